"""Hardware profiles and the roofline model they feed.

A profile is a YAML file in ``specs/hardware/`` (bundled, read-only), in the user's
configuration directory (written by ``graphcost hwprobe``) or given by path: a name, the
memory bandwidth (bytes/s, streaming read) and the peak FLOP rate (FLOP/s), each with
``how`` it was obtained and a ``source``. ``kind: theoretical`` profiles are datasheet
arithmetic (channels x bus width x transfer rate; cores x clock x FLOP/cycle) and cite
the datasheet; ``kind: measured`` ones come from ``graphcost hwprobe`` on that machine.

Roofline (Williams, Waterman, Patterson, CACM 52(4), 2009): a node that moves ``B`` bytes
and does ``F`` FLOPs takes at least ``max(B / bandwidth, F / peak)`` seconds; which term
wins says whether it is memory- or compute-bound. ``B`` is what graphcost's cost model
counts (bytes read + bytes written, see docs/counting.md), ``F`` its FLOPs (FMA = 2).

A measured profile also holds what graphcost's own executor achieves on that machine:
``op_overhead`` (seconds one tiny node of each op kind takes end to end: Python, Numba
dispatch, thread wake-up), ``memory_bandwidth.by_type`` (bytes/s the executor's
matrix-vector kernel streams for each weight type), ``peak_flops.by_type`` (FLOP/s the
executor's matmul nodes reach per weight type) and ``op_costs``: each op kind's measured
time at a ladder of sizes (``by_op`` right after a matmul, ``by_op_chained`` right after a
small op, measured but not modelled, ``by_op_local`` after a matmul and a small op
that rewrote the first input, ``by_op_tokens`` on several tokens (``by_op_tokens_local``
after a small op), ``by_op_cold`` and ``by_op_tokens_cold`` right after a flush with the
kind not run since, ``by_op_mid`` and ``by_op_tokens_mid`` after a smaller one (a layer's
matvecs), ``since_bytes`` the bytes streamed since
the kind last ran at each curve's calls; flash attention's query tiles in
``flash_attn_tiled``; the decode matvec per weight type in ``matvec``), as ``[bytes, flops,
seconds]`` points, and the prompt matmuls per weight type in ``matmul`` as ``[weight
bytes, flops, seconds]`` (with ``matvec_max_rows``, ``matmul_row_tile``,
``flash_attn_tile_min_tokens``, ``flash_attn_tile_queries``, ``flash_attn_split_min_cells``:
where the kernels switch).
They are not part of the machine's roofline; :func:`executor_seconds` models the executor itself from them, and ``graphcost profile``
reports how close both come to the measured node times.

A profile may also hold ``llama_cpp``: the coefficients of llama.cpp's CPU execution
model (:mod:`graphcost.cost.speed_model`) fitted against llama-bench on that machine by
``graphcost calibrate`` (graphcost/calibrate.py), with the error band measured on held-out cases;
``graphcost speed`` and ``analyze --hardware`` use it (docs/speed.md).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

from graphcost.graph import ops
from graphcost.errors import GraphcostError
from graphcost.files import MAX_PROFILE_BYTES, check_output, load_yaml, write_atomic
from graphcost.resources import bundled
from graphcost.schema import field, mapping_of, need

KINDS = ("theoretical", "measured")


@dataclass(frozen=True)
class Hardware:
    """One machine: bytes/s it streams from memory, FLOP/s it can compute."""

    name: str
    bandwidth: float          # bytes per second
    peak_flops: float         # FLOP per second (FMA = 2)
    kind: str = "theoretical"
    description: str = ""
    threads: int | None = None
    path: Path | None = None
    overhead: float = 0.0     # seconds per executed node (measured profiles only)
    extra: dict[str, Any] = dc_field(default_factory=dict, compare=False)

    def matvec_rate(self, type_name: str) -> float:
        """Bytes/s the executor's matmul streams ``type_name`` weights at (the profile's
        ``by_type`` figure; the bandwidth if the profile has none)."""
        by_type = (self.extra.get("memory_bandwidth") or {}).get("by_type") or {}
        return float(by_type.get(type_name, self.bandwidth))

    def op_overhead(self, op: str) -> float:
        """Per-call overhead of ``op`` (its own measurement if the probe has one)."""
        by_op = (self.extra.get("op_overhead") or {}).get("by_op") or {}
        return float(by_op.get(op, self.overhead))

    @property
    def cpu_features(self) -> frozenset[str] | None:
        """The machine's CPU features under ggml's names (the profile's top-level
        ``cpu_features``: a datasheet's, or those ``hwprobe`` read on the machine it
        measured), which decide llama.cpp's weight layouts there; None where the profile
        does not say."""
        feats = self.extra.get("cpu_features")
        return None if feats is None else frozenset(feats)

    def peak_for(self, type_name: str | None) -> float:
        """FLOP/s of the executor's matmul with ``type_name`` weights (the profile's
        ``peak_flops.by_type``; the F32 peak if it has none): the compute roof a matmul of
        that type meets, so an integer-dot matvec is not judged by the float peak."""
        by_type = (self.extra.get("peak_flops") or {}).get("by_type") or {}
        return float(by_type.get(type_name, self.peak_flops)) if type_name else self.peak_flops

    def op_curve(self, op: str, type_name: str | None = None,
                 head_size: int | None = None, tokens: int = 1,
                 local: bool = False) -> list | None:
        """The probe's ``[[bytes, flops, seconds], ...]`` for ``op`` (a matmul: for its
        weight type; another op: ``by_op``, run right after a matmul, whatever ran before
        the node -- ``by_op_chained``, the call repeated after a small op, is not read: it
        put a decode's SCALE after a ROPE and SET_ROWS after a SET_ROWS at 1.5-2x their
        time, docs/executor.md; a one-row node that runs right after a small op
        (``local``): ``by_op_local``, where the probe has it; flash attention: at the
        measured head size nearest
        ``head_size``, keys ``FLASH_ATTN_EXT@D``, and for ``tokens`` queries from
        ``op_costs.flash_attn_tile_min_tokens`` on, the query-tile kernel's curves,
        ``op_costs.flash_attn_tiled``; another op of more than one token: its curve
        measured on several tokens, ``op_costs.by_op_tokens``, where there is one),
        sorted by bytes; None when the profile did not measure it."""
        oc = self.extra.get("op_costs") or {}
        if op in ops.MATMUL:
            pts = (oc.get("matvec") or {}).get(type_name)
            return sorted(pts) if pts else None
        table = oc.get(self.warm_part(op, tokens, local)) or {}
        tile_min = oc.get("flash_attn_tile_min_tokens")
        if op == "FLASH_ATTN_EXT" and tile_min and tokens >= tile_min \
                and oc.get("flash_attn_tiled"):
            table = oc["flash_attn_tiled"]
        key = op
        if head_size:
            sizes = {int(k.split("@")[1]) if "@" in k else 128: k for k in table
                     if k == op or k.startswith(op + "@")}
            if sizes:
                key = sizes[min(sizes, key=lambda d: (abs(d - head_size), d))]
        pts = table.get(key)
        if not pts and op == GET_ROWS_ACTIVATION:     # a profile from before the key
            return self.op_curve("GET_ROWS", type_name, head_size, tokens)
        return sorted(pts) if pts else None

    def warm_part(self, op: str, tokens: int = 1, local: bool = False) -> str:
        """The ``op_costs`` key of ``op``'s curve right after what ran before it: a node
        of several ``tokens``, ``by_op_tokens`` where ``op`` has a curve there; a node
        right after a small op that wrote its first input (``local``), ``by_op_local``
        or for several tokens ``by_op_tokens_local``, where ``op`` has one; else
        ``by_op`` (right after a matmul)."""
        oc = self.extra.get("op_costs") or {}
        if tokens > 1 and op in (oc.get("by_op_tokens") or {}):
            return "by_op_tokens_local" if local and op in (oc.get("by_op_tokens_local")
                                                            or {}) else "by_op_tokens"
        if local and tokens == 1 and op in (oc.get("by_op_local") or {}):
            return "by_op_local"
        return "by_op"

    def warmth_curves(self, op: str, tokens: int = 1,
                      local: bool = False) -> list[tuple[float, list]]:
        """``[(bytes, curve), ...]`` for ``op`` by how long ago its kind last ran, the
        bytes growing: first, where the probe has it and its bytes are fewer than the warm
        curve's, the curve with the kind's code warm (``by_op_again`` /
        ``by_op_local_again``: a node of the same op ran just before its matvecs, or just
        before it); the warm curve (``by_op``, or ``by_op_tokens`` for a node of several
        tokens where ``op`` has a curve on several tokens, or ``by_op_local`` for a one-row
        node after a small op, ``local``, as :meth:`op_curve` picks), the
        middle ones (``op_costs.by_op_midN``/``by_op_tokens_midN``: each call after a
        matvec streaming N MiB, ``hwprobe.MID_MIB``) and the cold one (``by_op_cold``/
        ``by_op_tokens_cold``: after a flush as the output matmul streams), each at the
        median bytes streamed since the kind last ran at its calls
        (``op_costs.since_bytes``). A middle curve only where its bytes lie between the
        warm and cold ones (a kind whose warm calls already come that long after its last
        is measured there by its warm curve). [] when the profile has no cold curve or
        figures (an older profile), or they do not grow."""
        oc = self.extra.get("op_costs") or {}
        warm = self.warm_part(op, tokens, local)
        since = oc.get("since_bytes") or {}

        def at(part: str) -> tuple[float, list] | None:
            pts = (oc.get(part) or {}).get(op)
            b = (since.get(part) or {}).get(op)
            return (float(b), sorted(pts)) if pts and b is not None else None
        cold = warm.removesuffix("_local")      # the middle and cold curves: not local
        ends = [at(warm), at(cold + "_cold")]
        if None in ends or ends[1][0] <= ends[0][0]:
            return []
        mids = [m for k in oc if MID_PART.fullmatch(k) and k.startswith(cold + "_mid")
                and (m := at(k)) and ends[0][0] < m[0] < ends[1][0]]
        again = at(warm + "_again")
        first = [again] if again and again[0] < ends[0][0] else []
        return first + [ends[0]] + sorted(mids, key=lambda m: m[0]) + [ends[1]]

    def matmul_points(self, type_name: str | None) -> list | None:
        """The probe's prompt-matmul points for ``type_name`` weights
        (``op_costs.matmul``: ``[[weight bytes, flops, seconds], ...]``, the same weights
        at several activation row counts), or None."""
        pts = ((self.extra.get("op_costs") or {}).get("matmul") or {}).get(type_name)
        return sorted(pts, key=lambda p: p[1]) if pts else None

    @property
    def matvec_max_rows(self) -> int:
        """Most activation rows the executor's matvec kernels take (``op_costs.
        matvec_max_rows``, ``kernels.matmul.MATVEC_MAX_N``; 1 if the profile does not
        say): a matmul with more takes the prompt kernels."""
        return int((self.extra.get("op_costs") or {}).get("matvec_max_rows") or 1)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "description": self.description,
                "threads": self.threads, "bandwidth_bytes_per_s": self.bandwidth,
                "peak_flops_per_s": self.peak_flops, "op_overhead_s": self.overhead,
                "path": None if self.path is None else str(self.path)}


def roofline_seconds(nbytes: float, flops: float, hw: Hardware,
                     bandwidth: float | None = None,
                     peak: float | None = None) -> tuple[float, str]:
    """(lower-bound seconds, ``"memory"`` or ``"compute"``) for one node or a sum; the
    memory roof is ``bandwidth`` bytes/s if given, else the profile's, the compute roof
    ``peak`` FLOP/s if given (a matmul's: :meth:`Hardware.peak_for`), else the profile's."""
    t_mem = nbytes / (bandwidth or hw.bandwidth)
    t_cmp = flops / (peak or hw.peak_flops)
    return (t_mem, "memory") if t_mem >= t_cmp else (t_cmp, "compute")


def curve_seconds(points: list, nbytes: float, column: int = 0) -> float:
    """Seconds at ``nbytes`` on a probe curve (``[[bytes, flops, seconds], ...]``; with
    ``column`` 1, ``nbytes`` is FLOPs and the curve is read by its FLOPs): linear between
    the two measured sizes around it; below the smallest, that size's time (the fixed
    cost of a call); above the largest, the last segment's slope carried on (a slope below
    zero, noise, counts as zero)."""
    points = sorted(([p[column], p[2]] for p in points))
    if nbytes <= points[0][0]:
        return float(points[0][1])
    for (b0, t0), (b1, t1) in zip(points, points[1:]):
        if nbytes <= b1:
            return float(t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)) if b1 > b0 else float(t1)
    if len(points) == 1:
        return float(points[0][1])
    (b0, t0), (b1, t1) = points[-2], points[-1]
    slope = max(0.0, (t1 - t0) / (b1 - b0)) if b1 > b0 else 0.0
    return float(t1 + slope * (nbytes - b1))


def matmul_fit(points: list) -> tuple[float, list] | None:
    """(FLOP/s, rest curve) of a prompt matmul from the probe's points ``[[weight bytes,
    flops, seconds], ...]`` (``op_costs.matmul``): on the matrix with the most points (the
    largest on a tie), the line through its fewest and most FLOPs gives the per-row work
    (its slope: seconds per FLOP); what is left of each matrix's time at its fewest FLOPs
    (never below zero: noise) is the work once per call (the call, unpacking the weight
    blocks once), as a curve ``[[weight bytes, 0, seconds], ...]`` for
    :func:`curve_seconds`. None without two FLOP counts on one matrix or with a slope that
    is not positive (noise)."""
    by_w: dict[float, list] = {}
    for w, f, t in points:
        by_w.setdefault(w, []).append((f, t))
    main = max(by_w, key=lambda w: (len(by_w[w]), w), default=None)
    if main is None:
        return None
    (f0, t0), (f1, t1) = min(by_w[main]), max(by_w[main])
    if f1 <= f0 or t1 <= t0:
        return None
    per_flop = (t1 - t0) / (f1 - f0)
    rest = [[w, 0, max(0.0, t - per_flop * f)] for w, (f, t) in
            ((w, min(v)) for w, v in sorted(by_w.items()))]
    return 1.0 / per_flop, rest


#: the ``op_costs`` key of a GET_ROWS whose rows are an activation the graph computed
#: (the last layer's ``get_rows(cur, inp_out_ids)``: a few KB in the caches), measured
#: apart from the token embedding gather (rows of a mapped weight table, from memory);
#: a profile without it models both with GET_ROWS's curve
GET_ROWS_ACTIVATION = "GET_ROWS@activation"


def model_op(node) -> str:
    """The op key the executor model reads for ``node``: :data:`GET_ROWS_ACTIVATION` for
    a GET_ROWS from rows that are not a weight, else the node's op."""
    if node.op == "GET_ROWS" and node.src[0].storage.role != "weight":
        return GET_ROWS_ACTIVATION
    return node.op


