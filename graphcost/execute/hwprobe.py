"""``graphcost hwprobe``: this machine's memory bandwidth and peak FLOP rate, measured with
the same Numba kernels the executor runs.

* **Bandwidth** (streaming read): ``kernels.stream.read_rows``, a parallel sum over a
  float32 array much larger than the caches (default 256 MiB): every byte read once, the
  plainest loop a kernel can be. This is the profile's bandwidth, the roofline's memory
  roof.
* **Matrix-vector rate per weight type** (``memory_bandwidth.by_type``): a MUL_MAT node
  of one activation row by a matrix of the same size, compiled by
  :mod:`graphcost.execute.exec_ops` and called as the executor calls it (decode: the
  fused ``kernels.matmul.fused_matvec`` for the block types, ``--numerics fast``); each
  weight byte is read once, so rate / bandwidth is how close that kernel comes to the
  memory's limit. Each type's runs alternate with runs of the streaming read, so both
  see the same load (the bandwidth is the median over all of those runs).
* **Peak FLOP rate**: ``kernels.matmul.mul_mat``'s tiled path on an F32 matrix that fits in
  L2-sized tiles, multiplied by 256 activation rows (compute-bound; FMA = 2 FLOPs); and
  per weight type (``peak_flops.by_type``) the best rate the executor's matmul nodes of
  that type reach: its prompt MUL_MATs (``op_costs.matmul``: 1024-column weights by 16
  and by 64 activation rows, ``kernels.gemm``'s panels where the type has them) or its
  decode matvec on 256 KiB of cache-resident weights, whichever is higher (FLOPs over
  seconds as measured: no fit, so noise cannot make it larger than what ran); so a
  quantized matvec meets its own compute roof, not the F32 one.
* **Prompt matmuls** (``op_costs.matmul``): MUL_MAT nodes of :data:`PROMPT_SHAPES`
  (two activation row counts above ``kernels.matmul.MATVEC_MAX_N`` on one matrix, and a
  smaller matrix), each call on a new slice of the type's matrix, as the executor runs
  them (``kernels.gemm``'s panels, the four-row dots, the tiled float path): the per-row
  rate and the once-a-call work the model (:func:`graphcost.cost.hardware.matmul_fit`)
  is read from.
* **Op costs** (``op_costs``): each op kind the executor runs, compiled by
  :mod:`graphcost.execute.exec_ops` exactly as for a graph node and called the way the
  executor calls it (bound to its arrays where the node allows, through the overload it
  compiled) and timed as the executor's loop times a node (each sequence of the probe's
  calls is a plan of bound steps run by :func:`graphcost.execute.plan.run_plan`,
  :func:`graphcost.execute.plan.calls_plan`: from a plain loop of its own, the probe's
  decode-sized norms, ROPEs and ADDs came out 10-30% above the decode's same nodes), at a
  ladder of sizes (64 to 65536 values a row; again on
  :data:`LADDER_TOKENS` tokens from 1024 values, ``by_op_tokens``, for a prompt's nodes;
  flash attention over 16 to 4096 attended cells of a window of at least
  :data:`FA_MIN_KV`, K and V caches of their own, 4 query heads per KV head, head sizes
  64, 128 and 256: ``FLASH_ATTN_EXT@64``, ``FLASH_ATTN_EXT``, ``FLASH_ATTN_EXT@256``,
  and one tile of ``kernels.attention.QT`` queries a head, ``flash_attn_tiled``), each
  point ``[bytes, flops, seconds]`` with bytes and FLOPs from the cost model
  (:func:`graphcost.cost.costs.op_cost`; flash attention: the attended cells' share). A
  decode runs a matvec, then a few small ops, then the next matvec. So each call is
  timed twice: right after MUL_MAT nodes over weights that are not in the caches (the
  fused decode matvec over about 0.5 MiB slices of a pool larger than the last-level
  cache) whose own outputs are its float inputs, as a node after a matmul runs
  (``by_op``; GET_ROWS, a step's first node, gathers distinct rows of a
  :data:`TABLE_BYTES` table on 4 KiB pages (:func:`small_pages`) after a matvec over the whole
  pool, as the token embedding follows the previous step's output matmul;
  ``GET_ROWS@activation``, a GET_ROWS from rows of an activation its matvecs just wrote,
  as the last layer's ``get_rows(cur, inp_out_ids)``), and right
  after the op before it in the ladder's list, as a node in a chain of small ops runs
  (``by_op_chained``: measured, not modelled, docs/executor.md); and one row again after
  its matvecs and a serial element-wise kernel that rewrote its first activation on the
  calling thread, as a decode's node after a small op runs (``by_op_local``: a residual
  ADD after the norm's MUL; a norm's weight and an ADD's second input, the residual, are
  left where their matvecs wrote them); the same on several tokens
  (``by_op_tokens_local``: a prompt's Q scale after its rope; the rewrite's kernel
  parallel from its work threshold on, as a prompt's small op runs). A
  node's second input (an ADD's, a gated op's gate, a norm's weight) is fed by a matvec
  of 32 columns, not about 0.5 MiB: a node meets one matvec's streaming right before
  it, not two (with two, the ladder's ADD of 512 and 1024 values ran 0.15-0.3 us over
  a decode's ADD of 640 in every probe of 2026-11-27). Each family (one row, several tokens, flash attention for one
  query, for a tile) is timed apart, GET_ROWS last. Then each node of the ladders again
  after a flush (a matvec streaming :data:`FLUSH_MIB` MiB, as a step's output matmul
  does) with its kind not run since (``by_op_cold``, ``by_op_tokens_cold``: a step's
  first node of its kind, after the output matmul; one flush before the nodes of one
  size, one of each kind, so that the path all calls share is warm again as in a
  step); ``since_bytes``
  gives, per curve, the median bytes streamed (matvec weights and the nodes' bytes)
  since a node of its kind last ran at its calls, the figure the
  executor model places a node between the curves by
  (:func:`graphcost.cost.hardware.cold_share`). The same schedule again after a smaller
  flush of :data:`MID_MIB` MiB (a layer's matvecs) gives the middle curves
  (``by_op_midN``, ``by_op_tokens_midN``) and their ``since_bytes``. MUL_MAT is measured per weight type
  (``op_costs.matvec``): one activation row times slices of 64 KiB to 4 MiB of the
  type's ``mib`` MiB matrix (each call a new slice, each size's after the size before's,
  wrapping: cold when ``mib`` is larger than twice the last-level cache) and the whole
  matrix, on 4 KiB pages as a GGUF's mapped weights (:func:`matvec_ladder`,
  :func:`small_pages`); the prompt matmuls read the same copy.
  The smallest size's time of each op kind is its ``op_overhead.by_op``: what a node
  costs end to end (Python call, Numba dispatch, waking the kernel threads) when it has
  almost no work.

Each figure is the median of ``repeat`` timed calls after one warm-up call (compilation or
cache load is never timed); the op-cost curves' points are medians over passes, each over
arrays of its own (:func:`op_cost_passes`: where the arrays land moves a whole curve).
These are achieved rates of graphcost's kernels, which is what a roofline for graphcost's
executor needs; a datasheet peak is higher.
"""
from __future__ import annotations

import mmap
import os
import platform
import time
from datetime import datetime, timezone
from functools import partial
from typing import Callable

import numpy as np

from graphcost.format import ggml_types as gt
from graphcost.cost.hardware import GET_ROWS_ACTIVATION
from graphcost.memory.backends import host_cpu_features

#: row length of the probe matrices (elements)
K = 4096


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    fn()                                        # warm-up: compile or load from cache
    return float(np.median([_seconds(fn) for _ in range(repeat)]))


