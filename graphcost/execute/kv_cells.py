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
    position each cell holds (-1: empty) and the search head (``v_heads``).

    As ``llama_kv_cells`` keeps its ``used`` set and ``seq_pos`` map beside the cells, the
    count of filled cells, the highest filled cell + 1 and the highest position are kept
    beside ``pos`` (a decode step reads them without a pass over the cells: the passes
    were ~0.3 ms of Gemma 3 270M's ~1 ms of Python a step, 2-core Zen 3, 2026-11-28).
    Write the cells through :meth:`apply` or :meth:`restore` only."""

    size: int
    n_swa: int = 0                     # > 0: sliding-window cache (standard SWA)
    pos: np.ndarray = field(init=False)
    head: int = 0

    def __post_init__(self) -> None:
        self.pos = np.full(self.size, -1, dtype=np.int64)
        self._count()

    def _count(self) -> None:
        """The figures kept beside ``pos``, from one pass over it."""
        filled = np.flatnonzero(self.pos >= 0)
        self._used = int(filled.size)
        self._max_p1 = int(filled[-1]) + 1 if filled.size else 0
        self._pos_max = int(self.pos[filled].max()) if filled.size else -1

    def restore(self, pos: np.ndarray, head: int) -> None:
        """Put back cells saved as ``(pos.copy(), head)`` (a checkpoint)."""
        np.copyto(self.pos, pos)
        self.head = head
        self._count()

    def masked_swa(self, p0: int, p1: int) -> bool:
        """llama_hparams::is_masked_swa for LLAMA_SWA_TYPE_STANDARD (positions as ints)."""
        return self.n_swa > 0 and p1 - p0 >= self.n_swa

    @property
    def used(self) -> int:
        """Filled cells (llama_kv_cells::get_used)."""
        return self._used

    def used_max_p1(self) -> int:
        """The highest filled cell + 1, 0 when empty (llama_kv_cells::used_max_p1)."""
        return self._max_p1

    def seq_pos_max(self) -> int:
        """The highest position held, -1 when empty (llama_kv_cells::seq_pos_max)."""
        return self._pos_max

    def n_kv(self) -> int:
        """llama_kv_cache::get_n_kv: attended cells, padded to 256."""
        return n_kv_for(self._max_p1, self.size)

    def find_slot(self, n: int) -> np.ndarray:
        """llama_kv_cache::find_slot (cont = false) for ``n`` tokens of sequence 0."""
        if n > self.size:
            raise SettingsError(f"{n} tokens do not fit a KV cache of {self.size} cells")
        used = self._used
        head = 0 if self.head > used + 2 * n else self.head
        seq_max = self._pos_max          # seq_pos_max(0)
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
        max_rm = int(old.max())          # -1 when every cell taken was empty
        self.pos[idxs] = positions
        self.head = int(idxs[-1]) + 1
        if max_rm >= 0:
            # keep [pos_min, pos_max] complete: drop positions <= the ones overwritten
            stale = (self.pos >= 0) & (self.pos <= max_rm)
            if stale.any():
                self.pos[stale] = -1
                self._count()
                return
        # no cell was emptied: the cells taken that were empty are filled now. Every
        # filled cell holds a position > max_rm, the new ones too, so a position
        # overwritten (<= max_rm) was not the highest unless all were: the highest is
        # the old one or a new one
        self._used += int(np.count_nonzero(old < 0))
        self._max_p1 = max(self._max_p1, int(idxs.max()) + 1)
        self._pos_max = max(self._pos_max, int(positions.max()))

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
