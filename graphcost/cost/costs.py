"""Per-op cost functions: shapes and types in, an :class:`OpCost` out. One registry.

A cost function that meets an op variant or a type it does not model returns an
:class:`Unmodelled` value naming what is missing (the analysis lists the node, never
counts it as zero); any exception a cost function raises is a bug and propagates.

Counting convention (the one graphcost uses everywhere)
-------------------------------------------------------
FLOPs are counted **by kind**, one per elementary operation the CPU kernel performs on
floats (kinds: ``mul add div exp log sqrt sin cos tanh max``). A fused multiply-add is a
``mul`` plus an ``add``, so it counts **2** in ``flops`` (the total over all kinds). A
matmul ``a [K, M] x b [K, N, B2, B3]`` is ``M*N*K*B2*B3`` multiplies and as many adds
(``2*M*N*K*B`` in total, the convention of llama.cpp's ``test-backend-ops``); for
quantized weights those multiply-adds run on integers inside the block dot products
(``vec_dot_q*``), and we still count them as mul/add, plus the per-block float work.
Type conversions are counted separately as ``cvt`` (elements converted) and are not in
``flops``; quantizing to a block type also costs an abs-max (``max``) and a multiply per
element and one ``div`` per block.

Bytes: each op says how many bytes it reads from each source (a view counts the bytes of
its elements, not the span of its strides; GET_ROWS only the rows it gathers) and how
many it writes. Views (VIEW, RESHAPE, PERMUTE, TRANSPOSE) allocate nothing and cost
nothing. The analysis
(:mod:`graphcost.cost.analysis`) files each read under what the source is — weights, KV
cache, graph inputs, activations — and counts a graph input (tokens, positions, mask,
indices) only at its first use, because it stays cached after that; weights and KV cache
are counted at every use.

CPU matmul activation conversion: ``ggml_compute_forward_mul_mat`` converts every row of
``b`` to the weights' ``vec_dot_type`` (Q8_0, Q8_1, Q8_K, F16...) into a work buffer
before the dot products. That work is part of the MUL_MAT node's cost: ``b`` is read once
as F32, the converted copy is written (``work``) and then read by the dot products.

Mixture of experts: a MUL_MAT_ID counts the FLOPs of the ``n_expert_used`` experts each
token uses, and reads the weights of the distinct experts touched, assumed to be the worst
case ``min(n_expert, n_expert_used * n_tokens)`` (:func:`experts_touched`); the reports add
the expectation under uniform routing (:func:`experts_expected`).

How this differs from the older analyzer of ``shared/reference/sample-report.txt``: it
counted only a matmul's multiplies (graphcost counts the adds too: 2x its FLOPs), counted
views as if they allocated memory, printed a CPY's write in bits (8x the bytes), ignored
the activation conversion, and assumed CONT was free (graphcost counts its read and write).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from graphcost.format import ggml_types as gt
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph import ops
from graphcost.graph.ops import Op

#: FLOP kinds summed into ``flops`` (``cvt`` is reported but not summed)
FLOP_KINDS = ("mul", "add", "div", "exp", "log", "sqrt", "sin", "cos", "tanh", "max")


@dataclass(frozen=True)
class OpCost:
    """What one op does: FLOPs by kind, bytes read per source, bytes written.

    ``reads[i]`` is the bytes read from ``src[i]``; ``work`` is scratch traffic (bytes
    written to and read back from the CPU work buffer, e.g. converted activations).
    """

    ops: dict[str, int] = field(default_factory=dict)
    reads: tuple[int, ...] = ()
    write: int = 0
    work: int = 0

    @property
    def flops(self) -> int:
        return sum(self.ops.get(k, 0) for k in FLOP_KINDS)


@dataclass(frozen=True)
class Unmodelled:
    """What a cost function returns for an op or type it has no model of: ``reason`` says
    what is missing (``"MUL_MAT with q4_0_4_4 weights"``). Never costed as zero."""

    reason: str


CostFn = Callable[[Tensor], "OpCost | Unmodelled"]


def _ops(**kw: int) -> dict[str, int]:
    return {k: int(v) for k, v in kw.items() if v}


def _rows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def _quantize_ops(t: gt.GGMLType, n: int) -> dict[str, int]:
    """Converting ``n`` F32 values to type ``t`` (from_float / quantize_row_*)."""
    if t == gt.F32:
        return {}
    blk = gt.block(t)[0]
    if blk == 1:
        return {"cvt": n}
    # per block: abs-max over the block, d = amax/qmax, then x * (1/d) and round per value
    return {"max": n, "mul": n, "div": n // blk, "cvt": n}


def _plain(t: Tensor) -> list[int]:
    """Bytes read from each source in full (its spanned extent)."""
    return [s.data_bytes for s in t.src]


# ---- op cost functions -----------------------------------------------------------------
# each: (node) -> OpCost; shapes in ggml ne order

def mul_mat(t: Tensor) -> OpCost | Unmodelled:
    # a:[K, M, A2, A3] x b:[K, N, B2, B3] -> [M, N, B2, B3]; a broadcast over b's dims 2, 3
    a, b = t.src[0], t.src[1]
    K = a.ne[0]
    macs = t.n_elements * K
    ops = Counter(mul=macs, add=macs)
    work = 0
    vdt = gt.vec_dot_type(a.type)
    if vdt is None:  # no vec_dot_type known for these weights
        return Unmodelled(f"{t.op} with {gt.type_name(a.type)} weights")
    if b.type != vdt:
        n_b = b.n_elements
        ops.update(_quantize_ops(vdt, n_b))
        work = gt.row_size(vdt, n_b)  # converted activations: written, then read
    blk = gt.block(vdt)[0]
    if blk > 1:
        # per block pair: d_a * d_b * isum, accumulated: 2 mul + 1 add (vec_dot_q*_q8*)
        n_blocks = macs // blk
        ops.update(mul=2 * n_blocks, add=n_blocks)
    return OpCost(dict(ops), (a.data_bytes, b.data_bytes), t.data_bytes, work)


def _binary(op: str) -> Callable[[Tensor], OpCost]:
    def cost(t: Tensor) -> OpCost:
        # a:[n...] op b (broadcast) -> [n...]: one op per output element
        return OpCost({op: t.n_elements}, tuple(_plain(t)), t.data_bytes)
    cost.__name__ = f"binary_{op}"
    return cost


def scale(t: Tensor) -> OpCost:
    # y = x*s (+ b)
    n = t.n_elements
    bias = t.params.get("bias", 0.0)
    return OpCost(_ops(mul=n, add=n if bias else 0), tuple(_plain(t)), t.data_bytes)


def rms_norm(t: Tensor) -> OpCost:
    # per row of n = ne0: sum(x*x) [n mul, n add], mean = sum/n [1 div], + eps [1 add],
    # 1/sqrt(.) [1 sqrt, 1 div], y = x*scale [n mul]  (ggml_compute_forward_rms_norm_f32)
    n, r = t.ne[0], _rows(t)
    return OpCost(_ops(mul=2 * n * r, add=(n + 1) * r, div=2 * r, sqrt=r), tuple(_plain(t)), t.data_bytes)


def norm(t: Tensor) -> OpCost:
    # per row: mean [n add, 1 div], x - mean [n add], sum sq [n mul, n add], var/n [1 div],
    # + eps [1 add], 1/sqrt [1 sqrt, 1 div], scale [n mul]  (ggml_compute_forward_norm_f32)
    n, r = t.ne[0], _rows(t)
    return OpCost(_ops(mul=2 * n * r, add=(3 * n + 1) * r, div=3 * r, sqrt=r), tuple(_plain(t)), t.data_bytes)


def get_rows(t: Tensor) -> OpCost:
    # a:[n, rows] gathered at idx:[m] -> F32 [n, m]: dequantize m rows
    a, idx = t.src[0], t.src[1]
    n_out = t.n_elements
    row_bytes = gt.row_size(a.type, a.ne[0])
    ops: dict[str, int] = {}
    blk = gt.block(a.type)[0]
    if blk > 1:
        ops = {"mul": n_out, "cvt": n_out}  # value * block scale (dequantize_row_*)
    elif a.type != t.type:
        ops = {"cvt": n_out}
    return OpCost(ops, (row_bytes * _rows(t), idx.data_bytes), t.data_bytes)


def set_rows(t: Tensor) -> OpCost:
    # dst rows (type_k/type_v) <- src F32 rows [n, m] at idx:[m]: convert and scatter
    src, idx = t.src[0], t.src[1]
    n = src.n_elements
    written = gt.row_size(t.type, src.ne[0]) * _rows(src)
    return OpCost(_quantize_ops(t.type, n), (src.data_bytes, idx.data_bytes, 0), written)


def copy(t: Tensor) -> OpCost:
    # CONT / CPY: read the (strided) source, write the packed result, converting types
    src = t.src[0]
    ops = {} if src.type == t.type else _quantize_ops(t.type, src.n_elements)
    reads = [src.data_bytes] + [0] * (len(t.src) - 1)  # CPY's destination is not read
    return OpCost(ops, tuple(reads), t.data_bytes)


def concat(t: Tensor) -> OpCost:
    # a ++ b along one dim -> packed result: read both, write the result, no arithmetic
    return OpCost({}, tuple(_plain(t)), t.data_bytes)


def pad(t: Tensor) -> OpCost:
    # a:[n0, n1, n2, n3] -> [n0 + p0, ...]: copy a, write zeros in the padding; no
    # arithmetic (ggml_compute_forward_pad)
    return OpCost({}, tuple(_plain(t)), t.data_bytes)


def repeat(t: Tensor) -> OpCost:
    # a:[n0, n1, n2, n3] tiled to [k0*n0, ...]: read a once, write every copy; no
    # arithmetic (ggml_compute_forward_repeat)
    return OpCost({}, tuple(_plain(t)), t.data_bytes)


def rope(t: Tensor) -> OpCost:
    # x:[D, H, T] rotated in n_dims/2 pairs per head. Per token and pair (rope cache, shared
    # by all heads): theta*scale, cos*m, sin*m, theta step [4 mul], 1 sin, 1 cos (+1 div with
    # freq factors). Per head and pair: x0*c - x1*s, x0*s + x1*c [4 mul, 2 add].
    # (ggml_rope_cache_init / rotate_pairs in ggml-cpu/ops.cpp)
    x = t.src[0]
    pairs = t.params.get("n_dims", x.ne[0]) // 2
    tokens = x.ne[2] * x.ne[3]
    heads = x.ne[1]
    per_tok = pairs * tokens
    rot = pairs * tokens * heads
    has_ff = len(t.src) > 2
    reads = [x.data_bytes, t.src[1].data_bytes] + ([t.src[2].data_bytes] if has_ff else [])
    return OpCost(_ops(mul=4 * per_tok + 4 * rot, add=2 * rot, sin=per_tok, cos=per_tok,
                       div=per_tok if has_ff else 0), tuple(reads), t.data_bytes)


def soft_max(t: Tensor) -> OpCost:
    # per row of n: x*scale [n mul]; + slope*mask [n mul, n add]; max [n max];
    # exp(x - max) [n add, n exp] summed [n add]; 1/sum [1 div]; * (1/sum) [n mul]
    # (ggml_compute_forward_soft_max_f32, ggml_vec_soft_max_f32). With attention sinks
    # (src[2], one logit s per head): max = MAX(max, s) [1 max], sum += exp(s - max)
    # [2 add, 1 exp] per row; the sinks are read in full.
    n, r = t.ne[0], _rows(t)
    has_mask = len(t.src) > 1
    sinks = r if t.params.get("sinks") else 0
    mask_reads = []
    if has_mask:
        m = t.src[1]
        mask_reads = [m.data_bytes]
    mul = (2 + (1 if has_mask else 0)) * n * r
    add = (2 + (1 if has_mask else 0)) * n * r + 2 * sinks
    sink_reads = [t.src[2].data_bytes] if sinks else []
    return OpCost(_ops(mul=mul, add=add, max=n * r + sinks, exp=n * r + sinks, div=r),
                  tuple([t.src[0].data_bytes] + mask_reads + sink_reads), t.data_bytes)


def flash_attn_ext(t: Tensor) -> OpCost:
    # q:[Dk, T, H, ns] k:[Dk, NKV, Hkv] v:[Dv, NKV, Hkv] mask:[NKV, T] -> [Dv, H, T]
    # per (query row, kv cell): q.k [Dk mul, Dk add], *scale [1 mul], + slope*mask
    # [1 mul, 1 add], running max [1 max], one exp(s - M) [1 add, 1 exp], S = S*ms + vs
    # [1 mul, 1 add], V accumulate [Dv mul, Dv add]; per row: q -> F16 [Dk cvt],
    # 1/S [1 div], output scale [Dv mul]. The V rescale when the running max grows is
    # data-dependent and not counted. (ggml_compute_forward_flash_attn_ext_f16_one_chunk)
    # With logit soft-capping (gemma2), per pair s = softcap*tanh(s) [1 tanh, 1 mul].
    # With attention sinks (src[4], gpt-oss), per row once: compare s with M [1 max], one
    # exp of their difference [1 add, 1 exp], S = S*ms + vs [1 mul, 1 add]; the V rescale
    # when s > M is data-dependent and not counted, like the one in the loop.
    q, k, v = t.src[0], t.src[1], t.src[2]
    Dk, Dv, nkv = q.ne[0], v.ne[0], k.ne[1]
    rows = q.ne[1] * q.ne[2] * q.ne[3]
    pairs = rows * nkv
    has_mask = len(t.src) > 3
    sinks = rows if t.params.get("sinks") else 0
    capped = pairs if t.params.get("softcap", 0.0) else 0
    ops = _ops(mul=pairs * (Dk + 3 + Dv) + rows * Dv + capped + sinks,
               add=pairs * (Dk + 3 + Dv) + 2 * sinks,
               max=pairs + sinks, exp=pairs + sinks, div=rows, tanh=capped,
               cvt=rows * Dk if k.type != gt.F32 else 0)
    # MLA (deepseek2): V is the first Dv elements of each K row (a view of the same cache,
    # build_attn for llm_graph_input_attn_k): those bytes are K's, counted once, with K
    v_bytes = 0 if _v_inside_k(k, v) else v.data_bytes
    reads = [q.data_bytes, k.data_bytes, v_bytes] + ([t.src[3].data_bytes] if has_mask else [])
    if sinks:
        reads.append(t.src[4].data_bytes)
    return OpCost(ops, tuple(reads), t.data_bytes)


def _v_inside_k(k: Tensor, v: Tensor) -> bool:
    """V views the leading elements of K's own rows (same memory, offset and strides)."""
    return (v.storage is k.storage and v.view_offs == k.view_offs and v.ne[0] <= k.ne[0]
            and v.ne[1:] == k.ne[1:] and v.nb[1:] == k.nb[1:])


