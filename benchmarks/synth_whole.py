"""Make a header-only GGUF whole for llama-bench, from the command line.

    PYTHONPATH=. python benchmarks/synth_whole.py SRC DST [--zero] [--keep-vocab]

graphcost.bench_models.make_whole: ``SRC``'s header (tokenizer model ``"none"`` unless
``--keep-vocab``) and tiled random tensor data of every tensor's type (``fill_tiled``), or
sparse zeros with ``--zero``. benchmarks/value_check.py measured which data gives a real
file's speed (docs/speed.md, "Values").
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphcost.bench_models import make_whole  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--zero", action="store_true", help="sparse zero data")
    ap.add_argument("--keep-vocab", action="store_true", help="keep the tokenizer")
    a = ap.parse_args()
    t0 = time.perf_counter()
    out = make_whole(a.src, a.dst, vocab_none=not a.keep_vocab,
                     data="zero" if a.zero else "random")
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
