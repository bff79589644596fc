"""Matrix-vector speed of the mul_mat kernels against the machine's memory bandwidth.

Decode (one token) multiplies every weight matrix by one vector: each weight byte is
read once and used for one multiply-add per value, so the kernel is memory-bound by
design and the figure of merit is bytes/second against what a plain streaming read
achieves on the same machine, in the same run. Target (profiling issue): >= 80%.

    python benchmarks/bench_kernels.py [--mib 256] [--repeat 9] [--types Q4_K,Q8_0]
                                       [--threads 2] [--paths float,ggml] [--use-cache]
                                       [--beside-llama-cpp]

Two paths, side by side (``kernels/matmul.py``):

* ``float`` -- ``mul_mat``: float32 x, the weight decoded to float32 on the fly;
* ``ggml`` -- ``mul_mat_ggml``: x quantized to the weight's vec_dot_type (timed: it is
  part of every call), then ggml's integer block dots (``kernels/vec_dot_simd.py``
  for the quantized types, ``vec_dot_ggml.py`` for F32/F16/BF16).

For each weight type (K = 4096 columns, rows chosen so the matrix is >= --mib MiB,
well past the caches: a 64 MiB read already runs at DRAM speed here):

1. build the weight: 64 valid rows from ``tests/gguf_writer.make_weight`` (gguf-py
   quantizer, or random k-quant blocks with sane scales), tiled to size;
2. compile: time each path's first call on a small matrix (numba's cache is sent to
   a fresh temporary directory unless ``--use-cache``, so this is a real compile);
3. validate: the big product's first 256 rows, ``float`` against
   ``x @ dequantize(W).T`` (relative to ``|x| @ |W|.T``), ``ggml`` bit for bit against
   its numpy reimplementation ``mul_mat_ggml_ref``;
4. time: ``--repeat`` rounds, each one run of the bandwidth kernel then one run of
   each path, so the ratios compare measurements taken under the same load (the
   machine is shared); report medians.

Bandwidth kernel: ``kernels.stream.read_rows`` (the one ``graphcost hwprobe`` uses), a
``prange`` sum over a 1 GiB float32 array (rows of 4096, fastmath so it vectorizes) --
the simplest streaming read.
Napkin math per row of the table: bytes = weight + x + y, FLOPs = 2*M*K (FMA = 2).

``--beside-llama-cpp`` adds llama.cpp's own matrix-vector for each type, timed right after
ours: ``test-backend-ops perf -o MUL_MAT -b CPU`` (built beside llama-bench by
``graphcost.judge.llama_tools.build``), its perf case ``type_a=<type>, type_b=f32,
m=4096, n=1, k=14336`` (``make_test_cases_perf`` in llama.cpp's tests/test-backend-ops.cpp:
4096 weight rows of 14336, one activation row; ggml quantizes the row to the type's
vec_dot_type and runs its vec_dot, the plain layout: test-backend-ops allocates no
repacked buffer). It runs in its own process with the environment this script was
started with, on ``max(1, hardware_concurrency / 2)`` threads (its ``N_THREADS / 2``, not
settable), so this option sets our threads to the same count. Its GB/s counts the same
bytes (weight + x + y) over its printed us/run. Its matrix (19-235 MiB by type) can be
smaller than ``--mib`` makes ours (a Q2_K one, 19 MiB, fits in a 32 MiB L3, and calls
one after another then read it from there), so ours is also timed on a matrix of that
shape right before it: those two columns compare the same bytes in the same caches.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

K_COLS = 4096
BW_BYTES = 1 << 30
VALIDATE_ROWS = 256
#: test-backend-ops' matrix-vector perf case: weight rows, row length (tests/test-backend-ops.cpp)
LLAMA_M, LLAMA_K = 4096, 14336
_LLAMA_RUN = re.compile(rf"MUL_MAT\(type_a=(\w+),type_b=f32,m={LLAMA_M},n=1,k={LLAMA_K},"
                        r"bs=\[1,1\],nr=\[1,1\],per=\[0,1,2,3\][^)]*\):\s+(\d+) runs -\s+"
                        r"([\d.]+) us/run")
#: the environment this script was started with (llama.cpp's process gets it, not ours)
_USER_ENV = dict(os.environ)


def tiled_weight(make_weight, rng, qt, k: int, rows: int, row_bytes: int) -> np.ndarray:
    """``rows`` (a multiple of 64) raw weight rows of ``k`` values: 64 valid rows of
    ``make_weight`` repeated."""
    tile = np.ascontiguousarray(make_weight(rng, (64, k), qt)).view(np.uint8)
    return np.tile(tile.reshape(64, row_bytes), (rows // 64, 1))


def llama_cpp_threads() -> int:
    """test-backend-ops' CPU threads: ``max(1, N_THREADS / 2)``, N_THREADS the hardware
    concurrency (``std::thread::hardware_concurrency``, the CPUs Linux reports)."""
    return max(1, (os.cpu_count() or 1) // 2)


def llama_cpp_matvec(exe: Path, qt) -> float:
    """Seconds per run of llama.cpp's MUL_MAT of ``LLAMA_M`` rows of ``LLAMA_K`` ``qt``
    weights by one f32 row (test-backend-ops perf, its own process)."""
    from graphcost.format.ggml_types import type_name
    name = type_name(qt)
    r = subprocess.run([str(exe), "perf", "-o", "MUL_MAT", "-b", "CPU", "-p",
                        rf"type_a={name},type_b=f32,m={LLAMA_M},n=1,k={LLAMA_K},bs=\[1,1\]"],
                       capture_output=True, text=True, env=_USER_ENV, timeout=600)
    runs = [m for m in _LLAMA_RUN.finditer(r.stdout) if m.group(1) == name]
    if r.returncode != 0 or len(runs) != 1:
        raise SystemExit(f"test-backend-ops perf for {name}: exit {r.returncode}, "
                         f"{len(runs)} matching cases\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return float(runs[0].group(3)) * 1e-6


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="minimum weight size per type (MiB)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--types", default="", help="comma-separated GGML type names (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="numba threads (default: all cores)")
    ap.add_argument("--paths", default="float,ggml", help="comma-separated: float, ggml")
    ap.add_argument("--use-cache", action="store_true",
                    help="use numba's on-disk cache (compile column then shows load time)")
    ap.add_argument("--beside-llama-cpp", action="store_true",
                    help="also time llama.cpp's matrix-vector (test-backend-ops perf) per type, "
                         "on its thread count")
    return ap.parse_args()


def main() -> None:
    args = _args()
    if not args.use_cache:  # must happen before numba is imported
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="graphcost-bench-numba-")
    import numba

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gguf_writer import make_weight
    from gguf import GGMLQuantizationType as QT

    from graphcost.execute.hwprobe import _median_seconds     # one warm-up, then the median
    from graphcost.execute.kernels_loader import load_kernels

    llama_exe = None
    if args.beside_llama_cpp:
        from graphcost.judge.llama_tools import find_tool, missing_reason
        llama_exe = find_tool("test-backend-ops")
        if llama_exe is None:
            raise SystemExit(missing_reason("test-backend-ops"))
        if args.threads and args.threads != llama_cpp_threads():
            raise SystemExit(f"--beside-llama-cpp: test-backend-ops runs {llama_cpp_threads()} "
                             f"threads here, not --threads {args.threads}")
        args.threads = llama_cpp_threads()
    if args.threads:
        numba.set_num_threads(args.threads)
    kern = load_kernels()
    mm, quants = kern.matmul, kern.quants
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - {"float", "ggml"}:
        raise SystemExit(f"--paths: expected float and/or ggml, got {args.paths!r}")
    run = {"float": mm.mul_mat, "ggml": mm.mul_mat_ggml}

    stream_sum = kern.stream.read_rows     # what hwprobe measures the bandwidth with
    big = np.ones((BW_BYTES // 4 // K_COLS, K_COLS), dtype=np.float32)   # touched: resident
    stream_sum(big)                                                         # compile + warm

    def bandwidth_run() -> float:
        t = time.perf_counter()
        stream_sum(big)
        return BW_BYTES / (time.perf_counter() - t) / 1e9

    types = [QT[t] for t in args.types.split(",") if t] or list(quants.SUPPORTED)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, K_COLS)).astype(np.float32)
    print(f"graphcost kernels: matrix-vector, K = {K_COLS}, numba {numba.__version__}, "
          f"{numba.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f} at start")
    print(f"bandwidth kernel: prange sum over {BW_BYTES >> 20} MiB float32 "
          f"(median of the runs interleaved with each type)\n")
    if llama_exe:
        print(f"beside: llama.cpp's MUL_MAT {LLAMA_M} x {LLAMA_K}, n = 1 ({llama_exe}, "
              f"{llama_cpp_threads()} threads)\n")
    cols = "".join(f" | {p + ' ms':>9s} {'GB/s':>6s} {'% BW':>5s}" for p in paths)
    if llama_exe:
        cols += f" | {'ours':>6s} {'llama':>6s} {'ratio':>5s}"
    head = (f"{'type':5s} {'MiB':>5s} {'rows':>7s} {'BW GB/s':>7s}{cols} | {'compile s':>11s} "
            f"{'check':>14s}")
    print(head)
    print("-" * len(head))
    all_bw = []
    for qt in types:
        row_bytes = quants.row_bytes(qt, K_COLS)
        rows = -(-(args.mib << 20) // row_bytes)
        rows = -(-rows // 64) * 64
        w = tiled_weight(make_weight, rng, qt, K_COLS, rows, row_bytes)

        compile_s, checks = [], []
        for p in paths:
            t = time.perf_counter()
            run[p](w[:64], qt, K_COLS, 64, x)                   # first call: compile
            compile_s.append(time.perf_counter() - t)
            y = run[p](w, qt, K_COLS, rows, x)                  # validate before timing
            w0 = w[:VALIDATE_ROWS]
            if p == "float":
                ref = mm.mul_mat_ref(w0, qt, K_COLS, VALIDATE_ROWS, x)
                bound = np.abs(x) @ np.abs(quants.dequantize_ref(w0, qt, K_COLS)).T
                err = float((np.abs(y[:, :VALIDATE_ROWS] - ref) / bound).max())
                assert err <= 1e-5, f"{qt.name}: mul_mat disagrees with dequantize(W) @ x ({err:.1e})"
                checks.append(f"{err:.0e}")
            else:
                ref = mm.mul_mat_ggml_ref(w0, qt, K_COLS, VALIDATE_ROWS, x)
                assert np.array_equal(y[:, :VALIDATE_ROWS], ref), \
                    f"{qt.name}: mul_mat_ggml differs from mul_mat_ggml_ref"
                checks.append("exact")
            del y

        times = {p: [] for p in paths}
        bws = []
        for _ in range(args.repeat):
            bws.append(bandwidth_run())
            for p in paths:
                t = time.perf_counter()
                run[p](w, qt, K_COLS, rows, x)
                times[p].append(time.perf_counter() - t)
        all_bw += bws
        bw = statistics.median(bws)
        moved = w.nbytes + x.nbytes + rows * 4
        line = f"{qt.name:5s} {w.nbytes / 2**20:5.0f} {rows:7d} {bw:7.2f}"
        for p in paths:
            sec = statistics.median(times[p])
            gbs = moved / sec / 1e9
            line += f" | {sec * 1e3:9.2f} {gbs:6.2f} {100 * gbs / bw:5.0f}"
        if llama_exe:
            # ours on llama.cpp's matrix (same bytes, same caches: up to 32 MiB of it can
            # stay in a large L3 between calls), then llama.cpp's
            rb = quants.row_bytes(qt, LLAMA_K)
            w2 = tiled_weight(make_weight, rng, qt, LLAMA_K, LLAMA_M, rb)
            x2 = rng.standard_normal((1, LLAMA_K)).astype(np.float32)
            moved2 = LLAMA_M * rb + 4 * (LLAMA_K + LLAMA_M)
            ours = _median_seconds(lambda: run["ggml"](w2, qt, LLAMA_K, LLAMA_M, x2),
                                   args.repeat)
            del w2
            sec = llama_cpp_matvec(llama_exe, qt)
            line += f" | {moved2 / ours / 1e9:6.2f} {moved2 / sec / 1e9:6.2f} {sec / ours:5.2f}"
        line += f" | {'/'.join(f'{c:.1f}' for c in compile_s):>11s} {'/'.join(checks):>14s}"
        print(line, flush=True)
        del w
    print(f"\nbandwidth kernel over the whole run: median {statistics.median(all_bw):.2f} GB/s, "
          f"min {min(all_bw):.2f}, max {max(all_bw):.2f}; load average "
          f"{os.getloadavg()[0]:.2f} at end")
    print("GB/s = (weight + x + y bytes) / median time; % BW against the bandwidth runs "
          "interleaved with that type's runs" + (".\nours / llama: GB/s on llama.cpp's matrix "
          f"({LLAMA_M} rows of {LLAMA_K}), ours (mul_mat_ggml, median of --repeat) then "
          "test-backend-ops'; ratio = llama.cpp's time / ours (> 1: ours is faster)"
          if llama_exe else "") + ".\ncompile s = first call of each path (the "
          "first type also compiles the shared kernels); check = float path's max error\n"
          "relative to |x| @ |W|.T, ggml path bit for bit against mul_mat_ggml_ref.")


if __name__ == "__main__":
    main()
