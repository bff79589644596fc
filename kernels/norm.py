"""rms_norm and norm (layer norm without affine) over the last axis, as ggml-cpu/ops.cpp.

``rms_norm`` (ggml_compute_forward_rms_norm_f32)::

    sum   = sum(x*x)            float32 squares, summed in float64 (ggml_float)
    mean  = (float)(sum / n)
    scale = 1.0f / sqrtf(mean + eps)
    y     = x * scale

``norm`` (ggml_compute_forward_norm_f32)::

    mean  = (float)sum(x) / n   float64 sum (ggml_vec_sum_f32), float32 divide
    y     = x - mean
    var   = (float)(sum(y*y) / n)   float64 sum (ggml_vec_cvar_f32)
    y    *= 1.0f / sqrtf(var + eps)

The weight multiply (``* w``) is a separate ggml_mul in llama.cpp's graph (the CPU
backend's fused RMS_NORM+MUL computes the same ``(x*scale)*w``). The references do the
same steps in numpy; the float64 sums may differ in the last bit of a double, so
kernel and reference agree to ~1 float32 ulp.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

F = np.float32


@njit(inline="always", cache=True)
def _rms_norm_row(x, eps, out, r):
    n = x.shape[1]
    row = x[r]
    s = 0.0
    for i in range(n):
        s += np.float64(row[i] * row[i])
    scale = F(1) / np.sqrt(F(s / n) + eps)
    for i in range(n):
        out[r, i] = row[i] * scale


@njit(inline="always", cache=True)
def _norm_row(x, eps, out, r):
    n = x.shape[1]
    row = x[r]
    s = 0.0
    for i in range(n):
        s += np.float64(row[i])
    mean = F(s) / F(n)
    v = 0.0
    for i in range(n):
        d = row[i] - mean
        out[r, i] = d
        v += np.float64(d * d)
    scale = F(1) / np.sqrt(F(v / n) + eps)
    for i in range(n):
        out[r, i] *= scale


@njit(parallel=True, cache=True)
def _rms_norm(x, eps, out):
    for r in prange(x.shape[0]):
        _rms_norm_row(x, eps, out, r)


@njit(cache=True)
def _rms_norm_serial(x, eps, out):
    for r in range(x.shape[0]):
        _rms_norm_row(x, eps, out, r)


@njit(parallel=True, cache=True)
def _norm(x, eps, out):
    for r in prange(x.shape[0]):
        _norm_row(x, eps, out, r)


@njit(cache=True)
def _norm_serial(x, eps, out):
    for r in range(x.shape[0]):
        _norm_row(x, eps, out, r)


#: work (elements) below which :func:`kernel` picks the serial variant (a parallel
#: region costs 5-30 us to start: more than a few thousand elements take on one core)
SERIAL_BELOW = {"rms_norm": 32768, "norm": 32768}
_KERNELS = {"rms_norm": (_rms_norm, _rms_norm_serial), "norm": (_norm, _norm_serial)}


def kernel(name: str, work: int):
    """The numba kernel ``name`` (rms_norm, norm: ``(x[rows, n], eps, out[rows, n])``)
    for ``work`` elements: parallel, or serial below ``SERIAL_BELOW[name]``."""
    par, ser = _KERNELS[name]
    return ser if work < SERIAL_BELOW[name] else par


def _rows(x, out):
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    return x, x.reshape(-1, x.shape[-1]), out


def rms_norm(x: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis (into ``out`` when given)."""
    x, x2, out = _rows(x, out)
    kernel("rms_norm", x.size)(x2, F(eps), out.reshape(x2.shape))
    return out


def norm(x: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over the last axis (into ``out`` when given)."""
    x, x2, out = _rows(x, out)
    kernel("norm", x.size)(x2, F(eps), out.reshape(x2.shape))
    return out


def rms_norm_ref(x: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    s = (x * x).astype(np.float64).sum(-1, keepdims=True)
    scale = np.float32(1) / np.sqrt((s / x.shape[-1]).astype(np.float32) + np.float32(eps))
    return x * scale


def norm_ref(x: np.ndarray, eps: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    mean = x.astype(np.float64).sum(-1, keepdims=True).astype(np.float32) / np.float32(n)
    d = x - mean
    var = ((d * d).astype(np.float64).sum(-1, keepdims=True) / n).astype(np.float32)
    return d * (np.float32(1) / np.sqrt(var + np.float32(eps)))
