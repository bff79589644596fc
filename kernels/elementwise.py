"""Element-wise ops: add/sub/mul/div with ggml broadcasting, scale, and activations.

Shapes are numpy order (ggml ne reversed): ``a`` up to 4-D, float32.

Broadcasting is ggml's ``ggml_can_repeat``, not numpy's: every dim of ``b`` must
divide the matching dim of ``a`` and ``b`` is *tiled* over ``a`` (element ``i`` of a
row of ``a`` meets ``b[i % len(b)]``; binary-ops.cpp ``apply_binary_op``). Exact: one
float32 rounding per element, same as the numpy reference.

Activations, float32 (vec.h):

* ``silu(x) = x / (1 + expf(-x))``; ``tanh``: ``tanhf``.
* ``gelu``: the tanh form ``0.5x(1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2)))``.
* ``gelu_f16_table``: what ggml's CPU backend actually computes (``GGML_GELU_FP16``):
  x <= -10 -> 0, x >= 10 -> x, otherwise x is rounded to F16 and looked up in a
  65536-entry table of F16 results computed in float32 with the tanh formula.
* ``swiglu(a, b) = silu(a) * b``, ``geglu(a, b) = gelu(a) * b`` (the split forms),
  ``geglu_f16_table`` with the table GELU.
* gpt-oss: ``swiglu_oai(a, b)`` (alpha, limit) and ``add_id`` (per-expert bias rows).

ggml's x86 SIMD loops compute ``expf`` for silu/softmax with their own polynomial
(``ggml_v_expf``, <= 2 ulp from libm), so silu here can differ from llama.cpp by a
couple of float32 ulp. The references below compute in float64.
"""
from __future__ import annotations

from functools import cache

import numpy as np
from numba import njit, prange

from .bits import f16_to_f32, f32_to_f16, fma_f32

F = np.float32
OPS = {"add": 0, "sub": 1, "mul": 2, "div": 3}

# vec.h constants
GELU_COEF_A = F(0.044715)
SQRT_2_OVER_PI = F(0.79788456080286535587989211986876)


# ---------------------------------------------------------------------------- binary


def _as4d(a: np.ndarray) -> np.ndarray:
    if a.ndim > 4:
        raise ValueError(f"at most 4 dims, got {a.shape}")
    return a.reshape((1,) * (4 - a.ndim) + a.shape)


def _check_repeat(a: np.ndarray, b: np.ndarray) -> None:
    if b.ndim > a.ndim or any(da % db for da, db in zip(a.shape[::-1], b.shape[::-1])):
        raise ValueError(f"b {b.shape} cannot be repeated over a {a.shape} (ggml_can_repeat)")


@njit(inline="always", cache=True)
def _op(code, x, y):
    if code == 0:
        return x + y
    if code == 1:
        return x - y
    if code == 2:
        return x * y
    return x / y


@njit(inline="always", cache=True)
def _binary_row(a, b, code, out, r):
    d3, d2, d1, d0 = a.shape
    e3, e2, e1, e0 = b.shape
    i3, i2, i1 = r // (d2 * d1), (r // d1) % d2, r % d1
    brow = b[i3 % e3, i2 % e2, i1 % e1]
    arow, orow = a[i3, i2, i1], out[i3, i2, i1]
    if e0 == d0:                   # no repeat along the row: no modulo, vectorizable
        for i in range(d0):
            orow[i] = _op(code, arow[i], brow[i])
    else:
        for i in range(d0):
            orow[i] = _op(code, arow[i], brow[i % e0])


@njit(parallel=True, cache=True)
def _binary(a, b, code, out):
    # a, out: [d3, d2, d1, d0]; b: [e3, e2, e1, e0], each e divides its d
    for r in prange(a.shape[0] * a.shape[1] * a.shape[2]):
        _binary_row(a, b, code, out, r)


@njit(cache=True)
def _binary_serial(a, b, code, out):
    for r in range(a.shape[0] * a.shape[1] * a.shape[2]):
        _binary_row(a, b, code, out, r)


