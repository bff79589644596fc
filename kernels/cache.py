"""KV-cache writes and copies: set_rows, cpy, cont.

``set_rows(dst, dst_type, src, idx)`` writes row ``i`` of float32 ``src[N, K]`` into
row ``idx[i]`` of the raw cache ``dst[rows, row_bytes]`` (uint8), converting with the
destination type's ``from_float`` (ggml-cpu/ops.cpp ``ggml_compute_forward_set_rows``):

* F16: round to nearest even (F16C), BF16: ``ggml_compute_fp32_to_bf16``, F32: copy;
* Q8_0: ``quantize_row_q8_0`` -- per 32 values ``d = amax/127`` stored as F16 and
  ``q = round(x*127/amax)``; ``x86=True`` (default) is the AVX path that an x86 build
  runs (ties to even), ``x86=False`` the scalar reference (``x/d``, ties away).

``cpy(src, dst_type)`` is ggml_cpy from float32 into a new tensor of ``dst_type`` (the
same conversions); ``cont(x)`` makes a strided view contiguous (ggml_cont).
Bytes moved: ``N*K*4`` read, ``N*row_bytes`` written.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit, prange

from .quants import (BF16, F16, F32, Q8_0, check_weight, quantize_activations,
                     quantize_activations_ref, quantize_row_bf16, quantize_row_f16,
                     quantize_row_q8_0)

#: cache types set_rows/cpy can write
CACHE_TYPES = (QT.F32, QT.F16, QT.BF16, QT.Q8_0)


@njit(inline="always", cache=True)
def _set_row(dst, src, idx, code, x86, i):
    row = dst[idx[i]]
    if code == Q8_0:
        quantize_row_q8_0(src[i], row, x86)
    elif code == F16:
        quantize_row_f16(src[i], row.view(np.uint16))
    elif code == BF16:
        quantize_row_bf16(src[i], row.view(np.uint16))
    elif code == F32:     # (a slice assignment through .view() is lost inside prange)
        v = row.view(np.float32)
        for j in range(src.shape[1]):
            v[j] = src[i, j]


@njit(parallel=True, cache=True)
def _set_rows(dst, src, idx, code, x86):
    for i in prange(src.shape[0]):
        _set_row(dst, src, idx, code, x86, i)


@njit(cache=True)
def _set_rows_serial(dst, src, idx, code, x86):
    for i in range(src.shape[0]):
        _set_row(dst, src, idx, code, x86, i)


#: work (values) below which :func:`kernel` picks the serial variants (a parallel region
#: costs 5-30 us to start)
SERIAL_BELOW = {"set_rows": 65536, "cont": 32768}


def kernel(name: str, work: int):
    """The numba kernel ``name`` for ``work`` values: ``set_rows`` ``(dst[rows, row_bytes]
    uint8, src[N, K] float32, idx[N] int64, code int64, x86)`` (no index check) or
    ``cont`` ``(x 4-D, out 4-D)``; serial below ``SERIAL_BELOW[name]``."""
    par, ser = _KERNELS[name]
    return ser if work < SERIAL_BELOW[name] else par


def _check(dst_type, n_dst_rows, src, idx):
    if QT(dst_type) not in CACHE_TYPES:
        raise NotImplementedError(f"set_rows into {QT(dst_type).name}: supported "
                                  f"{', '.join(t.name for t in CACHE_TYPES)}")
    if idx.shape[0] != src.shape[0]:
        raise ValueError(f"{src.shape[0]} rows but {idx.shape[0]} indices")
    if idx.size and (idx.min() < 0 or idx.max() >= n_dst_rows):
        raise IndexError(f"row index out of range [0, {n_dst_rows})")


def set_rows(dst: np.ndarray, dst_type: QT, src: np.ndarray, idx: np.ndarray,
             x86: bool = True) -> np.ndarray:
    """dst[idx[i]] = convert(src[i]) in place; ``dst`` raw uint8 ``[rows, row_bytes]``."""
    src = np.ascontiguousarray(src, dtype=np.float32)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    w = check_weight(dst, dst_type, src.shape[1], writable=True)
    if not np.shares_memory(w, dst):
        raise ValueError("dst must be a C-contiguous uint8 buffer (it is written in place)")
    _check(dst_type, w.shape[0], src, idx)
    kernel("set_rows", src.size)(w, src, idx, np.int64(QT(dst_type)), x86)
    return dst


def set_rows_ref(dst: np.ndarray, dst_type: QT, src: np.ndarray, idx: np.ndarray,
                 x86: bool = True) -> np.ndarray:
    """numpy reference: a converted copy of ``dst`` (Q8_0 via quantize_activations_ref)."""
    out = check_weight(dst, dst_type, src.shape[1]).copy()
    out[np.asarray(idx)] = quantize_activations_ref(src, QT(dst_type), x86)
    return out


def cpy(src: np.ndarray, dst_type: QT, x86: bool = True) -> np.ndarray:
    """ggml_cpy float32 ``[N, K]`` -> raw ``dst_type`` rows ``[N, row_bytes]``."""
    if QT(dst_type) not in CACHE_TYPES:
        raise NotImplementedError(f"cpy to {QT(dst_type).name}")
    return np.array(quantize_activations(cont(src), QT(dst_type), x86), copy=True)


@njit(inline="always", cache=True)
def _cont_row(x, out, r):
    n3, n2, n1, n0 = x.shape
    i3, i2, i1 = r // (n2 * n1), (r // n1) % n2, r % n1
    for i in range(n0):
        out[i3, i2, i1, i] = x[i3, i2, i1, i]


@njit(parallel=True, cache=True)
def _cont4(x, out):
    for r in prange(x.shape[0] * x.shape[1] * x.shape[2]):
        _cont_row(x, out, r)


@njit(cache=True)
def _cont4_serial(x, out):
    for r in range(x.shape[0] * x.shape[1] * x.shape[2]):
        _cont_row(x, out, r)


_KERNELS = {"set_rows": (_set_rows, _set_rows_serial), "cont": (_cont4, _cont4_serial)}


def cont(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A C-contiguous float32 copy of a (possibly permuted/strided) view, up to 4-D
    (into ``out``, C-contiguous float32 of x's shape, when given)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim > 4:
        raise ValueError(f"at most 4 dims, got {x.shape}")
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim < 4 else x
    if out is None:
        out = np.empty(x.shape, dtype=np.float32)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    kernel("cont", x.size)(x4, out.reshape(x4.shape))
    return out
