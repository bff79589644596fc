"""ggml's quantized dot products with byte SIMD: the same numbers as :mod:`.vec_dot_ggml`.

:mod:`.vec_dot_ggml` reproduces ggml's generic (scalar) ``ggml_vec_dot_<w>_<y>`` one value
at a time. Here the same integer sums come from ``vpdpbusd``/``vpmaddubsw`` (u8 x i8 ->
int32 / int16 pair sums) and ``vpdpwssd`` (int16 pairs x scales -> int32), 64 values
per instruction (:mod:`.simd`), and the float32 parts are the generic ones, operation
for operation. Integer sums are exact in any order, so the results are bit for bit
those of :func:`.vec_dot_ggml.dot_row_ggml` (``tests/test_kernels.py``).

What ggml's generic order fixes, and how the vector code keeps it:

* 32-blocks (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): ``sumf += f(sumi_b, d_b ...)`` one block after
  the other. One row: eight blocks are summed at once (lanes of one vector, reduced by
  a transposed add tree to one int32 lane per block), their float terms computed as an
  8-lane vector, then added to ``sumf`` lane by lane in block order
  (:func:`.simd.add_in_order`). Four rows of the nibble types: 4 blocks of each row,
  lane 4b + r holding block b of row r (:func:`_four_nibbles`), each block's 4 terms
  added to the 4 rows' sums as one vector.
* K-quants except Q2_K: ggml's ``aux32[l]`` collects the products of the values
  ``k`` with ``k % 8 == l`` (times their sub-block scale) and adds ``d * aux32[l]`` to
  float lane ``l`` once per 256 values. The weight bytes are therefore permuted in
  registers (one ``vpermb``) so that each int32 lane of a dot holds one class ``l`` of
  one sub-block; the activations were permuted the same way once per row
  (:func:`prepare_row`). Q2_K sums everything into one integer per block.
* Signed x signed bytes: ``vpdpbusd`` wants one unsigned side. Q4_0/Q5_0/Q6_K/Q3_K
  use their unsigned codes ``u`` and subtract ``offset * sum(y)`` (precomputed per row
  of activations, exact); so does Q8_0 with VNNI (``w + 128``: ``vpdpbusd`` does not
  saturate), elsewhere ggml's sign trick (``|w| * (sign(w) * y)``).

Numbers are bounded so that no 16-bit pair sum saturates (see :mod:`.simd`): unsigned
codes are at most 63 (Q6_K), ``|w| <= 128`` for Q8_0, activations in [-127, 127].

Each weight row is streamed with a software prefetch into L2 ``PREFETCH`` bytes ahead;
the four-row kernels instead sweep the next four rows in address order
(:func:`_prefetch_next4`): without a hint a core's misses and its arithmetic took turns
(6.7 GB/s on Q4_K from memory, 12 GB/s with it). A prefetch into L1 2-3 KB ahead held
the Q8_0 output matvec of gemma3 270M (640 columns) at 6 GB/s per core; into L2 8 KB
ahead, 14 GB/s (:func:`.simd.prefetch`). Four per-row streams 8 KB ahead left the 2-core
matvecs at 70-86% of the streaming read; the one sequential sweep at 86-99%.

Activation layout (:func:`prepare_row`, ``prep_bytes(code, k)`` bytes per row; ``yq``
itself is still read for the scales ``d`` and Q2_K's ``bsums``):

=============  =======================================================================
Q4_K, Q5_K     per 256: int8 quants of sub-blocks 0,2,1,3,4,6,5,7, each class-grouped
               (:func:`_class32`); int16 ``bsums[2j] + bsums[2j+1]``, j < 8
Q6_K           per 256: int8 quants, each 64 in :func:`_pairs16` order; int16
               ``32 * (y[a] + y[b])`` for each maddubs pair
Q3_K           as Q6_K over the bit-plane order (:data:`_PLANES`), each 64 in
               :func:`_q3_pairs` order, ``4 * (y[a] + y[b])``; without AVX-512 the
               quants in :func:`_q3_lanes` order instead
Q2_K           per 256: int8 quants in bit-plane order; the 16 ``bsums`` split as
               ``128 * hi + lo``, int8 hi then int8 lo, each tiled to 64 bytes
               (:func:`_prep_q2_k_bsums`)
32-blocks      quants (per 4 blocks: Q8_0 natural, others :func:`_nibble_order`), then
               float32 ``d`` of every block, then int32 ``offset * sum(q)`` (Q4_0,
               Q5_0, Q8_0) or float32 ``s`` (Q4_1, Q5_1) of every block; then both
               again, each value 4 times (:func:`_rep_d`, :func:`_rep_e`)
=============  =======================================================================
"""
from __future__ import annotations

import numpy as np
from numba import njit

from gguf import GGMLQuantizationType as QT

from graphcost.format import ggml_types as gt

from . import simd as S
from .bits import f16_to_f32, out_of_line, stack_f32
from .quants import Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Q8_1, Q8_K
from .vec_dot_ggml import (blocks_q4_0, blocks_q4_1, blocks_q5_0, blocks_q5_1,
                           blocks_q8_0)

F = np.float32

#: bytes per block of each type (graphcost.format.ggml_types: gguf's GGML_QUANT_SIZES)
B_Q4_0, B_Q4_1, B_Q5_0, B_Q5_1, B_Q8_0, B_Q8_1 = (gt.block(QT(c))[1] for c in
                                                  (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1))
B_Q2_K, B_Q3_K, B_Q4_K, B_Q5_K, B_Q6_K, B_Q8_K = (gt.block(QT(c))[1] for c in
                                                  (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K))

#: bytes ahead of the current weight block that each kernel prefetches
PREFETCH = 8192
#: ``ahead`` that makes :func:`_prefetch` do nothing (the four-row kernels)
NO_PREFETCH = -1
#: forms of the four-row kernels' sweep (:func:`_prefetch_next4`)
SWEEP_FIXED, SWEEP_LINES = 0, 1
#: (form, bytes ahead of 4 times the position) of each type's four-row sweep: what
#: streamed faster against memory in in-process A/B runs on a 2-core AVX-512 EPYC
#: (kernels/README.md, 2026-11-27; Q2_K, Q3_K and Q5_K tied and keep the fixed count;
#: 8 KB ahead gained the loop's types 2-5 points when memory read at ~95 GB/s, the
#: fixed count's nothing; Q2_K's table kernel: 8 KB ahead, one core from memory 81-85%
#: -> 89-90% of that core's streaming read)
SWEEP = {Q4_0: (SWEEP_LINES, 8192), Q4_1: (SWEEP_LINES, 8192), Q5_0: (SWEEP_FIXED, 4096),
         Q5_1: (SWEEP_FIXED, 4096), Q8_0: (SWEEP_LINES, 8192), Q2_K: (SWEEP_FIXED, 8192),
         Q3_K: (SWEEP_FIXED, 4096), Q4_K: (SWEEP_LINES, 8192), Q5_K: (SWEEP_FIXED, 4096),
         Q6_K: (SWEEP_LINES, 8192)}
_SW_Q4_0, _SW_Q4_1, _SW_Q5_0, _SW_Q5_1, _SW_Q8_0 = (SWEEP[c] for c in (Q4_0, Q4_1, Q5_0, Q5_1,
                                                                      Q8_0))
_SW_Q2_K, _SW_Q3_K, _SW_Q4_K, _SW_Q5_K, _SW_Q6_K = (SWEEP[c] for c in (Q2_K, Q3_K, Q4_K, Q5_K,
                                                                      Q6_K))

#: weight types with a kernel here (the others use :mod:`.vec_dot_ggml`)
CODES = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)

# ---------------------------------------------------------------------------- layouts
# Each list maps an output byte to the input byte it takes; the same list permutes the
# weight bytes in registers and the activations in prepare_row.


def _class32(base: int = 0) -> list[int]:
    """32 values grouped by class ``k % 8``: output 4c + i is input 8i + c, so the
    int32 lane c of a ``dpbusd`` sums the four values of class c."""
    return [base + 8 * i + c for c in range(8) for i in range(4)]


def _pairs16(base: int = 0) -> list[int]:
    """64 values = 4 sub-blocks of 16 (s = 0..3). Output dword L = 8h + c holds the class
    c pair (c, c + 8) of sub-block 2h, then of sub-block 2h + 1: after ``maddubs`` its two
    int16 are those sub-blocks' class-c sums, which one ``dpwssd`` scales and adds."""
    return [base + 16 * (2 * h + e) + c + 8 * f
            for h in range(2) for c in range(8) for e in range(2) for f in range(2)]


def _q3_pairs() -> list[int]:
    """As :func:`_pairs16` with the halves interleaved: output dword 2c + h holds the class
    c pair of sub-block 2h, then of 2h + 1. For Q3_K, whose 64-value plane vectors hold
    32 values of each 128-half (:data:`_PLANES`): each 64-bit lane then needs the same
    four scales, one ``vpbroadcastq`` (:func:`_q3_k_scale_pairs`)."""
    return [16 * (2 * h + e) + c + 8 * f
            for c in range(8) for h in range(2) for e in range(2) for f in range(2)]


#: Q2_K/Q3_K bit planes: vector j holds plane j of both 128-halves (values 32j..32j+31
#: and 128+32j..128+32j+31), the values one shift of the 64 quant bytes yields
_PLANES = [32 * j + i if i < 32 else 128 + 32 * j + i - 32 for j in range(4) for i in range(64)]

#: sub-block order of the Q4_K/Q5_K activations: low nibbles of quant bytes 0..63 are
#: sub-blocks 0 and 2, high nibbles 1 and 3; bytes 64..127 likewise 4,6 and 5,7
_K4_SUBBLOCKS = (0, 2, 1, 3, 4, 6, 5, 7)


def _nibble_order() -> list[int]:
    """4 blocks of 32: the low halves (values 0..15) of blocks 0..3, then the high halves,
    matching 4 blocks' 16 quant bytes loaded side by side and split into nibbles."""
    return [32 * b + 16 * half + j for half in range(2) for b in range(4) for j in range(16)]


_IDX_K4 = np.array([32 * s + i for s in _K4_SUBBLOCKS for i in _class32()], dtype=np.int64)
_IDX_K6 = np.array([64 * m + i for m in range(4) for i in _pairs16()], dtype=np.int64)
_IDX_K3 = np.array([_PLANES[64 * m + i] for m in range(4) for i in _q3_pairs()], dtype=np.int64)


def _q3_lanes() -> list[int]:
    """Q3_K without AVX-512 (:func:`_q3_k_ints_ymm`): 8 vectors of 32 bytes, vector
    4h + 2r + g for the values 128h + 32j + l of planes j = 2r, 2r + 1 and classes c =
    l % 8 in 4g..4g + 3; in its 128-bit lane L (l = 16L + ..) the dword of class c holds
    values c and c + 8 of plane 2r, then of plane 2r + 1 (two sub-blocks: ``maddubs`` pairs
    one sub-block's two values of class c, ``madd`` scales and adds the two sub-blocks),
    bytes that in-lane shuffles of the weight bytes bring together."""
    return [128 * h + 32 * j + 16 * L + c + 8 * e
            for h in range(2) for r in range(2) for g in range(2) for L in range(2)
            for c in range(4 * g, 4 * g + 4) for j in (2 * r, 2 * r + 1) for e in range(2)]


_IDX_K3_LANES = np.array(_q3_lanes(), dtype=np.int64)
_IDX_K2 = np.array(_PLANES, dtype=np.int64)

_CLASS32X2 = S.permutation(_class32(0) + _class32(32))
_PAIRS16 = S.permutation(_pairs16())


