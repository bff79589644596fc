"""The cells of a KV cache as the executor keeps them across steps (``llama_kv_cells``,
``src/llama-kv-cache.cpp``) for one sequence: which position each cell holds, the slot
search (``find_slot``), the causal and sliding-window mask, and the Hadamard matrices of
quantized caches."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphcost.errors import SettingsError
from graphcost.graph.settings import n_kv_for


@dataclass
class CellState:
    """The cells of one ``llama_kv_cache`` for one sequence (``llama_kv_cells``): the
    position each cell holds (-1: empty) and the search head (``v_heads``)."""

    size: int
    n_swa: int = 0                     # > 0: sliding-window cache (standard SWA)
    pos: np.ndarray = field(init=False)
    head: int = 0

    def __post_init__(self) -> None:
        self.pos = np.full(self.size, -1, dtype=np.int64)

    def masked_swa(self, p0: int, p1: int) -> bool:
        """llama_hparams::is_masked_swa for LLAMA_SWA_TYPE_STANDARD (positions as ints)."""
        return self.n_swa > 0 and p1 - p0 >= self.n_swa

    @property
    def used(self) -> int:
        return int((self.pos >= 0).sum())

    def used_max_p1(self) -> int:
        filled = np.nonzero(self.pos >= 0)[0]
        return int(filled[-1]) + 1 if filled.size else 0

    def n_kv(self) -> int:
        """llama_kv_cache::get_n_kv: attended cells, padded to 256."""
        return n_kv_for(self.used_max_p1(), self.size)

    def find_slot(self, n: int) -> np.ndarray:
        """llama_kv_cache::find_slot (cont = false) for ``n`` tokens of sequence 0."""
        if n > self.size:
            raise SettingsError(f"{n} tokens do not fit a KV cache of {self.size} cells")
        used = self.used          # one pass over the cells (a decode step is ~1 ms of
        head = 0 if self.head > used + 2 * n else self.head      # Python: kept short)
        seq_max = int(self.pos.max()) if used else -1
        idxs: list[int] = []
        tested = 0
        while len(idxs) < n:
            if tested >= self.size:
                raise SettingsError(f"the KV cache ({self.size} cells) is full")
            if head >= self.size:
                head = 0
            p = int(self.pos[head])
            if p < 0 or self.masked_swa(p, seq_max + 1):
                idxs.append(head)
            head += 1
            tested += 1
        return np.array(idxs, dtype=np.int64)

    def apply(self, idxs: np.ndarray, positions: np.ndarray) -> None:
        """llama_kv_cache::apply_ubatch: store positions, purge older overwritten ones."""
        old = self.pos[idxs]
        max_rm = int(old.max()) if (old >= 0).any() else -1
        self.pos[idxs] = positions
        if max_rm >= 0:
            # keep [pos_min, pos_max] complete: drop positions <= the ones overwritten
            stale = (self.pos >= 0) & (self.pos <= max_rm)
            self.pos[stale] = -1
        self.head = int(idxs[-1]) + 1

    def mask(self, n_kv: int, positions: np.ndarray, out: np.ndarray | None = None
             ) -> np.ndarray:
        """kq_mask rows [T, n_kv]: 0 where token i sees cell j, -inf elsewhere; written
        into ``out`` ([T, n_kv], any float dtype) when given, else a new float32 array."""
        p0 = self.pos[:n_kv][None, :]
        p1 = positions[:, None]
        keep = (p0 >= 0) & (p0 <= p1)
        if self.n_swa > 0:
            keep &= p1 - p0 < self.n_swa
        if out is None:
            out = np.empty(keep.shape, dtype=np.float32)
        out.fill(-np.inf)
        out[keep] = 0
        return out


def hadamard(n: int) -> np.ndarray:
    """ggml_gen_hadamard (src/llama-kv-cache.cpp): orthonormal Walsh-Hadamard, F32 [n, n]."""
    h = np.zeros((n, n), dtype=np.float32)
    h[0, 0] = np.float32(1.0 / float(np.sqrt(np.float32(n))))
    s = 1
    while s < n:
        blk = h[:s, :s].copy()
        h[s:2 * s, :s] = blk
        h[:s, s:2 * s] = blk
        h[s:2 * s, s:2 * s] = -blk
        s *= 2
    return h
