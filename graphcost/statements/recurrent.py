"""Statements for hybrid families (recurrent layers beside attention layers): lfm2.

* ``hybrid_inputs``   -- ``build_inp_mem_hybrid`` (src/llama-graph.cpp): the recurrent
  state of the recurrent layers and its ``rs_s_copy`` input, then the KV cache of the
  attention layers with its index, mask and rotation inputs (llama_memory_hybrid);
* ``recurrent_layer`` -- C++ ``if (hparams.is_recr(il))``: ``then`` on recurrent layers,
  ``else`` on attention layers;
* ``shortconv``       -- LFM2's ``build_shortconv_block`` (src/models/lfm2.cpp).

Creation and expand order are llama.cpp's, because they decide auto-names and node order.
"""
from __future__ import annotations

from typing import Any

from .. import ggml_types as gt
from ..errors import GraphcostError, UnsupportedError
from ..ggml_graph import Tensor
from ..llm_recurrent import N_RS_SEQ, build_rs, build_rs_inputs, make_state
from ..spec_builder import SpecBuilder, statement
from .dense import _branch


@statement("hybrid_inputs")
def hybrid_inputs(sb: SpecBuilder, a: dict) -> None:
    """build_inp_mem_hybrid: ``rs_s_copy`` for the recurrent state, then the attention
    inputs of the KV cache that holds only the non-recurrent layers (llama_memory_hybrid's
    default filters ``!is_recr`` / ``is_recr``). A hybrid model with a sliding window
    (build_inp_mem_hybrid_iswa) is not modelled."""
    b, m, run = sb.b, sb.m, sb.b.run
    if m.n_swa > 0:
        raise UnsupportedError(f"{m.header.path}: {m.arch} with a sliding window "
                               "(llama_memory_hybrid_iswa) is not modelled yet")
    recr = [il for il in range(m.n_layer) if m.recurrent(il)]
    attn = [il for il in range(m.n_layer) if not m.recurrent(il)]
    sb.inp_rs = build_rs_inputs(b, make_state(b, recr))
    cache = b.make_cache("base", attn, run.kv_size, run.n_kv)
    sb.inp_attn = b.build_attn_inputs(cache)
    b.build_rot_inputs(sb.inp_attn)


@statement("recurrent_layer")
def recurrent_layer(sb: SpecBuilder, a: dict) -> None:
    """``{then: [...], else: [...]}``: ``then`` when hparams.is_recr(il)."""
    if sb.il is None:
        raise GraphcostError(sb.where("recurrent_layer outside a layer"))
    taken = "then" if sb.m.recurrent(sb.il) else "else"
    sb.run(_branch(sb, f"recurrent_layer: {taken}", a.get(taken)))


def _chunk(g, bcx: Tensor, k: int, chunk: int) -> Tensor:
    """ggml_view_3d(bcx, chunk, ne1, ne2, nb1, nb2, k * chunk * element_size)."""
    return g.view(bcx, [chunk, bcx.ne[1], bcx.ne[2]], [bcx.nb[1], bcx.nb[2]],
                  k * chunk * gt.type_size(bcx.type))


@statement("shortconv")
def shortconv(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, out: cur}``: llama_model_lfm2's build_shortconv_block for one sequence
    (n_seqs = 1, causal): in_proj -> B, C, x chunks; B*x transposed; the conv state
    gathered by build_rs, prepended (CONCAT); the last d_conv columns copied back into
    the state (one slot: n_rs_seq = 0); SSM_CONV with the kernel; C * conv; out_proj."""
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    inp = getattr(sb, "inp_rs", None)
    if inp is None:
        raise GraphcostError(sb.where("shortconv before hybrid_inputs"))
    st = inp.state
    if m.shortconv_l_cache <= 1:
        raise GraphcostError(f"{m.header.path}: {m.arch}.shortconv.l_cache is "
                             f"{m.shortconv_l_cache}; llama.cpp needs it > 1")
    d_conv = m.shortconv_l_cache - 1
    n_seqs = 1
    cur = sb.var(a.get("x", "cur"))
    n_seq_tokens = cur.ne[1]
    cur = g.reshape(cur, [cur.ne[0], n_seq_tokens, n_seqs])
    bcx = sb.cb(b.mm(sb.weight("shortconv.in_proj"), cur), "model.layers.{}.conv.in_proj")
    if bcx.ne[0] % 3:
        raise GraphcostError(f"{m.header.path}: blk.{il}.shortconv.in_proj has "
                             f"{bcx.ne[0]} rows, not 3 chunks")
    chunk = bcx.ne[0] // 3
    bb, c, x = (_chunk(g, bcx, k, chunk) for k in range(3))
    bx = g.transpose(g.mul(bb, x))
    conv_state = st.r[il]
    conv_rs = build_rs(b, inp, conv_state, m.n_embd_r(), n_seqs)
    conv = g.reshape(conv_rs, [d_conv, m.n_embd, n_seqs])
    bx = g.concat(conv, bx, 0)
    # write conv states: slot 0 = the final state (K = 1: n_rs_seq = 0)
    n_written = min(n_seq_tokens, 1 + N_RS_SEQ if N_RS_SEQ > 0 else 1)
    row_size = gt.row_size(conv_state.type, d_conv * m.n_embd)
    for slot in range(n_written):
        snap = g.view(bx, [d_conv, bx.ne[1], bx.ne[2]], [bx.nb[1], bx.nb[2]],
                      (bx.ne[0] - d_conv - slot) * gt.type_size(bx.type))
        dst = g.view(conv_state, [d_conv * m.n_embd, n_seqs], [conv_state.nb[1]],
                     (slot * st.size + st.head) * row_size)
        g.expand(g.cpy(snap, dst))
    conv_out = sb.cb(g.ssm_conv(bx, sb.weight("shortconv.conv")), "model.layers.{}.conv.conv")
    y = g.mul(c, conv_out)
    y = sb.cb(b.mm(sb.weight("shortconv.out_proj"), y), "model.layers.{}.conv.out_proj")
    y = g.reshape(y, [y.ne[0], n_seq_tokens * n_seqs])
    sb.vars[a.get("out", "cur")] = y


__all__: list[Any] = []