def _lane_pairs(a: int, b: int, width: int = 8) -> object:
    """16 int32 lanes: ``width`` copies of source lane a, then of b, and so on."""
    return S.permutation(([a] * width + [b] * width) * (8 // width))


# ---------------------------------------------------------------------------- activations


def prep_bytes(code: int, k: int) -> int:
    """Bytes of one prepared activation row for weight type ``code`` and row length k."""
    if code in (Q4_K, Q5_K):
        return k // 256 * 272
    if code in (Q6_K, Q3_K):
        return k // 256 * 512
    if code == Q2_K:
        return k // 256 * PREP_Q2_K
    return k // 32 * PREP32      # see _prep_32


#: the activation permutations of prepare_row as constant shuffles (one 256-byte Q8_K
#: block, or four 32-byte blocks for the 4-row Q4_0/Q4_1/Q5_0/Q5_1 kernels)
_PERM_K4, _PERM_K6, _PERM_K3, _PERM_K2, _PERM_K3_LANES = (
    S.permutation(idx.tolist()) for idx in (_IDX_K4, _IDX_K6, _IDX_K3, _IDX_K2, _IDX_K3_LANES))
_PERM_NIB = S.permutation(_nibble_order())
_EVENS128, _ODDS128 = S.permutation(range(0, 256, 2)), S.permutation(range(1, 256, 2))
_EVENS8, _ODDS8 = S.permutation(range(0, 16, 2)), S.permutation(range(1, 16, 2))


@njit(inline="always", cache=True)
def _q8_k_quants(yq, py):
    """The 256 int8 quants of the Q8_K block at byte ``py``, one vector."""
    return S.concat(S.concat(S.load(yq, py + 4, 64, "i8"), S.load(yq, py + 68, 64, "i8")),
                    S.concat(S.load(yq, py + 132, 64, "i8"), S.load(yq, py + 196, 64, "i8")))


@njit(inline="always", cache=True)
def _prep_k_tail(yq, out, py, po, perm, per_block, pair_offset):
    """After the permuted quants at ``po``: either bsum pairs (``per_block`` 272,
    Q4_K/Q5_K) or ``pair_offset * (y[a] + y[b])`` for each byte pair (512, Q6_K/Q3_K),
    int16 lanes (the sums wrap as the int16 they are stored in)."""
    if per_block == 272:
        bs = S.load(yq, py + 260, 16, "i16")
        S.store(out, po + 256, _EVENS8(bs) + _ODDS8(bs))
    elif per_block == 512:
        w = S.convert(perm, "i16")
        S.store(out, po + 256, (_EVENS128(w) + _ODDS128(w)) * np.int16(pair_offset))


#: prepared bytes per Q2_K block: 256 quants, then :func:`_prep_q2_k_bsums`' 2 x 64
PREP_Q2_K = 256 + 128
#: bsums byte b of dword 4L + r (any r): bsums[4L + b] (:func:`_q2_k_mins4`' layout)
_Q2_BSUMS4 = S.permutation([4 * (d // 4 // 4) + b for d in range(64) for b in [d % 4]])


@njit(inline="always", cache=True)
def _prep_q2_k_bsums(yq, out, py, po):
    """Q8_K ``bsums`` (int16, within [-2048, 2047]) split as ``128 * hi + lo`` (hi in
    [-16, 15], lo in [0, 127]), each as int8 in :data:`_Q2_BSUMS4` order: hi at ``po``,
    lo at ``po + 64``, the signed operands of Q2_K's mins ``vpdpbusd``."""
    bs = S.load(yq, py + 260, 16, "i16")
    S.store(out, po, _Q2_BSUMS4(S.convert(bs >> 7, "i8")))
    S.store(out, po + 64, _Q2_BSUMS4(S.convert(bs & 127, "i8")))


@njit(cache=True)
def _prep_k(yq, out, code):
    """Permuted quants of each Q8_K block (``_IDX_K*`` of weight type ``code``), then
    :func:`_prep_k_tail`: one 256-lane shuffle per block (was a byte loop: ~2x)."""
    for i in range(yq.shape[0] // B_Q8_K):
        py = B_Q8_K * i
        q = _q8_k_quants(yq, py)
        if code == Q4_K or code == Q5_K:
            v = _PERM_K4(q)
            S.store(out, 272 * i, v)
            _prep_k_tail(yq, out, py, 272 * i, v, 272, 0)
        elif code == Q6_K:
            v = _PERM_K6(q)
            S.store(out, 512 * i, v)
            _prep_k_tail(yq, out, py, 512 * i, v, 512, 32)
        elif code == Q3_K:
            v = _PERM_K3(q) if S.has_avx512() else _PERM_K3_LANES(q)
            S.store(out, 512 * i, v)
            _prep_k_tail(yq, out, py, 512 * i, v, 512, 4)
        else:
            S.store(out, PREP_Q2_K * i, _PERM_K2(q))
            _prep_q2_k_bsums(yq, out, py, PREP_Q2_K * i + 256)


#: prepared bytes per 32-block of activations: 32 quants, float32 d, int32/float32 extra,
#: then d and extra again, each four times (one lane per weight row of the 4-row kernels)
PREP32 = 32 + 4 + 4 + 16 + 16


@njit(inline="always", cache=True)
def _rep_d(nb, b):
    """Byte offset of block b's d, repeated 4 times, in a prepared row of nb blocks."""
    return 40 * nb + 16 * b


@njit(inline="always", cache=True)
def _rep_e(nb, b):
    """Byte offset of block b's extra (``offset * sum(q)`` or s), repeated 4 times."""
    return 56 * nb + 16 * b


@njit(cache=True)
def _prep_32(yq, out, block_bytes, natural, offset):
    """Q8_0/Q8_1 blocks -> quants (4-block groups in kernel order), float32 d per block,
    then int32 ``offset * sum(q)`` (offset > 0) or float32 s (Q8_1, offset 0); then the
    d and the extra of each block repeated 4 times (at ``_rep_d``/``_rep_e``). Vector
    copies and one 128-lane shuffle per 4-block group (was a byte loop)."""
    qoff = block_bytes - 32
    nb = yq.shape[0] // block_bytes
    full = 0 if natural else nb // 4 * 4
    for g in range(0, full, 4):
        p = block_bytes * g + qoff
        v = S.concat(S.concat(S.load(yq, p, 32, "i8"), S.load(yq, p + block_bytes, 32, "i8")),
                     S.concat(S.load(yq, p + 2 * block_bytes, 32, "i8"),
                              S.load(yq, p + 3 * block_bytes, 32, "i8")))
        S.store(out, 32 * g, _PERM_NIB(v))
    for b in range(full, nb):
        S.store(out, 32 * b, S.load(yq, block_bytes * b + qoff, 32, "i8"))
    for b in range(nb):
        d = f16_to_f32(S.scalar_at(yq, block_bytes * b, "u16"))
        S.store_at(out, 32 * nb + 4 * b, d, "f32")
        S.store(out, _rep_d(nb, b), S.splat(d, 4, "f32"))
        if offset:
            t = S.hsum(S.convert(S.load(yq, block_bytes * b + qoff, 32, "i8"), "i32"))
            e = np.int32(offset * t)
            S.store_at(out, 36 * nb + 4 * b, e, "i32")
            S.store(out, _rep_e(nb, b), S.splat(e, 4, "i32"))
        else:
            s = f16_to_f32(S.scalar_at(yq, block_bytes * b + 2, "u16"))
            S.store_at(out, 36 * nb + 4 * b, s, "f32")
            S.store(out, _rep_e(nb, b), S.splat(s, 4, "f32"))


@njit(cache=True)
def prepare_row(code, yq, out):
    """One activation row quantized to the vec_dot_type (``yq``, raw bytes) -> the
    layout the kernel of weight type ``code`` reads (``out``: ``prep_bytes`` bytes)."""
    if code == Q4_K or code == Q5_K or code == Q6_K or code == Q3_K or code == Q2_K:
        _prep_k(yq, out, code)
    elif code == Q8_0:
        _prep_32(yq, out, B_Q8_0, True, 128)
    elif code == Q4_0:
        _prep_32(yq, out, B_Q8_0, False, 8)
    elif code == Q5_0:
        _prep_32(yq, out, B_Q8_0, False, 16)
    elif code == Q4_1 or code == Q5_1:
        _prep_32(yq, out, B_Q8_1, False, 0)


# ---------------------------------------------------------------------------- shared pieces


@njit(inline="always", cache=True)
def _prefetch(row, p, nbytes, ahead):
    """Prefetch the cache lines ``ahead`` bytes after [p, p + nbytes) (``PREFETCH``, a
    kernel walking one row); none for ``NO_PREFETCH`` (the four-row kernels, which call
    :func:`_prefetch_next4`)."""
    if ahead < 0:
        return
    for o in range(0, nbytes, 64):
        S.prefetch(row, p + ahead + o)


@njit(inline="always", cache=True)
def _prefetch_next4(r0, p, nbytes, sweep):
    """Prefetch the cache lines the next four rows hold at 4 * [p, p + nbytes) + ahead
    (from the first of them; weight rows are contiguous): while a four-row kernel walks
    bytes p..p + nbytes of rows r0..r0+3, one sequential sweep runs 4 times as fast
    through the 4 rows after them. Per row ``ahead`` bytes ahead (:func:`_prefetch`, the
    one-row kernels) reached 72-80% of the streaming read with 2 threads on Q4_0; this
    sweep 94-100% (benchmarks/bench_kernels.py, one A/B run). ``sweep`` = (form, ahead),
    a constant of :data:`SWEEP`: form ``SWEEP_FIXED`` a fixed count of addresses 64
    bytes apart, unrolled (consecutive steps' spans abut, so every line is hit; a line
    may be hit twice); ``SWEEP_LINES`` a loop over exactly the lines a step crosses (5
    or 6 for Q2_K, a branch the predictor misses: ~12% of Q2_K's in-cache time). With
    no sweep (the hardware prefetchers alone) the 2-thread matvecs reached 18-65% of the
    streaming read (kernels/README.md)."""
    form, ahead = sweep
    start = 4 * r0.shape[0] + 4 * p + ahead
    if form == SWEEP_FIXED:
        for k in range((4 * nbytes + 63) // 64):
            S.prefetch(r0, start + 64 * k)
    else:
        for q in range((start + 63) // 64 * 64, start + 4 * nbytes, 64):
            S.prefetch(r0, q)


@njit(inline="always", cache=True)
def _scaled(acc, dots, scales):
    """acc + dots * scales for int32 lanes, dots and scales below 2**15 in magnitude:
    one ``vpdpwssd`` on (dot, sign) x (scale, 0) int16 pairs."""
    return S.dpwssd(acc, S.bitcast(dots, "i16"), S.bitcast(scales, "i16"))


@njit(inline="always", cache=True)
def _fold8(acc):
    """int32 lanes 0..7 + 8..15: the eight class sums ggml calls aux32."""
    return S.lanes(acc, 0, 8) + S.lanes(acc, 8, 8)


_EVEN16 = S.permutation2(list(range(0, 32, 2)))
_ODD16 = S.permutation2(list(range(1, 32, 2)))
_EVEN8 = S.permutation(list(range(0, 16, 2)))
_ODD8 = S.permutation(list(range(1, 16, 2)))
_EVEN4 = S.permutation([0, 2, 4, 6])
_ODD4 = S.permutation([1, 3, 5, 7])


@njit(inline="always", cache=True)
def _pairwise(a, b):
    """Adjacent lanes of a then of b added: 2 x 16 lanes -> 16."""
    return _EVEN16(a, b) + _ODD16(a, b)


@njit(inline="always", cache=True)
def _block_sums4(v0, v1):
    """Two vectors of 4 int32 lanes per block (blocks 0..3, 4..7) -> 8 block sums."""
    c = _pairwise(v0, v1)
    return _EVEN8(c) + _ODD8(c)


#: in-lane swaps of int32 lanes (``vpshufd``): of 64-bit halves, of neighbours
_SWAP64 = S.permutation([i ^ 2 for i in range(16)])
_SWAP32 = S.permutation([i ^ 1 for i in range(16)])
_LANE0_OF4 = S.permutation([0, 4, 8, 12])


@njit(inline="always", cache=True)
def _sums_in_lanes(v):
    """int32 x16 -> x4: the sums of lanes 4r..4r+3 (128-bit lane r: block or row r), by
    two in-lane swaps and adds and one cross-lane pick, where LLVM made even/odd picks
    (the sums' earlier form) two ``vphaddd`` (3 uops each) and extracts. Q4_K/Q5_K
    four-row kernels 2-4% faster cache-resident (2026-11-27; without the whole mins sum
    Q5_K's was 17% faster: the rest is the mins' packing and the register spills of a
    loop that keeps ~40 vectors live)."""
    v = v + _SWAP64(v)
    return _LANE0_OF4(S.opaque(v + _SWAP32(v)))    # else LLVM picks twice, then adds


def _span4_bytes(size: int, offsets) -> list[int]:
    """Where, block after block, the bytes at ``offsets`` of each of 4 blocks of ``size``
    bytes lie in :func:`_span4`'s two vectors (``64 <= 4 * size <= 128``)."""
    return [i if i < 64 else i + 128 - 4 * size
            for blk in range(4) for o in offsets for i in [size * blk + o]]


def _gather4(size: int, offsets) -> object:
    """``f(a, b)`` picking :func:`_span4_bytes` from :func:`_span4`'s two vectors."""
    return S.permutation2(_span4_bytes(size, offsets))


@njit(inline="always", cache=True)
def _span4(row, p, size):
    """The ``4 * size`` bytes of 4 blocks from byte p as two 64-byte loads, the first and
    the last 64 (they overlap; nothing outside the 4 blocks is read)."""
    return S.load(row, p, 64, "u8"), S.load(row, p + 4 * size - 64, 64, "u8")


#: Q5 code byte 16b + j (value j of block b, or 16 + j) against its block's ``qh``, which
#: :func:`_qh2` puts in 64-bit lanes 2b and 2b + 1: the bit number of its value
_QH_BIT_LO = S.constant([j for _ in range(4) for j in range(16)], "u8")
_QH_BIT_HI = S.constant([16 + j for _ in range(4) for j in range(16)], "u8")


@njit(inline="always", cache=True)
def _nibble_dot4(lo, hi, yp, pq):
    """int32 lanes 4b..4b+3 = partial sums over block b of code * y, ``lo``/``hi`` the
    codes of values 0..15 / 16..31 of 4 blocks (16 bytes each)."""
    z = S.zeros(16, "i32")
    return S.dpbusd(S.dpbusd(z, lo, S.load(yp, pq, 64, "i8")), hi, S.load(yp, pq + 64, 64, "i8"))


@njit(inline="always", cache=True)
def _q5_codes(q, qh):
    """Q5 codes of 4 blocks: nibbles of their quants ``q`` plus 16 where the value's
    ``qh`` bit is set (``qh``: each block's 32 bits twice, :func:`_qh2`): one bit pick
    into a mask per 64 codes, where a byte spread of ``qh`` took a 2-source permute and
    a ``vptestmb``."""
    return (S.add_if_bit(q & 15, qh, _QH_BIT_LO(), 16),
            S.add_if_bit(q >> 4, qh, _QH_BIT_HI(), 16))


def _qh2(size: int, qh_at: int) -> object:
    """``f(a, b)`` on :func:`_span4`'s two vectors: uint16 x32, the ``qh`` (2 halves at
    ``qh_at``) of block b in 64-bit lanes 2b and 2b + 1 (their upper 32 bits unused)."""
    src = _span4_bytes(size, (qh_at, qh_at + 2))            # even: word offsets
    return S.permutation2([src[2 * b + h] // 2 for b in range(4) for _ in range(4)
                           for h in range(2)])


@njit(inline="always", cache=True)
def _halves(v):
    """IEEE halves gathered as bytes (low byte first) -> float32 lanes."""
    return S.f16_to_f32(S.bitcast(v, "u16"))


# ---------------------------------------------------------------------------- 32-blocks
# A row is taken 8 blocks at a time, then 4 if that many are left, then block by block
# with .vec_dot_ggml's scalar code (fewer than 4: any K >= 128 a multiple of 128 has none).
# _part4_<t>(row, p, yp, pq): for the 4 blocks from byte p (activations at pq), int32
# lanes 4i..4i+3 holding partial sums of block i, and the blocks' d and m (float32 x4;
# d again where the type has no m); the nibble types load the 4 blocks as two vectors
# (_span4) and pick quants, qh and scales from them with one byte permute each
# (_codes_<t>). A row's dot is sumf += term, term after term (add_in_order). Four rows
# of Q8_0 transpose their terms and add them as 4-lane vectors (_add_rows4); four rows
# of the nibble types keep block-major lanes throughout (_four_nibbles, below).

_QS_Q4_0, _D_Q4_0 = _gather4(B_Q4_0, range(2, B_Q4_0)), _gather4(B_Q4_0, (0, 1))
_QS_Q4_1, _D_Q4_1 = _gather4(B_Q4_1, range(4, B_Q4_1)), _gather4(B_Q4_1, (0, 1))
_M_Q4_1 = _gather4(B_Q4_1, (2, 3))
_QH_Q5_0 = _qh2(B_Q5_0, 2)
_QS_Q5_0, _D_Q5_0 = _gather4(B_Q5_0, range(6, B_Q5_0)), _gather4(B_Q5_0, (0, 1))
_QH_Q5_1 = _qh2(B_Q5_1, 4)
_QS_Q5_1, _D_Q5_1 = _gather4(B_Q5_1, range(8, B_Q5_1)), _gather4(B_Q5_1, (0, 1))
_M_Q5_1 = _gather4(B_Q5_1, (2, 3))


# _float_<t>(sumi, d, m, yp, pd, pe, n): the terms of n blocks (lanes), the activations'
# d and extra read as n lanes from byte offsets pd and pe of the prepared row (one per
# block: 32 * nb + 4 * b0, 36 * nb + 4 * b0; or a block's 4 lanes: _rep_d, _rep_e)


@njit(inline="always", cache=True)
def _codes_q4_0(a, b):                # block_q4_0: d@0 qs@2, 18 B
    q = _QS_Q4_0(a, b)
    return q & 15, q >> 4


@njit(inline="always", cache=True)
def _part4_q4_0(row, p, yp, pq):
    a, b = _span4(row, p, B_Q4_0)
    lo, hi = _codes_q4_0(a, b)
    d = _halves(_D_Q4_0(a, b))
    return _nibble_dot4(lo, hi, yp, pq), d, d


@njit(inline="always", cache=True)
def _float_q4_0(sumi, d, m, yp, pd, pe, n):     # sumi*dx*dy, sumi = dot - 8 * sum(y)
    sumi = sumi - S.load(yp, pe, n, "i32")
    return S.convert(sumi, "f32") * d * S.load(yp, pd, n, "f32")


@njit(inline="always", cache=True)
def _codes_q5_0(a, b):                # block_q5_0: d@0 qh@2 qs@6, 22 B
    return _q5_codes(_QS_Q5_0(a, b), _QH_Q5_0(S.bitcast(a, 'u16'), S.bitcast(b, 'u16')))


@njit(inline="always", cache=True)
def _part4_q5_0(row, p, yp, pq):
    a, b = _span4(row, p, B_Q5_0)
    lo, hi = _codes_q5_0(a, b)
    d = _halves(_D_Q5_0(a, b))
    return _nibble_dot4(lo, hi, yp, pq), d, d


@njit(inline="always", cache=True)
def _float_q5_0(sumi, d, m, yp, pd, pe, n):     # (dx*dy)*sumi, sumi = dot - 16 * sum(y)
    sumi = sumi - S.load(yp, pe, n, "i32")
    return (d * S.load(yp, pd, n, "f32")) * S.convert(sumi, "f32")


@njit(inline="always", cache=True)
def _codes_q4_1(a, b):                # block_q4_1: d@0 m@2 qs@4, 20 B
    q = _QS_Q4_1(a, b)
    return q & 15, q >> 4


@njit(inline="always", cache=True)
def _part4_q4_1(row, p, yp, pq):
    a, b = _span4(row, p, B_Q4_1)
    lo, hi = _codes_q4_1(a, b)
    return _nibble_dot4(lo, hi, yp, pq), _halves(_D_Q4_1(a, b)), _halves(_M_Q4_1(a, b))


@njit(inline="always", cache=True)
def _float_q4_1(sumi, d, m, yp, pd, pe, n):     # (dx*dy)*sumi + m*s
    ms = m * S.load(yp, pe, n, "f32")
    return (d * S.load(yp, pd, n, "f32")) * S.convert(sumi, "f32") + ms


@njit(inline="always", cache=True)
def _codes_q5_1(a, b):                # block_q5_1: d@0 m@2 qh@4 qs@8, 24 B
    return _q5_codes(_QS_Q5_1(a, b), _QH_Q5_1(S.bitcast(a, 'u16'), S.bitcast(b, 'u16')))


@njit(inline="always", cache=True)
def _part4_q5_1(row, p, yp, pq):
    a, b = _span4(row, p, B_Q5_1)
    lo, hi = _codes_q5_1(a, b)
    return _nibble_dot4(lo, hi, yp, pq), _halves(_D_Q5_1(a, b)), _halves(_M_Q5_1(a, b))


_float_q5_1 = _float_q4_1                       # the same float terms


@njit(inline="always", cache=True)
def _q8_dot2(row, p, yp, pq):
    """int32 lanes 0..7 / 8..15: partial sums of blocks at p and p + 34. With VNNI the
    unsigned codes ``w + 128`` (``128 * sum(y)`` is subtracted per block in
    :func:`_float_q8_0`), elsewhere ggml's sign trick (pair sums within int16)."""
    w = S.concat(S.load(row, p + 2, 32, "i8"), S.load(row, p + 36, 32, "i8"))
    y = S.load(yp, pq, 64, "i8")
    if S.has_vnni():
        return S.dpbusd(S.zeros(16, "i32"), S.bitcast(w, "u8") ^ 0x80, y)
    return S.dpbusd(S.zeros(16, "i32"), S.bitcast(S.absolute(w), "u8"), S.select_neg(w, y))


#: the d of 4 Q8_0 blocks from 64-byte loads at p (blocks 0, 1) and p + 68 (2, 3)
_D_Q8_0 = S.permutation2([0, 1, 34, 35, 64, 65, 98, 99])


@njit(inline="always", cache=True)
def _part4_q8_0(row, p, yp, pq):      # block_q8_0: d@0 qs:i8@2, 34 B
    sums = _pairwise(_q8_dot2(row, p, yp, pq), _q8_dot2(row, p + 68, yp, pq + 64))
    d = _halves(_D_Q8_0(S.load(row, p, 64, "u8"), S.load(row, p + 68, 64, "u8")))
    return sums, d, d


@njit(inline="always", cache=True)
def _float_q8_0(sumi, d, m, yp, pd, pe, n):     # sumi*(dx*dy)
    if S.has_vnni():                            # sumi = dot - 128 * sum(y)
        sumi = sumi - S.load(yp, pe, n, "i32")
    return S.convert(sumi, "f32") * (d * S.load(yp, pd, n, "f32"))


_ZIP8 = S.permutation2([i // 2 + 8 * (i % 2) for i in range(16)])    # a0 b0 a1 b1 ...
_BLOCKS03 = S.permutation2([2 * b + i + 16 * h for b in range(4) for h in range(2)
                            for i in range(2)])
_BLOCKS47 = S.permutation2([2 * b + i + 16 * h for b in range(4, 8) for h in range(2)
                            for i in range(2)])
_ZIP4 = S.permutation2([i // 2 + 4 * (i % 2) for i in range(8)])
_BLOCKS01 = S.permutation2([2 * b + i + 8 * h for b in range(2) for h in range(2)
                            for i in range(2)])
_BLOCKS23 = S.permutation2([2 * b + i + 8 * h for b in range(2, 4) for h in range(2)
                            for i in range(2)])


@njit(inline="always", cache=True)
def _add_rows4(s, t0, t1, t2, t3):
    """s[r] + t_r[0] + t_r[1] + ... + t_r[7] for the four rows r, in that order: the 4x8
    terms transposed to 8 vectors of (row 0..3) and added one after the other."""
    a, b = _ZIP8(t0, t1), _ZIP8(t2, t3)             # (row 0, row 1) / (2, 3) per block
    lo, hi = _BLOCKS03(a, b), _BLOCKS47(a, b)       # block 0..3 / 4..7, 4 rows each
    s = s + S.lanes(lo, 0, 4)
    s = s + S.lanes(lo, 4, 4)
    s = s + S.lanes(lo, 8, 4)
    s = s + S.lanes(lo, 12, 4)
    s = s + S.lanes(hi, 0, 4)
    s = s + S.lanes(hi, 4, 4)
    s = s + S.lanes(hi, 8, 4)
    return s + S.lanes(hi, 12, 4)


@njit(inline="always", cache=True)
def _add_rows4x4(s, t0, t1, t2, t3):
    """:func:`_add_rows4` for 4 terms per row."""
    a, b = _ZIP4(t0, t1), _ZIP4(t2, t3)
    lo, hi = _BLOCKS01(a, b), _BLOCKS23(a, b)
    s = s + S.lanes(lo, 0, 4)
    s = s + S.lanes(lo, 4, 4)
    s = s + S.lanes(hi, 0, 4)
    return s + S.lanes(hi, 4, 4)


@njit(inline="always", cache=True)
def _terms8(part4, flt, size, row, g, nb, yp, ahead):
    b0 = 8 * g
    _prefetch(row, size * b0, 8 * size, ahead)
    s0, d0, m0 = part4(row, size * b0, yp, 32 * b0)
    s1, d1, m1 = part4(row, size * (b0 + 4), yp, 32 * (b0 + 4))
    return flt(_block_sums4(s0, s1), S.concat(d0, d1), S.concat(m0, m1), yp, 32 * nb + 4 * b0,
               36 * nb + 4 * b0, 8)


@njit(inline="always", cache=True)
def _terms4(part4, flt, size, row, b0, nb, yp, ahead):
    _prefetch(row, size * b0, 4 * size, ahead)
    s, d, m = part4(row, size * b0, yp, 32 * b0)
    return flt(_sums_in_lanes(s), d, m, yp, 32 * nb + 4 * b0, 36 * nb + 4 * b0, 4)


@njit(inline="always", cache=True)
def _one32(part4, flt, blocks, size, row, yq, yp):
    """One row of a 32-block type (``size`` bytes per block)."""
    nb, sumf = row.shape[0] // size, F(0)
    for g in range(nb // 8):
        sumf = S.add_in_order(sumf, _terms8(part4, flt, size, row, g, nb, yp, PREFETCH))
    if nb % 8 >= 4:
        sumf = S.add_in_order(sumf, _terms4(part4, flt, size, row, nb // 8 * 8, nb, yp, PREFETCH))
    return blocks(row, yq, nb // 4 * 4, nb, sumf)


@njit(inline="always", cache=True)
def _four32(part4, flt, blocks, size, sweep, r0, r1, r2, r3, yq, yp):
    """Four rows of a 32-block type, their terms added as 4-lane vectors."""
    nb, s, ahead = r0.shape[0] // size, S.zeros(4, "f32"), NO_PREFETCH
    for g in range(nb // 8):
        _prefetch_next4(r0, 8 * size * g, 8 * size, sweep)
        s = _add_rows4(s, _terms8(part4, flt, size, r0, g, nb, yp, ahead),
                       _terms8(part4, flt, size, r1, g, nb, yp, ahead),
                       _terms8(part4, flt, size, r2, g, nb, yp, ahead),
                       _terms8(part4, flt, size, r3, g, nb, yp, ahead))
    if nb % 8 >= 4:
        b0 = nb // 8 * 8
        _prefetch_next4(r0, size * b0, 4 * size, sweep)
        s = _add_rows4x4(s, _terms4(part4, flt, size, r0, b0, nb, yp, ahead),
                         _terms4(part4, flt, size, r1, b0, nb, yp, ahead),
                         _terms4(part4, flt, size, r2, b0, nb, yp, ahead),
                         _terms4(part4, flt, size, r3, b0, nb, yp, ahead))
    b = nb // 4 * 4
    return (blocks(r0, yq, b, nb, S.lane(s, 0)), blocks(r1, yq, b, nb, S.lane(s, 1)),
            blocks(r2, yq, b, nb, S.lane(s, 2)), blocks(r3, yq, b, nb, S.lane(s, 3)))


# Four rows of the nibble types take 4 blocks of each row at a time and keep everything
# in "block-major, row-minor" lanes (lane 4b + r: block b of row r): the rows' dot lanes are
# summed by a transpose of in-lane unpacks (_rows_sum4), the scales picked straight into
# that order (_field4x4), the activations' d and extra read from their 4-fold copies
# (_rep_d, _rep_e), and each block's 4 terms added to the rows' sums as one 4-lane vector.
# Cross-lane permutes (one per cycle here, where unpacks and blends issue four) are thus
# only the quant gathers and two per scale field.

#: vpunpck{l,h}dq and vpunpck{l,h}qdq: within each 128-bit lane k, the low or high half
#: of a and of b interleaved by int32 (first two) or by int64 (last two)
_UNPACK_LO32 = S.permutation2([4 * k + i // 2 + 16 * (i % 2)
                               for k in range(4) for i in range(4)])
_UNPACK_HI32 = S.permutation2([4 * k + 2 + i // 2 + 16 * (i % 2)
                               for k in range(4) for i in range(4)])
_UNPACK_LO64 = S.permutation2([4 * k + i % 2 + 16 * (i // 2)
                               for k in range(4) for i in range(4)])
_UNPACK_HI64 = S.permutation2([4 * k + 2 + i % 2 + 16 * (i // 2)
                               for k in range(4) for i in range(4)])


@njit(inline="always", cache=True)
def _rows_sum4(s0, s1, s2, s3):
    """Four rows' int32 x16 -> x16: lane 4k + r = the sum of lanes 4k..4k+3 of row r."""
    t01 = _UNPACK_LO32(s0, s1) + _UNPACK_HI32(s0, s1)
    t23 = _UNPACK_LO32(s2, s3) + _UNPACK_HI32(s2, s3)
    return _UNPACK_LO64(t01, t23) + _UNPACK_HI64(t01, t23)


def _field4x4(size: int, off: int) -> object:
    """``f(a, b)`` on two rows' first :func:`_span4` vectors (block 3's field must lie in
    it): 16 uint16 lanes, lane 4b + r (r = 0, 1; lanes r = 2, 3 repeat them) the half at
    byte ``off`` of block b of row r."""
    return S.permutation2([64 * (r % 2) + size * b + off + e
                           for b in range(4) for r in range(4) for e in range(2)])


def _fields_row(size: int, offs) -> object:
    """``f(a, c)`` on one row's two :func:`_span4` vectors: for each field offset in
    ``offs`` (d, m), 16 uint16 lanes, lane 4b + r (every r) the half of block b."""
    src = [q if q < 64 else q + 128 - 4 * size
           for f in offs for b in range(4) for _ in range(4) for e in range(2)
           for q in [size * b + f + e]]
    return S.permutation2(src)


def _select_rows(n: int, rows) -> object:
    """``f(x, y)`` on two vectors of n bytes (uint16 lanes 4b + r): lanes of rows ``rows``
    from x, the others from y (a blend)."""
    return S.permutation2([j if (j // 2) % 4 in rows else n + j for j in range(n)])


_ROW0_32, _ROW2_32, _ROWS01_32 = (_select_rows(32, r) for r in ((0,), (2,), (0, 1)))
_ROW0_64, _ROW2_64, _ROWS01_64 = (_select_rows(64, r) for r in ((0,), (2,), (0, 1)))


@njit(inline="always", cache=True)
def _halves4x4(pick, a0, a1, a2, a3):
    """float32 x16, lane 4b + r = the half ``pick`` (:func:`_field4x4`) selects in block b
    of row r."""
    return _halves(_ROWS01_32(pick(a0, a1), pick(a2, a3)))


@njit(inline="always", cache=True)
def _d_rows(pick, a0, c0, a1, c1, a2, c2, a3, c3):
    """float32 x16, lane 4b + r = d of block b of row r (``pick``: :func:`_fields_row` of
    d alone): one permute per row, then blends."""
    x01 = _ROW0_32(pick(a0, c0), pick(a1, c1))
    x23 = _ROW2_32(pick(a2, c2), pick(a3, c3))
    return _halves(_ROWS01_32(x01, x23))


@njit(inline="always", cache=True)
def _dm_rows(pick, a0, c0, a1, c1, a2, c2, a3, c3):
    """(d, m) as :func:`_d_rows`, ``pick`` the :func:`_fields_row` of (d, m)."""
    x01 = _ROW0_64(pick(a0, c0), pick(a1, c1))
    x23 = _ROW2_64(pick(a2, c2), pick(a3, c3))
    h = S.bitcast(_ROWS01_64(x01, x23), "u16")
    return S.f16_to_f32(S.lanes(h, 0, 16)), S.f16_to_f32(S.lanes(h, 16, 16))


@njit(inline="always", cache=True)
def _dm_q4_0(a0, c0, a1, c1, a2, c2, a3, c3):
    d = _halves4x4(_D4X4_Q4_0, a0, a1, a2, a3)
    return d, d


@njit(inline="always", cache=True)
def _dm_q5_0(a0, c0, a1, c1, a2, c2, a3, c3):
    d = _d_rows(_D_ROW_Q5_0, a0, c0, a1, c1, a2, c2, a3, c3)
    return d, d


@njit(inline="always", cache=True)
def _dm_q4_1(a0, c0, a1, c1, a2, c2, a3, c3):
    return _dm_rows(_DM_ROW_Q4_1, a0, c0, a1, c1, a2, c2, a3, c3)


@njit(inline="always", cache=True)
def _dm_q5_1(a0, c0, a1, c1, a2, c2, a3, c3):
    return _dm_rows(_DM_ROW_Q5_1, a0, c0, a1, c1, a2, c2, a3, c3)


_D4X4_Q4_0, _D_ROW_Q5_0 = _field4x4(B_Q4_0, 0), _fields_row(B_Q5_0, (0,))
_DM_ROW_Q4_1, _DM_ROW_Q5_1 = _fields_row(B_Q4_1, (0, 2)), _fields_row(B_Q5_1, (0, 2))


@njit(inline="always", cache=True)
def _terms4x4(codes, dm, flt, size, sweep, r0, r1, r2, r3, b0, nb, yp):
    """The float terms of blocks b0..b0+3 of four rows, lane 4b + r = block b0 + b of
    row r (``codes``: _codes_<t>, ``dm``: _dm_<t>), the next four rows prefetched by
    :func:`_prefetch_next4`."""
    p, pq = size * b0, 32 * b0
    _prefetch_next4(r0, p, 4 * size, sweep)
    a0, c0 = _span4(r0, p, size)
    a1, c1 = _span4(r1, p, size)
    a2, c2 = _span4(r2, p, size)
    a3, c3 = _span4(r3, p, size)
    l0, h0 = codes(a0, c0)
    l1, h1 = codes(a1, c1)
    l2, h2 = codes(a2, c2)
    l3, h3 = codes(a3, c3)
    sums = _rows_sum4(_nibble_dot4(l0, h0, yp, pq), _nibble_dot4(l1, h1, yp, pq),
                      _nibble_dot4(l2, h2, yp, pq), _nibble_dot4(l3, h3, yp, pq))
    d, m = dm(a0, c0, a1, c1, a2, c2, a3, c3)
    return flt(sums, d, m, yp, _rep_d(nb, b0), _rep_e(nb, b0), 16)


@njit(inline="always", cache=True)
def _four_nibbles(codes, dm, flt, blocks, size, sweep, r0, r1, r2, r3, yq, yp):
    """Four rows of a nibble type (Q4_0 Q4_1 Q5_0 Q5_1): 4 blocks of each at a time, each
    block's 4 terms (one per row) added to the rows' sums in block order."""
    nb, s = r0.shape[0] // size, S.zeros(4, "f32")
    for g in range(nb // 4):
        t = _terms4x4(codes, dm, flt, size, sweep, r0, r1, r2, r3, 4 * g, nb, yp)
        s = s + S.lanes(t, 0, 4)
        s = s + S.lanes(t, 4, 4)
        s = s + S.lanes(t, 8, 4)
        s = s + S.lanes(t, 12, 4)
    b = nb // 4 * 4
    return (blocks(r0, yq, b, nb, S.lane(s, 0)), blocks(r1, yq, b, nb, S.lane(s, 1)),
            blocks(r2, yq, b, nb, S.lane(s, 2)), blocks(r3, yq, b, nb, S.lane(s, 3)))


@njit(cache=True)
def _simd_q4_0(row, yq, yp):
    out_of_line()
    return _one32(_part4_q4_0, _float_q4_0, blocks_q4_0, B_Q4_0, row, yq, yp)


@njit(inline="always", cache=True)
def _rows4_q4_0(r0, r1, r2, r3, yq, yp):
    return _four_nibbles(_codes_q4_0, _dm_q4_0, _float_q4_0, blocks_q4_0,
                         B_Q4_0, _SW_Q4_0, r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _simd_q5_0(row, yq, yp):
    out_of_line()
    return _one32(_part4_q5_0, _float_q5_0, blocks_q5_0, B_Q5_0, row, yq, yp)


@njit(inline="always", cache=True)
def _rows4_q5_0(r0, r1, r2, r3, yq, yp):
    return _four_nibbles(_codes_q5_0, _dm_q5_0, _float_q5_0, blocks_q5_0,
                         B_Q5_0, _SW_Q5_0, r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _simd_q4_1(row, yq, yp):
    out_of_line()
    return _one32(_part4_q4_1, _float_q4_1, blocks_q4_1, B_Q4_1, row, yq, yp)


@njit(inline="always", cache=True)
def _rows4_q4_1(r0, r1, r2, r3, yq, yp):
    return _four_nibbles(_codes_q4_1, _dm_q4_1, _float_q4_1, blocks_q4_1,
                         B_Q4_1, _SW_Q4_1, r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _simd_q5_1(row, yq, yp):
    out_of_line()
    return _one32(_part4_q5_1, _float_q5_1, blocks_q5_1, B_Q5_1, row, yq, yp)


@njit(inline="always", cache=True)
def _rows4_q5_1(r0, r1, r2, r3, yq, yp):
    return _four_nibbles(_codes_q5_1, _dm_q5_1, _float_q5_1, blocks_q5_1,
                         B_Q5_1, _SW_Q5_1, r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _simd_q8_0(row, yq, yp):
    out_of_line()
    return _one32(_part4_q8_0, _float_q8_0, blocks_q8_0, B_Q8_0, row, yq, yp)


@njit(inline="always", cache=True)
def _rows4_q8_0(r0, r1, r2, r3, yq, yp):
    return _four32(_part4_q8_0, _float_q8_0, blocks_q8_0, B_Q8_0, _SW_Q8_0, r0, r1, r2, r3,
                   yq, yp)


# ---------------------------------------------------------------------------- K-quants
# Q8_K block (292 B): d:f32 @0, qs:i8[256] @4, bsums:i16[16] @260.
# _<t>_ints(row, p, yp, pp): the integer parts of the block at byte p of a weight row
# (16 int32 lanes of scaled class sums, lanes c and 8 + c being ggml's aux32[c]; plus the
# mins of Q4_K/Q5_K). The float parts follow per row (_simd_<t>) or four rows at a time
# (_rows4_<t>), whose per-row lanes see exactly the same operations.

_SC02, _SC13 = _lane_pairs(0, 2), _lane_pairs(1, 3)
_SC46, _SC57 = _lane_pairs(4, 6), _lane_pairs(5, 7)
_SHL_42 = S.constant([4] * 16 + [2] * 16, "u16")      # Q5_K qh bits 0 | 2 -> bit 4
_SHL_31 = S.constant([3] * 16 + [1] * 16, "u16")      # bits 1 | 3
_SHR_02 = S.constant([0] * 16 + [2] * 16, "u16")      # bits 4 | 6
_SHR_13 = S.constant([1] * 16 + [3] * 16, "u16")      # bits 5 | 7
_FOLD2 = S.permutation2([i % 8 + (16 if i >= 8 else 0) for i in range(16)])
_FOLD2_HI = S.permutation2([8 + i % 8 + (16 if i >= 8 else 0) for i in range(16)])
_SPREAD01 = S.permutation([0] * 8 + [1] * 8)            # 4 row scalars -> 8 lanes each
_SPREAD23 = S.permutation([2] * 8 + [3] * 8)
_REP4 = S.permutation(list(range(8)) * 4)


@njit(inline="always", cache=True)
def _fold2(a, b):
    """[aux32 of a | aux32 of b]: the class sums of two rows' blocks, 8 lanes each."""
    return _FOLD2(a, b) + _FOLD2_HI(a, b)


@njit(inline="always", cache=True)
def _spread4(x):
    """float32 x4 (one per row) -> lanes 0..7 = x[0], 8..15 = x[1]; and x[2], x[3]."""
    return _SPREAD01(x), _SPREAD23(x)


@njit(inline="always", cache=True)
def _rows4_result(sumf, s01, s23):
    """Each row's ``sumf + sums[0] + ... + sums[7]`` (ggml's final loop)."""
    return (S.add_in_order(S.lane(sumf, 0), S.lanes(s01, 0, 8)),
            S.add_in_order(S.lane(sumf, 1), S.lanes(s01, 8, 8)),
            S.add_in_order(S.lane(sumf, 2), S.lanes(s23, 0, 8)),
            S.add_in_order(S.lane(sumf, 3), S.lanes(s23, 8, 8)))


def _k4_scale_bytes(i: int) -> tuple[int, int]:
    """Q4_K/Q5_K scale (i < 8) or min (i - 8) i: the scales bytes holding its low bits
    and its top 2 bits (ggml's ``utmp`` unpacking; the same byte where it has none)."""
    j, base = i % 8, 4 * (i >= 8)
    return (base + j, base + j) if j < 4 else (8 + j - 4, base + j - 4)


#: the two bytes of :func:`_k4_scale_bytes` as a uint16 lane (low, high), taken from the
#: block's first 16 bytes (scales byte k is vector byte 4 + k)
_K4_SC_BYTES = S.permutation([4 + b for i in range(16) for b in _k4_scale_bytes(i)])
_K4_SC_SHIFT = S.constant([4 * (i >= 12) for i in range(16)], "u16")
_K4_SC_LOW = S.constant([63 if i % 8 < 4 else 15 for i in range(16)], "u16")
_K4_SC_TOP = S.constant([0 if i % 8 < 4 else 0x30 for i in range(16)], "u16")


@njit(inline="always", cache=True)
def _k4_scales(row, p):
    """Scales and mins of a Q4_K/Q5_K block, 8 uint16 lanes each (ggml's ``utmp``)."""
    w = S.bitcast(_K4_SC_BYTES(S.load(row, p, 16, "u8")), "u16")
    v = ((w >> _K4_SC_SHIFT()) & _K4_SC_LOW()) | ((w >> 10) & _K4_SC_TOP())
    return S.lanes(v, 0, 8), S.lanes(v, 8, 8)


@njit(inline="always", cache=True)
def _k4_dots(lo0, hi0, lo1, hi1, sc, yp, pp):
    """The scaled class sums of a Q4_K/Q5_K block from its codes, in 16 int32 lanes."""
    z = S.zeros(16, "i32")
    a = _scaled(z, S.dpbusd(z, lo0, S.load(yp, pp, 64, "i8")), _SC02(sc))
    a = _scaled(a, S.dpbusd(z, hi0, S.load(yp, pp + 64, 64, "i8")), _SC13(sc))
    a = _scaled(a, S.dpbusd(z, lo1, S.load(yp, pp + 128, 64, "i8")), _SC46(sc))
    return _scaled(a, S.dpbusd(z, hi1, S.load(yp, pp + 192, 64, "i8")), _SC57(sc))


@njit(inline="always", cache=True)
def _q4_k_ints(row, p, yp, pp, ahead):       # d@0 dmin@2 scales@4 qs@16, 144 B
    _prefetch(row, p, B_Q4_K, ahead)
    sc8, mins = _k4_scales(row, p)
    sc = S.opaque(S.convert(sc8, "i32"))
    w0 = _CLASS32X2(S.load(row, p + 16, 64, "u8"))
    w1 = _CLASS32X2(S.load(row, p + 80, 64, "u8"))
    return _k4_dots(w0 & 15, w0 >> 4, w1 & 15, w1 >> 4, sc, yp, pp), mins


@njit(inline="always", cache=True)
def _q5_k_ints(row, p, yp, pp, ahead):       # d@0 dmin@2 scales@4 qh@16 qs@48, 176 B
    _prefetch(row, p, B_Q5_K, ahead)
    sc8, mins = _k4_scales(row, p)
    sc = S.opaque(S.convert(sc8, "i32"))
    qh = S.load(row, p + 16, 32, "u8")
    h = S.bitcast(_CLASS32X2(S.concat(qh, qh)), "u16")     # bit 2j: sub-block 2j's bit 4
    w0 = _CLASS32X2(S.load(row, p + 48, 64, "u8"))
    w1 = _CLASS32X2(S.load(row, p + 112, 64, "u8"))
    lo0 = (w0 & 15) | (S.bitcast(h << _SHL_42(), "u8") & 16)
    hi0 = (w0 >> 4) | (S.bitcast(h << _SHL_31(), "u8") & 16)
    lo1 = (w1 & 15) | (S.bitcast(h >> _SHR_02(), "u8") & 16)
    hi1 = (w1 >> 4) | (S.bitcast(h >> _SHR_13(), "u8") & 16)
    return _k4_dots(lo0, hi0, lo1, hi1, sc, yp, pp), mins


@njit(inline="always", cache=True)
def _k4_float(row, p, yq, py, yp, pp, acc, mins, sums, sumf):
    """Q4_K/Q5_K per-block float part: sums[l] += d * aux32[l]; sumf -= dmin * sumi."""
    sumi = S.hsum(S.madd(S.load(yp, pp + 256, 8, "i16"), S.convert(mins, "i16")))
    yd = S.scalar_at(yq, py, "f32")
    dd = S.halves_at(row, p, 2)
    sums = sums + S.convert(_fold8(acc), "f32") * (S.lane(dd, 0) * yd)
    return sums, sumf - (S.lane(dd, 1) * yd) * F(sumi)


@njit(inline="always", cache=True)
def _k4_float4(r0, r1, r2, r3, p, yq, py, yp, pp, a0, a1, a2, a3, m0, m1, m2, m3,
               s01, s23, sumf):
    """_k4_float for four rows: their d/dmin, sums and sumf side by side."""
    mins = S.convert(S.concat(S.concat(m0, m1), S.concat(m2, m3)), "i16")
    sumi = _sums_in_lanes(S.madd(_REP4(S.load(yp, pp + 256, 8, "i16")), mins))
    dd = S.concat(S.concat(S.halves_at(r0, p, 2), S.halves_at(r1, p, 2)),
                  S.concat(S.halves_at(r2, p, 2), S.halves_at(r3, p, 2)))
    dd = dd * S.scalar_at(yq, py, "f32")                  # d, dmin of rows 0..3, interleaved
    d01, d23 = _spread4(_EVEN4(dd))
    s01 = s01 + S.convert(_fold2(a0, a1), "f32") * d01
    s23 = s23 + S.convert(_fold2(a2, a3), "f32") * d23
    return s01, s23, sumf - _ODD4(dd) * S.convert(sumi, "f32")


@njit(cache=True)
def _simd_q4_k(row, yq, yp):
    out_of_line()
    sums, sumf = S.zeros(8, "f32"), F(0)
    for i in range(row.shape[0] // B_Q4_K):
        acc, mins = _q4_k_ints(row, B_Q4_K * i, yp, 272 * i, PREFETCH)
        sums, sumf = _k4_float(row, B_Q4_K * i, yq, B_Q8_K * i, yp, 272 * i, acc, mins, sums,
                               sumf)
    return S.add_in_order(sumf, sums)


@njit(inline="always", cache=True)
def _rows4_q4_k(r0, r1, r2, r3, yq, yp):
    ahead = NO_PREFETCH
    s01, s23, sumf = S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(4, "f32")
    for i in range(r0.shape[0] // B_Q4_K):
        p, pp = B_Q4_K * i, 272 * i
        _prefetch_next4(r0, p, B_Q4_K, _SW_Q4_K)
        a0, m0 = _q4_k_ints(r0, p, yp, pp, ahead)
        a1, m1 = _q4_k_ints(r1, p, yp, pp, ahead)
        a2, m2 = _q4_k_ints(r2, p, yp, pp, ahead)
        a3, m3 = _q4_k_ints(r3, p, yp, pp, ahead)
        s01, s23, sumf = _k4_float4(r0, r1, r2, r3, p, yq, B_Q8_K * i, yp, pp, a0, a1, a2, a3,
                                    m0, m1, m2, m3, s01, s23, sumf)
    return _rows4_result(sumf, s01, s23)


@njit(cache=True)
def _simd_q5_k(row, yq, yp):
    out_of_line()
    sums, sumf = S.zeros(8, "f32"), F(0)
    for i in range(row.shape[0] // B_Q5_K):
        acc, mins = _q5_k_ints(row, B_Q5_K * i, yp, 272 * i, PREFETCH)
        sums, sumf = _k4_float(row, B_Q5_K * i, yq, B_Q8_K * i, yp, 272 * i, acc, mins, sums,
                               sumf)
    return S.add_in_order(sumf, sums)


@njit(inline="always", cache=True)
def _rows4_q5_k(r0, r1, r2, r3, yq, yp):
    ahead = NO_PREFETCH
    s01, s23, sumf = S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(4, "f32")
    for i in range(r0.shape[0] // B_Q5_K):
        p, pp = B_Q5_K * i, 272 * i
        _prefetch_next4(r0, p, B_Q5_K, _SW_Q5_K)
        a0, m0 = _q5_k_ints(r0, p, yp, pp, ahead)
        a1, m1 = _q5_k_ints(r1, p, yp, pp, ahead)
        a2, m2 = _q5_k_ints(r2, p, yp, pp, ahead)
        a3, m3 = _q5_k_ints(r3, p, yp, pp, ahead)
        s01, s23, sumf = _k4_float4(r0, r1, r2, r3, p, yq, B_Q8_K * i, yp, pp, a0, a1, a2, a3,
                                    m0, m1, m2, m3, s01, s23, sumf)
    return _rows4_result(sumf, s01, s23)


_SHL_Q6 = S.constant([4] * 16 + [2] * 16, "u16")      # qh bits 0-1 | 2-3 -> bits 4-5
_SHR_Q6 = S.constant([0] * 16 + [2] * 16, "u16")      # bits 4-5 | 6-7 -> bits 4-5
#: Q6_K scale of int16 lane t of the scales vector: value chunk m's scale pairs (4m, 4m+1
#: for _pairs16 dwords 0..7, 4m+2, 4m+3 for 8..15) are dword m of each 128-bit lane, taken
#: by one in-lane ``vpshufd`` (_SC16_m)
_Q6_SC_OF = S.permutation([4 * ((t // 2) % 4) + 2 * (t // 16) + t % 2 for t in range(32)])
_SC16_0, _SC16_1, _SC16_2, _SC16_3 = [S.permutation([4 * (d // 4) + m for d in range(16)])
                                      for m in range(4)]


@njit(inline="always", cache=True)
def _pairs_dot(acc, u, yp, pq, pb, scales):
    """acc + scale * (class sums of 4 sub-blocks of 16) for codes u in :func:`_pairs16`
    order, activations at pq and their offset pair sums at pb (integers: exact in any
    order, so a block's four calls chain through one accumulator)."""
    return _pairs_term(acc, u, S.load(yp, pq, 64, "i8"), S.load(yp, pb, 32, "i16"), scales)


@njit(inline="always", cache=True)
def _pairs_term(acc, u, ya, yo, scales):
    """:func:`_pairs_dot` on activations ``ya`` and offset pair sums ``yo`` already loaded
    (four rows' planes share them, :func:`_q3_k_plane4`)."""
    return S.dpwssd(acc, S.maddubs(u, ya) - yo, S.bitcast(scales, "i16"))


@njit(inline="always", cache=True)
def _q6_k_ints(row, p, yp, pp, ahead):       # ql@0 qh@128 scales:i8@192 d@208, 210 B
    _prefetch(row, p, B_Q6_K, ahead)
    sc = S.bitcast(S.opaque(S.convert(_Q6_SC_OF(S.load(row, p + 192, 16, "i8")), "i16")), "i32")
    x0 = S.load(row, p, 64, "u8")                      # ql: values 0..63 (low), 64..127 (high)
    h0 = S.load(row, p + 128, 32, "u8")
    h = S.bitcast(S.concat(h0, h0), "u16")
    z = S.zeros(16, "i32")
    a = _pairs_dot(z, _PAIRS16((x0 & 15) | (S.bitcast(h << _SHL_Q6(), "u8") & 0x30)), yp, pp,
                   pp + 256, _SC16_0(sc))
    a = _pairs_dot(a, _PAIRS16((x0 >> 4) | (S.bitcast(h >> _SHR_Q6(), "u8") & 0x30)), yp,
                   pp + 64, pp + 320, _SC16_1(sc))
    x1 = S.load(row, p + 64, 64, "u8")                 # values 128..191, 192..255
    h1 = S.load(row, p + 160, 32, "u8")
    h = S.bitcast(S.concat(h1, h1), "u16")
    a = _pairs_dot(a, _PAIRS16((x1 & 15) | (S.bitcast(h << _SHL_Q6(), "u8") & 0x30)), yp,
                   pp + 128, pp + 384, _SC16_2(sc))
    return _pairs_dot(a, _PAIRS16((x1 >> 4) | (S.bitcast(h >> _SHR_Q6(), "u8") & 0x30)), yp,
                      pp + 192, pp + 448, _SC16_3(sc))


#: Q3_K codes of the 4 bit planes from two bytes per value: x holds quant bits 0..3
#: (planes 0, 1) and the value's hmask bits of planes 0, 1 at bits 4, 5; y quant bits 4..7
#: (planes 2, 3) and hmask bits of planes 2, 3 at bits 0, 1. The hmask byte holds plane j's
#: bit at j for the first 128 values and at 4 + j for the second (the even and the odd
#: dwords of the :func:`_q3_pairs` order): 16-bit shifts by half move them there (a
#: byte's bits that cross into its neighbour land outside the bits kept)
_SHL_HX = S.constant([4 if w // 2 % 2 == 0 else 0 for w in range(32)], "u16")
_SHR_HY = S.constant([2 if w // 2 % 2 == 0 else 6 for w in range(32)], "u16")
#: plane j's code (crumb + 4 * hmask bit, 0..7; ggml's value + 4) picked from x or y
_Q3_U0, _Q3_U1 = S.bit_picker((0, 1, 4)), S.bit_picker((2, 3, 5))
_Q3_U2, _Q3_U3 = S.bit_picker((4, 5, 0)), S.bit_picker((6, 7, 1))
_Q3_PAIRS = S.permutation(_q3_pairs())

#: Q3_K scales of four rows, decoded together (:func:`_q3_k_scales4`). Each row's 16
#: bytes from p + 94 (the block's last 16: scales byte k is byte 2 + k) fill a 128-bit
#: lane; one in-lane shuffle makes its 64-bit halves scales bytes (0..3, 8..11) and
#: (4..7, 8..11): all the bits of scales 0..3, 8..11 and of 4..7, 12..15. Scale i has
#: its low 4 bits in byte i % 8 (high nibble for i >= 8), its top 2 in byte 8 + i % 4 at
#: bit 2 * (i // 4) (ggml's kmask1/kmask2 unpacking); a ``vpmultishiftqb`` per part moves
#: them to bits 0..3 and 4..5 of the output byte. Output bytes per row, in plane order
#: (plane j's scale pairs: sub-blocks 2j, 2j + 1 of the first 128 values, then of the
#: second): s0 s1 s8 s9 | s2 s3 s10 s11 | s4 s5 s12 s13 | s6 s7 s14 s15
_Q3_SC_ORDER = (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)
_Q3_SC_ARRANGE = S.permutation([16 * r + 2 + k for r in range(4)
                                for k in (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11)])
_Q3_SC_LOW = S.multishift([8 * (i % 4) + 4 * (i >= 8) for _ in range(4) for i in _Q3_SC_ORDER])
_Q3_SC_HIGH = S.multishift([32 + 8 * (i % 4) + 2 * (i // 4) - 4
                            for _ in range(4) for i in _Q3_SC_ORDER])
#: bytes of the scales buffer one four-row decode fills: row r's plane j scale quad (int16
#: x4) at 32 * r + 8 * j
_Q3_SC_BYTES = 128
#: float32 lanes of :func:`.bits.stack_f32` holding one decode, two (a double buffer)
_Q3_SC_F32, _Q3_SC2_F32 = _Q3_SC_BYTES // 4, _Q3_SC_BYTES // 2


@njit(inline="always", cache=True)
def _q3_k_scales4(r0, r1, r2, r3, p, buf, o):
    """The 16 scales minus 32 of the Q3_K blocks at byte p of four rows into ``buf`` from
    byte o (int16, row r's plane j quad at o + 32 r + 8 j): 4 loads, 7 vector operations
    and 2 stores for four rows, where decoding each row into the vpshufd-ready order took
    7 per row and 4 ``vpshufd`` a row (one per plane)."""
    z = S.concat(S.concat(S.load(r0, p + 94, 16, "u8"), S.load(r1, p + 94, 16, "u8")),
                 S.concat(S.load(r2, p + 94, 16, "u8"), S.load(r3, p + 94, 16, "u8")))
    a = _Q3_SC_ARRANGE(z)
    v = S.bitcast((_Q3_SC_LOW(a) & 15) | (_Q3_SC_HIGH(a) & 0x30), "i8") - np.int8(32)
    w = S.convert(v, "i16")
    S.store(buf, o, S.lanes(w, 0, 32))
    S.store(buf, o + 64, S.lanes(w, 32, 32))


@njit(inline="always", cache=True)
def _q3_k_scale_pairs(buf, o):
    """A plane's four scales (int16 x4 at byte o of ``buf``) in every 64-bit lane: the
    scale pairs of the first and the second 128 values in the even and odd int32 lanes
    of the :func:`_q3_pairs` order. A ``vpbroadcastq`` from memory is a load (no vector
    pipe), where a shuffle of a register (``vpshufd``) took one of them per plane."""
    return S.bitcast(S.splat(S.scalar_at(buf, o, "i64"), 8, "i64"), "i32")


@njit(inline="always", cache=True)
def _q3_k_ints(row, p, yp, pp, buf, o):   # hmask@0 qs@32 scales@96 d@108, 110 B
    """int32 lane 2c + h: the scaled class-c sums of the block's first (h = 0) or second
    128 values; the row's scales at byte o of ``buf`` (:func:`_q3_k_scales4`)."""
    x, y = _q3_k_xy(row, p)
    a = _pairs_dot(S.zeros(16, "i32"), _Q3_U0(x), yp, pp, pp + 256, _q3_k_scale_pairs(buf, o))
    a = _pairs_dot(a, _Q3_U1(x), yp, pp + 64, pp + 320, _q3_k_scale_pairs(buf, o + 8))
    a = _pairs_dot(a, _Q3_U2(y), yp, pp + 128, pp + 384, _q3_k_scale_pairs(buf, o + 16))
    return _pairs_dot(a, _Q3_U3(y), yp, pp + 192, pp + 448, _q3_k_scale_pairs(buf, o + 24))


@njit(inline="always", cache=True)
def _q3_k_xy(row, p):
    """The block's x and y (:data:`_SHL_HX`): quant and hmask bytes in :func:`_q3_pairs`
    order, merged two planes a byte."""
    q = _Q3_PAIRS(S.load(row, p + 32, 64, "u8"))      # permuted once for the 4 planes
    hm0 = S.load(row, p, 32, "u8")
    h = S.bitcast(_Q3_PAIRS(S.concat(hm0, hm0)), "u16")
    x = (q & 15) | (S.bitcast(h << _SHL_HX(), "u8") & 0xF0)
    y = (q & 0xF0) | (S.bitcast(h >> _SHR_HY(), "u8") & 15)
    return x, y


@njit(inline="always", cache=True)
def _q3_k_plane4(a0, a1, a2, a3, u0, u1, u2, u3, yp, pp, buf, o):
    """:func:`_pairs_dot` of four rows (codes u0..u3, scales at byte o + 32 r of ``buf``),
    one plane: its activations at pp and offset pair sums at pp + 256 loaded once."""
    ya, yo = S.load(yp, pp, 64, "i8"), S.load(yp, pp + 256, 32, "i16")
    return (_pairs_term(a0, u0, ya, yo, _q3_k_scale_pairs(buf, o)),
            _pairs_term(a1, u1, ya, yo, _q3_k_scale_pairs(buf, o + 32)),
            _pairs_term(a2, u2, ya, yo, _q3_k_scale_pairs(buf, o + 64)),
            _pairs_term(a3, u3, ya, yo, _q3_k_scale_pairs(buf, o + 96)))


@njit(inline="always", cache=True)
def _q3_k_ints4(r0, r1, r2, r3, p, yp, pp, buf, o):
    """:func:`_q3_k_ints` of four rows, written plane by plane over the rows (the four
    rows' weight loads and permutes first): LLVM keeps roughly this order, and the loop
    ran ~5% faster than with the rows one after the other (kernels/README.md)."""
    x0, y0 = _q3_k_xy(r0, p)
    x1, y1 = _q3_k_xy(r1, p)
    x2, y2 = _q3_k_xy(r2, p)
    x3, y3 = _q3_k_xy(r3, p)
    z = S.zeros(16, "i32")
    a0, a1, a2, a3 = _q3_k_plane4(z, z, z, z, _Q3_U0(x0), _Q3_U0(x1), _Q3_U0(x2), _Q3_U0(x3),
                                  yp, pp, buf, o)
    a0, a1, a2, a3 = _q3_k_plane4(a0, a1, a2, a3, _Q3_U1(x0), _Q3_U1(x1), _Q3_U1(x2),
                                  _Q3_U1(x3), yp, pp + 64, buf, o + 8)
    a0, a1, a2, a3 = _q3_k_plane4(a0, a1, a2, a3, _Q3_U2(y0), _Q3_U2(y1), _Q3_U2(y2),
                                  _Q3_U2(y3), yp, pp + 128, buf, o + 16)
    return _q3_k_plane4(a0, a1, a2, a3, _Q3_U3(y0), _Q3_U3(y1), _Q3_U3(y2), _Q3_U3(y3), yp,
                        pp + 192, buf, o + 24)


#: two rows' class sums side by side in 128-bit lanes: lane 2c from a, 2c + 1 from b
_BLEND_EO = S.permutation2([i if i % 2 == 0 else 16 + i for i in range(16)])
#: float lanes of :func:`_q3_k_fold2`'s order back to row-major (8 class lanes a row)
_UNZIP_EO = S.permutation(list(range(0, 16, 2)) + list(range(1, 16, 2)))
#: the four rows' d (float32 x4) spread as rows (0, 1) or (2, 3) alternating
_ALT01, _ALT23 = S.permutation([0, 1] * 8), S.permutation([2, 3] * 8)


@njit(inline="always", cache=True)
def _q3_k_fold2(a, b):
    """ggml's aux32 of two rows (int32 lanes 2c + h of :func:`_q3_k_ints` -> lane 2c: class c
    of a, 2c + 1: of b) with in-lane operations (LLVM makes one blend, one two-source
    permute and an add), where :func:`_pairwise`'s two cross-lane ``vpermt2d`` put each
    row's 8 sums in one 256-bit half (6.5 cycles each on the block's dependency chain)."""
    return _BLEND_EO(a + _SWAP32(a), b + _SWAP32(b))


@njit(cache=True)
def _simd_q6_k(row, yq, yp):
    out_of_line()
    sums = S.zeros(8, "f32")
    for i in range(row.shape[0] // B_Q6_K):
        acc = _q6_k_ints(row, B_Q6_K * i, yp, 512 * i, PREFETCH)
        d = S.half_at(row, B_Q6_K * i + 208) * S.scalar_at(yq, B_Q8_K * i, "f32")
        sums = sums + S.convert(_fold8(acc), "f32") * d
    return S.add_in_order(F(0), sums)


@njit(inline="always", cache=True)
def _rows4_q6_k(r0, r1, r2, r3, yq, yp):
    ahead = NO_PREFETCH
    s01, s23 = S.zeros(16, "f32"), S.zeros(16, "f32")
    for i in range(r0.shape[0] // B_Q6_K):
        p, pp = B_Q6_K * i, 512 * i
        _prefetch_next4(r0, p, B_Q6_K, _SW_Q6_K)
        a0, a1 = _q6_k_ints(r0, p, yp, pp, ahead), _q6_k_ints(r1, p, yp, pp, ahead)
        a2, a3 = _q6_k_ints(r2, p, yp, pp, ahead), _q6_k_ints(r3, p, yp, pp, ahead)
        d01, d23 = _spread4(S.halves4(r0, r1, r2, r3, p + 208) * S.scalar_at(yq, B_Q8_K * i, "f32"))
        s01 = s01 + S.convert(_fold2(a0, a1), "f32") * d01
        s23 = s23 + S.convert(_fold2(a2, a3), "f32") * d23
    return _rows4_result(S.zeros(4, "f32"), s01, s23)


# Q3_K without AVX-512 (the activations in :func:`_q3_lanes` order): 32-byte vectors and
# in-lane shuffles only. The 64-byte form's two permutes of a block's weight bytes
# (:func:`_q3_k_xy`) cross 128-bit lanes, which AVX2 has no byte shuffle for: ~30% of its
# time there (2-core Zen 3, 2026-11-28), and its four rows' vectors spilled AVX2's 16
# registers. Same integers, same float operations: the same bits.

#: in each 128-bit lane, bytes c and c + 8 side by side (``vpshufb``)
_Q3Y_PAIR = S.permutation([16 * (i // 16) + (i % 16) // 2 + 8 * (i % 2) for i in range(32)])
#: two planes' paired codes a, b -> dword c of a lane: a's pair of class c, then b's
#: (``vpunpcklwd``: classes 0..3; ``vpunpckhwd``: 4..7)
_Q3Y_LO, _Q3Y_HI = [S.permutation2([16 * L + 8 * g + 2 * c + e + 32 * src for L in range(2)
                                    for c in range(4) for src in range(2) for e in range(2)])
                    for g in range(2)]
#: the scales of vectors 4h + 2r + g from a row's 16 (``_q3_k_scales4``' quads: int16 4j +
#: 2h + L is sub-block 8h + 2j + L): int16 i holds plane 2r + i % 2's, lane L = i // 8
_Q3Y_SC0, _Q3Y_SC1, _Q3Y_SC2, _Q3Y_SC3 = [
    S.permutation([4 * (2 * r + i % 2) + 2 * h + i // 8 for i in range(16)])
    for h in range(2) for r in range(2)]


@njit(inline="always", cache=True)
def _q3y_codes(q, hm, plane, hbit):
    """Codes (crumb + 4 * hmask bit, 0..7) of one plane from bytes already paired."""
    return S.bit_field(q, plane, 2) | (((hm >> hbit) & 1) << 2)


@njit(inline="always", cache=True)
def _q3y_pair(lo, hi, a, b, yp, pv, sc):
    """``lo``, ``hi`` + the scaled class sums of the planes with codes a and b (vector pair
    at byte pv of the prepared activations; their offset pair sums 256 bytes on)."""
    tl = S.maddubs(_Q3Y_LO(a, b), S.load(yp, pv, 32, "i8")) - S.load(yp, pv + 256, 16, "i16")
    th = (S.maddubs(_Q3Y_HI(a, b), S.load(yp, pv + 32, 32, "i8"))
          - S.load(yp, pv + 288, 16, "i16"))
    return S.dpwssd(lo, tl, sc), S.dpwssd(hi, th, sc)


@njit(inline="always", cache=True)
def _q3_k_ints_ymm(row, p, yp, pp, buf, o):
    """ggml's aux32 (int32 lane c: class c) of the block at byte p, the row's scales at
    byte o of ``buf`` (:func:`_q3_k_scales4`)."""
    hm = _Q3Y_PAIR(S.load(row, p, 32, "u8"))
    q0, q1 = _Q3Y_PAIR(S.load(row, p + 32, 32, "u8")), _Q3Y_PAIR(S.load(row, p + 64, 32, "u8"))
    z = S.load(buf, o, 16, "i16")
    lo, hi = S.zeros(8, "i32"), S.zeros(8, "i32")
    lo, hi = _q3y_pair(lo, hi, _q3y_codes(q0, hm, 0, 0), _q3y_codes(q0, hm, 2, 1), yp, pp,
                       _Q3Y_SC0(z))
    lo, hi = _q3y_pair(lo, hi, _q3y_codes(q0, hm, 4, 2), _q3y_codes(q0, hm, 6, 3), yp, pp + 64,
                       _Q3Y_SC1(z))
    lo, hi = _q3y_pair(lo, hi, _q3y_codes(q1, hm, 0, 4), _q3y_codes(q1, hm, 2, 5), yp,
                       pp + 128, _Q3Y_SC2(z))
    lo, hi = _q3y_pair(lo, hi, _q3y_codes(q1, hm, 4, 6), _q3y_codes(q1, hm, 6, 7), yp,
                       pp + 192, _Q3Y_SC3(z))
    return S.concat(S.lanes(lo, 0, 4) + S.lanes(lo, 4, 4), S.lanes(hi, 0, 4) + S.lanes(hi, 4, 4))


@njit(cache=True)
def _simd_q3_k(row, yq, yp):
    out_of_line()
    buf = stack_f32(_Q3_SC_F32)
    sums = S.zeros(8, "f32")
    for i in range(row.shape[0] // B_Q3_K):
        p = B_Q3_K * i
        _prefetch(row, p, B_Q3_K, PREFETCH)
        _q3_k_scales4(row, row, row, row, p, buf, 0)
        S.clobber(buf)
        d = S.half_at(row, p + 108) * S.scalar_at(yq, B_Q8_K * i, "f32")
        if S.has_avx512():
            acc = _q3_k_ints(row, p, yp, 512 * i, buf, 0)
            sums = sums + S.convert(_EVEN8(acc) + _ODD8(acc), "f32") * d
        else:
            sums = sums + S.convert(_q3_k_ints_ymm(row, p, yp, 512 * i, buf, 0), "f32") * d
    return S.add_in_order(F(0), sums)


@njit(inline="always", cache=True)
def _rows4_q3_k(r0, r1, r2, r3, yq, yp, buf):
    """Four rows; block i + 1's scales are decoded during block i into the other half of
    a double buffer ``buf`` (the broadcasts of block i read what was stored a block
    earlier). Without AVX-512 the rows' sums (:func:`_q3_k_ints_ymm`) one after the
    other, row r's 8 class lanes at 8 * (r % 2) of ``s01`` (r < 2) or ``s23``."""
    s01, s23 = S.zeros(16, "f32"), S.zeros(16, "f32")
    nb = r0.shape[0] // B_Q3_K
    if nb > 0:
        _q3_k_scales4(r0, r1, r2, r3, 0, buf, 0)
    for i in range(nb):
        p, pp, o = B_Q3_K * i, 512 * i, _Q3_SC_BYTES * (i & 1)
        _prefetch_next4(r0, p, B_Q3_K, _SW_Q3_K)
        if i + 1 < nb:
            _q3_k_scales4(r0, r1, r2, r3, p + B_Q3_K, buf, _Q3_SC_BYTES - o)
        S.clobber(buf)
        d = S.halves4(r0, r1, r2, r3, p + 108) * S.scalar_at(yq, B_Q8_K * i, "f32")
        if S.has_avx512():
            a0, a1, a2, a3 = _q3_k_ints4(r0, r1, r2, r3, p, yp, pp, buf, o)
            s01 = s01 + S.convert(_q3_k_fold2(a0, a1), "f32") * _ALT01(d)
            s23 = s23 + S.convert(_q3_k_fold2(a2, a3), "f32") * _ALT23(d)
        else:
            s01 = s01 + S.concat(
                S.convert(_q3_k_ints_ymm(r0, p, yp, pp, buf, o), "f32") * S.lane(d, 0),
                S.convert(_q3_k_ints_ymm(r1, p, yp, pp, buf, o + 32), "f32") * S.lane(d, 1))
            s23 = s23 + S.concat(
                S.convert(_q3_k_ints_ymm(r2, p, yp, pp, buf, o + 64), "f32") * S.lane(d, 2),
                S.convert(_q3_k_ints_ymm(r3, p, yp, pp, buf, o + 96), "f32") * S.lane(d, 3))
    if S.has_avx512():
        s01, s23 = _UNZIP_EO(s01), _UNZIP_EO(s23)
    return _rows4_result(S.zeros(4, "f32"), s01, s23)


@njit(cache=True)
def _groups4_q3_k(w, r0, r1, yq, yp, out):
    """:func:`_rows4_q3_k` of rows r0..r1 of ``w`` (r1 - r0 a multiple of 4) into ``out``,
    in one call: a call per four rows (the array arguments passed field by field, the
    constants loaded again, the double buffer's first decode) cost ~70 ns, ~28% of the
    four rows' time at K = 4096 (kernels/README.md)."""
    out_of_line()
    buf = stack_f32(_Q3_SC2_F32)
    for r in range(r0, r1, 4):
        out[r], out[r + 1], out[r + 2], out[r + 3] = _rows4_q3_k(w[r], w[r + 1], w[r + 2],
                                                                 w[r + 3], yq, yp, buf)


#: Q2_K: the sub-block of each int16 lane of ``maddubs(plane j codes, activations)``:
#: lane t sums values 2t, 2t + 1 of bit plane j, of sub-block 2j + (0, 1, 8, 9)[t // 8].
#: Each plane's 32 scales in two steps: the 16 scales (int16) as 32 lanes, scales 0..7 in
#: the first two 128-bit lanes and 8..15 in the last two, once a block (cross-lane); then
#: each plane's by a shuffle within 128-bit lanes (``vpshufb``), where a plane's own
#: cross-lane permute took a ``vpermq`` more per 32 bytes on AVX2
_SC2_X = S.permutation([t % 8 + 8 * (t // 16) for t in range(32)])
_SC2X_0, _SC2X_1, _SC2X_2, _SC2X_3 = [S.permutation([8 * (t // 8) + 2 * j + (t // 8) % 2
                                                     for t in range(32)]) for j in range(4)]


@njit(inline="always", cache=True)
def _q2_k_isum_pairs(row, p, y0, y1, y2, y3):
    """int32 lanes summing to ggml's isum of the block at p: each plane's codes (0..3)
    dotted with the activations in int16 pairs (``maddubs``, at most 2 * 3 * 127), scaled
    by the pairs' sub-block scales and summed to int32 (``madd``; isum is an integer: any
    order is exact), ggml's AVX2 q2_K dot. The one-row kernel's, and the four rows' where
    VNNI is missing: there ``dpbusd`` is three instructions, and :func:`_q2_k_isum`'s code
    x scale table (a 64-byte lookup and three bit picks a row, emulated without VBMI and
    GFNI) cost more than it saved (2-core Zen 3, 2026-11-28)."""
    x = _SC2_X(S.opaque(S.convert(S.load(row, p, 16, "u8"), "i16") & 15))
    q = S.load(row, p + 16, 64, "u8")
    acc = S.dpwssd(S.zeros(16, "i32"), S.maddubs(q & 3, y0), _SC2X_0(x))
    acc = S.dpwssd(acc, S.maddubs(S.bit_field(q, 2, 2), y1), _SC2X_1(x))
    acc = S.dpwssd(acc, S.maddubs(S.bit_field(q, 4, 2), y2), _SC2X_2(x))
    return S.dpwssd(acc, S.maddubs(S.bit_field(q, 6, 2), y3), _SC2X_3(x))


@njit(inline="always", cache=True)
def _q2_k_ints(row, p, yq, py, yp, pp, ahead):   # scales@0 qs@16 d@80 dmin@82, 84 B
    """(isum lanes, summs lanes): ggml's isum and summs of the block, still spread over
    int32 lanes (16 and 8) whose sums they are (:func:`_q2_k_isum_pairs`)."""
    _prefetch(row, p, B_Q2_K, ahead)
    acc = _q2_k_isum_pairs(row, p, S.load(yp, pp, 64, "i8"), S.load(yp, pp + 64, 64, "i8"),
                           S.load(yp, pp + 128, 64, "i8"), S.load(yp, pp + 192, 64, "i8"))
    mins = S.convert(S.load(row, p, 16, "u8"), "i16") >> 4
    return acc, S.madd(S.load(yq, py + 260, 16, "i16"), mins)


_DMIN_LAST = S.permutation([0, 2, 4, 6, 1, 3, 5, 7])


def _in_lanes(n, picks):
    """Two n-lane int32 vectors -> n lanes: in each 128-bit lane (4 int32 lanes) c, its
    lanes ``picks`` of a then of b (``vpunpck*``: no lane crossing)."""
    return S.permutation2([4 * c + i + (n if src else 0)
                           for c in range(n // 4) for src, i in picks])


#: interleaved int32 (``vpunpck[lh]dq``) and int64 (``vpunpck[lh]qdq``) halves
_LO32, _HI32 = [(0, 0), (1, 0), (0, 1), (1, 1)], [(0, 2), (1, 2), (0, 3), (1, 3)]
_LO64, _HI64 = [(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 2), (0, 3), (1, 2), (1, 3)]
_LO32_16, _HI32_16 = _in_lanes(16, _LO32), _in_lanes(16, _HI32)
_LO64_16, _HI64_16 = _in_lanes(16, _LO64), _in_lanes(16, _HI64)


@njit(inline="always", cache=True)
def _lane_sums16(a, b, c, d):
    """Four 16-lane int32 vectors -> 16 lanes: int32 lane 4L + r holds the sum of 128-bit
    lane L of the r-th of a, b, c, d (6 in-lane unpacks, 3 adds)."""
    t0 = _LO32_16(a, b) + _HI32_16(a, b)
    t1 = _LO32_16(c, d) + _HI32_16(c, d)
    return _LO64_16(t0, t1) + _HI64_16(t0, t1)


@njit(cache=True)
def _simd_q2_k(row, yq, yp):
    out_of_line()
    sumf = F(0)
    for i in range(row.shape[0] // B_Q2_K):
        p, py = B_Q2_K * i, B_Q8_K * i
        isum, summs = _q2_k_ints(row, p, yq, py, yp, PREP_Q2_K * i, PREFETCH)
        yd = S.scalar_at(yq, py, "f32")
        dd = S.halves_at(row, p + 80, 2)
        sumf += ((yd * S.lane(dd, 0)) * F(S.hsum(isum))
                 - (yd * S.lane(dd, 1)) * F(S.hsum(summs)))
    return sumf


@njit(inline="always", cache=True)
def _rows4_u32(r0, r1, r2, r3, p):
    """The 4 bytes at p of each of four rows (int32 lane r: row r): one vector and one
    ``vcvtph2ps`` for four rows' (d, dmin), where four half-pair loads took four."""
    return S.concat(S.concat(S.load(r0, p, 1, "u32"), S.load(r1, p, 1, "u32")),
                    S.concat(S.load(r2, p, 1, "u32"), S.load(r3, p, 1, "u32")))


#: Q2_K four-row form: the 16 scale bytes of rows 0..3 side by side (``_q2_k_scales4``,
#: 128-bit lane r: row r). Row r's byte table (``_q2_k_table``): in 128-bit lane L, byte
#: 4j + c = c * (scale of the sub-block that plane j's codes in lane L belong to, 2j +
#: (0, 1, 8, 9)[L]), made by one byte permute of the scales, an or of 16c and one
#: lookup in ``_Q2_MUL`` (byte 16c + s = c * s)
_Q2_SC_R0, _Q2_SC_R1, _Q2_SC_R2, _Q2_SC_R3 = (
    S.permutation([16 * r + 2 * j + (0, 1, 8, 9)[L] for L in range(4) for j in range(4)
                   for c in range(4)]) for r in range(4))
_Q2_C16 = S.constant([16 * c for L in range(4) for j in range(4) for c in range(4)], "u8")
_Q2_MUL = S.constant([(i // 16) * (i % 16) for i in range(64)], "u8")
#: plane j's codes as table indices 4j + code (one ``vgf2p8affineqb`` each; plane 0: q & 3)
_Q2_IDX1, _Q2_IDX2, _Q2_IDX3 = (S.bit_picker([2 * j, 2 * j + 1], 4 * j) for j in (1, 2, 3))
#: int32 lanes of the four rows' scale bytes -> lane 4L + r: row r's bytes 4L..4L+3
_Q2_MINS_T = S.permutation([4 * r + L for L in range(4) for r in range(4)])
_Q2_ISUM_SUMMS_A = S.permutation2(list(range(8)) + list(range(16, 24)))
_Q2_ISUM_SUMMS_B = S.permutation2(list(range(8, 16)) + list(range(24, 32)))
_Q2_SWAP128 = S.permutation([i ^ 4 for i in range(16)])
#: float32 (dall, dmin) pairs of rows 0..3 -> dall in lanes 0..3, dmin in lanes 8..11
_Q2_DD16 = S.permutation([0, 2, 4, 6] * 2 + [1, 3, 5, 7] * 2)


@njit(inline="always", cache=True)
def _q2_k_scales4(r0, r1, r2, r3, p):
    """The 16 scale bytes of the blocks at p of four rows, row r in 128-bit lane r."""
    return S.concat(S.concat(S.load(r0, p, 16, "u8"), S.load(r1, p, 16, "u8")),
                    S.concat(S.load(r2, p, 16, "u8"), S.load(r3, p, 16, "u8")))


@njit(inline="always", cache=True)
def _q2_k_table(sc):
    """A row's code x scale byte table from its scale bytes ``sc`` as ``_Q2_SC_R<r>``
    picks them (scales are their low nibbles, at most 15: products at most 45)."""
    return S.lookup64(_Q2_MUL(), (sc & 15) | _Q2_C16())


@njit(inline="always", cache=True)
def _q2_k_isum(row, p, tab, y0, y1, y2, y3):
    """int32 lanes summing to ggml's isum of one row's block: each plane's codes looked
    up as code * scale bytes (``vpshufb`` of the row's table) and dotted with the
    activations by one ``vpdpbusd`` (products at most 45 * 128: exact, no int16 step)."""
    q = S.load(row, p + 16, 64, "u8")
    acc = S.dpbusd(S.zeros(16, "i32"), S.lookup16(tab, q & 3), y0)
    acc = S.dpbusd(acc, S.lookup16(tab, _Q2_IDX1(q)), y1)
    acc = S.dpbusd(acc, S.lookup16(tab, _Q2_IDX2(q)), y2)
    return S.dpbusd(acc, S.lookup16(tab, _Q2_IDX3(q)), y3)


@njit(inline="always", cache=True)
def _q2_k_mins4(s4, yp, pb):
    """int32 lane 4L + r: row r's sum of mins[4L + b] * bsums[4L + b] over b, from the
    scale bytes' high nibbles and the activations' split bsums (``_prep_q2_k_bsums``):
    128 * dpbusd(mins, hi) + dpbusd(mins, lo)."""
    t = S.bit_field(S.bitcast(_Q2_MINS_T(S.bitcast(s4, "i32")), "u8"), 4, 4)
    hi = S.dpbusd(S.zeros(16, "i32"), t, S.load(yp, pb, 64, "i8"))
    return S.dpbusd(hi << 7, t, S.load(yp, pb + 64, 64, "i8"))


@njit(inline="always", cache=True)
def _rows4_q2_k(r0, r1, r2, r3, yq, yp):
    sumf = S.zeros(4, "f32")
    for i in range(r0.shape[0] // B_Q2_K):
        p, py, pp = B_Q2_K * i, B_Q8_K * i, PREP_Q2_K * i
        _prefetch_next4(r0, p, B_Q2_K, _SW_Q2_K)
        s4 = _q2_k_scales4(r0, r1, r2, r3, p)
        y0, y1 = S.load(yp, pp, 64, "i8"), S.load(yp, pp + 64, 64, "i8")
        y2, y3 = S.load(yp, pp + 128, 64, "i8"), S.load(yp, pp + 192, 64, "i8")
        if S.has_vnni():
            a0 = _q2_k_isum(r0, p, _q2_k_table(_Q2_SC_R0(s4)), y0, y1, y2, y3)
            a1 = _q2_k_isum(r1, p, _q2_k_table(_Q2_SC_R1(s4)), y0, y1, y2, y3)
            a2 = _q2_k_isum(r2, p, _q2_k_table(_Q2_SC_R2(s4)), y0, y1, y2, y3)
            a3 = _q2_k_isum(r3, p, _q2_k_table(_Q2_SC_R3(s4)), y0, y1, y2, y3)
        else:
            a0 = _q2_k_isum_pairs(r0, p, y0, y1, y2, y3)
            a1 = _q2_k_isum_pairs(r1, p, y0, y1, y2, y3)
            a2 = _q2_k_isum_pairs(r2, p, y0, y1, y2, y3)
            a3 = _q2_k_isum_pairs(r3, p, y0, y1, y2, y3)
        v = _lane_sums16(a0, a1, a2, a3)                  # lane 4L + r: isum parts
        m = _q2_k_mins4(s4, yp, pp + 256)                 # lane 4L + r: summs parts
        c = _Q2_ISUM_SUMMS_A(v, m) + _Q2_ISUM_SUMMS_B(v, m)
        sums = S.convert(c + _Q2_SWAP128(c), "f32")      # lanes 0..3 isum, 8..11 summs
        dd = _halves(_rows4_u32(r0, r1, r2, r3, p + 80))          # d, dmin of rows 0..3
        t = _Q2_DD16(S.scalar_at(yq, py, "f32") * dd) * sums     # dall*isum, dmin*summs
        sumf = sumf + (S.lanes(t, 0, 4) - S.lanes(t, 8, 4))
    return S.lane(sumf, 0), S.lane(sumf, 1), S.lane(sumf, 2), S.lane(sumf, 3)


@njit(inline="always", cache=True)
def _groups4(rows4, w, r0, r1, yq, yp, out):
    """``rows4`` (a type's four-row kernel, ``_rows4_<t>``) of rows r0..r1 of ``w`` (r1 - r0
    a multiple of 4) into ``out``. Each type's ``_groups4_<t>`` is one out-of-line call of
    this for a task's rows: a call per four rows cost ~70 ns (Q3_K: ~28% of the four rows'
    time at K = 4096, kernels/README.md). The nibble types (Q4_0 Q4_1 Q5_0 Q5_1) and Q5_K pass
    their out-of-line ``_simd4_<t>`` instead, a call per four rows: with the body inlined
    in this loop the nibble types ran 2-7% slower in cache, Q5_K 3-5% faster in cache but
    at 85-90% of the streaming read against 91-99% (2 threads, kernels/README.md). (Passed a kernel as a run-time argument, the fused
    matvec could not be cached: "uses dynamic globals".)"""
    for r in range(r0, r1, 4):
        out[r], out[r + 1], out[r + 2], out[r + 3] = rows4(w[r], w[r + 1], w[r + 2], w[r + 3],
                                                           yq, yp)


@njit(cache=True)
def _simd4_q4_0(r0, r1, r2, r3, yq, yp):
    out_of_line()
    return _rows4_q4_0(r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _groups4_q4_0(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_simd4_q4_0, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _simd4_q5_0(r0, r1, r2, r3, yq, yp):
    out_of_line()
    return _rows4_q5_0(r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _groups4_q5_0(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_simd4_q5_0, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _simd4_q4_1(r0, r1, r2, r3, yq, yp):
    out_of_line()
    return _rows4_q4_1(r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _groups4_q4_1(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_simd4_q4_1, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _simd4_q5_1(r0, r1, r2, r3, yq, yp):
    out_of_line()
    return _rows4_q5_1(r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _groups4_q5_1(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_simd4_q5_1, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _groups4_q8_0(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_rows4_q8_0, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _groups4_q4_k(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_rows4_q4_k, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _simd4_q5_k(r0, r1, r2, r3, yq, yp):
    out_of_line()
    return _rows4_q5_k(r0, r1, r2, r3, yq, yp)


@njit(cache=True)
def _groups4_q5_k(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_simd4_q5_k, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _groups4_q6_k(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_rows4_q6_k, w, r0, r1, yq, yp, out)


@njit(cache=True)
def _groups4_q2_k(w, r0, r1, yq, yp, out):
    out_of_line()
    _groups4(_rows4_q2_k, w, r0, r1, yq, yp, out)


# ---------------------------------------------------------------------------- dispatch


@njit(inline="always", cache=True)
def dot_row_simd(code, row, yq, yp):
    """ggml_vec_dot of raw weight row ``row`` with one activation row: ``yq`` quantized
    to the vec_dot_type, ``yp`` = :func:`prepare_row` of it. ``code`` in :data:`CODES`."""
    if code == Q4_K:
        return _simd_q4_k(row, yq, yp)
    if code == Q6_K:
        return _simd_q6_k(row, yq, yp)
    if code == Q8_0:
        return _simd_q8_0(row, yq, yp)
    if code == Q5_0:
        return _simd_q5_0(row, yq, yp)
    if code == Q4_0:
        return _simd_q4_0(row, yq, yp)
    if code == Q5_K:
        return _simd_q5_k(row, yq, yp)
    if code == Q3_K:
        return _simd_q3_k(row, yq, yp)
    if code == Q2_K:
        return _simd_q2_k(row, yq, yp)
    if code == Q4_1:
        return _simd_q4_1(row, yq, yp)
    if code == Q5_1:
        return _simd_q5_1(row, yq, yp)
    return F(np.nan)


@njit(inline="always", cache=True)
def dot_groups4_simd(code, w, r0, r1, yq, yp, out):
    """``out[r]`` = :func:`dot_row_simd` of weight row ``w[r]`` for r in r0..r1 (r1 - r0 a
    multiple of 4), four rows at a time with the same activations, in one call for the
    whole span (``_groups4_<t>``: :func:`_groups4` of the type's four-row kernel
    ``_rows4_<t>``; Q3_K's :func:`_groups4_q3_k`)."""
    if code == Q4_K:
        _groups4_q4_k(w, r0, r1, yq, yp, out)
    elif code == Q6_K:
        _groups4_q6_k(w, r0, r1, yq, yp, out)
    elif code == Q8_0:
        _groups4_q8_0(w, r0, r1, yq, yp, out)
    elif code == Q5_0:
        _groups4_q5_0(w, r0, r1, yq, yp, out)
    elif code == Q4_0:
        _groups4_q4_0(w, r0, r1, yq, yp, out)
    elif code == Q5_K:
        _groups4_q5_k(w, r0, r1, yq, yp, out)
    elif code == Q3_K:
        _groups4_q3_k(w, r0, r1, yq, yp, out)
    elif code == Q2_K:
        _groups4_q2_k(w, r0, r1, yq, yp, out)
    elif code == Q4_1:
        _groups4_q4_1(w, r0, r1, yq, yp, out)
    elif code == Q5_1:
        _groups4_q5_1(w, r0, r1, yq, yp, out)
    else:
        out[r0:r1] = np.nan
