"""The Vulkan backend's node reorder: ``ggml_vk_graph_optimize`` (``ggml/src/ggml-vulkan/
ggml-vulkan.cpp``, patterns in ``ggml-vulkan-types.h``, as vendored by llama-cpp-python
0.3.36), registered in :data:`graphcost.memory.reorder.REORDERS` as ``vulkan``.

Unless ``GGML_VK_DISABLE_GRAPH_OPTIMIZE`` (device option ``graph_optimize=0``), the split's
nodes are taken in rounds from the first unused one:

* a fusion pattern starting there (top-k MoE routings, snake, the QSA top-k, RMS_NORM + MUL
  + ADD (+ MUL), RMS_NORM/ROPE + VIEW + SET_ROWS, the HC post gate) is kept together as it
  is; the top-k MoE routings and the HC post gate also keep their sources alive until their
  last node (a trailing SCALE included for the routings) with ``add_alloc_dep``;
* otherwise the round's set starts with that node and takes each later non-view node among
  the next 19 that is not inside a pattern and depends (``is_src_of``: a source, a view of
  the same memory either way, or the same memory) on no unused node before it, except the
  fusable pairs (RMS_NORM or a unary op then MUL; MUL_MAT then ADD; MUL_MAT_ID then ADD_ID
  or MUL; ADD then ADD; SSM_CONV then ADD or a unary op); a taken node pulls in the ROPE of
  an RMS_NORM + MUL, a ROPE/RMS_NORM's VIEW + SET_ROWS, the MUL after MUL_MAT_ID + ADD_ID,
  the ADD after MUL_MAT + ADD, the unary op after SSM_CONV + ADD and the MUL a unary op
  fuses with; then, unless the set ends with an ADD, the views among the next 19 whose
  sources are done or in the set.

The scheduler (:mod:`graphcost.memory.sched`) runs it on every Vulkan split before the
allocator plans Vulkan's compute buffer (specs/backends/vulkan.yaml
``graph_optimize_reorder: vulkan``).
"""
from __future__ import annotations

from typing import Any

from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import EMPTY, UNARY, Op
from graphcost.memory.alloc_deps import GGML_MAX_SRC, SplitGraph, can_fuse_subgraph_ext, op_is
from graphcost.memory.op_rules import device_flag

#: ggml-vulkan-types.h fusion patterns ("UNARY": GGML_OP_UNARY, any unary sub-op)
TOPK_MOE_EARLY_SOFTMAX_NORM = (Op.SOFT_MAX, Op.RESHAPE, Op.ARGSORT, Op.VIEW, Op.GET_ROWS,
                               Op.RESHAPE, Op.SUM_ROWS, Op.CLAMP, Op.DIV, Op.RESHAPE)
TOPK_MOE_SIGMOID_NORM_BIAS = ("UNARY", Op.RESHAPE, Op.ADD, Op.ARGSORT, Op.VIEW, Op.GET_ROWS,
                              Op.RESHAPE, Op.SUM_ROWS, Op.CLAMP, Op.DIV, Op.RESHAPE)
TOPK_MOE_SQRT_SOFTPLUS_NORM_BIAS = ("UNARY", Op.SQRT, Op.RESHAPE, Op.ADD, Op.ARGSORT, Op.VIEW,
                                    Op.GET_ROWS, Op.RESHAPE, Op.SUM_ROWS, Op.CLAMP, Op.DIV,
                                    Op.RESHAPE)