def _exp_add_div(t: Tensor) -> OpCost:
    # silu x / (1 + exp(-x)) and sigmoid 1 / (1 + exp(-x)) (ggml_vec_sigmoid_f32):
    # 1 exp, 1 add, 1 div per element
    n = t.n_elements
    return OpCost(_ops(exp=n, add=n, div=n), tuple(_plain(t)), t.data_bytes)


silu = sigmoid = _exp_add_div


def gelu(t: Tensor) -> OpCost:
    # 0.5*x*(1 + tanh(sqrt(2/pi)*x*(1 + 0.044715*x*x))): 6 mul, 2 add, 1 tanh per element.
    # (The CPU F32 path looks values up in an F16 table; we count the arithmetic it stands for.)
    n = t.n_elements
    return OpCost(_ops(mul=6 * n, add=2 * n, tanh=n), tuple(_plain(t)), t.data_bytes)


def tanh(t: Tensor) -> OpCost:
    n = t.n_elements
    return OpCost(_ops(tanh=n), tuple(_plain(t)), t.data_bytes)


def _glu(act: Callable[[Tensor], OpCost]) -> Callable[[Tensor], OpCost]:
    def cost(t: Tensor) -> OpCost:
        # act(gate) * up: the activation's ops plus 1 mul per output element
        base = act(t)
        ops = Counter(base.ops)
        ops["mul"] += t.n_elements
        return OpCost(dict(ops), tuple(_plain(t)), t.data_bytes)
    cost.__name__ = f"glu_{act.__name__}"
    return cost


