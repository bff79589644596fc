"""Numba kernels against their numpy references (kernels/*.py), on odd sizes.

Tolerances, in the order of the file:

* exact (``array_equal``): row decoding vs gguf-py, activation quantizers, ggml's
  quantized dots vs their numpy reimplementation, binary ops, scale, the F16 GELU
  table, set_rows, cpy, cont;
* 1 float32 ulp: rms_norm/norm (float64 sums added in another order);
* 1e-5 of ``|x| @ |W|.T``: mul_mat vs ``x @ dequantize(W).T`` (float32, other order);
* a few ulp (``rtol`` 2e-6): silu/gelu/tanh/rope/softmax/flash attention, whose
  transcendental functions come from libm in the kernel and from numpy's own float32
  implementations (or float64) in the reference.

The first run compiles every kernel (~1 min on 2 cores); numba's cache makes later
runs take seconds.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

import gguf_writer as W
from graphcost.format import ggml_types as gt
from graphcost.execute.kernels_loader import load_kernels
from graphcost.execute.weights import read_only
from graphcost.resources import bundled

K = load_kernels()
Q, MM, GR = K.quants, K.matmul, K.get_rows
E, NORM, ROPE, SM, FA, CACHE = K.elementwise, K.norm, K.rope, K.softmax, K.attention, K.cache

TYPES = list(Q.SUPPORTED)
IDS = [t.name for t in TYPES]


def row_len(qt: QT) -> int:
    """An odd number of blocks: 3 super-blocks (768) for K-quants, 3 blocks (96) for the
    32-blocks, 97 for the float types."""
    return {QT.F32: 97, QT.F16: 97, QT.BF16: 97}.get(qt, 768 if qt.name.endswith("_K") else 96)


def weight(qt: QT, rows: int, seed: int = 0) -> np.ndarray:
    """Raw ``[rows, row_bytes]`` uint8 weight from the shared fixture maker, read-only as
    the executor's weights are (:func:`read_only`: the kernels are compiled for the one
    array type the executor gives them, not a second time for a writable copy)."""
    w = W.make_weight(np.random.default_rng(seed), (rows, row_len(qt)), qt)
    return read_only(np.ascontiguousarray(w).view(np.uint8).reshape(rows, -1))


def bound_of(w, qt, x):
    """|x| @ |W|.T in float64: the scale of a dot product's rounding error."""
    wd = np.abs(Q.dequantize_ref(w, qt, x.shape[1])).astype(np.float64)
    return np.abs(x).astype(np.float64) @ wd.T


def rand(shape, seed=1, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------- loader


def test_loader_imports_the_bundled_directory_once():
    assert K is load_kernels()
    assert K.__name__ == "graphcost_kernels"
    assert K.__path__ == [str(bundled("kernels"))]
    assert K.matmul.__name__ == "graphcost_kernels.matmul"      # relative imports resolved


# ---------------------------------------------------------------------------- quants


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_get_rows_decodes_like_gguf(qt):
    w = weight(qt, 13)
    idx = np.array([12, 0, 5, 5, 7])                              # repeats, out of order
    got = GR.get_rows(w, qt, row_len(qt), idx)
    assert got.shape == (5, row_len(qt)) and got.dtype == np.float32
    assert np.array_equal(got, GR.get_rows_ref(w, qt, row_len(qt), idx))


def test_get_rows_rejects_bad_index():
    with pytest.raises(IndexError):
        GR.get_rows(weight(QT.Q8_0, 3), QT.Q8_0, 96, [3])


def test_unsupported_weight_type_is_refused():
    with pytest.raises(NotImplementedError, match="IQ2_XXS"):
        Q.check_weight(np.zeros((1, 66), np.uint8), QT.IQ2_XXS, 256)


ACT = [(QT.Q8_0, True), (QT.Q8_0, False), (QT.Q8_1, True), (QT.Q8_1, False), (QT.Q8_K, True),
       (QT.F16, True), (QT.BF16, True), (QT.F32, True)]


@pytest.mark.parametrize("qt,x86", ACT, ids=[f"{t.name}-{'x86' if a else 'ref'}" for t, a in ACT])
def test_activation_quantizers_match_reference(qt, x86):
    x = rand((3, 768), scale=3.0)
    x[1, 256:512] = 0.0                                           # an all-zero Q8_K block
    got = Q.quantize_activations(x, qt, x86)
    assert got.shape == (3, Q.row_bytes(qt, 768))
    assert np.array_equal(got, Q.quantize_activations_ref(x, qt, x86))


Q8 = [(QT.Q8_0, True), (QT.Q8_0, False), (QT.Q8_1, True), (QT.Q8_1, False), (QT.Q8_K, True)]


@pytest.mark.warm_up
@pytest.mark.parametrize("qt,x86", Q8, ids=[f"{t.name}-{'x86' if a else 'ref'}" for t, a in Q8])
def test_vector_quantizers_keep_ggml_bytes_on_edge_rows_and_strided_rows(qt, x86):
    # contiguous rows take the 16-lane quantizers (x86 rounding; Q8_K always), strided
    # rows the scalar loops: both must give the reference's bytes on the cases a vector
    # max or search could get wrong
    x = rand((2, 768), scale=3.0)
    x[0, 0:32] = 0.0                                  # an all-zero 32-block
    x[0, 40], x[0, 50] = 9.0, -9.0                    # |max| twice, + first: Q8_K's mx = +9
    x[0, 300], x[0, 301] = -9.5, 9.5                  # - first: mx = -9.5 in block 1
    x[0, 512:768] = -2.0                              # every value is the max (first lane)
    x[1, 32:64] = np.arange(32, dtype=np.float32) - 15.5   # halves: x/d on .5 ties
    x[1, 100] = np.float32(-0.0)
    ref = Q.quantize_activations_ref(x, qt, x86)
    assert np.array_equal(Q.quantize_activations(x, qt, x86), ref)
    wide = np.repeat(x, 2, axis=1)[:, ::2]            # stride 8 bytes: the scalar path
    out = np.empty_like(ref)
    for r in range(2):
        Q.quantize_row(wide[r], np.int64(qt), x86, out[r])
    assert np.array_equal(out, ref)


def test_q8_0_reference_rounding_is_ggml_ref_and_x86_rounds_ties_to_even():
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 127.0, 2.5, -3.5                  # d = 1: x/d hits .5 ties
    ref = Q.quantize_activations(x, QT.Q8_0, x86=False)
    assert np.array_equal(ref, gq.quantize(x, QT.Q8_0))           # == quantize_row_q8_0_ref
    assert list(ref[0, 2:5].view(np.int8)) == [127, 3, -4]        # roundf: away from zero
    simd = Q.quantize_activations(x, QT.Q8_0, x86=True)
    assert list(simd[0, 2:5].view(np.int8)) == [127, 2, -4]       # _mm256_round_ps: even


def test_kernel_type_facts_are_graphcosts():
    # one table of type facts (graphcost.format.ggml_types): the kernels derive theirs from it
    assert Q.VEC_DOT_TYPE == {t: gt.vec_dot_type(t) for t in Q.SUPPORTED}
    assert len(Q.VEC_DOT_TYPE) == 13 and Q.VEC_DOT_TYPE[QT.Q4_1] == QT.Q8_1
    assert all(Q.row_bytes(t, 256) == gt.row_size(t, 256) for t in Q.SUPPORTED)


def test_q8_1_block_is_36_bytes_as_in_ggml_common():
    # gguf-py's GGML_QUANT_SIZES says 40 (an older float layout): 2 halves + 32 quants
    assert Q.row_bytes(QT.Q8_1, 64) == 72


# ---------------------------------------------------------------------------- matmul


@pytest.mark.warm_up
@pytest.mark.parametrize("n", [1, 3, 7], ids=["decode", "n3", "tiled"])
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_mul_mat_matches_dequantized_matmul(qt, n):
    k, m = row_len(qt), 13
    w, x = weight(qt, m), rand((n, k))
    y = MM.mul_mat(w, qt, k, m, x)
    assert y.shape == (n, m) and y.dtype == np.float32
    assert np.all(np.abs(y - MM.mul_mat_ref(w, qt, k, m, x)) <= 1e-5 * bound_of(w, qt, x))


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q8_0, QT.F16], ids=["Q4_K", "Q8_0", "F16"])
def test_mul_mat_tiled_path_over_many_partial_tiles(qt, monkeypatch):
    k, m = row_len(qt), 23                                        # 8-row tiles: 8, 8, 7
    monkeypatch.setattr(MM, "TILE_BYTES", 8 * 4 * k)
    w, x = weight(qt, m, seed=3), rand((9, k), seed=4)
    err = np.abs(MM.mul_mat(w, qt, k, m, x) - MM.mul_mat_ref(w, qt, k, m, x))
    assert np.all(err <= 1e-5 * bound_of(w, qt, x))


