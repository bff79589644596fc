"""Execution: Numba kernels run the same graph (weights, KV cells, inputs), profile, hardware probe."""
