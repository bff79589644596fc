"""Row-times-vector dot products that decode the weight row on the fly (float32 math).

``dot_row(code, row, x, xs)`` returns ``sum_k w[k] * x[k]`` for one raw weight row
(uint8, layouts in :mod:`.quants`) and a float32 vector ``x[K]``, without writing the
decoded row anywhere. ``xs = x_sums16(x)`` holds the sums of each 16 consecutive
``x`` (computed once per vector, shared by every row): the ``dmin * m * sum(x)``
offsets of Q2_K/Q4_K/Q5_K sub-blocks are then one scalar multiply per sub-block
instead of one per value.

How the loops are written, and why (each measured on a 4096-wide row, one core):

* Lane accumulators. A block's values share a scale, so ``acc += d * sum_j q_j x_j``
  would pay a horizontal sum per block; instead lane ``j`` of a 16/32-wide
  accumulator collects ``d * q_j * x_j`` across blocks and the lanes are summed once
  per row. The accumulator is a stack array (:func:`.bits.stack_f32`) so LLVM keeps
  it in registers (1.7x).
* Quants stay bytes until the final conversion (:mod:`.bits` byte intrinsics), so
  nibbles and crumbs are split 16 at a time and widened straight to 32-bit lanes
  (2x); bit planes are written out (constant shift counts) and tested with masks
  (:func:`.bits.b_test`), which keeps LLVM vectorizing (Q2_K/Q3_K: 15x).
* :func:`.bits.prefer_512bit` lets LLVM use 512-bit vectors (1.6x).
* F32/F16/BF16 are written with :mod:`.simd` vectors (LLVM's own vectorization of the
  scalar loop ran at ~60% of the bandwidth): one ``vcvtph2ps`` (or shift) per 16
  weights, four FMA accumulators, and a software prefetch of every cache line
  ``PREFETCH_AHEAD`` bytes ahead in the row (F32 from memory on 2 threads: 63% of the
  streaming read without it, ~80-90% with it).
* Each type's dot is its own compiled function (called, not inlined, from the
  kernels), so its code generation does not depend on the caller; mins of the
  K-quants are summed in a separate loop so that the lane loop holds lane work only.

Numerics: the same products as ``dequantize(w) @ x`` grouped differently
(``d*(q*x)`` rather than ``(d*q)*x``) and summed in another order (fastmath
reassociation): expect a relative difference of ~1e-6 of ``|w| @ |x|``.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import simd
from .bits import (b_and, b_f32, b_shr, bf16_to_f32, f16_at, f16_to_f32, out_of_line,
                   prefer_512bit, sb_f32, stack_f32, u32_at, u32_bit_f32)
from .quants import (BF16, F16, F32, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0,
                     _q3_k_scale, q3_k_value, q5_k_values, q6_k_values, scale_min_k4)

F = np.float32
_8, _16, _32 = F(8), F(16), F(32)


@njit(inline="always", fastmath=True, cache=True)
def x_sums16(x, xs):
    """xs[i] = sum(x[16*i : 16*i+16]) (K a multiple of 16; xs: float32[K/16])."""
    for i in range(x.shape[0] // 16):
        s = F(0)
        for j in range(16):
            s += x[16 * i + j]
        xs[i] = s


@njit(inline="always", cache=True)
def _lanes(acc):
    s = F(0)
    for j in range(acc.shape[0]):
        s += acc[j]
    return s


#: bytes ahead in the weight row that the float dots prefetch (simd.prefetch), every cache line
#: of the row (here and in .vec_dot_ggml; 1 KB ahead, every second or fourth line:
#: F16 48%, F32 63% of the streaming read)
PREFETCH_AHEAD = 8192


@njit(inline="always", cache=True)
def f32_chains4(row, x, n64):
    """The four 16-lane FMA chains over the first ``n64`` values of a float32 weight row
    (raw bytes) against ``x`` (float32 values, any array type), chain c taking values
    64i + 16c..64i + 16c + 15, with a prefetch of every line ``PREFETCH_AHEAD`` bytes
    ahead (the plain loop LLVM vectorized ran at 63% of the streaming read from memory
    on 2 threads). The callers reduce the chains in their own order."""
    s0 = s1 = s2 = s3 = simd.zeros(16, "f32")
    for p in range(0, 4 * n64, 256):
        for o in range(0, 256, 64):
            simd.prefetch(row, p + PREFETCH_AHEAD + o)
        s0 = simd.fma(simd.load(row, p, 16, "f32"), simd.load(x, p, 16, "f32"), s0)
        s1 = simd.fma(simd.load(row, p + 64, 16, "f32"), simd.load(x, p + 64, 16, "f32"), s1)
        s2 = simd.fma(simd.load(row, p + 128, 16, "f32"), simd.load(x, p + 128, 16, "f32"), s2)
        s3 = simd.fma(simd.load(row, p + 192, 16, "f32"), simd.load(x, p + 192, 16, "f32"), s3)
    return s0, s1, s2, s3


@njit(fastmath=True, cache=True)
def _dot_f32(row, x, xs):
    out_of_line()
    n = x.shape[0]
    n64 = n - n % 64
    s0, s1, s2, s3 = f32_chains4(row, x, n64)
    s = simd.reduce_add_ps((s0 + s1) + (s2 + s3))
    if n64 < n:                     # a view a row costs (README: "Streaming")
        w = row.view(np.float32)
        for i in range(n64, n):
            s += w[i] * x[i]
    return s


@njit(inline="always", cache=True)
def halves16(v):
    """16 F16 lanes (u16) -> float32 (vcvtph2ps)."""
    return simd.f16_to_f32(v)


@njit(inline="always", cache=True)
def bhalves16(v):
    """16 BF16 lanes (u16) -> float32."""
    return simd.bf16_to_f32(v)


@njit(inline="always", cache=True)
def fma_chains4(convert, row, x, n64):
    """The four 16-lane FMA chains over the first ``n64`` values of a 16-bit float weight
    row (raw bytes; ``convert`` = :func:`halves16` or :func:`bhalves16`) against float32
    ``x``, chain c taking values 64i + 16c..64i + 16c + 15; prefetches the row. The
    callers reduce the chains in their own order."""
    s0 = s1 = s2 = s3 = simd.zeros(16, "f32")
    for p in range(0, 2 * n64, 128):
        simd.prefetch(row, p + PREFETCH_AHEAD)
        simd.prefetch(row, p + PREFETCH_AHEAD + 64)
        s0 = simd.fma(convert(simd.load(row, p, 16, "u16")), simd.load(x, 2 * p, 16, "f32"), s0)
        s1 = simd.fma(convert(simd.load(row, p + 32, 16, "u16")),
                      simd.load(x, 2 * p + 64, 16, "f32"), s1)
        s2 = simd.fma(convert(simd.load(row, p + 64, 16, "u16")),
                      simd.load(x, 2 * p + 128, 16, "f32"), s2)
        s3 = simd.fma(convert(simd.load(row, p + 96, 16, "u16")),
                      simd.load(x, 2 * p + 192, 16, "f32"), s3)
    return s0, s1, s2, s3


@njit(fastmath=True, cache=True)
def _dot_f16(row, x, xs):
    # explicit vectors: one vcvtph2ps per 16 weights, 4 independent FMA chains, prefetch
    out_of_line()
    n = x.shape[0]
    n64 = n - n % 64
    s0, s1, s2, s3 = fma_chains4(halves16, row, x, n64)
    s = simd.reduce_add_ps((s0 + s1) + (s2 + s3))
    if n64 < n:
        w = row.view(np.uint16)
        for i in range(n64, n):
            s += f16_to_f32(w[i]) * x[i]
    return s


@njit(fastmath=True, cache=True)
def _dot_bf16(row, x, xs):
    out_of_line()
    n = x.shape[0]
    n64 = n - n % 64
    s0, s1, s2, s3 = fma_chains4(bhalves16, row, x, n64)
    s = simd.reduce_add_ps((s0 + s1) + (s2 + s3))
    if n64 < n:
        w = row.view(np.uint16)
        for i in range(n64, n):
            s += bf16_to_f32(w[i]) * x[i]
    return s


@njit(fastmath=True, cache=True)
def _dot_q4_0(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    for b in range(x.shape[0] // 32):
        p, o = 18 * b, 32 * b
        d = f16_at(row, p)
        for j in range(16):
            q = row[p + 2 + j]
            acc[j] += d * ((b_f32(b_and(q, 15)) - _8) * x[o + j]
                           + (b_f32(b_shr(q, 4)) - _8) * x[o + 16 + j])
    return _lanes(acc)


@njit(fastmath=True, cache=True)
def _dot_q4_1(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    for b in range(x.shape[0] // 32):
        p, o = 20 * b, 32 * b
        d = f16_at(row, p)
        m = f16_at(row, p + 2)
        for j in range(16):
            q = row[p + 4 + j]
            x0, x1 = x[o + j], x[o + 16 + j]
            acc[j] += d * (b_f32(b_and(q, 15)) * x0 + b_f32(b_shr(q, 4)) * x1) + m * (x0 + x1)
    return _lanes(acc)


@njit(fastmath=True, cache=True)
def _dot_q5_0(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    for b in range(x.shape[0] // 32):
        p, o = 22 * b, 32 * b
        d = f16_at(row, p)
        qh = u32_at(row, p + 2)
        for j in range(16):
            q = row[p + 6 + j]
            lo = b_f32(b_and(q, 15)) + _16 * u32_bit_f32(qh, j) - _16
            hi = b_f32(b_shr(q, 4)) + _16 * u32_bit_f32(qh, j + 16) - _16
            acc[j] += d * (lo * x[o + j] + hi * x[o + 16 + j])
    return _lanes(acc)


@njit(fastmath=True, cache=True)
def _dot_q5_1(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    for b in range(x.shape[0] // 32):
        p, o = 24 * b, 32 * b
        d = f16_at(row, p)
        m = f16_at(row, p + 2)
        qh = u32_at(row, p + 4)
        for j in range(16):
            q = row[p + 8 + j]
            lo = b_f32(b_and(q, 15)) + _16 * u32_bit_f32(qh, j)
            hi = b_f32(b_shr(q, 4)) + _16 * u32_bit_f32(qh, j + 16)
            x0, x1 = x[o + j], x[o + 16 + j]
            acc[j] += d * (lo * x0 + hi * x1) + m * (x0 + x1)
    return _lanes(acc)


@njit(fastmath=True, cache=True)
def _dot_q8_0(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(32)
    acc[:] = 0
    for b in range(x.shape[0] // 32):
        p, o = 34 * b, 32 * b
        d = f16_at(row, p)
        for j in range(32):
            acc[j] += d * (sb_f32(row[p + 2 + j]) * x[o + j])
    return _lanes(acc)


@njit(fastmath=True, cache=True)
def _dot_q2_k(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    mins = F(0)
    for b in range(x.shape[0] // 256):
        p, o = 84 * b, 256 * b
        d = f16_at(row, p + 80)
        for n in range(2):              # each qs byte holds 4 crumbs, one per 32-plane
            for h in range(2):          # planes j=0..3 written out: constant shifts
                d0 = d * b_f32(b_and(row[p + 8 * n + h], 15))
                d1 = d * b_f32(b_and(row[p + 8 * n + 2 + h], 15))
                d2 = d * b_f32(b_and(row[p + 8 * n + 4 + h], 15))
                d3 = d * b_f32(b_and(row[p + 8 * n + 6 + h], 15))
                qo, xo = p + 16 + 32 * n + 16 * h, o + 128 * n + 16 * h
                for l in range(16):
                    q = row[qo + l]
                    acc[l] += (d0 * (b_f32(b_and(q, 3)) * x[xo + l])
                               + d1 * (b_f32(b_and(b_shr(q, 2), 3)) * x[xo + 32 + l])
                               + d2 * (b_f32(b_and(b_shr(q, 4), 3)) * x[xo + 64 + l])
                               + d3 * (b_f32(b_shr(q, 6)) * x[xo + 96 + l]))
    for b in range(x.shape[0] // 256):  # the mins: sub-block i covers x[16i : 16i+16]
        dmin = f16_at(row, 84 * b + 82)
        for i in range(16):
            mins += dmin * b_f32(b_shr(row[84 * b + i], 4)) * xs[16 * b + i]
    return _lanes(acc) - mins


@njit(fastmath=True, cache=True)
def _dot_q3_k(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    for b in range(x.shape[0] // 256):
        p, o = 110 * b, 256 * b
        d = f16_at(row, p + 108)
        for n in range(2):
            m = 1 << (4 * n)            # hmask bit of plane 0; planes 1..3 shift it left
            for h in range(2):
                d0 = d * F(_q3_k_scale(row, p, 8 * n + h))
                d1 = d * F(_q3_k_scale(row, p, 8 * n + 2 + h))
                d2 = d * F(_q3_k_scale(row, p, 8 * n + 4 + h))
                d3 = d * F(_q3_k_scale(row, p, 8 * n + 6 + h))
                qo, xo = p + 32 + 32 * n + 16 * h, o + 128 * n + 16 * h
                for l in range(16):
                    q, hb = row[qo + l], row[p + 16 * h + l]
                    acc[l] += (d0 * (q3_k_value(q, 0, hb, m) * x[xo + l])
                               + d1 * (q3_k_value(q, 2, hb, m << 1) * x[xo + 32 + l])
                               + d2 * (q3_k_value(q, 4, hb, m << 2) * x[xo + 64 + l])
                               + d3 * (q3_k_value(q, 6, hb, m << 3) * x[xo + 96 + l]))
    return _lanes(acc)


@njit(inline="always", cache=True)
def _k4_mins(row, block_bytes, xs):
    """sum over 32-value sub-blocks of dmin*m*sum(x) for Q4_K/Q5_K (d@0 dmin@2 scales@4)."""
    mins = F(0)
    for b in range(xs.shape[0] // 16):
        p = block_bytes * b
        dmin = f16_at(row, p + 2)
        for j in range(8):
            _, m = scale_min_k4(row, p + 4, j)
            mins += dmin * F(m) * (xs[16 * b + 2 * j] + xs[16 * b + 2 * j + 1])
    return mins


@njit(fastmath=True, cache=True)
def _dot_q4_k(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(32)
    acc[:] = 0
    for b in range(x.shape[0] // 256):
        p, o = 144 * b, 256 * b
        d = f16_at(row, p)
        for j in range(4):
            s1, m1 = scale_min_k4(row, p + 4, 2 * j)
            s2, m2 = scale_min_k4(row, p + 4, 2 * j + 1)
            d1, d2 = d * F(s1), d * F(s2)
            qo, xo = p + 16 + 32 * j, o + 64 * j
            for l in range(32):
                q = row[qo + l]
                acc[l] += (d1 * (b_f32(b_and(q, 15)) * x[xo + l])
                           + d2 * (b_f32(b_shr(q, 4)) * x[xo + 32 + l]))
    return _lanes(acc) - _k4_mins(row, 144, xs)


@njit(fastmath=True, cache=True)
def _dot_q5_k(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(32)
    acc[:] = 0
    for b in range(x.shape[0] // 256):
        p, o = 176 * b, 256 * b
        d = f16_at(row, p)
        for j in range(4):
            s1, m1 = scale_min_k4(row, p + 4, 2 * j)
            s2, m2 = scale_min_k4(row, p + 4, 2 * j + 1)
            d1, d2 = d * F(s1), d * F(s2)
            qo, xo = p + 48 + 32 * j, o + 64 * j
            hm1, hm2 = 1 << (2 * j), 2 << (2 * j)     # qh bits of the two sub-blocks
            for l in range(32):
                lo, hi = q5_k_values(row[qo + l], row[p + 16 + l], hm1, hm2)
                acc[l] += d1 * (b_f32(lo) * x[xo + l]) + d2 * (b_f32(hi) * x[xo + 32 + l])
    return _lanes(acc) - _k4_mins(row, 176, xs)


@njit(fastmath=True, cache=True)
def _dot_q6_k(row, x, xs):
    prefer_512bit()
    out_of_line()
    acc = stack_f32(16)
    acc[:] = 0
    for b in range(x.shape[0] // 256):
        p, o = 210 * b, 256 * b
        d = f16_at(row, p + 208)
        for n in range(2):
            ql, qh, sc = p + 64 * n, p + 128 + 32 * n, p + 192 + 8 * n
            for h in range(2):
                d1 = d * sb_f32(row[sc + h])
                d2 = d * sb_f32(row[sc + h + 2])
                d3 = d * sb_f32(row[sc + h + 4])
                d4 = d * sb_f32(row[sc + h + 6])
                for i in range(16):
                    l = 16 * h + i
                    q1, q2, q3, q4 = q6_k_values(row[ql + l], row[ql + l + 32], row[qh + l])
                    xo = o + 128 * n + l
                    acc[i] += (d1 * ((b_f32(q1) - _32) * x[xo])
                               + d2 * ((b_f32(q2) - _32) * x[xo + 32])
                               + d3 * ((b_f32(q3) - _32) * x[xo + 64])
                               + d4 * ((b_f32(q4) - _32) * x[xo + 96]))
    return _lanes(acc)


@njit(inline="always", fastmath=True, cache=True)
def dot_row(code, row, x, xs):
    """sum_k w[k]*x[k] for the raw row ``row`` (uint8) of weight type ``code``;
    ``xs`` = :func:`x_sums16` of ``x``."""
    if code == Q4_K:
        return _dot_q4_k(row, x, xs)
    if code == Q6_K:
        return _dot_q6_k(row, x, xs)
    if code == Q4_0:
        return _dot_q4_0(row, x, xs)
    if code == Q8_0:
        return _dot_q8_0(row, x, xs)
    if code == F16:
        return _dot_f16(row, x, xs)
    if code == F32:
        return _dot_f32(row, x, xs)
    if code == BF16:
        return _dot_bf16(row, x, xs)
    if code == Q4_1:
        return _dot_q4_1(row, x, xs)
    if code == Q5_0:
        return _dot_q5_0(row, x, xs)
    if code == Q5_1:
        return _dot_q5_1(row, x, xs)
    if code == Q2_K:
        return _dot_q2_k(row, x, xs)
    if code == Q3_K:
        return _dot_q3_k(row, x, xs)
    if code == Q5_K:
        return _dot_q5_k(row, x, xs)
    return F(np.nan)
