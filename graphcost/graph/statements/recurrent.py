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

from graphcost.format import ggml_types as gt
from graphcost.format.hparam_expr import evaluate
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import InputKind
from graphcost.graph.llm_recurrent import N_RS_SEQ, build_rs, build_rs_inputs, make_state
from graphcost.graph.spec_builder import SpecBuilder, statement


@statement("hybrid_inputs")
def hybrid_inputs(sb: SpecBuilder, a: dict) -> None:
    """build_inp_mem_hybrid: ``rs_s_copy`` for the recurrent state, then the attention
    inputs of the KV cache that holds only the non-recurrent layers (llama_memory_hybrid's
    default filters ``!is_recr`` / ``is_recr``; ``attention_layers``, an expression over
    ``il n_ff n_head_kv``, narrows the attention filter: nemotron_h's ``n_ff == 0``). A
    hybrid model with a sliding window (build_inp_mem_hybrid_iswa) is not modelled."""
    b, m, run = sb.b, sb.m, sb.b.run
    keep = a.get("attention_layers")
    if m.n_swa > 0:
        raise UnsupportedError(f"{m.header.path}: {m.arch} with a sliding window "
                               "(llama_memory_hybrid_iswa) is not modelled yet")
    recr = [il for il in range(m.n_layer) if m.recurrent(il)]
    attn = [il for il in range(m.n_layer) if not m.recurrent(il)
            and (keep is None or evaluate(keep, {"il": il, "n_ff": m.n_ff[il],
                                                 "n_head_kv": m.n_head_kv[il]}, str(sb.spec.path)))]
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
    sb.run_branch(f"recurrent_layer: {taken}", a.get(taken))


def _chunk(g, bcx: Tensor, k: int, chunk: int) -> Tensor:
    """ggml_view_3d(bcx, chunk, ne1, ne2, nb1, nb2, k * chunk * element_size)."""
    return g.view(bcx, [chunk, bcx.ne[1], bcx.ne[2]], [bcx.nb[1], bcx.nb[2]],
                  k * chunk * gt.type_size(bcx.type))


@statement("shortconv")
def shortconv(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, out: cur}``: llama_model_lfm2's build_shortconv_block for the ubatch's
    n_seqs equal sequences (causal): in_proj -> B, C, x chunks; B*x transposed; the conv state
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
    n_seqs = b.run.n_seqs
    cur = sb.var(a.get("x", "cur"))
    n_seq_tokens = cur.ne[1] // n_seqs
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
    (src/models/mamba-base.cpp) for the ubatch's n_seqs sequences: ssm_in -> z, xBC, dt views; the conv
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
    n_seqs, K = b.run.n_seqs, 1  # K = n_rs_seq + 1 with n_rs_seq = 0
    d_xbc = d_inner + 2 * n_group * d_state
    f32 = gt.type_size(gt.F32)
    conv_states, ssm_states = st.r[il], st.s[il]
    cur = sb.var(a.get("x", "cur"))
    n_seq_tokens = cur.ne[1] // n_seqs

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


# ---- qwen3next (src/models/qwen3next.cpp, src/models/delta-net-base.cpp) ------------------

#: GGML_ROPE_TYPE_IMROPE (ggml/include/ggml.h): interleaved multi-section rope (qwen35)
ROPE_TYPE_IMROPE = 40


@statement("positions_multi")
def positions_multi(sb: SpecBuilder, a: dict) -> None:
    """``{out: inp_pos}``: build_inp_pos with hparams.n_pos_per_embd() = 4 (M-RoPE and
    IMRoPE take four position components per token): I32 [4 * n_tokens]."""
    sb.vars[a.get("out", "inp_pos")] = sb.g.cb(sb.b.new_input(InputKind.POS, gt.I32, [4 * sb.b.n_tokens]), "inp_pos")


def _rope_sections(sb: SpecBuilder) -> list[int]:
    """hparams.rope_sections (read and checked by :mod:`graphcost.format.model`), which
    this graph requires: ``<arch>.rope.dimension_sections`` must be in the file."""
    from gguf import Keys
    key = Keys.Rope.DIMENSION_SECTIONS.format(arch=sb.m.arch)
    if key not in sb.m.header.metadata:
        raise GraphcostError(f"{sb.m.header.path}: metadata key {key!r} is missing "
                             "(llama.cpp requires it)")
    return list(sb.m.rope_sections)


