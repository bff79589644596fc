"""ggml's quantized dot products: weight row x activations quantized to the vec_dot_type.

llama.cpp does not multiply a quantized weight by float activations. It first
quantizes each activation row to the weight's ``vec_dot_type`` (:mod:`.quants`:
Q8_0, Q8_1, Q8_K, F16, BF16 or F32) and then calls ``ggml_vec_dot_<w>_<y>``, which
multiplies integer quants block by block and applies the float scales per block.
``dot_row_ggml(code, row, yq)`` reproduces the scalar ("generic") versions in
ggml-cpu/quants.c operation for operation (float32, no FMA) and the float types as
llama.cpp's AVX-512 build runs them:

* Q4_0/Q5_0/Q8_0 x Q8_0, Q4_1/Q5_1 x Q8_1: integer block sums, ``sumf`` accumulated
  block by block with the exact expression ggml uses (``sumi*dx*dy``,
  ``(dx*dy)*sumi + m*s``, ...);
* K-quants x Q8_K: integer sums per sub-block times the 6/8-bit scales, kept in 8
  int32 lanes (``aux32``) and 8 float lanes (``sums``) exactly like the generic code,
  mins through Q8_K's ``bsums``;
* F16/BF16/F32: ggml_vec_dot_f16/bf16/f32's AVX-512F code (16-lane FMA accumulators,
  GGML_F32x16_REDUCE, scalar leftovers) operation for operation, and bf16's AVX512-BF16
  pair dot on CPUs that have it, see "float types".

The integer parts are exact everywhere; the float32 parts of the block types follow
the generic order.
ggml's AVX2/AVX-512 versions compute the same integer sums but add the float terms
in a different order, so llama.cpp on x86 differs from this by float32 rounding only
(~1e-7 relative).

:func:`dot_rows_ggml_ref` is the numpy reimplementation the kernel is validated
against (bit for bit).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq
from numba import njit, prange

from . import simd
from .bits import bf16_to_f32, f16_at, f16_to_f32, out_of_line, u32_at
from .quants import (BF16, F16, F32, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
                     _q3_k_scale, scale_min_k4)
from .vec_dot import PREFETCH_AHEAD, f32_chains4, fma_chains4, halves16

F = np.float32


@njit(inline="always", cache=True)
def _i8(buf, p):
    """Signed byte at offset p of a uint8 buffer, as int."""
    v = np.int64(buf[p])
    return v - 256 if v > 127 else v


@njit(inline="always", cache=True)
def _i16(buf, p):
    v = np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8)
    return v - 65536 if v > 32767 else v


@njit(inline="always", cache=True)
def _f32_at(buf, p):
    return buf[p:p + 4].view(np.float32)[0]


# ---------------------------------------------------------------------------- 32-blocks


# Each 32-block dot is a loop over blocks b0 <= b < b1 (inline, so that the vectorised
# kernels of .vec_dot_simd can finish a row's last blocks with the same code).


@njit(inline="always", cache=True)
def blocks_q4_0(row, y, b0, b1, sumf):          # block_q4_0 x block_q8_0 (34 B)
    for ib in range(b0, b1):
        p, py = 18 * ib, 34 * ib
        sumi = 0
        for j in range(16):
            q = np.int64(row[p + 2 + j])
            sumi += ((q & 15) - 8) * _i8(y, py + 2 + j) + ((q >> 4) - 8) * _i8(y, py + 18 + j)
        sumf += F(sumi) * f16_at(row, p) * f16_at(y, py)
    return sumf


@njit(inline="always", cache=True)
def blocks_q4_1(row, y, b0, b1, sumf):          # block_q4_1 x block_q8_1 (36 B: d, s, qs)
    for ib in range(b0, b1):
        p, py = 20 * ib, 36 * ib
        sumi = 0
        for j in range(16):
            q = np.int64(row[p + 4 + j])
            sumi += (q & 15) * _i8(y, py + 4 + j) + (q >> 4) * _i8(y, py + 20 + j)
        sumf += ((f16_at(row, p) * f16_at(y, py)) * F(sumi)
                 + f16_at(row, p + 2) * f16_at(y, py + 2))
    return sumf


@njit(inline="always", cache=True)
def blocks_q5_0(row, y, b0, b1, sumf):
    for ib in range(b0, b1):
        p, py = 22 * ib, 34 * ib
        qh = np.int64(u32_at(row, p + 2))
        sumi = 0
        for j in range(16):
            q = np.int64(row[p + 6 + j])
            x0 = ((q & 15) | (((qh >> j) & 1) << 4)) - 16
            x1 = ((q >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16
            sumi += x0 * _i8(y, py + 2 + j) + x1 * _i8(y, py + 18 + j)
        sumf += (f16_at(row, p) * f16_at(y, py)) * F(sumi)
    return sumf


@njit(inline="always", cache=True)
def blocks_q5_1(row, y, b0, b1, sumf):
    for ib in range(b0, b1):
        p, py = 24 * ib, 36 * ib
        qh = np.int64(u32_at(row, p + 4))
        sumi = 0
        for j in range(16):
            q = np.int64(row[p + 8 + j])
            x0 = (q & 15) | (((qh >> j) & 1) << 4)
            x1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4)
            sumi += x0 * _i8(y, py + 4 + j) + x1 * _i8(y, py + 20 + j)
        sumf += ((f16_at(row, p) * f16_at(y, py)) * F(sumi)
                 + f16_at(row, p + 2) * f16_at(y, py + 2))
    return sumf


@njit(inline="always", cache=True)
def blocks_q8_0(row, y, b0, b1, sumf):
    for ib in range(b0, b1):
        p = 34 * ib
        sumi = 0
        for j in range(32):
            sumi += _i8(row, p + 2 + j) * _i8(y, p + 2 + j)
        sumf += F(sumi) * (f16_at(row, p) * f16_at(y, p))
    return sumf


@njit(cache=True)
def _ggml_q4_0(row, y):
    out_of_line()
    return blocks_q4_0(row, y, 0, row.shape[0] // 18, F(0))


@njit(cache=True)
def _ggml_q4_1(row, y):
    out_of_line()
    return blocks_q4_1(row, y, 0, row.shape[0] // 20, F(0))


@njit(cache=True)
def _ggml_q5_0(row, y):
    out_of_line()
    return blocks_q5_0(row, y, 0, row.shape[0] // 22, F(0))


@njit(cache=True)
def _ggml_q5_1(row, y):
    out_of_line()
    return blocks_q5_1(row, y, 0, row.shape[0] // 24, F(0))


@njit(cache=True)
def _ggml_q8_0(row, y):
    out_of_line()
    return blocks_q8_0(row, y, 0, row.shape[0] // 34, F(0))


# ---------------------------------------------------------------------------- K-quants
# Q8_K block (292 B): d:f32 @0, qs:i8[256] @4, bsums:i16[16] @260


@njit(cache=True)
def _ggml_q2_k(row, y):
    out_of_line()
    sumf = F(0)
    for i in range(row.shape[0] // 84):
        p, py = 84 * i, 292 * i
        summs = 0
        for j in range(16):
            summs += _i16(y, py + 260 + 2 * j) * (np.int64(row[p + j]) >> 4)
        yd = _f32_at(y, py)
        dall = yd * f16_at(row, p + 80)
        dmin = yd * f16_at(row, p + 82)
        isum = 0
        for k in range(2):
            for j in range(4):
                for h in range(2):
                    d = np.int64(row[p + 8 * k + 2 * j + h]) & 15
                    isuml = 0
                    for l in range(16 * h, 16 * h + 16):
                        q2 = (np.int64(row[p + 16 + 32 * k + l]) >> (2 * j)) & 3
                        isuml += _i8(y, py + 4 + 128 * k + 32 * j + l) * q2
                    isum += d * isuml
        sumf += dall * F(isum) - dmin * F(summs)
    return sumf


@njit(inline="always", cache=True)
def _add_lanes(sumf, sums):
    """ggml's final ``for (l = 0; l < 8; ++l) sumf += sums[l]``."""
    for l in range(8):
        sumf += sums[l]
    return sumf


