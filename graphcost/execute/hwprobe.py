"""``graphcost hwprobe``: this machine's memory bandwidth and peak FLOP rate, measured with
the same Numba kernels the executor runs.

* **Bandwidth** (streaming read): ``kernels.stream.read_rows``, a parallel sum over a
  float32 array much larger than the caches (default 256 MiB): every byte read once, the
  plainest loop a kernel can be. This is the profile's bandwidth, the roofline's memory
  roof.
* **Matrix-vector rate per weight type** (``memory_bandwidth.by_type``): the matmul the
  executor runs for that type with ``--numerics fast`` (:func:`graphcost.execute.exec_ops.matmul_fn`)
  of one activation row by a matrix of the same size; each weight byte is read once, so
  rate / bandwidth is how close that kernel comes to the memory's limit. Each type's runs
  alternate with runs of the streaming read, so both see the same load (the bandwidth is
  the median over all of those runs).
* **Peak FLOP rate**: ``kernels.matmul.mul_mat``'s tiled path on an F32 matrix that fits in L2-sized
  tiles, multiplied by 256 activation rows (compute-bound; FMA = 2 FLOPs).
* **Per-op overhead**: each op kind the executor runs, compiled by
  :mod:`graphcost.execute.exec_ops` exactly as for a graph node and called the way the executor
  calls it (bound to its arrays where the node allows), on tiny operands (64 values per
  row, 1 token, 16 cache cells): what one node costs end to end (Python call, Numba
  dispatch, waking the kernel threads) when it has almost no work. This is
  the floor under every node's time, which a roofline does not see.

Each figure is the median of ``repeat`` timed calls after one warm-up call (compilation or
cache load is never timed). These are achieved rates of graphcost's kernels, which is what
a roofline for graphcost's executor needs; a datasheet peak is higher.
"""
from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from functools import partial
from typing import Callable

import numpy as np

from graphcost.format import ggml_types as gt

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


