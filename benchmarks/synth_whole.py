"""Header-only GGUFs made whole for llama-bench, and random tensor data for them.

``make_whole`` is the package's (graphcost.bench_models: same header, tokenizer model
``"none"``, zero sparse tensor data); ``fill_random`` (benchmarks only) overwrites the data
with the executor's small random values, for checking that speed does not depend on them.
"""
from __future__ import annotations

import sys
from pathlib import Path

from graphcost.bench_models import make_whole
from graphcost.format.gguf_reader import read_header

__all__ = ["make_whole", "fill_random"]


def fill_random(path: str | Path, seed: int = 0) -> Path:
    """Overwrite every tensor of the whole file ``path`` with small finite random values
    (graphcost.execute.weights.random_raw: the executor's random weights), in place."""
    import numpy as np

    from graphcost.execute.weights import random_raw

    h = read_header(path)
    rng = np.random.default_rng(seed)
    with open(path, "r+b") as f:
        for t in h.tensors.values():
            f.seek(h.data_offset + t.offset)
            f.write(random_raw(t.type, t.ne, rng).tobytes())
    return Path(path)


if __name__ == "__main__":
    print(make_whole(sys.argv[1], sys.argv[2]))