# ---- mixture of experts ----------------------------------------------------------------
# Expert weights a MUL_MAT_ID reads: T tokens routed to k experts each touch at most
# min(n_expert, k*T) distinct experts. graphcost assumes that worst case (no two tokens
# share an expert): exact for one token (decode), an upper bound otherwise, and reached as
# soon as k*T >= n_expert. Beside it the reports give the expectation under uniform random
# routing, n*(1 - (1 - k/n)**T) (experts_expected), lower for small T; real routing is
# neither. Node costs use the worst case. docs/counting.md.

def experts_touched(n_expert: int, n_used: int, n_tokens: int) -> int:
    """Distinct experts read by ``n_tokens`` tokens using ``n_used`` experts each: the worst
    case ``min(n_expert, n_used * n_tokens)`` (see the comment above)."""
    return min(n_expert, n_used * n_tokens)


def experts_expected(n_expert: int, n_used: int, n_tokens: int) -> Fraction:
    """Expected distinct experts read by ``n_tokens`` tokens under **uniform routing**: each
    token picks ``n_used`` distinct experts of ``n_expert``, every subset equally likely,
    tokens independent. One token misses a given expert with probability ``1 - k/n``, all
    ``T`` miss it with ``(1 - k/n)**T``; by linearity of expectation over the ``n`` experts,
    ``n * (1 - (1 - k/n)**T)``. Exact (a Fraction); never above :func:`experts_touched`."""
    if n_expert <= 0:
        return Fraction(0)
    miss = 1 - Fraction(n_used, n_expert)
    return n_expert * (1 - miss ** n_tokens)


