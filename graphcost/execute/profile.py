"""``graphcost profile``: run the graph on the kernels, time every node, and set each time
beside what the cost model says it moves and computes and what a roofline predicts.

One *step* is one ``llama_decode``: the prompt (``--token-ids``) as one ubatch, then each
decode token (``--decode-ids``, or ``--greedy K`` argmax tokens) as a ubatch of one. Each
step's graph runs ``repeat`` times (it is idempotent: the same cells are rewritten with
the same values) and each node's time is the median over the repeats. The first run of a
new graph shape is an untimed warm-up; its extra time over the median is reported as the
first-run overhead (Numba compiling kernels, or loading them from its cache).

Untimed rate and what node timing costs: after the timed steps the same tokens are
replayed ``repeat`` rounds through :meth:`Executor.step` as a caller runs it (one run per
step, no node clock, timed from outside with one clock read before and after), each step
run twice, untimed and with node timing on (``time_nodes``, timed the same way), the
sequence put back between the two (:meth:`Executor.checkpoint`); which of a pair goes
first alternates from step to step. The untimed rate is the median untimed step; node
timing's cost is the median over the pairs of timed / untimed - 1
(:func:`paired_overhead`): the two sides of a pair run one step apart (milliseconds), so
a change in the memory's state (minutes apart on a VM) or a burst of other load meets
both alike, where a ratio of two medians taken minutes apart would carry it.

Per node: measured seconds, modelled bytes (read + written) and FLOPs
(:mod:`graphcost.cost.analysis`), achieved GB/s and GFLOP/s, the roofline time on the
hardware profile and ``ratio = predicted / measured`` (1 means the kernel runs at the
profile's roofline; small means it is slower than the roofline predicts), and the executor
model's time (:func:`graphcost.cost.hardware.executor_seconds`: the probe's measured cost
curve of each op kind and weight type, never below the type's compute roof; a measured
profile's figures). The roofline of a matmul uses its weight type's peak FLOP rate
(:meth:`~graphcost.cost.hardware.Hardware.peak_for`). Roll-ups per op
kind and per layer are sums over the decode steps, per token (or over the prompt step when
there is no decode step).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from graphcost.format import ggml_types as gt
from graphcost.graph import ops
from graphcost.cost.analysis import Analysis, analyze_graph
from graphcost.graph.build import load_model
from graphcost.errors import SettingsError
from graphcost.execute.exec_ops import NUMPY_OPS, code_kind
from graphcost.execute.executor import Executor
from graphcost.cost.hardware import (Hardware, executor_seconds, model_op, parse,
                                     roofline_seconds)
from graphcost.format.model import ModelInfo
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import InputKind
from graphcost.graph.settings import Resolved, RunSettings


class _Rates:
    """What a measured span (one node, or a rollup of nodes) achieved: its ``bytes`` and
    ``flops`` per measured ``seconds``, and roofline ``predicted`` and executor-model
    ``modelled`` seconds per measured second; None where a figure is missing or nothing
    was measured."""

    seconds: float | None
    bytes: int | None
    flops: int | None
    predicted: float | None
    modelled: float | None

    def _per_second(self, x: float | None) -> float | None:
        return x / self.seconds if self.seconds and x is not None else None

    @property
    def gbps(self) -> float | None:
        v = self._per_second(self.bytes)
        return None if v is None else v / 1e9

    @property
    def gflops(self) -> float | None:
        v = self._per_second(self.flops)
        return None if v is None else v / 1e9

    @property
    def ratio(self) -> float | None:
        """predicted / measured."""
        return self._per_second(self.predicted)

    @property
    def model_ratio(self) -> float | None:
        """executor model (``modelled`` seconds) / measured."""
        return self._per_second(self.modelled)


@dataclass
class NodeRow(_Rates):
    """One node of one step."""

    index: int
    name: str
    op: str
    layer: int | None
    block: str
    view: bool
    seconds: float | None           # median over repeats (None: a view, not executed)
    bytes: int | None               # modelled bytes read + written (None: unmodelled)
    flops: int | None
    predicted: float | None         # roofline seconds
    bound: str | None               # memory | compute
    modelled: float | None          # executor model seconds (hardware.executor_seconds)
    numpy: bool = False             # ran in numpy, not a Numba kernel


@dataclass
class StepRow:
    n_tokens: int
    past: int
    argmax: int
    top5: list[tuple[int, float]]
    wall: float                         # median seconds of the whole graph (Python included)
    nodes: list[NodeRow]
    warmup: float | None = None         # seconds of the untimed first run, if there was one
    #: seconds of this step's Executor.step in each replay round, untimed and node-timed
    #: (one pair a round, run one after the other)
    untimed_runs: list[float] = field(default_factory=list)
    timed_runs: list[float] = field(default_factory=list)

    @property
    def node_seconds(self) -> float:
        return sum(n.seconds for n in self.nodes if n.seconds)

    @property
    def untimed(self) -> float | None:
        """Median seconds of Executor.step replayed untimed, as a caller runs it."""
        return float(np.median(self.untimed_runs)) if self.untimed_runs else None

    @property
    def timed(self) -> float | None:
        """Median seconds of Executor.step replayed with every node timed."""
        return float(np.median(self.timed_runs)) if self.timed_runs else None


def paired_overhead(timed: Sequence[float], untimed: Sequence[float]) -> float | None:
    """What timing adds, from runs paired by position (``timed[k]`` beside
    ``untimed[k]``): the median of ``timed[k] / untimed[k]`` - 1. None without pairs."""
    if len(timed) != len(untimed):
        raise ValueError(f"{len(timed)} timed runs against {len(untimed)} untimed: "
                         "pairs need both")
    if not timed:
        return None
    return float(np.median([t / u for t, u in zip(timed, untimed)])) - 1


@dataclass
class Rollup(_Rates):
    """The nodes of one op (or layer), summed per step: ``count`` nodes, measured
    ``seconds``, modelled ``bytes`` and ``flops``, roofline ``predicted`` seconds."""

    key: object
    count: int = 0
    seconds: float = 0.0
    bytes: int = 0
    flops: int = 0
    predicted: float = 0.0
    modelled: float = 0.0               # executor model seconds


@dataclass
class Profile:
    model_path: str
    model_name: str
    arch: str
    settings: dict
    numerics: str
    threads: int
    repeat: int
    hardware: Hardware
    steps: list[StepRow]
    kernels_import: float
    numba_cache: dict[str, int]
    notes: list[str] = field(default_factory=list)
    #: KV cells filled before the prompt (``--depth``, llama-bench's ``-d``), untimed
    depth: int = 0

    @property
    def prompt(self) -> StepRow:
        return self.steps[0]

    @property
    def decode(self) -> list[StepRow]:
        return self.steps[1:]

    @property
    def first_run_overhead(self) -> float:
        """Seconds the warm-up runs took beyond the timed medians (compile / cache load)."""
        return sum(max(0.0, s.warmup - s.wall) for s in self.steps if s.warmup is not None)

    def tokens_per_second(self) -> dict[str, float | None]:
        """Untimed (``*_untimed``: :meth:`Executor.step` replayed, the rate a caller gets)
        and with every node timed (``prompt``, ``decode``: the replay's node-timed
        runs); the decode rates are 1 / the median over every decode step's runs."""
        p = self.prompt

        def rate(n, runs):
            return n / float(np.median(runs)) if runs else None
        return {"prompt": rate(p.n_tokens, p.timed_runs),
                "decode": rate(1, [t for s in self.decode for t in s.timed_runs]),
                "prompt_untimed": rate(p.n_tokens, p.untimed_runs),
                "decode_untimed": rate(1, [t for s in self.decode for t in s.untimed_runs])}

    def timing_overhead(self) -> float | None:
        """How much longer a step is with every node timed than untimed: the median over
        the phase's steps and replay rounds of each pair's timed / untimed - 1
        (:func:`paired_overhead`)."""
        _, steps = self.phase()
        return paired_overhead([t for s in steps for t in s.timed_runs],
                               [u for s in steps for u in s.untimed_runs])

    def phase(self) -> tuple[str, list[StepRow]]:
        """The steps the roll-ups sum over: the decode steps, else the prompt."""
        return ("decode", self.decode) if self.decode else ("prompt", [self.prompt])

    def rollup(self, key: Callable[[NodeRow], object]) -> list[Rollup]:
        """Sums over the phase's steps, divided by their number (per step)."""
        _, steps = self.phase()
        acc: dict[object, Rollup] = {}
        for s in steps:
            for n in s.nodes:
                if n.view:
                    continue
                k = key(n)
                r = acc.setdefault(k, Rollup(k))
                r.count += 1
                r.seconds += n.seconds or 0.0
                r.bytes += n.bytes or 0
                r.flops += n.flops or 0
                r.predicted += n.predicted or 0.0
                r.modelled += n.modelled or 0.0
        k = len(steps)
        for r in acc.values():
            r.count //= k
            r.seconds /= k
            r.bytes //= k
            r.flops //= k
            r.predicted /= k
            r.modelled /= k
        return list(acc.values())

    def by_op(self) -> list[Rollup]:
        return sorted(self.rollup(lambda n: n.op), key=lambda r: -r.seconds)

    def by_layer(self) -> list[Rollup]:
        return sorted(self.rollup(lambda n: n.layer),
                      key=lambda r: (r.key is None, r.key if r.key is not None else 0))

    def estimate_accuracy(self, min_seconds: float = 10e-6, phase: str | None = None) -> dict:
        """median |estimate/measured - 1| over nodes slower than ``min_seconds`` (0: every
        executed node), overall and per op kind, for the roofline and for the executor
        model, over the ``phase``'s steps (``"prompt"``, ``"decode"``; default: the
        roll-ups' phase, :meth:`phase`). A threshold on the measured time picks, for a kind
        whose nodes mostly run under it, only its slowest (interrupted) calls: judge such
        kinds with 0."""
        if phase not in (None, "prompt", "decode"):
            raise ValueError(f"phase {phase!r}: prompt or decode")
        steps = self.phase()[1] if phase is None else \
            [self.prompt] if phase == "prompt" else self.decode
        hw = self.hardware
        ovh = hw.overhead
        ratios: dict[str, list[tuple[float, float]]] = {}
        for s in steps:
            for n in s.nodes:
                if n.seconds and n.seconds > min_seconds and n.ratio is not None:
                    ratios.setdefault(n.op, []).append((n.ratio, n.modelled / n.seconds))

        def med(v, i):
            return float(np.median([abs(r[i] - 1) for r in v])) if v else None
        every = [r for v in ratios.values() for r in v]
        return {"min_seconds": min_seconds, "nodes": len(every),
                "median_abs_error": med(every, 0),
                "median_abs_error_model": med(every, 1),
                "op_overhead_seconds": ovh,
                "by_op": {op: {"nodes": len(v), "median_abs_error": med(v, 0),
                               "median_ratio": float(np.median([r[0] for r in v])),
                               "median_abs_error_model": med(v, 1),
                               "median_model_ratio": float(np.median([r[1] for r in v])),
                               "op_overhead_seconds": hw.op_overhead(op)}
                          for op, v in sorted(ratios.items())}}


