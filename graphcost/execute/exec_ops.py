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

Small nodes (decode: a few thousand values) cost far more in overhead than in work, so
the common cases compile to a :class:`KernelNode`: the output is allocated once per
plan (``fn.out``, for outputs up to :data:`PREALLOC_MAX_BYTES`; the node returns that
same array every run), the numba kernel is the serial variant below the kernel
module's work threshold (a ``prange`` region wakes the sleeping OpenMP workers: 5-30 us),
and ``fn.bind(*src_values)`` returns a zero-argument callable with every kernel
argument prepared once, for sources whose arrays are the same every run (weights,
caches, inputs and other preallocated outputs; the executor binds those nodes and calls
the compiled overload directly, see :func:`resolve_entry`).

Numerics (``ctx.numerics``): ``"ggml"`` converts a matmul's activations to the weights'
``vec_dot_type`` (Q8_0/Q8_1/Q8_K/F16) and uses ggml's block dot products
(``kernels.matmul.mul_mat_ggml``), as llama.cpp's CPU backend does; ``"fast"`` runs the
fastest kernel for each weight type: the same ggml byte-SIMD dots for the block types
(``kernels.matmul.GGML_FASTEST``: they beat decoding to float32), and float32
activations times the weights decoded on the fly (``kernels.matmul.mul_mat``) for the
float types; and SiLU, GELU and their gated forms (SWIGLU, GEGLU) through a
rational tanh that vectorizes (``kernels.elementwise.tanh_rational``), where ``ggml``
numerics take GELU from ggml's F16 table (``GGML_GELU_FP16``) and SiLU from ``expf``.
Everything else is the same in both modes and follows ggml-cpu: F16/Q8_0 KV cache rows
rounded as ``set_rows`` stores them,
softmax and RMS norm with float64 sums. The few ops without a kernel (CONCAT, ARGSORT,
SUM_ROWS, CLAMP, SIGMOID, FILL: routing and bias bookkeeping; RELU, SQR: nemotron_h's MLP;
SOFTPLUS, REPEAT: qwen3next's gates and head repeat, deepseek2's legacy k_pe; PAD: qwen3vl's
deepstack; MEAN, SQRT: gemma3n's altup) run in numpy,
as does SET_ROWS into an F32 tensor with batched rows (DeepSeek V3's expert-group mask);
:data:`NUMPY_OPS` names them so reports can say so.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any, Callable

import numpy as np

from graphcost.format import ggml_types as gt
from graphcost.errors import UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import Op
from graphcost.execute.weights import read_only

OpFn = Callable[..., "np.ndarray | None"]

#: numpy dtype of each element-addressable ggml type (others are uint8 rows)
DTYPES = {gt.F32: np.float32, gt.F16: np.float16, gt.I32: np.int32, gt.I64: np.int64}

#: ops run in numpy rather than a Numba kernel (small bookkeeping ops, no kernel exists)
NUMPY_OPS = frozenset({Op.CONCAT, Op.ARGSORT, Op.SUM_ROWS, Op.CLAMP, Op.SIGMOID, Op.RELU,
                       Op.SQR, Op.SOFTPLUS, Op.REPEAT, Op.FILL, Op.PAD, Op.MEAN, Op.SQRT})

#: op kinds whose plain-float32 nodes run one shared kernel (``kernels.elementwise``'s
#: ``binary``, an op code apart): after any of them, that kernel's code is warm for the
#: others (:func:`code_kind`)
SHARED_KERNEL = {Op.ADD: "binary", Op.SUB: "binary", Op.MUL: "binary", Op.DIV: "binary"}


def code_kind(op: str) -> str:
    """The kind of code ``op``'s node runs: its shared kernel's name
    (:data:`SHARED_KERNEL`), else the op itself. The executor model's warmth counts the
    bytes streamed since a node of the same code kind last ran
    (:func:`graphcost.execute.profile.streamed_since`): on the EPYC VM (2026-11-27) an
    ADD of 640 values took 1.0-1.2 us right after a MUL (the same kernel) and 1.6-1.8 us
    right after a scale kernel, both after a 64 MiB flush."""
    return SHARED_KERNEL.get(op, str(op))


#: node outputs up to this size are allocated once per plan (larger ones per run, so a
#: long prompt's activations are not kept between steps)
PREALLOC_MAX_BYTES = 1 << 20


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
    """A 2-D ``[rows, row]`` view of a 2-D slice, as read-only uint8 rows for the kernels'
    weights. Read-only as a mapped file's weights are (:func:`graphcost.execute.weights.read_only`): numba
    compiles a kernel again, with every per-type function it dispatches to, for a
    writable array, so a KV cache or an activation read as rows (KQ, KQV, GET_ROWS of
    activations, a quantized cache decoded) takes the code compiled for the weights."""
    return read_only((a if a.strides[-1] == a.itemsize else np.ascontiguousarray(a))
                     .view(np.uint8))


def is_contiguous(t: Tensor) -> bool:
    """Whether ``t``'s value is C-contiguous (numpy's rule: size-1 dims ignored)."""
    shape, strides, dtype = shape_strides(t)
    step = np.dtype(dtype).itemsize
    for n, st in zip(shape[::-1], strides[::-1]):
        if n != 1 and st != step:
            return False
        step *= n
    return True


def _plain_f32(*ts: Tensor) -> bool:
    """All of ``ts`` are C-contiguous F32: the kernels take their values as they are."""
    return all(t.type == gt.F32 and is_contiguous(t) for t in ts)


class KernelNode:
    """A node computed by one numba kernel call into a C-contiguous float32 output.

    ``prep(*src_values, out)`` returns the kernel's arguments (views of the values, no
    copies when ``bindable``); ``out`` is the preallocated output (``None``: a fresh
    array per call, for large outputs) or, with ``result=False``, the node writes into
    a source's memory (SET_ROWS) and returns ``None``."""

    __slots__ = ("kern", "prep", "out", "shape", "bindable", "result")

    def __init__(self, kern, prep, shape=None, *, prealloc: bool = True,
                 bindable: bool = True, result: bool = True):
        self.kern, self.prep, self.shape = kern, prep, shape
        self.result, self.bindable = result, bindable
        self.out = None
        if result and prealloc and 4 * int(np.prod(shape)) <= PREALLOC_MAX_BYTES:
            self.out = np.empty(shape, dtype=np.float32)

    def __call__(self, *vals):
        if not self.result:
            self.kern(*self.prep(*vals, None))
            return None
        out = self.out if self.out is not None else np.empty(self.shape, dtype=np.float32)
        self.kern(*self.prep(*vals, out))
        return out

    def bind(self, *vals) -> Callable[[], Any] | None:
        """A zero-argument callable computing the node from these very source arrays
        (their contents may change between calls, not the arrays), or ``None`` when the
        node cannot be bound (per-run output, or sources that need a copy)."""
        if not self.bindable or (self.result and self.out is None):
            return None
        return partial(self.kern, *self.prep(*vals, self.out))


def resolve_entry(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` (a bound :meth:`KernelNode.bind` partial that has run once) calling the
    numba overload it compiled directly, skipping the dispatcher's type resolution of
    every argument; ``call`` unchanged if that overload is not found. Safe because a
    bound call always passes the same arrays (same types)."""
    import numba

    disp = getattr(call, "func", None)
    overloads = getattr(disp, "overloads", None)
    if overloads is None:
        return call
    try:
        sig = tuple(numba.typeof(a) for a in call.args)
    except (ValueError, TypeError):
        return call
    cres = overloads.get(sig)
    if cres is None:
        return call
    return partial(cres.entry_point, *call.args)


# ---------------------------------------------------------------------------- registry

OPS: dict[Op, Callable[[Tensor, Ctx], OpFn]] = {}


def op(*names: str):
    def deco(fn):
        for n in names:
            OPS[Op(n)] = fn
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


def weight_types(K: ModuleType) -> tuple[gt.GGMLType, ...]:
    """Weight types the executor runs: the row decoders' (``kernels.quants``), and MXFP4
    (``kernels.mxfp4``: matmuls only; a GET_ROWS from it is refused when compiled)."""
    return tuple(K.quants.SUPPORTED) + (gt.GGMLType.MXFP4,)


def matmul_fn(ctx: Ctx, w_type: gt.GGMLType, k: int, m: int) -> Callable[..., np.ndarray]:
    """``f(w, x, out=None) -> y``: the kernel a MUL_MAT with ``w_type`` weights (``k``
    columns, ``m`` rows) runs in ``ctx.numerics`` mode (hwprobe times the same function).
    MXFP4: ``fast`` decodes on the fly against float32 x; ``ggml`` quantizes x to Q8_0
    (its vec_dot_type) and runs ggml_vec_dot_mxfp4_q8_0 (``kernels.mxfp4``)."""
    mm = ctx.K.matmul
    if w_type == gt.GGMLType.MXFP4:
        X = ctx.K.mxfp4
        if ctx.numerics == "fast":
            return lambda w, x, out=None: X.mul_mat(w, k, m, x, out=out)
        quant = ctx.K.quants.quantize_activations
        return lambda w, x, out=None: X.mul_mat_ggml(
            w, k, m, quant(np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32),
                           X.VEC_DOT_TYPE), out=out)
    supported = ctx.K.quants.SUPPORTED
    if w_type not in supported:
        raise UnsupportedError(f"matmul with {gt.type_name(w_type)} weights: the kernels "
                               f"support {', '.join(gt.type_name(t) for t in supported)}")
    if not _takes_ggml(ctx, w_type):
        return lambda w, x, out=None: mm.mul_mat(w, w_type, k, m, x, out=out)
    return lambda w, x, out=None: mm.mul_mat_ggml(w, w_type, k, m, x, out=out)


def _takes_ggml(ctx: Ctx, w_type: gt.GGMLType) -> bool:
    """Whether :func:`matmul_fn` runs ``mul_mat_ggml`` for a supported non-MXFP4
    ``w_type`` in ``ctx.numerics`` mode (``fast`` keeps it only where it is fastest)."""
    return ctx.numerics != "fast" or w_type in ctx.K.matmul.GGML_FASTEST


def _fused_matvec(node: Tensor, ctx: Ctx):
    """``kernels.matmul.fused_matvec`` for a decode MUL_MAT whose weights take ggml's
    byte-SIMD dots in ``ctx.numerics`` mode (where :func:`matmul_fn` calls
    ``mul_mat_ggml``): quantizing, rearranging and the dots in one numba call, into
    buffers allocated once. ``None`` otherwise."""
    a, b = node.src
    if a.type not in ctx.K.quants.SUPPORTED or not _takes_ggml(ctx, a.type):
        return None
    return ctx.K.matmul.fused_matvec(a.type, a.ne[0], a.ne[1], b.ne[1])


@op(Op.MUL_MAT)
def _mul_mat(node: Tensor, ctx: Ctx) -> OpFn:
    # a:[K, M, A2, A3] x b:[K, N, B2, B3] -> [M, N, B2, B3]; b batch i2 uses a batch i2 // (B2/A2)
    a, b = node.src
    k, m = a.ne[0], a.ne[1]
    n, b2, b3 = b.ne[1], b.ne[2], b.ne[3]
    a2, a3 = a.ne[2], a.ne[3]
    r2, r3 = b2 // a2, b3 // a3
    mm = matmul_fn(ctx, a.type, k, m)

    if a2 == a3 == b2 == b3 == 1:
        if b.type == gt.F32 and is_contiguous(b) and is_contiguous(a) and \
                4 * n * m <= PREALLOC_MAX_BYTES:
            fused = _fused_matvec(node, ctx)
            if fused is not None:
                kern, code, tail = fused
                return KernelNode(kern, lambda av, bv, out: (_rows2d(av[0, 0]), code, bv[0, 0])
                                  + tail + (out[0, 0],), (1, 1, n, m))
            # into the node's own output, so that it (and the views of it) stay the same
            # array every run
            return KernelNode(mm, lambda av, bv, out: (_rows2d(av[0, 0]), bv[0, 0], out[0, 0]),
                              (1, 1, n, m))

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


@op(Op.MUL_MAT_ID)
def _mul_mat_id(node: Tensor, ctx: Ctx) -> OpFn:
    # experts:[K, M, E] x b:[K, n_b, T] for ids:[k, T] -> [M, k, T]; slot j of token t uses
    # expert ids[t, j] on b row j % n_b (ggml_compute_forward_mul_mat_id)
    a, b, ids = node.src
    k, m = a.ne[0], a.ne[1]
    n_used, n_tok = ids.ne[0], ids.ne[1]
    n_b = b.ne[1]
    mm = matmul_fn(ctx, a.type, k, m)

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


@op(Op.GET_ROWS)
def _get_rows(node: Tensor, ctx: Ctx) -> OpFn:
    # a:[K, R, A2, A3] rows idx:[n, I1, I2] -> [K, n, I1, I2]; out[i2][i1][i0] = a[i2][i1][idx]
    a, idx = node.src
    k = a.ne[0]
    gr = ctx.K.get_rows.get_rows
    kernel_type = a.type if a.type in ctx.K.quants.SUPPORTED else None
    if kernel_type is None:
        raise UnsupportedError(f"get_rows from {gt.type_name(a.type)} ({node.name})")
    n0, n1, n2 = idx.ne[0], idx.ne[1], idx.ne[2]

    if n1 == n2 == 1 and is_contiguous(a) and idx.type in (gt.I32, gt.I64):
        # the kernel reads the I32/I64 index as it is (one compiled overload per index
        # type): a bound call is one call of that overload, with no Python wrapper and no
        # copy of the index (issue 12: those paths run cold once a step and cost 4-15 us)
        kern = ctx.K.get_rows.kernel(n0 * k)
        code = np.int64(int(kernel_type))
        return KernelNode(kern, lambda av, iv, out: (_rows2d(av[0, 0]), code, iv[0, 0, 0],
                                                     out[0, 0]), (1, 1, n0, k))

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


@op(Op.SET_ROWS)
def _set_rows(node: Tensor, ctx: Ctx) -> OpFn:
    # rows of b:[K, n] (F32) stored into a:[K, R] (cache type) at idx:[n]; result is a view of a
    b, idx, a = node.src
    if a.type == gt.F32 and b.type == gt.F32 and (b.ne[2] != 1 or b.ne[3] != 1):
        return _set_rows_batched_f32(node)
    if b.ne[2] != 1 or b.ne[3] != 1 or a.ne[2] != 1 or a.ne[3] != 1:
        raise UnsupportedError(f"set_rows with batched rows ({node.name})")
    if a.type not in ctx.K.cache.CACHE_TYPES:
        raise UnsupportedError(f"KV cache type {gt.type_name(a.type)}: the set_rows kernel "
                               f"stores {', '.join(gt.type_name(t) for t in ctx.K.cache.CACHE_TYPES)}")
    sr = ctx.K.cache.set_rows
    if _plain_f32(b) and idx.type == gt.I64 and is_contiguous(a) and is_contiguous(idx):
        kern = ctx.K.cache.kernel("set_rows", b.ne[0] * b.ne[1])
        code = np.int64(int(a.type))
        rb = gt.row_size(a.type, a.ne[0])

        def prep(bv, iv, av, out):
            return av[0, 0].view(np.uint8).reshape(-1, rb), bv[0, 0], iv[0, 0, 0], code, True
        return KernelNode(kern, prep, result=False)

    def run(bv, iv, av):
        dst = av[0, 0]
        if dst.dtype != np.uint8:
            dst = dst.view(np.uint8)
        sr(dst, a.type, bv[0, 0], iv[0, 0, 0])
        return None
    return run


def set_rows_batched(dst: np.ndarray, rows: np.ndarray, idx: np.ndarray) -> None:
    """ggml_compute_forward_set_rows_impl (ggml-cpu/ops.cpp) for an F32 destination, in
    numpy order: ``dst[i3, i2, idx[i3 % I2, i2 % I1, i], :] = rows[i3, i2, i, :]`` for
    every row ``i`` of ``rows`` (shape ``(R3, R2, R1, K)``); ``idx`` is ``(1, I2, I1, R1)``."""
    n3, n2, n1 = rows.shape[:3]
    i2n, i1n = idx.shape[1], idx.shape[2]
    for i3 in range(n3):
        for i2 in range(n2):
            r = idx[0, i3 % i2n, i2 % i1n, :n1].astype(np.int64)
            if r.size and (r.min() < 0 or r.max() >= dst.shape[2]):
                raise IndexError(f"set_rows index out of range 0..{dst.shape[2] - 1}")
            dst[i3, i2, r] = rows[i3, i2]


def _set_rows_batched_f32(node: Tensor) -> OpFn:
    # the expert-group mask (statements/moe.py mask_expert_groups): rows of
    # [per_group, n_group_used, n_tokens] into a FILL of [per_group, n_groups, n_tokens]
    def run(bv, iv, av):
        set_rows_batched(av, bv, iv)
        return av                     # the node views the filled tensor it wrote into
    return run


@op(Op.FILL)
def _fill(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_compute_forward_fill: a new tensor of ``a``'s shape, every element ``c``
    if node.type != gt.F32:
        raise UnsupportedError(f"fill of {gt.type_name(node.type)} ({node.name})")
    shape, c = shape_strides(node)[0], np.float32(node.params["c"])
    return lambda av: np.full(shape, c, dtype=np.float32)


@op(Op.CPY)
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


@op(Op.CONT)
def _cont(node: Tensor, ctx: Ctx) -> OpFn:
    shape = shape_strides(node)[0]
    if node.type == gt.F32 and node.src[0].type == gt.F32:
        src_shape = shape_strides(node.src[0])[0]     # out viewed in the source's shape
        return KernelNode(ctx.K.cache.kernel("cont", node.n_elements),
                          lambda av, out: (av, out.reshape(src_shape)), shape)
    if node.type == gt.F32:
        cont = ctx.K.cache.cont
        return lambda av: cont(av).reshape(shape)
    if is_rows_type(node.type):
        raise UnsupportedError(f"cont of {gt.type_name(node.type)} ({node.name})")
    return lambda av: np.ascontiguousarray(av).reshape(shape)


@op(Op.CONCAT)
def _concat(node: Tensor, ctx: Ctx) -> OpFn:
    axis = 3 - node.params["dim"]
    return lambda av, bv: np.ascontiguousarray(np.concatenate([av, bv], axis=axis))


@op(Op.PAD)
def _pad(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_compute_forward_pad_f32: the source at the start of each dim, zeros after
    # (ggml_pad: right padding p[i] of dim i; qwen3vl's deepstack embeddings)
    if node.type != gt.F32 or node.src[0].type != gt.F32:
        raise UnsupportedError(f"PAD of {gt.type_name(node.src[0].type)} ({node.name})")
    widths = [(0, p) for p in reversed(node.params["pad"])]
    return lambda av: np.pad(av, widths)


# ---------------------------------------------------------------------------- element-wise


@op(Op.ADD, Op.SUB, Op.MUL, Op.DIV)
def _binary(node: Tensor, ctx: Ctx) -> OpFn:
    name = node.op.lower()
    e = ctx.K.elementwise
    a, b = node.src
    if _plain_f32(a, b):
        code = np.int64(e.OPS[name])
        return KernelNode(e.kernel("binary", a.n_elements), lambda av, bv, out: (av, bv, code, out),
                          shape_strides(node)[0])
    binary = e.binary
    return lambda av, bv: binary(name, av, _f32(bv))


@op(Op.SCALE)
def _scale(node: Tensor, ctx: Ctx) -> OpFn:
    s, bias = node.params["scale"], node.params.get("bias", 0.0)
    e = ctx.K.elementwise
    if node.is_view:
        # ggml_scale_inplace (build_rs zeroing a recurrent cell): written into the source
        fs, fb = np.float32(s), np.float32(bias)

        def inplace(av):
            av *= fs
            if fb:
                av += fb
            return None
        return inplace
    if _plain_f32(node.src[0]):
        code = "scale" if bias == 0.0 else "scale_bias"
        return _unary_node(node, ctx, code, s, bias)
    scale = e.scale
    return lambda av: scale(av, s, bias)


def _flat_node(node: Tensor, ctx: Ctx, kind: str, args: tuple) -> OpFn:
    """The element-wise kernel ``kind`` (``kernels.elementwise.kernel``) over the flat
    values of a C-contiguous F32 source, with its other arguments ``args``."""
    return KernelNode(ctx.K.elementwise.kernel(kind, node.src[0].n_elements),
                      lambda av, out: (av.reshape(-1),) + args + (out.reshape(-1),),
                      shape_strides(node)[0])


def _unary_node(node: Tensor, ctx: Ctx, name: str, s: float = 1.0, b: float = 0.0) -> OpFn:
    """One element-wise kernel over the flat values (C-contiguous F32 source)."""
    e = ctx.K.elementwise
    return _flat_node(node, ctx, "unary", (
        np.int64(e.UNARY_CODES[name]), np.float32(s), np.float32(b),
        e.gelu_table() if name == "gelu_f16_table" else np.zeros(1, dtype=np.uint16)))


def _fast_activation(node: Tensor, ctx: Ctx) -> str | None:
    """The :data:`kernels.elementwise.FAST_CODES` name of ``node``'s activation (SILU,
    GELU, SWIGLU, GEGLU) under ``fast`` numerics, else None (ggml's: libm, the F16 table)."""
    if ctx.numerics != "fast":
        return None
    return {"SILU": "silu", "SWIGLU": "silu", "GELU": "gelu", "GEGLU": "gelu"}.get(node.op)


@op(Op.SILU, Op.GELU, Op.TANH)
def _unary(node: Tensor, ctx: Ctx) -> OpFn:
    e = ctx.K.elementwise
    fast = _fast_activation(node, ctx)
    if fast and _plain_f32(node.src[0]):
        return _flat_node(node, ctx, "fast_unary", (np.int64(e.FAST_CODES[fast]),))
    if fast:
        return {"silu": e.silu_fast, "gelu": e.gelu_fast}[fast]
    # ggml-cpu computes GELU through its F16 table (vec.h GGML_GELU_FP16)
    if _plain_f32(node.src[0]):
        return _unary_node(node, ctx, {"SILU": "silu", "GELU": "gelu_f16_table",
                                       "TANH": "tanh"}[node.op])
    return {"SILU": e.silu, "GELU": e.gelu_f16_table, "TANH": e.tanh}[node.op]


@op(Op.SIGMOID)
def _sigmoid(node: Tensor, ctx: Ctx) -> OpFn:
    one = np.float32(1)
    return lambda av: (one / (one + np.exp(-_f32(av)))).astype(np.float32)


@op(Op.RELU)
def _relu(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_vec_relu_f32: x > 0 ? x : 0
    zero = np.float32(0)
    return lambda av: np.where(av > zero, av, zero).astype(np.float32)


@op(Op.SQR)
def _sqr(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_vec_sqr_f32: x*x in float32
    return lambda av: np.multiply(_f32(av), _f32(av), dtype=np.float32)


@op(Op.SOFTPLUS)
def _softplus(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_compute_softplus_f32: x > 20 ? x : logf(1 + expf(x))
    lim, one = np.float32(20), np.float32(1)

    def run(av):
        a = _f32(av)
        with np.errstate(over="ignore"):
            return np.where(a > lim, a, np.log(one + np.exp(a))).astype(np.float32)
    return run


@op(Op.REPEAT)
def _repeat(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_repeat: dst[i3, i2, i1, i0] = src[i3 % ne3, ...] (whole copies of src per dim)
    reps = tuple(n // m for n, m in zip(shape_strides(node)[0], shape_strides(node.src[0])[0]))
    return lambda av: np.ascontiguousarray(np.tile(av, reps))


@op(Op.CLAMP)
def _clamp(node: Tensor, ctx: Ctx) -> OpFn:
    lo, hi = np.float32(node.params["min"]), np.float32(node.params["max"])
    return lambda av: np.clip(av, lo, hi).astype(np.float32)


@op(Op.ADD_ID)
def _add_id(node: Tensor, ctx: Ctx) -> OpFn:
    # a:[n, k, T] + row ids[j, t] of b:[n, E] (per-expert biases): kernels.elementwise.add_id
    a, b, ids = node.src
    if a.type != gt.F32 or b.type != gt.F32 or ids.type != gt.I32 or a.ne[3] != 1 \
            or b.ne[2] != 1 or b.ne[3] != 1:
        raise UnsupportedError(f"add_id of {gt.type_name(a.type)} {list(a.ne)} ({node.name})")
    k, t = a.ne[1], a.ne[2]
    add_id = ctx.K.elementwise.add_id

    def run(av, bv, iv):
        try:
            return add_id(av[0], bv[0, 0], iv[0, 0, :t, :k])[None]
        except ValueError as e:
            raise UnsupportedError(f"{node.name}: {e}") from None
    return run


@op(Op.SWIGLU_OAI)
def _swiglu_oai(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_swiglu_oai(a, b): the split form (gpt-oss: gate and up from two matmuls)
    if len(node.src) != 2 or any(t.type != gt.F32 for t in node.src) or \
            node.src[0].ne != node.src[1].ne:
        raise UnsupportedError(f"swiglu_oai of one tensor, non-F32 or unequal shapes "
                               f"({node.name})")
    alpha, limit = node.params["alpha"], node.params["limit"]
    n0 = node.ne[0]
    shape = shape_strides(node)[0]
    sw = ctx.K.elementwise.swiglu_oai

    def run(av, bv):
        return sw(av.reshape(-1, n0), bv.reshape(-1, n0), alpha, limit).reshape(shape)
    return run


@op(Op.SWIGLU, Op.GEGLU)
def _glu(node: Tensor, ctx: Ctx) -> OpFn:
    e = ctx.K.elementwise
    fast = _fast_activation(node, ctx)
    if len(node.src) == 2 and _plain_f32(*node.src) and node.src[0].ne == node.src[1].ne:
        if fast:
            kind, args = "fast_gated", (np.int64(e.FAST_CODES[fast]),)
        else:
            name = "swiglu" if node.op == "SWIGLU" else "geglu_f16_table"
            kind, args = "gated", (np.int64(e.GATED_CODES[name]), e.gelu_table()
                                   if name == "geglu_f16_table" else np.zeros(1, np.uint16))
        return KernelNode(e.kernel(kind, node.n_elements),
                          lambda av, bv, out: (av.reshape(-1), bv.reshape(-1)) + args
                          + (out.reshape(-1),), shape_strides(node)[0])
    if fast:
        gated = {"silu": e.swiglu_fast, "gelu": e.geglu_fast}[fast]
    else:
        gated = e.swiglu if node.op == "SWIGLU" else e.geglu_f16_table
    if len(node.src) == 2:          # ggml_*_split(a, b): act(a) * b
        return lambda av, bv: gated(av, bv)
    half = node.ne[0]               # ggml_swiglu(a): act(first half) * second half

    return lambda av: gated(av[..., :half], av[..., half:])


# ---------------------------------------------------------------------------- rows


@op(Op.RMS_NORM, Op.NORM)
def _norm(node: Tensor, ctx: Ctx) -> OpFn:
    eps = node.params["eps"]
    f = ctx.K.norm.rms_norm if node.op == "RMS_NORM" else ctx.K.norm.norm
    if _plain_f32(node.src[0]):
        n0 = node.ne[0]
        feps = np.float32(eps)
        return KernelNode(ctx.K.norm.kernel(node.op.lower(), node.n_elements),
                          lambda av, out: (av.reshape(-1, n0), feps, out.reshape(-1, n0)),
                          shape_strides(node)[0])
    return lambda av: f(av, eps)


def _sinks(node: Tensor, i: int) -> Tensor | None:
    """The attention-sink logits (gpt-oss; ggml_*_add_sinks: F32 [n_head]) at ``src[i]``."""
    if not node.params.get("sinks"):
        return None
    s = node.src[i]
    if s.type != gt.F32 or not is_contiguous(s) or s.n_elements != node.src[0].ne[2]:
        raise UnsupportedError(f"{node.name}: sinks {gt.type_name(s.type)} {list(s.ne)} for "
                               f"{node.src[0].ne[2]} heads")
    return s


def _sink_values(sv: np.ndarray) -> np.ndarray:
    # read-only, as the kernels take sinks (a weight; zeros without: see _soft_max)
    return read_only(sv.reshape(-1) if sv.flags.c_contiguous
                     else np.ascontiguousarray(sv).reshape(-1))


@op(Op.SOFT_MAX)
def _soft_max(node: Tensor, ctx: Ctx) -> OpFn:
    # a:[n_kv, T, H] (+ mask [n_kv, T], + sinks [H]: src[2], one logit per head)
    scale, max_bias = node.params["scale"], node.params["max_bias"]
    sm = ctx.K.softmax.soft_max
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    sinks = _sinks(node, 2)
    if sinks is not None:
        if len(node.src) != 3:
            raise UnsupportedError(f"{node.name}: soft_max sinks without a mask")
        S = ctx.K.softmax
        if _plain_f32(a) and mask.type in (gt.F16, gt.F32) and is_contiguous(mask) \
                and mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1] \
                and a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0:
            m32, m16 = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.uint16)
            kind = np.int64(2 if mask.type == gt.F16 else 1)
            fs, slopes = np.float32(scale), S.alibi_slopes(a.ne[2], max_bias)

            def prep_s(av, mv, sv, out):
                ms = (m32, mv.view(np.uint16)) if mv.dtype == np.float16 else (mv, m16)
                return (av,) + ms + (kind, fs, slopes, _sink_values(sv), True, out)
            return KernelNode(S.kernel(a.n_elements), prep_s, shape_strides(node)[0])
        return lambda av, mv, sv: sm(av, mv, scale, max_bias, sinks=_sink_values(sv))
    if len(node.src) <= 2 and _plain_f32(a) and (
            mask is None or (mask.type in (gt.F16, gt.F32) and is_contiguous(mask)
                             and mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1]
                             and a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0)):
        S = ctx.K.softmax
        m32, m16 = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.uint16)
        kind = np.int64(0 if mask is None else 2 if mask.type == gt.F16 else 1)
        # no sinks: zeros, read-only as sinks are (a weight), one compiled kernel for both
        tail = (np.float32(scale), S.alibi_slopes(a.ne[2], max_bias),
                read_only(np.zeros(a.ne[2], dtype=np.float32)), False)

        def prep(av, mv=None, out=None):
            if mv is None:
                return (av, m32, m16, kind) + tail + (out,)
            if mv.dtype == np.float16:
                return (av, m32, mv.view(np.uint16), kind) + tail + (out,)
            return (av, mv, m16, kind) + tail + (out,)
        if mask is None:
            return KernelNode(S.kernel(a.n_elements), lambda av, out: prep(av, None, out),
                              shape_strides(node)[0])
        return KernelNode(S.kernel(a.n_elements), prep, shape_strides(node)[0])
    if len(node.src) == 1:
        return lambda av: sm(av, None, scale, max_bias)
    return lambda av, mv: sm(av, mv, scale, max_bias)


@op(Op.SUM_ROWS)
def _sum_rows(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_vec_sum_f32 accumulates in ggml_float (double)
    return lambda av: av.astype(np.float64).sum(-1, keepdims=True).astype(np.float32)


@op(Op.MEAN)
def _mean(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_compute_forward_mean_f32: ggml_vec_sum_f32 (double sum, stored as float), then
    # divided by (float) ne00 (gemma3n's altup magnitudes)
    n = np.float32(node.src[0].ne[0])
    return lambda av: av.astype(np.float64).sum(-1, keepdims=True).astype(np.float32) / n


@op(Op.SQRT)
def _sqrt(node: Tensor, ctx: Ctx) -> OpFn:
    # ggml_vec_sqrt_f32: sqrtf per element
    return lambda av: np.sqrt(_f32(av))


@op(Op.ARGSORT)
def _argsort(node: Tensor, ctx: Ctx) -> OpFn:
    desc = node.params.get("order", "desc") == "desc"
    return lambda av: np.argsort(-av if desc else av, axis=-1, kind="stable").astype(np.int32)


@op(Op.ROPE)
def _rope(node: Tensor, ctx: Ctx) -> OpFn:
    # x:[D, H, T] -> numpy [T, H, D]; pos:[T] ([4T] for MROPE/IMROPE: ggml_rope_multi);
    # optional freq_factors:[D/2]
    p = node.params
    R = ctx.K.rope
    if p["mode"] not in R.MODES:
        raise UnsupportedError(f"rope mode {p['mode']} ({node.name}): the kernel does "
                               "NORMAL (0), NEOX (2), MROPE (8) and IMROPE (40)")
    if node.ne[3] != 1:
        raise UnsupportedError(f"rope over 4-D tensors ({node.name})")
    rope = R.rope
    kw = dict(n_dims=p["n_dims"], mode=p["mode"], freq_base=p["freq_base"],
              freq_scale=p["freq_scale"], n_ctx_orig=p.get("n_ctx_orig", 0),
              # llama_context: yarn_ext_factor -1 -> 0 unless the model uses YaRN
              ext_factor=p.get("ext_factor", 0.0), attn_factor=p.get("attn_factor", 1.0),
              beta_fast=p.get("beta_fast", 32.0), beta_slow=p.get("beta_slow", 1.0),
              sections=tuple(p.get("sections", (0, 0, 0, 0))))
    mode = p["mode"]

    x, pos = node.src[:2]
    ff = node.src[2] if len(node.src) > 2 else None
    n_track = 4 if mode in R.MULTI else 1
    if pos.n_elements != n_track * x.ne[2]:
        raise UnsupportedError(f"{node.name}: {pos.n_elements} positions for {x.ne[2]} "
                               f"tokens in rope mode {mode}")
    offs = p.get("n_offs", 0)
    if offs:
        return _rope_offset(node, offs, rope, kw)
    if _plain_f32(x) and pos.type == gt.I32 and is_contiguous(pos) and \
            (ff is None or _plain_f32(ff)) and x.ne[0] >= p["n_dims"] and p["n_dims"] % 2 == 0:
        base = R.params(**kw)
        if ff is not None and ff.n_elements < p["n_dims"] // 2:
            raise UnsupportedError(f"{node.name}: freq_factors has {ff.n_elements} values, "
                                   f"rope needs {p['n_dims'] // 2}")
        kern = R.kernel(x.n_elements)
        if ff is None:
            return KernelNode(kern, lambda xv, pv, out: (xv[0], pv[0, 0, 0].reshape(n_track, -1))
                              + base + (out[0],), shape_strides(node)[0])
        return KernelNode(kern, lambda xv, pv, fv, out: (xv[0], pv[0, 0, 0].reshape(n_track, -1))
                          + base[:5] + (fv.reshape(-1), True) + base[7:] + (out[0],),
                          shape_strides(node)[0])
    if len(node.src) == 2:
        return lambda xv, pv: rope(xv[0], pv[0, 0, 0], **kw)[None]
    return lambda xv, pv, fv: rope(xv[0], pv[0, 0, 0], freq_factors=fv.reshape(-1), **kw)[None]


def _rope_offset(node: Tensor, offs: int, rope, kw: dict) -> OpFn:
    # ggml_rope_set_offset (ggml-cpu/ops.cpp rope_flt): dims [offs, offs + n_dims) of each
    # head rotate as a head of n_dims would (same thetas: they depend on n_dims and the
    # pair index only); the other dims are copied
    n_dims = kw["n_dims"]
    if node.src[0].type != gt.F32 or offs % 2 or offs + n_dims > node.ne[0]:
        raise UnsupportedError(f"rope offset {offs} ({node.name})")
    sl = slice(offs, offs + n_dims)

    def run(xv, pv, fv=None):
        out = np.array(xv[0], dtype=np.float32, copy=True)
        ff = None if fv is None else fv.reshape(-1)
        out[..., sl] = rope(np.ascontiguousarray(xv[0][..., sl]), pv[0, 0, 0],
                            freq_factors=ff, **kw)
        return out[None]
    return run


@op(Op.FLASH_ATTN_EXT)
def _flash_attn(node: Tensor, ctx: Ctx) -> OpFn:
    # q:[D, T, H] k:[D, n_kv, Hkv] v:[Dv, n_kv, Hkv] mask:[n_kv, T] (sinks:[H]) -> [Dv, H, T]
    _sinks(node, 4)  # refuses sinks the kernel cannot read
    p = node.params
    q, k, v = node.src[:3]
    fa = ctx.K.attention.flash_attn_ext
    if q.ne[3] != 1 or k.ne[3] != 1:
        raise UnsupportedError(f"flash attention over several streams ({node.name})")
    q_as = _q_for_k(k, ctx)
    deq_k = _kv_as_float(k, ctx)
    deq_v = _kv_as_float(v, ctx)
    scale, max_bias, softcap = p["scale"], p["max_bias"], p["softcap"]
    mask = node.src[3] if len(node.src) > 3 else None
    if q.type == gt.F32 and k.type in (gt.F16, gt.F32) and \
            v.type in (gt.F16, gt.F32) and (mask is None or mask.type == gt.F16):
        return _flash_attn_node(node, ctx)

    def run(qv, kv, vv, mv=None, sv=None):
        out = fa(q_as(qv[0]), deq_k(kv[0]), deq_v(vv[0]), None if mv is None else mv[0],
                 scale, max_bias, softcap, sinks=None if sv is None else _sink_values(sv),
                 split=False)     # llama.cpp splits a decode's keys for F16/F32 K, V only
        return out[None]
    return run


def _flash_attn_node(node: Tensor, ctx: Ctx) -> OpFn:
    """FLASH_ATTN_EXT on F16/F32 K and V straight into the kernel (what
    ``flash_attn_ext`` passes it, prepared once); non-contiguous sources are copied per
    run (and the node is then not bindable)."""
    A = ctx.K.attention
    p = node.params
    q, k, v = node.src[:3]
    mask = node.src[3] if len(node.src) > 3 else None
    n_head, n_tok, n_kv = q.ne[2], q.ne[1], k.ne[1]
    if k.ne[2] == 0 or n_head % k.ne[2] or k.ne[0] != q.ne[0] or v.ne[1:3] != k.ne[1:3] or (
            mask is not None and (mask.ne[1] < n_tok or mask.ne[0] != n_kv
                                  or n_head % mask.ne[2])):
        raise UnsupportedError(f"{node.name}: q {q.ne}, k {k.ne}, v {v.ne} do not fit")
    contig = [is_contiguous(t) for t in node.src]
    k_f16, v_f16 = k.type == gt.F16, v.type == gt.F16
    z16, z32 = np.zeros((1, 1, 1), np.uint16), np.zeros((1, 1, 1), np.float32)
    kv_f16 = np.array([k_f16, v_f16, ctx.numerics == "fast"])   # A.FAST: the third flag
    head = (np.float32(p["scale"]), np.float32(p["softcap"]), A.alibi_slopes(n_head, p["max_bias"]))
    tail = head + (read_only(np.zeros(n_head, dtype=np.float32)), False)   # as _soft_max's

    def c(a, i):
        return a if contig[i] else np.ascontiguousarray(a)

    def prep(qv, kv, vv, mv=None, out=None, sv=None):
        kk, vvv = c(kv[0], 1), c(vv[0], 2)
        ks = (kk.view(np.uint16), z32) if k_f16 else (z16, kk)
        vs = (vvv.view(np.uint16), z32) if v_f16 else (z16, vvv)
        m = z16 if mv is None else c(mv[0], 3).view(np.uint16)
        t = tail if sv is None else head + (_sink_values(sv), True)
        return (c(qv[0], 0),) + ks + vs + (kv_f16, m, mv is not None) + t + (out[0],)

    kern = A.kernel(n_head * n_tok * n_kv * (k.ne[0] + v.ne[0]), n_tok, n_head, k.ne[2], n_kv,
                    k.type == v.type, ctx.numerics == "fast")
    shape = shape_strides(node)[0]
    if len(node.src) > 4:           # sinks (src[4], after the mask)
        return KernelNode(kern, lambda qv, kv, vv, mv, sv, out: prep(qv, kv, vv, mv, out, sv),
                          shape, bindable=all(contig))
    if mask is None:
        return KernelNode(kern, lambda qv, kv, vv, out: prep(qv, kv, vv, None, out), shape,
                          bindable=all(contig))
    return KernelNode(kern, prep, shape, bindable=all(contig))


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
        return gr(_rows2d(raw), vdt, d, np.arange(h * t)).reshape(h, t, d)
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
        rows = _rows2d(np.ascontiguousarray(a).reshape(h * n, rb))
        return gr(rows, t.type, d, np.arange(h * n)).reshape(h, n, d)
    return deq


# ---------------------------------------------------------------------------- recurrent (Mamba)


@op(Op.SSM_CONV)
def _ssm_conv(node: Tensor, ctx: Ctx) -> OpFn:
    # sx:[d_conv - 1 + n_t, d_inner, n_s] (*) c:[d_conv, d_inner] -> [d_inner, n_t, n_s]
    sx, c = node.src
    if not _plain_f32(c) or sx.type != gt.F32 or sx.ne[3] != 1:
        raise UnsupportedError(f"SSM_CONV of {gt.type_name(sx.type)} x {gt.type_name(c.type)} "
                               f"{list(sx.ne)} ({node.name})")
    return KernelNode(ctx.K.ssm.ssm_conv, lambda sv, cv, out: (sv[0], cv[0, 0], out[0]),
                      shape_strides(node)[0])


@op(Op.SSM_SCAN)
def _ssm_scan(node: Tensor, ctx: Ctx) -> OpFn:
    # s:[d_state, head_dim, n_head, rows] x:[head_dim, n_head, n_t, n_s] dt:[n_head, n_t, n_s]
    # A:[1, n_head] B, C:[d_state, n_group, n_t, n_s] ids:[n_s] -> F32 [y..., new states...]
    s, x, dt, A, B, C, ids = node.src
    if A.ne[0] != 1:
        raise UnsupportedError(f"SSM_SCAN with Mamba-1 decay factors ({node.name}) is not executed")
    if node.params.get("K", 1) != 1:
        raise UnsupportedError(f"SSM_SCAN with {node.params['K']} state slots ({node.name}) "
                               "is not executed")
    if any(t.type != gt.F32 for t in (s, x, dt, A, B, C)) or ids.type != gt.I32:
        raise UnsupportedError(f"SSM_SCAN on non-F32 sources ({node.name})")
    d_state, head_dim, n_head = s.ne[0], s.ne[1], s.ne[2]
    n_s = ids.ne[0]
    n_x = x.n_elements
    y_shape = (x.ne[3], x.ne[2], n_head, head_dim)
    s_shape = (n_s, n_head, head_dim, d_state)

    def prep(sv, xv, dtv, av, bv, cv, iv, out):
        flat = out.reshape(-1)
        return (sv, xv, dtv[0], av.reshape(-1), bv, cv, iv.reshape(-1),
                flat[:n_x].reshape(y_shape), flat[n_x:].reshape(s_shape))
    return KernelNode(ctx.K.ssm.ssm_scan, prep, shape_strides(node)[0])


@op(Op.GATED_DELTA_NET)
def _gated_delta_net(node: Tensor, ctx: Ctx) -> OpFn:
    # q, k:[S, H_q, n_t, n_sq] v:[S, H, n_t, n_s] g:[1 or S, H, n_t, n_s] beta:[1, H, n_t, n_s]
    # state:[S, S, H, n_s] -> F32 [S * H, n_t * n_s + S * n_s] (outputs, then the new state)
    q, k, v, g, beta, state = node.src
    if node.params.get("K", 1) != 1:
        raise UnsupportedError(f"GATED_DELTA_NET with {node.params['K']} state slots "
                               f"({node.name}) is not executed")
    if any(t.type != gt.F32 for t in node.src):
        raise UnsupportedError(f"GATED_DELTA_NET on non-F32 sources ({node.name})")
    S, H, n_t, n_s = v.ne
    n_out = v.n_elements
    o_shape, s_shape = (n_s, n_t, H, S), (n_s, H, S, S)

    def prep(qv, kv, vv, gv, bv, sv, out):
        flat = out.reshape(-1)
        return (qv, kv, vv, gv, bv, sv, flat[:n_out].reshape(o_shape),
                flat[n_out:].reshape(s_shape))
    return KernelNode(ctx.K.ssm.gated_delta_net, prep, shape_strides(node)[0])