TOPK_MOE_EARLY_SOFTMAX = (Op.SOFT_MAX, Op.RESHAPE, Op.ARGSORT, Op.VIEW, Op.GET_ROWS)
TOPK_MOE_LATE_SOFTMAX = (Op.ARGSORT, Op.VIEW, Op.GET_ROWS, Op.RESHAPE, Op.SOFT_MAX, Op.RESHAPE)
SNAKE = (Op.MUL, Op.SIN, Op.SQR, Op.MUL, Op.ADD)
TOPK_QSA = (Op.GET_ROWS, Op.PERMUTE, Op.CONT, Op.CPY, Op.RESHAPE, Op.ADD, Op.TOP_K)
RMS_NORM_MUL_ADD_MUL = (Op.RMS_NORM, Op.MUL, Op.ADD, Op.MUL)
RMS_NORM_MUL_ADD = (Op.RMS_NORM, Op.MUL, Op.ADD)
RMS_NORM_MUL_ROPE_VIEW_SET_ROWS = (Op.RMS_NORM, Op.MUL, Op.ROPE, Op.VIEW, Op.SET_ROWS)
RMS_NORM_VIEW_SET_ROWS = (Op.RMS_NORM, Op.VIEW, Op.SET_ROWS)
ROPE_VIEW_SET_ROWS = (Op.ROPE, Op.VIEW, Op.SET_ROWS)
HC_POST_GATE = (Op.SCALE, "UNARY", Op.SCALE, Op.DSV4_HC_POST)

#: the patterns kept whole, in the order ggml_vk_graph_optimize tries them, and whether they
#: add allocation dependencies (the top-k MoE routings: through a trailing SCALE)
_TOPK_MOE = (TOPK_MOE_EARLY_SOFTMAX_NORM, TOPK_MOE_SIGMOID_NORM_BIAS,
             TOPK_MOE_SQRT_SOFTPLUS_NORM_BIAS, TOPK_MOE_EARLY_SOFTMAX, TOPK_MOE_LATE_SOFTMAX)
_KEPT = (SNAKE, TOPK_QSA, RMS_NORM_MUL_ADD_MUL, RMS_NORM_MUL_ADD,
         RMS_NORM_MUL_ROPE_VIEW_SET_ROWS, RMS_NORM_VIEW_SET_ROWS, ROPE_VIEW_SET_ROWS)
#: patterns a later node may not be taken from (it stays for its own round)
_PROTECTED = _TOPK_MOE + (SNAKE,) + _KEPT[2:] + (HC_POST_GATE,)
#: ggml_vk_graph_optimize NUM_TO_CHECK; the pull-in searches look 15 ahead
NUM_TO_CHECK = 20
PULL_AHEAD = 15
#: ggml_vk_unary_mul_op_index: the unary ops a MUL fuses with
UNARY_MUL_OPS = frozenset({Op.GELU, Op.SIGMOID, Op.SILU, Op.SOFTPLUS})


def _src(t: Tensor, i: int) -> Tensor | None:
    return t.src[i] if i < len(t.src) else None


def _is_empty(t: Tensor) -> bool:
    return t.op in EMPTY


def is_src_of(dst: Tensor, src: Tensor) -> bool:
    """ggml_vk_graph_optimize's is_src_of: ``dst`` must run after ``src``."""
    for s in range(GGML_MAX_SRC):
        d = _src(dst, s)
        if d is not None and d is src:
            return True
        if _is_empty(dst) or _is_empty(src):
            continue
        if d is not None and d.storage is src.storage:
            return True  # a source view of dst may read what src writes through another view
        ss = _src(src, s)
        if ss is not None and dst.storage is ss.storage:
            return True  # moving dst forward may overwrite what src still reads
    return dst.storage is src.storage


def _can_repeat(a: Tensor, b: Tensor) -> bool:
    """ggml_can_repeat: ``a`` tiles into ``b``."""
    if any(x == 0 for x in a.ne):
        return any(x == 0 for x in b.ne)
    return all(b.ne[i] % a.ne[i] == 0 for i in range(4))


def can_fuse_unary_mul(unary: Tensor, mul: Tensor) -> bool:
    """ggml_vk_can_fuse_unary_mul."""
    if unary.op not in UNARY_MUL_OPS or unary.type.name not in ("F32", "F16"):
        return False
    if unary.type != mul.type or (_src(mul, 0) is not unary and _src(mul, 1) is not unary):
        return False
    other = mul.src[1] if mul.src[0] is unary else mul.src[0]
    if other is None or other.type != unary.type:
        return False
    if not other.is_contiguous(1) or not unary.src[0].is_contiguous(1):
        return False
    return _can_repeat(other, unary) if mul.src[0] is unary else _can_repeat(unary, mul.src[0])