def probe(mib: int = 256, repeat: int = 5, threads: int | None = None,
          progress: Callable[[str], None] | None = None) -> dict:
    """Measure and return the profile document (see :mod:`graphcost.cost.hardware`), the
    kernels on ``threads`` threads (default: Numba's now) for this call only."""
    from graphcost.execute.threads import kernel_threads

    with kernel_threads(threads):
        return _probe(mib, repeat, progress)


def stream_read(mib: int = 256, threads: int | None = None, repeat: int = 5) -> float:
    """Bytes/s of the probe's streaming read (``kernels.stream.read_rows`` over ``mib`` MiB
    of float32), median of ``repeat`` runs after one untimed: the memory's state now."""
    from graphcost.execute.kernels_loader import load_kernels
    from graphcost.execute.threads import kernel_threads

    K_ = load_kernels()
    big = np.ones(((mib << 20) // (4 * K), K), dtype=np.float32)
    with kernel_threads(threads):
        return big.nbytes / _median_seconds(lambda: K_.stream.read_rows(big), repeat)


def _probe(mib: int, repeat: int, progress: Callable[[str], None] | None) -> dict:
    import numba

    from graphcost.execute.exec_ops import Ctx
    from graphcost.execute.kernels_loader import load_kernels
    from graphcost.execute.weights import random_raw, read_only

    K_ = load_kernels()
    rng = np.random.default_rng(0)
    say = progress or (lambda s: None)
    x = rng.standard_normal((1, K)).astype(np.float32)
    big = np.ones(((mib << 20) // (4 * K), K), dtype=np.float32)     # touched: resident
    K_.stream.read_rows(big)                                          # compile or load
    ctx = Ctx(K_, "fast")
    stream_runs: list[float] = []
    by_type = {}
    beside = {}         # the streaming read timed alternately with each type's matvec
    matvec = {}
    hot: dict[str, float] = {}          # FLOP/s of each type's matvec on cache-resident weights
    prompt_mm: dict[str, list[list]] = {}
    calls = max(5, 4 * repeat)          # each op-cost and matvec-ladder point: median of calls
    for t in K_.quants.SUPPORTED:
        t = gt.GGMLType(int(t))
        rows = max(1, (mib << 20) // gt.row_size(t, K))
        say(f"matvec: {gt.type_name(t)} {rows} x {K}")
        w = read_only(random_raw(t, (K, rows), rng).reshape(rows, gt.row_size(t, K)))
        node = _matmul_node(t, K, rows, 1)
        mv = _node_calls(node, ctx, [_values(node, [w, x])])[1][0]  # compiled or loaded from cache
        runs, reads = [], []
        for _ in range(repeat):                     # alternate: the same load for both
            reads.append(_seconds(lambda: K_.stream.read_rows(big)))
            runs.append(_seconds(mv))
        stream_runs += reads
        by_type[gt.type_name(t)] = round(w.nbytes / float(np.median(runs)))
        beside[gt.type_name(t)] = round(big.nbytes / float(np.median(reads)))
        del mv
        w = small_pages(w)                          # the curves: as a GGUF's mapped weights
        matvec[gt.type_name(t)], hot[gt.type_name(t)] = matvec_ladder(ctx, t, w, calls, rng)
        say(f"prompt matmuls: {gt.type_name(t)}")
        prompt_mm[gt.type_name(t)] = prompt_matmul(ctx, t, w, calls, rng)
        del w
    bandwidth = round(big.nbytes / float(np.median(stream_runs)))
    big = None                                      # free before the FLOP probe

    m, n = 1024, 256
    say(f"peak FLOP rate: f32 {m} x {K} times {n} rows")
    w = read_only(random_raw(gt.F32, (K, m), rng).reshape(m, gt.row_size(gt.F32, K)))
    xs = rng.standard_normal((n, K)).astype(np.float32)
    sec = _median_seconds(lambda: K_.matmul.mul_mat(w, gt.F32, K, m, xs), repeat)
    flops = 2.0 * m * n * K / sec
    peak_by_type = {name: round(best) for name, pts in prompt_mm.items()
                    if (best := max([hot[name]] + [f / t for _, f, t in pts if t > 0])) > 0}
    say("op costs")
    curves, passes = op_cost_passes(ctx, rng, calls, mib)
    per_pass = (f"median over {passes} pass{'es' if passes > 1 else ''}, each over arrays "
                f"of its own, of {calls // passes} calls")
    by_op = curves["by_op"]
    overheads = {op: pts[0][2] for op, pts in by_op.items() if "@" not in op}
    overheads["MUL_MAT"] = matvec[gt.type_name(gt.GGMLType.Q8_0)][0][2]
    overhead = float(np.median(list(overheads.values())))
    n_threads = numba.get_num_threads()
    return {
        "name": None,
        "description": f"{_cpu_name()}, {n_threads} threads (measured by graphcost hwprobe)",
        "kind": "measured",
        "threads": n_threads,
        "cpu": _cpu_name(),
        "cpu_features": sorted(host_cpu_features()),
        "cpu_features_source": "/proc/cpuinfo of the machine probed, under ggml's names",
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "memory_bandwidth": {
            "bytes_per_second": bandwidth,
            "how": f"kernels.stream.read_rows over {mib} MiB of float32, median of "
                   f"{len(stream_runs)} runs alternating with the matvec runs",
            "by_type": by_type,
            "by_type_how": f"the executor's matmul (--numerics fast), 1 row x {mib} MiB "
                           f"matrix of each type, median of {repeat}: bytes/s of weights",
            "stream_by_type": beside,
            "stream_by_type_how": f"the streaming read's median over the {repeat} runs "
                                  f"alternating with each type's matvec runs: the memory's "
                                  f"state while that type was timed (bytes_per_second is "
                                  f"the median over every type's)",
            "source": "graphcost hwprobe on this machine",
        },
        "peak_flops": {
            "flops_per_second": round(flops),
            "how": f"kernels.matmul.mul_mat tiled path, f32 {m}x{K} weights x {n} rows "
                   f"(2*M*N*K FLOPs), median of {repeat}",
            "by_type": peak_by_type,
            "by_type_how": f"per weight type, the highest FLOP/s of the executor's prompt "
                           f"MUL_MAT nodes (op_costs.matmul: FLOPs / seconds of each point), "
                           f"and its decode matvec node on {HOT_BYTES >> 10} KiB of "
                           f"cache-resident weights (median of {calls} calls)",
            "source": "graphcost hwprobe on this machine",
        },
        "op_overhead": {
            "seconds": overhead,
            "how": "the smallest size of each op kind's op_costs curve (MUL_MAT: q8_0's), "
                   "end to end; seconds is the median over op kinds",
            "by_op": overheads,
            "source": "graphcost hwprobe on this machine",
        },
        "op_costs": {
            "how": f"each op kind compiled and called as the executor does, at a ladder of "
                   f"sizes: by_op called after a matvec over weights not in the caches, "
                   f"by_op_chained called again at once (not modelled), by_op_local "
                   f"one row after its matvecs and a serial kernel that rewrote its "
                   f"first activation (a decode's node after a small op), "
                   f"by_op_tokens_local the same on several tokens (the kernel's "
                   f"parallel form from its work threshold on); by_op_again, "
                   f"by_op_local_again the same with a node of the same op (next "
                   f"ladder size) run right before the matvecs, or right before it: "
                   f"its code warm, as a decode's nodes mostly meet it; {per_pass} "
                   f"(op_cost_passes); points are [bytes, flops, seconds] (cost model's "
                   f"bytes and FLOPs); matvec: 1 row x slices of each type's {mib} MiB "
                   f"matrix on 4 KiB pages (a new slice each call), and the whole matrix",
            **{k: curves[k] for k in ("by_op", "by_op_chained", "by_op_local", "by_op_again",
                                      "by_op_local_again", "by_op_tokens",
                                      "by_op_tokens_local")},
            "by_op_tokens_rows": LADDER_TOKENS,
            **{k: v for k, v in curves.items() if k.endswith("_cold") or "_mid" in k
               or k == "since_bytes"},
            "cold_how": f"by_op_cold, by_op_tokens_cold: each node after a matvec "
                        f"streaming {min(FLUSH_MIB, 4 * mib)} MiB (a step's output "
                        f"matmul), its op kind not run since (one flush before the nodes "
                        f"of one size, one of each code kind (nodes sharing a kernel, "
                        f"ADD and MUL, in rows of their own), in an order turning round by "
                        f"round; GET_ROWS's nodes each after a flush of its own), "
                        f"median of {cold_rounds(calls // passes)} a pass (merged as "
                        f"the warm curves); by_op_midN, "
                        f"by_op_tokens_midN: the same after a matvec over N MiB of "
                        f"those weights, the next slice each time; since_bytes: per curve, "
                        f"the median bytes streamed (matvec weights, nodes' bytes) since "
                        f"a node of its code kind (ADD, SUB, MUL, DIV: one kernel) last ran, at "
                        f"its calls",
            "matvec": matvec,
            "flash_attn_tiled": curves["flash_attn_tiled"],
            "flash_attn_tile_min_tokens": int(K_.attention.TILE_MIN_TOKENS),
            "flash_attn_tile_queries": int(K_.attention.QT),
            "flash_attn_split_min_cells": int(K_.attention.SPLIT_KV_MIN),
            "matmul": prompt_mm,
            "matmul_how": f"prompt MUL_MAT nodes as the executor runs them, {LADDER_K} "
                          f"columns, (weight rows, activation rows) = {PROMPT_SHAPES}, "
                          f"a new slice of the matvec's matrix each call, median of {calls}; "
                          f"points are [weight "
                          f"bytes, flops, seconds]; used above matvec_max_rows activation rows",
            "matvec_max_rows": int(K_.matmul.MATVEC_MAX_N),
            # kernels.gemm._gemm pads the activation rows to a multiple of ACTS and does
            # the padding's work (the K-quant panels and the four-row dots do not)
            "matmul_row_tile": {gt.type_name(gt.GGMLType(int(c))): int(K_.gemm.ACTS)
                                for c in K_.gemm.LAYOUT},
            "source": "graphcost hwprobe on this machine",
        },
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _point(node, seconds: float) -> list:
    """``[bytes, flops, seconds]`` of ``node`` (bytes read + written as the analysis counts
    them: every source, the work buffer written and read back)."""
    from graphcost.cost.costs import op_cost

    c = op_cost(node)
    return [int(sum(c.reads) + c.write + 2 * c.work), int(c.flops), float(seconds)]


def _matmul_node(t: gt.GGMLType, k: int, rows: int, n: int):
    """A MUL_MAT of ``rows`` weight rows of ``k`` columns (type ``t``) by ``n`` F32
    activation rows, built with the ggml graph mirror."""
    from graphcost.graph.ggml_graph import Graph

    g = Graph()
    return g.mul_mat(g.new_tensor(t, [k, rows], role="weight"), g.new_tensor(gt.F32, [k, n]))


def _values(node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``node``'s sources over C-contiguous ``arrays`` (raw weight rows, float32 rows),
    in the kernels' layout (:func:`~graphcost.execute.exec_ops.tensor_view`, no copy)."""
    from graphcost.execute.exec_ops import flat_bytes, tensor_view

    return [tensor_view(flat_bytes(a), s, 0) for s, a in zip(node.src, arrays)]


def _node_calls(node, ctx, arg_sets: list[list[np.ndarray]]) -> tuple[object, list[Callable[[], object]]]:
    """``node`` compiled by :mod:`graphcost.execute.exec_ops` once (returned first: a
    :class:`~graphcost.execute.exec_ops.KernelNode` keeps its output in ``out``), and one zero-argument
    call for each set of source values (numpy arrays in the kernels' layout, as
    :func:`~graphcost.execute.exec_ops.tensor_view` makes them: :func:`_values`), each called as the
    executor calls a node whose sources are fixed (``graphcost/execute/plan.py``): bound
    to its arrays where the node allows (:meth:`~graphcost.execute.exec_ops.KernelNode.bind`)
    and through the numba overload it compiled
    (:func:`~graphcost.execute.exec_ops.resolve_entry`). Each call has run once (compile
    or load from Numba's cache) on the first set only: the others' data stays where it
    was (not pulled into the caches)."""
    from graphcost.execute.exec_ops import compile_node, resolve_entry

    fn = compile_node(node, ctx)
    calls = []
    for i, args in enumerate(arg_sets):
        bound = fn.bind(*args) if hasattr(fn, "bind") else None
        call = partial(fn, *args) if bound is None else bound
        if i == 0:
            call()                  # compiles the overload the others use (same types)
        calls.append(call if bound is None else resolve_entry(bound))
    return fn, calls


def small_pages(a: np.ndarray) -> np.ndarray:
    """A read-only copy of ``a``'s bytes (flat ``uint8``) in anonymous memory that the
    kernel is told not to back with huge pages (``MADV_NOHUGEPAGE``), where the platform
    has it: 4 KiB pages, as a GGUF's weights mapped from a file are (the page cache's
    pages; ``/proc/meminfo`` FilePmdMapped 0 kB on the EPYC VM while the executor ran),
    where numpy's arrays of 4 MiB and more are madvised into huge pages. On the VM a
    matvec over cold 110 / 440 / 892 KiB slices of Q5_0 took 4.7 / 13.2 / 22.7 us on 4 KiB
    pages and 4.1 / 11.8 / 20.9 on huge pages (medians of three rounds over 96 MiB,
    2026-11-27 13:10 UTC); a decode's own 892 KiB ``ffn_gate`` nodes 22.5-25.8."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    advise = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advise is None or not flat.nbytes:
        out = flat.copy()
    else:
        m = mmap.mmap(-1, flat.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(advise)           # before the first touch: no page is huge yet
        out = np.frombuffer(m, dtype=np.uint8)
        out[:] = flat
    out.flags.writeable = False
    return out


#: row length of the matvec ladder's slices, and their sizes (bytes of weights)
LADDER_K = 1024
LADDER_BYTES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
#: the ladder size whose slice is also timed over and over, in the caches: the matvec's
#: own compute rate (a candidate for the type's peak FLOP rate)
HOT_BYTES = 256 << 10


def matvec_ladder(ctx, t: gt.GGMLType, w: np.ndarray, calls: int,
                  rng) -> tuple[list[list], float]:
    """Points of one activation row times slices of ``w`` (its bytes read as rows of
    :data:`LADDER_K`) of :data:`LADDER_BYTES`, a new slice each call, then all of ``w``
    (the last point, median of ``calls``), each a MUL_MAT node
    run as the executor runs it (decode: ``kernels.matmul.fused_matvec`` for the block
    types, into the node's own output); and the FLOP/s of the :data:`HOT_BYTES` slice
    called ``calls`` times in a row (cache-resident weights: the kernel's compute rate).

    ``w`` is on 4 KiB pages (:func:`small_pages`), as a GGUF's mapped weights are. The
    slices follow each other from one size to the next, wrapping: a
    slice is read again only after the rest of ``w`` went by, so when ``w`` is larger
    than twice the last-level cache every call reads weights from memory, as a decode's
    matvecs do (each reads its own tensor, not read since the step before). Until
    2026-11-27 each size took the first ``calls`` slices of ``w``, most of which the size
    before had just read: 20 MiB of 1 MiB slices sat in the 32 MiB L3 of the EPYC VM,
    and the model put gemma3 270M's decode matvecs at 0.71-0.79 of their measured time
    (892 KiB of Q5_0: 15.5-16.0 us modelled, 20.3-21.7 measured; slices spread over
    64 MiB took 21-23 us)."""
    rb = gt.row_size(t, LADDER_K)
    pool = w.reshape(-1)[: (w.nbytes // rb) * rb].reshape(-1, rb)
    x = rng.standard_normal((1, LADDER_K)).astype(np.float32)
    pts, hot = [], 0.0
    cursor = 0                          # the next slice's first row
    for size in LADDER_BYTES:
        rows = max(1, size // rb)
        if rows * 2 > len(pool):
            break
        node = _matmul_node(t, LADDER_K, rows, 1)
        n_slices = min(len(pool) // rows, calls)
        starts = []
        for _ in range(n_slices):
            cursor = 0 if cursor + rows > len(pool) else cursor
            starts.append(cursor)
            cursor += rows
        mvs = _node_calls(node, ctx, [_values(node, [pool[i:i + rows], x])
                                      for i in starts])[1]
        runs = [_seconds(mvs[i % n_slices]) for i in range(calls)]
        pts.append(_point(node, float(np.median(runs))))
        if size == HOT_BYTES:
            sec = float(np.median([_seconds(mvs[0]) for _ in range(calls)]))
            hot = _point(node, sec)[1] / sec
    node = _matmul_node(t, LADDER_K, len(pool), 1)        # and all of it (a step's output
    whole = _node_calls(node, ctx, [_values(node, [pool, x])])[1][0]   # matmul's case)
    pts.append(_point(node, float(np.median([_seconds(whole) for _ in range(calls)]))))
    return pts, hot


#: the prompt-matmul probe: MUL_MAT nodes of :data:`LADDER_K` columns and, as (weight rows,
#: activation rows), these shapes: two row counts above ``kernels.matmul.MATVEC_MAX_N``
#: (the prompt kernels) on one matrix, and a smaller matrix
PROMPT_SHAPES = ((1024, 16), (1024, 64), (128, 16))


def prompt_matmul(ctx, t: gt.GGMLType, w: np.ndarray, calls: int, rng) -> list[list]:
    """``[[weight bytes, flops, seconds], ...]`` of MUL_MAT nodes of the
    :data:`PROMPT_SHAPES` with ``t`` weights (slices of ``w``'s bytes read as rows of
    :data:`LADDER_K`, a new slice each call: cold when ``w`` is larger than the last-level
    cache, as a prompt's weights come from memory), run as the executor runs them
    (``kernels.gemm``'s 16-row panels for Q4_0/Q5_0/Q4_1/Q5_1/Q4_K/Q6_K, the four-row
    dots for the other block types, the tiled float path for F32/F16/BF16 with ``fast``
    numerics), median of ``calls``: the two row counts on one matrix size part the per-row
    work from the work once a call, which the smaller matrix measures at another size
    (:func:`graphcost.cost.hardware.matmul_fit`)."""
    rb = gt.row_size(t, LADDER_K)
    pool = w.reshape(-1)[: (w.nbytes // rb) * rb].reshape(-1, rb)
    pts = []
    for m, n in PROMPT_SHAPES:
        xs = rng.standard_normal((n, LADDER_K)).astype(np.float32)
        node = _matmul_node(t, LADDER_K, m, n)
        n_slices = max(1, min(calls + 1, len(pool) // m))
        mms = _node_calls(node, ctx, [_values(node, [pool[i * m:(i + 1) * m], xs])
                                      for i in range(n_slices)])[1]
        sec = float(np.median([_seconds(mms[(i + 1) % n_slices]) for i in range(calls)]))
        pts.append([m * rb, int(_point(node, sec)[1]), sec])
    return pts


#: sizes of the op-cost ladder: values a row (flash attention: KV cells attended)
LADDER = tuple(64 << i for i in range(11))          # 64 .. 65536
#: a prompt's nodes hold several tokens (rows): the ladder again with this many, at these
#: sizes (values in all), as ``op_costs.by_op_tokens``
LADDER_TOKENS = 16
LADDER_PROMPT = LADDER[4:]                          # 1024 .. 65536
#: the key prefix of those curves while the ladder runs (they leave in their own table)
TOKENS = "tokens:"
#: bytes of the table GET_ROWS gathers from (on 4 KiB pages as a mapped GGUF's: not in
#: the caches after the matvec over the whole pool)
TABLE_BYTES = 64 << 20
FA_CELLS = tuple(16 << i for i in range(9))         # 16 .. 4096
#: flash attention's head sizes: its cost is per cell and head more than per byte, so each
#: head size has its own curve (``FLASH_ATTN_EXT`` is 128's, the others ``FLASH_ATTN_EXT@D``)
FA_HEAD_SIZES, FA_HEADS = (64, 128, 256), 4
#: KV cells of the probe's flash attention at least: fewer attended cells are the first
#: cells of a window this long, the rest masked (-inf), as a decode early in a padded KV
#: cache runs (llama.cpp pads the attended window to 256 cells); the kernel reads every
#: mask value and picks its serial or parallel variant by the window's size
FA_MIN_KV = 256
#: a prompt's flash attention (``kernels.attention``'s query tiles, from
#: ``TILE_MIN_TOKENS`` queries): one tile of ``QT`` queries of each head attending the
#: same first cells, over FA_TILE_CELLS; its curves are ``op_costs.flash_attn_tiled``
FA_TILE_CELLS = tuple(16 << i for i in range(7))    # 16 .. 1024
#: the key prefix of those curves while the ladder runs (they leave in their own table)
TILED = "tiled:"


def cache_cells(values: int, tokens: int) -> int:
    """Cells of the probe's SET_ROWS cache for rows of ``values`` F16 values and
    ``tokens`` rows a call: 1024 (``bench_profile``'s context), fewer for long rows (8 MiB
    at most), at least 16 calls' worth."""
    return max(16 * tokens, min(1024, (8 << 20) // (2 * values)))


def fa_key(d: int) -> str:
    """The op_costs key of flash attention's curve at head size ``d``."""
    return "FLASH_ATTN_EXT" if d == 128 else f"FLASH_ATTN_EXT@{d}"


#: the name of a ladder node's second input (an ADD's, a gated op's gate, a norm's
#: weight): fed by a narrow matvec (:func:`op_costs`), so that a node meets one matvec's
#: streaming right before it, as in a decode
SECOND = "second input"


def _ladder_nodes(tile: int):
    """([(op, node, attended fraction, group)], {id(mask storage): attended cells}, {id(GET_ROWS
    index storage): rows of its table}, {id(SET_ROWS index storage): cells of its cache})
    for every op kind and size of the ladder, built with the ggml graph mirror (one
    graph: sources are leaves, filled with random values; flash attention's masks unmask
    their first cells; the prompt's flash attention with ``tile`` queries a head; GET_ROWS
    gathers distinct rows of a :data:`TABLE_BYTES` table, as token ids pick rows of an
    embedding table far larger than the caches; SET_ROWS writes a run of cells of a
    :func:`cache_cells` cache, moved on before each call by :func:`op_costs`). A group
    names the node's family and size; a family is timed apart from the others."""
    from graphcost.graph.ggml_graph import Graph

    Q8 = gt.GGMLType.Q8_0
    g = Graph()
    out = []
    gathers: dict[int, int] = {}
    set_cells: dict[int, int] = {}
    for n_tok, prefix, sizes in ((1, "", LADDER), (LADDER_TOKENS, TOKENS, LADDER_PROMPT)):
        for n in sizes:
            v = n // n_tok                  # values a token (a row)
            x = g.new_tensor(gt.F32, [v, n_tok])
            x2 = g.new_tensor(gt.F32, [v, n_tok], name=SECOND)
            w = g.new_tensor(gt.F32, [v], role="weight", name=SECOND)    # a norm's weight
            # rope: heads of 128 values, for several tokens 256 (its work is per token and
            # angle, n_dims / 2 of them, as much as per value: gemma's heads of 256 on a
            # one-head K have 128 a token)
            d = min(v, 128 if n_tok == 1 else 256)
            h = g.reshape(x, [d, v // d, n_tok])
            pos = g.new_tensor(gt.I32, [n_tok])
            idx = g.new_tensor(gt.I64, [n_tok])
            rows = g.new_tensor(gt.I32, [n_tok])
            # SET_ROWS's cache: cells enough that each call writes cells not written
            # for a while (:func:`op_costs` moves the index on before each call), as a
            # decode writes a new cell each step and a prompt its tokens' run of cells
            cache = g.new_tensor(gt.F16, [v, cache_cells(v, n_tok)], role="kv")
            set_cells[id(idx.storage)] = cache.ne[1]
            table = g.new_tensor(Q8, [v, TABLE_BYTES // gt.row_size(Q8, v)], role="weight")
            gathers[id(rows.storage)] = table.ne[1]
            side = 1 << ((n.bit_length() - 1) // 2)
            kq = g.new_tensor(gt.F32, [v // 4, n_tok, 4])
            # in this order, each op that reads x runs soon after another that read it
            # (a chain of small ops passes each one's output on while it is in the caches);
            # MUL multiplies by a weight (a norm's) after RMS_NORM, ADD adds two
            # activations both just read (a residual add after the norm's MUL)
            out += [(prefix + node.op, node, (prefix, n)) for node in (
                g.cont(g.transpose(g.new_tensor(gt.F32, [side, n // side]))),
                g.set_rows(cache, x, idx), g.get_rows(table, rows),
                g.scale(x, 0.5), g.rms_norm(x, 1e-6), g.mul(x, w),
                g.unary("GELU", x), g.unary("SILU", x), g.glu_split("GEGLU", x, x2),
                g.glu_split("SWIGLU", x, x2), g.add(x, x2),
                g.soft_max_ext(kq, g.new_tensor(gt.F32, [v // 4, n_tok]), 1.0, 0.0),
                g.rope(h, pos, None, n_dims=d, mode=2, freq_base=1e4, freq_scale=1.0,
                       n_ctx_orig=4096))]
            # GET_ROWS from an activation (the last layer's row select): rows of x, just
            # written by its matvecs, not of a mapped weight table; last, so no other
            # op's chained predecessor changes
            out.append((prefix + GET_ROWS_ACTIVATION, g.get_rows(x, pos), (prefix, n)))
    fa, masks = [], {}
    for tokens, table, cells_ladder in ((1, "", FA_CELLS), (tile, TILED, FA_TILE_CELLS)):
        for d in FA_HEAD_SIZES:
            for cells in cells_ladder:
                n_kv = max(cells, FA_MIN_KV)
                q = g.reshape(g.new_tensor(gt.F32, [d * FA_HEADS * tokens, 1]),
                              [d, FA_HEADS, tokens])
                kv = []
                for _ in "kv":              # K and V: caches of their own, as get_k/get_v
                    cache = g.new_tensor(gt.F16, [d, n_kv], role="kv")
                    kv.append(g.permute(g.view(cache, [d, 1, n_kv], [2 * d, 2 * d], 0),
                                        0, 2, 1, 3))    # [D, n_kv, Hkv]
                mask = g.new_tensor(gt.F16, [n_kv, tokens])
                masks[id(mask.storage)] = cells
                fa.append((table + fa_key(d),
                           g.flash_attn_ext(g.permute(q, 0, 2, 1, 3), kv[0], kv[1], mask,
                                            d ** -0.5, 0.0, 0.0), cells / n_kv,
                           (FLASH + table, d, cells)))
    return [(op, node, 1.0, group) for op, node, group in out] + fa, masks, gathers, set_cells


#: the group name of flash attention's families (they have no flushed curves)
FLASH = "flash "
#: MiB the probe's flush streams (at most 4x its ``mib``): a matvec over a matrix of its
#: own, like a step's output matmul (gemma3 270M's: 171 MiB), which pushes out of the
#: caches what the step's nodes left there. On the 32 MiB-L3 EPYC VM a stream of 64 MiB
#: left a GEGLU's and a row select's code and state warm (2.6 and 0.7 us against 1.7
#: and 0.2 hot) and one of 128 MiB did not (5.7 and 2.1 us), as after the output matmul
FLUSH_MIB = 192
#: MiB the probe's middle flushes stream (each at most a quarter of the flush): between
#: the L2 (1 MiB a core on that VM) and the L3 (32 MiB), what a layer's matvecs stream
#: between two nodes of one kind in a decode or a prompt (gemma3 270M: ~4 MiB in a
#: decode, ~7.5 in a 21-token prompt). The ``by_op_midN`` curves measure that middle
#: instead of assuming it log-linear between the warm and cold curves: a GEGLU of 2048
#: values after 0 / 4 / 8 / 192 MiB took 4.5 / 6.9-9.5 / 7.0 / 15.5-16.3 us in one memory
#: state (2026-11-27 07:31 UTC, streaming read ~49 GB/s) and a decode's, 4.2 MiB after
#: the last, 3.7-4.6 in the other (~76 GB/s), where the probe's warm curve gave 3.6-3.8
MID_MIB = (4, 8)


def flusher(ctx, rng, nbytes: int, parts: tuple[int, ...]) -> tuple[
        Callable[[], None], int, list[tuple[Callable[[], None], int]]]:
    """(call, bytes it streams, [(part call, bytes it streams), ...]): a MUL_MAT node of
    one row by about ``nbytes`` of Q8_0 weights of its own, run as the executor runs it
    (the fused decode matvec); and for each of ``parts``, one of about that many bytes of
    those weights, each call over the next slice of them (wrapping: a slice comes back
    after the others went by, out of the last-level cache when ``nbytes`` is larger than
    it), as a layer's matvecs stream weights of their own from memory."""
    from graphcost.execute.weights import random_raw, read_only

    q8 = gt.GGMLType.Q8_0
    rb = gt.row_size(q8, LADDER_K)
    rows = max(1, nbytes // rb)
    node = _matmul_node(q8, LADDER_K, rows, 1)
    w = read_only(random_raw(q8, (LADDER_K, rows), rng).reshape(rows, rb))
    x = rng.standard_normal((1, LADDER_K)).astype(np.float32)
    call = _node_calls(node, ctx, [_values(node, [w, x])])[1][0]

    def part_call(part: int) -> tuple[Callable[[], None], int]:
        p_rows = max(1, min(rows, part // rb))
        p_node = _matmul_node(q8, LADDER_K, p_rows, 1)
        slices = _node_calls(p_node, ctx, [_values(p_node, [w[i * p_rows:(i + 1) * p_rows], x])
                                           for i in range(rows // p_rows)])[1]
        turn = [0]

        def run() -> None:
            slices[turn[0] % len(slices)]()
            turn[0] += 1
        return run, p_rows * rb
    return call, rows * rb, [part_call(p) for p in parts]


def feed_width(n: int) -> int:
    """Columns of a feeding matvec with ``n`` rows: about 0.5 MiB of Q8_0 weights."""
    return int(max(32, min(LADDER_K, (1 << 19) // (n * 34 // 32) // 32 * 32)))


#: calls a pass of :func:`op_cost_passes` takes at least (fewer calls: one pass)
PASS_CALLS = 5
#: most passes :func:`op_cost_passes` splits the calls into
PASSES = 4


def cold_rounds(calls: int) -> int:
    """Rounds of :func:`op_costs`' flushed (cold and middle) schedule for ``calls`` warm
    calls a point: each flushed point is the median of that many calls."""
    return max(3, calls // 2)


def op_cost_passes(ctx, rng, calls: int, mib: int) -> tuple[dict[str, dict], int]:
    """:func:`op_costs` in passes of at least :data:`PASS_CALLS` calls (at most
    :data:`PASSES`), each over arrays of its own, merged: every point's seconds and every
    ``since_bytes`` figure the median over the passes. Where a probe's arrays land moves
    its small ops' curves as a whole: on the EPYC VM (2026-11-27) four passes over the same
    arrays agreed within 5-10% while three probes' decode ROPE curves sat at 2.3, 3.2
    and 3.0 us; over four probes each, the coefficient of variation of a decode ROPE,
    ADD, RMS_NORM and flushed ADD point fell from 0.11 / 0.16 / 0.13 / 0.24 with one
    pass of 20 calls to 0.03 / 0.05 / 0.04 / 0.03 with four passes of 5. Returns (the
    merged curves, the passes)."""
    n = max(1, min(PASSES, calls // PASS_CALLS))
    runs = [op_costs(ctx, rng, calls // n, mib) for _ in range(n)]
    return merge_op_costs(runs), n


def merge_op_costs(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """:func:`op_costs` results of the same ladder merged: each curve point's seconds and
    each ``since_bytes`` figure the median over ``runs`` (bytes and FLOPs are the
    ladder's, the same in every run)."""
    def curve(pts_by_run: list[list[list]]) -> list[list]:
        out = []
        for pts in zip(*pts_by_run, strict=True):
            assert len({(p[0], p[1]) for p in pts}) == 1, pts    # the same ladder point
            out.append([pts[0][0], pts[0][1], float(np.median([p[2] for p in pts]))])
        return out

    merged: dict[str, dict] = {}
    for key, table in runs[0].items():
        if key == "since_bytes":
            merged[key] = {name: {op: int(np.median([r[key][name][op] for r in runs]))
                                  for op in by_op} for name, by_op in table.items()}
        else:
            merged[key] = {op: curve([r[key][op] for r in runs]) for op in table}
    return merged


def op_costs(ctx, rng, calls: int, mib: int) -> dict[str, dict]:
    """Each op kind's ``[[bytes, flops, seconds], ...]`` over the ladder (see the module
    docstring), twice: called right after matvecs over weights not in the caches wrote its
    float inputs, and called right after the op before it in the ladder's list (a node in
    a chain of small ops); and after a matmul, each op kind again on :data:`LADDER_TOKENS`
    tokens (rows) and a prompt's flash attention (a tile of ``kernels.attention.QT``
    queries a head). Flash attention's bytes and FLOPs are those of the cells it
    attends (the profile models it so: ``graphcost.execute.profile.live_fraction``).
    Then the one-row and several-token curves again after a flush
    (:func:`flusher`) with the kind not run since, and the bytes streamed since the kind
    last ran at each curve's calls; then the same after each middle flush (:data:`MID_MIB`).
    The one-row nodes again after their matvecs and a serial kernel on the calling
    thread that rewrote their first activation (``by_op_local``, a node after a small op);
    the several-token nodes the same (``by_op_tokens_local``, the rewrite parallel from
    the kernel's work threshold on).
    Each one-row node again with its code warm: a node of its op at the next ladder size
    (arrays of its own) right before its matvecs (``by_op_again``), or right before it,
    after its matvecs and the serial kernel (``by_op_local_again``), as a decode's nodes
    mostly meet their code (the Q norm before the K norm, the MUL before the residual
    ADD, :func:`~graphcost.execute.exec_ops.code_kind`); ``since_bytes`` counts from the
    last node of the same code kind.
    Returns the profile's ``op_costs`` curves by key: by_op, by_op_chained, by_op_local,
    by_op_again, by_op_local_again, by_op_tokens_local,
    flash_attn_tiled, by_op_tokens, by_op_cold, by_op_tokens_cold, by_op_midN and
    by_op_tokens_midN for each N of :data:`MID_MIB` (at most a quarter of the flush), and
    since_bytes (the same keys but by_op_chained and flash_attn_tiled)."""
    from graphcost.execute.exec_ops import (DTYPES, code_kind, flat_bytes, resolve_entry,
                                            tensor_view)
    from graphcost.execute.plan import calls_plan, run_plan
    from graphcost.execute.weights import random_raw, read_only

    # the weights a decode's matvecs stream: a pool larger than the last-level cache
    q8 = gt.GGMLType.Q8_0
    pool = read_only(random_raw(q8, (LADDER_K, max(1024, (min(mib, 64) << 20)
                                                    // gt.row_size(q8, LADDER_K))), rng))
    cursor = [0]                        # slices of the pool handed to feeders so far
    fed: dict[int, int] = {}    # id of a feeding matvec (a flush's, later) -> bytes it reads

    def feeder(rows: int, narrow: bool = False) -> tuple[Callable[[], None], np.ndarray]:
        """(run, output bytes): a MUL_MAT node of ``rows`` rows (:func:`feed_width`
        columns, 32 if ``narrow``: a second input's) over the next of its slices of the pool each run, run as the executor
        runs it (the fused decode matvec, on the kernel threads), into its own output:
        the next node reads that output as it reads the matvec's before it. Each feeder
        owns ``2 * calls`` slices of the pool after the previous feeder's (wrapping): a
        slice comes back only after the other feeders' slices went by, out of the
        last-level cache when the pool is larger than it."""
        k = 32 if narrow else feed_width(rows)
        rb = gt.row_size(q8, k)
        w = pool[: (pool.nbytes // rb) * rb].reshape(-1, rb)
        n_slices = max(1, min(len(w) // rows, 2 * calls))
        first = cursor[0] % max(1, len(w) // rows - n_slices + 1)
        cursor[0] = first + n_slices
        xk = rng.standard_normal((1, k)).astype(np.float32)
        node = _matmul_node(q8, k, rows, 1)
        fn, mvs = _node_calls(node, ctx, [_values(node, [w[i * rows:(i + 1) * rows], xk])
                                          for i in range(first, first + n_slices)])
        mine = [0]

        def run():
            mvs[mine[0] % n_slices]()
            mine[0] += 1
        fed[id(run)] = rows * rb
        return run, flat_bytes(fn.out)

    nodes, masks, gathers, set_cells = _ladder_nodes(int(ctx.K.attention.QT))
    mapped: list[np.ndarray] = []

    def embedding() -> np.ndarray:
        """:data:`TABLE_BYTES` of Q8_0 rows on 4 KiB pages (:func:`small_pages`), as the
        executor's mapped GGUF holds the token embeddings (not huge pages: a gathered row
        costs its page walk too)."""
        if not mapped:
            blk, size = gt.block(q8)              # whole blocks: every table's rows fit
            mapped.append(small_pages(random_raw(q8, (blk, TABLE_BYTES // size), rng)))
        return mapped[0]
    store: dict[int, np.ndarray] = {}
    feeds: dict[int, Callable[[], None]] = {}

    def next_cells(idx: np.ndarray, n_cells: int) -> Callable[[], None]:
        """A call that moves a SET_ROWS node's cell indices on to the next run of
        ``len(idx)`` cells of its ``n_cells`` (wrapping), as the positions of a decode's
        next step or a prompt's next ubatch: the node writes cells not in the caches."""
        idx[:] = np.arange(len(idx))

        def run() -> None:
            idx[:] = (idx + len(idx)) % n_cells
        return run

    def value(t, op: str):
        base = t.storage
        if id(base) not in store:
            if id(base) in gathers:         # distinct rows, spread over the table
                raw = ((np.arange(base.ne[0], dtype=np.int64) * 7919 + 13) % gathers[id(base)]) \
                    .astype(DTYPES[base.type]).view(np.uint8)
            elif base.type in (gt.I32, gt.I64):
                raw = np.zeros(base.nbytes, np.uint8)
            elif base.type == q8 and base.nbytes <= TABLE_BYTES:    # a GET_ROWS table
                raw = embedding()[:base.nbytes]
            elif id(base) in masks:         # the first cells attended, the rest -inf
                m = np.full((base.ne[1], base.ne[0]), -np.inf, np.float16)
                m[:, :masks[id(base)]] = 0
                raw = m.reshape(-1).view(np.uint8)
            elif base.type == gt.F32 and op != "GET_ROWS" and base.n_elements >= 64:
                feeds[id(base)], raw = feeder(base.n_elements, base.name == SECOND)
            else:
                raw = random_raw(base.type, base.ne, rng)
            store[id(base)] = raw
        return tensor_view(store[id(base)], t, t.view_offs if t.is_view else 0)

    # GET_ROWS, a step's first node, follows the output matmul: a matvec over the whole pool
    rb = gt.row_size(q8, LADDER_K)
    node = _matmul_node(q8, LADDER_K, len(pool) // rb, 1)
    whole = _node_calls(node, ctx, [_values(node, [pool[: len(pool) // rb * rb], rng
                                                   .standard_normal((1, LADDER_K))
                                                   .astype(np.float32)])])[1][0]
    fed[id(whole)] = len(pool) // rb * rb
    small = None
    calls_by = []
    for op, node, frac, group in nodes:
        args = [value(s, op) for s in node.src]
        # called as the executor calls it: bound to its arrays when the node allows it
        call = _node_calls(node, ctx, [args])[1][0]
        before = [feeds[id(s.storage)] for s in node.src if id(s.storage) in feeds]
        if op.endswith("SET_ROWS"):
            # first of its own calls: the cells move on before its matvecs run (after
            # the flush, in a pass that has one)
            before.insert(0, next_cells(args[1].reshape(-1),
                                        set_cells[id(node.src[1].storage)]))
        if not before:
            if op == "GET_ROWS":
                before = [whole]
            else:
                small = small or feeder(1024)[0]
                before = [small]
        family = ("GET_ROWS",) + group[:1] if op.endswith("GET_ROWS") else group[:1]
        # a one-row or several-token node's first activation, which the local pass
        # rewrites as a decode's or prompt's small op before it wrote it (a norm's
        # weight, fed as the others, stays where its matvec left it; so does a residual
        # ADD's second input, written layers' matvecs ago); none: no local pass
        acts = list({id(s.storage): store[id(s.storage)].view(np.float32) for s in node.src
                     if id(s.storage) in feeds and s.storage.role != "weight"}.values())[:1] \
            if family in (("",), (TOKENS,)) else []
        calls_by.append((op, node, frac, call, list(dict.fromkeys(before)), family,
                         group[1:2], acts))
    cold: list[list[float]] = [[] for _ in calls_by]
    hot: list[list[float]] = [[] for _ in calls_by]
    local: list[list[float]] = [[] for _ in calls_by]
    rewrite, one, zero = ctx.K.elementwise._unary_serial, np.float32(1), np.float32(0)
    code, no_table = np.int64(ctx.K.elementwise.UNARY_CODES["scale"]), ctx.K.elementwise._NO_TABLE
    flush_cold: list[list[float]] = [[] for _ in calls_by]
    # one family at a time (the one-row ladder, the several-token ladder, flash attention
    # for one query, for a tile of queries): between two calls of a node only its
    # family's nodes and their matvecs run, not flash attention over thousands of cells,
    # whose data (larger than the last-level cache) would push out what a decode's layer
    # keeps there; GET_ROWS, whose matvecs over the whole
    # pool flush that cache as a step's output matmul does, last
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(calls_by):
        groups.setdefault(c[5], []).append(i)
    order = sorted(groups, key=lambda k: k[0] == "GET_ROWS")

    # the bytes streamed since each timed node's code kind last ran
    # (:func:`~graphcost.execute.exec_ops.code_kind`), counted from each sequence's own
    # calls after its plan ran (not between its calls: a few Python statements between a
    # matvec and the node it feeds moved the small ops' curves by 0.1-0.2 us)
    moved = [_point(c[1], 0.0)[0] for c in calls_by]     # each node's bytes
    kinds = [code_kind(str(c[1].op)) for c in calls_by]  # each node's code kind
    node_at = {id(c[3]): i for i, c in enumerate(calls_by)}
    last: dict[str, int] = {}           # code kind -> bytes streamed when it last ran
    streamed = 0

    def sequence(rows: list[tuple[list[Callable[[], object]], int, list[float],
                                  list[int] | None]]) -> Callable[[], None]:
        """A call that runs, in order, each row's calls before its node and then the
        node (``calls_by[i][3]``), as one plan through the executor's loop
        (:func:`~graphcost.execute.plan.calls_plan`: every call timed as a step's bound
        node is), and appends each node's seconds to its row's list, and, where the row
        has a since list, the bytes streamed since its code kind last ran: each call's
        bytes are a feeder's weights or a flush's (``fed``), a node's :func:`_point`
        bytes (a twin too), or none (a rewrite on the calling thread)."""
        seq: list[Callable[[], object]] = []
        at: list[tuple[int, list[float]]] = []
        tally: list[tuple[int, str | None, list[int] | None]] = []
        for before, i, times, since_to in rows:
            for c in before:
                j = node_at.get(id(c))
                tally.append((fed.get(id(c), 0), None, None) if j is None else
                             (moved[j], kinds[j], None))
            at.append((len(seq) + len(before), times))
            seq += before + [calls_by[i][3]]
            tally.append((moved[i], kinds[i], since_to))
        plan = calls_plan(seq)

        def run() -> None:
            nonlocal streamed
            ns = run_plan(plan)[1].ns
            for k, times in at:
                times.append(ns[k] * 1e-9)
            for nbytes, kind, since_to in tally:
                if kind is not None:
                    if since_to is not None and kind in last:
                        since_to.append(streamed - last[kind])
                    streamed += nbytes
                    last[kind] = streamed
                else:
                    streamed += nbytes
        return run

    def rewriter(a: np.ndarray, tokens: bool) -> Callable[[], object]:
        """The scale by 1 of ``a`` in place, called as a bound step is: through the
        overload it compiled (run once here), not Numba's dispatcher; serial on the
        calling thread for a one-row node, for several ``tokens`` as the executor runs a
        prompt's small op (parallel from the kernel's work threshold on)."""
        call = partial(ctx.K.elementwise.kernel("unary", a.size) if tokens else rewrite,
                       a, code, one, zero, no_table, a)
        call()
        return resolve_entry(call)

    def twin(i: int) -> int | None:
        """A one-row node of ``calls_by[i]``'s op at the ladder's next size (the previous
        at the top): the same code on arrays of its own, run before ``i`` in the
        ``again`` passes. None for other families."""
        if calls_by[i][5] != ("",) or calls_by[i][0] == "SET_ROWS":
            # SET_ROWS: a decode's V write follows its K write, the same kernel, and
            # takes as long (1.08-1.16 us against 1.20-1.45, Gemma 3 270M); the probe's
            # point with its code warm fell to 0.46-0.76 us (new cells each call, the
            # twin's moving on or not: scratch /tmp/dg s20f-s20k, 2026-11-27)
            return None
        same = [j for j in groups[("",)] if calls_by[j][0] == calls_by[i][0]]
        k = same.index(i)
        return same[k + 1] if k + 1 < len(same) else (same[k - 1] if k else None)
    twins = [twin(i) for i in range(len(calls_by))]
    again: list[list[float]] = [[] for _ in calls_by]
    local_again: list[list[float]] = [[] for _ in calls_by]
    since: list[list[int]] = [[] for _ in calls_by]
    since_local: list[list[int]] = [[] for _ in calls_by]
    since_again: list[list[int]] = [[] for _ in calls_by]
    since_local_again: list[list[int]] = [[] for _ in calls_by]
    for key in order:
        part = groups[key]
        # the local passes' rewrites of each node's first activation, made once for both
        rewrites = {i: [rewriter(a, key == (TOKENS,)) for a in calls_by[i][7]] for i in part}
        runs = [sequence([(calls_by[i][4], i, cold[i], since[i]) for i in part]),
                # then as a chain of small ops: each right after the one before it
                sequence([([], i, hot[i], None) for i in part]),
                # then after its matvecs and a small op that rewrote its first
                # activation (a node whose input a small op wrote, not a matvec on the
                # kernel threads; one row: on the calling thread)
                sequence([(calls_by[i][4] + rewrites[i], i, local[i], since_local[i])
                          for i in part if calls_by[i][7]]),
                # then each one-row node with its code warm, as a decode's node meets
                # it (its kind ran a few nodes before: the Q norm before the K norm, the
                # MUL before the residual ADD): a node of its op on arrays of its own,
                # then its matvecs, then it (``by_op_again``); and its matvecs, the small
                # op rewriting its first activation, that node, then it (``by_op_local_again``)
                sequence([([calls_by[t][3]] + calls_by[i][4], i, again[i], since_again[i])
                          for i in part if (t := twins[i]) is not None]),
                sequence([(calls_by[i][4] + rewrites[i] + [calls_by[t][3]], i,
                           local_again[i], since_local_again[i])
                          for i in part if (t := twins[i]) is not None and calls_by[i][7]])]
        for _ in range(calls):
            for run in runs:
                run()
    # then each node as a step's first node of its kind meets it (the token embedding
    # gather, layer 0's nodes after the output matmul): after a flush, its kind not run
    # since. One flush before each size's nodes (one of each kind; GET_ROWS's two, of one
    # kind, each after a flush of its own), in an order that turns round by round: as in
    # a step, other kinds' nodes ran since the flush, so what all calls share (the call
    # path, the kernel threads) is warm again. After every warm curve, so that those are
    # timed as before there were cold ones (the flush's weights not yet in memory)
    flush_mib = min(FLUSH_MIB, 4 * mib)
    mids = sorted({min(m, flush_mib // 4) for m in MID_MIB})
    flush, flush_bytes, mid_flushes = flusher(ctx, rng, flush_mib << 20,
                                              tuple(m << 20 for m in mids))
    rounds = cold_rounds(calls)

    def cold_schedule() -> list[list[int]]:
        """The cold pass, in order: per family (flash attention's have no cold curves),
        round and size, the nodes one flush precedes (GET_ROWS's each alone), turned
        round by round; the timing loop and the replay of its bytes below both walk it."""
        out = []
        for key in order:
            if key[0].startswith(FLASH):
                continue
            rows: dict[object, list[int]] = {}
            for i in groups[key]:
                rows.setdefault(i if key[0] == "GET_ROWS" else calls_by[i][6], []).append(i)
            # a flush before each node of a code kind: nodes that share a kernel (ADD
            # and MUL, code_kind) go to rows of their own
            split: list[list[int]] = []
            for row in rows.values():
                subs: list[list[int]] = []
                for i in row:
                    free = [s for s in subs if all(kinds[j] != kinds[i] for j in s)]
                    if free:
                        free[0].append(i)
                    else:
                        subs.append([i])
                split += subs
            for r in range(rounds):
                for row in split:
                    at = r % len(row)
                    out.append(row[at:] + row[:at])
        return out
    schedule = cold_schedule()
    # the cold pass, then the same schedule after each middle flush (:data:`MID_MIB`: the
    # kind a layer's matvecs ago, as most of a step's nodes meet it)
    flush_mid = [[[] for _ in calls_by] for _ in mids]
    since_cold: list[list[int]] = [[] for _ in calls_by]
    since_mid = [[[] for _ in calls_by] for _ in mids]
    fed[id(flush)] = flush_bytes
    fed.update((id(f), b) for f, b in mid_flushes)
    for before, times, since_to in [(flush, flush_cold, since_cold)] + [
            (f, t, s) for (f, _), t, s in zip(mid_flushes, flush_mid, since_mid)]:
        for run in [sequence([([before] * (k == 0) + calls_by[i][4], i, times[i], since_to[i])
                              for k, i in enumerate(row)]) for row in schedule]:
            run()
    after_mm: dict[str, list[list]] = {}
    chained: dict[str, list[list]] = {}
    after_local: dict[str, list[list]] = {}
    after_flush: dict[str, list[list]] = {}
    after_mid: list[dict[str, list[list]]] = [{} for _ in mids]
    after_again: dict[str, list[list]] = {}
    after_local_again: dict[str, list[list]] = {}
    for j, (op, node, frac, *_) in enumerate(calls_by):
        for table, runs in [(after_mm, cold[j]), (chained, hot[j]), (after_flush, flush_cold[j]),
                            (after_local, local[j]), (after_again, again[j]),
                            (after_local_again, local_again[j])] \
                + [(a, t[j]) for a, t in zip(after_mid, flush_mid)]:
            if runs:
                b, fl, sec = _point(node, float(np.median(runs)))
                table.setdefault(op, []).append([max(1, int(b * frac)), int(fl * frac), sec])
    streamed_since: dict[str, dict[str, list[int]]] = {"by_op": {}, "cold": {}}
    for j, (op, *_) in enumerate(calls_by):
        for name, vals in [("by_op", since[j]), ("cold", since_cold[j]),
                           ("local", since_local[j]), ("again", since_again[j]),
                           ("local_again", since_local_again[j])] + \
                [(f"mid{m}", s[j]) for m, s in zip(mids, since_mid)]:
            streamed_since.setdefault(name, {}).setdefault(op, []).extend(vals)

    def part(table: dict, prefix: str | None) -> dict[str, list[list]]:
        """The curves of ``table`` whose key has ``prefix`` (None: no prefix), unprefixed."""
        pre = (TILED, TOKENS)
        return {op.split(":", 1)[1] if prefix else op: sorted(pts) for op, pts in table.items()
                if (op.startswith(prefix) if prefix else not op.startswith(pre))}
    def since_part(name: str, prefix: str | None) -> dict[str, int]:
        """Median bytes streamed since the kind last ran, over each curve's calls."""
        return {k: int(np.median(v)) for k, v in part(streamed_since[name], prefix).items()
                if v}
    out = {"by_op": part(after_mm, None), "by_op_chained": part(chained, None),
           "by_op_local": part(after_local, None),
           "by_op_tokens_local": part(after_local, TOKENS),
           "by_op_again": part(after_again, None),
           "by_op_local_again": part(after_local_again, None),
           "flash_attn_tiled": part(after_mm, TILED), "by_op_tokens": part(after_mm, TOKENS),
           "by_op_cold": part(after_flush, None),
           "by_op_tokens_cold": part(after_flush, TOKENS),
           "since_bytes": {"by_op": since_part("by_op", None),
                           "by_op_cold": since_part("cold", None),
                           "by_op_local": since_part("local", None),
                           "by_op_tokens_local": since_part("local", TOKENS),
                           "by_op_again": since_part("again", None),
                           "by_op_local_again": since_part("local_again", None),
                           "by_op_tokens": since_part("by_op", TOKENS),
                           "by_op_tokens_cold": since_part("cold", TOKENS)}}
    for m, a in zip(mids, after_mid):
        out[f"by_op_mid{m}"], out[f"by_op_tokens_mid{m}"] = part(a, None), part(a, TOKENS)
        out["since_bytes"][f"by_op_mid{m}"] = since_part(f"mid{m}", None)
        out["since_bytes"][f"by_op_tokens_mid{m}"] = since_part(f"mid{m}", TOKENS)
    return out


def default_name() -> str:
    """``<hostname>`` made safe for a file name."""
    host = platform.node() or "this-machine"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in host).strip("-.") or "local"
