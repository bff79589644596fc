"""Matrix-vector speed of the mul_mat kernels against the machine's memory bandwidth.

Decode (one token) multiplies every weight matrix by one vector: each weight byte is
read once and used for one multiply-add per value, so the kernel is memory-bound by
design and the figure of merit is bytes/second against what a plain streaming read
achieves on the same machine, in the same run. Target (profiling issue): >= 80%.

    python benchmarks/bench_kernels.py [--mib 256] [--repeat 9] [--types Q4_K,Q8_0]
                                       [--threads 2] [--paths float,ggml] [--use-cache]

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
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

K_COLS = 4096
BW_BYTES = 1 << 30
VALIDATE_ROWS = 256


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="minimum weight size per type (MiB)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--types", default="", help="comma-separated GGML type names (default: all)")
    ap.add_argument("--threads", type=int, default=0, help="numba threads (default: all cores)")
    ap.add_argument("--paths", default="float,ggml", help="comma-separated: float, ggml")
    ap.add_argument("--use-cache", action="store_true",
                    help="use numba's on-disk cache (compile column then shows load time)")
    return ap.parse_args()


def main() -> None:
    args = _args()
    if not args.use_cache:  # must happen before numba is imported
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="graphcost-bench-numba-")
    import numba

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from gguf_writer import make_weight
    from gguf import GGMLQuantizationType as QT

    from graphcost.execute.kernels_loader import load_kernels

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
    cols = "".join(f" | {p + ' ms':>9s} {'GB/s':>6s} {'% BW':>5s}" for p in paths)
    head = (f"{'type':5s} {'MiB':>5s} {'rows':>7s} {'BW GB/s':>7s}{cols} | {'compile s':>11s} "
            f"{'check':>14s}")
    print(head)
    print("-" * len(head))
    all_bw = []
    for qt in types:
        row_bytes = quants.row_bytes(qt, K_COLS)
        rows = -(-(args.mib << 20) // row_bytes)
        rows = -(-rows // 64) * 64
        tile = np.ascontiguousarray(make_weight(rng, (64, K_COLS), qt)).view(np.uint8)
        w = np.tile(tile.reshape(64, row_bytes), (rows // 64, 1))

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
        line += f" | {'/'.join(f'{c:.1f}' for c in compile_s):>11s} {'/'.join(checks):>14s}"
        print(line, flush=True)
        del w
    print(f"\nbandwidth kernel over the whole run: median {statistics.median(all_bw):.2f} GB/s, "
          f"min {min(all_bw):.2f}, max {max(all_bw):.2f}; load average "
          f"{os.getloadavg()[0]:.2f} at end")
    print("GB/s = (weight + x + y bytes) / median time; % BW against the bandwidth runs "
          "interleaved with that type's runs.\ncompile s = first call of each path (the "
          "first type also compiles the shared kernels); check = float path's max error\n"
          "relative to |x| @ |W|.T, ggml path bit for bit against mul_mat_ggml_ref.")


if __name__ == "__main__":
    main()
