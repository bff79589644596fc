"""``gemma3``: mirrors ``src/models/gemma3.cpp`` (``graph<iswa>``; iswa when the GGUF has a
sliding window, which every released Gemma 3 has)."""
from __future__ import annotations

import math

from ..llm_graph import LlmGraph

ROPE_MODE = 2  # LLAMA_ROPE_TYPE_NEOX (llama_model_rope_type)

#: layer count -> LLM_TYPE; the 27B scales queries by 1/sqrt(n_embd/n_head) (gemma3.cpp)
_TYPE_27B_LAYERS = 62


def build(b: LlmGraph) -> None:
    g, m, run = b.g, b.model, b.run
    iswa = m.n_swa > 0
    inpL = b.build_inp_embd(b.weight("token_embd.weight"))
    inpL = g.cb(g.scale(inpL, math.sqrt(m.n_embd)), "inp_scaled")
    inp_pos = b.build_inp_pos()
    if iswa:
        base_layers = [il for il in range(m.n_layer) if not m.is_swa[il]]
        swa_layers = [il for il in range(m.n_layer) if m.is_swa[il]]
        base = b.make_cache("base", base_layers, run.kv_size, run.n_kv)
        swa = b.make_cache("swa", swa_layers, run.kv_size_swa, run.n_kv_swa)
        inp_base = b.build_attn_inputs(base)
        inp_swa = b.build_attn_inputs(swa)
        b.build_rot_inputs(inp_base)
        b.build_rot_inputs(inp_swa)
    else:
        base = b.make_cache("base", list(range(m.n_layer)), run.kv_size, run.n_kv)
        inp_base = b.build_attn_inputs(base)
        b.build_rot_inputs(inp_base)
        inp_swa = None
    out_ids = b.build_inp_out_ids()
    if m.n_layer == _TYPE_27B_LAYERS:
        q_scale = 1.0 / math.sqrt(m.n_embd / m.n_head[0])
    else:
        q_scale = 1.0 / math.sqrt(m.head_dim_k)

    for il in range(m.n_layer):
        g.layer = il
        swa_layer = iswa and m.is_swa[il]
        if swa_layer:
            fb, fs = m.rope_freq_base_swa, 1.0
        else:
            fb, fs = m.rope_freq_base, m.rope_freq_scale
        g.block = "attention"
        cur = b.build_norm(inpL, b.lw(il, "attn_norm.weight"), None, il)
        g.cb(cur, "attn_norm", il)
        q, k, v = b.build_qkv(il, cur)
        q = g.cb(b.build_norm(q, b.lw(il, "attn_q_norm.weight"), None, il), "Qcur_normed", il)
        q = b.rope(q, inp_pos, None, il, ROPE_MODE, fb, fs)
        k = g.cb(b.build_norm(k, b.lw(il, "attn_k_norm.weight"), None, il), "Kcur_normed", il)
        k = b.rope(k, inp_pos, None, il, ROPE_MODE, fb, fs)
        g.cb(q, "Qcur", il)
        g.cb(k, "Kcur", il)
        g.cb(v, "Vcur", il)
        q = g.scale(q, q_scale)
        inp = inp_swa if swa_layer else inp_base
        cur = b.build_attn(inp, b.lw(il, "attn_output.weight"), None, q, k, v, 1.0, il, iswa=iswa)
        g.block = "other"
        cur, inpL = b.select_rows(il, cur, inpL, out_ids=out_ids)
        g.block = "attention"
        cur = b.build_norm(cur, b.lw(il, "post_attention_norm.weight"), None, il)
        g.cb(cur, "attn_post_norm", il)
        g.block = "other"
        sa_out = g.cb(g.add(cur, inpL), "sa_out", il)
        g.block = "ffn"
        cur = b.build_norm(sa_out, b.lw(il, "ffn_norm.weight"), None, il)
        g.cb(cur, "ffn_norm", il)
        cur = g.cb(b.build_ffn_par(il, cur, "gelu"), "ffn_out", il)
        cur = b.build_norm(cur, b.lw(il, "post_ffw_norm.weight"), None, -1)
        g.cb(cur, "ffn_post_norm", il)
        g.block = "other"
        cur = g.add(cur, sa_out)
        inpL = g.cb(cur, "l_out", il)

    g.layer = None
    g.block = "other"
    cur = b.build_norm(inpL, b.weight("output_norm.weight"), None, -1)
    g.cb(cur, "result_norm")
    out = b.weight("output.weight", required=False) or b.weight("token_embd.weight")
    cur = b.mm(out, cur)
    if m.final_logit_softcap:
        cur = g.scale(cur, 1.0 / m.final_logit_softcap)
        cur = g.unary("TANH", cur)
        cur = g.scale(cur, m.final_logit_softcap)
    g.cb(cur, "result_output")
    g.expand(cur)
