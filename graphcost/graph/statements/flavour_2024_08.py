"""Statements for the ``--llama-cpp 2024-08`` flavour: llama.cpp as of 6e02327e8 (2024-08-10),
the single-file era (``src/llama.cpp``: ``build_llama``, ``llm_build_inp_embd``,
``llm_build_kv``, ``llm_build_kv_store``, ``llm_build_kqv``, ``llm_build_ffn``).

What differs from today's graph: the KV cache is two 1-D tensors per layer written by
CPY into views (``k_cache_view-<il>``, ``v_cache_view-<il>``; V transposed without flash
attention), the mask is ``KQ_mask`` F32 [n_kv, PAD(T, 32)] (cast to F16 once for flash
attention), V stays 2-D, RoPE is applied to a reshape made inside the call, the FFN gate is
a separate SILU and MUL, and ``inp_out_ids`` is created inside the last layer.
"""
from __future__ import annotations

from graphcost.format import ggml_types as gt
from graphcost.graph.llm_graph import InputKind, KVCache
from graphcost.graph.spec_builder import SpecBuilder, statement
from graphcost.graph.statements.core import s_rope

#: GGML_KQ_MASK_PAD in August 2024 (ggml.h)
KQ_MASK_PAD = 32


@statement("embed_2024_08")
def embed(sb: SpecBuilder, a: dict) -> None:
    """llm_build_inp_embd: GET_ROWS named ``inp_embd``."""
    g, b = sb.g, sb.b
    tokens = g.cb(b.new_input(InputKind.TOKENS, gt.I32, [b.n_tokens]), "inp_tokens")
    sb.vars[a.get("out", "inpL")] = g.cb(g.get_rows(b.weight("token_embd.weight"), tokens), "inp_embd")


@statement("attention_inputs_2024_08")
def attention_inputs(sb: SpecBuilder, a: dict) -> None:
    """llama_kv_cache_init (1-D caches) and build_inp_KQ_mask."""
    g, b, m, run = sb.g, sb.b, sb.m, sb.b.run
    cache = b.make_cache("base", list(range(m.n_layer)), run.kv_size, run.n_kv, flat=True)
    sb.vars["kv_cache"] = cache
    mask = g.cb(b.new_input(InputKind.KQ_MASK, gt.F32,
                           [run.n_kv, gt.ggml_pad(b.n_tokens, KQ_MASK_PAD)]), "KQ_mask")
    sb.vars["KQ_mask"] = g.cast(mask, gt.F16) if run.flash_attn else mask


@statement("qkv_2024_08")
def qkv(sb: SpecBuilder, a: dict) -> None:
    """Q, K, V projections (2-D), each cb'ed, with optional biases."""
    g, x = sb.g, sb.var(a.get("x", "cur"))
    for short, name in (("attn_q", "Qcur"), ("attn_k", "Kcur"), ("attn_v", "Vcur")):
        t = sb.cb(sb.b.mm(sb.weight(short), x), name)
        bias = sb.weight(f"{short}.bias?")
        if bias is not None:
            t = sb.cb(g.add(t, bias), name)
        sb.vars[name] = t


@statement("rope_3d")
def rope_3d(sb: SpecBuilder, a: dict) -> None:
    """ggml_rope_ext(ggml_reshape_3d(x, head_dim, heads, T), ...): the reshape is made in the call."""
    m = sb.m
    x = sb.var(a["x"])
    heads = m.n_head[sb.il] if a.get("heads", "n_head") == "n_head" else m.n_head_kv[sb.il]
    x3 = sb.g.reshape(x, [m.head_dim_k, heads, x.ne[1]])
    sb.vars[a["x"]] = x3
    s_rope(sb, a)


