"""Quantized matrix x matrix (prompt processing): ggml's block dots with one int32 lane
per weight row, 16 rows at a time, each weight block unpacked once per call.

For N activation rows (N > ``matmul.MATVEC_MAX_N``) the matrix-vector kernels unpack
every weight block N times, once per activation row. Here the weights are taken in
**panels of 16 rows**: a panel's blocks are unpacked once into its codes, interleaved
so that one 64-byte vector holds 4 consecutive codes of the same block of each of the
16 rows (``panel[512 b + 64 k + 4 r + e]`` = code ``4 k + e`` of block ``b`` of row
``r``). One ``vpdpbusd`` of that vector with 4 bytes of one activation row broadcast to
all lanes adds 4 products into each row's int32 lane; 8 of them are the block's integer
sum for 16 rows, 4 activation rows sharing every weight load. The float part then runs
with lanes = rows, block after block, so each output sees ggml's generic operations in
ggml's order (``sumf += term`` from ``sumf = 0``, term as ``ggml_vec_dot_<w>_q8_0/1``):

=====  ============  =========================================  ===========================
type   code (u8)     integer sum (``off`` per activation block)  term
=====  ============  =========================================  ===========================
Q4_0   nibble        dot - 8 * sum(q)                            ``(sumi * dx) * dy``
Q5_0   nibble | h    dot - 16 * sum(q)                           ``(dx * dy) * sumi``
Q4_1   nibble        dot                                         ``(dx * dy) * sumi + m * s``
Q5_1   nibble | h    dot                                         ``(dx * dy) * sumi + m * s``
=====  ============  =========================================  ===========================

Q4_K and Q6_K have their own panels (below). Integer sums are exact in any order, so
the results are bit for bit those of :func:`.matmul.mul_mat_ggml`
(``tests/test_kernels.py``). Codes are at most 31 (K-quants: 63) against activations in
[-127, 127], so no 16-bit pair sum saturates where ``dpbusd`` is emulated (:mod:`.simd`). Threads take panels (``prange``); a panel's codes (512 bytes a
block) stay in L1 while all activation rows pass over them.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit, prange

from graphcost.format import ggml_types as gt

from . import simd as S
from .bits import f16_to_f32, u32_at
from .quants import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q6_K, scale_min_k4

#: weight rows per panel (the int32 lanes of one vector)
ROWS = 16
#: activation rows per micro-tile (they share each weight vector)
ACTS = 4


def _block_bytes(code: int) -> int:
    """Bytes per block of type ``code`` (graphcost.format.ggml_types: gguf's
    GGML_QUANT_SIZES, Q8_1 as in ggml)."""
    return gt.block(QT(code))[1]


#: weight types with a kernel here: (quants offset, qh offset or -1) within a block
LAYOUT = {Q4_0: (2, -1), Q5_0: (6, 2), Q4_1: (4, -1), Q5_1: (8, 4)}
#: what the kernels read, indexed by type code: (block bytes, quants offset, qh offset or
#: -1, bytes per block of the activations' vec_dot_type: Q8_0 34 / Q8_1 36)
LAYOUT_ARRAYS = np.zeros((max(LAYOUT) + 1, 4), dtype=np.int64)
for _c, (_qs, _qh) in LAYOUT.items():
    LAYOUT_ARRAYS[_c] = (_block_bytes(_c), _qs, _qh, _block_bytes(gt.vec_dot_type(QT(_c))))
CODES = tuple(LAYOUT) + (Q4_K, Q6_K)


@njit(inline="always", cache=True)
def _store8(panel, o, u):
    """The 8 uint32 lanes of ``u`` at panel bytes o, o + 64, ..., o + 448 (one row's 4
    codes in each of 8 consecutive vectors)."""
    S.store_at(panel, o, S.lane(u, 0), "u32")
    S.store_at(panel, o + 64, S.lane(u, 1), "u32")
    S.store_at(panel, o + 128, S.lane(u, 2), "u32")
    S.store_at(panel, o + 192, S.lane(u, 3), "u32")
    S.store_at(panel, o + 256, S.lane(u, 4), "u32")
    S.store_at(panel, o + 320, S.lane(u, 5), "u32")
    S.store_at(panel, o + 384, S.lane(u, 6), "u32")
    S.store_at(panel, o + 448, S.lane(u, 7), "u32")


@njit(cache=True)
def _pack_panel(w, r0, code, panel, dw, mw):
    """Unpack rows r0..r0+15 of ``w`` (zeros past its last row) into ``panel`` (codes,
    interleaved as the module doc says), ``dw`` (float32 d, [block, row]) and ``mw``
    (float32 m of Q4_1/Q5_1, [block, row])."""
    size, qs, qh_at = LAYOUT_ARRAYS[code, 0], LAYOUT_ARRAYS[code, 1], LAYOUT_ARRAYS[code, 2]
    nb = w.shape[1] // size
    nr = min(ROWS, w.shape[0] - r0)
    if nr < ROWS:
        panel[:] = 0
        dw[:] = 0
        mw[:] = 0
    for r in range(nr):
        row = w[r0 + r]
        for b in range(nb):
            p, o = size * b, 512 * b + 4 * r
            dw[ROWS * b + r] = S.half_at(row, p)
            if code == Q4_1 or code == Q5_1:
                mw[ROWS * b + r] = S.half_at(row, p + 2)
            q = S.load(row, p + qs, 16, "u8")
            c = S.concat(q & 15, q >> 4)                 # values 0..31 of the block
            if qh_at >= 0:
                c = S.or_where(c, u32_at(row, p + qh_at), 16)
            _store8(panel, o, S.bitcast(c, "u32"))      # 4 codes per lane


@njit(cache=True)
def _prep_acts(yq, code, yv, dy, sy, sf):
    """Activation rows quantized to Q8_0/Q8_1 (``yq``) -> their quants ``yv`` (int8, in
    order) and per block ``dy`` (float32 d), ``sy`` (int32 ``-off``, Q4_0/Q5_0), ``sf``
    (the Q8_1 ``s`` as float32, Q4_1/Q5_1)."""
    ysize = LAYOUT_ARRAYS[code, 3]
    q = yq.view(np.int8)
    nb = yv.shape[1] // 32
    off = 8 if code == Q4_0 else 16
    for n in range(yq.shape[0]):
        for b in range(nb):
            p = ysize * b
            dy[n, b] = f16_to_f32(np.uint16(yq[n, p]) | (np.uint16(yq[n, p + 1]) << 8))
            t = 0
            for j in range(32):
                v = q[n, p + ysize - 32 + j]
                yv[n, 32 * b + j] = v
                t += np.int64(v)
            if code == Q4_1 or code == Q5_1:
                s = f16_to_f32(np.uint16(yq[n, p + 2]) | (np.uint16(yq[n, p + 3]) << 8))
                sf[n, b] = s
            else:
                sy[n, b] = -off * t


@njit(inline="always", cache=True)
def _bcast(row, p):
    """The 4 int8 at byte ``p`` of ``row`` repeated in all 16 int32 lanes."""
    return S.bitcast(S.splat(S.scalar_at(row, p, "i32"), 16, "i32"), "i8")


@njit(inline="always", cache=True)
def _term(code, dwv, mwv, dy, sy, sf, acc):
    """The 16 rows' float term of one block for one activation row (ggml's expression)."""
    if code == Q4_0:
        return (S.convert(acc + sy, "f32") * dwv) * dy
    if code == Q5_0:
        return (dwv * dy) * S.convert(acc + sy, "f32")
    return (dwv * dy) * S.convert(acc, "f32") + mwv * sf


@njit(inline="always", cache=True)
def _tile(code, panel, dw, mw, yv, dy, sy, sf, a0, y, r0, nr):
    """y[a0..a0+3, r0..r0+nr) from one packed panel."""
    nb = yv.shape[1] // 32
    s0, s1 = S.zeros(16, "f32"), S.zeros(16, "f32")
    s2, s3 = S.zeros(16, "f32"), S.zeros(16, "f32")
    y0, y1, y2, y3 = yv[a0], yv[a0 + 1], yv[a0 + 2], yv[a0 + 3]
    for b in range(nb):
        c0, c1 = S.zeros(16, "i32"), S.zeros(16, "i32")
        c2, c3 = S.zeros(16, "i32"), S.zeros(16, "i32")
        for k in range(8):
            wv = S.load(panel, 512 * b + 64 * k, 64, "u8")
            p = 32 * b + 4 * k
            c0 = S.dpbusd(c0, wv, _bcast(y0, p))
            c1 = S.dpbusd(c1, wv, _bcast(y1, p))
            c2 = S.dpbusd(c2, wv, _bcast(y2, p))
            c3 = S.dpbusd(c3, wv, _bcast(y3, p))
        dwv = S.load(dw, 64 * b, 16, "f32")
        mwv = S.load(mw, 64 * b, 16, "f32")
        s0 = s0 + _term(code, dwv, mwv, dy[a0, b], sy[a0, b], sf[a0, b], c0)
        s1 = s1 + _term(code, dwv, mwv, dy[a0 + 1, b], sy[a0 + 1, b], sf[a0 + 1, b], c1)
        s2 = s2 + _term(code, dwv, mwv, dy[a0 + 2, b], sy[a0 + 2, b], sf[a0 + 2, b], c2)
        s3 = s3 + _term(code, dwv, mwv, dy[a0 + 3, b], sy[a0 + 3, b], sf[a0 + 3, b], c3)
    _put(y[a0], r0, nr, s0)
    _put(y[a0 + 1], r0, nr, s1)
    _put(y[a0 + 2], r0, nr, s2)
    _put(y[a0 + 3], r0, nr, s3)


@njit(inline="always", cache=True)
def _put(yrow, r0, nr, s):
    if nr == ROWS:
        S.store(yrow, 4 * r0, s)
    else:
        t = np.empty(ROWS, dtype=np.float32)
        S.store(t, 0, s)
        for r in range(nr):
            yrow[r0 + r] = t[r]


@njit(parallel=True, cache=True)
def _gemm(w, code, yq, y):
    n, m = y.shape
    nb = w.shape[1] // LAYOUT_ARRAYS[code, 0]
    k = 32 * nb
    n4 = (n + ACTS - 1) // ACTS * ACTS          # activation rows padded to the tile
    yv = np.zeros((n4, k), dtype=np.int8)
    dy = np.zeros((n4, nb), dtype=np.float32)
    sy = np.zeros((n4, nb), dtype=np.int32)
    sf = np.zeros((n4, nb), dtype=np.float32)
    _prep_acts(yq, code, yv, dy, sy, sf)
    yt = np.empty((n4, m), dtype=np.float32) if n4 != n else y
    for g in prange((m + ROWS - 1) // ROWS):
        r0 = g * ROWS
        panel = np.empty(512 * nb, dtype=np.uint8)
        dw = np.empty(ROWS * nb, dtype=np.float32)
        mw = np.empty(ROWS * nb, dtype=np.float32)
        _pack_panel(w, r0, code, panel, dw, mw)
        nr = min(ROWS, m - r0)
        for a0 in range(0, n4, ACTS):
            _tile(code, panel, dw, mw, yv, dy, sy, sf, a0, yt, r0, nr)
    if n4 != n:
        y[:] = yt[:n]


# ---------------------------------------------------------------------------- Q4_K, Q6_K
# ggml_vec_dot_q4_K_q8_K / q6_K_q8_K (generic): per super-block of 256, aux32[l] sums
# scale * y_k * a_k over the values k of class l = k % 8 (Q4_K: a = code, scale of the
# 32-value sub-block; Q6_K: a = code - 32, scale of the 16-value sub-block); sums[l] +=
# (d * dy) * aux32[l]; Q4_K also sumf -= (dmin * dy) * sum_j bsums[j] * min_{j/2}; the
# result is sumf + sums[0] + ... + sums[7] (Q6_K: from sumf = 0).
#
# A panel holds, per super-block, 64 vectors (32 values h, class l): the 4 codes 8 t + l
# (t < 4) of group h of each of the 16 rows. Q4_K: one vpdpbusd with the activation's 4
# class-l bytes broadcast is that dot for 16 rows, one vpdpwssd scales it into aux32[l]
# (dots below 2**15, scales below 64: exact). Q6_K: codes t = 0, 1 belong to sub-block
# 2h, t = 2, 3 to 2h + 1; vpmaddubsw makes the two pair sums, minus 32 * (their
# activations' sum), and one vpdpwssd with the rows' (scale[2h], scale[2h + 1]) adds both
# (pair sums within 2**15: codes < 64, |y| <= 127).

#: a 64-byte pair of 32-value groups -> per group 8 int32 lanes, lane l = its codes l,
#: 8 + l, 16 + l, 24 + l
_CLASSES2 = S.permutation([32 * h + 8 * t + c for h in range(2) for c in range(8)
                           for t in range(4)])
#: bytes per super-block of the K-quant weights with a kernel here (Q4_K 144, Q6_K 210)
Q4_K_BYTES, Q6_K_BYTES = _block_bytes(Q4_K), _block_bytes(Q6_K)


@njit(inline="always", cache=True)
def _store16(panel, o, u):
    """The 16 uint32 lanes of ``u`` at panel bytes o, o + 64, ..., o + 960 (one row's
    4 codes in each of 16 consecutive class vectors)."""
    _store8(panel, o, S.lanes(u, 0, 8))
    _store8(panel, o + 512, S.lanes(u, 8, 8))


@njit(inline="always", cache=True)
def _unpack_q4_k(row, p, r, i, panel, sc, mn, dd):
    # d@0 dmin@2 scales@4 qs@16, 144 B; sub-block 2g: low nibbles of qs[32g..], 2g+1 high
    dd[2 * ROWS * i + r] = S.half_at(row, p)
    dd[2 * ROWS * i + ROWS + r] = S.half_at(row, p + 2)
    for j in range(8):
        a, b = scale_min_k4(row, p + 4, j)
        sc[ROWS * (8 * i + j) + r] = a
        mn[ROWS * (8 * i + j) + r] = b
    for g in range(4):
        q = S.load(row, p + 16 + 32 * g, 32, "u8")
        _store16(panel, 4096 * i + 1024 * g + 4 * r,
                 S.bitcast(_CLASSES2(S.concat(q & 15, q >> 4)), "u32"))


@njit(inline="always", cache=True)
def _unpack_q6_k(row, p, r, i, panel, sc, dd):
    # ql@0 qh@128 scales:i8@192 d@208, 210 B; value 128 n + 32 t + l: ql byte 64 n + l +
    # 32 (t % 2), nibble t // 2; qh byte 128 + 32 n + l, bits 2 t
    dd[2 * ROWS * i + r] = S.half_at(row, p + 208)
    for h in range(8):
        lo = np.int32(S.scalar_at(row, p + 192 + 2 * h, "i8")) & 0xFFFF
        hi = np.int32(S.scalar_at(row, p + 193 + 2 * h, "i8"))
        sc[ROWS * (8 * i + h) + r] = lo | (hi << 16)
    for g in range(4):              # groups 2g, 2g + 1: half n = g // 2, quarters t, t + 1
        n = g // 2
        qh = S.load(row, p + 128 + 32 * n, 32, "u8")
        ql0 = S.load(row, p + 64 * n, 32, "u8")
        ql1 = S.load(row, p + 64 * n + 32, 32, "u8")
        if g % 2 == 0:
            c0 = (ql0 & 15) | ((qh & 3) << 4)
            c1 = (ql1 & 15) | (((qh >> 2) & 3) << 4)
        else:
            c0 = (ql0 >> 4) | (((qh >> 4) & 3) << 4)
            c1 = (ql1 >> 4) | (((qh >> 6) & 3) << 4)
        _store16(panel, 4096 * i + 1024 * g + 4 * r,
                 S.bitcast(_CLASSES2(S.concat(c0, c1)), "u32"))


@njit(cache=True)
def _pack_panel_k(w, r0, code, panel, sc, mn, dd):
    """Rows r0..r0+15 of Q4_K/Q6_K ``w`` -> ``panel`` (codes, 4096 bytes a super-block:
    vector 8 h + l), ``sc`` (int32 per [super-block, 8 groups, row]: Q4_K the sub-block
    scale, Q6_K the int16 pair of its two scales), ``mn`` (Q4_K mins, same layout),
    ``dd`` (float32 d, dmin per [super-block, 2, row]); zeros past the last row."""
    size = Q4_K_BYTES if code == Q4_K else Q6_K_BYTES
    nr = min(ROWS, w.shape[0] - r0)
    if nr < ROWS:
        panel[:] = 0
        sc[:] = 0
        mn[:] = 0
        dd[:] = 0
    for r in range(nr):
        row = w[r0 + r]
        for i in range(w.shape[1] // size):
            if code == Q4_K:
                _unpack_q4_k(row, size * i, r, i, panel, sc, mn, dd)
            else:
                _unpack_q6_k(row, size * i, r, i, panel, sc, dd)


@njit(cache=True)
def _prep_acts_k(yq, yc, dy, bsp, off):
    """Q8_K activation rows -> ``yc`` (int8, each 32 values in class order: byte 4 l + t
    = value 8 t + l), ``dy`` (float32 d per super-block), ``bsp`` (int32 bsums[2 s] +
    bsums[2 s + 1], [super-block, s]) and ``off`` (the int16 pair 32 * (y[l] + y[8 + l]),
    32 * (y[16 + l] + y[24 + l]) of each group and class as int32: Q6_K's offsets)."""
    q = yq.view(np.int8)
    nsb = yq.shape[1] // 292
    for n in range(yq.shape[0]):
        for i in range(nsb):
            p = 292 * i
            dy[n, i] = S.scalar_at(yq[n], p, "f32")
            for s in range(8):
                bsp[n, 8 * i + s] = (np.int32(S.scalar_at(yq[n], p + 260 + 4 * s, "i16"))
                                     + np.int32(S.scalar_at(yq[n], p + 262 + 4 * s, "i16")))
            for h in range(8):
                for l in range(8):
                    c = 256 * i + 32 * h + 4 * l
                    for t in range(4):
                        yc[n, c + t] = q[n, p + 4 + 32 * h + 8 * t + l]
                    a = 32 * (np.int32(yc[n, c]) + np.int32(yc[n, c + 1]))
                    b = 32 * (np.int32(yc[n, c + 2]) + np.int32(yc[n, c + 3]))
                    off[n, 64 * i + 8 * h + l] = (a & 0xFFFF) | (b << 16)


@njit(inline="always", cache=True)
def _class_dot(code, acc, panel, o, yc, p, off, q, scales):
    """acc + scales * (16 rows' class dot of the panel vector at byte o with activation
    bytes p..p+3); Q6_K: pair sums minus the offsets ``off[q]``, a scale per pair."""
    w = S.load(panel, o, 64, "u8")
    if code == Q4_K:
        t = S.bitcast(S.dpbusd(S.zeros(16, "i32"), w, _bcast(yc, p)), "i16")
    else:
        t = S.maddubs(w, _bcast(yc, p)) - S.bitcast(S.splat(off[q], 16, "i32"), "i16")
    return S.dpwssd(acc, t, scales)


@njit(inline="always", cache=True)
def _row_k(code, panel, sc, mn, dd, yc, dy, bsp, off, yrow, r0, nr):
    """One activation row against a packed Q4_K/Q6_K panel -> yrow[r0..r0+nr)."""
    sumf = S.zeros(16, "f32")
    s0, s1, s2, s3 = S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(16, "f32")
    s4, s5, s6, s7 = S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(16, "f32")
    for i in range(dy.shape[0]):
        z = S.zeros(16, "i32")
        a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
        for h in range(8):
            sch = S.bitcast(S.load(sc, 64 * (8 * i + h), 16, "i32"), "i16")
            o, p, q = 4096 * i + 512 * h, 256 * i + 32 * h, 64 * i + 8 * h
            a0 = _class_dot(code, a0, panel, o, yc, p, off, q, sch)
            a1 = _class_dot(code, a1, panel, o + 64, yc, p + 4, off, q + 1, sch)
            a2 = _class_dot(code, a2, panel, o + 128, yc, p + 8, off, q + 2, sch)
            a3 = _class_dot(code, a3, panel, o + 192, yc, p + 12, off, q + 3, sch)
            a4 = _class_dot(code, a4, panel, o + 256, yc, p + 16, off, q + 4, sch)
            a5 = _class_dot(code, a5, panel, o + 320, yc, p + 20, off, q + 5, sch)
            a6 = _class_dot(code, a6, panel, o + 384, yc, p + 24, off, q + 6, sch)
            a7 = _class_dot(code, a7, panel, o + 448, yc, p + 28, off, q + 7, sch)
        yd = dy[i]
        d = S.load(dd, 128 * i, 16, "f32") * yd
        s0 = s0 + d * S.convert(a0, "f32")
        s1 = s1 + d * S.convert(a1, "f32")
        s2 = s2 + d * S.convert(a2, "f32")
        s3 = s3 + d * S.convert(a3, "f32")
        s4 = s4 + d * S.convert(a4, "f32")
        s5 = s5 + d * S.convert(a5, "f32")
        s6 = s6 + d * S.convert(a6, "f32")
        s7 = s7 + d * S.convert(a7, "f32")
        if code == Q4_K:
            mins = S.zeros(16, "i32")
            for j in range(8):
                mins = mins + S.load(mn, 64 * (8 * i + j), 16, "i32") * bsp[8 * i + j]
            sumf = sumf - (S.load(dd, 128 * i + 64, 16, "f32") * yd) * S.convert(mins, "f32")
    _put(yrow, r0, nr, sumf + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7)


@njit(parallel=True, cache=True)
def _gemm_k(w, code, yq, y):
    n, m = y.shape
    nsb = yq.shape[1] // 292
    yc = np.empty((n, 256 * nsb), dtype=np.int8)
    dy = np.empty((n, nsb), dtype=np.float32)
    bsp = np.empty((n, 8 * nsb), dtype=np.int32)
    off = np.empty((n, 64 * nsb), dtype=np.int32)
    _prep_acts_k(yq, yc, dy, bsp, off)
    for g in prange((m + ROWS - 1) // ROWS):
        r0 = g * ROWS
        panel = np.empty(4096 * nsb, dtype=np.uint8)
        sc = np.empty(ROWS * 8 * nsb, dtype=np.int32)
        mn = np.empty(ROWS * 8 * nsb, dtype=np.int32)
        dd = np.empty(2 * ROWS * nsb, dtype=np.float32)
        _pack_panel_k(w, r0, code, panel, sc, mn, dd)
        nr = min(ROWS, m - r0)
        for a in range(n):
            _row_k(code, panel, sc, mn, dd, yc[a], dy[a], bsp[a], off[a], y[a], r0, nr)


def mul_mat_ggml(w: np.ndarray, code: int, yq: np.ndarray, y: np.ndarray) -> None:
    """y[N, M] = ggml's dots of weight rows ``w`` (raw ``[M, row_bytes]``, type ``code``
    in :data:`CODES`) with activation rows ``yq`` (quantized to the type's vec_dot_type,
    ``[N, row_bytes]``), into ``y`` (C-contiguous float32)."""
    if code in (Q4_K, Q6_K):
        _gemm_k(w, np.int64(code), yq, y)
    else:
        _gemm(w, np.int64(code), yq, y)
