"""How each ggml op runs on the Numba kernels (``kernels/``): one compile function per op,
one registry (:data:`OPS`).

Values are numpy arrays in ggml's memory layout, 4-D in numpy order: a tensor with
``ne = [n0, n1, n2, n3]`` and strides ``nb`` is an array of shape ``(n3, n2, n1, n0)``
with strides ``(nb3, nb2, nb1, nb0)`` over its storage (:func:`tensor_view`); a block type
(Q8_0, Q4_K, ...) or BF16 is ``uint8`` rows instead, shape ``(n3, n2, n1, row_bytes)``.
Views, reshapes and permutes are therefore free: a strided numpy view of the same bytes.

``compile_node(node, ctx)`` returns ``fn(*src_values) -> result``: a fresh C-contiguous
array whose bytes are the node's result in ggml layout, or ``None`` for the ops that write
into another tensor's memory (``SET_ROWS``, ``CPY`` into a view), whose value is then a
view of that memory. Compilation checks shapes and types once, so running a node is the
kernel call and little else.

Numerics (``ctx.numerics``): ``"ggml"`` converts a matmul's activations to the weights'
``vec_dot_type`` (Q8_0/Q8_1/Q8_K/F16) and uses ggml's block dot products
(``kernels.matmul.mul_mat_ggml``), as llama.cpp's CPU backend does; ``"fast"`` multiplies
float32 activations by the weights decoded on the fly (``kernels.matmul.mul_mat``).
Everything else is the same in both modes and follows ggml-cpu: GELU through ggml's F16
table (``GGML_GELU_FP16``), F16/Q8_0 KV cache rows rounded as ``set_rows`` stores them,
softmax and RMS norm with float64 sums. The few ops without a kernel (CONCAT, ARGSORT,
SUM_ROWS, CLAMP, SIGMOID: routing and bias bookkeeping) run in numpy; :data:`NUMPY_OPS`
names them so reports can say so.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import numpy as np

from . import ggml_types as gt
from .errors import UnsupportedError
from .ggml_graph import Tensor

OpFn = Callable[..., "np.ndarray | None"]

#: numpy dtype of each element-addressable ggml type (others are uint8 rows)
DTYPES = {gt.F32: np.float32, gt.F16: np.float16, gt.I32: np.int32, gt.I64: np.int64}

#: ops run in numpy rather than a Numba kernel (small bookkeeping ops, no kernel exists)
NUMPY_OPS = frozenset({"CONCAT", "ARGSORT", "SUM_ROWS", "CLAMP", "SIGMOID"})

#: rope modes the kernel implements (ggml.h GGML_ROPE_TYPE_NORMAL / _NEOX)
ROPE_MODES = (0, 2)


@dataclass(frozen=True)
class Ctx:
    """What compilation needs besides the node: the kernels and the numerics mode."""

    K: ModuleType
    numerics: str = "ggml"  # ggml | fast


def is_rows_type(t: gt.GGMLType) -> bool:
    """Types held as uint8 rows (block types, BF16) rather than typed elements."""
    return t not in DTYPES


def shape_strides(t: Tensor) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """numpy shape, strides and dtype of ``t``'s value (see the module docstring)."""
    n0, n1, n2, n3 = t.ne
    b0, b1, b2, b3 = t.nb
    if is_rows_type(t.type):
        if b0 != gt.type_size(t.type) and n0 > gt.block(t.type)[0]:
            raise UnsupportedError(f"{t.name}: a {gt.type_name(t.type)} view with strided "
                                   "blocks cannot be executed")
        return (n3, n2, n1, gt.row_size(t.type, n0)), (b3, b2, b1, 1), np.uint8
    return (n3, n2, n1, n0), (b3, b2, b1, b0), DTYPES[t.type]


def tensor_view(raw: np.ndarray, t: Tensor, offset: int) -> np.ndarray:
    """``t``'s value over the flat byte buffer ``raw`` starting at byte ``offset``."""
    shape, strides, dtype = shape_strides(t)
    return np.ndarray(shape, dtype=dtype, buffer=raw, offset=offset, strides=strides)


