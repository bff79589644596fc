"""Statements for ``gemma4`` (src/models/gemma4.cpp in the llama.cpp vendored by
llama-cpp-python 0.3.36) beyond the core and :mod:`graphcost.graph.statements.gemma3n`
(``q_only``, ``kv_layer``, ``attention_shared``, ``build_per_layer_inputs``) and
:mod:`graphcost.graph.statements.gptoss` (``get_rows_out``):

* ``per_layer_inputs_key`` -- per-layer inputs as gemma3n's, their width read from the
  GGUF (``embedding_length_per_layer_input``);
* ``rope_factors_global``  -- ``rope_freqs`` on full-attention layers, none on sliding ones;
* ``kv_only``              -- K and V of a layer with KV: from the fused projection
  (CONTs of row views) or ``attn_k``/``attn_v`` (V is K when the file has no ``attn_v``);
* ``per_layer_embd``       -- the per-layer embedding residual of each layer;
* ``mul_weight``           -- ``ggml_mul(x, weight)`` (``layer_output_scale``).
"""
from __future__ import annotations

from gguf import Keys

from graphcost.format import ggml_types as gt
from graphcost.errors import GraphcostError
from graphcost.graph.spec_builder import SpecBuilder, statement
from graphcost.graph.statements.gemma3n import build_per_layer_inputs, slice2d


@statement("per_layer_inputs_key")
def per_layer_inputs_key(sb: SpecBuilder, a: dict) -> None:
    """``{x: inpL, out: inp_per_layer}``: build_inp_per_layer + project_per_layer_inputs,
    n_embd_per_layer from ``<arch>.embedding_length_per_layer_input``."""
    key = Keys.LLM.EMBD_LENGTH_PER_LAYER_INP.format(arch=sb.m.arch)
    width = sb.m.header.metadata.get(key)
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0:
        raise GraphcostError(f"{sb.m.header.path}: metadata key {key!r} must be a positive "
                             f"integer when the file has per_layer_token_embd")
    sb.vars[a.get("out", "inp_per_layer")] = build_per_layer_inputs(
        sb, sb.var(a.get("x", "inpL")), width)


@statement("rope_factors_global")
def rope_factors_global(sb: SpecBuilder, a: dict) -> None:
    """``{out: freq_factors}``: ``rope_freqs`` (one tensor shared by the full-attention
    layers, TENSOR_DUPLICATED) on a full-attention layer, None on a sliding one."""
    sb.vars[a.get("out", "freq_factors")] = (None if sb.m.is_swa[sb.il]
                                             else sb.weight("/rope_freqs"))


@statement("kv_only")
def kv_only(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur}``: Kcur and Vcur after ``q_only``: CONTs of the fused projection's K and
    V rows (``qkv_fused``), or MUL_MATs of ``attn_k``/``attn_v`` (no ``attn_v``: V is K);
    cb ``Kcur``/``Vcur``; 3-D reshapes with the layer's head size."""
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    cur = sb.var(a.get("x", "cur"))
    hd, T = m.head_k(il), b.n_tokens
    qkv = sb.vars.get("qkv_fused")
    if qkv is not None:
        q_dim, k_dim = hd * m.n_head[il], hd * m.n_head_kv[il]
        es = gt.type_size(qkv.type)
        k = g.cont(g.view(qkv, [k_dim, T], [qkv.nb[1]], q_dim * es))
        v = g.cont(g.view(qkv, [k_dim, T], [qkv.nb[1]], (q_dim + k_dim) * es))
    else:
        k = b.mm(sb.weight("attn_k"), cur)
        wv = sb.weight("attn_v?")
        v = b.mm(wv, cur) if wv is not None else k
    g.cb(k, "Kcur", il)
    g.cb(v, "Vcur", il)
    sb.vars["Kcur"] = g.reshape(k, [hd, m.n_head_kv[il], T])
    sb.vars["Vcur"] = g.reshape(v, [hd, m.n_head_kv[il], T])


@statement("per_layer_embd")
def per_layer_embd(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, per_layer: inp_per_layer, out: cur}``: cb ``pe_in``; GELU(inp_gate x) *
    this layer's per-layer input, ``proj``, RMS norm (``per_layer_embd_out``); + pe_in."""
    b, g, il = sb.b, sb.g, sb.il
    pe_in = g.cb(sb.var(a.get("x", "cur")), "pe_in", il)
    t = g.unary("GELU", b.mm(sb.weight("inp_gate"), pe_in))
    t = g.mul(t, slice2d(sb, sb.var(a.get("per_layer", "inp_per_layer")), il))
    t = b.build_norm(b.mm(sb.weight("proj"), t), sb.weight("post_norm"), None, il)
    g.cb(t, "per_layer_embd_out", il)
    sb.vars[a.get("out", "cur")] = g.add(pe_in, t)


@statement("mul_weight")
def mul_weight(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, weight: layer_output_scale, cb: out_scaled, out: cur}``: ggml_mul by a
    weight (skipped when an optional ``weight?`` is absent)."""
    w = sb.weight(a["weight"])
    if w is None:
        return
    sb.vars[a.get("out", a["x"])] = sb.cb(sb.g.mul(sb.var(a["x"]), w), a.get("cb"))