def vulkan_graph_optimize(g: SplitGraph, address: Any, options: dict[str, Any]) -> list[Tensor]:
    """ggml_vk_graph_optimize: the split's nodes in their new order (see the module
    docstring); its allocation dependencies go to ``g.add``. ``address`` is not read (the
    Vulkan reorder compares tensors, not memory ranges)."""
    nodes = g.nodes
    if not device_flag(options, "graph_optimize", True):
        return list(nodes)
    n = len(nodes)
    used = [False] * n
    done: set[int] = set()  # used_node_set: ids of nodes already placed
    new_order: list[Tensor] = []
    first = 0

    def match(pattern: tuple, start: int) -> bool:
        return start + len(pattern) <= n and all(
            op_is(nodes[start + j], p) and not used[start + j] for j, p in enumerate(pattern))

    def keep(pattern: tuple) -> bool:
        nonlocal first
        if not match(pattern, first):
            return False
        for j in range(len(pattern)):
            new_order.append(nodes[first + j])
            done.add(id(nodes[first + j]))
            used[first + j] = True
        while first < n and used[first]:
            first += 1
        return True

    def add_deps(pattern: tuple, last: int) -> None:
        seen: set[int] = set()
        for j in range(len(pattern)):
            node = nodes[first + j]
            for s in node.src:
                if s is not None and id(s) not in seen:
                    seen.add(id(s))
                    g.add(s, nodes[last])
            seen.add(id(node))

    def keep_topk_moe(pattern: tuple) -> bool:
        if not match(pattern, first):
            return False
        last = first + len(pattern) - 1
        if last + 1 < n and nodes[last + 1].op == Op.SCALE:
            last += 1  # some variants fuse a trailing scale
        add_deps(pattern, last)
        return keep(pattern)

    def empty_or_scheduled(lo: int, hi: int) -> bool:
        return all(used[v] or _is_empty(nodes[v]) for v in range(lo, hi))

    def in_qsa(j: int) -> bool:
        return any(j - o >= 0 and match(TOPK_QSA, j - o) for o in range(len(TOPK_QSA)))

    def done_or_weight(t: Tensor | None) -> bool:
        return t is not None and (t.op == Op.NONE or id(t) in done)

    while first < n:
        if any(keep_topk_moe(p) for p in _TOPK_MOE) or any(keep(p) for p in _KEPT):
            continue
        if match(HC_POST_GATE, first):
            add_deps(HC_POST_GATE, first + len(HC_POST_GATE) - 1)
            keep(HC_POST_GATE)
            continue
        current = [first]
        for j in range(first + 1, min(first + NUM_TO_CHECK, n)):
            if used[j] or _is_empty(nodes[j]):
                continue
            if any(match(p, j) for p in _PROTECTED) or in_qsa(j):
                continue
            nj = nodes[j]
            ok = True
            for c in range(first, j):
                nc = nodes[c]
                if used[c] or not is_src_of(nj, nc):
                    continue
                last = c == current[-1]
                fusable = last and (
                    (nc.op == Op.RMS_NORM and nj.op == Op.MUL and empty_or_scheduled(c + 1, j))
                    or (nc.op in UNARY and nj.op == Op.MUL and empty_or_scheduled(c + 1, j))
                    or (j == c + 1 and (nc.op, nj.op) in (
                        (Op.MUL_MAT, Op.ADD), (Op.MUL_MAT_ID, Op.ADD_ID), (Op.MUL_MAT_ID, Op.MUL),
                        (Op.ADD, Op.ADD), (Op.SSM_CONV, Op.ADD)))
                    or (j == c + 1 and nc.op == Op.SSM_CONV and nj.op in UNARY))
                if not fusable:
                    ok = False
                    break
            if not ok:
                continue
            current.append(j)
            rope_idx = j
            if nj.op == Op.MUL and nodes[j - 1].op == Op.RMS_NORM:
                for k in range(j + 1, min(j + PULL_AHEAD, n)):
                    nk = nodes[k]
                    s2 = _src(nk, 2)
                    if (nk.op == Op.ROPE and _src(nk, 0) is nj and nk.src[1].op == Op.NONE
                            and (s2 is None or s2.op == Op.NONE)):
                        rope_idx = k
                        current.append(k)
                        used[k] = True
                        break
            if nodes[rope_idx].op in (Op.ROPE, Op.RMS_NORM):
                view_idx = set_rows_idx = -1
                for k in range(rope_idx + 1, min(rope_idx + PULL_AHEAD, n)):
                    if used[k]:
                        continue
                    nk = nodes[k]
                    if view_idx == -1 and nk.op == Op.VIEW and _src(nk, 0) is nodes[rope_idx]:
                        view_idx = k
                        continue
                    if view_idx != -1 and nk.op == Op.SET_ROWS and _src(nk, 0) is nodes[view_idx]:
                        set_rows_idx = k
                        break
                if set_rows_idx != -1:
                    idxs = [rope_idx, view_idx, set_rows_idx]
                    can_pull = can_fuse_subgraph_ext(g, idxs, [nodes[rope_idx].op, Op.VIEW, Op.SET_ROWS],
                                                     [set_rows_idx])
                    for c in range(rope_idx + 1, set_rows_idx):
                        if (can_pull and not used[c] and c != view_idx and not _is_empty(nodes[c])
                                and is_src_of(nodes[set_rows_idx], nodes[c])):
                            can_pull = False
                    if can_pull:
                        current += [view_idx, set_rows_idx]
                        used[view_idx] = used[set_rows_idx] = True
            prev = nodes[j - 1].op
            # MUL_MAT_ID + ADD_ID pulls the MUL, MUL_MAT + ADD the ADD, that reads it as
            # src0 with src1 a weight or already placed
            then = {(Op.ADD_ID, Op.MUL_MAT_ID): Op.MUL, (Op.ADD, Op.MUL_MAT): Op.ADD}.get((nj.op, prev))
            if then is not None:
                for k in range(j + 1, min(j + PULL_AHEAD, n)):
                    nk = nodes[k]
                    if nk.op == then and _src(nk, 0) is nj and done_or_weight(_src(nk, 1)):
                        current.append(k)
                        used[k] = True
                        break
            if nj.op == Op.ADD and prev == Op.SSM_CONV:
                for k in range(j + 1, min(j + PULL_AHEAD, n)):
                    if nodes[k].op in UNARY and _src(nodes[k], 0) is nj:
                        current.append(k)
                        used[k] = True
                        break
            if nj.op in UNARY:
                for k in range(j + 1, min(j + PULL_AHEAD, n)):
                    mul = nodes[k]
                    if mul.op != Op.MUL or (_src(mul, 0) is not nj and _src(mul, 1) is not nj):
                        continue
                    other = mul.src[1] if mul.src[0] is nj else mul.src[0]
                    if not done_or_weight(other) or not can_fuse_unary_mul(nj, mul):
                        continue
                    current.append(k)
                    used[k] = True
                    break
        if nodes[current[-1]].op != Op.ADD:  # keep add->rms_norm and add->add together
            for j in range(first + 1, min(first + NUM_TO_CHECK, n)):
                if used[j] or not _is_empty(nodes[j]):
                    continue
                if all(used[c] or c in current or not is_src_of(nodes[j], nodes[c])
                       for c in range(first, j)):
                    current.append(j)
        for c in current:
            new_order.append(nodes[c])
            done.add(id(nodes[c]))
            used[c] = True
        while first < n and used[first]:
            first += 1
    return new_order
