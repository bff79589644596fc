"""Matrix-vector kernels of another commit against this tree's, in one process, alternated.

A change to a kernel is judged against the code before it, on the same machine, under
the same load: both run in this process on the same weight matrix, ten calls of one then
ten of the other, 21 rounds, medians. The other commit's ``kernels/`` is taken with
``git archive`` into a temporary directory and imported as a second package
(``kernels_base``, compiled there on first use: its compile time is not timed), so the
run needs the repository's git history.

    python benchmarks/bench_kernels_ab.py --base c259a47 --types Q2_K,Q3_K [--rows 2048]
                                          [--k 4096] [--threads 1]

For each type: ``_groups4_<type>`` (the four-row matvec the executor's decode runs over a
task's rows) of ``--rows`` rows of ``--k`` columns (rows of 64 valid blocks from
``tests/gguf_writer.make_weight``, tiled), activations quantized and prepared by each
side's own ``quantize_activations``/``prepare_row``. Prints GB/s of the weight bytes for
both, after/before speed, and whether both gave the same bits (they must: a kernel change
keeps ggml's numbers; a mismatch is an error, exit 1).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def base_kernels(rev: str, into: Path):
    """``kernels/`` of commit ``rev`` imported as package ``kernels_base`` from ``into``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels"],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(tar)) as t:
        t.extractall(into, filter="data")
    (into / "kernels").rename(into / "kernels_base")
    sys.path.insert(0, str(into))
    import kernels_base
    import kernels_base.quants
    import kernels_base.vec_dot_simd
    return kernels_base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (git rev)")
    ap.add_argument("--types", default="Q2_K,Q3_K")
    ap.add_argument("--rows", type=int, default=2048, help="weight rows (a multiple of 64)")
    ap.add_argument("--k", type=int, default=4096, help="columns (a multiple of 256)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    import numba
    numba.set_num_threads(a.threads)
    sys.path.insert(0, str(ROOT / "tests"))
    import gguf_writer as W
    from gguf import GGMLQuantizationType as QT

    from graphcost.execute.kernels_loader import load_kernels
    new = load_kernels()
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        old = base_kernels(a.base, Path(tmp))
        print(f"kernels of {a.base} (before) and of {ROOT} (after), {a.threads} thread(s), "
              f"numba {numba.__version__}")
        for name in a.types.split(","):
            qt, k, m = QT[name], a.k, a.rows
            rng = np.random.default_rng(3)
            w0 = np.ascontiguousarray(W.make_weight(rng, (64, k), qt)).view(np.uint8)
            w = np.ascontiguousarray(np.tile(w0.reshape(64, -1), (m // 64, 1)))
            x = rng.standard_normal((1, k)).astype(np.float32)
            sides = []
            for K in (old, new):
                V, Q = K.vec_dot_simd, K.quants
                yq = Q.quantize_activations(x, Q.VEC_DOT_TYPE[qt], True)[0]
                yp = np.empty(V.prep_bytes(np.int64(int(qt)), k), np.uint8)
                V.prepare_row(np.int64(int(qt)), yq, yp)
                fn, out = getattr(V, "_groups4_" + name.lower()), np.empty(m, np.float32)
                fn(w, 0, m, yq, yp, out)                      # compile or load
                sides.append((fn, yq, yp, out))
            equal = np.array_equal(sides[0][3], sides[1][3])
            same &= equal
            times = ([], [])
            for _ in range(21):
                for (fn, yq, yp, out), t in zip(sides, times):
                    t0 = time.perf_counter()
                    for _ in range(10):
                        fn(w, 0, m, yq, yp, out)
                    t.append((time.perf_counter() - t0) / 10)
            before, after = (float(np.median(t)) for t in times)
            print(f"{name:5s} {m} x {k} ({w.nbytes / 2**20:.1f} MiB): before "
                  f"{w.nbytes / before / 1e9:.2f} GB/s, after {w.nbytes / after / 1e9:.2f} "
                  f"GB/s, after/before speed {before / after:.3f}, same bits: {equal}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