def test_mul_mat_uses_only_the_first_m_rows():
    w, x = weight(QT.Q4_0, 9), rand((1, 96))
    assert np.array_equal(MM.mul_mat(w, QT.Q4_0, 96, 5, x), MM.mul_mat(w[:5], QT.Q4_0, 96, 5, x))


@pytest.mark.parametrize("n", [1, 3], ids=["decode", "n3"])
@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_mul_mat_ggml_is_bit_exact_with_numpy_reimplementation(qt, n):
    k, m = row_len(qt), 13
    w, x = weight(qt, m), rand((n, k))
    assert np.array_equal(MM.mul_mat_ggml(w, qt, k, m, x), MM.mul_mat_ggml_ref(w, qt, k, m, x))


@pytest.mark.parametrize("n", [5, 9])
@pytest.mark.parametrize("qt", [QT.Q4_0, QT.Q5_0, QT.Q4_1, QT.Q5_1, QT.Q4_K, QT.Q6_K],
                         ids=["Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q4_K", "Q6_K"])
def test_mul_mat_ggml_prompt_gemm_is_bit_exact(qt, n):
    # more than MATVEC_MAX_N rows take kernels/gemm.py: 37 weight rows = two 16-row
    # panels and one of 5; n activation rows = full 4-row tiles and a padded one
    assert n > MM.MATVEC_MAX_N and int(qt) in K.gemm.CODES
    k, m = row_len(qt), 37
    w, x = weight(qt, m, seed=4), rand((n, k), seed=6)
    for x86 in (True, False):
        assert np.array_equal(MM.mul_mat_ggml(w, qt, k, m, x, x86),
                              MM.mul_mat_ggml_ref(w, qt, k, m, x, x86))


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.F16], ids=["Q4_K", "F16"])
def test_mul_mat_writes_into_out(qt):
    # the executor's preallocated node outputs: same bits as a fresh result, same array
    k, m = row_len(qt), 13
    w, x = weight(qt, m), rand((3, k))
    for f in (MM.mul_mat, MM.mul_mat_ggml):
        out = np.full((3, m), np.nan, dtype=np.float32)
        assert f(w, qt, k, m, x, out=out) is out
        assert np.array_equal(out, f(w, qt, k, m, x))
        with pytest.raises(ValueError, match="out must be"):
            f(w, qt, k, m, x, out=np.empty((3, m + 1), dtype=np.float32))


# ---------------------------------------------------------------------------- ggml byte SIMD
# mul_mat_ggml on quantized weights runs kernels/vec_dot_simd.py (GGML_SIMD), vectorised
# versions of the scalar vec_dot_ggml dots; row_len's short rows only reach their scalar
# tails, so these use rows that pass through every stage of them.

QUANT = [t for t in TYPES if t not in (QT.F32, QT.F16, QT.BF16)]
QUANT_IDS = [t.name for t in QUANT]
#: byte offsets of the f16 fields of the 32-blocks (the K-quants' are in fixtures)
F16_FIELDS = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,),
              **W.KQUANT_F16_OFFSETS}


def long_row(qt: QT) -> int:
    """32-blocks: 13 blocks = one group of 8, one of 4 and one scalar block; K-quants: 3
    super-blocks."""
    return 768 if qt.name.endswith("_K") else 416


def arbitrary_weight(qt: QT, rows: int, k: int, seed: int = 5) -> np.ndarray:
    """Random bytes in every quant, scale and min field (extreme codes, Q8_0's -128,
    Q6_K scales of -128), finite f16 scales from the fixture maker."""
    good = W.make_weight(np.random.default_rng(seed), (rows, k), qt)
    good = np.ascontiguousarray(good).view(np.uint8).reshape(rows, -1)
    w = np.random.default_rng(seed + 1).integers(0, 256, good.shape, dtype=np.uint8)
    size = Q.row_bytes(qt, GGML_QUANT_SIZES[qt][0])         # one block
    wb, gb = w.reshape(rows, -1, size), good.reshape(rows, -1, size)
    for off in F16_FIELDS[qt]:
        wb[..., off:off + 2] = gb[..., off:off + 2]
    return read_only(w)


@pytest.mark.parametrize("n", [1, 3], ids=["decode", "n3"])
@pytest.mark.parametrize("qt", QUANT, ids=QUANT_IDS)
def test_mul_mat_ggml_simd_is_bit_exact_on_long_rows(qt, n):
    k, m = long_row(qt), 13                      # 13 rows: three 4-row calls and one row
    w = W.make_weight(np.random.default_rng(2), (m, k), qt)
    w, x = read_only(np.ascontiguousarray(w).view(np.uint8).reshape(m, -1)), rand((n, k), scale=3.0)
    for x86 in (True, False):
        assert np.array_equal(MM.mul_mat_ggml(w, qt, k, m, x, x86),
                              MM.mul_mat_ggml_ref(w, qt, k, m, x, x86))


@pytest.mark.parametrize("qt", QUANT, ids=QUANT_IDS)
def test_fused_matvec_is_mul_mat_ggml(qt, monkeypatch):
    # the executor's decode matvec (quantize + rearrange + dots in one call, buffers
    # reused): the same bits as mul_mat_ggml, serial and parallel, run twice. 13 rows:
    # 3 four-row groups and a row, one group a task; 77 rows: 20 groups (the last one
    # row) in 16 tasks (MATVEC_MIN_TASKS), the 4 tasks t with 20 * t // 16 != 20 * (t + 1)
    # // 16 - 1 two groups long (Q2_K/Q3_K: two groups in one kernel call)
    k = long_row(qt)
    w77 = W.make_weight(np.random.default_rng(3), (77, k), qt)
    w77 = read_only(np.ascontiguousarray(w77).view(np.uint8).reshape(77, -1))
    for m, n in ((13, 1), (13, 3), (77, 1)):
        w = w77[:m]
        for serial_below in (0, 1 << 30):
            monkeypatch.setattr(MM, "SERIAL_BELOW", serial_below)
            kern, code, tail = MM.fused_matvec(qt, k, m, n)
            y = np.full((n, m), np.nan, dtype=np.float32)
            for seed in (4, 5):
                x = rand((n, k), scale=3.0, seed=seed)
                kern(w, code, x, *tail, y)
                assert np.array_equal(y, MM.mul_mat_ggml(w, qt, k, m, x))
    assert MM.fused_matvec(qt, k, 13, MM.MATVEC_MAX_N + 1) is None


@pytest.mark.warm_up
@pytest.mark.parametrize("types", [(QT.Q5_0, QT.Q5_0, QT.Q8_0), (QT.Q4_K, QT.Q6_K),
                                   (QT.Q2_K, QT.Q3_K, QT.Q5_K, QT.Q4_0)],
                         ids=["gemma-qkv", "k-pair", "four"])
