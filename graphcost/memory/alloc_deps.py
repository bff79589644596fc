"""Allocation dependencies a backend's ``graph_optimize`` adds: tensors ggml-alloc must keep
alive until a later node of the split has been computed, because the backend will run a
fused kernel there that still reads them.

The mechanism (``ggml/src/ggml-backend.cpp`` ``ggml_backend_sched_split_graph``, as vendored
by llama-cpp-python 0.3.36): after the splits are made, each split's graph
(``ggml_graph_view``: its node range, sharing the whole graph's use counts) goes to its
backend's ``graph_optimize`` with ``ggml_backend_graph_optimize_params.add_alloc_dep``
(``ggml-backend-impl.h``); every call ``(tensor, until)`` appends ``tensor`` to
``alloc_deps[until]`` unless it is there already. ``graph_copy`` then puts, right after the
node ``until``, one ``GGML_OP_NONE`` view node per ``GGML_MAX_SRC`` (10) kept tensors, whose
sources are those tensors (:func:`dep_nodes`); ggml-alloc frees a tensor only after its
last consumer, so the kept tensors live until then (and a kept tensor's consumer cannot
reuse its memory in place).

Rules, by the name a backend spec gives under ``scheduler.graph_optimize_alloc_deps``:

* ``cuda_moe_fusions``: ``ggml-cuda/ggml-cuda.cu`` ``ggml_backend_cuda_graph_optimize``
  (CUDA and HIP), unless ``GGML_CUDA_DISABLE_FUSION=1`` (device option ``fusion=0``):
  the weighted sum of the experts (``ggml_cuda_match_moe_weighted_reduction``: the experts,
  the router weights and an expert scale kept until the last ADD) and the top-k routing
  (``ggml_cuda_topk_moe_fusion`` + ``ggml_can_fuse_subgraph`` +
  ``ggml_cuda_should_use_topk_moe``: every node of the fused range and its sources kept
  until the node after it).
* ``metal_fusions``: ``ggml-metal/ggml-metal.cpp`` ``ggml_backend_metal_graph_optimize``
  (always): every raw op run of Metal's fusion table keeps its sources until its last node
  (:mod:`graphcost.memory.metal_fusion`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import UNARY, Op
from graphcost.memory.op_rules import Unmodelled, device_flag

#: ggml.h GGML_MAX_SRC: sources per node (a dependency node keeps at most this many)
GGML_MAX_SRC = 10


@dataclass
class SplitGraph:
    """What ``graph_optimize`` sees of one split: its nodes (``ggml_graph_view``), the
    node after it in the whole graph (``cgraph->nodes[n_nodes]``, read when a fused range
    ends the split), the whole graph's use counts (``cgraph->use_counts``: consumers'
    source slots, counted before the scheduler replaced sources by copies), the tensors
    flagged output, and the weights (``ggml_is_constant``)."""

    nodes: list[Tensor]
    after: Tensor | None
    use_counts: dict[int, int]
    outputs: set[int]
    weights: set[int]
    deps: list[tuple[Tensor, Tensor]] = field(default_factory=list)

    def node(self, i: int) -> Tensor | None:
        """cgraph->nodes[i], or None out of range (where the C code would read past it)."""
        if 0 <= i < len(self.nodes):
            return self.nodes[i]
        return self.after if i == len(self.nodes) else None

    def add(self, t: Tensor, until: Tensor) -> None:
        self.deps.append((t, until))


def use_counts(nodes: list[Tensor]) -> dict[int, int]:
    """ggml_visit_parents_graph's ``use_counts``: per tensor id, how many source slots of
    the graph's nodes hold it."""
    out: dict[int, int] = {}
    for n in nodes:
        for s in n.src:
            if s is not None:
                out[id(s)] = out.get(id(s), 0) + 1
    return out


def dep_nodes(until: Tensor, keep: list[Tensor]) -> list[Tensor]:
    """graph_copy's dependency nodes after ``until``: per 10 kept tensors a view of the
    first (``ggml_view_tensor``, op NONE) with the kept tensors as sources."""
    out = []
    for k in range(0, len(keep), GGML_MAX_SRC):
        first = keep[k]
        out.append(dataclasses.replace(first, op=Op.NONE, src=list(keep[k:k + GGML_MAX_SRC]),
                                       view_src=first.storage, params={},
                                       name=f"{first.name} (view)"))
    return out