@statement("attention_2024_08")
def attention(sb: SpecBuilder, a: dict) -> None:
    """llm_build_kv: expand q, k, v; llm_build_kv_store; llm_build_kqv; output projection."""
    g, m, run, il = sb.g, sb.m, sb.b.run, sb.il
    cache: KVCache = sb.var("kv_cache")
    q, k_cur, v_cur = sb.var("Qcur"), sb.var("Kcur"), sb.var("Vcur")
    for t in (q, k_cur, v_cur):
        g.expand(t)
    T = q.ne[2]
    kv_head = run.past  # first free cell of a fresh single-sequence context
    n_k, n_v = m.n_embd_k_gqa(il), m.n_embd_v_gqa(il)
    kl, vl = cache.k[il], cache.v[il]
    # llm_build_kv_store
    k_view = sb.cb(g.view(kl, [T * n_k], [], gt.row_size(kl.type, n_k) * kv_head), "k_cache_view")
    g.expand(g.cpy(k_cur, k_view))
    esize = gt.type_size(vl.type)
    if run.flash_attn:
        v_view = g.view(vl, [T * n_v], [], gt.row_size(vl.type, n_v) * kv_head)
    else:
        v_view = g.view(vl, [T, n_v], [cache.size * esize], kv_head * esize)
        v_cur = g.transpose(v_cur)
    sb.cb(v_view, "v_cache_view")
    g.expand(g.cpy(v_cur, v_view))
    # llm_build_kqv
    Dk, Dv, H, Hkv, n_kv = m.head_dim_k, m.head_dim_v, m.n_head[il], m.n_head_kv[il], cache.n_kv
    qp = sb.cb(g.permute(q, 0, 2, 1, 3), "q")
    k = sb.cb(g.view(kl, [Dk, n_kv, Hkv], [gt.row_size(kl.type, n_k), gt.row_size(kl.type, Dk)], 0), "k")
    scale = sb.expr(a.get("kq_scale", "1/sqrt(head_dim)"))
    mask = sb.var("KQ_mask")
    if run.flash_attn:
        v = sb.cb(g.view(vl, [Dv, n_kv, Hkv], [gt.row_size(vl.type, n_v), gt.row_size(vl.type, Dv)], 0), "v")
        cur = g.flash_attn_ext(qp, k, v, mask, scale, 0.0, 0.0)
        cur = g.reshape(cur, [Dv * H, T])
    else:
        kq = sb.cb(g.mul_mat(k, qp), "kq")
        kq = sb.cb(g.soft_max_ext(kq, mask, scale, 0.0), "kq_soft_max_ext")
        v = sb.cb(g.view(vl, [n_kv, Dv, Hkv], [esize * cache.size, esize * cache.size * Dv], 0), "v")
        kqv = sb.cb(g.mul_mat(v, kq), "kqv")
        merged = sb.cb(g.permute(kqv, 0, 2, 1, 3), "kqv_merged")
        cur = sb.cb(g.cont(merged, [Dv * H, T]), "kqv_merged_cont")
    g.expand(cur)
    cur = sb.b.mm(sb.weight(a.get("wo", "attn_output")), cur)
    wo_b = sb.weight(a.get("wo_bias", "attn_output.bias?"))
    if wo_b is not None:
        sb.cb(cur, "kqv_wo")
        cur = g.add(cur, wo_b)
    sb.vars[a.get("out", "cur")] = sb.cb(cur, a.get("cb"))


@statement("select_rows_2024_08")
def select_rows(sb: SpecBuilder, a: list) -> None:
    """Last layer: build ``inp_out_ids`` there and keep only the output rows."""
    if sb.il != sb.m.n_layer - 1:
        return
    g = sb.g
    ids = g.cb(sb.b.new_input(InputKind.OUT_IDS, gt.I32, [sb.b.n_outputs]), "inp_out_ids")
    for name in a:
        sb.vars[name] = g.get_rows(sb.var(name), ids)


@statement("ffn_2024_08")
def ffn(sb: SpecBuilder, a: dict) -> None:
    """llm_build_ffn, SILU, LLM_FFN_PAR: up, gate, silu, gate*up (ffn_gate_par), down."""
    g, x = sb.g, sb.var(a.get("x", "cur"))
    up = sb.cb(sb.b.mm(sb.weight("ffn_up"), x), "ffn_up")
    gate = sb.cb(sb.b.mm(sb.weight("ffn_gate"), x), "ffn_gate")
    act = sb.cb(g.unary("SILU", gate), "ffn_silu")
    cur = sb.cb(g.mul(act, up), "ffn_gate_par")
    cur = sb.b.mm(sb.weight("ffn_down"), cur)
    sb.vars[a.get("out", "cur")] = sb.cb(cur, a.get("cb"))
