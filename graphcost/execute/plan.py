"""A built graph compiled for execution: the executor's plan (one per ubatch shape) and
the loop that runs it once.

* **slots**: every tensor of the graph has one, its value in a run;
* **fixed arrays**: weights, cache buffers, input buffers, the views of them and the
  small node outputs preallocated by :mod:`graphcost.execute.exec_ops`
  (:data:`graphcost.execute.exec_ops.PREALLOC_MAX_BYTES`) are the same arrays every run;
  larger outputs are the arrays the kernels return, one per node and run;
* **views**, reshapes and permutes are strided numpy views of their storage
  (``view_offs``, ``nb``), made once when the storage is fixed, else per run;
* a node whose sources are all fixed is **bound**: its kernel arguments are prepared once
  and a run is one call of the compiled numba overload
  (:meth:`graphcost.execute.exec_ops.KernelNode.bind`,
  :func:`graphcost.execute.exec_ops.resolve_entry`);
* **grouped matvecs**: an untimed run computes the bound decode matvecs that read the
  same activations (a layer's Q, K and V projections; its FFN gate and up) in one
  parallel region at the first one's place (:func:`group_matvecs`), where a node-timed
  run times each alone. A parallel region costs microseconds to start (3.4 us at 2
  threads, 8.2 us at 16 on a 16-core Xeon, ``benchmarks/bench_region_start.py``); Gemma 3
  270M's decode has three fewer a layer.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterable

import numpy as np

from graphcost.errors import UnsupportedError
from graphcost.execute.exec_ops import (Ctx, compile_node, flat_bytes, resolve_entry,
                                        shape_strides, tensor_view, unsupported_ops)
from graphcost.execute.inputs import graph_inputs
from graphcost.graph import ops
from graphcost.graph.build import BuiltGraph
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import GraphInput
from graphcost.graph.ops import Op

#: how a step runs: its kernel is called on the run's values (COMPUTE), it is a view made
#: per run (VIEW) or once (FIXED), or its bound call computes it from fixed arrays (BOUND)
COMPUTE, VIEW, FIXED, BOUND = 0, 1, 2, 3


@dataclass
class Step:
    """One executable node: its index, compiled function and value slots."""

    index: int
    node: Tensor
    fn: Callable | None       # None for a view
    srcs: tuple[int, ...]
    slot: int
    storage: int              # slot of the tensor owning the memory (views, SET_ROWS, CPY)
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: object
    kind: int = 0             # COMPUTE, VIEW (made per run), FIXED (view of fixed memory)
    #                           or BOUND (``call`` computes it from fixed arrays)
    call: Callable | None = None


@dataclass
class Plan:
    """A built graph compiled for execution (one per ubatch shape)."""

    graph: BuiltGraph
    steps: list[Step]
    n_slots: int
    fixed: dict[int, np.ndarray]          # slot -> value of weights, caches, input buffers
    fixed_raw: dict[int, np.ndarray]      # slot -> flat bytes of the same
    inputs: list[tuple[GraphInput, np.ndarray]]   # each graph input and its array
    needs_raw: set[int]                   # node slots that views or writers look through
    resolved: bool = False                # bound calls go to the compiled overloads
    #: ``steps`` with grouped matvecs (:func:`group_matvecs`), for untimed runs; None
    #: where nothing is grouped
    grouped: list[Step] | None = None
    grouped_resolved: bool = False
    #: the groups' share count (int64 [1]): the thread count, set by each grouped run
    shares: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=np.int64))


@dataclass
class NodeTiming:
    """Nanoseconds per executed node of one run (``None`` for views), the clock read
    before and after each kernel call; ``ns`` is None for an untimed run
    (:func:`run_plan` ``timed=False``), which has only its wall time."""

    ns: list[int | None] | None
    wall_ns: int


def compile_plan(bg: BuiltGraph, ctx: Ctx, weights: Mapping[str, np.ndarray],
                 kv: dict[str, np.ndarray]) -> Plan:
    """Compile ``bg`` for execution: each node's kernel (:func:`compile_node`), the arrays
    that stay fixed from run to run (weights, cache buffers, input buffers and the views
    of them, preallocated outputs) and the nodes bound to them. ``kv`` holds the cache
    buffers by tensor name across plans (a missing one is made, zeroed)."""
    bad = unsupported_ops(bg.nodes)
    if bad:
        raise UnsupportedError(f"{bg.model.header.path}: the executor has no kernel for "
                               f"op(s) {', '.join(bad)}")
    slot_of: dict[int, int] = {}

    def slot(t: Tensor) -> int:
        if id(t) not in slot_of:
            slot_of[id(t)] = len(slot_of)
        return slot_of[id(t)]

    fixed: dict[int, np.ndarray] = {}
    fixed_raw: dict[int, np.ndarray] = {}
    for leaf in bg.leafs:
        s = slot(leaf)
        if leaf.role == "weight":
            raw = weights[leaf.name]
        elif leaf.role == "kv":
            if leaf.name not in kv:
                kv[leaf.name] = np.zeros(leaf.nbytes, dtype=np.uint8)
            raw = kv[leaf.name]
        else:
            raw = np.zeros(leaf.nbytes, dtype=np.uint8)
        fixed_raw[s] = raw
        fixed[s] = tensor_view(raw, leaf, 0)
    inputs = [(gi, fixed[slot_of[id(gi.tensor)]]) for gi in graph_inputs(bg)]

    steps: list[Step] = []
    needs_raw: set[int] = set()
    for i, n in enumerate(bg.nodes):
        srcs = tuple(slot(s) for s in n.src)
        storage = n.storage
        st_slot = slot(storage) if storage is not n else slot(n)
        shape, strides, dtype = shape_strides(n)
        fn = None if n.op in ops.EMPTY else compile_node(n, ctx)
        if storage is not n and storage.op != Op.NONE:
            needs_raw.add(st_slot)
        offset = n.view_offs if n.is_view else 0
        kind = COMPUTE if fn is not None else VIEW
        if storage is not n and st_slot in fixed_raw:
            # a view of weights, cache, inputs or a preallocated output: the same
            # array every run
            fixed[slot(n)] = tensor_view(fixed_raw[st_slot], n, offset)
            if fn is None:
                kind = FIXED
        out = getattr(fn, "out", None)
        if out is not None and storage is n:
            # allocated once (exec_ops.KernelNode): rewritten by every run
            fixed[slot(n)] = out
            fixed_raw[slot(n)] = flat_bytes(out)
        call = None
        if fn is not None and hasattr(fn, "bind") and all(s in fixed for s in srcs) \
                and (out is not None or slot(n) in fixed):
            call = fn.bind(*(fixed[s] for s in srcs))
            if call is not None:
                kind = BOUND
        steps.append(Step(i, n, fn, srcs, slot(n), st_slot, offset, shape, strides,
                          np.dtype(dtype), kind, call))
    shares = np.ones(1, dtype=np.int64)
    return Plan(bg, steps, len(slot_of), fixed, fixed_raw, inputs, needs_raw,
                grouped=group_matvecs(steps, ctx.K, shares), shares=shares)


def group_matvecs(steps: list[Step], K, shares: np.ndarray) -> list[Step] | None:
    """``steps`` with the bound fused matvecs (``kernels.matmul.fused_matvec``) that
    read the same activations run as one call at the first one's place
    (``kernels.matmul.group_matvecs``); the others' places become no-ops (kind FIXED:
    their outputs are their preallocated arrays, filled by the group). A matvec joins
    the group of an earlier one only where no node between them writes into the memory
    of the activations (an in-place op or a SET_ROWS into it), and a group only where
    its weights are ``kernels.matmul.SERIAL_BELOW`` bytes or more (smaller ones stay on
    the calling thread). ``shares``: the groups' share count (:attr:`Plan.shares`).
    ``None`` where nothing is grouped."""
    mm = K.matmul
    kernels = (mm._matvec_ggml_fused, mm._matvec_ggml_fused_serial)
    storage = {st.slot: st.storage for st in steps}
    open_groups: dict[int, list[int]] = {}       # x slot -> positions of its matvecs
    groups: list[list[int]] = []
    for pos, st in enumerate(steps):
        if st.kind == BOUND and getattr(st.fn, "kern", None) in kernels:
            x = st.srcs[1]
            if x in open_groups:
                open_groups[x].append(pos)
            else:
                open_groups[x] = [pos]
                groups.append(open_groups[x])
            continue
        if st.fn is not None:        # a write into memory some open group's x lives in
            for x in [x for x in open_groups
                      if st.storage in (x, storage.get(x, x)) and st.storage != st.slot]:
                del open_groups[x]
    out = list(steps)
    grouped = False
    for g in groups:
        args = [steps[p].call.args for p in g]
        if len(g) < 2 or sum(a[0].nbytes for a in args) < mm.SERIAL_BELOW:
            continue
        made = mm.group_matvecs(args, shares)
        if made is None:
            continue
        kern, kargs = made
        first = steps[g[0]]
        out[g[0]] = replace(first, call=partial(kern, *kargs))
        for p in g[1:]:
            out[p] = replace(steps[p], kind=FIXED, call=None)
        grouped = True
    return out if grouped else None


def calls_plan(calls: Iterable[Callable[[], object]]) -> Plan:
    """A plan of bare zero-argument calls, each a bound step: :func:`run_plan` times
    them as it times a graph's bound nodes. The probe times its nodes so
    (:func:`graphcost.execute.hwprobe.op_costs`): on the EPYC VM (2026-11-27) a decode's
    K norm (256 values after the K matvec) took 0.69-0.79 us timed by run_plan's loop and
    1.1-1.3 us when the same kernels ran from a loop that differed only in reading no
    clock around the other calls or keeping no list of the readings; the probe's
    small-op points came out above the decode's nodes by about as much."""
    steps = [Step(i, None, None, (), 0, 0, 0, (), (), None, BOUND, c)  # type: ignore[arg-type]
             for i, c in enumerate(calls)]
    return Plan(None, steps, 0, {}, {}, [], set(), resolved=True)  # type: ignore[arg-type]


