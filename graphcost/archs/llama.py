"""``llama`` (Llama 1-3, Mistral, GQA): mirrors ``src/models/llama.cpp`` (``graph<false>``)."""
from __future__ import annotations

from ..errors import UnsupportedError
from ..llm_graph import LlmGraph

ROPE_MODE = 0  # LLAMA_ROPE_TYPE_NORM (llama_model_rope_type)


def build(b: LlmGraph) -> None:
    g, m = b.g, b.model
    if m.tensor("blk.0.ffn_gate_inp.weight") is not None:
        raise UnsupportedError(f"{m.header.path}: llama with mixture-of-experts layers "
                               "(Mixtral style) is not modelled yet")
    if m.head_dim_k != m.head_dim_v or m.n_rot != m.head_dim_k:
        raise UnsupportedError(f"{m.header.path}: llama needs key_length == value_length == "
                               f"rope.dimension_count (got {m.head_dim_k}, {m.head_dim_v}, {m.n_rot})")
    inpL = b.build_inp_embd(b.weight("token_embd.weight"))
    inp_pos = b.build_inp_pos()
    cache = b.make_cache("base", list(range(m.n_layer)), b.run.kv_size, b.run.n_kv)
    inp_attn = b.build_attn_inputs(cache)
    b.build_rot_inputs(inp_attn)
    kq_scale = m.attn_scale if m.attn_scale != 0.0 else b.kq_scale_default()
    out_ids = b.build_inp_out_ids()
    rope_factors = b.weight("rope_freqs.weight", required=False)

    for il in range(m.n_layer):
        g.layer = il
        inpSA = inpL
        g.block = "attention"
        cur = b.build_norm(inpL, b.lw(il, "attn_norm.weight"), None, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = b.build_qkv(il, cur)
        q = b.rope(q, inp_pos, rope_factors, il, ROPE_MODE, m.rope_freq_base, m.rope_freq_scale)
        k = b.rope(k, inp_pos, rope_factors, il, ROPE_MODE, m.rope_freq_base, m.rope_freq_scale)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        cur = b.build_attn(inp_attn, b.lw(il, "attn_output.weight"),
                           b.lw(il, "attn_output.bias", required=False), q, k, v, kq_scale, il,
                           iswa=False)
        g.cb(cur, "attn_out", il)
        g.block = "other"
        cur, inpSA = b.select_rows(il, cur, inpSA, out_ids=out_ids)
        ffn_inp = g.cb(g.add(cur, inpSA), "ffn_inp", il)
        g.block = "ffn"
        cur = b.build_norm(ffn_inp, b.lw(il, "ffn_norm.weight"), None, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.cb(b.build_ffn_par(il, cur, "silu"), "ffn_out", il)
        g.block = "other"
        cur = g.cb(g.add(cur, ffn_inp), "ffn_out", il)
        inpL = g.cb(cur, "l_out", il)

    g.layer = None
    g.block = "other"
    cur = b.build_norm(inpL, b.weight("output_norm.weight"), None, -1)
    g.cb(cur, "result_norm")
    out = b.weight("output.weight", required=False) or b.weight("token_embd.weight")
    cur = g.cb(b.mm(out, cur), "result_output")
    g.expand(cur)