def expert_bytes(w: Tensor) -> int:
    """Bytes of one expert's matrix in a stacked expert tensor ``w`` [K, M, n_expert]."""
    return gt.row_size(w.type, w.ne[0]) * w.ne[1]


def mul_mat_id(t: Tensor) -> OpCost | Unmodelled:
    # as:[K, M, n_exp] x b:[K, n_b, T] for ids:[k, T] (I32) -> [M, k, T]
    # (ggml_compute_forward_mul_mat_id): all of b is converted to the weights' vec_dot_type
    # once, then each (slot, token) is one M x K matrix-vector product with its expert:
    # M*k*T*K multiply-adds, the arithmetic of a MUL_MAT with N = k*T (same conversion and
    # block-scale work). Weights read: experts_touched(n_exp, k, T) experts of
    # expert_bytes each, not the whole tensor; ids read in full.
    dense = mul_mat(t)
    if isinstance(dense, Unmodelled):
        return dense
    a, ids = t.src[0], t.src[2]
    touched = experts_touched(a.ne[2], ids.ne[0], ids.ne[1])
    return OpCost(dense.ops, (touched * expert_bytes(a), dense.reads[1], ids.data_bytes),
                  dense.write, dense.work)


def add_id(t: Tensor) -> OpCost:
    # a:[n, k, T] + b:[n, n_expert] row ids[i1, i2] -> [n, k, T]: 1 add per element
    # (ggml_compute_forward_add_id_f32). b is a weight: the rows of the distinct experts
    # touched are read, experts_touched(n_expert, k, T) of them, as for MUL_MAT_ID.
    a, b, ids = t.src[0], t.src[1], t.src[2]
    touched = experts_touched(b.ne[1], ids.ne[0], ids.ne[1])
    return OpCost(_ops(add=t.n_elements),
                  (a.data_bytes, touched * gt.row_size(b.type, b.ne[0]), ids.data_bytes),
                  t.data_bytes)


