"""Recurrent state (``src/llama-memory-recurrent.cpp``) and the llama-graph helpers that
read it (``build_rs_inp_impl``, ``build_rs`` in ``src/llama-graph.cpp``), on top of
:class:`graphcost.graph.llm_graph.LlmGraph`.

A recurrent layer keeps, per cell, a rolling state ``r`` (LFM2's and Mamba's conv state:
``n_embd_r`` floats) and a state ``s`` (Mamba's SSM state: ``n_embd_s`` floats), both F32
(llama_model::create_memory passes GGML_TYPE_F32). The cache has
``rs_size = max(1, n_seq_max)`` cells; with ``n_rs_seq`` rollback snapshots it has
``rs_size * (1 + n_rs_seq)`` rows: one cell per sequence (``-np``), and graphcost models
no rollback (``n_rs_seq = 0``, the context default), so one row per cell: the state does
not grow with the context.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from graphcost.format import ggml_types as gt
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import InputKind

#: llama_context_default_params().n_rs_seq: no rollback snapshots
N_RS_SEQ = 0


@dataclass
class RecurrentState:
    """One ``llama_memory_recurrent``: per recurrent layer ``cache_r_l<il>`` [n_embd_r,
    rows] and ``cache_s_l<il>`` [n_embd_s, rows], F32, and the cell range this ubatch uses
    (``llama_memory_recurrent_context``: ``head``, ``n_rs`` cells, ``rs_z`` the cell to
    zero or -1)."""

    size: int  # cells (rs_size)
    layers: tuple[int, ...]
    r: dict[int, Tensor]
    s: dict[int, Tensor]
    head: int
    n_rs: int
    rs_z: int

    @property
    def r_bytes(self) -> int:
        """llama_memory_recurrent::size_r_bytes: ggml_nbytes of every r tensor."""
        return sum(t.nbytes for t in self.r.values())

    @property
    def s_bytes(self) -> int:
        return sum(t.nbytes for t in self.s.values())


@dataclass
class RsInputs:
    """llm_graph_input_rs: ``rs_s_copy`` I32 [n_rs] and its two views."""

    state: RecurrentState
    s_copy: Tensor
    s_copy_main: Tensor
    s_copy_extra: Tensor


def make_state(b, layers: list[int]) -> RecurrentState:
    """llama_memory_recurrent constructor (filtered to ``layers``) plus the context of this
    ubatch: full (sched_reserve's init_full) -> head 0, all cells, rs_z 0 (the reserve
    ubatch has one sequence per cell); otherwise one sequence in cell 0, which find_slot zeroes (rs_z 0) only while nothing was decoded
    into it yet (``past == 0``), else rs_z -1."""
    m, g, run = b.model, b.g, b.run
    size = max(1, run.n_seq_max)  # llama_model::create_memory: rs_size
    rows = size * (1 + N_RS_SEQ)
    r, s = {}, {}
    for il in layers:
        r[il] = g.new_tensor(gt.F32, [m.n_embd_r(), rows], name=f"cache_r_l{il}", role="kv")
        s[il] = g.new_tensor(gt.F32, [m.n_embd_s(), rows], name=f"cache_s_l{il}", role="kv")
        r[il].layer = s[il].layer = il
    full = run.settings.memory_full
    rs_z = 0 if full or run.past == 0 else -1
    st = RecurrentState(size, tuple(layers), r, s, head=0, n_rs=size if full else 1, rs_z=rs_z)
    b.states.append(st)
    return st


def build_rs_inputs(b, st: RecurrentState) -> RsInputs:
    """build_rs_inp_impl: ``rs_s_copy`` [n_rs], views ``s_copy_main`` [n_seqs] and
    ``s_copy_extra`` [n_rs - n_seqs] (n_seqs: ubatch.n_seqs)."""
    g = b.g
    n_seqs = b.run.n_seqs
    s_copy = b.new_input(InputKind.S_COPY, gt.I32, [st.n_rs], name="rs_s_copy")
    main = g.view(s_copy, [n_seqs], (), 0)
    extra = g.view(s_copy, [st.n_rs - n_seqs], (), n_seqs * s_copy.nb[0])
    return RsInputs(st, s_copy, main, extra)


def build_rs(b, inp: RsInputs, s: Tensor, state_size: int, n_seqs: int,
             get_rows: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
    """llm_graph_context::build_rs: zero cell ``rs_z`` in place (a zero-sized view when
    rs_z < 0), gather the ubatch's states with ``get_rows(states, s_copy_main)``
    (default ggml_get_rows; Mamba passes its SSM_SCAN), and copy the states of the other
    used cells into place; returns what ``get_rows`` returned."""
    g, st = b.g, inp.state
    states = g.reshape(s, [state_size, s.ne[1]])
    z = st.rs_z
    zero = g.view(states, [state_size * (z >= 0)], (), z * states.nb[1] * (z >= 0))
    g.expand(g.scale_inplace(zero, 0.0))
    out = (get_rows or g.get_rows)(states, inp.s_copy_main)
    g.expand(out)
    extra = g.get_rows(states, inp.s_copy_extra)
    dst = g.view(s, [state_size, st.n_rs - n_seqs], [s.nb[1]], (st.head + n_seqs) * s.nb[1])
    g.expand(g.cpy(extra, dst))
    return out