def _probe(mib: int, repeat: int, progress: Callable[[str], None] | None) -> dict:
    import numba

    from graphcost.execute.exec_ops import Ctx, matmul_fn
    from graphcost.execute.kernels_loader import load_kernels
    from graphcost.execute.weights import random_raw

    K_ = load_kernels()
    rng = np.random.default_rng(0)
    say = progress or (lambda s: None)
    x = rng.standard_normal((1, K)).astype(np.float32)
    big = np.ones(((mib << 20) // (4 * K), K), dtype=np.float32)     # touched: resident
    K_.stream.read_rows(big)                                          # compile or load
    ctx = Ctx(K_, "fast")
    stream_runs: list[float] = []
    by_type = {}
    for t in K_.quants.SUPPORTED:
        t = gt.GGMLType(int(t))
        rows = max(1, (mib << 20) // gt.row_size(t, K))
        say(f"matvec: {gt.type_name(t)} {rows} x {K}")
        w = random_raw(t, (K, rows), rng).reshape(rows, gt.row_size(t, K))
        mv = matmul_fn(ctx, t, K, rows)
        mv(w, x)                                    # compile or load from cache
        runs = []
        for _ in range(repeat):                     # alternate: the same load for both
            stream_runs.append(_seconds(lambda: K_.stream.read_rows(big)))
            runs.append(_seconds(lambda: mv(w, x)))
        by_type[gt.type_name(t)] = round(w.nbytes / float(np.median(runs)))
        del w
    bandwidth = round(big.nbytes / float(np.median(stream_runs)))
    big = None                                      # free before the FLOP probe

    m, n = 1024, 256
    say(f"peak FLOP rate: f32 {m} x {K} times {n} rows")
    w = random_raw(gt.F32, (K, m), rng).reshape(m, gt.row_size(gt.F32, K))
    xs = rng.standard_normal((n, K)).astype(np.float32)
    sec = _median_seconds(lambda: K_.matmul.mul_mat(w, gt.F32, K, m, xs), repeat)
    flops = 2.0 * m * n * K / sec
    say("per-op overhead")
    by_op = op_overheads(K_, max(50, 20 * repeat))
    overhead = float(np.median(list(by_op.values())))
    n_threads = numba.get_num_threads()
    return {
        "name": None,
        "description": f"{_cpu_name()}, {n_threads} threads (measured by graphcost hwprobe)",
        "kind": "measured",
        "threads": n_threads,
        "cpu": _cpu_name(),
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "memory_bandwidth": {
            "bytes_per_second": bandwidth,
            "how": f"kernels.stream.read_rows over {mib} MiB of float32, median of "
                   f"{len(stream_runs)} runs alternating with the matvec runs",
            "by_type": by_type,
            "by_type_how": f"the executor's matmul (--numerics fast), 1 row x {mib} MiB "
                           f"matrix of each type, median of {repeat}: bytes/s of weights",
            "source": "graphcost hwprobe on this machine",
        },
        "peak_flops": {
            "flops_per_second": round(flops),
            "how": f"kernels.matmul.mul_mat tiled path, f32 {m}x{K} weights x {n} rows "
                   f"(2*M*N*K FLOPs), median of {repeat}",
            "source": "graphcost hwprobe on this machine",
        },
        "op_overhead": {
            "seconds": overhead,
            "how": "one executor node on tiny operands (64 values, 1 token), end to end, "
                   "median of the calls; seconds is the median over op kinds",
            "by_op": by_op,
            "source": "graphcost hwprobe on this machine",
        },
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _tiny_nodes():
    """One small node per op kind, built with the ggml graph mirror: [(node, inputs)]."""
    from graphcost.graph.ggml_graph import Graph

    Q8 = gt.GGMLType.Q8_0
    g = Graph()
    x = g.new_tensor(gt.F32, [64, 1])
    w = g.new_tensor(gt.F32, [64])
    wq = g.new_tensor(Q8, [64, 16], role="weight")
    h = g.reshape(x, [64, 1, 1])
    pos = g.new_tensor(gt.I32, [1])
    idx = g.new_tensor(gt.I64, [1])
    rows = g.new_tensor(gt.I32, [1])
    cache = g.new_tensor(gt.F16, [64, 16], role="kv")
    k = g.view(cache, [64, 1, 16], [128, 128], 0)           # [D, Hkv, n_kv] as get_k
    mask = g.new_tensor(gt.F16, [16, 1])
    kq = g.new_tensor(gt.F32, [16, 1])
    nodes = [
        g.add(x, w), g.mul(x, w), g.scale(x, 0.5), g.rms_norm(x, 1e-6),
        g.unary("GELU", x), g.unary("SILU", x), g.glu_split("GEGLU", x, x),
        g.glu_split("SWIGLU", x, x), g.soft_max_ext(kq, g.new_tensor(gt.F32, [16, 1]), 1.0, 0.0),
        g.rope(h, pos, None, n_dims=64, mode=2, freq_base=1e4, freq_scale=1.0, n_ctx_orig=4096),
        g.set_rows(cache, x, idx), g.get_rows(wq, rows), g.mul_mat(wq, x),
        g.cont(g.transpose(g.new_tensor(gt.F32, [8, 8]))),
        g.flash_attn_ext(g.permute(h, 0, 2, 1, 3), g.permute(k, 0, 2, 1, 3),
                         g.permute(k, 0, 2, 1, 3), mask, 0.125, 0.0, 0.0),
    ]
    return nodes


def op_overheads(K_, repeat: int) -> dict[str, float]:
    """Seconds per call of each op kind on tiny operands (see the module docstring)."""
    from graphcost.execute.exec_ops import Ctx, compile_node, resolve_entry, tensor_view
    from graphcost.execute.weights import random_raw

    rng = np.random.default_rng(1)
    ctx = Ctx(K_, "fast")
    store: dict[int, np.ndarray] = {}

    def value(t):
        base = t.storage
        if id(base) not in store:
            if base.type in (gt.I32, gt.I64):
                raw = np.zeros(base.nbytes, np.uint8)
            else:
                raw = random_raw(base.type, base.ne, rng)
            store[id(base)] = raw
        return tensor_view(store[id(base)], t, t.view_offs if t.is_view else 0)

    calls = []
    for node in _tiny_nodes():
        fn = compile_node(node, ctx)
        args = [value(s) for s in node.src]
        fn(*args)                                   # compile or load from cache
        # called as the executor calls it: bound to its arrays when the node allows it
        bound = fn.bind(*args) if hasattr(fn, "bind") else None
        calls.append((node.op, partial(fn, *args) if bound is None else resolve_entry(bound)))
    # run them in turn, like the nodes of a graph, rather than one op in a tight loop
    times: dict[str, list[float]] = {op: [] for op, _ in calls}
    for _ in range(repeat):
        for op, call in calls:
            times[op].append(_seconds(call))
    return {op: float(np.median(v)) for op, v in times.items()}


def default_name() -> str:
    """``<hostname>`` made safe for a file name."""
    host = platform.node() or "this-machine"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in host).strip("-.") or "local"