def collect(pairs: list[tuple[Tensor, Tensor]]) -> dict[int, list[Tensor]]:
    """add_alloc_dep's map: per ``until`` (by id), its kept tensors in call order, each once."""
    deps: dict[int, list[Tensor]] = {}
    for t, until in pairs:
        keep = deps.setdefault(id(until), [])
        if not any(k is t for k in keep):
            keep.append(t)
    return deps


# ---- ggml_can_fuse_subgraph (ggml.c ggml_can_fuse_subgraph_ext) -----------------------------

def op_is(t: Tensor, op: str) -> bool:
    """``t->op == op``, with ``"UNARY"`` for ggml's GGML_OP_UNARY (any unary sub-op)."""
    return t.op in UNARY if op == "UNARY" else t.op == op


def can_fuse_subgraph(g: SplitGraph, start: int, ops: list[str], outputs: list[int]) -> bool:
    """ggml_can_fuse_subgraph: :func:`can_fuse_subgraph_ext` over nodes ``start ..``."""
    if start + len(ops) > len(g.nodes):
        return False
    return can_fuse_subgraph_ext(g, list(range(start, start + len(ops))), ops, outputs)


def can_fuse_subgraph_ext(g: SplitGraph, idxs: list[int], ops: list[str],
                          outputs: list[int]) -> bool:
    """ggml_can_fuse_subgraph_ext (ggml.c): nodes ``idxs`` (split indices) have these ops
    ("UNARY": any unary op); every node not among ``outputs`` (node indices) is no graph
    output, is used only inside the set, and views only tensors inside it or weights."""
    if any(i >= len(g.nodes) for i in idxs):
        return False
    rng = [g.nodes[i] for i in idxs]
    out_ids = {id(g.nodes[o]) for o in outputs if o < len(g.nodes)}
    in_rng = {id(n) for n in rng}
    for i, node in enumerate(rng):
        if not op_is(node, ops[i]):
            return False
        if id(node) in out_ids:
            continue
        if id(node) in g.outputs:
            return False
        uses = sum(1 for other in rng[i + 1:] for s in other.src if s is node)
        if uses != g.use_counts.get(id(node), 0):
            return False
        if node.view_src is not None:  # ggml's view_src is the storage tensor itself
            root = node.storage
            if id(root) not in in_rng and id(root) not in g.weights:
                return False
    return True


# ---- CUDA: ggml_backend_cuda_graph_optimize (ggml-cuda/ggml-cuda.cu) -------------------------

#: ggml-cuda.cu MOE_WEIGHTED_REDUCTION_MAX_EXPERTS (2k + 1 nodes within ggml_can_fuse_subgraph's 31)
MOE_WEIGHTED_REDUCTION_MAX_EXPERTS = 15


def _f32_contig(t: Tensor | None) -> bool:
    return t is not None and t.type.name == "F32" and t.is_contiguous(0)


def match_moe_weighted_reduction(g: SplitGraph, i: int) -> tuple[Tensor, Tensor | None, Tensor, Tensor, int] | None:
    """ggml_cuda_match_moe_weighted_reduction: ``experts * weights`` (or ``(experts *
    scale) * weights``), its ``n_expert_used`` row views and their chain of ADDs. Returns
    (experts, expert_scale, weights, dst, node_count) or None."""
    first = g.nodes[i]
    if first.op != Op.MUL or not _f32_contig(first):
        return None

    def split_mul(mul: Tensor):
        def is_weights(t):
            return (_f32_contig(t) and t.ne[0] == 1 and t.ne[1] == mul.ne[1]
                    and t.ne[2] == mul.ne[2] and t.ne[3] == mul.ne[3])

        def is_experts(t):
            return _f32_contig(t) and t.ne == mul.ne
        a, b = (mul.src + [None, None])[:2]
        if is_experts(a) and is_weights(b):
            return a, b
        if is_experts(b) and is_weights(a):
            return b, a
        return None

    weighted, experts, scale, weights, mul_count = first, None, None, None, 1
    second = g.nodes[i + 1] if i + 1 < len(g.nodes) else None
    if second is not None and second.op == Op.MUL and _f32_contig(second):
        sr, fr = split_mul(second), split_mul(first)
        if sr is not None and sr[0] is first and fr is not None:
            weighted, experts, scale, weights, mul_count = second, fr[0], fr[1], sr[1], 2
    if experts is None:
        fr = split_mul(first)
        if fr is None:
            return None
        experts, weights = fr
    n_used = weighted.ne[1]
    n_tokens = weighted.ne[2] * weighted.ne[3]
    if n_used < 2 or n_used > MOE_WEIGHTED_REDUCTION_MAX_EXPERTS or n_tokens <= 0:
        return None
    node_count = 2 * n_used + mul_count - 1
    if i + node_count > len(g.nodes):
        return None
    ops = [Op.MUL] * mul_count
    views: list[Tensor] = []
    previous = None
    n_adds = 0
    for off in range(mul_count, node_count):
        c = g.nodes[i + off]
        ops.append(c.op)
        if c.op == Op.VIEW:
            e = len(views)
            if (e >= n_used or not c.src or c.src[0] is not weighted or c.view_src is not weighted
                    or c.type.name != "F32" or c.ne != (weighted.ne[0], n_tokens, 1, 1)
                    or c.nb[0] != weighted.nb[0] or c.nb[1] != weighted.nb[2]
                    or c.view_offs != e * weighted.nb[1]):
                return None
            views.append(c)
            continue
        if c.op != Op.ADD or len(views) < 2 or n_adds + 1 >= len(views):
            return None
        lhs = views[0] if n_adds == 0 else previous
        rhs = views[n_adds + 1]
        if len(c.src) < 2 or c.src[0] is not lhs or c.src[1] is not rhs or c.type.name != "F32":
            return None
        previous = c
        n_adds += 1
    if len(views) != n_used or n_adds != n_used - 1 or previous is None:
        return None
    if not previous.is_contiguous(0) or previous.ne != (weighted.ne[0], n_tokens, 1, 1):
        return None
    out = i + node_count - 1
    if not can_fuse_subgraph(g, i, [str(o) for o in ops], [out]):
        return None
    return experts, scale, weights, g.nodes[out], node_count