def test_grouped_matvecs_are_each_members_matvec(types):
    # one parallel region for several matvecs of one x (the executor's Q/K/V and
    # gate/up): the same bits as each member's own fused call. Rows 77, 13, 130, 5: odd
    # counts, a last group of one or two rows, 130 rows = 33 groups: more than
    # MATVEC_TASK_GROUPS on one thread
    k = 768                                       # 3 super-blocks, 24 32-blocks
    rows = (77, 13, 130, 5)[:len(types)]
    ws = [read_only(np.ascontiguousarray(W.make_weight(np.random.default_rng(10 + i), (m, k), qt))
                    .view(np.uint8).reshape(m, -1)) for i, (qt, m) in enumerate(zip(types, rows))]
    x = rand((1, k), scale=3.0, seed=8)
    members = []
    for qt, m, w in zip(types, rows, ws):
        kern, code, tail = MM.fused_matvec(qt, k, m, 1)
        members.append((w, code, x, *tail, np.full((1, m), np.nan, dtype=np.float32)))
    shares = np.ones(1, dtype=np.int64)
    kern, args = MM.group_matvecs(members, shares)
    # 2, 3 or 4 members: padded to 4 (members of no rows), one numba type, one compile
    assert MM.GROUP_PAD == 4 and all(len(a) == 4 for a in (args[0], args[5], args[6], args[7]))
    assert [w.shape[0] for w in args[0]] == list(rows) + [0] * (4 - len(rows))
    before = numba.get_num_threads()
    # every thread's share of every member (5 rows: 2 groups, none for a third thread)
    for threads in sorted({1, min(3, numba.config.NUMBA_NUM_THREADS), before}):
        numba.set_num_threads(threads)
        try:
            # twice (the buffers are reused), with any share count: the same bits
            for seed, shares[0] in ((8, threads), (9, 5)):
                x[:] = rand((1, k), scale=3.0, seed=seed)
                for a in members:
                    a[-1][:] = np.nan
                kern(*args)
                for qt, m, w, a in zip(types, rows, ws, members):
                    assert np.array_equal(a[-1], MM.mul_mat_ggml(w, qt, k, m, x)), qt.name
        finally:
            numba.set_num_threads(before)
    # refused: one member, another x, another x86 rounding
    assert MM.group_matvecs(members[:1], shares) is None
    other = (members[1][0], members[1][1], x.copy(), *members[1][3:])
    assert MM.group_matvecs([members[0], other], shares) is None
    flipped = (*members[1][:4], not members[1][4], *members[1][5:])
    assert MM.group_matvecs([members[0], flipped], shares) is None


@pytest.mark.warm_up
@pytest.mark.parametrize("qt", QUANT, ids=QUANT_IDS)
def test_simd_and_scalar_ggml_dots_agree_on_arbitrary_bytes(qt, monkeypatch):
    # no 16-bit pair sum may saturate and no offset may be lost, whatever the bytes
    k, m = long_row(qt), 7
    w, x = arbitrary_weight(qt, m, k), rand((2, k), seed=6, scale=100.0)
    x[1, :32] = 0.0                                               # a zero activation block
    simd = MM.mul_mat_ggml(w, qt, k, m, x)
    monkeypatch.setattr(MM, "GGML_SIMD", False)
    assert np.array_equal(simd, MM.mul_mat_ggml(w, qt, k, m, x))
    assert np.array_equal(simd, MM.mul_mat_ggml_ref(w, qt, k, m, x))


def _host_features() -> set[str]:
    from llvmlite import binding
    return {f for f, on in binding.get_host_cpu_features().items() if on}


def test_byte_dots_compile_to_the_cpus_dot_instructions():
    # the point of kernels/simd.py: LLVM does not find these from scalar code
    from numba import njit
    S = K.simd

    @njit(cache=False)
    def dots(a, b):
        u, s = S.load(a, 0, 64, "u8"), S.load(b, 0, 64, "i8")
        return S.hsum(S.dpbusd(S.zeros(16, "i32"), u, s)) + S.hsum(S.maddubs(u, s))

    a = np.arange(64, dtype=np.uint8) % 100
    b = (np.arange(64) % 50 - 25).astype(np.int8)
    want = 2 * int((a.astype(np.int64) * b).sum())
    assert dots(a, b.view(np.uint8)) == want
    asm = dots.inspect_asm(dots.signatures[0])
    feats = _host_features()
    if "avx512vnni" in feats:
        assert "vpdpbusd" in asm
    if "avx2" in feats:
        assert "vpmaddubsw" in asm