def run_plan(plan: Plan, *, capture: Iterable[int] = (), timed: bool = True,
             timer: Callable[[], int] = time.perf_counter_ns
             ) -> tuple[list, NodeTiming, dict[int, np.ndarray]]:
    """Execute every node once (inputs already filled); values of ``capture`` indices
    are copied out. ``timed``: the clock read around each kernel call (a node costs
    ~0.2-0.3 us more, ``benchmarks/bench_node_timing.py``); untimed, twice in all (the
    wall; the plan's grouped matvecs (:func:`group_matvecs`) run as groups. Returns
    (values by slot, timing, captured values)."""
    grouped = not timed and plan.grouped is not None
    steps = plan.grouped if grouped else plan.steps
    if grouped:
        import numba
        plan.shares[0] = numba.get_num_threads()     # one share of each group a thread
    vals: list = [None] * plan.n_slots
    for s, v in plan.fixed.items():
        vals[s] = v
    raws: dict[int, np.ndarray] = dict(plan.fixed_raw)
    ns: list[int | None] = []
    append = ns.append
    captured = set(capture)
    cap: dict[int, np.ndarray] = {}
    needs_raw = plan.needs_raw
    new_view = np.ndarray
    t_start = timer()
    for st in steps:
        kind = st.kind
        if kind == BOUND:
            call = st.call
            if timed:
                t0 = timer()
                call()
                append(timer() - t0)
            else:
                call()
        elif kind == VIEW:
            vals[st.slot] = new_view(st.shape, dtype=st.dtype, buffer=raws[st.storage],
                                     offset=st.offset, strides=st.strides)
            if timed:
                append(None)
        elif kind == FIXED:
            if timed:
                append(None)
        else:
            args = [vals[s] for s in st.srcs]
            if timed:
                t0 = timer()
                res = st.fn(*args)
                append(timer() - t0)
            else:
                res = st.fn(*args)
            if res is not None:          # None: it wrote into fixed memory (cache rows)
                if res.shape != st.shape or res.dtype != st.dtype or not res.flags.c_contiguous:
                    res = tensor_view(flat_bytes(np.ascontiguousarray(res)), st.node, 0)
                vals[st.slot] = res
                if st.slot in needs_raw:
                    raws[st.slot] = flat_bytes(res)
        if captured and st.index in captured:
            cap[st.index] = np.array(vals[st.slot], copy=True)
    wall = timer() - t_start
    if not (plan.grouped_resolved if grouped else plan.resolved):
        for st in steps:         # every bound kernel has run (compiled) once
            if st.call is not None:
                st.call = resolve_entry(st.call)
        if grouped:
            plan.grouped_resolved = True
        else:
            plan.resolved = True
    return vals, NodeTiming(ns if timed else None, wall), cap