#: the ``op_costs`` keys of the probe's middle curves: ``by_op_midN`` and
#: ``by_op_tokens_midN``, each call after a matvec streaming N MiB (``hwprobe.MID_MIB``)
MID_PART = re.compile(r"by_op(_tokens)?_mid\d+")


def cold_share(since: float, warm: float, cold: float) -> float:
    """How far a node whose op kind last ran ``since`` bytes of streaming ago is from a
    warmer probe curve (measured ``warm`` bytes after the kind last ran) toward a colder
    one (``cold`` bytes after): 0 up to ``warm``, 1 from ``cold`` on, linear in log(bytes)
    between (what a cache keeps falls off with each doubling of what streamed through
    it; the probe measured the ends, :meth:`Hardware.warmth_curves`)."""
    if since <= warm:
        return 0.0
    if since >= cold:
        return 1.0
    warm = max(warm, 1.0)       # a code-warm curve: nothing streamed since (0 bytes)
    return math.log(since / warm) / math.log(cold / warm)


def executor_seconds(op: str, nbytes: float, flops: float, hw: Hardware,
                     weight_type: str | None = None, head_size: int | None = None, rows: int = 1,
                     weight_bytes: float | None = None, tokens: int = 1,
                     since: float | None = None, local: bool = False,
                     distinct: float = 1.0) -> float:
    """Modelled seconds of one node on graphcost's executor.

    A matmul of more than :attr:`Hardware.matvec_max_rows` activation ``rows`` (a
    prompt's) with the probe's prompt points for ``weight_type``: the once-a-call work at
    ``weight_bytes`` plus ``flops`` at the per-row FLOP rate (:func:`matmul_fit`), the
    rows rounded up to the type's ``op_costs.matmul_row_tile`` (a kernel that works on
    tiles of activation rows does the padding's work too). Otherwise, with the probe's curve for ``op`` (a matmul: its
    decode matvec for ``weight_type``; another op: the curve measured right after a
    matmul, whatever ran before the node, :meth:`Hardware.op_curve`): the curve's time at ``nbytes`` (:func:`curve_seconds`; flash attention:
    at ``flops``, on its ``head_size``'s curve for ``tokens`` queries), never below the
    compute roof ``flops / peak`` (a matmul's peak is its weight type's). A node whose op
    kind last ran ``since`` bytes of streaming ago (matmul weights and every node's bytes,
    :func:`graphcost.execute.profile.streamed_since`) moves from that curve toward the
    kind's middle and cold curves (:meth:`Hardware.warmth_curves`: a layer's matvecs
    push its table out of the L2, a step's first node of its kind, after the output
    matmul, meets its code and tables out of the caches), between the two whose bytes
    lie around ``since`` by :func:`cold_share`; a node that runs right after a small op
    that wrote its first input (``local``, :func:`graphcost.execute.profile.after_small`)
    starts from the probe's curve after a small op (``by_op_local``, on several tokens
    ``by_op_tokens_local``); a node whose code
    kind ran fewer bytes ago than that curve's calls met reads the probe's code-warm
    curve (``by_op_again``, ``by_op_local_again``). Without a curve (an op the probe did not
    time, an older or datasheet profile): the per-call overhead of ``op`` plus the
    roofline with the memory roof lowered to the matvec rate for ``weight_type`` (other
    ops stream at the bandwidth).

    A gather whose rows repeat (``distinct`` < 1: the share of its rows that are
    distinct, a prompt's token ids, :func:`graphcost.execute.profile.distinct_share`)
    costs the gather of its distinct rows (``nbytes * distinct``) as above, plus the
    repeats at the curve without warmth (their rows were just read: the warm curve's time
    at ``nbytes`` less its time at ``nbytes * distinct``). The probe gathers distinct
    rows; on the EPYC VM the 21-token prompt of ``bench_profile`` (10 distinct ids)
    measured 10.8-14.0 us where all 21 rows as distinct were modelled 13.9-17.2, and
    10 distinct rows plus 11 repeats 9.9-12.5 (28 saved runs of session 20)."""
    if distinct < 1.0:
        warm = dict(head_size=head_size, tokens=tokens, local=local)
        again = max(0.0, executor_seconds(op, nbytes, flops, hw, weight_type, **warm)
                    - executor_seconds(op, nbytes * distinct, flops * distinct, hw,
                                       weight_type, **warm))
        return executor_seconds(op, nbytes * distinct, flops * distinct, hw, weight_type,
                                head_size, rows, weight_bytes, tokens, since, local) + again
    mat = op in ops.MATMUL and weight_type is not None
    if mat and rows > hw.matvec_max_rows and weight_bytes:
        fit = matmul_fit(hw.matmul_points(weight_type) or [])
        if fit is not None:
            tile = int(((hw.extra.get("op_costs") or {}).get("matmul_row_tile") or {})
                       .get(weight_type, 1))
            padded = -(-rows // tile) * tile
            return curve_seconds(fit[1], weight_bytes) + flops * padded / rows / fit[0]
    peak = hw.peak_for(weight_type) if mat else hw.peak_flops
    curve = hw.op_curve(op, weight_type if mat else None, head_size, tokens, local)
    if curve:
        # flash attention's work is per (query, attended cell) pair: its FLOPs, not its
        # bytes (a prompt's q and output rows are most of its bytes)
        at = (flops, 1) if op == "FLASH_ATTN_EXT" else (nbytes, 0)
        sec = curve_seconds(curve, *at)
        warmth = [] if since is None or mat else hw.warmth_curves(op, tokens, local)
        for (b0, c0), (b1, c1) in zip(warmth, warmth[1:]):
            if since <= b1 or b1 == warmth[-1][0]:
                # from the nearer curve: warmth[0] is op_curve's, or the code-warm one
                share = cold_share(since, b0, b1)
                t0 = curve_seconds(c0, *at)
                sec = t0 + share * (curve_seconds(c1, *at) - t0)
                break
        return max(sec, flops / peak)
    rate = hw.matvec_rate(weight_type) if mat else hw.bandwidth
    return hw.op_overhead(op) + roofline_seconds(nbytes, flops, hw, rate, peak)[0]


# ---------------------------------------------------------------------------- files
#
# Where profiles live: the bundled datasheet profiles (``specs/hardware/``, read-only: in
# a wheel they are inside site-packages) and the user's own, written by ``hwprobe`` into
# the user's configuration directory (platformdirs: ``~/.config/graphcost/hardware`` on
# Linux, honouring XDG_CONFIG_HOME). ``--hardware NAME`` looks in the user's directory
# first: a profile measured on this machine is what its user means by that name, and a
# bundled name is only shadowed by a file the user wrote (hwprobe says so when it does);
# ``--hardware PATH`` (anything with a slash or a .yaml/.yml suffix) reads that file.


def hardware_dir() -> Path:
    """The bundled, read-only datasheet profiles."""
    return bundled("specs") / "hardware"


def user_dir() -> Path:
    """Profiles the user measured: ``<user config dir>/graphcost/hardware``."""
    import platformdirs
    return Path(platformdirs.user_config_dir("graphcost")) / "hardware"


def available() -> list[str]:
    """Names of the profiles ``--hardware NAME`` finds (user's and bundled)."""
    names: set[str] = set()
    for d in (user_dir(), hardware_dir()):
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.yaml"))
    return sorted(names)


def is_path(name: str) -> bool:
    """Whether ``--hardware``/``-o`` names a file rather than a profile name."""
    return "/" in name or os.sep in name or name.endswith((".yaml", ".yml")) or name.startswith(".")


def _positive(section: dict, key: str, where: str, path) -> float:
    return float(field(section, key, "positive", where, path))


def parse(doc: Any, path: Path | None) -> Hardware:
    """The profile in ``doc`` (a YAML document; ``path`` names it in errors, None for one
    just measured). Every field is type-checked: one line naming the first wrong one."""
    where = path if path is not None else "hardware profile"
    need(doc, "dict", "the hardware profile", where)
    kind = doc.get("kind", "theoretical")
    if kind not in KINDS:
        raise GraphcostError(f"{where}: kind {_show(kind)}: use {' or '.join(KINDS)}")
    field(doc, "name", "str", "", where, required=False, null=True)
    field(doc, "description", "str", "", where, required=False, null=True)
    threads = doc.get("threads")
    if threads is not None and (not _is_int(threads) or threads < 1):
        raise GraphcostError(f"{where}: threads must be an integer >= 1 or null, got {_show(threads)}")
    bw = need(doc.get("memory_bandwidth"), "dict", "memory_bandwidth", where)
    bandwidth = _positive(bw, "bytes_per_second", "memory_bandwidth", where)
    if bw.get("by_type") is not None:
        mapping_of(bw["by_type"], "positive", "memory_bandwidth.by_type", where)
    if bw.get("stream_by_type") is not None:
        mapping_of(bw["stream_by_type"], "positive", "memory_bandwidth.stream_by_type", where)
    pk = need(doc.get("peak_flops"), "dict", "peak_flops", where)
    peak = _positive(pk, "flops_per_second", "peak_flops", where)
    if pk.get("by_type") is not None:
        mapping_of(pk["by_type"], "positive", "peak_flops.by_type", where)
    if doc.get("op_costs") is not None:
        oc = need(doc["op_costs"], "dict", "op_costs", where)
        for key, v in mapping_of(oc.get("matmul_row_tile") or {}, "positive",
                                 "op_costs.matmul_row_tile", where).items():
            if not _is_int(v):
                raise GraphcostError(f"{where}: op_costs.matmul_row_tile.{key} must be an "
                                     f"integer >= 1, got {_show(v)}")
        for part in ("by_op", "by_op_chained", "by_op_local", "by_op_again",
                     "by_op_local_again", "by_op_tokens", "by_op_tokens_local", "by_op_cold",
                     "by_op_tokens_cold", "matvec", "matmul", "flash_attn_tiled",
                     *sorted(k for k in oc if MID_PART.fullmatch(str(k)))):
            for key, pts in mapping_of(oc.get(part) or {}, "list", f"op_costs.{part}",
                                       where).items():
                _check_curve(pts, f"op_costs.{part}.{key}", where)
        for part, v in mapping_of(oc.get("since_bytes") or {}, "dict",
                                  "op_costs.since_bytes", where).items():
            mapping_of(v, "nonneg", f"op_costs.since_bytes.{part}", where)
        for key in ("matvec_max_rows", "flash_attn_tile_min_tokens", "flash_attn_tile_queries",
                    "flash_attn_split_min_cells", "by_op_tokens_rows"):
            v = oc.get(key)
            if v is not None and (not _is_int(v) or v < 1):
                raise GraphcostError(f"{where}: op_costs.{key} must be an integer >= 1, "
                                     f"got {_show(v)}")
    overhead = 0.0
    if doc.get("op_overhead") is not None:
        ov = need(doc["op_overhead"], "dict", "op_overhead", where)
        overhead = float(field(ov, "seconds", "nonneg", "op_overhead", where))
        if ov.get("by_op") is not None:
            mapping_of(ov["by_op"], "nonneg", "op_overhead.by_op", where)
    if doc.get("llama_cpp") is not None:     # graphcost speed's calibration (docs/speed.md)
        lc = need(doc["llama_cpp"], "dict", "llama_cpp", where)
        mapping_of(need(lc.get("coefficients"), "dict", "llama_cpp.coefficients", where),
                   "nonneg", "llama_cpp.coefficients", where)
        n = lc.get("counts")
        if n is not None and (not _is_int(n) or n < 1):
            raise GraphcostError(f"{where}: llama_cpp.counts must be an integer >= 1 or null, "
                                 f"got {_show(n)}")
        t = lc.get("threads")
        if t is not None and (not _is_int(t) or t < 1):
            raise GraphcostError(f"{where}: llama_cpp.threads must be an integer >= 1 or null, "
                                 f"got {_show(t)}")
        if lc.get("error_band") is not None:
            band = need(lc["error_band"], "dict", "llama_cpp.error_band", where)
            for k in ("median", "worst", "cases"):
                field(band, k, "nonneg", "llama_cpp.error_band", where)
        for i, k in enumerate(field(lc, "undetermined", "list", "llama_cpp", where,
                                    required=False, null=True) or []):
            need(k, "str", f"llama_cpp.undetermined[{i}]", where)     # coefficient names
        # the weight placement the coefficients were fitted on
        _features(field(lc, "cpu_features", "list", "llama_cpp", where, required=False,
                        null=True), "llama_cpp.cpu_features", where)
    # the machine's own (a datasheet's, or the probed machine's)
    _features(field(doc, "cpu_features", "list", "", where, required=False, null=True),
              "cpu_features", where)
    field(doc, "cpu_features_source", "str", "", where, required=False, null=True)
    return Hardware(name=str(doc.get("name") or (path.stem if path else "this machine")),
                    bandwidth=bandwidth, peak_flops=peak, kind=kind,
                    description=str(doc.get("description") or ""), threads=threads, path=path,
                    overhead=overhead, extra=doc)


def _features(feats: list | None, at: str, where) -> None:
    """A profile's list of ggml CPU feature names (``at`` names it): each element a
    known name (not a comma list: ``"avx2,avx512"`` is one unknown name)."""
    if feats is None:
        return
    from graphcost.memory.backends import check_cpu_features
    for i, f in enumerate(feats):
        need(f, "str", f"{at}[{i}]", where)
    check_cpu_features(feats, f"{where}: {at} {','.join(feats)!r}")


def _check_curve(pts: list, at: str, where) -> None:
    """A probe curve: a non-empty list of ``[bytes > 0, flops >= 0, seconds >= 0]``."""
    if not pts:
        raise GraphcostError(f"{where}: {at} must list at least one [bytes, flops, seconds]")
    for i, p in enumerate(pts):
        need(p, "list", f"{at}[{i}]", where)
        if len(p) != 3:
            raise GraphcostError(f"{where}: {at}[{i}] must be [bytes, flops, seconds], "
                                 f"got {_show(p)}")
        for v, kind in zip(p, ("positive", "nonneg", "nonneg")):
            need(v, kind, f"{at}[{i}]", where)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _show(v: Any) -> str:
    t = repr(v)
    return t if len(t) <= 40 else t[:37] + "..."


def find(name: str) -> Path | None:
    """The file ``--hardware name`` means: a path as given, else the user's profile, else
    the bundled one; None if there is none."""
    if is_path(name):
        return Path(name).expanduser()
    for d in (user_dir(), hardware_dir()):
        if (d / f"{name}.yaml").exists():
            return d / f"{name}.yaml"
    return None


def load(name: str) -> Hardware:
    """A profile by name (user's directory first, then bundled) or by path."""
    p = find(name)
    if p is None:
        have = ", ".join(available()) or "none"
        raise GraphcostError(f"--hardware {name!r}: no such profile (have: {have}; in "
                             f"{user_dir()} or bundled; or give a path to a .yaml)")
    return parse(load_yaml(p, "hardware profile", MAX_PROFILE_BYTES), p)


def save(doc: dict, name: str, inputs: tuple = ()) -> tuple[Path, str | None]:
    """Write ``doc`` as ``<user dir>/<name>.yaml``, or to ``name`` if it is a path;
    atomically (temporary file, then rename). Never into the package. Returns the path
    and a note when the new profile shadows a bundled one of the same name."""
    import yaml

    target = Path(name).expanduser() if is_path(name) else user_dir() / f"{name}.yaml"
    check_output(target, inputs)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GraphcostError(f"{target.parent}: cannot create the directory: "
                             f"{e.strerror or e}") from None
    write_atomic(target, yaml.safe_dump(doc, sort_keys=False, width=100))
    note = None
    if not is_path(name) and (hardware_dir() / f"{name}.yaml").exists():
        note = (f"--hardware {name} now means this profile, not the bundled datasheet "
                f"profile of the same name")
    return target, note
