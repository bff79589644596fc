"""The weights the executor's graph reads, as flat bytes per tensor name: memory-mapped
from the GGUF (no copy: matmuls decode them block by block) or, for a header-only file,
random bytes of the right types drawn when the graph first reads a tensor; and the refusal
of a file whose tensor types the kernels cannot read."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graphcost.errors import UnsupportedError
from graphcost.format import ggml_types as gt
from graphcost.format.gguf_reader import read_header
from graphcost.format.model import ModelInfo
from graphcost.units import mib

#: fraction of available memory random weights may take before tensors of a type share one buffer
RANDOM_WEIGHTS_MEMORY_FRACTION = 0.5


#: per block type, a scale magnitude that keeps random decoded weights around 0.02
_RANDOM_SCALE = {
    gt.GGMLType.Q4_0: 3e-3, gt.GGMLType.Q4_1: 3e-3, gt.GGMLType.Q5_0: 1.5e-3,
    gt.GGMLType.Q5_1: 1.5e-3, gt.GGMLType.Q8_0: 2e-4, gt.GGMLType.Q2_K: 2e-3,
    gt.GGMLType.Q3_K: 2e-4, gt.GGMLType.Q4_K: 1e-4, gt.GGMLType.Q5_K: 5e-5,
    gt.GGMLType.Q6_K: 2e-5,
}


def random_raw(t: gt.GGMLType, ne: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Flat bytes of a tensor of type ``t`` whose values are small and finite, drawn in
    float32 (never a float64 copy of the tensor: that would be 2-8x its size)."""
    n = int(np.prod(ne))
    if t == gt.F32:
        vec = len([d for d in ne if d > 1]) <= 1            # norm weights, biases: around 1
        v = rng.standard_normal(n, dtype=np.float32)
        v *= np.float32(0.05 if vec else 0.02)
        if vec:
            v += np.float32(1.0)
        return v.view(np.uint8)
    if t == gt.F16:
        v = rng.standard_normal(n, dtype=np.float32)
        v *= np.float32(0.02)
        return v.astype(np.float16).view(np.uint8)
    if t == gt.GGMLType.BF16:
        f = rng.standard_normal(n, dtype=np.float32)
        f *= np.float32(0.02)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blk, size = gt.block(t)
    n_blocks = n // blk
    if t == gt.GGMLType.MXFP4:
        # E8M0 scale byte first: 2^(e - 128) times codes up to 12 -> |w| <= 0.05
        raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        raw[:, 0] = rng.integers(118, 121, size=n_blocks, dtype=np.uint8)
        return raw.reshape(-1)
    offsets, scale = gt.f16_scale_offsets(t), _RANDOM_SCALE.get(t)
    if not offsets or scale is None:
        raise UnsupportedError(f"random weights of type {gt.type_name(t)}")
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in offsets:
        d = ((rng.random(n_blocks, dtype=np.float32) * 0.5 + 0.5) * scale).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable`` of /proc/meminfo; 8 GiB where it
    cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` marked read-only, as a mapped file's weights are (:func:`mapped_weights`):
    numba types a read-only array apart from a writable one, so random weights of the same
    array type as mapped ones run the kernels already compiled (and cached) for those,
    instead of compiling every kernel a second time."""
    a.flags.writeable = False
    return a


class RandomWeights(Mapping):
    """Random bytes for the tensors of a header-only file, drawn when the graph first
    asks for a tensor: a tensor the graph never uses costs nothing.

    Each tensor gets its own buffer while all drawn so far fit in
    RANDOM_WEIGHTS_MEMORY_FRACTION of the available memory; past that, tensors of one
    type share one buffer (as big as the largest of them asked for so far), which keeps
    a 100-GB model runnable but lets caches serve reads that would come from memory:
    timings are then optimistic (:attr:`note` says which happened)."""

    def __init__(self, model: ModelInfo, seed: int = 0):
        self.model = model
        self.rng = np.random.default_rng(seed)
        self.budget = RANDOM_WEIGHTS_MEMORY_FRACTION * available_memory()
        self.drawn: dict[str, np.ndarray] = {}
        self.own_bytes = 0
        self.pools: dict[gt.GGMLType, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.drawn:
            t = self.model.tensors[name]
            if self.own_bytes + t.nbytes <= self.budget:
                self.drawn[name] = read_only(random_raw(t.type, t.ne, self.rng))
                self.own_bytes += t.nbytes
            else:
                pool = self.pools.get(t.type)
                if pool is None or pool.nbytes < t.nbytes:
                    pool = self.pools[t.type] = read_only(random_raw(t.type, t.ne, self.rng))
                self.drawn[name] = pool[:t.nbytes]
        return self.drawn[name]

    def __contains__(self, name: object) -> bool:  # drawn so far (Mapping's would draw it)
        return name in self.drawn

    def __iter__(self):
        return iter(self.drawn)

    def __len__(self) -> int:
        return len(self.drawn)

    @property
    def note(self) -> str:
        used = sum(self.model.tensors[n].nbytes for n in self.drawn)
        if not self.pools:
            return (f"header-only file: weights are random ({mib(used, 0)} MiB for the "
                    f"{len(self.drawn)} tensors the graph uses)")
        pooled = sum(p.nbytes for p in self.pools.values())
        return (f"header-only file: weights are random and, past {mib(self.own_bytes, 0)} MiB, "
                f"tensors of one type share a buffer ({mib(pooled, 0)} MiB shared for "
                f"{mib(used, 0)} MiB of weights): timings are optimistic")


def random_weights(model: ModelInfo, seed: int = 0) -> RandomWeights:
    """The random weights of a header-only file (drawn lazily, see :class:`RandomWeights`)."""
    return RandomWeights(model, seed)


def mapped_weights(model: ModelInfo) -> dict[str, np.ndarray]:
    """Each tensor's bytes, memory-mapped read-only from its shard (no copy)."""
    header = model.header
    shards = header.shards or [header.path]
    maps, offsets = [], []
    for i, p in enumerate(shards):
        maps.append(np.memmap(p, dtype=np.uint8, mode="r"))
        offsets.append(header.data_offset if i == 0 else read_header(p).data_offset)
    out = {}
    for t in model.tensors.values():
        start = offsets[t.shard] + t.offset
        out[t.name] = maps[t.shard][start:start + t.nbytes]
    return out


def refuse_unsupported_weights(model: ModelInfo, supported) -> None:
    """One line naming the first tensor whose type the kernels cannot read (MXFP4, the IQ
    and TQ types ...), before any graph is compiled; analysis still costs such files."""
    bad = [t for t in model.tensors.values() if t.type not in supported]
    if bad:
        more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
        kinds = ", ".join(sorted({gt.type_name(t.type) for t in bad}))
        raise UnsupportedError(
            f"{model.header.path}: tensor {bad[0].name!r} is {gt.type_name(bad[0].type)}"
            f"{more}; the executor's kernels do not run {kinds} (they run "
            f"{', '.join(gt.type_name(t) for t in supported)}); `graphcost analyze` costs it")