@dataclass
class TopkMoeArgs:
    """ggml-cuda/topk-moe.cuh ggml_cuda_topk_moe_args."""

    sigmoid: bool = False
    sqrt_softplus: bool = False
    softmax: bool = False
    delayed_softmax: bool = False
    prob_bias: bool = False
    norm: bool = False
    scale: bool = False


def topk_moe_fusion(g: SplitGraph, i: int) -> TopkMoeArgs | None:
    """ggml_cuda_topk_moe_fusion: the routing pattern starting at node ``i`` (None: no)."""
    n = len(g.nodes)
    nodes = g.nodes
    a = TopkMoeArgs()
    if nodes[i].op == Op.SOFT_MAX:
        a.softmax = True
    if nodes[i].op in UNARY:
        if nodes[i].op == Op.SIGMOID:
            a.sigmoid = True
        elif (nodes[i].op == Op.SOFTPLUS and i + 1 < n and nodes[i + 1].op == Op.SQRT
              and nodes[i + 1].src[0] is nodes[i]):
            a.sqrt_softplus = True
            i += 1
        else:
            return None
    if nodes[i].op == Op.ARGSORT:
        a.delayed_softmax = True
    i += 1

    def src(k: int, j: int) -> Tensor | None:
        return nodes[k].src[j] if j < len(nodes[k].src) else None

    if a.sigmoid or a.sqrt_softplus or a.softmax:
        if i >= n or nodes[i].op != Op.RESHAPE or src(i, 0) is not nodes[i - 1]:
            return None
        probs_reshaped = nodes[i]
        i += 1
        if i >= n:
            return None
        if nodes[i].op == Op.ADD and src(i, 0) is nodes[i - 2]:
            a.prob_bias = True
            i += 1
        if i >= n or nodes[i].op != Op.ARGSORT:
            return None
        if src(i, 0) is not (nodes[i - 1] if a.prob_bias else nodes[i - 2]):
            return None
        i += 1
        if i >= n or nodes[i].op != Op.VIEW or src(i, 0) is not nodes[i - 1]:
            return None
        i += 1
        if i >= n or nodes[i].op != Op.GET_ROWS:
            return None
        if src(i, 0) is not probs_reshaped or src(i, 1) is not nodes[i - 1]:
            return None
        i += 1
    elif a.delayed_softmax:
        # matched or not, graph_optimize adds no dependency for the delayed softmax
        return None
    if i >= n:
        return a
    if nodes[i].op == Op.RESHAPE:
        a.norm = True
        for op in (Op.RESHAPE, Op.SUM_ROWS, Op.CLAMP):
            if i < n and nodes[i].op == op and src(i, 0) is nodes[i - 1]:
                i += 1
            else:
                a.norm = False
                return a
        if (i >= n or nodes[i].op != Op.DIV or src(i, 1) is not nodes[i - 1]
                or src(i, 0) is not nodes[i - 3]):
            a.norm = False
            return a
        i += 1
        if i >= n or nodes[i].op != Op.RESHAPE or src(i, 0) is not nodes[i - 1]:
            a.norm = False
            return a
        i += 1
    if i < n and nodes[i].op == Op.SCALE and src(i, 0) is nodes[i - 1]:
        a.scale = True
    return a


