"""Numba CPU kernels for graphcost's graph (placeholder; filled in below)."""
