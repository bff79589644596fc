"""Filling a plan's graph inputs for one ubatch of one sequence, as llama.cpp's
``set_input`` does (``src/llama-graph.cpp``, ``src/llama-kv-cache.cpp``,
``src/llama-memory-recurrent.cpp``): tokens, positions, output ids, the KV cells chosen by
``find_slot`` (``k_idxs``; ``v_idxs`` as element indices ``j*kv_size + cell`` when V is
transposed), the causal mask (0 / -inf, F16 with flash attention) with sliding-window
masking (``LLAMA_SWA_TYPE_STANDARD``: cell masked when ``p1 - p0 >= n_swa``) for the SWA
cache, the Hadamard matrices of quantized caches, the recurrent state's source cells and
the query temperature.

Each input is the builder's own object (:class:`graphcost.graph.llm_graph.GraphInput`):
its filler is chosen by its kind, and the cache it describes is the one the builder tied
it to, never looked up by the tensor's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from graphcost.errors import UnsupportedError
from graphcost.format import ggml_types as gt
from graphcost.format.model import ModelInfo
from graphcost.graph.build import BuiltGraph
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import GraphInput, InputKind
from graphcost.execute.kv_cells import CellState, hadamard


def attn_temp(positions: np.ndarray, scale: float, length: int,
              offset: float = 0.0) -> np.ndarray:
    """``inp_attn_scale`` per token (llm_graph_input_attn_temp::set_input,
    src/llama-graph.cpp): ``log(floor((pos + offset) / length) + 1) * scale + 1``, the
    division in float32 and the rest in double, as there (llama4 sets offset 1, the others
    0)."""
    if scale == 0.0 or length == 0:
        raise UnsupportedError("inp_attn_scale needs attention.temperature_scale and "
                               "attention.temperature_length (llama.cpp asserts both non-zero)")
    q = (positions.astype(np.float32) + np.float32(offset)) / np.float32(length)
    return (np.log(np.floor(q).astype(np.float64) + 1.0) * np.float64(np.float32(scale))
            + 1.0).astype(np.float32)


def pos_input(positions: np.ndarray, size: int) -> np.ndarray:
    """``inp_pos`` for text tokens (llm_graph_input_pos::set_input): the positions, or
    with 4 per token (n_pos_per_embd 4: MROPE/IMROPE) the tracks ``(p, p, p, 0)`` one
    after another."""
    if size == len(positions):
        return positions
    if size != 4 * len(positions):
        raise AssertionError(f"inp_pos has {size} values for {len(positions)} tokens")
    return np.concatenate([positions] * 3 + [np.zeros_like(positions)])


@dataclass(frozen=True)
class Ubatch:
    """One ubatch of sequence 0: token ids, their positions, the rows whose logits are
    kept, and per cache (by name) its cells and the cells this ubatch's tokens took."""

    model: ModelInfo
    tokens: np.ndarray
    positions: np.ndarray
    out_ids: np.ndarray
    cells: dict[str, CellState]
    slots: dict[str, np.ndarray]


def _flat(get: Callable[[GraphInput, Ubatch], np.ndarray]):
    def fill(gi: GraphInput, arr: np.ndarray, ub: Ubatch) -> None:
        arr.reshape(-1)[:] = get(gi, ub)
    return fill


def _v_idxs(gi: GraphInput, arr: np.ndarray, ub: Ubatch) -> None:
    cache = gi.attn.cache
    idx = ub.slots[cache.name]
    flat = arr.reshape(-1)
    if cache.v_trans:
        n_embd_v = gi.tensor.ne[0] // len(ub.tokens)      # n_embd_v_gqa_max
        j = np.arange(n_embd_v, dtype=np.int64)
        flat[:] = (j[None, :] * cache.size + idx[:, None]).reshape(-1)
    else:
        flat[:] = idx


def _kq_mask(gi: GraphInput, arr: np.ndarray, ub: Ubatch) -> None:
    ub.cells[gi.attn.cache.name].mask(gi.tensor.ne[0], ub.positions,
                                      out=arr[0, 0, :len(ub.tokens), :])


def _rot(gi: GraphInput, arr: np.ndarray, ub: Ubatch) -> None:
    arr[0, 0] = hadamard(gi.tensor.ne[0])


def _pos(arr: np.ndarray, ub: Ubatch) -> None:
    flat = arr.reshape(-1)
    flat[:] = pos_input(ub.positions, flat.size)


