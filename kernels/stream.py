"""The plainest streaming read: what memory bandwidth a kernel can reach on this machine.

``graphcost hwprobe`` and ``benchmarks/bench_kernels.py`` measure bandwidth with
:func:`read_rows`, and every matrix-vector kernel is judged against it: a matvec reads
each weight byte once, so at best it runs at this rate.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, fastmath=True, cache=True)
def read_rows(a):
    """Sum of each row of ``a`` (float32 ``[rows, n]``, C-contiguous), rows split across
    threads; every byte is read once and the sums (4 bytes a row) are all that is written.
    fastmath lets the inner loop vectorize, so the loop is bound by memory, not adds."""
    out = np.empty(a.shape[0], dtype=np.float32)
    for r in prange(a.shape[0]):
        s = np.float32(0)
        for i in range(a.shape[1]):
            s += a[r, i]
        out[r] = s
    return out
