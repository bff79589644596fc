"""get_rows: gather rows of a raw weight by index and decode them to float32.

``get_rows(w_raw, w_type, K, idx)`` -> ``[len(idx), K]`` float32, ``out[i]`` =
decoded row ``idx[i]`` (token embedding lookup; ggml-cpu/ops.cpp
``ggml_compute_forward_get_rows``, which calls the type's ``to_float`` =
``dequantize_row_*``). Only the requested rows are read. Exact: the decoders match
``gguf.quants.dequantize`` bit for bit, which is the reference.
Bytes: ``len(idx) * row_bytes`` read, ``len(idx) * K * 4`` written.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit, prange

from .quants import check_weight, dequantize_ref, dequantize_row


@njit(parallel=True, cache=True)
def _get_rows(w, code, idx, out):
    for i in prange(idx.shape[0]):
        dequantize_row(code, w[idx[i]], out[i])


@njit(cache=True)
def _get_rows_serial(w, code, idx, out):
    for i in range(idx.shape[0]):
        dequantize_row(code, w[idx[i]], out[i])


#: decoded values below which :func:`kernel` picks the serial variant (a parallel region
#: costs 5-30 us to start)
SERIAL_BELOW = 32768


def kernel(work: int):
    """The gather kernel ``(w[rows, row_bytes], code, idx int32 or int64, out[n, K])`` for ``work``
    decoded values (serial below ``SERIAL_BELOW``); it does not check ``idx``."""
    return _get_rows_serial if work < SERIAL_BELOW else _get_rows


def get_rows(w_raw: np.ndarray, w_type: QT, k: int, idx: np.ndarray,
             out: np.ndarray | None = None) -> np.ndarray:
    """Decoded rows ``idx`` of the raw weight ``w_raw`` ``[rows, row_bytes]`` (into
    ``out``, C-contiguous float32 ``[len(idx), k]``, when given)."""
    w = check_weight(w_raw, w_type, k)
    idx = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= w.shape[0]):
        raise IndexError(f"row index out of range [0, {w.shape[0]})")
    if out is None:
        out = np.empty((idx.shape[0], k), dtype=np.float32)
    elif out.shape != (idx.shape[0], k) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {(idx.shape[0], k)}")
    kernel(out.size)(w, np.int64(QT(w_type)), idx, out)
    return out


def get_rows_ref(w_raw: np.ndarray, w_type: QT, k: int, idx: np.ndarray) -> np.ndarray:
    """numpy reference: gguf-py's dequantizer on the gathered rows."""
    w = check_weight(w_raw, w_type, k)
    return dequantize_ref(w[np.asarray(idx, dtype=np.int64).reshape(-1)], w_type, k)
