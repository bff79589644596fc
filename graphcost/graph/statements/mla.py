"""Statements for multi-head latent attention (deepseek2: DeepSeek V2/V3/R1, Kimi K2).

``src/models/deepseek2.cpp`` (llama.cpp vendored by llama-cpp-python 0.3.36) builds MLA
from plain ggml calls on activations -- matmuls against per-layer weights, strided views,
permutes, concatenations -- and attends through a K-only cache
(``llm_graph_context::build_attn_inp_k`` and its ``build_attn`` overload,
``src/llama-graph.cpp``). The statements here are those calls, one each:

* ``attention_inputs_k`` -- ``build_attn_inp_k``: the MLA cache (K rows of
  ``kv_lora_rank + n_rot``, no V buffer) with its K index and mask inputs;
* ``view``      -- ``ggml_view_Nd(x, ne..., nb..., offset)``, strides and offset in
  *elements* of ``x``'s type (``ggml_row_size(x->type, n)`` in the C++);
* ``permute``   -- ``ggml_permute``;
* ``concat``    -- ``ggml_concat(a, b, dim)``;
* ``attention_k`` -- ``build_attn(llm_graph_input_attn_k *, wo, ..., v_mla = wv_b)``;
* ``repeat``    -- ``ggml_repeat_4d`` (the legacy non-MLA graph's shared ``k_pe``);
* ``cont``      -- ``ggml_cont``;
* ``rope_offset`` -- ``ggml_rope_set_offset``: the rope rotates the dims after ``offset``
  (legacy non-MLA: rope on the trailing ``n_rot`` dims of the whole Q).

The matmuls (``mm``) and the query temperature input (``attn_temp_input``, Mistral Large 3
in deepseek2's graph) are the shared statements of :mod:`.common`.

Sizes are expressions over the hyperparameter names (``kv_lora_rank``, ``head_dim_k_mla``,
``n_rot``, ``n_head``, ``n_tokens`` ...).
"""
from __future__ import annotations

from graphcost.format import ggml_types as gt
from graphcost.errors import GraphcostError, SettingsError
from graphcost.graph.spec_builder import SpecBuilder, statement


@statement("attention_inputs_k")
def attention_inputs_k(sb: SpecBuilder, a: dict) -> None:
    """``{}``: build_attn_inp_k -- one K-only cache over all layers (llama_kv_cache with
    ``has_v = !is_mla``), its ``attn_inp_k_idxs`` and ``attn_inp_kq_mask``."""
    b, m, run = sb.b, sb.m, sb.b.run
    if not m.is_mla:
        raise GraphcostError(sb.where("attention_inputs_k needs MLA head sizes "
                                      "(attention.key_length_mla / value_length_mla)"))
    if run.type_k != run.type_v:
        # llama_init_from_model: "model does not support different K and V cache types"
        raise SettingsError(f"{m.header.path}: {m.arch} with MLA keeps K and V in one cache: "
                            f"--cache-type-k {gt.type_name(run.type_k)} and --cache-type-v "
                            f"{gt.type_name(run.type_v)} must be equal (llama.cpp refuses)")
    cache = b.make_cache("base", list(range(m.n_layer)), run.kv_size, run.n_kv)
    sb.inp_attn = b.build_attn_inputs_k(cache)


@statement("view")
def view(sb: SpecBuilder, a: dict) -> None:
    """``{x, ne: [...], nb: [...], offset: e, cb, out}``: ggml_view_Nd; ``nb`` are
    nb[1..] and ``offset`` the byte offset, both given in elements of ``x``'s type."""
    x = sb.var(a["x"])
    ne = sb.sizes(a["ne"], "view size")
    nb = [gt.row_size(x.type, n) for n in sb.sizes(a.get("nb", []), "view stride")]
    (off,) = sb.sizes([a.get("offset", 0)], "view offset", minimum=0)
    t = sb.g.view(x, ne, nb, gt.row_size(x.type, off))
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("permute")
def permute(sb: SpecBuilder, a: dict) -> None:
    """``{x, axes: [0, 2, 1, 3], cb, out}``: ggml_permute."""
    axes = a.get("axes", [0, 2, 1, 3])
    if sorted(axes) != [0, 1, 2, 3]:
        raise GraphcostError(sb.where(f"permute axes {axes} are not a permutation of 0..3"))
    t = sb.g.permute(sb.var(a["x"]), *axes)
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("concat")
def concat(sb: SpecBuilder, a: dict) -> None:
    """``{a, b, dim, cb, out}``: ggml_concat(a, b, dim)."""
    x, y = sb.var(a["a"]), sb.var(a["b"])
    dim = int(a.get("dim", 0))
    if any(x.ne[i] != y.ne[i] for i in range(4) if i != dim):
        raise GraphcostError(sb.where(f"concat of {list(x.ne)} and {list(y.ne)} along {dim}"))
    sb.vars[a["out"]] = sb.cb(sb.g.concat(x, y, dim), a.get("cb"))


@statement("attention_k")
def attention_k(sb: SpecBuilder, a: dict) -> None:
    """``{q, k, v, wo, v_mla, kq_scale, cb, out}``: build_attn over the K-only cache of
    ``attention_inputs_k``; ``v_mla`` (``attn_v_b``) decompresses the result per head."""
    if sb.inp_attn is None or sb.inp_attn.v_idxs is not None:
        raise GraphcostError(sb.where("attention_k before attention_inputs_k"))
    t = sb.b.build_attn_k(sb.inp_attn, sb.weight(a.get("wo", "attn_output")),
                          sb.var(a.get("q", "Qcur")), sb.var(a.get("k", "Kcur")),
                          sb.var(a.get("v", "Vcur")), sb.weight(a.get("v_mla")),
                          sb.expr(a.get("kq_scale", 1.0)), sb.il)
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("repeat")
def repeat(sb: SpecBuilder, a: dict) -> None:
    """``{x, ne: [...], cb, out}``: ggml_repeat_4d(x, ne...)."""
    sb.shape_op(a, "repeat", sb.g.repeat_4d)


@statement("rope_offset")
def rope_offset(sb: SpecBuilder, a: dict) -> None:
    """``{x, offset}``: ggml_rope_set_offset -- ``x`` (a ROPE) skips its first ``offset``
    dims of each head; shapes and node are unchanged."""
    x = sb.var(a["x"])
    if x.op != "ROPE":
        raise GraphcostError(sb.where(f"rope_offset of {a['x']}, which is a {x.op}, not a ROPE"))
    (x.params["n_offs"],) = sb.sizes([a["offset"]], "rope offset", minimum=0)


@statement("cont")
def cont(sb: SpecBuilder, a: dict) -> None:
    """``{x, cb, out}``: ggml_cont(x) -- a packed copy."""
    t = sb.g.cont(sb.var(a["x"]))
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))