def swiglu_oai(t: Tensor) -> OpCost:
    # gpt-oss's clamped SwiGLU, per output element (ggml_compute_forward_swiglu_oai_f32):
    # x = min(a, limit) [1 max], y = clamp(b, -limit, limit) [2 max], alpha*(-x) [1 mul],
    # exp [1 exp], 1 + e [1 add], x / (.) [1 div], y + 1 [1 add], * [1 mul]
    n = t.n_elements
    return OpCost(_ops(mul=2 * n, add=2 * n, div=n, exp=n, max=3 * n), tuple(_plain(t)),
                  t.data_bytes)


def argsort(t: Tensor) -> OpCost:
    # a:[n, rows] F32 -> I32 [n, rows]: std::sort of n indices per row. Comparisons are
    # data-dependent; counted as n*ceil(log2 n) per row, each a "max" (compare-select).
    # (ggml_compute_forward_argsort_f32)
    n, r = t.ne[0], _rows(t)
    cmp = n * max(1, (n - 1).bit_length()) * r
    return OpCost(_ops(max=cmp), tuple(_plain(t)), t.data_bytes)


def sum_rows(t: Tensor) -> OpCost:
    # a:[n, rows] -> [1, rows]: n adds per row (ggml_vec_sum_f32 accumulates from 0)
    a = t.src[0]
    return OpCost(_ops(add=a.ne[0] * _rows(a)), tuple(_plain(t)), t.data_bytes)


