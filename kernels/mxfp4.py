"""MXFP4 weights (gpt-oss experts): decode and matrix x vector, float and ggml numerics.

A block (ggml-common.h ``block_mxfp4``, 17 bytes for 32 values) is one E8M0 scale byte
``e`` then 16 bytes of 4-bit E2M1 codes: value ``j`` (j < 16) is the low nibble of
``qs[j]``, value ``j + 16`` its high nibble. ggml stores the E2M1 values doubled as
int8 (``kvalues_mxfp4``) and halves the scale instead (``GGML_E8M0_TO_FP32_HALF``)::

    x[j] = kvalues[code] * e8m0_half(e)

Both tables come from gguf-py (``gguf.quants.MXFP4``), never re-typed here.

* :func:`mul_mat` (numerics ``fast``): float32 activations times the weights decoded on
  the fly, per block ``acc += e8m0_half(e) * sum_j(kvalues[code_j] * x_j)``. Validated
  against ``x @ dequantize(W).T`` (gguf-py's dequantizer, float64) to a relative 1e-5
  of ``|x| @ |W|.T``.
* :func:`mul_mat_ggml` (numerics ``ggml``): what ggml-cpu computes. MXFP4's
  ``vec_dot_type`` is Q8_0 (ggml-cpu.c ``type_traits_cpu[GGML_TYPE_MXFP4]``), so the
  activations arrive as Q8_0 rows (``quants.quantize_activations``) and each output is
  ``ggml_vec_dot_mxfp4_q8_0`` (ggml-cpu/quants.c, generic): per block the integer sum
  ``sumi = sum_j q8[j] * kvalues[code_j]``, then ``sumf += (fp16(d_q8) * e8m0_half(e)) *
  sumi`` in float32, blocks in order. Validated bit for bit against the numpy
  :func:`mul_mat_ggml_ref`. ggml's AVX2 variant sums the same integer products with
  the per-block scale in 8 float lanes (FMA): float32 rounding apart, the same values.

``w`` is ``[M, row_bytes]`` uint8 (M rows of K values), ``x`` ``[N, K]`` float32,
``y`` ``[N, M]`` float32, as in :mod:`.matmul`.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import MXFP4 as _GGUF_MXFP4
from gguf.quants import dequantize as _gguf_dequantize
from numba import njit, prange

from graphcost.format import ggml_types as gt

#: MXFP4's vec_dot_type in ggml-cpu (type_traits_cpu; graphcost.format.ggml_types): Q8_0
VEC_DOT_TYPE = gt.vec_dot_type(QT.MXFP4)
QK, BLOCK_BYTES = gt.block(QT.MXFP4)                 # 32 values in 17 bytes
Q8_QK, Q8_BYTES = gt.block(VEC_DOT_TYPE)             # 32 values in 34 bytes (f16 d + 32 int8)
#: ggml's kvalues_mxfp4: the E2M1 values doubled, as int8
KVALUES = np.array(_GGUF_MXFP4.kvalues, dtype=np.int8)
#: GGML_E8M0_TO_FP32_HALF of every scale byte
E8M0_HALF = np.ascontiguousarray(
    _GGUF_MXFP4.e8m0_to_fp32_half(np.arange(256, dtype=np.uint32)), dtype=np.float32)
F = np.float32


def row_bytes(k: int) -> int:
    if k % QK:
        raise ValueError(f"MXFP4 rows hold multiples of {QK} values, not {k}")
    return k // QK * BLOCK_BYTES


def _check(w_raw: np.ndarray, k: int) -> np.ndarray:
    rb = row_bytes(k)
    w = np.asarray(w_raw)
    if w.dtype != np.uint8:
        w = w.view(np.uint8)
    w = w.reshape(-1, rb)
    return w if w.flags.c_contiguous else np.ascontiguousarray(w)


# ---------------------------------------------------------------------------- references


def dequantize_ref(w_raw: np.ndarray, k: int) -> np.ndarray:
    """gguf-py's MXFP4 dequantizer: ``[M, K]`` float32."""
    return _gguf_dequantize(_check(w_raw, k), QT.MXFP4).reshape(-1, k).astype(np.float32)


def mul_mat_ref(w_raw: np.ndarray, k: int, m: int, x: np.ndarray) -> np.ndarray:
    """``x @ dequantize(W).T`` in float64, as float32."""
    w = dequantize_ref(w_raw, k)[:m]
    return (np.asarray(x, np.float64) @ w.T.astype(np.float64)).astype(np.float32)


