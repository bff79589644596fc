"""Matrix-vector kernels of another commit against this tree's, in one process, alternated.

A change to a kernel is judged against the code before it, on the same machine, under
the same load: both run in this process on the same weight matrix, ten calls of one then
ten of the other, 21 rounds, medians. The other commit's ``kernels/`` is taken with
``git archive`` into a temporary directory and imported as a second package
(``kernels_base``, compiled there on first use: its compile time is not timed), so the
run needs the repository's git history.

    python benchmarks/bench_kernels_ab.py --base c259a47 --types Q2_K,Q3_K [--rows 2048]
                                          [--k 4096] [--threads 1]
    python benchmarks/bench_kernels_ab.py --base 29701c3 --attention [--threads 2]

For each type: ``_groups4_<type>`` (the four-row matvec the executor's decode runs over a
task's rows) of ``--rows`` rows of ``--k`` columns (rows of 64 valid blocks from
``tests/gguf_writer.make_weight``, tiled), activations quantized and prepared by each
side's own ``quantize_activations``/``prepare_row``. Prints GB/s of the weight bytes for
both, after/before speed, and whether both gave the same bits (they must: a kernel change
keeps ggml's numbers; a mismatch is an error, exit 1).

The base's kernels compile in this process (a new temporary directory each run); this
tree's load from Numba's cache where it has them, and a kernel loaded from the cache can
run slower than the same kernel compiled in the process (flash attention's kernels that
call ``_lanes_body``: 4-7.5%, sessions 28-29). The run says which this tree's were; for a like-for-like run give it an empty
cache: ``NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/bench_kernels_ab.py ...``.

``--attention``: ``attention.flash_attn_ext`` instead, on F16 K/V in the shapes that
pick each of its kernels (a decode's head groups, serial and parallel, its split KV at
1000 and 4000 keys, rows without GQA; a prompt's query tiles), 15 rounds of 5 calls.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tarfile
import tempfile
import time
from functools import partial
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


def alternated(sides, rounds: int, calls: int) -> list[float]:
    """Median seconds a call of each of ``sides`` (argument-less callables): ``rounds``
    rounds, each timing ``calls`` calls of one side, then of the next."""
    times = [[] for _ in sides]
    for _ in range(rounds):
        for fn, t in zip(sides, times):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t.append((time.perf_counter() - t0) / calls)
    return [float(np.median(t)) for t in times]


def attention_cases(rng) -> dict:
    """Name -> (q, k, v, mask) of ``flash_attn_ext`` for each kernel it picks: Gemma 3
    270M's heads (4 over 1 KV head, 256 dims) and an 8B-like 32/8 and 8/8 at 128 dims;
    causal masks."""
    def case(h, hkv, t, n_kv, d=256):
        q = rng.standard_normal((h, t, d)).astype(np.float32)
        k = (rng.standard_normal((hkv, n_kv, d)) * 0.5).astype(np.float16)
        v = rng.standard_normal((hkv, n_kv, d)).astype(np.float16)
        m = np.zeros((1, t, n_kv), np.float16)
        for i in range(t):
            m[0, i, n_kv - t + i + 1:] = -np.inf
        return q, k, v, m
    return {"decode head groups, serial, 256 keys (4/1 heads)": case(4, 1, 1, 256),
            "decode split KV, 1000 keys (4/1)": case(4, 1, 1, 1000),
            "decode split KV, 4000 keys (4/1)": case(4, 1, 1, 4000),
            "decode rows, 300 keys (8/8, 128 dims)": case(8, 8, 1, 300, 128),
            "decode head groups, 300 keys (32/8, 128 dims)": case(32, 8, 1, 300, 128),
            "prompt tiles, 64 x 64 (4/1)": case(4, 1, 64, 64),
            "prompt tiles, 512 x 512 (4/1)": case(4, 1, 512, 512)}


def attention_ab(old, new) -> bool:
    """Both sides' ``flash_attn_ext`` on :func:`attention_cases`, alternated; prints each
    case's times and whether the bits are the same (returned: all are)."""
    same = True
    for name, (q, k, v, m) in attention_cases(np.random.default_rng(0)).items():
        outs = [K.attention.flash_attn_ext(q, k, v, m, 0.0625) for K in (old, new)]
        equal = np.array_equal(outs[0], outs[1])
        same &= equal
        before, after = alternated(
            [partial(K.attention.flash_attn_ext, q, k, v, m, 0.0625, out=o)
             for K, o in zip((old, new), outs)], rounds=15, calls=5)
        print(f"{name:48s} before {before * 1e6:8.1f} us, after {after * 1e6:8.1f} us, "
              f"after/before speed {before / after:.3f}, same bits: {equal}")
    return same


def cache_note(hits: int) -> str:
    """The line saying how this tree's kernels came to this process."""
    return ("this tree's kernels: compiled in this process, as the base's" if not hits else
            f"this tree's kernels: {hits} loaded from Numba's cache, the base's compiled "
            "here (not like for like: NUMBA_CACHE_DIR=$(mktemp -d) compiles both)")


def loaded_from_cache(*modules) -> int:
    """Functions of ``modules`` that Numba loaded from its cache in this process."""
    from numba.core.registry import CPUDispatcher
    return sum(sum(f.stats.cache_hits.values()) for m in modules for f in vars(m).values()
               if isinstance(f, CPUDispatcher))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (git rev)")
    ap.add_argument("--types", default="Q2_K,Q3_K")
    ap.add_argument("--rows", type=int, default=2048, help="weight rows (a multiple of 64)")
    ap.add_argument("--k", type=int, default=4096, help="columns (a multiple of 256)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--attention", action="store_true",
                    help="flash attention's kernels instead of the matvecs")
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
        if a.attention:
            importlib.import_module("kernels_base.attention")
            same = attention_ab(old, new)
            print(cache_note(loaded_from_cache(new.attention)))
            return 0 if same else 1
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
            before, after = alternated([partial(fn, w, 0, m, yq, yp, out)
                                        for fn, yq, yp, out in sides], rounds=21, calls=10)
            print(f"{name:5s} {m} x {k} ({w.nbytes / 2**20:.1f} MiB): before "
                  f"{w.nbytes / before / 1e9:.2f} GB/s, after {w.nbytes / after / 1e9:.2f} "
                  f"GB/s, after/before speed {before / after:.3f}, same bits: {equal}")
        print(cache_note(loaded_from_cache(new.vec_dot_simd)))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
