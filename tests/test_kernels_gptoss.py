"""gpt-oss's kernels, each against its reference: MXFP4 (``kernels/mxfp4.py``, the
experts) against gguf-py's dequantizer (exact), ``x @ dequantize(W).T`` in float64 (fast
path, relative 1e-5 of ``|x| @ |W|.T``) and the numpy reimplementation of
ggml_vec_dot_mxfp4_q8_0 (ggml path, bit exact); SWIGLU_OAI and ADD_ID
(``kernels/elementwise.py``) against numpy.

Kept apart from test_kernels.py so that it compiles only these kernels (seconds).
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

from graphcost.format import ggml_types as gt
from graphcost.execute.exec_ops import Ctx, matmul_fn, weight_types
from graphcost.execute.kernels_loader import load_kernels
from graphcost.execute.weights import read_only

K = load_kernels()
X = K.mxfp4
E = K.elementwise
# n_embd and expert width of the gpt-oss fixture: 9 and 5 blocks of 32
KDIM, MROWS = 288, 160


def _weights(m: int, k: int, seed: int = 0) -> np.ndarray:
    """gguf-py's MXFP4 quantization of normal values: [m, k / 32 * 17] uint8."""
    rng = np.random.default_rng(seed)
    return read_only(gq.quantize((0.05 * rng.standard_normal((m, k))).astype(np.float32),
                                  QT.MXFP4))