def _q8_parts(yq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 rows ``[N, nb * 34]`` -> scales ``[N, nb]`` float32 and ``[N, nb, 32]`` int8."""
    nb = k // Q8_QK
    blocks = np.ascontiguousarray(yq, dtype=np.uint8).reshape(-1, nb, Q8_BYTES)
    d = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16)[..., 0].astype(np.float32)
    qs = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8)
    return np.ascontiguousarray(d), qs


def mul_mat_ggml_ref(w_raw: np.ndarray, k: int, m: int, yq: np.ndarray) -> np.ndarray:
    """numpy ggml_vec_dot_mxfp4_q8_0 (generic) of every W row with every Q8_0 row of
    ``yq``: ``[N, M]`` float32."""
    w = _check(w_raw, k)[:m].reshape(m, -1, BLOCK_BYTES)
    dy, qy = _q8_parts(yq, k)
    scale_w = E8M0_HALF[w[:, :, 0]]                                   # [M, nb]
    codes = w[:, :, 1:]
    vals = np.concatenate([KVALUES[codes & 15], KVALUES[codes >> 4]], axis=-1).astype(np.int64)
    sumi = np.einsum("mbj,nbj->nmb", vals, qy.astype(np.int64))       # exact integers
    acc = np.zeros((qy.shape[0], m), dtype=np.float32)
    for b in range(w.shape[1]):                                       # blocks in order
        d = (dy[:, b:b + 1] * scale_w[None, :, b]).astype(np.float32)
        acc = (acc + (d * sumi[:, :, b].astype(np.float32)).astype(np.float32)).astype(np.float32)
    return acc


# ---------------------------------------------------------------------------- kernels


@njit(cache=True)
def dequantize_rows(w, kv, eh, out):
    """Decode ``w`` [M, row_bytes] into ``out`` [M, K] float32 (as ggml's
    dequantize_row_mxfp4)."""
    for r in range(w.shape[0]):
        row = w[r]
        for b in range(out.shape[1] // 32):
            d = eh[row[b * 17]]
            for j in range(16):
                q = row[b * 17 + 1 + j]
                out[r, b * 32 + j] = F(kv[q & 15]) * d
                out[r, b * 32 + j + 16] = F(kv[q >> 4]) * d


@njit(inline="always", cache=True)
def _dot_float(row, xn, kv, eh):
    acc = F(0)
    for b in range(xn.shape[0] // 32):
        s = F(0)
        for j in range(16):
            q = row[b * 17 + 1 + j]
            s += F(kv[q & 15]) * xn[b * 32 + j] + F(kv[q >> 4]) * xn[b * 32 + j + 16]
        acc += eh[row[b * 17]] * s
    return acc


@njit(inline="always", cache=True)
def _dot_ggml(row, dy, qy, kv, eh):
    sumf = F(0)
    for b in range(dy.shape[0]):
        sumi = 0
        for j in range(16):
            q = row[b * 17 + 1 + j]
            sumi += np.int32(qy[b, j]) * np.int32(kv[q & 15]) \
                + np.int32(qy[b, j + 16]) * np.int32(kv[q >> 4])
        sumf += (dy[b] * eh[row[b * 17]]) * F(sumi)
    return sumf


@njit(parallel=True, cache=True)
def _mm_float(w, x, kv, eh, y):
    for r in prange(w.shape[0]):
        for n in range(x.shape[0]):
            y[n, r] = _dot_float(w[r], x[n], kv, eh)


@njit(cache=True)
def _mm_float_serial(w, x, kv, eh, y):
    for r in range(w.shape[0]):
        for n in range(x.shape[0]):
            y[n, r] = _dot_float(w[r], x[n], kv, eh)


@njit(parallel=True, cache=True)
def _mm_ggml(w, dy, qy, kv, eh, y):
    for r in prange(w.shape[0]):
        for n in range(dy.shape[0]):
            y[n, r] = _dot_ggml(w[r], dy[n], qy[n], kv, eh)


@njit(cache=True)
def _mm_ggml_serial(w, dy, qy, kv, eh, y):
    for r in range(w.shape[0]):
        for n in range(dy.shape[0]):
            y[n, r] = _dot_ggml(w[r], dy[n], qy[n], kv, eh)


#: multiply-adds (M * N * K) below which the serial variants run (a parallel region costs
#: 5-30 us to start)
SERIAL_BELOW = 1 << 18


def _out(out, n, m):
    if out is None:
        return np.empty((n, m), dtype=np.float32)
    if out.shape != (n, m) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{n}, {m}], got {out.dtype} {out.shape}")
    return out


def mul_mat(w_raw: np.ndarray, k: int, m: int, x: np.ndarray,
            out: np.ndarray | None = None) -> np.ndarray:
    """y[N, M] = x[N, K] @ W.T on float32 activations (numerics ``fast``)."""
    w = _check(w_raw, k)[:m]
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    if x.shape[1] != k or w.shape[0] != m:
        raise ValueError(f"x {x.shape} / W {w.shape} do not fit K {k}, M {m}")
    y = _out(out, x.shape[0], m)
    kern = _mm_float_serial if m * x.shape[0] * k < SERIAL_BELOW else _mm_float
    kern(w, x, KVALUES, E8M0_HALF, y)
    return y


def mul_mat_ggml(w_raw: np.ndarray, k: int, m: int, yq: np.ndarray,
                 out: np.ndarray | None = None) -> np.ndarray:
    """y[N, M]: ggml_vec_dot_mxfp4_q8_0 of every W row with every Q8_0 activation row
    ``yq`` [N, K / 32 * 34] uint8 (numerics ``ggml``)."""
    w = _check(w_raw, k)[:m]
    dy, qy = _q8_parts(yq, k)
    y = _out(out, dy.shape[0], m)
    kern = _mm_ggml_serial if m * dy.shape[0] * k < SERIAL_BELOW else _mm_ggml
    kern(w, dy, qy, KVALUES, E8M0_HALF, y)
    return y