def clamp(t: Tensor) -> OpCost:
    # y = MAX(MIN(x, hi), lo): 2 compare-selects ("max") per element
    n = t.n_elements
    return OpCost(_ops(max=2 * n), tuple(_plain(t)), t.data_bytes)


def fill(t: Tensor) -> OpCost:
    # y[...] = c: the source gives the shape only and is not read; no arithmetic
    # (ggml_compute_forward_fill)
    return OpCost({}, (0,), t.data_bytes)
def sqr(t: Tensor) -> OpCost:
    # x*x: 1 mul per element (ggml_vec_sqr_f32)
    n = t.n_elements
    return OpCost(_ops(mul=n), tuple(_plain(t)), t.data_bytes)


def sqrt_(t: Tensor) -> OpCost:
    # sqrtf(x): 1 sqrt per element (ggml_vec_sqrt_f32)
    n = t.n_elements
    return OpCost(_ops(sqrt=n), tuple(_plain(t)), t.data_bytes)


def mean(t: Tensor) -> OpCost:
    # a:[n, rows] -> [1, rows]: n adds and 1 div per row (ggml_compute_forward_mean_f32:
    # ggml_vec_sum_f32, then /= ne00)
    a = t.src[0]
    r = _rows(a)
    return OpCost(_ops(add=a.ne[0] * r, div=r), tuple(_plain(t)), t.data_bytes)


# ---- recurrent ---------------------------------------------------------------------------

def ssm_conv(t: Tensor) -> OpCost:
    # sx:[d_conv - 1 + n_t, d_inner, n_s] conv c:[d_conv, d_inner] -> [d_inner, n_t, n_s]:
    # per output element a d_conv-long dot product accumulated from 0
    # [d_conv mul, d_conv add] (ggml_compute_forward_ssm_conv_f32); each output element reads
    # its d_conv window of sx, but sx and c are counted once, as for any other op
    d_conv = t.src[1].ne[0]
    n = t.n_elements
    return OpCost(_ops(mul=d_conv * n, add=d_conv * n), tuple(_plain(t)), t.data_bytes)


def ssm_scan(t: Tensor) -> OpCost | Unmodelled:
    # s:[d_state, head_dim, n_head, rows] (rows ids picked) x:[head_dim, n_head, n_t, n_s]
    # dt:[n_head, n_t, n_s] A:[1, n_head] B, C:[d_state, n_group, n_t, n_s] ids:[n_s]
    # -> y [head_dim, n_head, n_t, n_s] ++ states [d_state, head_dim, n_head, n_s]
    # (ggml_compute_forward_ssm_scan_f32, Mamba-2 branch: A scalar per head). Per token and
    # head: softplus(dt) = log1p(exp(dt)) [1 exp, 1 log, 1 add], dA = exp(softplus * A)
    # [1 mul, 1 exp]; per token, head and dim: x*dt [1 mul]; per state element:
    # s = s0*dA + B*x_dt [2 mul, 1 add], sum += s*C [1 mul, 1 add]. (softplus returns dt
    # itself above 20: data-dependent, counted as computed.) Mamba-1 (A [d_state, n_head])
    # computes exp per state element instead and is not modelled here.
    s, x, dt, A, B, C, ids = t.src
    if A.ne[0] != 1:
        return Unmodelled("SSM_SCAN with Mamba-1 decay factors (A per state element)")
    d_state, head_dim, n_head = s.ne[0], s.ne[1], s.ne[2]
    n_t, n_s = x.ne[2], x.ne[3]
    th = n_t * n_s * n_head
    thd = th * head_dim
    thds = thd * d_state
    state_bytes = gt.row_size(s.type, d_state * head_dim * n_head) * n_s  # the ids' rows only
    reads = (state_bytes, x.data_bytes, dt.data_bytes, A.data_bytes, B.data_bytes,
             C.data_bytes, ids.data_bytes)
    return OpCost(_ops(mul=th + thd + 3 * thds, add=th + 2 * thds, exp=2 * th, log=th),
                  reads, t.data_bytes)