def test_multishift_picks_unaligned_bytes_of_each_64_bit_lane():
    # vpmultishiftqb: output byte i = bits offsets[i] .. offsets[i] + 7 of 64-bit lane
    # i // 8, wrapping past bit 63 (the Q3_K scale decode; its plain-IR form runs on the
    # CPUs of test_simd_kernels_are_exact_on_other_cpus)
    from numba import njit
    S = K.simd
    offsets = [(7 * i + 3 * (i // 8)) % 64 for i in range(64)]          # 0..63, some wrap
    pick = S.multishift(offsets)

    @njit(cache=False)
    def run(a, out):
        S.store(out, 0, pick(S.load(a, 0, 64, "u8")))

    a = np.random.default_rng(7).integers(0, 256, 64, dtype=np.uint8)
    out = np.empty(64, np.uint8)
    run(a, out)
    lanes = a.view(np.uint64)
    want = [(int(lanes[i // 8]) >> o | int(lanes[i // 8]) << (64 - o)) & 0xFF
            for i, o in enumerate(offsets)]
    assert out.tolist() == want


# a CPU without AVX-512 (the AVX2 intrinsics) and one without AVX2 (plain LLVM IR)
ISAS = {"avx2": ("haswell", "+avx2,+avx,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+sse4.1,+ssse3"),
        "avx": ("ivybridge", "+avx,+f16c,+popcnt,+sse4.2,+sse4.1,+ssse3"),
        # AVX-512 without VNNI and GFNI: vpmaddubsw zmm, the shift-and-mask bit fields
        "avx512bw": ("skylake-avx512", "+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512cd,"
                     "+avx2,+avx,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+sse4.1,+ssse3")}
ISA_SCRIPT = """
import sys
import numpy as np
sys.path.insert(0, {tests!r})
import gguf_writer as W
from gguf import GGMLQuantizationType as QT
from graphcost.execute.kernels_loader import load_kernels
K = load_kernels()
MM, V, Q = K.matmul, K.vec_dot_simd, K.quants
for name in ("Q4_K", "Q6_K", "Q3_K", "Q2_K", "Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1"):
    # the per-type dots directly (compiling mul_mat_ggml's dispatch for every type costs
    # a minute per CPU model); 13 rows: three 4-row groups in one call and one row, like
    # the kernel
    qt, code = QT[name], np.int64(int(QT[name]))
    k, m = (768 if name.endswith("_K") else 416), 13
    rng = np.random.default_rng(3)
    w = np.ascontiguousarray(W.make_weight(rng, (m, k), qt)).view(np.uint8).reshape(m, -1)
    x = (rng.standard_normal((2, k)) * 3).astype(np.float32)
    want = MM.mul_mat_ggml_ref(w, qt, k, m, x)
    yq = Q.quantize_activations(x, Q.VEC_DOT_TYPE[qt], True)
    one, groups = getattr(V, "_simd_" + name.lower()), getattr(V, "_groups4_" + name.lower())
    for n in range(2):
        yp = np.empty(V.prep_bytes(code, k), np.uint8)
        V.prepare_row(code, yq[n], yp)
        got = np.empty(m, np.float32)
        groups(w, 0, 12, yq[n], yp, got)
        got[12] = one(w[12], yq[n], yp)
        if not np.array_equal(got, want[n]):
            print("MISMATCH", name)
for name in ("Q4_0", "Q5_1", "Q4_K", "Q6_K"):
    # the prompt gemm (kernels/gemm.py) directly: 37 rows = two 16-row panels and one of 5,
    # 5 activation rows = one 4-row tile and a padded one
    qt = QT[name]
    k, m = (768 if name.endswith("_K") else 416), 37
    rng = np.random.default_rng(5)
    w = np.ascontiguousarray(W.make_weight(rng, (m, k), qt)).view(np.uint8).reshape(m, -1)
    x = (rng.standard_normal((5, k)) * 3).astype(np.float32)
    want = MM.mul_mat_ggml_ref(w, qt, k, m, x)
    y = np.empty((5, m), np.float32)
    K.gemm.mul_mat_ggml(w, int(qt), Q.quantize_activations(x, Q.VEC_DOT_TYPE[qt], True), y)
    if not np.array_equal(y, want):
        print("MISMATCH gemm", name)
print("done")
"""


def _isa_skip_reason(isa: str) -> str | None:
    """Why ``isa``'s code cannot run here (None: it can)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return "the CPU models are x86"
    cpu, feats = ISAS[isa]
    wanted, host = {f.lstrip("+") for f in feats.split(",")}, _host_features()
    # the compiled code runs here: the host must have every feature it was compiled for
    missing = sorted(wanted - host)
    if missing:
        return f"this CPU lacks {', '.join(missing)} to run {cpu} code"
    if _vector_features(host) == _vector_features(wanted):
        # kernels/simd.py picks its lowering from these features alone: this host's own
        # compile is the same code, which the other tests here check bit for bit (the
        # Zen 3 VM of sessions 24-27 is a haswell to them; its run took 140 s cold)
        return f"this CPU's vector features are {cpu}'s: the other tests run that code"
    return None


def _vector_features(feats) -> set[str]:
    """The features in ``feats`` that choose how the kernels compile: :mod:`kernels.simd`'s
    branches (AVX-512 subsets, GFNI, AVX2, SSSE3) and LLVM's vector and float lowering."""
    return {f for f in feats if f.startswith("avx") or f in (
        "gfni", "fma", "f16c", "ssse3", "sse4.1", "sse4.2", "bmi", "bmi2", "popcnt")}


def _run_isa_script(isa: str, started: list) -> subprocess.CompletedProcess:
    """ISA_SCRIPT in a new process compiling for ``isa``'s CPU model, with a numba cache
    of its own (``cpu-<isa>`` beside the host's: a second process writing the host's cache
    index files at the same time could pair a signature with another's machine code).
    ``kernels_loader`` drops ``__pycache__/cpu-*`` with the host's cache when a kernel
    source changes."""
    cpu, feats = ISAS[isa]
    cache = Path(os.environ.get("NUMBA_CACHE_DIR") or bundled("kernels") / "__pycache__")
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": feats + ",+sse3,+sse2,+sse,+cx16",
           "NUMBA_CACHE_DIR": str(cache / f"cpu-{isa}")}
    script = ISA_SCRIPT.format(tests=str(Path(__file__).parent))
    with subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        started.append(proc)
        try:
            out, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


#: the other-CPU runs started so far by ISA, their processes, and the one thread that runs
#: them in turn
_ISA_RUNS: dict[str, Future] = {}
_ISA_PROCS: list[subprocess.Popen] = []
_ISA_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="other-cpus")


def start_isa_runs(isas: list[str], after: subprocess.Popen | None = None) -> None:
    """Start the other-CPU compiles of ``isas`` in the background, one at a time (130-150
    s of one core each, cold, on the 2-core Zen 3 of session 27): conftest.py calls this
    once the tests are collected, so they run on the core the suite (one process) leaves
    idle, not in turn with the tests;
    ``after``: a process they start after (conftest's kernel warm-up, on that core too)."""
    def run(isa):
        if after is not None:
            after.wait()
        return _run_isa_script(isa, _ISA_PROCS)
    for isa in isas:
        if isa not in _ISA_RUNS and _isa_skip_reason(isa) is None:
            _ISA_RUNS[isa] = _ISA_POOL.submit(run, isa)


def stop_isa_runs() -> None:
    """End the runs still going or waiting (a session stopped before their tests)."""
    for run in _ISA_RUNS.values():
        run.cancel()
    for proc in _ISA_PROCS:
        if proc.poll() is None:
            proc.kill()


def test_vector_features_cover_every_feature_simd_branches_on():
    # an ISA run is skipped where the host's _vector_features equal its own: sound only
    # while simd.py chooses its code by no feature outside them
    import re
    src = (Path(K.simd.__file__)).read_text()
    used = set(re.findall(r'"([a-z0-9.]+)" in feats', src))
    used |= set(re.findall(r'\(\d+, "llvm[^"]*", "([a-z0-9.]+)"\)', src))   # _pshufb_ir's
    assert {"avx2", "avx512bw", "avx512vnni", "gfni", "ssse3"} <= used
    assert _vector_features(used) == used
    # the Zen 3 VM's (znver3) features beyond haswell's change nothing here
    assert _vector_features({"avx2", "avx", "sse4a", "vaes", "sha", "adx"}) == {"avx2", "avx"}


@pytest.mark.parametrize("isa", list(ISAS))
def test_simd_kernels_are_exact_on_other_cpus(isa):
    # numba compiles for NUMBA_CPU_NAME/FEATURES: the vpmaddubsw-without-VNNI and the
    # plain-IR lowerings of kernels/simd.py (the run started at collection: start_isa_runs)
    reason = _isa_skip_reason(isa)
    if reason:
        pytest.skip(reason)
    start_isa_runs([isa])
    out = _ISA_RUNS[isa].result()
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["done"], out.stdout


@pytest.mark.parametrize("qt", TYPES, ids=IDS)
def test_quantizing_activations_costs_less_than_a_percent(qt):
    # relational: ggml's path differs from the float one only by x's quantization
    k, m = row_len(qt), 13
    w, x = weight(qt, m), rand((2, k))
    diff = np.abs(MM.mul_mat_ggml(w, qt, k, m, x) - MM.mul_mat(w, qt, k, m, x))
    assert np.all(diff <= 1e-2 * bound_of(w, qt, x))


# ---------------------------------------------------------------------------- elementwise

SHAPES = [((3, 5, 7), (5, 7)), ((3, 5, 7), (1, 1, 7)), ((2, 3, 5, 7), (1, 3, 1, 7)),
          ((3, 5, 14), (5, 7)), ((6, 7), (3, 1)), ((4, 7), (7,))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("a_shape,b_shape", SHAPES, ids=[f"{a}x{b}" for a, b in SHAPES])
def test_binary_ops_repeat_b_like_ggml_exactly(op, a_shape, b_shape):
    a, b = rand(a_shape, 2), rand(b_shape, 3) + 3.0
    assert np.array_equal(E.binary(op, a, b), E.binary_ref(op, a, b))


def test_binary_refuses_b_that_does_not_divide_a():
    with pytest.raises(ValueError, match="repeat"):
        E.add(rand((4, 6)), rand((4, 4)))


X = np.concatenate([rand(997, 5, scale=4.0), [0.0, -0.0, 9.99, 10.0, -10.0, 30.0, -30.0]])
UNARY = [("silu", E.silu, E.silu_ref), ("gelu", E.gelu, E.gelu_ref), ("tanh", E.tanh, E.tanh_ref)]


@pytest.mark.parametrize("name,fn,ref", UNARY, ids=[u[0] for u in UNARY])
def test_activations_within_a_few_ulp(name, fn, ref):
    # gelu's float32 formula cancels in 1 + tanh(..) for x < 0: ggml's own error there
    # is ~ulp(1)*|x|, so it gets an absolute allowance of 2e-7*|x|
    slack = 2e-7 * np.abs(X) if name == "gelu" else 1e-37
    assert np.all(np.abs(fn(X) - ref(X)) <= 2e-6 * np.abs(ref(X)) + slack)


def test_gelu_f16_table_equals_numpy_float32_formula():
    got = E.gelu_table().view(np.float16)
    np.testing.assert_array_equal(got, E.gelu_table_ref().view(np.float16))   # NaN == NaN


def test_gelu_f16_table_lookup_and_clamps():
    y = E.gelu_f16_table(X)
    assert np.array_equal(y, E.gelu_f16_table_ref(X))
    assert list(y[-4:]) == [10.0, 0.0, 30.0, 0.0]                 # x >= 10 -> x, <= -10 -> 0
    assert np.abs(y - E.gelu_ref(X)).max() <= 2e-3 * np.abs(X).max()   # F16 rounding


def test_scale_and_scale_bias():
    assert np.array_equal(E.scale(X, 0.125), E.scale_ref(X, 0.125))
    assert np.array_equal(E.scale(X, 0.3, -1.5), E.scale_ref(X, 0.3, -1.5))   # one rounding


def test_gated_activations_are_act_times_gate():
    a, g = rand((5, 33), 6, 3.0), rand((5, 33), 7)
    np.testing.assert_allclose(E.swiglu(a, g), E.silu_ref(a) * g, rtol=4e-6, atol=1e-37)
    assert np.all(np.abs(E.geglu(a, g) - E.gelu_ref(a) * g)
                  <= 4e-6 * np.abs(E.gelu_ref(a) * g) + 2e-7 * np.abs(a * g))
    assert np.array_equal(E.geglu_f16_table(a, g), E.gelu_f16_table(a) * g)


FAST = [("silu", E.silu_fast, E.silu_ref), ("gelu", E.gelu_fast, E.gelu_ref)]


@pytest.mark.parametrize("name,fn,ref", FAST, ids=[u[0] for u in FAST])
def test_fast_activations_within_the_rational_tanhs_error(name, fn, ref):
    # tanh_rational is within 2.6e-7 of tanh on [-9, 9] and clamps beyond; silu and gelu
    # are 0.5 x (1 + tanh(..)), so |error| <= 0.5 |x| 2.6e-7 plus a few float32 roundings
    # of the result: 2.5e-7 |x| (measured over 2e6 points of [-12, 12]: 1.97e-7 |x|)
    x = np.concatenate([X, np.linspace(-12, 12, 200001, dtype=np.float32)])
    assert np.all(np.abs(fn(x) - ref(x)) <= 2.5e-7 * np.abs(x) + 1e-37)
    assert fn(np.float32([0.0]))[0] == 0.0 and fn(np.float32([30.0]))[0] == 30.0


def test_fast_gated_activations_are_act_times_gate():
    a, g = rand((5, 33), 6, 3.0), rand((5, 33), 7)
    # the gate is one more float32 multiplication (reassociation: within 2 ulp)
    np.testing.assert_allclose(E.swiglu_fast(a, g), E.silu_fast(a) * g, rtol=2.4e-7, atol=1e-37)
    np.testing.assert_allclose(E.geglu_fast(a, g), E.gelu_fast(a) * g, rtol=2.4e-7, atol=1e-37)
    big = rand(40000, 8)                        # the parallel kernel (>= SERIAL_BELOW)
    assert E.kernel("fast_gated", big.size) is E._fast_gated
    serial = np.empty_like(big)
    E._fast_gated_serial(big, big, np.int64(E.FAST_CODES["gelu"]), serial)
    np.testing.assert_allclose(E.geglu_fast(big, big), serial, rtol=2.4e-7, atol=1e-37)


@pytest.mark.parametrize("kern", ["_fast_gated_serial", "_fast_unary_serial"])
def test_fast_activation_kernels_are_vectorized(kern):
    # the point of the rational tanh: the loop compiles to packed float32 divisions
    # (divps on any x86-64; libm's tanhf/expf calls or the GELU table's gather would not)
    import numba
    kernel = getattr(E, kern)
    # compiled afresh with the kernel's own options (a copy loaded from numba's cache has
    # no assembly text to look at)
    fn = numba.njit(**{k: v for k, v in kernel.targetoptions.items()
                       if k not in ("cache", "nopython")})(
        kernel.py_func)
    args = (rand(64, 9), rand(64, 10))[: 2 if "gated" in kern else 1]
    fn(*args, np.int64(1), np.empty(64, np.float32))
    asm = fn.inspect_asm(fn.signatures[-1])
    assert "divps" in asm and "tanhf" not in asm


# ---------------------------------------------------------------------------- norm


@pytest.mark.parametrize("shape", [(1, 1), (5, 77), (2, 3, 4097)], ids=["1x1", "5x77", "2x3x4097"])
def test_rms_norm_and_norm_within_one_ulp(shape):
    x = rand(shape, 8, 2.0) + 0.5
    np.testing.assert_array_max_ulp(NORM.rms_norm(x, 1e-6), NORM.rms_norm_ref(x, 1e-6), maxulp=1)
    np.testing.assert_array_max_ulp(NORM.norm(x, 1e-5), NORM.norm_ref(x, 1e-5), maxulp=1)


def test_rms_norm_output_has_unit_rms():
    y = NORM.rms_norm(rand((3, 1001), 9, 5.0), 0.0)
    np.testing.assert_allclose(np.sqrt((y.astype(np.float64) ** 2).mean(-1)), 1.0, rtol=1e-6)


# ---------------------------------------------------------------------------- rope

POS = np.array([0, 1, 2, 37, 4095, 70001], dtype=np.int32)
ROPES = {
    "plain": {},
    "freq_factors": {"freq_base": 500000.0,
                     "freq_factors": np.linspace(1, 8, 6).astype(np.float32)},
    "yarn": {"freq_base": 1e6, "freq_scale": 0.25, "n_ctx_orig": 8192, "ext_factor": 1.0,
             "attn_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
    "linear_scaled": {"freq_scale": 0.5, "attn_factor": 0.75},
}


@pytest.mark.parametrize("mode", [ROPE.NORMAL, ROPE.NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("name", list(ROPES))
def test_rope_matches_reference(mode, name):
    x = rand((6, 3, 14), 10)                                      # D=14, rotate n_dims=12
    got = ROPE.rope(x, POS, 12, mode, **ROPES[name])
    np.testing.assert_allclose(got, ROPE.rope_ref(x, POS, 12, mode, **ROPES[name]),
                               rtol=2e-6, atol=2e-6 * np.abs(x).max())
    assert np.array_equal(got[..., 12:], x[..., 12:])             # the rest is copied


@pytest.mark.parametrize("mode", [ROPE.NORMAL, ROPE.NEOX], ids=["normal", "neox"])
def test_rope_is_a_rotation_and_identity_at_position_zero(mode):
    x = rand((6, 3, 12), 11)
    y = ROPE.rope(x, POS, 12, mode)
    assert np.array_equal(y[0], x[0])                             # cos 0 = 1, sin 0 = 0
    pairs = (lambda a: a.reshape(6, 3, 6, 2)) if mode == ROPE.NORMAL else \
        (lambda a: np.stack([a[..., :6], a[..., 6:]], -1))
    np.testing.assert_allclose(np.hypot(*np.moveaxis(pairs(y), -1, 0)),
                               np.hypot(*np.moveaxis(pairs(x), -1, 0)), rtol=1e-6)


# ---------------------------------------------------------------------------- softmax

MASK = np.where(np.random.default_rng(12).random((1, 1, 8, 9)) < 0.3, -np.inf, 0.0)
MASK[..., 0] = 0.0                                                # keep one key per row
SOFTMAX = {
    "plain": (None, 0.5, 0.0, None),
    "mask_f16": (MASK.astype(np.float16), 0.125, 0.0, None),
    "mask_f32_alibi": (MASK.astype(np.float32), 1.0, 8.0, None),
    "mask_f16_sinks": (MASK.astype(np.float16), 0.3, 0.0, np.array([0.5, -1, 2, 0, 1], np.float32)),
}


@pytest.mark.parametrize("name", list(SOFTMAX))
def test_soft_max_matches_reference(name):
    mask, scale, max_bias, sinks = SOFTMAX[name]
    x = rand((2, 5, 7, 9), 13, 3.0)                               # 5 heads (ALiBi: m1 used)
    y = SM.soft_max(x, mask, scale, max_bias, sinks)
    np.testing.assert_allclose(y, SM.soft_max_ref(x, mask, scale, max_bias, sinks),
                               rtol=2e-6, atol=1e-9)
    if mask is not None:
        assert np.all(y[..., np.isinf(MASK[0, 0, :7, :])] == 0.0)
    if sinks is None:
        np.testing.assert_allclose(y.astype(np.float64).sum(-1), 1.0, rtol=2e-6)


def test_alibi_slopes_follow_ggml():
    # 8 heads, max_bias 8: m0 = 2^-1, slopes 2^-1 .. 2^-8
    np.testing.assert_array_equal(SM.alibi_slopes(8, 8.0), 2.0 ** -np.arange(1, 9))


# ---------------------------------------------------------------------------- attention


def attn_inputs(kv_dtype, seed=14, n_head=4, n_kv_head=2, n_tok=3, n_kv=37, dk=24, dv=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_head, n_tok, dk)).astype(np.float32)
    k = rng.standard_normal((n_kv_head, n_kv, dk)).astype(kv_dtype)
    v = rng.standard_normal((n_kv_head, n_kv, dv)).astype(kv_dtype)
    mask = np.where(rng.random((1, n_tok + 1, n_kv)) < 0.4, -np.inf, 0.0).astype(np.float16)
    mask[:, :, 0] = 0
    return q, k, v, mask


def kernel_args(q, k, v, mask, softcap=0.0, max_bias=0.0, sinks=None):
    """What flash_attn_ext hands a kernel (scale 0.2; sinks read-only, as it passes
    them), but ``out``; and K's and V's F16 flags (the fast variants add FA.FAST)."""
    k16, k32, k_f16 = FA._kv(k)
    v16, v32, v_f16 = FA._kv(v)
    n_head = q.shape[0]
    return ((q, k16, k32, v16, v32, np.array([k_f16, v_f16]), mask.view(np.uint16), True,
             np.float32(0.2), np.float32(softcap), FA.alibi_slopes(n_head, max_bias),
             K.bits.read_only_view(np.zeros(n_head, np.float32) if sinks is None else sinks),
             sinks is not None), k_f16, v_f16)


FA_CASES = {"plain": (0.0, 0.0, None), "softcap": (0.0, 30.0, None), "alibi": (8.0, 0.0, None),
            "sinks": (0.0, 0.0, np.array([0.5, -1.0, 3.0, 0.0], np.float32))}


@pytest.mark.warm_up
@pytest.mark.parametrize("kv", [np.float16, np.float32], ids=["F16", "F32"])
@pytest.mark.parametrize("name", list(FA_CASES))
def test_flash_attn_matches_online_softmax_reference(kv, name):
    max_bias, softcap, sinks = FA_CASES[name]
    q, k, v, mask = attn_inputs(kv)
    got = FA.flash_attn_ext(q, k, v, mask, 0.2, max_bias, softcap, sinks)
    assert got.shape == (3, 4, 16)
    ref = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, max_bias, softcap, sinks)
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kv", [np.float16, np.float32], ids=["F16", "F32"])
def test_flash_attn_equals_softmax_of_scores_times_v(kv):
    # relational: the non-fused path (KQ, soft_max_ext, KQV) with GQA by hand
    q, k, v, mask = attn_inputs(kv)
    kf, vf = np.repeat(k.astype(np.float32), 2, 0), np.repeat(v.astype(np.float32), 2, 0)
    qf = q.astype(np.float16).astype(np.float32) if kv == np.float16 else q
    kq = np.einsum("hkd,htd->htk", kf, qf)
    p = SM.soft_max(kq, mask[:, :3, :].astype(np.float32), 0.2)
    expect = np.einsum("htk,hkd->thd", p, vf)
    tol = 5e-3 if kv == np.float16 else 1e-5                      # F16 accumulator in VKQ16
    np.testing.assert_allclose(FA.flash_attn_ext(q, k, v, mask, 0.2), expect, atol=tol)


@pytest.mark.warm_up
@pytest.mark.parametrize("kv", [np.float16, np.float32], ids=["F16", "F32"])
@pytest.mark.parametrize("name", list(FA_CASES))
def test_flash_attn_query_tiles_equal_the_row_kernel(kv, name):
    # a prompt's query tiles (FA.QT queries of a head side by side) against the one-row
    # kernel, bit for bit: 37 tokens = two full tiles of 16 and one of 5, row 5 masked
    max_bias, softcap, sinks = FA_CASES[name]
    q, k, v, mask = attn_inputs(kv, seed=15, n_tok=37, n_kv=53)
    mask[:, 5, :] = -np.inf
    assert FA.kernel(1 << 20, 37) is FA._flash_attn_tiled
    assert FA.kernel(1 << 20, 1) is FA._flash_attn
    got = FA.flash_attn_ext(q, k, v, mask, 0.2, max_bias, softcap, sinks)
    k16, k32, k_f16 = FA._kv(k)
    v16, v32, v_f16 = FA._kv(v)
    rows = np.empty_like(got)
    FA._flash_attn(q, k16, k32, v16, v32, np.array([k_f16, v_f16]), mask.view(np.uint16), True,
                   np.float32(0.2), np.float32(softcap), FA.alibi_slopes(4, max_bias),
                   K.bits.read_only_view(np.zeros(4, np.float32) if sinks is None else sinks),
                   sinks is not None, rows)   # sinks read-only, as flash_attn_ext passes them
    np.testing.assert_array_equal(got, rows)
    assert np.all(got[5] == 0.0)
    # fast numerics (the third kv_f16 flag, FA.FAST): the K dots in float32
    fast = np.full_like(rows, np.nan)
    FA._flash_attn_tiled(q, k16, k32, v16, v32, np.array([k_f16, v_f16, True]),
                         mask.view(np.uint16), True, np.float32(0.2), np.float32(softcap),
                         FA.alibi_slopes(4, max_bias),
                         K.bits.read_only_view(np.zeros(4, np.float32) if sinks is None
                                               else sinks), sinks is not None, fast)
    ref = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, max_bias, softcap, sinks)
    np.testing.assert_allclose(fast, ref, rtol=0, atol=4e-3 if kv == np.float16 else 2e-6)
    assert not np.array_equal(fast, rows) and np.all(fast[5] == 0.0)


@pytest.mark.parametrize("kv", [np.float16, np.float32], ids=["F16", "F32"])
@pytest.mark.parametrize("name", list(FA_CASES))
@pytest.mark.parametrize("n_head,n_kv_head,n_tok", [(4, 1, 1), (36, 2, 1), (6, 3, 3)],
                         ids=["gemma_decode", "two_groups", "three_tokens"])
def test_flash_attn_head_groups_equal_the_row_kernel(kv, name, n_head, n_kv_head, n_tok):
    # a decode's query heads that share a KV head (GQA), up to FA.QT of them side by side,
    # against the one-row kernel bit for bit; 36 heads over 2 KV heads: 18 a KV head, a
    # group of 16 and one of 2; token 1 of three masked everywhere
    max_bias, softcap, sinks = FA_CASES[name]
    if sinks is not None:
        sinks = np.linspace(-2.0, 3.0, n_head).astype(np.float32)
    q, k, v, mask = attn_inputs(kv, seed=16, n_head=n_head, n_kv_head=n_kv_head,
                                n_tok=n_tok, n_kv=53)
    if n_tok > 1:
        mask[:, 1, :] = -np.inf
    items = n_kv_head * n_tok * -(-(n_head // n_kv_head) // FA.QT)
    assert FA.kernel(1 << 20, n_tok, n_head, n_kv_head) is (
        FA._flash_attn_grouped_serial if items == 1 else FA._flash_attn_grouped)
    assert FA.kernel(1 << 10, n_tok, n_head, n_kv_head) is FA._flash_attn_grouped_serial
    assert FA.kernel(1 << 20, n_tok, n_head, n_head) is FA._flash_attn     # no GQA: rows
    args, k_f16, v_f16 = kernel_args(q, k, v, mask, softcap, max_bias, sinks)
    rows = np.empty((n_tok, n_head, v.shape[2]), np.float32)
    FA._flash_attn(*args, rows)
    for kern in (FA._flash_attn_grouped, FA._flash_attn_grouped_serial):
        got = np.full_like(rows, np.nan)
        kern(*args, got)
        np.testing.assert_array_equal(got, rows)
    np.testing.assert_array_equal(FA.flash_attn_ext(q, k, v, mask, 0.2, max_bias, softcap,
                                                    sinks), rows)
    if n_tok > 1:
        assert np.all(rows[1] == 0.0)
    # fast numerics: the K dots in float32 (four partial sums a lane), the rest the same
    # (the kernels' third kv_f16 flag, FA.FAST)
    ref = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, max_bias, softcap, sinks)
    fast = (args[:5] + (np.array([k_f16, v_f16, True]),) + args[6:])
    assert FA.FAST == 2
    for kern in (FA._flash_attn_grouped, FA._flash_attn_grouped_serial):
        got = np.full_like(rows, np.nan)
        kern(*fast, got)
        # F16 V: VKQ16 rounds the accumulator to F16 (2^-11 relative) after every key
        np.testing.assert_allclose(got, ref, rtol=0, atol=4e-3 if kv == np.float16 else 2e-6)
        assert not np.array_equal(got, rows)        # the float32 sums did run


@pytest.mark.parametrize("kv", [np.float16, np.float32], ids=["F16", "F32"])
@pytest.mark.parametrize("name", list(FA_CASES))
@pytest.mark.parametrize("n_head,n_kv_head", [(4, 1), (3, 3)], ids=["gemma_groups", "rows"])
def test_flash_attn_split_kv_decode_merges_chunks_as_llama_cpp(kv, name, n_head, n_kv_head):
    # one token over 530 keys (>= FA.SPLIT_KV_MIN = 512, llama.cpp's use_split_kv_path):
    # chunks of ceil(530 / n) keys, each chunk's partial (M, S, acc; the sink in chunk 0
    # only), merged chunk by chunk. Keys 0..139 masked: with 5 chunks of 106, chunk 0 has
    # no live key (S = 0: skipped, or only the sink); 64 chunks of 9 leave chunks 59..63
    # past the 530 keys (59 * 9 = 531)
    max_bias, softcap, sinks = FA_CASES[name]
    if sinks is not None:
        sinks = np.linspace(-2.0, 3.0, n_head).astype(np.float32)
    q, k, v, mask = attn_inputs(kv, seed=17, n_head=n_head, n_kv_head=n_kv_head, n_tok=1,
                                n_kv=530)
    mask[:, :, :140] = -np.inf
    work = n_head * 530 * 40
    assert FA.SPLIT_KV_MIN == 512
    assert FA.kernel(work, 1, n_head, n_kv_head, 530, True) is FA._flash_attn_split
    assert FA.kernel(work, 1, n_head, n_kv_head, 530, False) is not FA._flash_attn_split
    assert FA.kernel(work, 1, n_head, n_kv_head, 511, True) is not FA._flash_attn_split
    assert FA.kernel(1 << 20, 4, n_head, n_kv_head, 530, True) is FA._flash_attn_tiled
    args, k_f16, v_f16 = kernel_args(q, k, v, mask, softcap, max_bias, sinks)
    rows = np.empty((1, n_head, v.shape[2]), np.float32)
    FA._flash_attn(*args, rows)
    one = np.full_like(rows, np.nan)
    FA.flash_attn_split(*args, one, 1)
    np.testing.assert_array_equal(one, rows)          # one chunk: the unsplit kernel's bits
    for n in (2, 5, 64):
        got = np.full_like(rows, np.nan)
        FA.flash_attn_split(*args, got, n)
        ref = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, max_bias, softcap, sinks, kv_chunks=n)
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)
        # the merge is the same softmax: F16 V rounds each chunk's accumulator apart
        np.testing.assert_allclose(got, rows, rtol=0, atol=5e-3 if kv == np.float16 else 2e-6)
    # fast numerics: the float32 row dots in every chunk (head groups, with or without GQA)
    fast = args[:5] + (np.array([k_f16, v_f16, True]),) + args[6:]
    got = np.full_like(rows, np.nan)
    FA.flash_attn_split(*fast, got, 5)
    np.testing.assert_allclose(got, FA.flash_attn_ext_ref(q, k, v, mask, 0.2, max_bias, softcap,
                                                          sinks, kv_chunks=5),
                               rtol=0, atol=4e-3 if kv == np.float16 else 2e-6)
    assert not np.array_equal(got, rows)
    threads = numba.get_num_threads()
    np.testing.assert_allclose(
        FA.flash_attn_ext(q, k, v, mask, 0.2, max_bias, softcap, sinks),
        FA.flash_attn_ext_ref(q, k, v, mask, 0.2, max_bias, softcap, sinks, kv_chunks=threads),
        rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kv", [np.float16, np.float32], ids=["F16", "F32"])
def test_flash_attn_fast_decode_without_gqa_runs_one_head_groups(kv):
    # no GQA (3 heads, 3 KV heads): exact numerics take the row kernel, fast numerics head
    # groups of one head (the float32 row dots); a one-lane group in exact numerics is the
    # row kernel bit for bit. Head size 40: one 32-dim vector step and 8 dims one by one
    q, k, v, mask = attn_inputs(kv, seed=19, n_head=3, n_kv_head=3, n_tok=1, n_kv=45, dk=40)
    assert FA.kernel(1 << 20, 1, 3, 3) is FA._flash_attn
    assert FA.kernel(1 << 20, 1, 3, 3, fast=True) is FA._flash_attn_grouped
    assert FA.kernel(1 << 20, 37, 3, 3, fast=True) is FA._flash_attn_tiled
    args, k_f16, v_f16 = kernel_args(q, k, v, mask)
    rows = np.empty((1, 3, 16), np.float32)
    FA._flash_attn(*args, rows)
    got = np.full_like(rows, np.nan)
    FA._flash_attn_grouped(*args, got)
    np.testing.assert_array_equal(got, rows)
    FA._flash_attn_grouped(*(args[:5] + (np.array([k_f16, v_f16, True]),) + args[6:]), got)
    np.testing.assert_allclose(got, FA.flash_attn_ext_ref(q, k, v, mask, 0.2), rtol=0,
                               atol=4e-3 if kv == np.float16 else 2e-6)
    assert not np.array_equal(got, rows)


def test_flash_attn_split_reference_sink_only_in_chunk_zero():
    # 2 chunks, every key of chunk 0 masked: chunk 0 is the sink alone (M = sink, S = 1,
    # acc = 0), chunk 1 the live keys; merged: out = acc_1 e^(M_1 - M) / (e^(s - M) +
    # S_1 e^(M_1 - M)), M = max(sink, M_1): the unsplit result, whose softmax sum also
    # counts the sink once
    q, k, v, mask = attn_inputs(np.float32, seed=18, n_head=2, n_kv_head=1, n_tok=1, n_kv=600)
    mask[:, :, :300] = -np.inf
    sinks = np.array([1.5, -0.5], np.float32)
    split = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, sinks=sinks, kv_chunks=2)
    whole = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, sinks=sinks)
    np.testing.assert_allclose(split, whole, rtol=1e-6, atol=1e-7)
    no_sink = FA.flash_attn_ext_ref(q, k, v, mask, 0.2, kv_chunks=2)
    assert np.all(np.abs(no_sink) > np.abs(split))    # the sink took a share of the sum


def test_flash_attn_fully_masked_row_is_zero():
    q, k, v, mask = attn_inputs(np.float16)
    mask[:, 1, :] = -np.inf
    assert np.all(FA.flash_attn_ext(q, k, v, mask, 0.2)[1] == 0.0)


# ---------------------------------------------------------------------------- cache


@pytest.mark.parametrize("x86", [True, False], ids=["x86", "ref"])
@pytest.mark.parametrize("qt", CACHE.CACHE_TYPES, ids=[t.name for t in CACHE.CACHE_TYPES])
def test_set_rows_writes_converted_rows_only(qt, x86):
    src, idx = rand((5, 96), 15, 2.0), np.array([6, 0, 3, 9, 1])
    dst = np.random.default_rng(16).integers(0, 256, (11, Q.row_bytes(qt, 96)), dtype=np.uint8)
    expect = CACHE.set_rows_ref(dst, qt, src, idx, x86)
    untouched = dst[[2, 4, 5, 7, 8, 10]].copy()
    CACHE.set_rows(dst, qt, src, idx, x86)
    assert np.array_equal(dst, expect)
    assert np.array_equal(dst[[2, 4, 5, 7, 8, 10]], untouched)


def test_set_rows_refuses_unsupported_cache_type():
    with pytest.raises(NotImplementedError, match="Q4_1"):
        CACHE.set_rows(np.zeros((2, 60), np.uint8), QT.Q4_1, rand((1, 96)), [0])


def test_cpy_and_cont():
    x = rand((4, 6, 64), 17).transpose(1, 0, 2)                   # a permuted view
    assert not x.flags.c_contiguous
    assert np.array_equal(CACHE.cont(x), np.ascontiguousarray(x))
    view = x[:, 1, :]                                             # strided rows [6, 64]
    expect = Q.quantize_activations_ref(np.ascontiguousarray(view), QT.Q8_0)
    assert np.array_equal(CACHE.cpy(view, QT.Q8_0), expect)


def _small_op_results():
    """Every small-op kernel once, results written into given ``out=`` arrays."""
    a, b = rand((2, 3, 5, 64), 2), rand((1, 3, 1, 64), 3) + 3.0
    q, k, v, mask = attn_inputs(np.float16)
    x = rand((5, 4, 32), 7)
    res = {"binary": E.binary("mul", a, b, out=np.empty_like(a)),
           "unary": E.gelu_f16_table(a, out=np.empty_like(a)),
           "scale": E.scale(a, 0.3, -1.5, out=np.empty_like(a)),
           "gated": E.geglu_f16_table(a, b.repeat(2, 0).repeat(5, 2), out=np.empty_like(a)),
           "rms_norm": NORM.rms_norm(a, 1e-6, out=np.empty_like(a)),
           "norm": NORM.norm(a, 1e-5, out=np.empty_like(a)),
           "rope": ROPE.rope(x, np.arange(5, dtype=np.int32) * 7, 32, ROPE.NEOX,
                             out=np.empty_like(x)),
           "soft_max": SM.soft_max(a, mask=None, scale=0.5, out=np.empty_like(a)),
           "flash_attn": FA.flash_attn_ext(q, k, v, mask, 0.2,
                                           out=np.empty((3, 4, 16), np.float32)),
           "flash_attn_softcap": FA.flash_attn_ext(q, k, v, mask, 0.2, 8.0, 30.0),
           "get_rows": GR.get_rows(weight(QT.Q4_K, 9), QT.Q4_K, 768, [3, 0, 8],
                                   out=np.empty((3, 768), np.float32)),
           "cont": CACHE.cont(a.transpose(0, 2, 1, 3), out=np.empty((2, 5, 3, 64), np.float32))}
    cache = np.zeros((8, 128), np.uint8)
    CACHE.set_rows(cache, QT.F16, rand((3, 64), 9), np.array([5, 1, 6]))
    res["set_rows"] = cache
    return res


@pytest.mark.warm_up
def test_serial_and_parallel_kernel_variants_agree_bit_for_bit(monkeypatch):
    # small ops run a serial kernel below each module's SERIAL_BELOW (a parallel region
    # costs more than their work); both variants must give the same bits
    def force(limit):
        for mod in (E, NORM, CACHE):
            for name in mod.SERIAL_BELOW:
                monkeypatch.setitem(mod.SERIAL_BELOW, name, limit)
        for mod in (ROPE, SM, FA, GR):
            monkeypatch.setattr(mod, "SERIAL_BELOW", limit)
    force(0)
    parallel = _small_op_results()
    force(1 << 60)
    serial = _small_op_results()
    for name in parallel:
        assert np.array_equal(parallel[name], serial[name]), name
    assert E.kernel("binary", 1 << 60) is E._binary and NORM.kernel("norm", 1) is NORM._norm_serial


def test_out_arrays_are_written_in_place_and_checked():
    a = rand((3, 64), 4)
    out = np.empty_like(a)
    assert NORM.rms_norm(a, 1e-6, out=out) is out
    np.testing.assert_array_equal(out, NORM.rms_norm(a, 1e-6))
    with pytest.raises(ValueError, match="out"):
        E.binary("add", a, a, out=np.empty((3, 65), np.float32))
    with pytest.raises(ValueError, match="out"):
        ROPE.rope(a.reshape(3, 1, 64), np.arange(3, dtype=np.int32), 64,
                  out=np.empty((3, 1, 64), np.float64))


# ---------------------------------------------------------------------------- float vec_dots
# mul_mat_ggml on F32/F16/BF16 follows ggml_vec_dot_f32/f16/bf16 as llama.cpp's AVX-512F
# build runs them (kernels/vec_dot_ggml.py "float types"): 16-lane FMA accumulators over
# steps of 64 (bf16: 32), GGML_F32x16_REDUCE, then the leftovers (f32: GCC's vectorized
# tail, its last n % 8 fused). Lengths through every stage: no step, exact steps, steps
# plus 1..63 leftovers with and without the 16- and 8-element tail chunks.

FLOATS = [QT.F32, QT.F16, QT.BF16]
FLOAT_LENGTHS = [1, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 71, 72, 80, 88, 96, 127,
                 128, 129, 191, 4096, 4103]


def float_row(qt: QT, a: np.ndarray) -> np.ndarray:
    """float32 values -> raw bytes of type qt (bf16 by truncation: any bits will do),
    read-only as weights are (:func:`read_only`)."""
    if qt == QT.F32:
        return read_only(np.ascontiguousarray(a, dtype=np.float32).view(np.uint8))
    if qt == QT.F16:
        return read_only(np.ascontiguousarray(a.astype(np.float16)).view(np.uint8))
    return read_only(np.ascontiguousarray((a.astype(np.float32).view(np.uint32) >> 16)
                                          .astype(np.uint16)).view(np.uint8))


@pytest.mark.parametrize("qt", FLOATS, ids=[t.name for t in FLOATS])
def test_float_ggml_dots_are_bit_exact_on_every_tail(qt):
    for k in FLOAT_LENGTHS:
        m = 5
        w = float_row(qt, rand((m, k), seed=k, scale=3.0)).reshape(m, -1)
        x = rand((2, k), seed=k + 1)
        want = MM.mul_mat_ggml_ref(w, qt, k, m, x)
        assert np.array_equal(MM.mul_mat_ggml(w, qt, k, m, x), want), k
        yq = Q.quantize_activations(x, Q.VEC_DOT_TYPE[qt], True)
        code = np.int64(int(qt))
        one = [[K.vec_dot_ggml.dot_row_ggml(code, w[r], yq[n]) for r in range(m)] for n in range(2)]
        assert np.array_equal(np.array(one, np.float32), want), k
        got = MM.mul_mat(w, qt, k, m, x)                            # float path, same rows
        assert np.all(np.abs(got - MM.mul_mat_ref(w, qt, k, m, x)) <= 1e-5 * bound_of(w, qt, x) + 1e-30)


def test_ggml_f32_fuses_main_loop_and_last_leftovers_only():
    # p = (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 (tie to even): added to
    # -(1 + 2^-11) it gives 2^-24 when fused with the product (FMA), 0 when not
    a, c = np.float32(1 + 2.0**-12), np.float32(-(1 + 2.0**-11))

    def dot(k, i):
        w, x = np.zeros((1, k), np.float32), np.zeros((1, k), np.float32)
        w[0, 0], x[0, 0] = c, 1
        w[0, i], x[0, i] = a, a
        return MM.mul_mat_ggml(read_only(w.view(np.uint8)), QT.F32, k, 1, x)[0, 0]

    assert dot(128, 64) == np.float32(2.0**-24)     # main loop: one lane, fma
    assert dot(9, 8) == np.float32(2.0**-24)        # the 9th of 9 leftovers: scalar fma
    assert dot(16, 15) == 0                         # a 16-element tail chunk: rounded products
    assert dot(72, 64) == 0                         # 64 + an 8-element chunk
    assert dot(73, 72) == np.float32(2.0**-24)


def test_fma32_reference_rounds_once():
    # products just off a float32 midpoint of the sum, where rounding p + c to float64
    # first (double rounding) picks the wrong neighbour half of the time
    rng = np.random.default_rng(21)
    n = 20000
    k = rng.integers(1, 300, n)
    sign = rng.choice([-1.0, 1.0], n)
    a = (1 + k * 2.0**-23).astype(np.float32)
    b = (2.0**-24 * (1 - k * 2.0**-23) * sign).astype(np.float32)
    c = ((1 + rng.integers(1, 2**22, n) * 2.0**-23) * sign * rng.choice([-1.0, 1.0], n)
         ).astype(np.float32)
    got = K.vec_dot_ggml._fma32(a, b, c)
    # exact value: c + a*b with a*b = sign * 2^-24 * (1 - k^2 2^-46), i.e. just inside the
    # midpoint c +- 2^-24 (1 < |c| < 2: ulp 2^-23): rounds to c
    assert np.array_equal(got, c)
    assert not np.array_equal((a.astype(np.float64) * b + c).astype(np.float32), c)


def _llama_vec_dots():
    try:
        import ctypes

        import llama_cpp
    except ImportError:
        return None
    lib = Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"
    if not lib.exists():
        return None
    cpu = ctypes.CDLL(str(lib))
    cpu.ggml_cpu_init()
    return ctypes, {QT.F32: cpu.ggml_vec_dot_f32, QT.F16: cpu.ggml_vec_dot_f16,
                    QT.BF16: cpu.ggml_vec_dot_bf16}


@pytest.mark.parametrize("qt", FLOATS, ids=[t.name for t in FLOATS])
def test_float_ggml_dots_match_llama_cpp_bit_for_bit(qt):
    # the order is AVX-512F's as GCC builds it (bf16: AVX512-BF16's pair dot where the CPU
    # has it, kernels.vec_dot_ggml.BF16_DP): only comparable on an AVX-512F host; with
    # AVX512-FP16 ggml's f16 dot takes another path, which the kernels do not follow
    found = _llama_vec_dots()
    if found is None:
        pytest.skip("llama-cpp-python's libggml-cpu.so not found")
    if "avx512f" not in _host_features() or "avx512fp16" in _host_features():
        pytest.skip("the kernels follow ggml's AVX-512F (no FP16) mappings")
    ctypes, fns = found
    for k in FLOAT_LENGTHS:
        w = float_row(qt, rand((3, k), seed=k, scale=3.0)).reshape(3, -1)
        yq = Q.quantize_activations(rand((1, k), seed=k + 1), Q.VEC_DOT_TYPE[qt], True)
        got = MM.mul_mat_ggml(w, qt, k, 3, rand((1, k), seed=k + 1))[0]
        for r in range(3):
            out = ctypes.c_float()
            fns[qt](ctypes.c_int(k), ctypes.byref(out), ctypes.c_size_t(0),
                    ctypes.c_void_p(w[r].ctypes.data), ctypes.c_size_t(0),
                    ctypes.c_void_p(yq[0].ctypes.data), ctypes.c_size_t(0), ctypes.c_int(1))
            assert np.float32(out.value).view(np.uint32) == got[r].view(np.uint32), (k, r)
