"""The cost of starting a Numba parallel region (prange) at several thread counts, back to
back and after a few us of serial work; per threading layer (run once per layer)."""
import time, statistics
import numpy as np, numba
from numba import njit, prange

@njit(parallel=True, cache=False)
def region(a):
    for i in prange(a.shape[0]):
        a[i] += 1.0

@njit(cache=False)
def spin(a, n):
    s = 0.0
    for j in range(n):
        for i in range(a.shape[0]):
            s += a[i] * 1.0000001
    return s

a = np.zeros(64, np.float32); b = np.ones(256, np.float32)
region(a); spin(b, 1)
print("layer", numba.threading_layer(), "numba", numba.__version__, "NUMBA_NUM_THREADS", numba.config.NUMBA_NUM_THREADS, flush=True)
t0 = time.perf_counter_ns(); spin(b, 20); s20 = (time.perf_counter_ns() - t0) / 1e3
clock = time.perf_counter_ns
top = numba.config.NUMBA_NUM_THREADS
for nt in sorted({1, 2, 4, 8, top} & set(range(1, top + 1))):
    numba.set_num_threads(nt)
    res = {}
    for gap in (0, 20, 200):
        ts = []
        for _ in range(1500):
            if gap: spin(b, gap)
            t0 = clock(); region(a); ts.append(clock() - t0)
        res[gap] = statistics.median(ts[200:]) / 1e3
    print(f"threads {nt:2d}: a region {res[0]:.2f} us back to back, {res[20]:.2f} after ~{s20:.1f} us serial, {res[200]:.2f} after ~{s20*10:.0f} us", flush=True)