@njit(cache=True)
def _ggml_q3_k(row, y):
    out_of_line()
    sums = np.zeros(8, dtype=np.float32)
    aux32 = np.zeros(8, dtype=np.int64)
    for i in range(row.shape[0] // 110):
        p, py = 110 * i, 292 * i
        aux32[:] = 0
        for k in range(256):                      # value k: plane j of half n, lane l
            n, j, l = k // 128, (k // 32) % 4, k % 32
            lq = (np.int64(row[p + 32 + 32 * n + l]) >> (2 * j)) & 3
            hm = (np.int64(row[p + l]) >> (4 * n + j)) & 1
            a = lq - (0 if hm else 4)
            aux32[k % 8] += _q3_k_scale(row, p, k // 16) * (_i8(y, py + 4 + k) * a)
        d = f16_at(row, p + 108) * _f32_at(y, py)
        for l in range(8):
            sums[l] += d * F(aux32[l])
    return _add_lanes(F(0), sums)


@njit(inline="always", cache=True)
def _k4_mins_ggml(row, p, y, py):
    sumi = 0
    for j in range(16):
        _, m = scale_min_k4(row, p + 4, j // 2)
        sumi += _i16(y, py + 260 + 2 * j) * m
    return sumi


@njit(cache=True)
def _ggml_q4_k(row, y):
    out_of_line()
    sums = np.zeros(8, dtype=np.float32)
    aux32 = np.zeros(8, dtype=np.int64)
    sumf = F(0)
    for i in range(row.shape[0] // 144):
        p, py = 144 * i, 292 * i
        aux32[:] = 0
        for k in range(256):                      # sub-block k//32: low/high nibbles
            j, l = k // 64, k % 32
            q = np.int64(row[p + 16 + 32 * j + l])
            a = (q & 15) if (k // 32) % 2 == 0 else (q >> 4)
            sc, _ = scale_min_k4(row, p + 4, k // 32)
            aux32[k % 8] += sc * (_i8(y, py + 4 + k) * a)
        sumi = _k4_mins_ggml(row, p, y, py)
        d = f16_at(row, p) * _f32_at(y, py)
        for l in range(8):
            sums[l] += d * F(aux32[l])
        dmin = f16_at(row, p + 2) * _f32_at(y, py)
        sumf -= dmin * F(sumi)
    return _add_lanes(sumf, sums)


@njit(cache=True)
def _ggml_q5_k(row, y):
    out_of_line()
    sums = np.zeros(8, dtype=np.float32)
    aux32 = np.zeros(8, dtype=np.int64)
    sumf = F(0)
    for i in range(row.shape[0] // 176):
        p, py = 176 * i, 292 * i
        aux32[:] = 0
        for k in range(256):
            j, l, hi = k // 64, k % 32, (k // 32) % 2
            q = np.int64(row[p + 48 + 32 * j + l])
            hbit = (np.int64(row[p + 16 + l]) >> (k // 32)) & 1
            a = ((q >> 4) if hi else (q & 15)) + 16 * hbit
            sc, _ = scale_min_k4(row, p + 4, k // 32)
            aux32[k % 8] += sc * (_i8(y, py + 4 + k) * a)
        sumi = _k4_mins_ggml(row, p, y, py)
        d = f16_at(row, p) * _f32_at(y, py)
        for l in range(8):
            sums[l] += d * F(aux32[l])
        dmin = f16_at(row, p + 2) * _f32_at(y, py)
        sumf -= dmin * F(sumi)
    return _add_lanes(sumf, sums)


@njit(cache=True)
def _ggml_q6_k(row, y):
    out_of_line()
    sums = np.zeros(8, dtype=np.float32)
    aux32 = np.zeros(8, dtype=np.int64)
    for i in range(row.shape[0] // 210):
        p, py = 210 * i, 292 * i
        aux32[:] = 0
        for k in range(256):                      # half n, quarter t (32 values), lane l
            n, t, l = k // 128, (k // 32) % 4, k % 32
            ql = np.int64(row[p + 64 * n + l + 32 * (t % 2)])
            qh = np.int64(row[p + 128 + 32 * n + l])
            a = (((ql >> (4 * (t // 2))) & 15) | (((qh >> (2 * t)) & 3) << 4)) - 32
            aux32[k % 8] += _i8(row, p + 192 + k // 16) * (_i8(y, py + 4 + k) * a)
        d = f16_at(row, p + 208) * _f32_at(y, py)
        for l in range(8):
            sums[l] += d * F(aux32[l])
    return _add_lanes(F(0), sums)


# ---------------------------------------------------------------------------- float types


# ggml_vec_dot_f32/_f16/_bf16 (vec.cpp) as llama.cpp builds them for an AVX-512F CPU
# without AVX512-FP16/BF16 (simd-mappings.h: GGML_F32_STEP = GGML_F16_STEP = 64,
# EPR 16, so 4 accumulators of 16 float32 lanes; bf16: 2 accumulators, step 32), compiled
# by GCC 12 (objdump of the libggml-cpu.so llama-cpp-python builds here):
#
# * main loop: ``sum[j] = fma(x, y, sum[j])`` per 16 lanes (GCC contracts bf16's
#   ``_mm512_add_ps(_mm512_mul_ps(..), c)`` into an FMA too);
# * GGML_F32x16_REDUCE: ``(sum0 + sum2) + (sum1 + sum3)`` lane-wise, then
#   ``_mm512_reduce_add_ps`` (:func:`.simd.reduce_add_ps`); bf16 reduces each of its
#   two accumulators and adds them in double;
# * leftovers: f16/bf16 ``sumf += (double)(x*y)`` (float32 products, double sum); f32
#   keeps ``float sumf`` and GCC vectorizes that loop into rounded products added in
#   order, except the last ``n % 8`` elements, which its scalar epilogue contracts to
#   ``sumf = fma(x, y, sumf)``.
#
# The order is fixed, not picked per numba target: compiled for an AVX2 or older CPU
# (NUMBA_CPU_NAME) the kernels give the same results, LLVM splitting the 16-lane vectors
# (and ``llvm.fma`` becoming a libm call without FMA). llama.cpp itself on an AVX2-only
# CPU (8-lane accumulators, hadd reduction), with AVX512-FP16, or built by another
# compiler adds in another order: expect float32 rounding differences there. On a CPU
# with AVX512-BF16 its bf16 dot is the pair dot ``_mm512_dpbf16_ps``, which the kernels
# follow (:data:`BF16_DP`).
# For N >= 2 activation rows llama.cpp uses llamafile's tinyBLAS instead of vec_dot.




@njit(cache=True)
def _ggml_f32(row, y):
    out_of_line()
    return _f32_dot(row, y)


@njit(inline="always", cache=True)
def _f32_dot(row, y):
    """ggml_vec_dot_f32 of raw float32 rows (the body of :func:`_ggml_f32`)."""
    n = row.shape[0] // 4
    n64 = n - n % 64
    s0, s1, s2, s3 = f32_chains4(row, y, n64)
    sumf = simd.reduce_add_ps((s0 + s2) + (s1 + s3))
    if n64 < n:                     # the views only where there is a tail: an array view
        w, v = row.view(np.float32), y.view(np.float32)     # a row cost ~9 points of the
        n8 = n - n % 8                                      # streaming read (README)
        for i in range(n64, n8):
            sumf = sumf + w[i] * v[i]
        for i in range(n8, n):
            sumf = simd.fma(w[i], v[i], sumf)
    return sumf


@njit(cache=True)
def _ggml_f16(row, y):
    out_of_line()
    n = row.shape[0] // 2
    n64 = n - n % 64
    s0 = s1 = s2 = s3 = simd.zeros(16, "f32")
    for p in range(0, 2 * n64, 128):
        s0 = simd.fma(simd.f16_to_f32(simd.load(row, p, 16, "u16")),
                      simd.f16_to_f32(simd.load(y, p, 16, "u16")), s0)
        s1 = simd.fma(simd.f16_to_f32(simd.load(row, p + 32, 16, "u16")),
                      simd.f16_to_f32(simd.load(y, p + 32, 16, "u16")), s1)
        s2 = simd.fma(simd.f16_to_f32(simd.load(row, p + 64, 16, "u16")),
                      simd.f16_to_f32(simd.load(y, p + 64, 16, "u16")), s2)
        s3 = simd.fma(simd.f16_to_f32(simd.load(row, p + 96, 16, "u16")),
                      simd.f16_to_f32(simd.load(y, p + 96, 16, "u16")), s3)
    s = np.float64(simd.reduce_add_ps((s0 + s2) + (s1 + s3)))
    if n64 < n:
        w, v = row.view(np.uint16), y.view(np.uint16)
        for i in range(n64, n):
            s += np.float64(f16_to_f32(w[i]) * f16_to_f32(v[i]))
    return F(s)


def _avx512_bf16_host() -> bool:
    """Whether llama.cpp, built natively for this CPU (GGML_NATIVE), compiles
    ggml_vec_dot_bf16's ``__AVX512BF16__`` branch (``_mm512_dpbf16_ps``, vec.cpp)."""
    from llvmlite import binding
    return bool(binding.get_host_cpu_features().get("avx512bf16", False))


#: ggml_vec_dot_bf16's main loop on this CPU: ``True`` the AVX512-BF16 pair dot (64
#: elements a step, each lane adds its odd then its even product), ``False`` the
#: AVX-512F FMA loop (32 a step). Frozen into the compiled kernels; numba's cache is
#: keyed by the host CPU, so a cache never crosses the two.
BF16_DP = _avx512_bf16_host()

# VDPBF16PS (Intel SDM): per float32 lane j, ``acc += x[2j+1]*y[2j+1]`` then
# ``acc += x[2j]*y[2j]``, each product of two bfloat16s exact in float32, so each step
# is one rounding: an FMA. (It also treats denormal inputs as zero and flushes denormal
# results, which this does not: rows with bfloat16 denormals may differ in the last bit.)
_odd16 = simd.permutation(range(1, 32, 2))
_even16 = simd.permutation(range(0, 32, 2))


@njit(inline="always", cache=True)
def _dpbf16(acc, x, y, i, y_is_f32):
    """``_mm512_dpbf16_ps(acc, x, y)``: 32 bfloat16 weights ``x`` (uint16 lanes) times the
    activations at element ``i`` of ``y`` (raw bytes: bfloat16, or float32 already
    expanded)."""
    if y_is_f32:
        v = simd.load(y, 4 * i, 32, "f32")
        yo, ye = _odd16(v), _even16(v)
    else:
        v = simd.load(y, 2 * i, 32, "u16")
        yo, ye = simd.bf16_to_f32(_odd16(v)), simd.bf16_to_f32(_even16(v))
    acc = simd.fma(simd.bf16_to_f32(_odd16(x)), yo, acc)
    return simd.fma(simd.bf16_to_f32(_even16(x)), ye, acc)


@njit(inline="always", cache=True)
def _bf16_main(row, y, n, y_is_f32):
    """ggml_vec_dot_bf16's SIMD part over the first elements of ``row`` (raw bytes):
    returns (double sum of its two reduced accumulators, elements consumed)."""
    c1 = c2 = simd.zeros(16, "f32")
    ys = 4 if y_is_f32 else 2                          # bytes of one activation element
    if BF16_DP:
        nv = n - n % 64
        for i in range(0, nv, 64):
            simd.prefetch(row, 2 * i + PREFETCH_AHEAD)
            simd.prefetch(row, 2 * i + PREFETCH_AHEAD + 64)
            c1 = _dpbf16(c1, simd.load(row, 2 * i, 32, "u16"), y, i, y_is_f32)
            c2 = _dpbf16(c2, simd.load(row, 2 * i + 64, 32, "u16"), y, i + 32, y_is_f32)
    else:
        nv = n - n % 32
        for i in range(0, nv, 32):
            simd.prefetch(row, 2 * i + PREFETCH_AHEAD)
            x1 = simd.bf16_to_f32(simd.load(row, 2 * i, 16, "u16"))
            x2 = simd.bf16_to_f32(simd.load(row, 2 * i + 32, 16, "u16"))
            if y_is_f32:
                c1 = simd.fma(x1, simd.load(y, ys * i, 16, "f32"), c1)
                c2 = simd.fma(x2, simd.load(y, ys * (i + 16), 16, "f32"), c2)
            else:
                c1 = simd.fma(x1, simd.bf16_to_f32(simd.load(y, ys * i, 16, "u16")), c1)
                c2 = simd.fma(x2, simd.bf16_to_f32(simd.load(y, ys * (i + 16), 16, "u16")), c2)
    s = 0.0
    s += np.float64(simd.reduce_add_ps(c1))
    s += np.float64(simd.reduce_add_ps(c2))
    return s, nv


@njit(cache=True)
def _ggml_bf16(row, y):
    out_of_line()
    n = row.shape[0] // 2
    s, nv = _bf16_main(row, y, n, False)
    if nv < n:
        w, v = row.view(np.uint16), y.view(np.uint16)
        for i in range(nv, n):
            s += np.float64(bf16_to_f32(w[i]) * bf16_to_f32(v[i]))
    return F(s)


# The same three dots against an activation row already expanded to float32 (``yf``,
# exact: every half and bfloat16 is a float32), the fast path of :func:`matvec_ggml_float`:
# one conversion per 16 weights instead of two, identical arithmetic.

@njit(inline="always", cache=True)
def _ggml_f16_yf(row, yf):
    n = row.shape[0] // 2
    n64 = n - n % 64
    s0, s1, s2, s3 = fma_chains4(halves16, row, yf, n64)
    s = np.float64(simd.reduce_add_ps((s0 + s2) + (s1 + s3)))
    for i in range(n64, n):
        s += np.float64(f16_to_f32(np.uint16(row[2 * i]) | (np.uint16(row[2 * i + 1]) << 8))
                        * yf[i])
    return F(s)


@njit(inline="always", cache=True)
def _ggml_bf16_yf(row, yf, yb):
    # yb: yf's bytes (one view a task, not one a row)
    n = row.shape[0] // 2
    s, nv = _bf16_main(row, yb, n, True)
    for i in range(nv, n):
        s += np.float64(bf16_to_f32(np.uint16(row[2 * i]) | (np.uint16(row[2 * i + 1]) << 8))
                        * yf[i])
    return F(s)


#: weight types (codes) :func:`matvec_ggml_float` takes
FLOAT_CODES = (F32, F16, BF16)
#: weight bytes of a :func:`matvec_ggml_float` task (one out-of-line call over its rows;
#: a call per row cost F32 ~12 points of the streaming read, kernels/README.md) ...
FLOAT_TASK_BYTES = 256 * 1024
#: ... and at least this many tasks a matrix (so that the threads can share it)
FLOAT_MIN_TASKS = 16


@njit(cache=True)
def _rows_f32(w, r0, r1, y, out):
    """out[r] = ggml_vec_dot_f32(w[r], y) for rows r0..r1 - 1 (one call a task)."""
    out_of_line()
    for r in range(r0, r1):
        out[r] = _f32_dot(w[r], y)


@njit(cache=True)
def _rows_f16_yf(w, r0, r1, yf, out):
    """out[r] = ggml_vec_dot_f16(w[r], y) for rows r0..r1 - 1, y expanded to ``yf``."""
    out_of_line()
    for r in range(r0, r1):
        out[r] = _ggml_f16_yf(w[r], yf)


@njit(cache=True)
def _rows_bf16_yf(w, r0, r1, yf, out):
    """out[r] = ggml_vec_dot_bf16(w[r], y) for rows r0..r1 - 1, y expanded to ``yf``."""
    out_of_line()
    yb = yf.view(np.uint8)
    for r in range(r0, r1):
        out[r] = _ggml_bf16_yf(w[r], yf, yb)


@njit(parallel=True, cache=True)
def matvec_ggml_float(w, code, yq, y):
    """``y[n, r] = ggml_vec_dot_<f32|f16|bf16>(w[r], yq[n])`` for raw weight rows ``w``
    ``[M, row_bytes]`` and raw activation rows ``yq`` ``[N, row_bytes]`` of the same float
    type ``code``; each activation row is expanded to float32 once, threads split the
    weight rows in tasks of about ``FLOAT_TASK_BYTES`` (at least ``FLOAT_MIN_TASKS``),
    each task's rows times every activation row. Same results as :func:`dot_row_ggml`."""
    nrow = yq.shape[0]
    m = w.shape[0]
    k = w.shape[1] // (4 if code == F32 else 2)
    yf = np.empty((nrow, k), dtype=np.float32)
    for n in range(nrow):
        if code == F32:
            yf[n] = yq[n].view(np.float32)
        else:
            h = yq[n].view(np.uint16)
            for i in range(k):
                yf[n, i] = f16_to_f32(h[i]) if code == F16 else bf16_to_f32(h[i])
    tasks = min(m, max(FLOAT_MIN_TASKS, m * w.shape[1] // FLOAT_TASK_BYTES))
    for t in prange(tasks):                 # numba hands each thread one even span of tasks
        r0, r1 = m * t // tasks, m * (t + 1) // tasks
        for n in range(nrow):
            if code == F16:
                _rows_f16_yf(w, r0, r1, yf[n], y[n])
            elif code == BF16:
                _rows_bf16_yf(w, r0, r1, yf[n], y[n])
            else:
                _rows_f32(w, r0, r1, yq[n], y[n])


@njit(inline="always", cache=True)
def dot_row_ggml(code, row, yq):
    """ggml_vec_dot for raw weight row ``row`` and one quantized activation row ``yq``
    (raw vec_dot_type bytes), both uint8."""
    if code == Q4_0:
        return _ggml_q4_0(row, yq)
    if code == Q4_1:
        return _ggml_q4_1(row, yq)
    if code == Q5_0:
        return _ggml_q5_0(row, yq)
    if code == Q5_1:
        return _ggml_q5_1(row, yq)
    if code == Q8_0:
        return _ggml_q8_0(row, yq)
    if code == Q2_K:
        return _ggml_q2_k(row, yq)
    if code == Q3_K:
        return _ggml_q3_k(row, yq)
    if code == Q4_K:
        return _ggml_q4_k(row, yq)
    if code == Q5_K:
        return _ggml_q5_k(row, yq)
    if code == Q6_K:
        return _ggml_q6_k(row, yq)
    if code == F16:
        return _ggml_f16(row, yq)
    if code == BF16:
        return _ggml_bf16(row, yq)
    if code == F32:
        return _ggml_f32(row, yq)
    return F(np.nan)


# ---------------------------------------------------------------------------- reference
# numpy reimplementation of the same arithmetic: integer block sums (int64, exact),
# float32 per-block terms with ggml's operation order, and a sequential float32 sum
# over blocks (a Python loop: numpy's pairwise sum would add in another order).

_f32 = np.float32


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _seq_sum(terms: np.ndarray, start: np.ndarray | float = 0.0) -> np.ndarray:
    """sumf += terms[..., b] for b in order, in float32."""
    acc = np.broadcast_to(np.asarray(start, dtype=np.float32), terms.shape[:-1]).copy()
    for b in range(terms.shape[-1]):
        acc = (acc + terms[..., b]).astype(np.float32)
    return acc


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32]: low nibbles then high nibbles (ggml order)."""
    q = qs.astype(np.int64)
    return np.concatenate([q & 15, q >> 4], axis=-1)


def _qh_bits(qh4: np.ndarray) -> np.ndarray:
    """[..., 4] bytes of a little-endian uint32 -> [..., 32] bits."""
    return np.unpackbits(np.ascontiguousarray(qh4), axis=-1, bitorder="little").astype(np.int64)


def _y_q8(yq: np.ndarray, nb: int, size: int, qoff: int):
    """Q8_0 (size 34) / Q8_1 (36) activation blocks -> d, s, qs[N, nb, 32]."""
    b = yq.reshape(yq.shape[0], nb, size)
    s = _f16(b[..., 2:4]) if size == 36 else None
    return _f16(b[..., 0:2]), s, b[..., qoff:qoff + 32].view(np.int8).astype(np.int64)


def _ref_32(w: np.ndarray, qt: QT, yq: np.ndarray) -> np.ndarray:
    size = {QT.Q4_0: 18, QT.Q4_1: 20, QT.Q5_0: 22, QT.Q5_1: 24, QT.Q8_0: 34}[qt]
    nb = w.shape[1] // size
    blk = w.reshape(w.shape[0], nb, size)
    d = _f16(blk[..., 0:2])
    m = None
    if qt == QT.Q4_0:
        q = _nibbles(blk[..., 2:18]) - 8
    elif qt == QT.Q4_1:
        m, q = _f16(blk[..., 2:4]), _nibbles(blk[..., 4:20])
    elif qt == QT.Q5_0:
        q = (_nibbles(blk[..., 6:22]) | (_qh_bits(blk[..., 2:6]) << 4)) - 16
    elif qt == QT.Q5_1:
        m, q = _f16(blk[..., 2:4]), _nibbles(blk[..., 8:24]) | (_qh_bits(blk[..., 4:8]) << 4)
    else:
        q = blk[..., 2:34].view(np.int8).astype(np.int64)
    ysize = 36 if qt in (QT.Q4_1, QT.Q5_1) else 34
    yd, ys, y8 = _y_q8(yq, nb, ysize, ysize - 32)
    sumi = np.einsum("mbj,nbj->nmb", q, y8).astype(np.float32)       # [N, M, nb]
    dx, dy = d[None, :, :], yd[:, None, :]
    if qt == QT.Q4_0:
        terms = sumi * dx * dy                                       # sumi*dx*dy
    elif qt == QT.Q8_0:
        terms = sumi * (dx * dy)                                     # sumi*(dx*dy)
    elif qt == QT.Q5_0:
        terms = (dx * dy) * sumi
    else:                                                            # (dx*dy)*sumi + m*s
        terms = (dx * dy) * sumi + m[None, :, :] * ys[:, None, :]
    return _seq_sum(terms.astype(np.float32))


def _y_q8k(yq: np.ndarray, nb: int):
    b = yq.reshape(yq.shape[0], nb, 292)
    d = np.ascontiguousarray(b[..., 0:4]).view(np.float32)[..., 0]
    q = b[..., 4:260].view(np.int8).astype(np.int64)
    bsums = np.ascontiguousarray(b[..., 260:292]).view(np.int16).astype(np.int64)
    return d, q, bsums


def _lanes_sum(vals: np.ndarray, scale_of_k: np.ndarray, y8: np.ndarray) -> np.ndarray:
    """aux32[l] = sum over k = l (mod 8) of scale*q8*a: [N, M, nb, 8] int64."""
    prod = vals[None] * scale_of_k[None] * y8[:, None]               # [N, M, nb, 256]
    return prod.reshape(*prod.shape[:-1], 32, 8).sum(-2)


def _k_values(qt: QT, blk: np.ndarray):
    """Integer values a[M, nb, 256] and the per-value scale of a K-quant block."""
    M, nb = blk.shape[:2]
    crumbs = lambda qs: ((qs.reshape(M, nb, 2, 1, 32).astype(np.int64)
                          >> (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)) & 3).reshape(M, nb, 256)
    if qt == QT.Q3_K:
        lq = crumbs(blk[..., 32:96])
        shifts = (4 * np.arange(2)[:, None] + np.arange(4)[None, :]).reshape(1, 1, 2, 4, 1)
        hm = ((blk[..., 0:32].reshape(M, nb, 1, 1, 32).astype(np.int64) >> shifts) & 1)
        a = lq - 4 * (1 - hm.reshape(M, nb, 256))
        sc = blk[..., 96:108].astype(np.int64)
        j = np.arange(16)
        lo = (sc[..., j & 7] >> (4 * (j >> 3))) & 15
        hi = (sc[..., 8 + (j & 3)] >> (2 * (j >> 2))) & 3
        return a, np.repeat((lo | (hi << 4)) - 32, 16, axis=-1)
    if qt in (QT.Q4_K, QT.Q5_K):
        sc, _ = gq.Q4_K.get_scale_min(blk[..., 4:16].reshape(-1, 12))
        sc = np.repeat(sc.reshape(M, nb, 8).astype(np.int64), 32, axis=-1)
        qs = blk[..., 16:144] if qt == QT.Q4_K else blk[..., 48:176]
        shifts = np.array([0, 4]).reshape(1, 1, 1, 2, 1)
        a = ((qs.reshape(M, nb, 4, 1, 32).astype(np.int64) >> shifts) & 15).reshape(M, nb, 256)
        if qt == QT.Q5_K:
            qh = blk[..., 16:48].reshape(M, nb, 1, 32).astype(np.int64)
            a = a + 16 * ((qh >> np.arange(8).reshape(1, 1, 8, 1)) & 1).reshape(M, nb, 256)
        return a, sc
    # Q6_K (gguf-py's dequantize order)
    ql = blk[..., 0:128].reshape(M, nb, 2, 1, 64).astype(np.int64)
    ql = ((ql >> np.array([0, 4]).reshape(1, 1, 1, 2, 1)) & 15).reshape(M, nb, 8, 32)
    qh = blk[..., 128:192].reshape(M, nb, 2, 1, 32).astype(np.int64)
    qh = ((qh >> (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)) & 3).reshape(M, nb, 8, 32)
    a = ((ql | (qh << 4)) - 32).reshape(M, nb, 256)
    sc = blk[..., 192:208].view(np.int8).astype(np.int64)
    return a, np.repeat(sc, 16, axis=-1)


def _ref_k(w: np.ndarray, qt: QT, yq: np.ndarray) -> np.ndarray:
    size = {QT.Q2_K: 84, QT.Q3_K: 110, QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}[qt]
    M, nb = w.shape[0], w.shape[1] // size
    blk = w.reshape(M, nb, size)
    yd, y8, bsums = _y_q8k(yq, nb)
    if qt == QT.Q2_K:
        sc = blk[..., 0:16].astype(np.int64)
        q2 = ((blk[..., 16:80].reshape(M, nb, 2, 1, 32).astype(np.int64)
               >> (2 * np.arange(4)).reshape(1, 1, 1, 4, 1)) & 3).reshape(M, nb, 256)
        isum = np.einsum("mbk,nbk->nmb", q2 * np.repeat(sc & 15, 16, axis=-1), y8)
        summs = np.einsum("mbj,nbj->nmb", sc >> 4, bsums)
        dall = yd[:, None, :] * _f16(blk[..., 80:82])[None]        # y.d * fp16(x.d)
        dmin = yd[:, None, :] * _f16(blk[..., 82:84])[None]
        return _seq_sum((dall * isum.astype(np.float32) - dmin * summs.astype(np.float32))
                        .astype(np.float32))
    a, scale = _k_values(qt, blk)
    aux32 = _lanes_sum(a, scale, y8).astype(np.float32)              # [N, M, nb, 8]
    dpos = {QT.Q3_K: 108, QT.Q4_K: 0, QT.Q5_K: 0, QT.Q6_K: 208}[qt]
    d = _f16(blk[..., dpos:dpos + 2])[None] * yd[:, None, :]         # fp16(x.d) * y.d
    sums = np.zeros(aux32.shape[:2] + (8,), dtype=np.float32)
    for b in range(nb):
        sums = (sums + d[..., b, None] * aux32[..., b, :]).astype(np.float32)
    sumf = np.zeros(aux32.shape[:2], dtype=np.float32)
    if qt in (QT.Q4_K, QT.Q5_K):
        _, mins = gq.Q4_K.get_scale_min(blk[..., 4:16].reshape(-1, 12))
        mins = np.repeat(mins.reshape(M, nb, 8).astype(np.int64), 2, axis=-1)
        sumi = np.einsum("mbj,nbj->nmb", mins, bsums).astype(np.float32)
        dmin = _f16(blk[..., 2:4])[None] * yd[:, None, :]
        for b in range(nb):
            sumf = (sumf - dmin[..., b] * sumi[..., b]).astype(np.float32)
    for l in range(8):
        sumf = (sumf + sums[..., l]).astype(np.float32)
    return sumf


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once, like ``vfmadd`` (numpy has no fma).

    The product is exact in float64 and ``s = p + c`` rounds once; TwoSum gives the
    exact error ``e``. Rounding ``s`` to float32 is then right unless ``s`` landed exactly
    on a float32 midpoint with ``e != 0`` (double rounding), where ``e`` picks the side."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    fix = (e != 0) & (r64 != s)
    if fix.any():
        other = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)))
        o64 = other.astype(np.float64)
        mid = (r64 + o64) * 0.5                       # exact: two adjacent float32s
        r = np.where(fix & (s == mid) & ((e > 0) == (o64 > r64)), other, r)
    return r


def _reduce_add_ps(v: np.ndarray) -> np.ndarray:
    """[..., 16] float32 -> [...]: ``_mm512_reduce_add_ps``'s order (:mod:`.simd`)."""
    a = v[..., 8:] + v[..., :8]
    b = a[..., 4:] + a[..., :4]
    return (b[..., 0] + b[..., 2]) + (b[..., 1] + b[..., 3])


def _ref_float(w: np.ndarray, qt: QT, yq: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32/f16/bf16 for AVX-512F as built by GCC (see the kernels); bf16
    with AVX512-BF16's pair dot where this CPU has it (:data:`BF16_DP`)."""
    if qt == QT.F32:
        wf, yf = w.view(np.float32), yq.view(np.float32)
    elif qt == QT.F16:
        wf, yf = w.view(np.float16).astype(np.float32), yq.view(np.float16).astype(np.float32)
    else:
        wf = (w.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        yf = (yq.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    (m, k), n = wf.shape, yf.shape[0]
    nacc = 2 if qt == QT.BF16 else 4
    pairs = qt == QT.BF16 and BF16_DP          # VDPBF16PS: 2 elements per lane
    step = 16 * nacc * (2 if pairs else 1)
    kv = k - k % step
    acc = np.zeros((n, m, nacc, 16), dtype=np.float32)
    for i in range(0, kv, step):
        wb = wf[None, :, i:i + step].reshape(1, m, nacc, 16, -1)
        yb = yf[:, None, i:i + step].reshape(n, 1, nacc, 16, -1)
        for e in ((1, 0) if pairs else (0,)):   # odd element first, then even
            acc = _fma32(wb[..., e], yb[..., e], acc)
    wt, yt = wf[None, :, kv:], yf[:, None, kv:]
    prod = (wt * yt).astype(np.float32)                              # [N, M, tail]
    if qt == QT.BF16:
        sumf = np.float64(0) + _reduce_add_ps(acc[..., 0, :]).astype(np.float64)
        sumf = sumf + _reduce_add_ps(acc[..., 1, :]).astype(np.float64)
    else:
        red = _reduce_add_ps((acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :]))
        if qt == QT.F32:                          # float sumf; last k % 8 by fma
            k8 = k - k % 8
            for i in range(kv, k8):
                red = (red + prod[..., i - kv]).astype(np.float32)
            for i in range(k8, k):
                red = _fma32(wt[..., i - kv], yt[..., i - kv], red)
            return red.astype(np.float32)
        sumf = red.astype(np.float64)
    for i in range(k - kv):                                          # double leftovers
        sumf = sumf + prod[..., i].astype(np.float64)
    return sumf.astype(np.float32)


def dot_rows_ggml_ref(w: np.ndarray, qtype: QT, yq: np.ndarray) -> np.ndarray:
    """numpy reference: raw weights ``[M, row_bytes]`` x raw quantized activations
    ``[N, bytes]`` -> float32 ``[N, M]``, ggml's generic vec_dot arithmetic."""
    qt = QT(qtype)
    if qt in (QT.F32, QT.F16, QT.BF16):
        return _ref_float(w, qt, yq)
    if qt in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        return _ref_k(w, qt, yq)
    return _ref_32(w, qt, yq)
