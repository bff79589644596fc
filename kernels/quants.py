"""Block decoding of ggml weight types, and the activation quantizers ggml's matmul uses.

Weights stay as the raw bytes memory-mapped from the GGUF: a ``uint8`` array
``[rows, row_bytes]``, ``row_bytes = K / block_size * type_size``
(``gguf.constants.GGML_QUANT_SIZES``). Nothing here makes a dequantized copy of a
matrix: :func:`dequantize_row` decodes one row into a caller-owned float32 buffer.

Block layouts (byte offsets inside one block; ggml-common.h, gguf/quants.py). In the
32-blocks value j < 16 is the low nibble of qs[j] and value j + 16 its high nibble;
Q5 types add bit j of ``qh`` as bit 4::

    Q4_0  18 B / 32    d:f16@0  qs[16]@2              x = d*(q - 8)
    Q4_1  20 B / 32    d@0 m@2  qs[16]@4              x = d*q + m
    Q5_0  22 B / 32    d@0 qh:u32@2 qs[16]@6          x = d*((q | hbit << 4) - 16)
    Q5_1  24 B / 32    d@0 m@2 qh@4 qs[16]@8          x = d*(q | hbit << 4) + m
    Q8_0  34 B / 32    d@0 qs:i8[32]@2                x = d*q
    Q2_K  84 B / 256   scales[16]@0 qs[64]@16 d@80 dmin@82
    Q3_K 110 B / 256   hmask[32]@0 qs[64]@32 scales[12]@96 d@108
    Q4_K 144 B / 256   d@0 dmin@2 scales[12]@4 qs[128]@16
    Q5_K 176 B / 256   d@0 dmin@2 scales[12]@4 qh[32]@16 qs[128]@48
    Q6_K 210 B / 256   ql[128]@0 qh[64]@128 scales:i8[16]@192 d@208

The decoders follow ``dequantize_row_*`` in ggml-quants.c operation for operation
(e.g. Q4_K is ``(d*sc)*q - (dmin*m)`` in float32, no FMA), so they match
``gguf.quants.dequantize`` bit for bit.

Activation quantizers (the ``vec_dot_type`` ggml converts src1 to before a quantized
matmul; ggml-cpu/ggml-cpu.c ``type_traits_cpu``), written as raw ggml blocks:

    Q8_0  34 B / 32    d:f16 qs:i8[32]                  (Q4_0, Q5_0, Q8_0 weights)
    Q8_1  36 B / 32    d:f16 s:f16(=d*sum qs) qs[32]    (Q4_1, Q5_1 weights)
    Q8_K 292 B / 256   d:f32 qs:i8[256] bsums:i16[16]   (K-quant weights)

``x86=True`` (the default) reproduces ggml-cpu/arch/x86/quants.c (what an AVX/AVX2
build runs): ``id = 127/amax`` and round-half-to-even. ``x86=False`` is the scalar
``quantize_row_q8_0_ref``: ``id = 1/d`` and ``roundf`` (half away from zero), which
``gguf.quants.quantize`` reproduces. Q8_K uses the reference on every arch
(``quantize_row_q8_K`` is the placeholder that calls it).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq
from numba import njit, prange

from graphcost.format import ggml_types as gt

from . import simd as S
from .bits import (b_and, b_f32, b_or, b_shl, b_shr, b_sub, b_test, bf16_round_ref,
                   bf16_to_f32, f16_at, f16_to_f32, f32_bits, f32_to_bf16, f32_to_f16,
                   out_of_line, read_only_view, sb_f32, u32_at, u32_bit)

# ---------------------------------------------------------------------------- types

#: weight types every kernel supports
SUPPORTED: tuple[QT, ...] = (
    QT.F32, QT.F16, QT.BF16,
    QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K,
)

# integer codes for use inside njit code (gguf's enum values, frozen as constants)
F32, F16, BF16 = int(QT.F32), int(QT.F16), int(QT.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = int(QT.Q4_0), int(QT.Q4_1), int(QT.Q5_0), int(QT.Q5_1), int(QT.Q8_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = int(QT.Q2_K), int(QT.Q3_K), int(QT.Q4_K), int(QT.Q5_K), int(QT.Q6_K)
Q8_1, Q8_K = int(QT.Q8_1), int(QT.Q8_K)

#: the type ggml quantizes activations to for a matmul with each supported weight type
#: (graphcost.format.ggml_types, the one table of type facts)
VEC_DOT_TYPE: dict[QT, QT] = {t: gt.vec_dot_type(t) for t in SUPPORTED}


def row_bytes(qtype: QT, k: int) -> int:
    """Bytes of one row of ``k`` elements of ``qtype`` (raises if k is not whole blocks);
    block sizes from graphcost.format.ggml_types (gguf's GGML_QUANT_SIZES, Q8_1 as in ggml)."""
    blck, tsize = gt.block(QT(qtype))
    if k % blck:
        raise ValueError(f"{QT(qtype).name}: row length {k} is not a multiple of {blck}")
    return k // blck * tsize


def check_weight(w_raw: np.ndarray, qtype: QT, k: int, writable: bool = False) -> np.ndarray:
    """Return ``w_raw`` as a C-contiguous ``uint8 [rows, row_bytes]`` view (a copy where
    it is not contiguous), or raise. Read-only unless ``writable`` (a cache written into):
    numba compiles a kernel, with every per-type function it dispatches to, once for
    read-only rows (a mapped file's weights) and again for writable ones, so rows that are
    only read (a KV cache in KQ, a copy of a strided view) take the weights' code."""
    qtype = QT(qtype)
    if qtype not in SUPPORTED:
        raise NotImplementedError(f"weight type {qtype.name} is not supported by the kernels")
    rb = row_bytes(qtype, k)
    w = np.ascontiguousarray(w_raw).view(np.uint8)
    if w.ndim != 2:
        w = w.reshape(-1, rb)
    if w.shape[1] != rb:
        raise ValueError(f"{qtype.name} rows of {k} elements take {rb} bytes, got {w.shape[1]}")
    return w if writable else read_only_view(w)


# ---------------------------------------------------------------------------- reference


def dequantize_ref(w_raw: np.ndarray, qtype: QT, k: int) -> np.ndarray:
    """numpy reference: gguf-py's dequantizer, float32 ``[rows, k]``."""
    w = check_weight(w_raw, qtype, k)
    qtype = QT(qtype)
    if qtype == QT.F32:
        return w.view(np.float32).copy()
    if qtype == QT.F16:
        return w.view(np.float16).astype(np.float32)
    return gq.dequantize(w, qtype).astype(np.float32, copy=False)


# ---------------------------------------------------------------------------- decoders

_8, _16, _32 = np.float32(8), np.float32(16), np.float32(32)
# each decodes a whole row; block b starts at byte p of ``row`` and value o of ``out``


@njit(cache=True)
def _deq_q4_0(row, out):
    out_of_line()
    for b in range(out.shape[0] // 32):
        p, o = 18 * b, 32 * b
        d = f16_at(row, p)
        for j in range(16):
            q = row[p + 2 + j]
            out[o + j] = (b_f32(b_and(q, 15)) - _8) * d
            out[o + j + 16] = (b_f32(b_shr(q, 4)) - _8) * d


@njit(cache=True)
def _deq_q4_1(row, out):
    out_of_line()
    for b in range(out.shape[0] // 32):
        p, o = 20 * b, 32 * b
        d = f16_at(row, p)
        m = f16_at(row, p + 2)
        for j in range(16):
            q = row[p + 4 + j]
            out[o + j] = b_f32(b_and(q, 15)) * d + m
            out[o + j + 16] = b_f32(b_shr(q, 4)) * d + m


@njit(inline="always", cache=True)
def _q5(q, qh, j):
    """The two 5-bit values of byte j of a Q5 block: (low nibble | qh bit j << 4, high
    nibble | qh bit j+16 << 4), as uint8."""
    return (b_or(b_and(q, 15), b_shl(u32_bit(qh, j), 4)),
            b_or(b_shr(q, 4), b_shl(u32_bit(qh, j + 16), 4)))


@njit(cache=True)
def _deq_q5_0(row, out):
    out_of_line()
    for b in range(out.shape[0] // 32):
        p, o = 22 * b, 32 * b
        d = f16_at(row, p)
        qh = u32_at(row, p + 2)
        for j in range(16):
            lo, hi = _q5(row[p + 6 + j], qh, j)
            out[o + j] = (b_f32(lo) - _16) * d
            out[o + j + 16] = (b_f32(hi) - _16) * d


@njit(cache=True)
def _deq_q5_1(row, out):
    out_of_line()
    for b in range(out.shape[0] // 32):
        p, o = 24 * b, 32 * b
        d = f16_at(row, p)
        m = f16_at(row, p + 2)
        qh = u32_at(row, p + 4)
        for j in range(16):
            lo, hi = _q5(row[p + 8 + j], qh, j)
            out[o + j] = b_f32(lo) * d + m
            out[o + j + 16] = b_f32(hi) * d + m


@njit(cache=True)
def _deq_q8_0(row, out):
    out_of_line()
    for b in range(out.shape[0] // 32):
        p, o = 34 * b, 32 * b
        d = f16_at(row, p)
        for j in range(32):
            out[o + j] = sb_f32(row[p + 2 + j]) * d


@njit(cache=True)
def _deq_q2_k(row, out):
    out_of_line()
    for b in range(out.shape[0] // 256):
        p, o = 84 * b, 256 * b
        d = f16_at(row, p + 80)
        dmin = f16_at(row, p + 82)
        for n in range(2):                       # two halves of 128 values
            for h in range(2):                   # sub-blocks of 16; the 4 crumb planes of
                base = o + 128 * n + 16 * h      # each byte are written out (constant shifts)
                s0, s1 = row[p + 8 * n + h], row[p + 8 * n + 2 + h]
                s2, s3 = row[p + 8 * n + 4 + h], row[p + 8 * n + 6 + h]
                d0, m0 = d * b_f32(b_and(s0, 15)), dmin * b_f32(b_shr(s0, 4))
                d1, m1 = d * b_f32(b_and(s1, 15)), dmin * b_f32(b_shr(s1, 4))
                d2, m2 = d * b_f32(b_and(s2, 15)), dmin * b_f32(b_shr(s2, 4))
                d3, m3 = d * b_f32(b_and(s3, 15)), dmin * b_f32(b_shr(s3, 4))
                for l in range(16):
                    q = row[p + 16 + 32 * n + 16 * h + l]
                    out[base + l] = d0 * b_f32(b_and(q, 3)) - m0
                    out[base + 32 + l] = d1 * b_f32(b_and(b_shr(q, 2), 3)) - m1
                    out[base + 64 + l] = d2 * b_f32(b_and(b_shr(q, 4), 3)) - m2
                    out[base + 96 + l] = d3 * b_f32(b_shr(q, 6)) - m3


@njit(inline="always", cache=True)
def _q3_k_scale(row, p, j):
    """6-bit scale j (0..15) of a Q3_K block, minus 32 (ggml's kmask shuffle)."""
    sc = p + 96
    lo = (np.int32(row[sc + (j & 7)]) >> (4 * (j >> 3))) & 15
    hi = (np.int32(row[sc + 8 + (j & 3)]) >> (2 * (j >> 2))) & 3
    return (lo | (hi << 4)) - 32


@njit(inline="always", cache=True)
def q3_k_value(q, shift, hbyte, hmask):
    """A Q3_K value as float: 2 low bits of ``q >> shift``, minus 4 unless the hmask bit
    is set (``(lq | (set ? 4 : 0)) - 4`` in bytes, then a signed conversion)."""
    lq = b_and(b_shr(q, shift), 3)
    return sb_f32(b_sub(b_or(lq, b_and(b_test(hbyte, hmask), 4)), 4))


@njit(cache=True)
def _deq_q3_k(row, out):
    out_of_line()
    for b in range(out.shape[0] // 256):
        p, o = 110 * b, 256 * b
        d = f16_at(row, p + 108)
        for n in range(2):
            m = 1 << (4 * n)                     # hmask bit of plane 0; planes 1..3: << j
            for h in range(2):
                base = o + 128 * n + 16 * h
                d0 = d * np.float32(_q3_k_scale(row, p, 8 * n + h))
                d1 = d * np.float32(_q3_k_scale(row, p, 8 * n + 2 + h))
                d2 = d * np.float32(_q3_k_scale(row, p, 8 * n + 4 + h))
                d3 = d * np.float32(_q3_k_scale(row, p, 8 * n + 6 + h))
                for l in range(16):
                    q, hb = row[p + 32 + 32 * n + 16 * h + l], row[p + 16 * h + l]
                    out[base + l] = d0 * q3_k_value(q, 0, hb, m)
                    out[base + 32 + l] = d1 * q3_k_value(q, 2, hb, m << 1)
                    out[base + 64 + l] = d2 * q3_k_value(q, 4, hb, m << 2)
                    out[base + 96 + l] = d3 * q3_k_value(q, 6, hb, m << 3)


@njit(inline="always", cache=True)
def scale_min_k4(row, sc, j):
    """ggml get_scale_min_k4: 6-bit (scale, min) of sub-block j of a Q4_K/Q5_K block
    whose 12 scale bytes start at ``sc``."""
    if j < 4:
        return np.int32(row[sc + j]) & 63, np.int32(row[sc + j + 4]) & 63
    s = (np.int32(row[sc + j + 4]) & 15) | ((np.int32(row[sc + j - 4]) >> 6) << 4)
    m = (np.int32(row[sc + j + 4]) >> 4) | ((np.int32(row[sc + j]) >> 6) << 4)
    return s, m


@njit(cache=True)
def _deq_q4_k(row, out):
    out_of_line()
    for b in range(out.shape[0] // 256):
        p, o = 144 * b, 256 * b
        d = f16_at(row, p)
        dmin = f16_at(row, p + 2)
        for j in range(4):                       # 64 values per pair of sub-blocks
            s1, m1 = scale_min_k4(row, p + 4, 2 * j)
            s2, m2 = scale_min_k4(row, p + 4, 2 * j + 1)
            d1, d2 = d * np.float32(s1), d * np.float32(s2)
            c1, c2 = dmin * np.float32(m1), dmin * np.float32(m2)
            for l in range(32):
                q = row[p + 16 + 32 * j + l]
                out[o + 64 * j + l] = d1 * b_f32(b_and(q, 15)) - c1
                out[o + 64 * j + 32 + l] = d2 * b_f32(b_shr(q, 4)) - c2


@njit(inline="always", cache=True)
def q5_k_values(q, h, hm1, hm2):
    """The two 5-bit values of a Q5_K qs byte, high bits from qh byte ``h`` masks."""
    return (b_or(b_and(q, 15), b_and(b_test(h, hm1), 16)),
            b_or(b_shr(q, 4), b_and(b_test(h, hm2), 16)))


@njit(cache=True)
def _deq_q5_k(row, out):
    out_of_line()
    for b in range(out.shape[0] // 256):
        p, o = 176 * b, 256 * b
        d = f16_at(row, p)
        dmin = f16_at(row, p + 2)
        for j in range(4):
            s1, m1 = scale_min_k4(row, p + 4, 2 * j)
            s2, m2 = scale_min_k4(row, p + 4, 2 * j + 1)
            d1, d2 = d * np.float32(s1), d * np.float32(s2)
            c1, c2 = dmin * np.float32(m1), dmin * np.float32(m2)
            hm1, hm2 = 1 << (2 * j), 2 << (2 * j)        # qh bits of the two sub-blocks
            for l in range(32):
                lo, hi = q5_k_values(row[p + 48 + 32 * j + l], row[p + 16 + l], hm1, hm2)
                out[o + 64 * j + l] = d1 * b_f32(lo) - c1
                out[o + 64 * j + 32 + l] = d2 * b_f32(hi) - c2


@njit(inline="always", cache=True)
def q6_k_values(a, c, hh):
    """The four 6-bit values (before -32) from ql bytes a = ql[l], c = ql[l+32] and
    qh byte hh = qh[l]: for outputs l, l+32, l+64, l+96 of a 128-half."""
    return (b_or(b_and(a, 15), b_shl(b_and(hh, 3), 4)),
            b_or(b_and(c, 15), b_shl(b_and(b_shr(hh, 2), 3), 4)),
            b_or(b_shr(a, 4), b_shl(b_and(b_shr(hh, 4), 3), 4)),
            b_or(b_shr(c, 4), b_shl(b_shr(hh, 6), 4)))


@njit(cache=True)
def _deq_q6_k(row, out):
    out_of_line()
    for b in range(out.shape[0] // 256):
        p, o = 210 * b, 256 * b
        d = f16_at(row, p + 208)
        for n in range(2):
            ql, qh, sc = p + 64 * n, p + 128 + 32 * n, p + 192 + 8 * n
            for h in range(2):                   # l in [0,16) uses scale is=0, [16,32) is=1
                d1 = d * sb_f32(row[sc + h])
                d2 = d * sb_f32(row[sc + h + 2])
                d3 = d * sb_f32(row[sc + h + 4])
                d4 = d * sb_f32(row[sc + h + 6])
                for i in range(16):
                    l = 16 * h + i
                    q1, q2, q3, q4 = q6_k_values(row[ql + l], row[ql + l + 32], row[qh + l])
                    base = o + 128 * n + l
                    out[base] = d1 * (b_f32(q1) - _32)
                    out[base + 32] = d2 * (b_f32(q2) - _32)
                    out[base + 64] = d3 * (b_f32(q3) - _32)
                    out[base + 96] = d4 * (b_f32(q4) - _32)


@njit(inline="always", cache=True)
def dequantize_row(code, row, out):
    """Decode one raw row (uint8) of weight type ``code`` into float32 ``out[K]``."""
    k = out.shape[0]
    if code == F32:
        v = row.view(np.float32)
        for i in range(k):
            out[i] = v[i]
    elif code == F16:
        v = row.view(np.uint16)
        for i in range(k):
            out[i] = f16_to_f32(v[i])
    elif code == BF16:
        v = row.view(np.uint16)
        for i in range(k):
            out[i] = bf16_to_f32(v[i])
    elif code == Q4_0:
        _deq_q4_0(row, out)
    elif code == Q4_1:
        _deq_q4_1(row, out)
    elif code == Q5_0:
        _deq_q5_0(row, out)
    elif code == Q5_1:
        _deq_q5_1(row, out)
    elif code == Q8_0:
        _deq_q8_0(row, out)
    elif code == Q2_K:
        _deq_q2_k(row, out)
    elif code == Q3_K:
        _deq_q3_k(row, out)
    elif code == Q4_K:
        _deq_q4_k(row, out)
    elif code == Q5_K:
        _deq_q5_k(row, out)
    elif code == Q6_K:
        _deq_q6_k(row, out)


# ---------------------------------------------------------------------------- activations


@njit(inline="always", cache=True)
def _q8_block(x, i0, n, x86, qs_out, q0):
    """Quantize x[i0:i0+n] to int8 with amax/127 scaling; return (d as f16 bits, sum q)."""
    amax = np.float32(0.0)
    for j in range(n):
        amax = max(amax, abs(x[i0 + j]))
    d = amax / np.float32(127.0)
    if x86:   # arch/x86/quants.c: id = 127/amax, _mm256_round_ps(NEAREST) = ties to even
        iv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
    else:     # quantize_row_q8_0_ref: id = 1/d, roundf = ties away from zero
        iv = np.float32(1.0) / d if d != np.float32(0.0) else np.float32(0.0)
    s = 0
    for j in range(n):
        v = x[i0 + j] * iv
        if x86:
            q = np.int32(np.rint(v))
        else:
            a = abs(v)                       # gguf np_roundf: exact for every float
            fa = np.floor(a)
            q = np.int32(np.sign(v) * (fa + np.floor(np.float32(2.0) * (a - fa))))
        qs_out[q0 + j] = np.int8(q)
        s += q
    return f32_to_f16(d), s, d


@njit(inline="always", cache=True)
def _abs_f32(v):
    """|v| of float32 lanes (the sign bit cleared)."""
    return S.bitcast(S.bitcast(v, "u32") & np.uint32(0x7FFFFFFF), "f32")


@njit(inline="always", cache=True)
def _q8_block_x86(x, i0, qs_out, q0):
    """:func:`_q8_block` with ``x86`` for the 32 values at x[i0] (x a C-contiguous row),
    16 float32 lanes at a time: the same amax, ``127/amax`` and ties-to-even rounding
    (arch/x86/quants.c quantize_row_q8_0/q8_1), so the same bytes; ~10x the scalar
    loop's speed (kernels/README.md)."""
    v0 = S.load(x, 4 * i0, 16, "f32")
    v1 = S.load(x, 4 * i0 + 64, 16, "f32")
    amax = S.reduce_max(S.vmax(_abs_f32(v0), _abs_f32(v1)))
    d = amax / np.float32(127.0)
    iv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
    q0v = S.convert(S.rint(v0 * iv), "i32")
    q1v = S.convert(S.rint(v1 * iv), "i32")
    S.store(qs_out, q0, S.convert(q0v, "i8"))
    S.store(qs_out, q0 + 16, S.convert(q1v, "i8"))
    return f32_to_f16(d), S.hsum(q0v + q1v), d


@njit(cache=True)
def quantize_row_q8_0(x, out, x86):
    """float32 x[K] -> raw Q8_0 blocks out[K/32*34] (uint8); x86 rounding on a
    contiguous x takes :func:`_q8_block_x86`."""
    qs = out.view(np.int8)
    vec = x86 and x.strides[0] == 4
    for b in range(x.shape[0] // 32):
        if vec:
            dh, s, d = _q8_block_x86(x, 32 * b, qs, 34 * b + 2)
        else:
            dh, s, d = _q8_block(x, 32 * b, 32, x86, qs, 34 * b + 2)
        out[34 * b] = np.uint8(dh & 0xFF)
        out[34 * b + 1] = np.uint8(dh >> 8)


@njit(cache=True)
def quantize_row_q8_1(x, out, x86):
    """float32 x[K] -> raw Q8_1 blocks out[K/32*36]: d, s = d*sum(qs), qs."""
    qs = out.view(np.int8)
    vec = x86 and x.strides[0] == 4
    for b in range(x.shape[0] // 32):
        if vec:
            dh, s, d = _q8_block_x86(x, 32 * b, qs, 36 * b + 4)
        else:
            dh, s, d = _q8_block(x, 32 * b, 32, x86, qs, 36 * b + 4)
        sh = f32_to_f16(np.float32(s) * d)
        out[36 * b] = np.uint8(dh & 0xFF)
        out[36 * b + 1] = np.uint8(dh >> 8)
        out[36 * b + 2] = np.uint8(sh & 0xFF)
        out[36 * b + 3] = np.uint8(sh >> 8)


@njit(cache=True)
def _quantize_row_q8_k_scalar(x, out):
    """:func:`quantize_row_q8_k` one value at a time (any stride of x)."""
    qs = out.view(np.int8)
    for b in range(x.shape[0] // 256):
        p = 292 * b
        x0 = 256 * b
        amax = np.float32(0.0)
        mx = np.float32(0.0)
        for j in range(256):           # signed value of the first largest |x|
            ax = abs(x[x0 + j])
            if ax > amax:
                amax = ax
                mx = x[x0 + j]
        if amax == np.float32(0.0):
            for j in range(292):
                out[p + j] = 0
            continue
        iscale = np.float32(-127.0) / mx
        for j in range(256):           # nearest_int: round half to even
            v = np.int32(np.rint(iscale * x[x0 + j]))
            qs[p + 4 + j] = np.int8(min(127, v))
        db = f32_bits(np.float32(1.0) / iscale)
        for j in range(4):
            out[p + j] = np.uint8((db >> np.uint32(8 * j)) & np.uint32(0xFF))
        for g in range(16):
            t = 0
            for j in range(16):
                t += np.int32(qs[p + 4 + 16 * g + j])
            out[p + 260 + 2 * g] = np.uint8(t & 0xFF)
            out[p + 261 + 2 * g] = np.uint8((t >> 8) & 0xFF)


@njit(cache=True)
def quantize_row_q8_k(x, out):
    """float32 x[K] -> raw Q8_K blocks out[K/256*292] (quantize_row_q8_K_ref), 16
    float32 lanes at a time (each 16-lane chunk is one bsums group) where x is
    contiguous, else :func:`_quantize_row_q8_k_scalar`."""
    if x.strides[0] != 4:
        _quantize_row_q8_k_scalar(x, out)
        return
    qs = out.view(np.int8)
    for b in range(x.shape[0] // 256):
        p = 292 * b
        x0 = 256 * b
        vm = _abs_f32(S.load(x, 4 * x0, 16, "f32"))
        for c in range(1, 16):
            vm = S.vmax(vm, _abs_f32(S.load(x, 4 * (x0 + 16 * c), 16, "f32")))
        amax = S.reduce_max(vm)
        if amax == np.float32(0.0):
            for j in range(292):
                out[p + j] = 0
            continue
        j0 = 0                         # first chunk holding amax, then its first lane
        while S.reduce_max(_abs_f32(S.load(x, 4 * (x0 + j0), 16, "f32"))) != amax:
            j0 += 16
        while abs(x[x0 + j0]) != amax:
            j0 += 1
        iscale = np.float32(-127.0) / x[x0 + j0]     # mx: signed value of the first largest |x|
        top = S.splat(127, 16, "i32")
        for c in range(16):            # nearest_int: round half to even
            q = S.vmin(S.convert(S.rint(S.load(x, 4 * (x0 + 16 * c), 16, "f32") * iscale),
                                 "i32"), top)
            S.store(qs, p + 4 + 16 * c, S.convert(q, "i8"))
            S.store_at(out, p + 260 + 2 * c, S.hsum(q), "i16")
        S.store_at(out, p, np.float32(1.0) / iscale, "f32")


@njit(cache=True)
def quantize_row_f16(x, out):
    """float32 x[K] -> uint16 halves (ggml_cpu_fp32_to_fp16: ties to even)."""
    for i in range(x.shape[0]):
        out[i] = f32_to_f16(x[i])


@njit(cache=True)
def quantize_row_bf16(x, out):
    """float32 x[K] -> uint16 bfloat16 (ggml_cpu_fp32_to_bf16)."""
    for i in range(x.shape[0]):
        out[i] = f32_to_bf16(x[i])


def quantize_q8_0_ref(x: np.ndarray, x86: bool = True) -> np.ndarray:
    """numpy reference of :func:`quantize_row_q8_0` on ``[rows, K]`` -> raw blocks."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not x86:
        return gq.quantize(x, QT.Q8_0)            # bit exact with quantize_row_q8_0_ref
    d, q = _q8_ref_parts(x)
    return np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)],
                          axis=-1).reshape(*x.shape[:-1], -1)


def quantize_q8_1_ref(x: np.ndarray, x86: bool = True) -> np.ndarray:
    """numpy reference of :func:`quantize_row_q8_1` on ``[rows, K]`` -> raw blocks."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    d, q = _q8_ref_parts(x, x86)
    s = (q.astype(np.int32).sum(-1, keepdims=True).astype(np.float32) * d)
    return np.concatenate([d.astype(np.float16).view(np.uint8), s.astype(np.float16).view(np.uint8),
                           q.view(np.uint8)], axis=-1).reshape(*x.shape[:-1], -1)


def _q8_ref_parts(x: np.ndarray, x86: bool = True) -> tuple[np.ndarray, np.ndarray]:
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        if x86:
            iv = np.where(amax == 0, np.float32(0), np.float32(127) / amax).astype(np.float32)
            q = np.rint(b * iv)
        else:
            iv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
            q = gq.np_roundf(b * iv)
    return d, q.astype(np.int8)


def quantize_q8_k_ref(x: np.ndarray) -> np.ndarray:
    """numpy reference of :func:`quantize_row_q8_k` on ``[rows, K]`` -> raw blocks."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    b = x.reshape(-1, 256)
    idx = np.abs(b).argmax(-1)                     # first index of the largest |x|
    mx = b[np.arange(b.shape[0]), idx][:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (np.float32(-127) / mx).astype(np.float32)
        q = np.minimum(127, np.rint((iscale * b).astype(np.float32))).astype(np.int8)
        d = (np.float32(1) / iscale).astype(np.float32)
    zero = mx == 0
    q = np.where(zero, 0, q).astype(np.int8)
    d = np.where(zero, np.float32(0), d).astype(np.float32)
    bsums = q.reshape(-1, 16, 16).astype(np.int32).sum(-1).astype(np.int16)
    out = np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)], axis=-1)
    return out.reshape(*x.shape[:-1], -1)


@njit(cache=True)
def quantize_row(x, code, x86, out):
    """One float32 row -> raw bytes of the activation type ``code`` (Q8_0, Q8_1, Q8_K,
    F16, BF16), serially: what matmul kernels call once per activation row."""
    if code == Q8_0:
        quantize_row_q8_0(x, out, x86)
    elif code == Q8_1:
        quantize_row_q8_1(x, out, x86)
    elif code == Q8_K:
        quantize_row_q8_k(x, out)
    elif code == F16:
        quantize_row_f16(x, out.view(np.uint16))
    elif code == BF16:
        quantize_row_bf16(x, out.view(np.uint16))


@njit(parallel=True, cache=True)
def _quantize_rows(x, code, x86, out):
    for r in prange(x.shape[0]):
        quantize_row(x[r], code, x86, out[r])


def quantize_activations(x: np.ndarray, qtype: QT, x86: bool = True) -> np.ndarray:
    """float32 ``[N, K]`` -> raw rows of ``qtype`` (a vec_dot_type), uint8 ``[N, bytes]``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    qtype = QT(qtype)
    if qtype not in (QT.Q8_0, QT.Q8_1, QT.Q8_K, QT.F16, QT.BF16, QT.F32):
        raise ValueError(f"{qtype.name} is not an activation (vec_dot) type")
    if qtype == QT.F32:
        return x.view(np.uint8)
    out = np.empty((x.shape[0], row_bytes(qtype, x.shape[1])), dtype=np.uint8)
    _quantize_rows(x, np.int64(qtype), x86, out)
    return out


def quantize_activations_ref(x: np.ndarray, qtype: QT, x86: bool = True) -> np.ndarray:
    """numpy reference of :func:`quantize_activations`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    qtype = QT(qtype)
    if qtype == QT.Q8_0:
        return quantize_q8_0_ref(x, x86)
    if qtype == QT.Q8_1:
        return quantize_q8_1_ref(x, x86)
    if qtype == QT.Q8_K:
        return quantize_q8_k_ref(x)
    if qtype == QT.F16:
        return x.astype(np.float16).view(np.uint8)
    if qtype == QT.BF16:
        return bf16_round_ref(x).view(np.uint8)
    return x.view(np.uint8)