def _arbitrary(m: int, k: int, seed: int = 1) -> np.ndarray:
    """Arbitrary code bytes (every nibble, -0 included) with scale bytes 100..140."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(m, k // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.integers(100, 141, size=(m, k // 32), dtype=np.uint8)
    return read_only(raw.reshape(m, -1))



def test_block_layout_and_tables_come_from_gguf():
    # block_mxfp4: 1 scale byte + 16 bytes of nibbles for 32 values
    assert (X.QK, X.BLOCK_BYTES) == GGML_QUANT_SIZES[QT.MXFP4] == (32, 17)
    assert gt.vec_dot_type(QT.MXFP4) == X.VEC_DOT_TYPE == QT.Q8_0
    assert X.KVALUES.tolist() == list(gq.MXFP4.kvalues)
    # GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) for every byte (e < 2: the subnormal path)
    assert X.E8M0_HALF.tolist() == [2.0 ** (e - 128) for e in range(256)]
    assert QT.MXFP4 in weight_types(K)


@pytest.mark.parametrize("make", [_weights, _arbitrary], ids=["quantized", "arbitrary"])
def test_dequantize_rows_equals_gguf_exactly(make):
    w = make(MROWS, KDIM)
    out = np.empty((MROWS, KDIM), np.float32)
    X.dequantize_rows(w, X.KVALUES, X.E8M0_HALF, out)
    assert np.array_equal(out, X.dequantize_ref(w, KDIM))
    assert np.count_nonzero(out) > 0.8 * out.size


@pytest.mark.warm_up
@pytest.mark.parametrize("n", [1, 3, 9])   # 9 rows: 160*9*288 >= SERIAL_BELOW, parallel path
@pytest.mark.parametrize("make", [_weights, _arbitrary], ids=["quantized", "arbitrary"])
def test_mul_mat_matches_dequantized_matmul(make, n):
    w = make(MROWS, KDIM)
    x = np.random.default_rng(n).standard_normal((n, KDIM)).astype(np.float32)
    y = X.mul_mat(w, KDIM, MROWS, x)
    bound = np.abs(x).astype(np.float64) @ np.abs(X.dequantize_ref(w, KDIM)).T
    assert np.abs(y - X.mul_mat_ref(w, KDIM, MROWS, x)).max() <= 1e-5 * bound.max()


@pytest.mark.warm_up
@pytest.mark.parametrize("n", [1, 9])
@pytest.mark.parametrize("make", [_weights, _arbitrary], ids=["quantized", "arbitrary"])
def test_mul_mat_ggml_is_bit_exact_with_numpy_reimplementation(make, n):
    w = make(MROWS, KDIM)
    x = np.random.default_rng(n).standard_normal((n, KDIM)).astype(np.float32)
    yq = K.quants.quantize_activations(x, QT.Q8_0)
    assert yq.shape == (n, KDIM // 32 * 34)
    y = X.mul_mat_ggml(w, KDIM, MROWS, yq)
    assert np.array_equal(y, X.mul_mat_ggml_ref(w, KDIM, MROWS, yq))
    # and it is the product: Q8_0 activations are within ~1% of x
    ref = X.mul_mat_ref(w, KDIM, MROWS, x)
    assert np.linalg.norm(y - ref) <= 0.01 * np.linalg.norm(ref)


@pytest.mark.parametrize("numerics", ["ggml", "fast"])
def test_executor_matmul_runs_the_mxfp4_kernels(numerics):
    w = _weights(MROWS, KDIM)
    x = np.random.default_rng(2).standard_normal((2, KDIM)).astype(np.float32)
    y = matmul_fn(Ctx(K, numerics), gt.GGMLType.MXFP4, KDIM, MROWS)(w, x)
    want = (X.mul_mat_ggml(w, KDIM, MROWS, K.quants.quantize_activations(x, QT.Q8_0))
            if numerics == "ggml" else X.mul_mat(w, KDIM, MROWS, x))
    assert np.array_equal(y, want)


def test_mxfp4_rows_of_a_wrong_length_are_refused():
    with pytest.raises(ValueError, match="multiples of 32"):
        X.row_bytes(100)


def test_swiglu_oai_reference_is_ggmls_formula():
    # ggml_compute_forward_swiglu_oai_f32 with gpt-oss's alpha 1.702 and limit 7:
    # x = min(a, 7), y = clamp(b, -7, 7), x * sigmoid(1.702 x) * (y + 1)
    a = np.array([-1.0, 0.0, 2.0, 8.0], np.float32)
    b = np.array([0.5, -9.0, 1.0, 9.0], np.float32)
    x = np.minimum(a.astype(np.float64), 7.0)
    y = np.clip(b.astype(np.float64), -7.0, 7.0)
    want = x / (1 + np.exp(-1.702 * x)) * (y + 1)     # [-0.2308, 0, 3.8702, 55.9995]
    got = E.swiglu_oai_ref(a, b, 1.702, 7.0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[1] == 0.0 and abs(got[3] - 7 * 8 / (1 + np.exp(-1.702 * 7))) < 1e-4


@pytest.mark.parametrize("rows", [3, 200])   # 200 x 160 >= SERIAL_BELOW: the parallel kernel
def test_swiglu_oai_kernel_within_a_few_ulp_of_reference(rows):
    rng = np.random.default_rng(rows)
    a, b = (4 * rng.standard_normal((2, rows, 160))).astype(np.float32)   # past the limit too
    got = E.swiglu_oai(a, b, 1.702, 7.0)
    ref = E.swiglu_oai_ref(a, b, 1.702, 7.0)
    # libm's expf against numpy's float32 exp, then a division: a few ulp (measured
    # relative 3.0e-7, 2.5 ulp)
    np.testing.assert_allclose(got, ref, rtol=5e-7, atol=1e-30)
    assert (np.abs(a) > 7).any() and (np.abs(b) > 7).any()


def test_add_id_is_exact_and_refuses_out_of_range_ids():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 2, 160)).astype(np.float32)      # [T, k, n]
    b = read_only(rng.standard_normal((5, 160)).astype(np.float32))   # [E, n]: a weight
    ids = rng.integers(0, 5, size=(7, 2)).astype(np.int32)
    assert np.array_equal(E.add_id(a, b, ids), E.add_id_ref(a, b, ids))
    assert np.array_equal(E.add_id(a, b, ids)[3, 1], a[3, 1] + b[ids[3, 1]])
    ids[2, 0] = 5
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        E.add_id(a, b, ids)
