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


@njit(parallel=True, cache=True)
def _rms_norm(x, eps, out):
    n = x.shape[1]
    for r in prange(x.shape[0]):
        row = x[r]
        s = 0.0
        for i in range(n):
            s += np.float64(row[i] * row[i])
        scale = F(1) / np.sqrt(F(s / n) + eps)
        for i in range(n):
            out[r, i] = row[i] * scale


@njit(parallel=True, cache=True)
def _norm(x, eps, out):
    n = x.shape[1]
    for r in prange(x.shape[0]):
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


def _rows(x):
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x, x.reshape(-1, x.shape[-1]), np.empty_like(x)


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis."""
    x, x2, out = _rows(x)
    _rms_norm(x2, F(eps), out.reshape(x2.shape))
    return out


def norm(x: np.ndarray, eps: float) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) over the last axis."""
    x, x2, out = _rows(x)
    _norm(x2, F(eps), out.reshape(x2.shape))
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