def should_use_topk_moe(gating: Tensor, logits: Tensor, weights: Tensor, ids: Tensor) -> bool:
    """ggml-cuda/topk-moe.cu ggml_cuda_should_use_topk_moe: an instantiated expert count
    (a power of 2 up to 512, or 288 or 576), contiguous logits and weights, a plain softmax
    (scale 1, no ALiBi, mask or sinks) or a sigmoid/softplus gate."""
    n_expert = ids.nb[1] // ids.nb[0]
    if ((n_expert & (n_expert - 1)) != 0 or n_expert > 512) and n_expert not in (288, 576):
        return False
    if not logits.is_contiguous(0) or not weights.is_contiguous(0):
        return False
    if gating.op == Op.SOFT_MAX:
        if not gating.src[0].is_contiguous(0):
            return False
        if gating.params.get("scale", 1.0) != 1.0 or gating.params.get("max_bias", 0.0) != 0.0:
            return False
        if any(s is not None for s in gating.src[1:3]):
            return False
    elif gating.op in UNARY and gating.op not in (Op.SIGMOID, Op.SOFTPLUS):
        return False
    return True


def cuda_moe_fusions(g: SplitGraph, options: dict[str, Any]) -> list[tuple[Tensor, Tensor]]:
    """ggml_backend_cuda_graph_optimize's add_alloc_dep calls for one split, in order."""
    if not device_flag(options, "fusion", True):
        return []  # GGML_CUDA_DISABLE_FUSION=1
    nodes = g.nodes
    i = 0
    while i < len(nodes):
        m = match_moe_weighted_reduction(g, i)
        if m is not None:
            experts, scale, weights, dst, count = m
            g.add(experts, dst)
            g.add(weights, dst)
            if scale is not None:
                g.add(scale, dst)
            i += count - 1
        node = nodes[i]
        if node.op in UNARY or node.op in (Op.SOFT_MAX, Op.ARGSORT):
            a = topk_moe_fusion(g, i)
            if a is not None and not a.delayed_softmax:
                ops = ["UNARY"] if a.sigmoid else (["UNARY", "SQRT"] if a.sqrt_softplus
                                                   else ["SOFT_MAX"])
                i_probs = i + len(ops) - 1
                if a.prob_bias:
                    ops += ["RESHAPE", "ADD", "ARGSORT", "VIEW", "GET_ROWS"]
                    out0 = i_probs + 4
                else:
                    ops += ["RESHAPE", "ARGSORT", "VIEW", "GET_ROWS"]
                    out0 = i_probs + 3
                if a.norm:
                    ops += ["RESHAPE", "SUM_ROWS", "CLAMP", "DIV", "RESHAPE"]
                if a.scale:
                    ops += ["SCALE"]
                out1 = i + len(ops) - 1
                ids, weights = g.node(out0), g.node(out1)
                if (ids is not None and weights is not None
                        and can_fuse_subgraph(g, i, ops, [out0, out1])
                        and should_use_topk_moe(node, node.src[0], weights, ids)):
                    last = i + len(ops)
                    until = g.node(last)
                    if until is None:
                        raise Unmodelled("CUDA graph_optimize: a top-k MoE fusion ends the graph "
                                         "(ggml reads past its last node)")
                    for k in range(i, last):
                        g.add(nodes[k], until)
                        for s in nodes[k].src:
                            if s is not None:
                                g.add(s, until)
                    i += len(ops) - 1
        i += 1
    return g.deps


# ---- Metal: ggml_backend_metal_graph_optimize (ggml-metal/ggml-metal.cpp) ---------------------

def metal_fusions(g: SplitGraph, options: dict[str, Any]) -> list[tuple[Tensor, Tensor]]:
    """ggml_metal_fusion_add_alloc_deps (ggml-metal-fusion.cpp), called on every split before
    the reorder: :func:`graphcost.memory.metal_fusion.raw_pattern_deps`."""
    from graphcost.memory.metal_fusion import raw_pattern_deps  # it builds on this module
    return raw_pattern_deps(g, options)


#: graph_optimize_alloc_deps rules by name (specs/backends/*.yaml scheduler)
RULES: dict[str, Callable[[SplitGraph, dict[str, Any]], list[tuple[Tensor, Tensor]]]] = {
    "cuda_moe_fusions": cuda_moe_fusions,
    "metal_fusions": metal_fusions,
}