def gated_delta_net(t: Tensor) -> OpCost:
    # q, k:[S, H_k, n_t, n_s] v:[S, H, n_t, n_s] g:[1 or S, H, n_t, n_s] beta:[1, H, n_t, n_s]
    # state:[S, S, H, n_s] -> [S*H, n_t*n_s + K*S*n_s] (ggml_compute_forward_gated_delta_net
    # _one_chunk). Per token and head, on the S x S state: decay by exp(g) [1 exp, S*S mul;
    # a per-row gate (KDA): S exp], k.S [S*S mul, S*S add], delta = (v - k.S)*beta
    # [S add, S mul], S += k (x) delta [S*S mul, S*S add], q.S [S*S mul, S*S add], * 1/sqrt(S)
    # [S mul]: 4 S^2 + 2 S mul, 3 S^2 + S add.
    q, k, v, g, beta, state = t.src
    S, H, n_t, n_s = v.ne
    th = H * n_t * n_s
    exp = th * (S if g.ne[0] == S else 1)
    return OpCost(_ops(mul=th * (4 * S * S + 2 * S), add=th * (3 * S * S + S), exp=exp),
                  tuple(_plain(t)), t.data_bytes)


def relu(t: Tensor) -> OpCost:
    # x > 0 ? x : 0: one compare-select ("max") per element (ggml_vec_relu_f32)
    n = t.n_elements
    return OpCost(_ops(max=n), tuple(_plain(t)), t.data_bytes)


def softplus(t: Tensor) -> OpCost:
    # log(1 + exp(x)) [1 exp, 1 add, 1 log] per element (x itself above 20: data-dependent,
    # counted as computed) (ggml_compute_softplus_f32)
    n = t.n_elements
    return OpCost(_ops(exp=n, add=n, log=n), tuple(_plain(t)), t.data_bytes)


#: op (ggml_op_desc name) -> cost function. Ops missing here are reported as unmodelled.
COSTS: dict[Op, CostFn] = {
    Op.MUL_MAT: mul_mat,
    Op.ADD: _binary("add"),
    Op.SUB: _binary("add"),
    Op.MUL: _binary("mul"),
    Op.DIV: _binary("div"),
    Op.SCALE: scale,
    Op.RMS_NORM: rms_norm,
    Op.NORM: norm,
    Op.GET_ROWS: get_rows,
    Op.SET_ROWS: set_rows,
    Op.CPY: copy,
    Op.CONT: copy,
    Op.CONCAT: concat,
    Op.PAD: pad,
    Op.REPEAT: repeat,
    Op.ROPE: rope,
    Op.SOFT_MAX: soft_max,
    Op.FLASH_ATTN_EXT: flash_attn_ext,
    Op.SILU: silu,
    Op.GELU: gelu,
    Op.TANH: tanh,
    Op.SWIGLU: _glu(silu),
    Op.GEGLU: _glu(gelu),
    Op.MUL_MAT_ID: mul_mat_id,
    Op.ARGSORT: argsort,
    Op.SUM_ROWS: sum_rows,
    Op.CLAMP: clamp,
    Op.SIGMOID: sigmoid,
    Op.FILL: fill,
    Op.SSM_CONV: ssm_conv,
    Op.SSM_SCAN: ssm_scan,
    Op.GATED_DELTA_NET: gated_delta_net,
    Op.SOFTPLUS: softplus,
    Op.ADD_ID: add_id,
    Op.SWIGLU_OAI: swiglu_oai,
    Op.SQR: sqr,
    Op.SQRT: sqrt_,
    Op.MEAN: mean,
    Op.RELU: relu,
}


def op_cost(t: Tensor) -> OpCost | Unmodelled:
    """The cost of one node, or :class:`Unmodelled` when its op (or the op with these
    types) has no cost model. Exceptions from a cost function are bugs: not caught."""
    if t.op in ops.VIEWS:
        return OpCost(reads=(0,) * len(t.src))
    fn = COSTS.get(t.op)
    if fn is None:
        return Unmodelled(f"no cost function for {t.op}")
    return fn(t)
