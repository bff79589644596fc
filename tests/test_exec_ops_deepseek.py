"""The numpy pieces the executor added for deepseek2 (graphcost/execute/exec_ops.py, executor.py),
each against a literal transcription of ggml-cpu's loop or llama.cpp's formula. No Numba."""
from __future__ import annotations

import numpy as np
import pytest

from graphcost.errors import UnsupportedError
from graphcost.execute.exec_ops import set_rows_batched
from graphcost.execute.inputs import attn_temp


def ggml_set_rows(dst, rows, idx):
    """ggml_compute_forward_set_rows_impl (ggml-cpu/ops.cpp), ggml index order:
    dst[i03][i02][idx[i12][i11][i]] = rows[i03][i02][i], i12 = i03 % ne12, i11 = i02 % ne11."""
    ne03, ne02, ne01 = rows.shape[:3]
    ne12, ne11 = idx.shape[1], idx.shape[2]
    for i03 in range(ne03):
        for i02 in range(ne02):
            for i in range(ne01):
                i1 = int(idx[0, i03 % ne12, i02 % ne11, i])
                dst[i03, i02, i1, :] = rows[i03, i02, i, :]


@pytest.mark.parametrize("idx_shape", [(1, 1, 5, 2), (1, 1, 1, 2), (1, 2, 5, 2)])
def test_set_rows_batched_matches_ggml_loop(idx_shape):
    rng = np.random.default_rng(0)
    # numpy order, as the expert-group mask: 2 of 4 rows of 3 values, 5 x 2 slabs
    rows = rng.standard_normal((2, 5, 2, 3)).astype(np.float32)
    idx = np.stack([rng.permutation(4)[:2] for _ in range(int(np.prod(idx_shape[:3])))])
    idx = idx.reshape(idx_shape).astype(np.int32)
    ours = np.full((2, 5, 4, 3), -np.inf, dtype=np.float32)
    ref = ours.copy()
    set_rows_batched(ours, rows, idx)
    ggml_set_rows(ref, rows, idx)
    assert np.array_equal(ours, ref)
    # every destination slab got exactly its 2 rows; the other 2 rows stay -inf
    assert (np.isinf(ours[..., 0]).sum(-1) == 2).all()


def test_set_rows_batched_checks_indices():
    dst = np.zeros((1, 1, 2, 3), np.float32)
    with pytest.raises(IndexError):
        set_rows_batched(dst, np.ones((1, 1, 1, 3), np.float32), np.array([[[[2]]]], np.int32))


def test_attn_temp_is_llama_cpps_formula():
    # log(floor(pos / 16) + 1) * 0.1 + 1: positions 0..15 -> 1, 16..31 -> 1 + 0.1 ln 2,
    # 48 -> 1 + 0.1 ln 4
    pos = np.array([0, 15, 16, 31, 48], dtype=np.int32)
    got = attn_temp(pos, 0.1, 16)
    assert got.dtype == np.float32
    want = np.float32([1, 1, 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(2), 1 + 0.1 * np.log(4)])
    np.testing.assert_allclose(got, want, rtol=1e-7)
    with pytest.raises(UnsupportedError, match="temperature_length"):
        attn_temp(pos, 0.1, 0)
