"""soft_max_ext: softmax(x*scale + slope*mask) over the last axis, as ggml-cpu/ops.cpp.

``x`` is numpy ``[n3, heads, rows, cols]`` (fewer leading dims allowed), float32.
``mask`` is ``[m3, m2, m1 >= rows, cols]`` float32 or float16, broadcast over heads
(``m2`` divides ``heads``) and batches; row ``i`` of ``x`` uses mask row ``i``.
``max_bias > 0`` turns on ALiBi: head ``h`` gets ``slope = m0^(h+1)`` for
``h < n_head_log2`` else ``m1^(2(h - n_head_log2) + 1)``, with
``n_head_log2 = 2^floor(log2(heads))``, ``m0 = 2^(-max_bias/n_head_log2)``,
``m1 = 2^(-max_bias/2/n_head_log2)``. Optional ``sinks[heads]`` join the
normalization as an extra logit per head (gpt-oss).

Per row (float32 except where noted)::

    w   = x*scale + slope*mask
    mx  = max(w)  (and the sink)
    e   = expf(w - mx);  sum = sum(e) in float64 (+ expf(sink - mx))
    y   = e * (float)(1/sum)

ggml's SIMD loop uses its own expf (``ggml_v_expf``, <= 2 ulp): compare to llama.cpp
with a few-ulp tolerance. The reference computes the same steps with numpy.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .bits import f16_to_f32, read_only_view

F = np.float32


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head ALiBi slope (1.0 for every head when max_bias == 0), float32."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=np.float32)
    n_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = F(F(2.0) ** (F(-max_bias) / F(n_log2)))
    m1 = F(F(2.0) ** (F(-(max_bias / 2.0)) / F(n_log2)))
    return np.array([m0 ** F(h + 1) if h < n_log2 else m1 ** F(2 * (h - n_log2) + 1)
                     for h in range(n_head)], dtype=np.float32)


@njit(inline="always", cache=True)
def _soft_max_row(x, mask_f32, mask_f16, mask_kind, scale, slopes, sinks, has_sinks, out, r):
    # mask_kind: 0 none, 1 float32 (mask_f32), 2 float16 bits (mask_f16)
    n3, n2, n1, n0 = x.shape
    m3, m2 = (mask_f16.shape[0], mask_f16.shape[1]) if mask_kind == 2 else \
        (mask_f32.shape[0], mask_f32.shape[1])
    i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
    slope = slopes[i2]
    src, dst = x[i3, i2, i1], out[i3, i2, i1]
    mx = -np.inf
    for i in range(n0):
        w = src[i] * scale
        if mask_kind == 1:
            w += slope * mask_f32[i3 % m3, i2 % m2, i1, i]
        elif mask_kind == 2:
            w += slope * f16_to_f32(mask_f16[i3 % m3, i2 % m2, i1, i])
        dst[i] = w
        mx = max(mx, w)
    mx = F(mx)
    if has_sinks:
        mx = max(mx, sinks[i2])
    s = 0.0
    for i in range(n0):
        e = np.exp(dst[i] - mx)
        dst[i] = e
        s += np.float64(e)
    if has_sinks:
        s += np.float64(np.exp(sinks[i2] - mx))
    inv = F(1.0 / s)
    for i in range(n0):
        dst[i] *= inv


@njit(parallel=True, cache=True)
def _soft_max(x, mask_f32, mask_f16, mask_kind, scale, slopes, sinks, has_sinks, out):
    for r in prange(x.shape[0] * x.shape[1] * x.shape[2]):
        _soft_max_row(x, mask_f32, mask_f16, mask_kind, scale, slopes, sinks, has_sinks,
                      out, r)


@njit(cache=True)
def _soft_max_serial(x, mask_f32, mask_f16, mask_kind, scale, slopes, sinks, has_sinks,
                     out):
    for r in range(x.shape[0] * x.shape[1] * x.shape[2]):
        _soft_max_row(x, mask_f32, mask_f16, mask_kind, scale, slopes, sinks, has_sinks,
                      out, r)


#: work (elements of x) below which :func:`kernel` picks the serial variant (a parallel
#: region costs 5-30 us to start)
SERIAL_BELOW = 16384


def kernel(work: int):
    """The soft_max kernel for ``work`` elements (serial below ``SERIAL_BELOW``)."""
    return _soft_max_serial if work < SERIAL_BELOW else _soft_max


def _prepare(x, mask, scale, max_bias, sinks):
    x = np.ascontiguousarray(x, dtype=np.float32)
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    n3, n2, n1, n0 = x4.shape
    m32, m16, kind = np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1, 1), np.uint16), 0
    if mask is not None:
        mask = np.asarray(mask)
        m4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        if m4.shape[3] != n0 or m4.shape[2] < n1 or n2 % m4.shape[1] or n3 % m4.shape[0]:
            raise ValueError(f"mask {mask.shape} does not fit x {x.shape}")
        if mask.dtype == np.float16:
            m16, kind = np.ascontiguousarray(m4).view(np.uint16), 2
        else:
            m32, kind = np.ascontiguousarray(m4, dtype=np.float32), 1
    has_sinks = sinks is not None
    sk = read_only_view(np.ascontiguousarray(sinks if has_sinks else np.zeros(n2),
                                             dtype=np.float32))
    return x, x4, m32, m16, kind, alibi_slopes(n2, max_bias), sk, has_sinks


def soft_max(x: np.ndarray, mask: np.ndarray | None = None, scale: float = 1.0,
             max_bias: float = 0.0, sinks: np.ndarray | None = None,
             out: np.ndarray | None = None) -> np.ndarray:
    """ggml_soft_max_ext(x, mask, scale, max_bias) (+ ggml_soft_max_add_sinks), into
    ``out`` (C-contiguous float32 of x's shape) when given."""
    x, x4, m32, m16, kind, slopes, sk, has_sinks = _prepare(x, mask, scale, max_bias, sinks)
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    kernel(x.size)(x4, m32, m16, np.int64(kind), F(scale), slopes, sk, has_sinks,
              out.reshape(x4.shape))
    return out


def soft_max_ref(x: np.ndarray, mask: np.ndarray | None = None, scale: float = 1.0,
                 max_bias: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)
    n3, n2, n1, n0 = x4.shape
    w = x4 * F(scale)
    if mask is not None:
        m = np.asarray(mask).astype(np.float32)
        m4 = m.reshape((1,) * (4 - m.ndim) + m.shape)[:, :, :n1, :]
        m4 = np.tile(m4, (n3 // m4.shape[0], n2 // m4.shape[1], 1, 1))
        w = w + alibi_slopes(n2, max_bias)[None, :, None, None] * m4
    mx = w.max(-1, keepdims=True)
    if sinks is not None:
        sk = np.asarray(sinks, dtype=np.float32)[None, :, None, None]
        mx = np.maximum(mx, sk)
    e = np.exp(w - mx)
    s = e.astype(np.float64).sum(-1, keepdims=True)
    if sinks is not None:
        s = s + np.exp(sk - mx).astype(np.float64)
    return (e * (1.0 / s).astype(np.float32)).reshape(x.shape)
