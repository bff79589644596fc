"""The Metal backend's fusion table and the two questions ggml asks of it before allocation.

Mirrors ``ggml/src/ggml-metal/ggml-metal-fusion.cpp`` as vendored by llama-cpp-python 0.3.36:
every fusable run of nodes is one entry of ``ggml_metal_fusions`` (:data:`FUSIONS`, in table
order): its raw op sequence (``ops_all``, views included), the extra fused outputs
(``outs``), whether the generic chain checks are skipped (``unsafe``) and its own check.

* :func:`raw_pattern_deps` is ``ggml_metal_fusion_add_alloc_deps``: per split, at each node the
  longest table entry whose raw op sequence matches there (op names only, no other check) keeps
  every source of its nodes alive until its last node (``add_alloc_dep``);
* :func:`fusion_max` is ``ggml_metal_fusion_max``: how many raw nodes from a position
  ``ggml_graph_optimize`` packs into one unit before reordering (patterns chained back to back,
  at most ``GGML_METAL_FUSION_MAX`` nodes), using ``ggml_metal_fusion_next`` in
  ``GGML_METAL_FUSION_STRUCTURAL`` mode (the graph is not allocated yet, so the buffer checks
  of ``GGML_METAL_FUSION_FULL`` are skipped).

Graph nodes are :class:`graphcost.graph.ggml_graph.Tensor`; a split is an
:class:`graphcost.memory.alloc_deps.SplitGraph`. ``"UNARY"`` in an op sequence is ggml's
``GGML_OP_UNARY`` (any unary sub-op; graphcost names nodes by their sub-op).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import EMPTY, Op
from graphcost.memory.alloc import same_layout
from graphcost.memory.alloc_deps import SplitGraph, can_fuse_subgraph_ext, op_is
from graphcost.memory.op_rules import contiguous_rows

#: ggml-metal-fusion.h GGML_METAL_FUSION_MAX: nodes in one fused kernel / one packed group
FUSION_MAX = 16
#: ggml-metal-fusion.cpp GGML_METAL_TOPK_MOE_MAX_EXPERTS, GGML_METAL_MOE_REDUCE_MAX_EXPERTS
TOPK_MOE_MAX_EXPERTS = 1024
MOE_REDUCE_MAX_EXPERTS = 8


@dataclass(frozen=True)
class Fusion:
    """One entry of ``ggml_metal_fusions``."""

    id: str
    ops_all: tuple[str, ...]
    outs: tuple[int, ...]
    unsafe: bool
    check: Callable[["Fusion", list[Tensor], SplitGraph, list[int], int], bool]

    @property
    def ops(self) -> tuple[str, ...]:
        """ggml_metal_fusion_filter_ops: the non-empty ops."""
        return tuple(o for o in self.ops_all if o not in EMPTY)


def _f32(t: Tensor | None) -> bool:
    return t is not None and t.type.name == "F32"


def _src(t: Tensor, i: int) -> Tensor | None:
    return t.src[i] if i < len(t.src) else None


# ---- pattern checks (structural mode) ---------------------------------------------------------

def check_norm(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_norm: NORM/RMS_NORM + SCALE, or + MUL (+ ADD) whose weight and
    bias rows are the norm's width, contiguous rows, F32 results."""
    if f.id == "NORM_SCALE":
        scale = nodes[1]
        return (scale.op == Op.SCALE and _src(scale, 0) is nodes[0] and _src(scale, 1) is None
                and _f32(scale))
    for j in range(1, len(f.ops)):
        w = _src(nodes[j], 1)
        if _src(nodes[j], 0) is not nodes[j - 1] or w is None or w.ne[0] != nodes[0].ne[0]:
            return False
        if not contiguous_rows(w) or not _f32(nodes[j]):
            return False
    return True