def mask_live(inputs) -> dict[int, np.ndarray]:
    """``id(mask tensor)`` -> bool ``[rows, n_kv]``: the cells each query attends, read
    from the attention masks (the KV cache's KQ mask, an encoder's own) as a step filled
    them (``Plan.inputs``; read right after the step, before the next one refills them)."""
    out = {}
    for gi, arr in inputs:
        if gi.kind in (InputKind.KQ_MASK, InputKind.NO_CACHE_MASK) and gi.tensor.ne[0]:
            out[id(gi.tensor)] = np.asarray(arr).reshape(-1, gi.tensor.ne[0]) != -np.inf
    return out


def live_fraction(node, live: dict[int, np.ndarray], tile: int | None = None,
                  split: tuple[int, int] | None = None) -> float:
    """The share of a FLASH_ATTN_EXT node's (query, cell) pairs its kernel computes (the
    kernel, as ggml's, skips a masked cell, never reading its K and V rows, while the cost
    model counts every cell), from the mask the step filled (:func:`mask_live`; without
    one, every cell, as the kernel runs without a mask; 1 for other nodes): a row or a decode's
    head group computes the cells its query attends (the kernel skips a masked cell);
    a query tile (``tile`` queries a head) every cell any of its queries attends, on all
    its lanes; the split-KV decode (``split`` = (threads, min cells), one query over at
    least that many cells) the cells live in its fullest chunk, times the chunks (the
    chunks run side by side: a sliding window's live cells in one chunk leave the other
    threads idle)."""
    if node.op != "FLASH_ATTN_EXT" or not node.src[1].ne[1]:
        return 1.0
    n_tok, n_kv = node.src[0].ne[1], node.src[1].ne[1]
    keep = live.get(id(node.src[3])) if len(node.src) > 3 else None
    if keep is None or keep.shape[0] < n_tok or keep.shape[1] != n_kv:
        keep = np.ones((n_tok, n_kv), dtype=bool)
    keep = keep[:n_tok]
    if tile:
        pairs = sum(tile * int(keep[i:i + tile].any(axis=0).sum()) for i in range(0, n_tok, tile))
    elif split and n_tok == 1 and n_kv >= split[1] and node.src[1].type == node.src[2].type \
            and node.src[1].type in (gt.F16, gt.F32):
        chunk = -(-n_kv // split[0])
        pairs = split[0] * max(int(keep[0, c:c + chunk].sum()) for c in range(0, n_kv, chunk))
    else:
        pairs = int(keep.sum())
    return pairs / (n_tok * n_kv)





def distinct_share(node, token_ids: list[int]) -> float:
    """The share of a gather's rows that are distinct: for a GET_ROWS from a weight
    table (the token embedding; its index is the step's ``token_ids``), distinct ids /
    ids; 1 for other nodes (a row select from an activation, whose index is not the
    tokens) and for a step whose ids do not match the node's rows."""
    if node.op != "GET_ROWS" or node.src[0].storage.role != "weight" \
            or len(token_ids) != node.src[1].n_elements or not token_ids:
        return 1.0
    return len(set(token_ids)) / len(token_ids)


def streamed_since(kinds: list[str], nbytes: list[float]) -> list[float]:
    """For each node of a step (``kinds``: the code each runs, in run order,
    :func:`graphcost.execute.exec_ops.code_kind`; ``nbytes``: the bytes each reads and
    writes), the bytes the nodes run since the last node of its kind moved,
    the step taken as repeating (``profile`` runs each step's graph back to back, and
    decode steps repeat one graph): a step's first node of a kind counts from that kind's
    last node a step before, the only node of its kind from itself a step before. The
    executor model's measure of how cold a node's code and tables are
    (:func:`graphcost.cost.hardware.cold_share`)."""
    n = len(kinds)
    out = [0.0] * n
    last: dict[str, float] = {}
    total = 0.0
    for j in range(2 * n):          # the first pass only sets where each kind last ran
        k = kinds[j % n]
        if j >= n:
            out[j - n] = total - last[k]
        total += nbytes[j % n]
        last[k] = total
    return out


def after_small(prev: Tensor | None, node: Tensor) -> bool:
    """Whether ``node``, whose run order puts ``prev`` (a node, None: nothing) just
    before it, runs right after a small op that wrote its first input: that input in
    the caches, nothing streamed since (the executor model reads the probe's
    ``by_op_local`` / ``by_op_tokens_local`` curve for it,
    :func:`graphcost.cost.hardware.executor_seconds`); not after a matmul, which
    streamed its weights on the kernel threads, nor after a small op that wrote
    elsewhere (a V cache write after the K cache's: its input came from a matvec)."""
    return prev is not None and prev.op not in ops.MATMUL and bool(node.src) \
        and node.src[0].storage is prev.storage


def _node_rows(a: Analysis, med: np.ndarray, executed: list[bool], hw: Hardware,
               token_ids: list[int], live: dict[int, np.ndarray], threads: int) -> list[NodeRow]:
    """The rows of a step of ``token_ids`` (its queries): for the executor model of flash
    attention, the (query, cell) pairs its kernel computes (:func:`live_fraction`, from
    the step's masks ``live``, with the probe's query-tile curves for this many queries
    the tile kernel's, the split-KV decode's over ``threads``); for the token embedding
    gather, the ids that repeat (:func:`distinct_share`)."""
    n_tokens = len(token_ids)
    oc = hw.extra.get("op_costs") or {}
    tile_min, tile = oc.get("flash_attn_tile_min_tokens"), oc.get("flash_attn_tile_queries")
    tiled = bool(tile and tile_min and n_tokens >= tile_min and oc.get("flash_attn_tiled"))
    split = (threads, oc["flash_attn_split_min_cells"]) \
        if oc.get("flash_attn_split_min_cells") else None
    rows = []
    moved = [(nc.node.op, 0.0 if nc.cost is None else nc.cost.bytes_read + nc.cost.bytes_written)
             for nc, ran in zip(a.nodes, executed) if ran]
    since = iter(streamed_since([code_kind(k) for k, _ in moved], [b for _, b in moved]))
    # the node run before each (steps repeat: the first node's is the step's last): a
    # node right after a small op that wrote its input reads the probe's local curve
    # (after_small)
    prev = next((nc.node for nc, ran in zip(reversed(a.nodes), reversed(executed)) if ran),
                None)
    for nc, sec, ran in zip(a.nodes, med, executed):
        n = nc.node
        c = nc.cost
        nbytes = None if c is None else c.bytes_read + c.bytes_written
        flops = None if c is None else c.flops
        pred, bound, model = None, None, None
        since_n = next(since) if ran else None
        if c is not None and ran:
            wtype = gt.type_name(n.src[0].type) if n.src and n.op in ops.MATMUL else None
            pred, bound = roofline_seconds(nbytes, flops, hw, peak=hw.peak_for(wtype))
            f = live_fraction(n, live, tile if tiled else None, split)
            mat = n.op in ops.MATMUL
            model = executor_seconds(model_op(n), nbytes * f, flops * f, hw, wtype,
                                     head_size=n.src[0].ne[0] if n.op == "FLASH_ATTN_EXT"
                                     else None,
                                     rows=n.src[1].ne[1] * n.src[1].ne[2] * n.src[1].ne[3]
                                     if mat else 1,
                                     weight_bytes=n.src[0].data_bytes if mat else None,
                                     tokens=n_tokens if n.ne[1] * n.ne[2] * n.ne[3] > 1
                                     else 1, since=since_n,
                                     local=after_small(prev, n),
                                     distinct=distinct_share(n, token_ids))
        if ran:
            prev = n
        rows.append(NodeRow(nc.index, n.name, n.op, n.layer, n.block, not ran,
                            float(sec) if ran else None, nbytes, flops, pred, bound, model,
                            n.op in NUMPY_OPS))
    return rows


_FIRST_IMPORT: dict[str, float] = {}


def timed_kernel_import() -> float:
    """Load the kernels package; the seconds the first load in this process took (imports
    and Numba's cache index, not compilation, which happens at the first call)."""
    if "seconds" not in _FIRST_IMPORT:
        from graphcost.execute.kernels_loader import load_kernels
        t0 = time.perf_counter()
        load_kernels()
        _FIRST_IMPORT["seconds"] = time.perf_counter() - t0
    return _FIRST_IMPORT["seconds"]


def numba_cache_stats(K) -> dict[str, int]:
    """Entry-point kernels compiled in this process (misses) or loaded from Numba's
    on-disk cache (hits)."""
    hits = misses = 0
    for mod_name in getattr(K, "__all__", []):
        mod = getattr(K, mod_name)
        for obj in vars(mod).values():
            stats = getattr(obj, "stats", None)
            if stats is not None and hasattr(stats, "cache_hits"):
                hits += sum(stats.cache_hits.values())
                misses += sum(stats.cache_misses.values())
    return {"hits": hits, "misses": misses}


def depth_ids(depth: int, n_vocab: int) -> list[int]:
    """The token ids that fill ``--depth`` cells: pseudo-random over the vocabulary, the
    same every run (seed 0), as llama-bench fills its ``-d`` cells with random tokens."""
    return [int(t) for t in np.random.default_rng(0).integers(0, n_vocab, depth)]


def check_steps(token_ids: list[int], decode_ids: list[int], greedy: int, repeat: int,
                depth: int = 0) -> None:
    """The step flags, checked before anything is run or probed (one line each)."""
    if depth < 0:
        raise SettingsError(f"--depth {depth} must be >= 0")
    if not token_ids:
        raise SettingsError("--token-ids needs at least one token id")
    if decode_ids and greedy:
        raise SettingsError("give --decode-ids or --greedy, not both")
    if repeat < 1:
        raise SettingsError(f"--repeat {repeat} must be >= 1")


def run_profile(path: str | os.PathLike | ModelInfo, settings: RunSettings | Resolved,
                token_ids: list[int], *,
                decode_ids: Iterable[int] = (), greedy: int = 0, repeat: int = 3,
                hardware: Hardware, numerics: str = "fast", threads: int | None = None,
                depth: int = 0,
                progress: Callable[[str, int], None] | None = None) -> Profile:
    """Run and time the steps; ``progress(description, advance)`` is called after each run
    (``advance`` is 0 for a warm-up run, 1 for a timed one). ``depth``: that many cells
    are filled first (:func:`depth_ids`, in ubatches of the context's size, untimed), so
    the prompt starts at position ``depth``."""
    decode_ids = list(decode_ids)
    check_steps(token_ids, decode_ids, greedy, repeat, depth)
    model = path if isinstance(path, ModelInfo) else load_model(path)
    import_s = timed_kernel_import()
    ex = Executor(model, settings, numerics=numerics, threads=threads)
    tick = progress or (lambda d, n: None)
    fill = depth_ids(depth, model.n_vocab)
    for i in range(0, depth, ex.run.n_ubatch):
        ex.step(fill[i:i + ex.run.n_ubatch])
        tick(f"filling --depth {depth}: {min(i + ex.run.n_ubatch, depth)} cells", 0)
    start = ex.checkpoint()            # the replay's start: the filled cells, then the steps
    n_steps = 1 + (len(decode_ids) or greedy)
    analyses: dict[int, Analysis] = {}
    steps: list[StepRow] = []
    tokens = list(token_ids)
    fed: list[list[int]] = []
    for i in range(n_steps):
        fed.append(list(tokens))
        plan = ex.plan(len(tokens))
        new = id(plan) not in analyses
        res = ex.step(tokens, repeat=repeat, warmup=new, time_nodes=True,
                      on_run=lambda timed: tick(f"step {i + 1}/{n_steps}"
                                                + ("" if timed else " (warm-up)"), int(timed)))
        if new:
            analyses[id(plan)] = analyze_graph(plan.graph)
        a = analyses[id(plan)]
        ns = np.array([[t if t is not None else 0 for t in tm.ns] for tm in res.timings],
                      dtype=np.float64)
        med = np.median(ns, axis=0) / 1e9
        executed = [t is not None for t in res.timings[0].ns]
        logits = res.logits[-1]
        top = np.argsort(-logits, kind="stable")[:5]
        wall = float(np.median([tm.wall_ns for tm in res.timings])) / 1e9
        steps.append(StepRow(res.n_tokens, res.past, int(top[0]),
                             [(int(t), float(logits[t])) for t in top], wall,
                             _node_rows(a, med, executed, hardware, fed[-1],
                                        mask_live(plan.inputs), ex.threads),
                             res.warmup_ns / 1e9 if res.warmup_ns is not None else None))
        if i + 1 < n_steps:
            tokens = [decode_ids[i]] if decode_ids else [int(top[0])]
    # the same tokens again through Executor.step as a caller runs it (no warm-up, one
    # run per step, one clock read around it; every shape is compiled by now), each step
    # twice, untimed and node-timed, the sequence put back between (Executor.checkpoint),
    # which goes first alternating from step to step
    clock = time.perf_counter_ns
    same = True
    for r in range(repeat):
        start()
        for k, (s, toks) in enumerate(zip(steps, fed)):
            back = ex.checkpoint()
            for j, time_nodes in enumerate((False, True) if (r + k) % 2 == 0 else (True, False)):
                if j:
                    back()
                t0 = clock()
                out = ex.step(toks, time_nodes=time_nodes)
                sec = (clock() - t0) / 1e9
                (s.timed_runs if time_nodes else s.untimed_runs).append(sec)
                same = same and int(np.argmax(out.logits[-1])) == s.argmax
        tick(f"replay {r + 1}/{repeat} (each step untimed and node-timed)", 0)
    notes = list(ex.notes)
    if not same:
        notes.append("the replay's argmax differed from the timed run's at some step")
    if any(n.numpy for s in steps for n in s.nodes if not n.view):
        notes.append("ops " + ", ".join(sorted({n.op for s in steps for n in s.nodes
                                               if n.numpy and not n.view}))
                     + " ran in numpy (no kernel)")
    run = next(iter(analyses.values())).graph.run
    return Profile(str(model.header.path), model.name, model.arch, run.to_dict(), numerics, ex.threads, repeat,
                   hardware, steps, import_s, numba_cache_stats(ex.K), notes, depth)


def quick_hardware(threads: int | None = None) -> Hardware:
    """A profile of this machine measured now with a small probe (64 MiB, 3 repeats)."""
    from graphcost.execute.hwprobe import probe

    timed_kernel_import()
    t0 = time.perf_counter()
    doc = probe(mib=64, repeat=3, threads=threads)
    doc["name"] = "this machine (quick probe)"
    doc["description"] += f"; probed in {time.perf_counter() - t0:.1f} s"
    return parse(doc, None)
