"""Time of one graph evaluation on llama.cpp's CPU backend, as a sum of counted quantities.

How llama.cpp's CPU backend runs a graph (ggml/src/ggml-cpu/ggml-cpu.c,
``ggml_graph_compute_thread``): every thread walks all nodes; empty ops (NONE, VIEW,
RESHAPE, PERMUTE, TRANSPOSE: ``ggml_op_is_empty``) are skipped; every other node is split
over the threads and followed by a barrier (``ggml_barrier``), except that an RMS_NORM
followed by the MUL that uses it runs as one fused node (``ggml_cpu_try_fuse_ops``). A
MUL_MAT first converts its activations to the weight type's ``vec_dot_type``
(``ggml_compute_forward_mul_mat``: ``from_float`` into the work buffer), then runs
``vec_dot`` over chunks of rows; a weight held in ``CPU_REPACK``
(ggml-cpu/repack.cpp ``forward_mul_mat``) runs ``gemm`` on groups of 4 activation rows
and ``gemv`` on the rest. FLASH_ATTN_EXT (ops.cpp ``ggml_compute_forward_flash_attn_ext_f16``)
walks the KV cells for every query row and head: K·q, online softmax, V accumulation;
its kernels skip masked cells (:func:`fa_pairs`).

So one graph takes, in seconds, ``sum_k coef[k] * count[k]`` over these counts (each a
plain integer from the graph and the cost model, :func:`counts`):

========================  ==========================================================
``steps``                 graph evaluations (llama_decode's per-ubatch work outside the
                          graph: building it, allocating, setting inputs, reading logits)
``barriers``              nodes that end in a barrier (non-empty nodes, fused pairs once)
``weight_bytes``          bytes of matmul weights read (each weight once per graph)
``mac:T:vec`` / ``mat``   multiply-accumulates of matmuls whose ``src0`` has type ``T``
                          and is not repacked: one activation row (vec_dot) or more
                          (llamafile_sgemm where it has a kernel for T, else vec_dot per
                          row); KV-cache matmuls are ``f16``
``mac:T:tiled``           the same for a K-quant or IQ weight, not repacked, with at
                          least 8 activation rows, on an x86 CPU with AVX2/AVX-512:
                          ggml-cpu/tiled/tiled.cpp's int8 tiles (:func:`tiled_unpacks`)
``tiled_unpack:w`` /      values that path unpacks into its tiles: each weight row once
``tiled_unpack:a``        per chunk of activation rows, each activation row once per
                          chunk of weight rows (the chunks depend on the threads)
``mac:T:gemv`` / ``gemm`` the same for a repacked weight: activation rows outside groups
                          of 4 (gemv) and inside them (gemm)
``convert``               activation values converted to a ``vec_dot_type``
``fa_mac``, ``:tiled``,   flash attention: heads x (Dk + Dv) x the (query row, KV cell)
``:split``                pairs its kernel computes (:func:`fa_pairs`: one row at a time,
                          tiles of 64 query rows, or one row with its >= 512 KV cells split
                          over the threads)
``other_bytes``           bytes read + written by every other non-empty node (cost model)
========================  ==========================================================

Nodes that get no rows (a ubatch with no output: everything that follows the
``inp_out_ids`` GET_ROWS) still end in a barrier but do no work. The coefficients are
seconds per unit at one thread count; they come from a hardware profile's ``llama_cpp``
section (fitted by ``graphcost calibrate`` against llama-bench on that machine, see
docs/speed.md) or, for a profile without one, from its bandwidth and peak FLOP rate alone
(:func:`roofline_coefficients`: unverified).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from graphcost.format import ggml_types as gt
from graphcost.graph import ops

#: MUL_MAT activation rows a repacked kernel takes at once (repack.cpp forward_mul_mat:
#: ``ne11 - ne11 % 4`` rows by gemm, the rest by gemv)
REPACK_GEMM_ROWS = 4
#: ggml-cpu/common.h GGML_FA_TILE_Q: query rows of one flash-attention tile
FA_TILE_Q = 64
#: ops.cpp use_split_kv_path: KV cells from which one query row's cells are split
FA_SPLIT_KV = 512
#: ggml-cpu/common.h GGML_FA_TILE_KV: KV cells of one tile of the tiled kernel
FA_TILE_KV = 64
#: attended KV cells at which :func:`counts` switches a key (its only choice keyed by the
#: cells: :func:`_fa_key`); between two of them a graph's counts are affine in the cells
N_KV_SWITCHES = (FA_SPLIT_KV,)
#: the counts a calibration's coefficients were fitted to (a profile's
#: ``llama_cpp.counts``; a section without it was fitted to 1): 2 since flash attention
#: counts the pairs its kernels compute (:func:`fa_pairs`), 1 every cell (session 29)
COUNTS = 2
#: names of the output-row index input (llm_graph_input_out_ids; ``out_ids`` in
#: llama.cpp's graph callbacks)
OUT_IDS = ("out_ids", "inp_out_ids")
#: weight types ggml-cpu/tiled/tiled.cpp multiplies in int8 tiles
#: (ggml_tiled_supported and ggml_tiled_matmul_type_dispatch: the same list), by ggml's
#: type names (graphcost.format.ggml_types.type_name)
TILED_TYPES = frozenset({"q6_K", "q5_K", "q4_K", "q3_K", "q2_K", "iq4_xs", "iq2_xxs",
                         "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"})
#: tiled.cpp ggml_tiled_min_batch: activation rows from which the tiled path is taken
TILED_MIN_ROWS = 8
#: tiled.cpp ggml_compute_forward_mul_mat_tiled_driver: the chunk edge starts at 256
#: (TILED_TILE_ROWS) and halves, down to 16 (TILED_MICRO), while there are fewer than
#: 4 chunks a thread
TILED_CHUNK, TILED_CHUNK_MIN, TILED_CHUNKS_PER_THREAD = 256, 16, 4
#: the path is compiled with __AVX__, __AVX2__ or __AVX512VNNI__ (tiled.cpp
#: ggml_tiled_supported; false elsewhere, e.g. ARM): graphcost's feature names for it
TILED_FEATURES = frozenset({"avx2", "avx512"})


def tiled_available(features) -> bool:
    """Whether a llama.cpp with ggml CPU ``features`` has the tiled K-quant path (an
    AVX-only CPU without AVX2 is taken not to: graphcost does not read ``avx``)."""
    return bool(TILED_FEATURES & frozenset(features))


def tiled_unpacks(nr0: int, nr1: int, k: int, threads: int) -> tuple[int, int]:
    """(weight values, activation values) the tiled path unpacks for a ``[k, nr0]``
    weight times ``nr1`` activation rows on ``threads`` threads. The driver cuts the
    output into chunks (edge 256, halved while there are fewer than 4 per thread, down to
    16): a chunk unpacks its weight rows and its activation rows once each (its rows are
    at most one 256-wide window), so every weight row is unpacked once per non-empty
    chunk of activation rows and every activation row once per chunk of weight rows.

    >>> tiled_unpacks(4096, 512, 4096, 2)     # 16 x 2 chunks of 256: 2 and 16 passes
    (33554432, 33554432)
    >>> tiled_unpacks(512, 32, 512, 2)        # edge 64: 8 x 1 chunks
    (262144, 131072)
    """
    def ceil(a: int, b: int) -> int:
        return -(-a // b)
    edge = TILED_CHUNK
    n0, n1 = ceil(nr0, edge), ceil(nr1, edge)
    while n0 * n1 < threads * TILED_CHUNKS_PER_THREAD and edge > TILED_CHUNK_MIN:
        edge //= 2
        n0, n1 = ceil(nr0, edge), ceil(nr1, edge)
    d0, d1 = ceil(nr0, n0), ceil(nr1, n1)        # rows a chunk, the last ones may be empty
    return nr0 * k * ceil(nr1, d1), nr1 * k * ceil(nr0, d0)


def _storage(t):
    while t.view_src is not None:
        t = t.view_src
    return t


def _fused_with_next(nodes, i: int) -> bool:
    """ggml_cpu_try_fuse_ops: RMS_NORM then a MUL that reads it (F32 operands)."""
    n = nodes[i]
    if n.op != "RMS_NORM" or i + 1 >= len(nodes):
        return False
    m = nodes[i + 1]
    return (m.op == "MUL" and n in m.src and m.type == gt.F32
            and all(s.type == gt.F32 for s in m.src))


def counts(analysis, repacked: Iterable[str] = (), *, outputs: bool = True,
           tiled_threads: int | None = None, live: bool = True) -> Counter:
    """The counts of one evaluation of ``analysis``'s graph (see the module docstring).

    ``repacked``: names of weights llama.cpp holds in ``CPU_REPACK`` on this CPU
    (:func:`repacked_weights`). ``outputs=False``: the ubatch has no output row, so the
    nodes after the ``inp_out_ids`` GET_ROWS do no work (they still end in a barrier).
    ``tiled_threads``: the threads llama.cpp runs with where it has the tiled K-quant path
    (:func:`tiled_available`), None where it has not.

    Flash attention over a KV cache by the row or tiled kernel counts the pairs it
    computes (:func:`fa_pairs`) for the graph's ubatch (its ``n_tokens`` queries a stream
    at positions ``past`` on, each stream alike); ``live=False`` leaves that to the caller
    and counts ``fa_units:<path>:<cache>`` instead, heads x (Dk + Dv) per node, which
    :func:`fa_expand` turns into MACs (``graphcost.speed.Predictor``: one graph stands for
    ubatches at many positions)."""
    rep = set(repacked)
    c: Counter = Counter(steps=1)
    caches = fa_caches(analysis)
    nodes = [nc.node for nc in analysis.nodes]
    empty: set[int] = set()                 # ids of tensors with no rows
    skip_barrier = False
    for i, nc in enumerate(analysis.nodes):
        n = nc.node
        if n.op in ops.EMPTY:
            if any(id(s) in empty for s in n.src):
                empty.add(id(n))
            continue
        if skip_barrier:
            skip_barrier = False
        else:
            c["barriers"] += 1
            skip_barrier = _fused_with_next(nodes, i)
        if not outputs and (any(id(s) in empty for s in n.src) or (
                n.op == "GET_ROWS" and len(n.src) > 1 and n.src[1].name in OUT_IDS)):
            empty.add(id(n))
            continue
        if n.op in ops.MATMUL:
            _matmul_counts(c, n, rep, tiled_threads)
        elif n.op == "FLASH_ATTN_EXT":
            c["barriers"] += 1          # the op's own ggml_barrier after setting up chunks
            key, cache = _fa_key(n), caches.get(id(n.src[3])) if len(n.src) > 3 else None
            if key == "fa_mac:split" or cache is None:
                c[key] += _fa_macs(n)       # the split decode: its fullest chunk, every cell
            else:
                path = FA_PATHS[key]
                if live:
                    run = analysis.graph.run
                    c[key] += _fa_units(n) * fa_pairs(path, n.src[0].ne[1], run.past,
                                                      cache[1])
                else:
                    c[f"fa_units:{path}:{cache[0]}"] += _fa_units(n)
        elif nc.cost is not None:
            c["other_bytes"] += nc.cost.bytes_read + nc.cost.bytes_written
    return c


#: :func:`_fa_key`'s key of the row and tiled kernels -> their :func:`fa_pairs` path
FA_PATHS = {"fa_mac": "row", "fa_mac:tiled": "tiled"}


def fa_window(model, cache: str) -> int:
    """The sliding window the mask of KV cache ``cache`` applies: the model's ``n_swa``
    for the ``swa`` cache, 0 (none) for the others."""
    return int(model.n_swa) if cache == "swa" else 0


def fa_caches(analysis) -> dict[int, tuple[str, int]]:
    """``id(KQ mask)`` -> (its KV cache's name, :func:`fa_window`) for the graph's
    attention inputs."""
    m = analysis.graph.model
    return {id(a.kq_mask): (a.cache.name, fa_window(m, a.cache.name))
            for a in analysis.graph.attn_inputs if a.kq_mask is not None}


def _fa_units(n) -> int:
    """heads x streams x (Dk + Dv): MACs per (query, cell) pair of a FLASH_ATTN_EXT node."""
    q, k, v = n.src[0], n.src[1], n.src[2]
    return q.ne[2] * q.ne[3] * (k.ne[0] + v.ne[0])


def _window_sum(x: int, window: int) -> int:
    """sum(min(i, window) for i in 1 .. x) (no cap where ``window`` is 0): the cells the
    queries at positions 0 .. x - 1 attend."""
    if not window or x <= window:
        return x * (x + 1) // 2
    return window * (window + 1) // 2 + (x - window) * window


def fa_pairs(path: str, tokens: int, past: int, window: int = 0) -> int:
    """(query, KV cell) pairs one head's flash attention computes for a ubatch of
    ``tokens`` queries at positions ``past .. past + tokens - 1`` of one sequence, its
    causal mask (and, with ``window`` > 0, the standard sliding window: a query at ``p``
    sees positions ``p - window + 1 .. p``) over a cache holding every earlier position.

    ggml skips masked cells (ops.cpp, llama-cpp-python 0.3.36): ``path`` ``"row"``
    (``one_chunk``, one query row at a time: ``if (mv == -INFINITY) continue``) computes
    the live pairs, ``min(p + 1, window)`` a query; ``"tiled"`` (64-query tiles,
    ``ggml_compute_forward_flash_attn_ext_tiled``) skips a KV tile of :data:`FA_TILE_KV`
    cells only where all its tile's queries mask it (``can_skip``), so a tile of ``r``
    queries computes ``r`` rows over the tiles its queries' cells span, counted as
    ``ceil(U / 64)`` tiles for ``U`` cells in their union (the cells of a cache without a
    window lie in position order; a sliding window's may wrap in its ring, one tile more:
    not counted). The split-KV decode is not here: its fullest chunk is all its cells
    (:func:`counts`).

    >>> fa_pairs("row", 3, 10)                # 11 + 12 + 13
    36
    >>> fa_pairs("row", 3, 10, window=4)      # each query sees 4
    12
    >>> fa_pairs("tiled", 100, 0)             # 64 rows x 1 tile, 36 rows x 2 tiles
    8704
    """
    if path == "row":
        return _window_sum(past + tokens, window) - _window_sum(past, window)
    if path != "tiled":
        raise ValueError(f"flash attention path {path!r}: 'row' or 'tiled'")
    # in closed form (a ubatch may hold millions of queries): full tiles j = 0 .. nt - 2
    # span ceil((past + 64 (j + 1)) / 64) = j + 1 + ceil(past / 64) KV tiles (FA_TILE_Q
    # = FA_TILE_KV), at most ceil((63 + window) / 64) with a window; then the last tile
    t, nt = FA_TILE_KV, -(-tokens // FA_TILE_Q)
    last = tokens - (nt - 1) * FA_TILE_Q
    c0 = -(-past // t)
    k = nt - 1                                  # full tiles below the window's cap
    cap = -(-(FA_TILE_Q - 1 + window) // t) if window else 0
    if window:
        k = max(0, min(nt - 1, cap - c0))
    full = k * (k + 1) // 2 + k * c0 + (nt - 1 - k) * cap
    union = past + tokens if not window else min(past + tokens, last - 1 + window)
    return FA_TILE_Q * t * full + last * t * -(-union // t)


def fa_pairs_sum(path: str, tokens: int, cells, lo: int, hi: int, window: int = 0) -> int:
    """``sum(fa_pairs(path, tokens, cells.at(m) - tokens, window) for m in range(lo,
    hi))`` in closed form over ubatches laid out as ``cells``
    (:class:`~graphcost.graph.settings.Rows`: filled cells after each), whatever ``hi -
    lo``: ubatches whose every query sees all earlier cells (filled cells <= ``window``,
    or no window) by sums over the rows; those whose every query sees a full window
    (``past >= window - 1``) are constant; the few between (at most the ubatches that
    straddle the window's end) one by one."""
    from graphcost.graph.settings import Rows, ceil_sum_rows

    hi = max(lo, hi)
    a, c = hi, hi                  # first ubatch past the window's end / all at a full one
    if window:
        a = _first(cells, lo, hi, lambda u: u > window)
        c = _first(cells, a, hi, lambda u: u - tokens >= window - 1)
    out = 0
    if a > lo:                     # no query at the window: as without one
        n = a - lo
        if path == "row":
            # sum over ubatches of tokens * past + tokens (tokens + 1) / 2, past = u - tokens
            out += (tokens * (ceil_sum_rows(cells, lo, a, 1) - n * tokens)
                    + n * (tokens * (tokens + 1) // 2))
        else:
            # full tiles i = 0 .. nt - 2 (64 rows, union past + 64 (i + 1)): 64 x 64 x
            # (i + 1 + ceil(past / 64)); the last (r rows, union u): r x 64 x ceil(u / 64)
            t, nt = FA_TILE_KV, -(-tokens // FA_TILE_Q)
            last = tokens - (nt - 1) * FA_TILE_Q
            shifted = Rows(cells.used - tokens + t, cells.step, cells.row, cells.row_step,
                           cells.rows)          # its cells past + t: ceil(past / t) + 1
            ceil_past = ceil_sum_rows(shifted, lo, a, t) - n
            out += (FA_TILE_Q * t * ((nt - 1) * nt // 2 * n + (nt - 1) * ceil_past)
                    + last * t * ceil_sum_rows(cells, lo, a, t))
    out += sum(fa_pairs(path, tokens, cells.at(m) - tokens, window) for m in range(a, c))
    if hi > c:                     # every query at a full window
        out += (hi - c) * fa_pairs(path, tokens, cells.at(c) - tokens, window)
    return out


def _first(cells, lo: int, hi: int, pred) -> int:
    """The first ``m`` in ``lo .. hi`` with ``pred(cells.at(m))`` (``hi`` if none); the
    cells never fall along ``m``, so ``pred`` holds on a suffix."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(cells.at(mid)):
            hi = mid
        else:
            lo = mid + 1
    return lo


def fa_expand(c: Mapping[str, int], macs: Mapping[str, int]) -> Counter:
    """``c`` with each ``fa_units:<path>:<cache>`` key (:func:`counts` with ``live=False``)
    replaced, where it stands, by ``macs[that key]`` under the path's MAC key (``fa_mac``
    for the row kernel, ``fa_mac:tiled``; added to that key where ``c`` has it already)."""
    out: Counter = Counter()
    keys = {v: k for k, v in FA_PATHS.items()}
    for k, v in c.items():
        if k.startswith("fa_units:"):
            out[keys[k.split(":")[1]]] += macs[k]
        else:
            out[k] += v
    return out


def _fa_macs(n) -> int:
    # q: [Dk, n_q, H, 1]; k: [Dk, n_kv, Hkv, 1]; v: [Dv, n_kv, Hkv, 1]
    q, k, v = n.src[0], n.src[1], n.src[2]
    return q.ne[1] * q.ne[2] * q.ne[3] * k.ne[1] * (k.ne[0] + v.ne[0])


def _fa_key(n) -> str:
    """ops.cpp ggml_compute_forward_flash_attn_ext_f16's three kernels: one query row with
    at least 512 KV cells (``use_split_kv_path``: the cells split over the threads, partial
    results reduced), ``:split``; chunks of at least GGML_FA_TILE_Q (64) query rows with
    F32/F16 K and V of one type (``use_tiled``), ``:tiled``; otherwise one query row at a
    time over all cells (``one_chunk``)."""
    q, k, v = n.src[0], n.src[1], n.src[2]
    kv_float = k.type in (gt.F32, gt.F16) and k.type == v.type and q.type == gt.F32
    if kv_float and q.ne[1] == 1 and q.ne[3] == 1 and k.ne[1] >= FA_SPLIT_KV:
        return "fa_mac:split"
    return "fa_mac:tiled" if kv_float and q.ne[1] >= FA_TILE_Q else "fa_mac"


def _matmul_counts(c: Counter, n, rep: set[str], tiled_threads: int | None) -> None:
    # W:[K, M, ...] x A:[K, N, ...] -> [M, N, ...]  (MUL_MAT_ID: experts used, cost model)
    w, a = n.src[0], n.src[1]
    store = _storage(w)
    K = w.ne[0]
    if n.op == "MUL_MAT_ID":
        rows = n.ne[1] * n.ne[2]            # expert slots x tokens, one weight row set each
        macs = K * n.ne[0] * rows
        n_rows = rows
    else:
        n_rows = a.ne[1] * a.ne[2] * a.ne[3]
        macs = K * n.ne[0] * n.ne[1] * n.ne[2] * n.ne[3]
    name = gt.type_name(store.type)
    if store.role == "weight":
        c["weight_bytes"] += w.data_bytes
    if gt.vec_dot_type(store.type) != a.type:
        c["convert"] += K * n_rows
    if store.role == "weight" and store.name in rep:
        gemm_rows = n_rows - n_rows % REPACK_GEMM_ROWS
        per_row = macs // max(n_rows, 1)
        if gemm_rows:
            c[f"mac:{name}:gemm"] += per_row * gemm_rows
        if n_rows - gemm_rows:
            c[f"mac:{name}:gemv"] += per_row * (n_rows - gemm_rows)
    elif (tiled_threads and n.op == "MUL_MAT" and name in TILED_TYPES
          and n_rows >= TILED_MIN_ROWS):
        # ggml_compute_forward_mul_mat hands it to ggml_compute_forward_mul_mat_tiled first
        # (MUL_MAT_ID's experts take it by their routed rows: not modelled, counted below)
        c[f"mac:{name}:tiled"] += macs
        w_vals, a_vals = tiled_unpacks(n.ne[0], n_rows, K, tiled_threads)
        c["tiled_unpack:w"] += w_vals
        c["tiled_unpack:a"] += a_vals
    else:
        # llamafile_sgemm (GGML_LLAMAFILE, on by default) takes ne11 >= 2 for the types it
        # has kernels for; ne11 == 1 is always ggml's vec_dot: two paths, two rates
        c[f"mac:{name}:{'vec' if a.ne[1] == 1 else 'mat'}"] += macs


@dataclass(frozen=True)
class SpeedModel:
    """Seconds per unit of each count, at ``threads`` threads; ``source`` says where the
    coefficients come from and ``verified`` whether they were checked against llama.cpp."""

    coef: Mapping[str, float]
    threads: int | None
    source: str
    verified: bool
    band: Mapping[str, float] | None = None      # error band measured by the calibration
    #: coefficients the calibration cases did not pin down (:func:`undetermined`)
    undetermined: tuple[str, ...] = ()
    #: the ggml CPU features the calibration placed weights with (its llama.cpp's repacked
    #: and AMX layouts); None where the profile does not say
    cpu_features: frozenset[str] | None = None
    #: the profile's machine's CPU features (its top-level ``cpu_features``: a
    #: datasheet's, or the probed machine's); None where the profile does not say
    machine_features: frozenset[str] | None = None
    #: the counts the coefficients were fitted to (:data:`COUNTS`)
    counts: int = COUNTS

    def seconds(self, c: Mapping[str, int], threads: int | None = None) -> float:
        """Modelled seconds for counts ``c`` (:func:`counts`). With ``threads`` other than
        the model's, compute terms scale by threads/this (memory, barrier and step terms do
        not): an extrapolation the calibration did not check."""
        scale = 1.0
        if threads and self.threads and threads != self.threads:
            scale = self.threads / threads
        total = 0.0
        for k, v in c.items():
            x = self.coefficient(k)
            if k not in ("steps", "barriers", "weight_bytes"):
                x *= scale
            total += x * v
        return total

    def coefficient(self, key: str) -> float:
        """``key``'s coefficient; a MAC count of a type the calibration never saw takes the
        mean of the known MAC coefficients of its path (named by :meth:`missing`)."""
        if key in self.coef:
            return float(self.coef[key])
        if key.startswith("mac:"):
            path = key.rsplit(":", 1)[-1]
            same = [v for k, v in self.coef.items() if k.startswith("mac:")
                    and k.rsplit(":", 1)[-1] == path]
            same = same or [v for k, v in self.coef.items() if k.startswith("mac:")]
            return float(sum(same) / len(same)) if same else 0.0
        return 0.0

    def missing(self, c: Mapping[str, int]) -> list[str]:
        """Counts in ``c`` without a coefficient of their own."""
        return sorted(k for k, v in c.items() if v and k not in self.coef)


def roofline_coefficients(bandwidth: float, peak_flops: float) -> dict[str, float]:
    """Coefficients from a bandwidth (bytes/s) and a peak FLOP rate (FLOP/s, FMA = 2) alone:
    every byte at the bandwidth, every MAC at two FLOPs of peak, no barrier or step cost.
    What a profile without a ``llama_cpp`` calibration predicts with (unverified)."""
    mac = 2.0 / peak_flops
    return {"steps": 0.0, "barriers": 0.0, "weight_bytes": 1.0 / bandwidth, "convert": 0.0,
            "tiled_unpack:w": 0.0, "tiled_unpack:a": 0.0,
            "fa_mac": mac, "fa_mac:tiled": mac, "fa_mac:split": mac,
            "other_bytes": 1.0 / bandwidth,
            "mac:f32:vec": mac}


def from_profile(hw) -> SpeedModel:
    """The profile's calibrated model (its ``llama_cpp`` section), else the roofline form."""
    sec = (hw.extra or {}).get("llama_cpp")
    if sec:
        return SpeedModel(dict(sec["coefficients"]), sec.get("threads"),
                          sec.get("how", "calibrated against llama-bench"),
                          hw.kind == "measured", sec.get("error_band"),
                          tuple(sec.get("undetermined") or ()),
                          None if sec.get("cpu_features") is None
                          else frozenset(sec["cpu_features"]), hw.cpu_features,
                          int(sec.get("counts") or 1))
    why = ("datasheet profile" if hw.kind == "theoretical"
           else "no llama_cpp calibration in this profile")
    return SpeedModel(roofline_coefficients(hw.bandwidth, hw.peak_flops), hw.threads,
                      f"bandwidth and peak FLOP rate only ({why})", False,
                      machine_features=hw.cpu_features)


def _system(rows: list[Mapping[str, float]], seconds: list[float], keys: list[str]):
    """(A, scale): :func:`fit`'s system, each case's counts over its seconds (so that
    ``A @ coef = 1`` is an exact fit), each column over its largest value (``scale``; 1
    for a column no case counts)."""
    import numpy as np

    A = (np.array([[float(r.get(k, 0)) for k in keys] for r in rows]).reshape(len(rows), len(keys))
         / np.array(seconds, dtype=float)[:, None])
    scale = A.max(axis=0) if len(rows) else np.ones(len(keys))
    scale[scale == 0] = 1.0
    return A / scale, scale


def fit(rows: list[Mapping[str, float]], seconds: list[float], keys: list[str],
        iters: int = 20000) -> dict[str, float]:
    """Non-negative coefficients minimising the squared relative error
    ``sum_i (pred_i / seconds_i - 1)^2`` (pred linear in the coefficients): Lawson-Hanson
    would do; a projected coordinate descent is short and enough for a dozen unknowns."""
    import numpy as np

    A, scale = _system(rows, seconds, keys)
    b = np.ones(len(rows))
    x = np.zeros(len(keys))
    col = (A * A).sum(axis=0)
    r = b - A @ x
    for _ in range(iters):
        moved = 0.0
        for j in range(len(keys)):
            if col[j] == 0:
                continue
            new = max(0.0, x[j] + A[:, j] @ r / col[j])
            d = new - x[j]
            if d:
                r -= d * A[:, j]
                x[j] = new
                moved = max(moved, abs(d))
        if moved < 1e-12:
            break
    return {k: float(v / s) for k, v, s in zip(keys, x, scale)}


def undetermined(rows: list[Mapping[str, float]], seconds: list[float],
                 keys: list[str]) -> list[str]:
    """The keys whose coefficient the cases ``rows`` (counts) taking ``seconds`` do not pin
    down: the columns of :func:`fit`'s system (each count over its case's seconds, each
    column over its largest value) that a null vector of the system touches. A coefficient
    in that list can trade against the others it moves with and fit these cases equally
    well (two counts always in the same proportion, or more coefficients than cases), so a
    graph whose counts mix them otherwise is predicted from a guess. Keys no case counts
    are not listed (:meth:`SpeedModel.missing` names those)."""
    import numpy as np

    A, _ = _system(rows, seconds, keys)
    used = [j for j in range(len(keys)) if A[:, j].any()]
    if not used:
        return []
    _, s, vt = np.linalg.svd(A[:, used])
    null = vt[int((s > 1e-9 * s[0]).sum()):]    # rows of vt past the rank: the null space
    if not null.size:
        return []
    return [keys[j] for i, j in enumerate(used) if np.abs(null[:, i]).max() > 1e-6]


def repacked_weights(model, features: frozenset[str]) -> list[str]:
    """Weights llama.cpp puts in ``CPU_REPACK`` on a CPU with ``features`` (resolved by
    :func:`placement_features`), by graphcost.memory.placement's rules."""
    from graphcost.memory.placement import PlacementFlags, place

    return list(place(model, [], PlacementFlags(cpu_features=frozenset(features))).repacked)


def placement_features(sm: SpeedModel, given: frozenset[str] | None = None
                       ) -> tuple[frozenset[str], str]:
    """(ggml CPU features, where they come from) that llama.cpp's weight placement is
    counted with: ``given`` (``--cpu-features``), else those the profile's calibration
    used (its counts, hence its coefficients, assumed them), else the profile's machine's
    (its top-level ``cpu_features``: a datasheet profile's CPU), else this machine's."""
    from graphcost.memory.backends import host_cpu_features

    if given is not None:
        return frozenset(given), "--cpu-features"
    if sm.cpu_features is not None:
        return sm.cpu_features, "the profile's calibration"
    if sm.machine_features is not None:
        return sm.machine_features, "the profile's CPU"
    return host_cpu_features(), "this machine's"


@dataclass(frozen=True)
class CpuPlacement:
    """How llama.cpp's CPU backend holds a model's weights, for a prediction: the ggml CPU
    ``features`` it is counted with and where they come from (:func:`placement_features`),
    the weights in ``CPU_REPACK`` (:func:`repacked_weights`) and whether the tiled K-quant
    path is there (:func:`tiled_available`)."""

    features: frozenset[str]
    features_from: str
    repacked: tuple[str, ...]
    tiled: bool


def cpu_placement(sm: SpeedModel, model, given: frozenset[str] | None = None
                  ) -> CpuPlacement:
    """:class:`CpuPlacement` of ``model`` for a prediction with ``sm``, the features
    ``given`` (``--cpu-features``) or found as :func:`placement_features` says."""
    feats, feats_from = placement_features(sm, given)
    return CpuPlacement(feats, feats_from, tuple(repacked_weights(model, feats)),
                        tiled_available(feats))


def step_estimate(analysis, hw, threads: int | None = None,
                  features: frozenset[str] | None = None) -> dict:
    """``analyze --hardware``: the modelled seconds of this one graph on llama.cpp's CPU
    backend (the same model as ``graphcost speed``), with where the figure comes from.
    The step is taken to have its outputs (as ``--outputs`` says); weights are placed
    with ``features`` (:func:`placement_features`)."""
    import os

    sm = from_profile(hw)
    place = cpu_placement(sm, analysis.graph.model, features)
    nth = threads or sm.threads or hw.threads or os.cpu_count() or 1
    c = counts(analysis, place.repacked, tiled_threads=nth if place.tiled else None)
    sec = sm.seconds(c, threads)
    n = analysis.graph.run.n_tokens
    out = {"seconds": sec, "tokens_per_second": n / sec if sec > 0 else None,
           "verified": sm.verified and bool(sm.band), "how": sm.source,
           "cpu_features": sorted(place.features), "cpu_features_from": place.features_from,
           "counts": dict(sorted(c.items()))}
    if sm.band:
        out["error_band"] = dict(sm.band)
    if not out["verified"]:
        out["warning"] = ("datasheet profile: unverified" if hw.kind == "theoretical" else
                          "no llama-bench calibration in this profile: unverified")
    return out