def check_ssm_conv_silu(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_ssm_conv_silu: SSM_CONV then SILU of it, F32, contiguous rows."""
    conv, un = nodes[0], nodes[1]
    return (conv.op == Op.SSM_CONV and un.op == Op.SILU and _src(un, 0) is conv
            and _src(un, 1) is None and _f32(conv) and _f32(un) and contiguous_rows(un))


def check_add_chain(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_add_chain (structural: the same-buffer check is FULL mode's):
    each ADD reads the previous one as src0, its addend laid out as the previous addend."""
    for j in range(1, len(f.ops)):
        a, b = _src(nodes[j], 1), _src(nodes[j - 1], 1)
        if _src(nodes[j], 0) is not nodes[j - 1] or a is None or b is None or not same_layout(a, b):
            return False
    return True


def check_gdn_cache(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_gdn_cache: GATED_DELTA_NET then the CPY of its state snapshots
    (the contiguous view at the tail offset) into an F32 cache view [S_v*S_v*H, n_seqs,
    min(n_tokens, K)]."""
    gdn, cpy = nodes[0], nodes[1]
    if not _f32(gdn) or id(gdn) in g.outputs or cpy.op != Op.CPY or id(cpy) in g.outputs:
        return False
    s_v, h, n_tokens, n_seqs = gdn.src[2].ne
    k = int(gdn.params.get("K", 1))
    f32 = 4
    tail = f32 * s_v * h * n_tokens * n_seqs
    d = s_v * s_v * h
    src, dst = _src(cpy, 0), _src(cpy, 1)
    if (src is None or src.op != Op.VIEW or src.view_src is not gdn or src.view_offs != tail
            or not src.is_contiguous(0)):
        return False
    return (dst is not None and _f32(dst) and dst.ne == (d, n_seqs, min(n_tokens, k), 1)
            and dst.nb[0] == f32 and dst.nb[1] == f32 * d)


def check_snake(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_snake: x + sin(a*x)^2 * inv_b with x F32/F16/BF16, a and inv_b F32
    [1, C], everything 2-D and contiguous."""
    mul0, sin, sqr, mul1, add = nodes
    x = mul0.src[0] if mul0.ne == mul0.src[0].ne else mul0.src[1]
    a = mul0.src[1] if x is mul0.src[0] else mul0.src[0]
    inv_b = mul1.src[1] if mul1.src[0] is sqr else mul1.src[0]
    x_in_add = add.src[1] if add.src[0] is mul1 else add.src[0]
    types_ok = (x.type.name in ("F32", "F16", "BF16") and _f32(a) and _f32(inv_b)
                and all(n.type == x.type for n in (mul0, sin, sqr, mul1, add)))
    shape_ok = a.ne == inv_b.ne and a.ne[0] == 1 and a.ne[1] == x.ne[1]
    dim_ok = all(t.ne[2] == 1 and t.ne[3] == 1 for t in (x, add, a, inv_b))
    contig_ok = all(t.is_contiguous(0) for t in (x, add, a, inv_b))
    return types_ok and shape_ok and dim_ok and contig_ok and x_in_add is x


def check_topk_moe(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_topk_moe: the raw SOFT_MAX, RESHAPE, ARGSORT, VIEW, GET_ROWS run
    (+ the norm's RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE, + SCALE) of a plain softmax over at
    most 1024 experts, checked with ggml_can_fuse_subgraph_ext (outputs: the ids view and the
    last node)."""
    n_ops = len(f.ops)
    with_norm, with_scale = n_ops >= 6, n_ops in (4, 7)
    raw_start, raw_end = idxs[idx], idxs[idx + n_ops - 1]
    gn = g.nodes
    if with_norm and not with_scale:
        if raw_end + 1 >= len(gn):
            return False
        trailing = gn[raw_end + 1]
        if trailing.op != Op.RESHAPE or _src(trailing, 0) is not gn[raw_end]:
            return False
        raw_end += 1
    raw_count = raw_end - raw_start + 1
    if raw_count != len(f.ops_all):
        return False
    raw = list(range(raw_start, raw_end + 1))
    if any(gn[i].op != f.ops_all[k] for k, i in enumerate(raw)):
        return False
    softmax, probs_r, argsort, ids, get_rows = (gn[raw_start + k] for k in range(5))
    out = gn[raw_end]
    logits = softmax.src[0]
    if (softmax.params.get("scale", 1.0) != 1.0 or softmax.params.get("max_bias", 0.0) != 0.0
            or _src(softmax, 1) is not None or _src(softmax, 2) is not None):
        return False
    if not (_f32(logits) and _f32(softmax) and _f32(out) and ids.type.name == "I32"):
        return False
    n_expert, n_tokens, n_used = logits.ne[0], logits.ne[1], ids.ne[0]
    if (n_expert <= 0 or n_used <= 0 or n_used > n_expert or n_expert > TOPK_MOE_MAX_EXPERTS
            or n_used > TOPK_MOE_MAX_EXPERTS):
        return False
    if (logits.ne[2] != 1 or logits.ne[3] != 1 or ids.ne[1] != n_tokens or ids.ne[2] != 1
            or ids.ne[3] != 1 or out.ne != (1, n_used, n_tokens, 1)):
        return False
    if (not logits.is_contiguous(0) or not out.is_contiguous(0) or ids.nb[0] != 4
            or ids.nb[1] != 4 * n_expert):
        return False
    if (_src(probs_r, 0) is not softmax or _src(argsort, 0) is not softmax
            or _src(ids, 0) is not argsort or _src(get_rows, 0) is not probs_r
            or _src(get_rows, 1) is not ids):
        return False
    if with_norm:
        w_r, sum_rows, clamp, div, out_r = (gn[raw_start + k] for k in range(5, 10))
        if (_src(w_r, 0) is not get_rows or _src(sum_rows, 0) is not w_r
                or _src(clamp, 0) is not sum_rows or _src(div, 0) is not w_r
                or _src(div, 1) is not clamp or _src(out_r, 0) is not div):
            return False
        if with_scale and _src(gn[raw_start + 10], 0) is not out_r:
            return False
    elif with_scale and _src(gn[raw_start + 5], 0) is not get_rows:
        return False
    return can_fuse_subgraph_ext(g, raw, list(f.ops_all), [raw_start + 3, raw_end])


def match_moe_reduce(g: SplitGraph, i: int, ops_all: tuple[str, ...]) -> bool:
    """ggml_metal_fusion_match_moe_reduce: experts (F32 [n_embd, n_used, n_tokens]) times the
    router weights (F32 [1, n_used, n_tokens]), one VIEW per expert slot and the chain of ADDs,
    2 to 8 experts."""
    gn = g.nodes
    if i < 0 or i + len(ops_all) > len(gn):
        return False
    mul = gn[i]
    if mul.op != Op.MUL or not _f32(mul):
        return False
    raw_count = len(ops_all)
    n_used = raw_count // 2
    if n_used < 2 or n_used > MOE_REDUCE_MAX_EXPERTS or raw_count != 2 * n_used:
        return False
    n_views = 0
    while i + 1 + n_views < len(gn) and gn[i + 1 + n_views].op == Op.VIEW:
        n_views += 1
    if n_views != n_used:
        return False
    if any(gn[i + k].op != ops_all[k] for k in range(raw_count)):
        return False
    experts, weights, dst = mul.src[0], mul.src[1], gn[i + raw_count - 1]
    if not (_f32(experts) and _f32(weights) and _f32(dst)):
        return False
    n_embd, n_tokens = experts.ne[0], experts.ne[2]
    if (n_embd <= 0 or experts.ne[1] != n_used or experts.ne[3] != 1
            or weights.ne != (1, n_used, n_tokens, 1) or dst.ne != (n_embd, n_tokens, 1, 1)):
        return False
    if not (experts.is_contiguous(0) and weights.is_contiguous(0) and dst.is_contiguous(0)):
        return False
    for k in range(1, n_used + 1):
        v = gn[i + k]
        if (v.view_src is not mul or _src(v, 0) is not mul or v.view_offs != (k - 1) * mul.nb[1]
                or v.ne[0] != n_embd or v.ne[1] != n_tokens or v.nb[1] != mul.nb[2]):
            return False
    prev = None
    for j in range(1, n_used):
        add = gn[i + n_used + j]
        lhs = gn[i + 1] if j == 1 else prev
        if _src(add, 0) is not lhs or _src(add, 1) is not gn[i + j + 1]:
            return False
        prev = add
    return can_fuse_subgraph_ext(g, list(range(i, i + raw_count)), list(ops_all),
                                 [i + raw_count - 1])


def check_moe_reduce(f: Fusion, nodes: list[Tensor], g: SplitGraph, idxs: list[int], idx: int) -> bool:
    """ggml_metal_fusion_check_moe_reduce: the raw run matches and ends where the non-empty
    sequence does."""
    if not match_moe_reduce(g, idxs[idx], f.ops_all):
        return False
    mul = g.nodes[idxs[idx]]
    if len(f.ops) != mul.src[0].ne[1]:
        return False
    return idxs[idx + len(f.ops) - 1] == idxs[idx] + len(f.ops_all) - 1


def _moe_reduce(n: int) -> tuple[str, ...]:
    return (Op.MUL,) + (Op.VIEW,) * n + (Op.ADD,) * (n - 1)


_TOPK = (Op.SOFT_MAX, Op.RESHAPE, Op.ARGSORT, Op.VIEW, Op.GET_ROWS)
_NORM = (Op.RESHAPE, Op.SUM_ROWS, Op.CLAMP, Op.DIV, Op.RESHAPE)

#: ggml_metal_fusions, in table order
FUSIONS: tuple[Fusion, ...] = (
    Fusion("NORM_MUL", (Op.NORM, Op.MUL), (), False, check_norm),
    Fusion("NORM_MUL_ADD", (Op.NORM, Op.MUL, Op.ADD), (), False, check_norm),
    Fusion("NORM_SCALE", (Op.NORM, Op.SCALE), (), False, check_norm),
    Fusion("NORM_MUL", (Op.RMS_NORM, Op.MUL), (), False, check_norm),
    Fusion("NORM_MUL_ADD", (Op.RMS_NORM, Op.MUL, Op.ADD), (), False, check_norm),
    Fusion("NORM_SCALE", (Op.RMS_NORM, Op.SCALE), (), False, check_norm),
    *(Fusion("ADD_CHAIN", (Op.ADD,) * n, (), False, check_add_chain) for n in range(2, 8)),
    Fusion("SNAKE", (Op.MUL, Op.SIN, Op.SQR, Op.MUL, Op.ADD), (), False, check_snake),
    Fusion("GDN_CACHE", (Op.GATED_DELTA_NET, Op.CPY), (), True, check_gdn_cache),
    Fusion("TOPK_MOE", _TOPK, (1,), True, check_topk_moe),
    Fusion("TOPK_MOE", _TOPK + (Op.SCALE,), (1,), True, check_topk_moe),
    Fusion("TOPK_MOE", _TOPK + _NORM, (1,), True, check_topk_moe),
    Fusion("TOPK_MOE", _TOPK + _NORM + (Op.SCALE,), (1,), True, check_topk_moe),
    *(Fusion("MOE_REDUCE", _moe_reduce(n), (), True, check_moe_reduce) for n in range(2, 9)),
    Fusion("SSM_CONV_SILU", (Op.SSM_CONV, "UNARY"), (), False, check_ssm_conv_silu),
)


def fusion_next(g: SplitGraph, idxs: list[int], idx: int) -> tuple[Fusion | None, int]:
    """ggml_metal_fusion_next (structural mode): the longest table entry matching the
    non-empty nodes ``idxs[idx:]`` (raw split indices), and how many of them it takes (1
    when none)."""
    best, res = 1, None
    for f in FUSIONS:
        n_ops = len(f.ops)
        if n_ops <= best or idx + n_ops > len(idxs):
            continue
        nodes = [g.nodes[idxs[idx + j]] for j in range(n_ops)]
        if not all(op_is(nodes[j], f.ops[j]) for j in range(n_ops)):
            continue
        if not f.unsafe:
            if any((_src(nodes[j], 0) is not nodes[j - 1] and _src(nodes[j], 1) is not nodes[j - 1])
                   or nodes[j].ne != nodes[j - 1].ne for j in range(1, n_ops)):
                continue
            outputs = [idxs[idx + n_ops - 1]] + [idxs[idx + o] for o in f.outs]
            if not can_fuse_subgraph_ext(g, idxs[idx:idx + n_ops], list(f.ops), outputs):
                continue
        if not f.check(f, nodes, g, idxs, idx):
            continue
        best, res = n_ops, f
    return res, best


def fusion_max(g: SplitGraph, i: int) -> int:
    """ggml_metal_fusion_max: the raw nodes from ``i`` that ggml_graph_optimize packs into one
    unit (at least 1): fusions chained back to back over the next (at most 16) non-empty
    nodes, the views between them included; a view packs alone."""
    if g.nodes[i].op in EMPTY:
        return 1
    idxs = [j for j in range(i, len(g.nodes)) if g.nodes[j].op not in EMPTY][:FUSION_MAX]
    if not idxs:
        return 1
    total = i_f = 0
    while i_f < len(idxs) and total < FUSION_MAX:
        f, n = fusion_next(g, idxs, i_f)
        if f is None or total + n > FUSION_MAX:
            break
        total += n
        i_f += n
    if i_f == 0:
        return 1
    return min(FUSION_MAX, idxs[i_f - 1] - i + 1)


def raw_pattern_deps(g: SplitGraph, options: dict) -> list[tuple[Tensor, Tensor]]:
    """ggml_metal_fusion_add_alloc_deps (called by ggml_backend_metal_graph_optimize on every
    split, before any reorder and whatever the device options): at each node, the longest
    table entry whose raw op sequence matches (op names only; the first of equal length)
    keeps every source of its nodes, each once and not its own nodes, until its last node;
    the scan goes on after the run."""
    nodes = g.nodes
    i = 0
    while i < len(nodes):
        best: Fusion | None = None
        for f in FUSIONS:
            n = len(f.ops_all)
            if best is not None and n <= len(best.ops_all):
                continue
            if i + n <= len(nodes) and all(op_is(nodes[i + k], f.ops_all[k]) for k in range(n)):
                best = f
        if best is not None:
            last = nodes[i + len(best.ops_all) - 1]
            seen: set[int] = set()
            for node in nodes[i:i + len(best.ops_all)]:
                for s in node.src:
                    if s is not None and id(s) not in seen:
                        seen.add(id(s))
                        g.add(s, last)
                seen.add(id(node))
            i += len(best.ops_all) - 1
        i += 1
    return g.deps