def _s_copy(gi: GraphInput, arr: np.ndarray, ub: Ubatch) -> None:
    # llama_memory_recurrent_context::s_copy: the cell each used cell's state comes from
    # (src0); one sequence in cell 0 reads cell 0
    flat = arr.reshape(-1)
    flat[:] = np.arange(flat.size, dtype=flat.dtype)


#: how each kind of graph input is filled; a kind without one is refused when the plan
#: is compiled (the encoders' inputs: the executor runs decoders)
FILLERS: dict[InputKind, Callable[[GraphInput, np.ndarray, Ubatch], None]] = {
    InputKind.TOKENS: _flat(lambda gi, ub: ub.tokens),
    InputKind.EMBD: lambda gi, arr, ub: None,          # the token path computes; left zero
    InputKind.POS: lambda gi, arr, ub: _pos(arr, ub),
    InputKind.OUT_IDS: _flat(lambda gi, ub: ub.out_ids),
    InputKind.K_IDXS: _flat(lambda gi, ub: ub.slots[gi.attn.cache.name]),
    InputKind.V_IDXS: _v_idxs,
    InputKind.KQ_MASK: _kq_mask,
    InputKind.K_ROT: _rot,
    InputKind.V_ROT: _rot,
    InputKind.S_COPY: _s_copy,
    # the hparams the spec's attn_temp_input gives the input (temp_scale, floor, offset)
    InputKind.ATTN_SCALE: _flat(lambda gi, ub: attn_temp(
        ub.positions, gi.tensor.params["temp_scale"], gi.tensor.params["temp_floor"],
        gi.tensor.params["temp_offset"])),
}

#: kinds whose filler reads the cells of the cache the builder tied the input to
_PER_CACHE = {InputKind.K_IDXS, InputKind.V_IDXS, InputKind.KQ_MASK, InputKind.K_ROT,
              InputKind.V_ROT}


def graph_inputs(bg: BuiltGraph) -> list[GraphInput]:
    """The graph's input leaves as the builder registered them, in leaf order; refuses
    (one line) an input that the builder did not register or that has no filler."""
    by_tensor = {id(gi.tensor): gi for gi in bg.inputs}
    out = []
    for leaf in bg.leafs:
        if leaf.role != "input":
            continue
        gi = by_tensor.get(id(leaf))
        if gi is not None and gi.kind == InputKind.NO_CACHE_MASK:
            raise UnsupportedError(f"{bg.model.header.path}: {bg.model.arch}'s attention "
                                   "without a KV cache (self_kq_mask: an encoder's "
                                   "non-causal attention, pooling) is not executed")
        if gi is None or gi.kind not in FILLERS or (gi.kind in _PER_CACHE and gi.attn is None):
            raise UnsupportedError(_no_filler(leaf))
        out.append(gi)
    return out


def _no_filler(leaf: Tensor) -> str:
    return (f"graph input {leaf.name!r} ({gt.type_name(leaf.type)} {list(leaf.ne)}) "
            "has no filler in the executor")


def place_ubatch(bg: BuiltGraph, cells: dict[str, CellState], tokens: np.ndarray,
                 positions: np.ndarray, out_ids: np.ndarray) -> Ubatch:
    """Find and take cells for the ubatch in each cache of the graph (``cells`` keeps them
    across steps, by cache name; made on first use) and check that the graph attends as
    many cells as they say (llama_kv_cache::get_n_kv)."""
    slots: dict[str, np.ndarray] = {}
    for c in bg.caches:
        cs = cells.get(c.name)
        if cs is None:
            n_swa = bg.model.n_swa if c.name == "swa" else 0
            cs = cells[c.name] = CellState(c.size, n_swa)
        idxs = cs.find_slot(len(tokens))
        cs.apply(idxs, positions)
        if cs.n_kv() != c.n_kv:
            raise AssertionError(f"cache {c.name}: cells give n_kv {cs.n_kv()}, "
                                 f"the graph {c.n_kv}")
        slots[c.name] = idxs
    return Ubatch(bg.model, tokens, positions, out_ids, cells, slots)


def fill_inputs(inputs: list[tuple[GraphInput, np.ndarray]], ub: Ubatch) -> None:
    """Write every input's array for the ubatch ``ub``."""
    for gi, arr in inputs:
        FILLERS[gi.kind](gi, arr, ub)


__all__ = ["FILLERS", "Ubatch", "attn_temp", "fill_inputs", "graph_inputs", "place_ubatch"]