@statement("gated_attention")
def gated_attention(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, style: qwen3next|qwen35, out: cur}``: qwen3next's / qwen35's
    build_layer_attn. One Q projection of twice the head size (``build_qkv(..., reshape =
    false)``) holds the query and a gate per head; Q and K RMS-normed per head, roped;
    attention without its output projection (``attn_pregate``), times sigmoid(gate)
    (``gate_sigmoid``, ``attn_gated``), then ``attn_output``. qwen3next reshapes Q to 4-D
    and views query and gate (``Qcur_view``, ``gate``) and makes the gate contiguous after
    attention; qwen35 views them 3-D (``Qcur_reshaped``), makes the gate contiguous
    (``gate_reshaped``) before rope and uses IMRoPE (ggml_rope_multi with
    ``rope.dimension_sections``). kq_scale: attention.scale, else 1/sqrt(head_dim)."""
    from graphcost.graph.statements.dense import build_qkv_flat
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    style = a.get("style", "qwen3next")
    if style not in ("qwen3next", "qwen35"):
        raise GraphcostError(sb.where(f"gated_attention style {style!r}: qwen3next or qwen35"))
    if sb.inp_attn is None:
        raise GraphcostError(sb.where("gated_attention before hybrid_inputs"))
    hd, n_head, n_head_kv = m.head_dim_v, m.n_head[il], m.n_head_kv[il]
    if m.head_dim_k != hd:
        raise GraphcostError(f"{m.header.path}: key_length {m.head_dim_k} != value_length "
                             f"{hd} ({m.arch} asserts they are equal)")
    cur = sb.var(a.get("x", "cur"))
    T = cur.ne[1]
    f32 = gt.type_size(gt.F32)
    q_full, k, v = build_qkv_flat(sb, cur)
    sb.cb(q_full, "Qcur_full")
    sb.cb(k, "Kcur")
    sb.cb(v, "Vcur")
    if style == "qwen3next":
        q_full = g.reshape(q_full, [hd * 2, n_head, T, 1])
        nb = q_full.nb
        q = sb.cb(g.view(q_full, [hd, n_head, T, 1], [nb[1], nb[2], nb[3]], 0), "Qcur_view")
        gate = sb.cb(g.view(q_full, [hd, n_head, T, 1], [nb[1], nb[2], nb[3]], hd * f32), "gate")
        k = g.reshape(k, [hd, n_head_kv, T])
        v = g.reshape(v, [hd, n_head_kv, T])
        sb.vars.update(Qcur=q, Kcur=k, Vcur=v)
        sb.run([{"norm": {"x": "Qcur", "weight": "attn_q_norm", "cb": "Qcur_normed"}},
                {"norm": {"x": "Kcur", "weight": "attn_k_norm", "cb": "Kcur_normed"}},
                {"rope": {"x": "Qcur"}}, {"rope": {"x": "Kcur"}}])
    else:
        q = sb.cb(g.view(q_full, [hd, n_head, T], [f32 * hd * 2, f32 * hd * 2 * n_head], 0),
                  "Qcur_reshaped")
        sb.vars["Qcur"] = q
        sb.run([{"norm": {"x": "Qcur", "weight": "attn_q_norm", "cb": "Qcur_normed"}}])
        sb.vars["Kcur"] = g.reshape(k, [hd, n_head_kv, T])
        sb.run([{"norm": {"x": "Kcur", "weight": "attn_k_norm", "cb": "Kcur_normed"}}])
        gate = g.view(q_full, [hd, n_head, T], [f32 * hd * 2, f32 * hd * 2 * n_head], f32 * hd)
        gate = sb.cb(g.cont(gate, [hd * n_head, T]), "gate_reshaped")
        sb.vars["Vcur"] = g.reshape(v, [hd, n_head_kv, T])
        sections = _rope_sections(sb)
        for var in ("Qcur", "Kcur"):
            sb.vars[var] = g.rope(sb.var(var), sb.var("inp_pos"), None, n_dims=m.n_rot,
                                  sections=sections, mode=ROPE_TYPE_IMROPE,
                                  freq_base=m.rope_freq_base, freq_scale=m.rope_freq_scale,
                                  n_ctx_orig=m.n_ctx_orig_yarn or m.n_ctx_train,
                                  attn_factor=m.rope_attn_factor)
    sb.run([{"cb": {"Qcur": "Qcur", "Kcur": "Kcur", "Vcur": "Vcur"}}])
    kq_scale = m.attn_scale if m.attn_scale != 0.0 else 1.0 / (hd ** 0.5)
    cur = b.build_attn(sb.inp_attn, None, None, sb.var("Qcur"), sb.var("Kcur"), sb.var("Vcur"),
                       kq_scale, il, iswa=False)
    sb.cb(cur, "attn_pregate")
    if style == "qwen3next":
        gate = g.cont(gate, [hd * n_head, T])
    gate = sb.cb(g.unary("SIGMOID", gate), "gate_sigmoid")
    cur = sb.cb(g.mul(cur, gate), "attn_gated")
    sb.vars[a.get("out", "cur")] = sb.cb(b.mm(sb.weight("attn_output"), cur), "attn_output")


def _gdn_l2_norm(g, x: Tensor, eps: float) -> Tensor:
    """build_gdn_l2_norm (src/models/models.h): RMS norm with eps/n, times 1/sqrt(n)."""
    n = x.ne[0]
    return g.scale(g.rms_norm(x, eps / n), 1.0 / (n ** 0.5))


@statement("gated_delta_net")
def gated_delta_net(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, style: qwen3next|qwen35, out: cur}``: qwen3next's (qwen35's)
    build_layer_attn_linear for the ubatch's n_seqs sequences of T tokens each, with
    llama.cpp's fused GATED_DELTA_NET (cparams.fused_gdn_ar/ch are on): fused QKV and z
    projections (``attn_qkv``, ``attn_gate``), beta/alpha (``ssm_ba``) into sigmoid(beta) and
    softplus(alpha + dt_bias) * A, the conv state (build_conv_state: build_rs, CONCAT before
    the transposed QKV, last kernel-1 columns copied back), SSM_CONV + SILU, Q/K/V views,
    L2 norms of Q and K (REPEATed when there are fewer K heads than V heads), the delta
    state through build_rs, GATED_DELTA_NET, its new state copied back, the gated RMS norm
    with silu(z), ``ssm_out``. qwen35 projects beta (``ssm_beta``: ``beta``,
    ``beta_sigmoid``) and alpha (``ssm_alpha``: ``alpha``) separately and, the fused op
    broadcasting K heads over V heads, never REPEATs."""
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    style = a.get("style", "qwen3next")
    if style not in ("qwen3next", "qwen35"):
        raise GraphcostError(sb.where(f"gated_delta_net style {style!r}: qwen3next or qwen35"))
    inp = getattr(sb, "inp_rs", None)
    if inp is None:
        raise GraphcostError(sb.where("gated_delta_net before hybrid_inputs"))
    st = inp.state
    d_inner, head_k, nk, nv = m.ssm_d_inner, m.ssm_d_state, m.ssm_n_group, m.ssm_dt_rank
    if min(d_inner, head_k, nk, nv) <= 0 or d_inner % nv or nv % nk or d_inner // nv != head_k:
        raise GraphcostError(f"{m.header.path}: ssm sizes inner {d_inner}, state {head_k}, "
                             f"group_count {nk}, time_step_rank {nv} are not a gated delta "
                             f"net llama.cpp can build (d_inner = state * time_step_rank)")
    head_v = d_inner // nv
    n_seqs = b.run.n_seqs
    f32 = gt.type_size(gt.F32)
    cur = sb.var(a.get("x", "cur"))
    T = cur.ne[1] // n_seqs  # ubatch.n_seq_tokens
    wqkv = sb.weight("attn_qkv?")
    if wqkv is None:
        raise UnsupportedError(f"{m.header.path}: {m.arch} layer {il} without attn_qkv "
                               "(the legacy ssm_in projection) is not modelled yet")
    # build_qkvz (the fused path)
    qkv_mixed = b.mm(wqkv, cur)
    qkv_mixed = sb.cb(g.reshape(qkv_mixed, [qkv_mixed.ne[0], T, n_seqs]), "linear_attn_qkv_mixed")
    z = sb.cb(b.mm(sb.weight("attn_gate"), cur), "z")
    if style == "qwen3next":
        mixed_ba = sb.cb(b.mm(sb.weight("ssm_ba"), cur), "linear_attn_mixed_ba")
        ba = g.reshape(mixed_ba, [2 * nv // nk, nk, T, n_seqs])
        nb = ba.nb
        beta_v = sb.cb(g.view(ba, [nv // nk, nk, T, n_seqs], [nb[1], nb[2], nb[3]], 0), "b")
        alpha_v = sb.cb(g.view(ba, [nv // nk, nk, T, n_seqs], [nb[1], nb[2], nb[3]],
                               (nv // nk) * gt.type_size(ba.type)), "a")
        beta = g.unary("SIGMOID", g.cont(beta_v))
        alpha = g.cont(alpha_v, [nv, T, n_seqs])
    else:
        beta = b.mm(sb.weight("ssm_beta"), cur)
        beta = sb.cb(g.reshape(beta, [1, nv, T, n_seqs]), "beta")
        beta = sb.cb(g.unary("SIGMOID", beta), "beta_sigmoid")
        alpha = b.mm(sb.weight("ssm_alpha"), cur)
        alpha = sb.cb(g.reshape(alpha, [nv, T, n_seqs]), "alpha")
    alpha = g.add(alpha, sb.weight("ssm_dt.bias"))
    alpha = sb.cb(g.unary("SOFTPLUS", alpha), "a_softplus")
    gate = sb.cb(g.mul(alpha, b.weight(f"blk.{il}.ssm_a")), "gate")  # LLM_TENSOR_SSM_A_NOSCAN
    if style == "qwen3next":
        beta = g.reshape(beta, [1, nv, T, n_seqs])
    gate = g.reshape(gate, [1, nv, T, n_seqs])

    conv_states_all, ssm_states_all = st.r[il], st.s[il]
    kernel = sb.weight("ssm_conv1d")
    ks = kernel.ne[0]
    channels = d_inner + 2 * nk * head_k
    # build_conv_state (n_rs_seq = 0)
    conv_states = sb.cb(build_rs(b, inp, conv_states_all, m.n_embd_r(), n_seqs), "conv_states")
    conv_states = sb.cb(g.reshape(conv_states, [ks - 1, channels, n_seqs]), "conv_states_reshaped")
    qkv_t = sb.cb(g.transpose(qkv_mixed), "qkv_mixed_transposed")
    conv_input = sb.cb(g.concat(conv_states, qkv_t, 0), "conv_input")
    row_count = (ks - 1) * channels
    row_size = gt.row_size(conv_states_all.type, row_count)
    s_idx = conv_input.ne[0] - conv_states.ne[0]
    last = sb.cb(g.view(conv_input, [ks - 1, channels, n_seqs], [conv_input.nb[1], conv_input.nb[2]],
                        gt.row_size(conv_input.type, s_idx)), "conv_state_last")
    upd = sb.cb(g.view(conv_states_all, [row_count, n_seqs], [conv_states_all.nb[1]],
                       (0 * st.size + st.head) * row_size), "conv_state_update")
    g.expand(g.cpy(last, upd))

    state = build_rs(b, inp, ssm_states_all, m.n_embd_s(), n_seqs)
    state = sb.cb(g.reshape(state, [head_v, head_v, nv, n_seqs]), "state_predelta")
    conv_out = sb.cb(g.ssm_conv(conv_input, kernel), "conv_output_raw")
    conv_out = sb.cb(g.unary("SILU", conv_out), "conv_output_silu")
    qkv_dim = head_k * nk * 2 + head_v * nv
    nb1 = gt.row_size(conv_out.type, qkv_dim)
    rs = gt.row_size
    q = sb.cb(g.view(conv_out, [head_k, nk, T, n_seqs], [rs(conv_out.type, head_k), nb1, nb1 * T], 0),
              "q_conv")
    k = sb.cb(g.view(conv_out, [head_k, nk, T, n_seqs], [rs(conv_out.type, head_k), nb1, nb1 * T],
                     head_k * nk * f32), "k_conv")
    v = sb.cb(g.view(conv_out, [head_v, nv, T, n_seqs], [rs(conv_out.type, head_v), nb1, nb1 * T],
                     rs(conv_out.type, 2 * head_k * nk)), "v_conv")
    q = _gdn_l2_norm(g, q, m.rms_eps)
    k = _gdn_l2_norm(g, k, m.rms_eps)
    if nk != nv and style == "qwen3next":  # qwen35: only without the fused GDN
        rf = nv // nk
        q = g.reshape(q, [head_k, 1, nk, T * n_seqs])
        k = g.reshape(k, [head_k, 1, nk, T * n_seqs])
        q = g.repeat_4d(q, [head_k, rf, nk, T * n_seqs])
        k = g.repeat_4d(k, [head_k, rf, nk, T * n_seqs])
        q = g.reshape(q, [head_k, nk * rf, T, n_seqs])
        k = g.reshape(k, [head_k, nk * rf, T, n_seqs])
    sb.cb(q, "q_conv_predelta")
    sb.cb(k, "k_conv_predelta")
    sb.cb(v, "v_conv_predelta")

    # build_recurrent_attn -> build_delta_net_fused (K = 1)
    S_v, H_v = v.ne[0], v.ne[1]
    res = g.gated_delta_net(q, k, v, gate, beta, state, 1)
    output = sb.cb(g.view(res, [S_v, H_v, T, n_seqs],
                          [rs(res.type, S_v), rs(res.type, S_v * H_v), rs(res.type, S_v * H_v * T)], 0),
                   "attn_output")
    new_state = sb.cb(g.view(res, [S_v, S_v, H_v, n_seqs],
                             [rs(res.type, S_v), rs(res.type, S_v * S_v), rs(res.type, S_v * S_v * H_v)],
                             rs(res.type, S_v * H_v * T * n_seqs)), "new_state")
    n_embd_s = m.n_embd_s()
    g.expand(g.cpy(new_state, g.view(ssm_states_all, [n_embd_s, n_seqs], [ssm_states_all.nb[1]],
                                     st.head * n_embd_s * gt.type_size(ssm_states_all.type))))
    z_2d = g.reshape(z, [head_v, nv, T, n_seqs])
    # build_norm_gated: rms_norm(output) * w * silu(z)
    normed = b.build_norm(output, sb.weight("ssm_norm"), None, il, "rms")
    out = g.mul(normed, g.unary("SILU", z_2d))
    out = sb.cb(g.reshape(out, [head_v * nv, T, n_seqs]), "final_output")
    cur = sb.cb(b.mm(sb.weight("ssm_out"), out), "linear_attn_out")
    sb.vars[a.get("out", "cur")] = g.reshape(cur, [m.n_embd, T * n_seqs])


@statement("shared_expert")
def shared_expert(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, moe: moe_out, gated: 1, out: cur}``: a shared expert beside the routed
    experts: build_ffn(SILU, PAR) over ``ffn_{up,gate,down}_shexp`` (named like a dense
    FFN: ffn_up, ffn_gate, ffn_swiglu), cb ``ffn_shexp``; with ``gated`` (qwen3next) the
    gate ``ffn_gate_inp_shexp`` [n_embd] -> sigmoid (``shared_expert_gate``,
    ``shared_expert_gate_sigmoid``) and ``ffn_shexp_gated``; added to the experts' output
    (``ffn_out``). granitehybrid's is ungated (``gated: 0``)."""
    b, g, il = sb.b, sb.g, sb.il
    cur = sb.var(a.get("x", "cur"))
    up = b.proj(il, "ffn_up_shexp", cur, "ffn_up")
    gate = b.proj(il, "ffn_gate_shexp", cur, "ffn_gate")
    t = g.cb(g.glu_split("SWIGLU", gate, up), "ffn_swiglu", il)
    shexp = sb.cb(b.mm(sb.weight("ffn_down_shexp"), t), "ffn_shexp")
    if sb.expr(a.get("gated", 1)):
        sgate = sb.cb(b.mm(sb.weight("ffn_gate_inp_shexp"), cur), "shared_expert_gate")
        sgate = sb.cb(g.unary("SIGMOID", sgate), "shared_expert_gate_sigmoid")
        shexp = sb.cb(g.mul(shexp, sgate), "ffn_shexp_gated")
    sb.vars[a.get("out", "cur")] = sb.cb(g.add(sb.var(a["moe"]), shexp), "ffn_out")


@statement("unsupported")
def unsupported(sb: SpecBuilder, a: Any) -> None:
    """``unsupported: "what"``: refuse the model in one line (a branch llama.cpp builds
    that graphcost does not model, e.g. nemotron_h's MoE FFN layers)."""
    where = f" layer {sb.il}" if sb.il is not None else ""
    raise UnsupportedError(f"{sb.m.header.path}: {sb.m.arch}{where} with {a} is not modelled yet")