def flat_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a flat uint8 array (no copy)."""
    return a.reshape(-1).view(np.uint8)


def _f32(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.float32 else a.astype(np.float32)


def _rows2d(a: np.ndarray) -> np.ndarray:
    """A 2-D ``[rows, row]`` view of a 2-D slice, as uint8 rows for the kernels' weights."""
    return a if a.dtype == np.uint8 else a.view(np.uint8) if a.strides[-1] == a.itemsize \
        else np.ascontiguousarray(a).view(np.uint8)


# ---------------------------------------------------------------------------- registry

OPS: dict[str, Callable[[Tensor, Ctx], OpFn]] = {}


def op(*names: str):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco


def compile_node(node: Tensor, ctx: Ctx) -> OpFn:
    """The callable that computes ``node`` from its sources' values."""
    make = OPS.get(node.op)
    if make is None:
        raise UnsupportedError(f"op {node.op} ({node.name}) has no executor implementation")
    return make(node, ctx)


def unsupported_ops(nodes: list[Tensor]) -> list[str]:
    """Ops among ``nodes`` the executor cannot run (views excluded), sorted."""
    return sorted({n.op for n in nodes if not n.is_view and n.op not in OPS})


# ---------------------------------------------------------------------------- matmul


def _matmul_fn(ctx: Ctx, w_type: gt.GGMLType, k: int, m: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    mm = ctx.K.matmul
    supported = ctx.K.quants.SUPPORTED
    if w_type not in supported:
        raise UnsupportedError(f"matmul with {gt.type_name(w_type)} weights: the kernels "
                               f"support {', '.join(gt.type_name(t) for t in supported)}")
    if ctx.numerics == "fast":
        return lambda w, x: mm.mul_mat(w, w_type, k, m, x)
    return lambda w, x: mm.mul_mat_ggml(w, w_type, k, m, x)


@op("MUL_MAT")
def _mul_mat(node: Tensor, ctx: Ctx) -> OpFn:
    # a:[K, M, A2, A3] x b:[K, N, B2, B3] -> [M, N, B2, B3]; b batch i2 uses a batch i2 // (B2/A2)
    a, b = node.src
    k, m = a.ne[0], a.ne[1]
    n, b2, b3 = b.ne[1], b.ne[2], b.ne[3]
    a2, a3 = a.ne[2], a.ne[3]
    r2, r3 = b2 // a2, b3 // a3
    mm = _matmul_fn(ctx, a.type, k, m)

    if a2 == a3 == b2 == b3 == 1:
        def run(av, bv):
            return mm(_rows2d(av[0, 0]), _f32(bv[0, 0])).reshape(1, 1, n, m)
        return run

    def run_batched(av, bv):
        out = np.empty((b3, b2, n, m), dtype=np.float32)
        for i3 in range(b3):
            for g in range(a2):
                x = _f32(bv[i3, g * r2:(g + 1) * r2]).reshape(r2 * n, k)
                out[i3, g * r2:(g + 1) * r2] = mm(_rows2d(av[i3 // r3, g]), x).reshape(r2, n, m)
        return out
    return run_batched


@op("MUL_MAT_ID")
def _mul_mat_id(node: Tensor, ctx: Ctx) -> OpFn:
    # experts:[K, M, E] x b:[K, n_b, T] for ids:[k, T] -> [M, k, T]; slot j of token t uses
    # expert ids[t, j] on b row j % n_b (ggml_compute_forward_mul_mat_id)
    a, b, ids = node.src
    k, m = a.ne[0], a.ne[1]
    n_used, n_tok = ids.ne[0], ids.ne[1]
    n_b = b.ne[1]
    mm = _matmul_fn(ctx, a.type, k, m)

    def run(av, bv, iv):
        out = np.empty((1, n_tok, n_used, m), dtype=np.float32)
        sel = iv[0, 0, :n_tok, :n_used]
        x = _f32(bv[0])                                    # [T, n_b, K]
        for e in np.unique(sel):
            tt, jj = np.nonzero(sel == e)
            out[0, tt, jj] = mm(_rows2d(av[0, e]), x[tt, jj % n_b])
        return out
    return run


# ---------------------------------------------------------------------------- gather/scatter


@op("GET_ROWS")
def _get_rows(node: Tensor, ctx: Ctx) -> OpFn:
    # a:[K, R, A2, A3] rows idx:[n, I1, I2] -> [K, n, I1, I2]; out[i2][i1][i0] = a[i2][i1][idx]
    a, idx = node.src
    k = a.ne[0]
    gr = ctx.K.get_rows.get_rows
    kernel_type = a.type if a.type in ctx.K.quants.SUPPORTED else None
    if kernel_type is None:
        raise UnsupportedError(f"get_rows from {gt.type_name(a.type)} ({node.name})")
    n0, n1, n2 = idx.ne[0], idx.ne[1], idx.ne[2]

    if n1 == n2 == 1:
        def run(av, iv):
            return gr(_rows2d(av[0, 0]), kernel_type, k, iv[0, 0, 0]).reshape(1, 1, n0, k)
        return run

    def run_batched(av, iv):
        out = np.empty((n2, n1, n0, k), dtype=np.float32)
        for i2 in range(n2):              # ggml_get_rows: a.ne[2] == idx.ne[1], a.ne[3] == idx.ne[2]
            for i1 in range(n1):
                out[i2, i1] = gr(_rows2d(av[i2, i1]), kernel_type, k, iv[0, i2, i1])
        return out
    return run_batched


@op("SET_ROWS")
def _set_rows(node: Tensor, ctx: Ctx) -> OpFn:
    # rows of b:[K, n] (F32) stored into a:[K, R] (cache type) at idx:[n]; result is a view of a
    b, idx, a = node.src
    if b.ne[2] != 1 or b.ne[3] != 1 or a.ne[2] != 1 or a.ne[3] != 1:
        raise UnsupportedError(f"set_rows with batched rows ({node.name})")
    if a.type not in ctx.K.cache.CACHE_TYPES:
        raise UnsupportedError(f"KV cache type {gt.type_name(a.type)}: the set_rows kernel "
                               f"stores {', '.join(gt.type_name(t) for t in ctx.K.cache.CACHE_TYPES)}")
    sr = ctx.K.cache.set_rows

    def run(bv, iv, av):
        dst = av[0, 0]
        if dst.dtype != np.uint8:
            dst = dst.view(np.uint8)
        sr(dst, a.type, bv[0, 0], iv[0, 0, 0])
        return None
    return run


@op("CPY")
def _cpy(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_cpy: a's elements in logical order, converted to b's type, into b's memory
    a, b = node.src
    if b is node:        # ggml_cast: a new tensor
        return _convert(a, node, ctx)
    conv = _convert(a, b, ctx)

    def run(av, bv):
        bv[...] = conv(av).reshape(bv.shape)
        return None
    return run


def _convert(a: Tensor, dst: Tensor, ctx: Ctx) -> OpFn:
    n = a.n_elements
    if dst.type == gt.F32:
        return lambda av: ctx.K.cache.cont(_f32(av)).reshape(-1)
    if dst.type == gt.F16:
        return lambda av: _f32(av).astype(np.float16).reshape(-1)   # round to nearest even, as F16C
    if dst.type in ctx.K.cache.CACHE_TYPES:
        k = dst.ne[0]
        return lambda av: ctx.K.cache.cpy(_f32(av).reshape(n // k, k), dst.type)
    raise UnsupportedError(f"copy into {gt.type_name(dst.type)} ({dst.name})")


@op("CONT")
def _cont(node: Tensor, ctx: Ctx) -> OpFn:
    shape = shape_strides(node)[0]
    if node.type == gt.F32:
        cont = ctx.K.cache.cont
        return lambda av: cont(av).reshape(shape)
    if is_rows_type(node.type):
        raise UnsupportedError(f"cont of {gt.type_name(node.type)} ({node.name})")
    return lambda av: np.ascontiguousarray(av).reshape(shape)


@op("CONCAT")
def _concat(node: Tensor, ctx: Ctx) -> OpFn:
    axis = 3 - node.params["dim"]
    return lambda av, bv: np.ascontiguousarray(np.concatenate([av, bv], axis=axis))


# ---------------------------------------------------------------------------- element-wise


@op("ADD", "SUB", "MUL", "DIV")
def _binary(node: Tensor, ctx: Ctx) -> OpFn:
    name = node.op.lower()
    binary = ctx.K.elementwise.binary
    return lambda av, bv: binary(name, av, _f32(bv))


@op("SCALE")
def _scale(node: Tensor, ctx: Ctx) -> OpFn:
    s, bias = node.params["scale"], node.params.get("bias", 0.0)
    scale = ctx.K.elementwise.scale
    return lambda av: scale(av, s, bias)


@op("SILU", "GELU", "TANH")
def _unary(node: Tensor, ctx: Ctx) -> OpFn:
    e = ctx.K.elementwise
    # ggml-cpu computes GELU through its F16 table (vec.h GGML_GELU_FP16)
    return {"SILU": e.silu, "GELU": e.gelu_f16_table, "TANH": e.tanh}[node.op]


@op("SIGMOID")
def _sigmoid(node: Tensor, ctx: Ctx) -> OpFn:
    one = np.float32(1)
    return lambda av: (one / (one + np.exp(-_f32(av)))).astype(np.float32)


@op("CLAMP")
def _clamp(node: Tensor, ctx: Ctx) -> OpFn:
    lo, hi = np.float32(node.params["min"]), np.float32(node.params["max"])
    return lambda av: np.clip(av, lo, hi).astype(np.float32)


@op("SWIGLU", "GEGLU")
def _glu(node: Tensor, ctx: Ctx) -> OpFn:
    e = ctx.K.elementwise
    gated = e.swiglu if node.op == "SWIGLU" else e.geglu_f16_table
    if len(node.src) == 2:          # ggml_*_split(a, b): act(a) * b
        return lambda av, bv: gated(av, bv)
    half = node.ne[0]               # ggml_swiglu(a): act(first half) * second half

    return lambda av: gated(av[..., :half], av[..., half:])


# ---------------------------------------------------------------------------- rows


@op("RMS_NORM", "NORM")
def _norm(node: Tensor, ctx: Ctx) -> OpFn:
    eps = node.params["eps"]
    f = ctx.K.norm.rms_norm if node.op == "RMS_NORM" else ctx.K.norm.norm
    return lambda av: f(av, eps)


@op("SOFT_MAX")
def _soft_max(node: Tensor, ctx: Ctx) -> OpFn:
    scale, max_bias = node.params["scale"], node.params["max_bias"]
    sm = ctx.K.softmax.soft_max
    if len(node.src) == 1:
        return lambda av: sm(av, None, scale, max_bias)
    return lambda av, mv: sm(av, mv, scale, max_bias)


@op("SUM_ROWS")
def _sum_rows(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_vec_sum_f32 accumulates in ggml_float (double)
    return lambda av: av.astype(np.float64).sum(-1, keepdims=True).astype(np.float32)


@op("ARGSORT")
def _argsort(node: Tensor, ctx: Ctx) -> OpFn:
    desc = node.params.get("order", "desc") == "desc"
    return lambda av: np.argsort(-av if desc else av, axis=-1, kind="stable").astype(np.int32)


@op("ROPE")
def _rope(node: Tensor, ctx: Ctx) -> OpFn:
    # x:[D, H, T] -> numpy [T, H, D]; pos:[T]; optional freq_factors:[D/2]
    p = node.params
    if p["mode"] not in ROPE_MODES:
        raise UnsupportedError(f"rope mode {p['mode']} ({node.name}): the kernel does "
                               "NORMAL (0) and NEOX (2)")
    if node.ne[3] != 1:
        raise UnsupportedError(f"rope over 4-D tensors ({node.name})")
    rope = ctx.K.rope.rope
    kw = dict(n_dims=p["n_dims"], mode=p["mode"], freq_base=p["freq_base"],
              freq_scale=p["freq_scale"], n_ctx_orig=p.get("n_ctx_orig", 0),
              # llama_context: yarn_ext_factor -1 -> 0 unless the model uses YaRN
              ext_factor=p.get("ext_factor", 0.0), attn_factor=p.get("attn_factor", 1.0),
              beta_fast=p.get("beta_fast", 32.0), beta_slow=p.get("beta_slow", 1.0))

    if len(node.src) == 2:
        return lambda xv, pv: rope(xv[0], pv[0, 0, 0], **kw)[None]
    return lambda xv, pv, fv: rope(xv[0], pv[0, 0, 0], freq_factors=fv.reshape(-1), **kw)[None]


@op("FLASH_ATTN_EXT")
def _flash_attn(node: Tensor, ctx: Ctx) -> OpFn:
    # q:[D, T, H] k:[D, n_kv, Hkv] v:[Dv, n_kv, Hkv] mask:[n_kv, T] -> [Dv, H, T]
    p = node.params
    q, k, v = node.src[:3]
    fa = ctx.K.attention.flash_attn_ext
    if q.ne[3] != 1 or k.ne[3] != 1:
        raise UnsupportedError(f"flash attention over several streams ({node.name})")
    q_as = _q_for_k(k, ctx)
    deq_k = _kv_as_float(k, ctx)
    deq_v = _kv_as_float(v, ctx)
    scale, max_bias, softcap = p["scale"], p["max_bias"], p["softcap"]

    def run(qv, kv, vv, mv=None):
        out = fa(q_as(qv[0]), deq_k(kv[0]), deq_v(vv[0]), None if mv is None else mv[0],
                 scale, max_bias, softcap)
        return out[None]
    return run


def _q_for_k(k: Tensor, ctx: Ctx) -> Callable[[np.ndarray], np.ndarray]:
    """ggml's one_chunk flash attention converts q to K's vec_dot_type before the K dots;
    for a quantized K (Q8_0) that is a Q8_0 round trip, done here explicitly because the
    kernel takes quantized K as float32 (F16 K: the kernel rounds q to F16 itself)."""
    if k.type in (gt.F16, gt.F32):
        return lambda a: a
    vdt = gt.vec_dot_type(k.type)
    quant, gr = ctx.K.quants.quantize_activations, ctx.K.get_rows.get_rows
    d = k.ne[0]

    def roundtrip(a):
        h, t, _ = a.shape
        raw = quant(np.ascontiguousarray(a, dtype=np.float32).reshape(h * t, d), vdt)
        return gr(raw, vdt, d, np.arange(h * t)).reshape(h, t, d)
    return roundtrip


def _kv_as_float(t: Tensor, ctx: Ctx) -> Callable[[np.ndarray], np.ndarray]:
    """K/V views for the flash-attention kernel: F16/F32 as they are; a quantized cache
    decoded to F32 (as ggml's ``v_to_float``; for K the products with the Q8_0-rounded q
    equal ggml's integer block dots up to float32 rounding)."""
    if t.type in (gt.F16, gt.F32):
        return lambda a: a
    if t.type not in ctx.K.quants.SUPPORTED:
        raise UnsupportedError(f"flash attention over a {gt.type_name(t.type)} cache")
    gr = ctx.K.get_rows.get_rows
    d = t.ne[0]

    def deq(a):
        h, n, rb = a.shape
        rows = np.ascontiguousarray(a).reshape(h * n, rb)
        return gr(rows, t.type, d, np.arange(h * n)).reshape(h, n, d)
    return deq