def binary(op: str, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``a op b`` with ``b`` repeated over ``a`` (ggml add/sub/mul/div), float32; into
    ``out`` (C-contiguous float32 of ``a``'s shape) when given."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    _check_repeat(a, b)
    out = _out(out, a.shape)
    kernel("binary", a.size)(_as4d(a), _as4d(b), np.int64(OPS[op]), _as4d(out))
    return out


def add(a, b):
    return binary("add", a, b)


def mul(a, b):
    return binary("mul", a, b)


def binary_ref(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy reference: tile ``b`` to ``a``'s shape, then the float32 op."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32).reshape((1,) * (a.ndim - b.ndim) + b.shape)
    bt = np.tile(b, [da // db for da, db in zip(a.shape, b.shape)])
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](a, bt)


# ---------------------------------------------------------------------------- unary


@njit(inline="always", cache=True)
def silu_f32(x):
    return x / (F(1) + np.exp(-x))


@njit(inline="always", cache=True)
def gelu_f32(x):
    """ggml_gelu_f32 (vec.h)."""
    return F(0.5) * x * (F(1) + np.tanh(SQRT_2_OVER_PI * x * (F(1) + GELU_COEF_A * x * x)))


@njit(inline="always", cache=True)
def _gelu_lut(x, table):
    """ggml_vec_gelu_f32 with GGML_GELU_FP16."""
    if x <= F(-10):
        return F(0)
    if x >= F(10):
        return x
    return f16_to_f32(table[f32_to_f16(x)])


@njit(inline="always", cache=True)
def _unary_one(v, code, s, b, table):
    if code == 0:
        return silu_f32(v)
    if code == 1:
        return gelu_f32(v)
    if code == 2:
        return _gelu_lut(v, table)
    if code == 3:
        return np.tanh(v)
    if code == 4:
        return v * s
    return fma_f32(v, s, b)


@njit(parallel=True, cache=True)
def _unary(x, code, s, b, table, out):
    for i in prange(x.shape[0]):
        out[i] = _unary_one(x[i], code, s, b, table)


@njit(cache=True)
def _unary_serial(x, code, s, b, table, out):
    for i in range(x.shape[0]):
        out[i] = _unary_one(x[i], code, s, b, table)


@njit(inline="always", cache=True)
def _gated_one(v, g, code, table):
    if code == 0:
        return silu_f32(v) * g
    if code == 1:
        return gelu_f32(v) * g
    return _gelu_lut(v, table) * g


@njit(parallel=True, cache=True)
def _gated(a, g, code, table, out):
    for i in prange(a.shape[0]):
        out[i] = _gated_one(a[i], g[i], code, table)


@njit(cache=True)
def _gated_serial(a, g, code, table, out):
    for i in range(a.shape[0]):
        out[i] = _gated_one(a[i], g[i], code, table)


# --------------------------------------------------------- fast (rational) activations
#
# ``--numerics fast``'s SiLU and GELU: tanh as a rational function, pure float32
# arithmetic that LLVM vectorizes (16 lanes with AVX-512), where libm's ``tanhf``/``expf``
# are scalar calls and ggml's F16 GELU table is a gather whose cost depends on which of its
# 2048 cache lines the values index (docs/executor.md). The [13/6] rational approximation
# on [-9, 9] is the one Eigen (``generic_fast_tanh_float``, MathFunctionsImpl.h), XLA and
# onnxruntime's MLAS (``MlasTanhConstants``, tanh.cpp) use; measured against float64 tanh
# over [-9, 9] (tests/test_kernels.py): within 2.6e-7 absolute. GELU is its tanh form,
# SiLU ``x * sigmoid(x) = 0.5 x (1 + tanh(x / 2))``.

TANH_CLAMP = F(9.0)
_TANH_NUM = tuple(F(c) for c in (-2.76076847742355e-16, 2.00018790482477e-13,
                                 -8.60467152213735e-11, 5.12229709037114e-08,
                                 1.48572235717979e-05, 6.37261928875436e-04,
                                 4.89352455891786e-03))
_TANH_DEN = tuple(F(c) for c in (1.19825839466702e-06, 1.18534705686654e-04,
                                 2.26843463243900e-03, 4.89352518554385e-03))
_A13, _A11, _A9, _A7, _A5, _A3, _A1 = _TANH_NUM
_B6, _B4, _B2, _B0 = _TANH_DEN
#: fast-math flags of the rational kernels: contraction into FMAs, reassociation and a
#: reciprocal division, but NaN and infinities kept (a NaN input stays NaN)
_FAST = {"contract", "reassoc", "arcp", "afn", "nsz"}


@njit(inline="always", fastmath=_FAST, error_model="numpy", cache=True)
def tanh_rational(x):
    """tanh(x) within 2.6e-7 (float32; ``x`` clamped to +-:data:`TANH_CLAMP`)."""
    x = TANH_CLAMP if x > TANH_CLAMP else x
    x = -TANH_CLAMP if x < -TANH_CLAMP else x
    x2 = x * x
    p = (((((_A13 * x2 + _A11) * x2 + _A9) * x2 + _A7) * x2 + _A5) * x2 + _A3) * x2 + _A1
    q = ((_B6 * x2 + _B4) * x2 + _B2) * x2 + _B0
    return x * p / q


@njit(inline="always", fastmath=_FAST, error_model="numpy", cache=True)
def gelu_rational(x):
    return F(0.5) * x * (F(1) + tanh_rational(SQRT_2_OVER_PI * x * (F(1) + GELU_COEF_A * x * x)))


@njit(inline="always", fastmath=_FAST, error_model="numpy", cache=True)
def silu_rational(x):
    return F(0.5) * x * (F(1) + tanh_rational(F(0.5) * x))


@njit(parallel=True, fastmath=_FAST, error_model="numpy", cache=True)
def _fast_unary(x, code, out):
    # one loop per activation (no branch inside a loop: each vectorizes)
    if code == 0:
        for i in prange(x.shape[0]):
            out[i] = silu_rational(x[i])
    else:
        for i in prange(x.shape[0]):
            out[i] = gelu_rational(x[i])


@njit(fastmath=_FAST, error_model="numpy", cache=True)
def _fast_unary_serial(x, code, out):
    if code == 0:
        for i in range(x.shape[0]):
            out[i] = silu_rational(x[i])
    else:
        for i in range(x.shape[0]):
            out[i] = gelu_rational(x[i])


@njit(parallel=True, fastmath=_FAST, error_model="numpy", cache=True)
def _fast_gated(a, g, code, out):
    if code == 0:
        for i in prange(a.shape[0]):
            out[i] = silu_rational(a[i]) * g[i]
    else:
        for i in prange(a.shape[0]):
            out[i] = gelu_rational(a[i]) * g[i]


@njit(fastmath=_FAST, error_model="numpy", cache=True)
def _fast_gated_serial(a, g, code, out):
    if code == 0:
        for i in range(a.shape[0]):
            out[i] = silu_rational(a[i]) * g[i]
    else:
        for i in range(a.shape[0]):
            out[i] = gelu_rational(a[i]) * g[i]


#: work (elements) below which :func:`kernel` picks the serial variant: starting a
#: parallel region costs 5-30 us (waking the sleeping OpenMP workers), more than a few
#: thousand elements take on one core
SERIAL_BELOW = {"binary": 65536, "unary": 16384, "gated": 16384,
                "fast_unary": 32768, "fast_gated": 32768}
_KERNELS = {"binary": (_binary, _binary_serial), "unary": (_unary, _unary_serial),
            "gated": (_gated, _gated_serial), "fast_unary": (_fast_unary, _fast_unary_serial),
            "fast_gated": (_fast_gated, _fast_gated_serial)}
#: code of each unary activation / gated activation in the kernels
UNARY_CODES = {"silu": 0, "gelu": 1, "gelu_f16_table": 2, "tanh": 3, "scale": 4,
               "scale_bias": 5}
GATED_CODES = {"swiglu": 0, "geglu": 1, "geglu_f16_table": 2}
#: code of each activation in the fast (rational) kernels, unary and gated alike
FAST_CODES = {"silu": 0, "gelu": 1}


def kernel(name: str, work: int):
    """The numba kernel ``name`` (binary, unary, gated) for ``work`` elements: the
    parallel one, or the serial one below ``SERIAL_BELOW[name]`` (same results)."""
    par, ser = _KERNELS[name]
    return ser if work < SERIAL_BELOW[name] else par


def _out(out, shape):
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.shape != tuple(shape) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {tuple(shape)}, got "
                         f"{out.dtype} {out.shape}")
    return out


@njit(cache=True)
def _build_gelu_table(table):
    # ggml-cpu.c ggml_cpu_init: table[i] = fp16(gelu_f32(fp32(half i)))
    for i in range(65536):
        table[i] = f32_to_f16(gelu_f32(f16_to_f32(np.uint16(i))))


@cache
def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: uint16[65536] F16 bits of GELU at every F16 value."""
    table = np.empty(65536, dtype=np.uint16)
    _build_gelu_table(table)
    return table


_NO_TABLE = np.zeros(1, dtype=np.uint16)


def _apply(name: str, args: tuple, x, g=None, out=None):
    """:func:`kernel` ``name`` over the flat float32 values of ``x`` (and of the gate ``g``,
    same shape, for the gated kernels) with its other arguments ``args``, into ``out``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    flat = (x.reshape(-1),)
    if g is not None:
        g = np.ascontiguousarray(g, dtype=np.float32)
        if x.shape != g.shape:
            raise ValueError(f"gate shapes differ: {x.shape} vs {g.shape}")
        flat += (g.reshape(-1),)
    out = _out(out, x.shape)
    kernel(name, x.size)(*flat, *args, out.reshape(-1))
    return out


def _run_unary(x, code, s=1.0, b=0.0, table=_NO_TABLE, out=None):
    return _apply("unary", (np.int64(code), F(s), F(b), table), x, out=out)


def silu(x, out=None):
    return _run_unary(x, 0, out=out)


def gelu(x, out=None):
    return _run_unary(x, 1, out=out)


def gelu_f16_table(x, out=None):
    return _run_unary(x, 2, table=gelu_table(), out=out)


def tanh(x, out=None):
    return _run_unary(x, 3, out=out)


def scale(x, s: float, b: float = 0.0, out=None):
    """ggml_scale(_bias): ``x*s`` (``fma(x, s, b)`` when there is a bias, as ggml's SIMD)."""
    return _run_unary(x, 4 if b == 0.0 else 5, s, b, out=out)


def _run_gated(a, g, code, table=_NO_TABLE, out=None):
    return _apply("gated", (np.int64(code), table), a, g, out)


def swiglu(a, g, out=None):
    """silu(a) * g (ggml_swiglu_split)."""
    return _run_gated(a, g, 0, out=out)


def geglu(a, g, out=None):
    """gelu(a) * g with the exact tanh GELU."""
    return _run_gated(a, g, 1, out=out)


def geglu_f16_table(a, g, out=None):
    """gelu(a) * g with ggml's F16-table GELU (ggml_vec_geglu_f32)."""
    return _run_gated(a, g, 2, gelu_table(), out=out)


def _run_fast(name: str, x, g=None, out=None):
    """:data:`FAST_CODES` activation ``name`` of ``x`` (times ``g`` when given) with the
    rational tanh (:func:`tanh_rational`)."""
    return _apply("fast_unary" if g is None else "fast_gated",
                  (np.int64(FAST_CODES[name]),), x, g, out)


def silu_fast(x, out=None):
    """silu(x) through the rational tanh (``--numerics fast``)."""
    return _run_fast("silu", x, out=out)


def gelu_fast(x, out=None):
    """gelu(x), tanh form, through the rational tanh (``--numerics fast``)."""
    return _run_fast("gelu", x, out=out)


def swiglu_fast(a, g, out=None):
    """silu(a) * g through the rational tanh (``--numerics fast``)."""
    return _run_fast("silu", a, g, out=out)


def geglu_fast(a, g, out=None):
    """gelu(a) * g through the rational tanh (``--numerics fast``)."""
    return _run_fast("gelu", a, g, out=out)


# ---------------------------------------------------------------------------- references


def silu_ref(x):
    x = np.asarray(x, dtype=np.float64)
    return (x / (1.0 + np.exp(-x))).astype(np.float32)


def gelu_ref(x):
    x = np.asarray(x, dtype=np.float64)
    c = np.sqrt(2.0 / np.pi)
    return (0.5 * x * (1.0 + np.tanh(c * x * (1.0 + 0.044715 * x * x)))).astype(np.float32)


def gelu_f32_ref(x):
    """ggml_gelu_f32's float32 arithmetic in numpy; tanh is float64 rounded to float32
    (what glibc's tanhf returns; numpy's own float32 tanh is a few ulp off, which the
    cancellation in 1 + tanh(..) for x < 0 would magnify)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        inner = SQRT_2_OVER_PI * x * (F(1) + GELU_COEF_A * x * x)
        th = np.tanh(inner.astype(np.float64)).astype(np.float32)
        return (F(0.5) * x * (F(1) + th)).astype(np.float32)


def gelu_table_ref() -> np.ndarray:
    """ggml_table_gelu_f16 from the float32 formula in numpy."""
    f = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    return gelu_f32_ref(f).astype(np.float16).view(np.uint16)


def gelu_f16_table_ref(x, table=None):
    x = np.asarray(x, dtype=np.float32)
    table = gelu_table_ref() if table is None else table
    looked = table[x.astype(np.float16).view(np.uint16)].view(np.float16).astype(np.float32)
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, looked)).astype(np.float32)


def tanh_ref(x):
    return np.tanh(np.asarray(x, dtype=np.float64)).astype(np.float32)


def scale_ref(x, s, b=0.0):
    x = np.asarray(x, dtype=np.float64)
    return (x * np.float32(s) + np.float32(b)).astype(np.float32)


# ---------------------------------------------------------------------------- gpt-oss


@njit(inline="always", cache=True)
def _swiglu_oai_row(a, b, alpha, limit, out, r):
    for i in range(a.shape[1]):
        x = min(a[r, i], limit)
        y = min(max(b[r, i], -limit), limit)
        out[r, i] = x / (F(1) + np.exp(alpha * -x)) * (y + F(1))


@njit(parallel=True, cache=True)
def _swiglu_oai(a, b, alpha, limit, out):
    for r in prange(a.shape[0]):
        _swiglu_oai_row(a, b, alpha, limit, out, r)


@njit(cache=True)
def _swiglu_oai_serial(a, b, alpha, limit, out):
    for r in range(a.shape[0]):
        _swiglu_oai_row(a, b, alpha, limit, out, r)


def swiglu_oai(a: np.ndarray, b: np.ndarray, alpha: float, limit: float,
               out: np.ndarray | None = None) -> np.ndarray:
    """ggml_swiglu_oai(a, b) (ggml-cpu/ops.cpp ``ggml_compute_forward_swiglu_oai_f32``),
    float32 per element: ``x = min(a, limit); y = clamp(b, -limit, limit);
    x / (1 + expf(alpha * -x)) * (y + 1)``. ``a``, ``b``: float32 ``[rows, n]``."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"swiglu_oai needs two [rows, n] arrays, got {a.shape} {b.shape}")
    out = _out(out, a.shape)
    kern = _swiglu_oai_serial if a.size < SERIAL_BELOW["gated"] else _swiglu_oai
    kern(a, b, F(alpha), F(limit), out)
    return out


def swiglu_oai_ref(a, b, alpha: float, limit: float) -> np.ndarray:
    """numpy float32 reference of :func:`swiglu_oai` (numpy's float32 ``exp``)."""
    x = np.minimum(np.asarray(a, F), F(limit))
    y = np.clip(np.asarray(b, F), F(-limit), F(limit))
    with np.errstate(over="ignore"):
        glu = x / (F(1) + np.exp(F(alpha) * -x))
    return (glu * (y + F(1))).astype(F)


@njit(cache=True)
def _add_id(a, b, ids, out):
    for t in range(a.shape[0]):
        for j in range(a.shape[1]):
            e = ids[t, j]
            for i in range(a.shape[2]):
                out[t, j, i] = a[t, j, i] + b[e, i]


def add_id(a: np.ndarray, b: np.ndarray, ids: np.ndarray,
           out: np.ndarray | None = None) -> np.ndarray:
    """ggml_add_id (ggml-cpu/ops.cpp ``ggml_compute_forward_add_id_f32``): ``out[t, j] =
    a[t, j] + b[ids[t, j]]`` for ``a`` float32 ``[T, k, n]``, ``b`` ``[E, n]`` (one bias
    row per expert), ``ids`` int32 ``[T, k]``; exact (one float32 add per element)."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim != 3 or ids.shape != a.shape[:2] or b.ndim != 2 or b.shape[1] != a.shape[2]:
        raise ValueError(f"add_id shapes a {a.shape}, b {b.shape}, ids {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= b.shape[0]):
        raise ValueError(f"add_id: expert ids must be in [0, {b.shape[0]})")
    out = _out(out, a.shape)
    _add_id(a, np.asarray(b, dtype=np.float32), ids, out)
    return out


def add_id_ref(a, b, ids) -> np.ndarray:
    return (np.asarray(a, F) + np.asarray(b, F)[ids]).astype(F)
