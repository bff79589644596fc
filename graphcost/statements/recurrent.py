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


@statement("mamba2")
def mamba2(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, out: cur}``: llm_build_mamba_base::build_mamba2_layer
    (src/models/mamba-base.cpp) for one sequence: ssm_in -> z, xBC, dt views; the conv
    state gathered by build_rs and CONCATed before xBC^T, its last d_conv - 1 columns
    copied back (one slot); SSM_CONV + conv bias + SILU; x, B, C views; dt + bias;
    SSM_SCAN over the SSM state gathered by build_rs (get_ssm_rows), the new state copied
    back; y + x*D (``mamba2_y_add_d``), SwiGLU with z, grouped RMS norm (``ssm_norm``),
    ssm_out (``mamba_out``)."""
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    inp = getattr(sb, "inp_rs", None)
    if inp is None:
        raise GraphcostError(sb.where("mamba2 before hybrid_inputs"))
    st = inp.state
    d_conv, d_inner, d_state = m.ssm_d_conv, m.ssm_d_inner, m.ssm_d_state
    n_head, n_group = m.ssm_dt_rank, m.ssm_n_group
    if min(d_conv, d_inner, d_state, n_head, n_group) <= 0 or d_inner % n_head or d_inner % n_group \
            or n_head % n_group:
        raise GraphcostError(f"{m.header.path}: ssm sizes d_conv {d_conv}, d_inner {d_inner}, "
                             f"d_state {d_state}, time_step_rank {n_head}, group_count "
                             f"{n_group} are not a Mamba-2 layer llama.cpp can build")
    head_dim = d_inner // n_head
    n_seqs, K = 1, 1  # one sequence; K = n_rs_seq + 1 with n_rs_seq = 0
    d_xbc = d_inner + 2 * n_group * d_state
    f32 = gt.type_size(gt.F32)
    conv_states, ssm_states = st.r[il], st.s[il]
    cur = sb.var(a.get("x", "cur"))
    n_seq_tokens = cur.ne[1]

    conv = build_rs(b, inp, conv_states, m.n_embd_r(), n_seqs)
    conv = g.reshape(conv, [d_conv - 1, d_xbc, n_seqs])
    zxbcdt = b.mm(sb.weight("ssm_in"), cur)
    zxbcdt = g.reshape(zxbcdt, [zxbcdt.ne[0], n_seq_tokens, n_seqs])
    nb = zxbcdt.nb
    z = g.view(zxbcdt, [head_dim, n_head, n_seq_tokens, n_seqs], [head_dim * nb[0], nb[1], nb[2]], 0)
    xbc = g.view(zxbcdt, [d_xbc, n_seq_tokens, n_seqs], [nb[1], nb[2]], d_inner * f32)
    dt = g.view(zxbcdt, [n_head, n_seq_tokens, n_seqs], [nb[1], nb[2]], (2 * d_inner + 2 * n_group * d_state) * f32)

    conv_x = g.concat(conv, g.transpose(xbc), 0)
    row_count = (d_conv - 1) * d_xbc
    row_size = gt.row_size(conv_states.type, row_count)
    for slot in range(min(n_seq_tokens, K)):
        last = g.view(conv_x, [d_conv - 1, d_xbc, n_seqs], [conv_x.nb[1], conv_x.nb[2]],
                      (n_seq_tokens - slot) * conv_x.nb[0])
        dst = g.view(conv_states, [row_count, n_seqs], [conv_states.nb[1]],
                     (slot * st.size + st.head) * row_size)
        g.expand(g.cpy(last, dst))
    xbc = g.ssm_conv(conv_x, sb.weight("ssm_conv1d"))
    xbc = g.add(xbc, sb.weight("ssm_conv1d.bias"))
    xbc = g.unary("SILU", xbc)

    nb = xbc.nb
    x = g.view(xbc, [head_dim, n_head, n_seq_tokens, n_seqs], [head_dim * nb[0], nb[1], nb[2]], 0)
    B = g.view(xbc, [d_state, n_group, n_seq_tokens, n_seqs], [d_state * nb[0], nb[1], nb[2]], d_inner * f32)
    C = g.view(xbc, [d_state, n_group, n_seq_tokens, n_seqs], [d_state * nb[0], nb[1], nb[2]],
               (d_inner + n_group * d_state) * f32)
    dt = g.add(g.cont(dt), sb.weight("ssm_dt.bias"))
    A = b.weight(f"blk.{il}.ssm_a")  # no ".weight" suffix (llama-arch.cpp LLM_TENSOR_SSM_A)
    D = b.weight(f"blk.{il}.ssm_d")

    def get_ssm_rows(states: Tensor, ids: Tensor) -> Tensor:
        ssm = g.reshape(states, [d_state, head_dim, n_head, ssm_states.ne[1]])
        return g.ssm_scan(ssm, x, dt, A, B, C, ids, K)

    y_ssm = build_rs(b, inp, ssm_states, m.n_embd_s(), n_seqs, get_rows=get_ssm_rows)
    Dn = d_state * d_inner
    n_written = min(n_seq_tokens, K)
    y_row = gt.row_size(y_ssm.type, Dn)
    s_row = gt.row_size(ssm_states.type, Dn)
    state_offset = x.n_elements * f32
    g.expand(g.cpy(g.view(y_ssm, [Dn, n_seqs, n_written], [y_row, y_row * n_seqs], state_offset),
                   g.view(ssm_states, [Dn, n_seqs, n_written], [ssm_states.nb[1], st.size * s_row],
                          st.head * s_row)))
    y = g.view(y_ssm, [head_dim, n_head, n_seq_tokens, n_seqs],
               [x.nb[1], n_head * x.nb[1], n_seq_tokens * n_head * x.nb[1]], 0)
    y = sb.cb(g.add(y, g.mul(x, D)), "mamba2_y_add_d")
    y = g.glu_split("SWIGLU", g.cont(z), y)
    norm = sb.weight("ssm_norm?")
    if norm is not None:
        y = g.reshape(y, [d_inner // n_group, n_group, n_seq_tokens, n_seqs])
        y = b.build_norm(y, norm, None, il, "rms")
    y = g.reshape(y, [d_inner, n_seq_tokens * n_seqs])
    cur = sb.cb(b.mm(sb.weight("ssm_out"), y), "mamba_out")
    sb.vars[a.get("out", "cur")] = cur
