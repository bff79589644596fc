"""Statements for ``gemma3n`` (src/models/gemma3n.cpp in the llama.cpp vendored by
llama-cpp-python 0.3.36): per-layer embeddings, AltUp (``n_altup`` parallel streams of the
hidden state, one active), LAuReL (a low-rank residual), activation sparsity in the first
FFNs (gaussian top-k) and KV sharing (layers from ``n_layer_kv_from_start`` on have no KV
of their own and attend an earlier layer's cache).

Each statement mirrors one member function of ``llama_model_gemma3n::graph`` and names
it; the constants llama.cpp hard-codes for gemma3n (``n_altup``, ``i_altup_act``,
``n_embd_altup``, ``n_layer_sparsity``, ``f_sparsity_std_mul``, ``n_layer_kv_from_start``)
are the spec's ``hparams`` (specs/arch/gemma3n.yaml), not GGUF keys.
"""
from __future__ import annotations

import math

from graphcost.format import ggml_types as gt
from graphcost.errors import GraphcostError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import InputKind
from graphcost.graph.spec_builder import SpecBuilder, statement


def _hp(sb: SpecBuilder, key: str) -> float:
    if key not in sb.spec.hparams:
        raise GraphcostError(sb.where(f"hparams.{key} is needed by this statement"))
    return sb.spec.hparams[key]


def slice2d(sb: SpecBuilder, x: Tensor, idx: int) -> Tensor:
    """gemma3n_view_2d_slice: the 2-D slice ``idx`` of a 3-D tensor along dim 2."""
    if idx >= x.ne[2]:
        raise GraphcostError(sb.where(f"slice {idx} of a tensor with {x.ne[2]} slices"))
    return sb.g.view(x, [x.ne[0], x.ne[1]], [gt.row_size(x.type, x.ne[0])],
                     idx * x.ne[0] * x.ne[1] * gt.type_size(x.type))


def _rest(sb: SpecBuilder, x: Tensor) -> Tensor:
    """ggml_view_3d of slices 1.. along dim 2 (skips the first slice)."""
    n0, n1 = x.ne[0], x.ne[1]
    rs = gt.row_size
    return sb.g.view(x, [n0, n1, x.ne[2] - 1], [rs(x.type, n0), rs(x.type, n0 * n1)],
                     n0 * n1 * gt.type_size(x.type))


def calc_magnitude(sb: SpecBuilder, x: Tensor) -> Tensor:
    """graph::calc_magnitude: sqrt(sum_rows(x*x))."""
    g = sb.g
    return g.sqrt(g.sum_rows(g.sqr(x)))


@statement("per_layer_inputs")
def per_layer_inputs(sb: SpecBuilder, a: dict) -> None:
    """``{x: inpL, out: inp_per_layer}``: graph::build_inp_per_layer (token path: a second,
    unnamed token input, GET_ROWS of ``per_layer_token_embd``, reshape, scale by
    sqrt(n_embd_altup)), expanded, then graph::project_per_layer_inputs -> F32
    [n_embd_altup, n_tokens, n_layer]."""
    x = sb.var(a.get("x", "inpL"))
    sb.vars[a.get("out", "inp_per_layer")] = build_per_layer_inputs(
        sb, x, int(_hp(sb, "n_embd_altup")))


def build_per_layer_inputs(sb: SpecBuilder, x: Tensor, ea: int) -> Tensor:
    """build_inp_per_layer + project_per_layer_inputs (gemma3n.cpp, gemma4.cpp) with
    per-layer inputs of ``ea`` values per layer."""
    b, g, m = sb.b, sb.g, sb.m
    T = b.n_tokens
    tokens = b.new_input(InputKind.TOKENS, gt.I32, [T])    # build_inp_per_layer: inp->tokens
    inp = g.get_rows(sb.weight("/per_layer_token_embd"), tokens)
    inp = g.reshape(inp, [ea, m.n_layer, T])
    inp = g.cb(g.scale(inp, math.sqrt(ea)), "inp_per_layer_selected", -1)
    g.expand(inp)
    proj = b.mm(sb.weight("/per_layer_model_proj"), x)
    proj = g.scale(proj, 1.0 / math.sqrt(m.n_embd))
    proj = g.reshape(proj, [ea, m.n_layer, T])
    proj = g.cb(b.build_norm(proj, sb.weight("/per_layer_proj_norm"), None, -1), "per_layer_proj")
    inp = g.scale(g.add(proj, inp), 1.0 / math.sqrt(2.0))
    g.cb(inp, "inp_per_layer")
    return g.cont(g.permute(inp, 0, 2, 1, 3))


@statement("altup_stack")
def altup_stack(sb: SpecBuilder, a: dict) -> None:
    """``{x: inpL, out: inpL}``: the first hidden state projected to the other n_altup - 1
    streams (``altup_proj``), rescaled to its magnitude and CONCATed along dim 2 ->
    [n_embd, n_tokens, n_altup], named ``inp_stacked``."""
    b, g, m = sb.b, sb.g, sb.m
    x = sb.var(a.get("x", "inpL"))
    n_altup = int(_hp(sb, "n_altup"))
    target = calc_magnitude(sb, x)
    rep = g.repeat_4d(x, [m.n_embd, b.n_tokens, n_altup - 1, 1])
    added = b.mm(sb.weight("/altup_proj"), rep)
    new = calc_magnitude(sb, added)
    added = g.div(g.mul(added, target), new)
    sb.vars[a.get("out", "inpL")] = g.cb(g.concat(x, added, 2), "inp_stacked")


def router_modalities(sb: SpecBuilder, x: Tensor) -> Tensor:
    """graph::altup_compute_router_modalities: tanh(router x (rms_norm(x) / n_embd))."""
    b, g = sb.b, sb.g
    r = b.build_norm(x, sb.weight("altup_router_norm"), None, sb.il)
    r = g.scale(r, 1.0 / sb.m.n_embd)
    return g.unary("TANH", b.mm(sb.weight("altup_router"), r))


@statement("altup_predict")
def altup_predict(sb: SpecBuilder, a: dict) -> None:
    """``{x: inpL, out: predictions}``: graph::altup_predict -> [n_embd, n_tokens, n_altup]."""
    b, g, il = sb.b, sb.g, sb.il
    cur = sb.var(a.get("x", "inpL"))
    n_altup = int(_hp(sb, "n_altup"))
    act = slice2d(sb, cur, int(_hp(sb, "i_altup_act")))
    mod = g.cb(router_modalities(sb, act), "modalities", il)
    coefs = g.cb(b.mm(sb.weight("altup_predict_coef"), mod), "all_coefs", il)
    coefs = g.reshape(coefs, [n_altup, n_altup, b.n_tokens])
    perm = g.cont(g.permute(cur, 1, 2, 0, 3))
    pred = g.mul_mat(perm, coefs)
    pred = g.cont(g.permute(pred, 0, 2, 1, 3))
    sb.vars[a.get("out", "predictions")] = g.cb(g.add(pred, cur), "predictions", il)


@statement("altup_slice")
def altup_slice(sb: SpecBuilder, a: dict) -> None:
    """``{x: predictions, cb: active_prediction, out: active_prediction}``: the active
    stream (``i_altup_act``) as a 2-D view."""
    t = slice2d(sb, sb.var(a["x"]), int(_hp(sb, "i_altup_act")))
    sb.vars[a["out"]] = sb.cb(t, a.get("cb"))


@statement("laurel")
def laurel(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, out: laurel_out}``: graph::laurel: rms_norm(R L x) * w + x."""
    b, g, il = sb.b, sb.g, sb.il
    cur = sb.var(a.get("x", "cur"))
    t = b.mm(sb.weight("laurel_r"), b.mm(sb.weight("laurel_l"), cur))
    t = b.build_norm(t, sb.weight("laurel_post_norm"), None, il)
    sb.vars[a.get("out", "laurel_out")] = g.cb(g.add(t, cur), "laurel_out", il)


def has_kv(sb: SpecBuilder, il: int) -> bool:
    """llama_hparams::has_kv: layers below n_layer_kv_from_start (when set) have KV."""
    return il not in sb.kv_reuse()


@statement("kv_layer")
def kv_layer(sb: SpecBuilder, a: dict) -> None:
    """``{then: [...], else: [...]}``: ``if (hparams.has_kv(il))``."""
    taken = "then" if has_kv(sb, sb.il) else "else"
    sb.run_branch(f"kv_layer: {taken}", a.get(taken))


@statement("q_only")
def q_only(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, cb_fused: wqkv}``: Q alone: MUL_MAT ``attn_q`` (fused ``attn_qkv``: the
    product, cb'ed ``cb_fused`` when given and kept as ``qkv_fused``, then a CONT of its
    first n_head*head_dim rows), cb ``Qcur``, a 3-D reshape. Sets ``Qcur``. (gemma3n: a
    layer that reuses another's KV; gemma4: every layer, K and V follow.)"""
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    cur = sb.var(a.get("x", "cur"))
    q_dim = m.head_k(il) * m.n_head[il]
    wqkv = sb.weight("attn_qkv?")
    sb.vars["qkv_fused"] = None
    if wqkv is not None:
        qkv = sb.cb(b.mm(wqkv, cur), a.get("cb_fused"))
        sb.vars["qkv_fused"] = qkv
        q = g.cont(g.view(qkv, [q_dim, b.n_tokens], [qkv.nb[1]], 0))
    else:
        q = b.mm(sb.weight("attn_q"), cur)
    g.cb(q, "Qcur", il)
    sb.vars["Qcur"] = g.reshape(q, [m.head_k(il), m.n_head[il], b.n_tokens])


@statement("attention_shared")
def attention_shared(sb: SpecBuilder, a: dict) -> None:
    """``{wo: attn_output, kq_scale: 1.0, out: cur}``: build_attn (iSWA inputs) with no K
    and V: nothing stored, the reused layer's cache attended."""
    il = sb.il
    swa = sb.inp_attn_swa is not None
    inp = sb.inp_attn_swa if swa and sb.m.is_swa[il] else sb.inp_attn
    if inp is None:
        raise GraphcostError(sb.where("attention_shared before attention_inputs"))
    t = sb.b.build_attn(inp, sb.weight(a.get("wo", "attn_output")), None,
                        sb.var(a.get("q", "Qcur")), None, None,
                        sb.expr(a.get("kq_scale", 1.0)), il, iswa=swa)
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


def gaussian_topk(sb: SpecBuilder, x: Tensor) -> Tensor:
    """graph::gaussian_topk: relu(x - (mean + std_mul * std)), std over ne0 - 1."""
    g = sb.g
    mean = g.mean(x)
    var = g.scale(g.sum_rows(g.sqr(g.sub(x, mean))), 1.0 / float(x.ne[0] - 1))
    cutoff = g.add(mean, g.scale(g.sqrt(var), float(_hp(sb, "sparsity_std_mul"))))
    return g.unary("RELU", g.sub(x, cutoff))


@statement("ffn_sparse")
def ffn_sparse(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, cb: ffn_out, out: cur}``: gemma3n's FFN: up, gate (gaussian top-k in the
    first ``n_layer_sparsity`` layers), GELU(gate) * up, down."""
    b, g, il = sb.b, sb.g, sb.il
    cur = sb.var(a.get("x", "cur"))
    up = b.mm(sb.weight("ffn_up"), cur)
    gate = b.mm(sb.weight("ffn_gate"), cur)
    if il < int(_hp(sb, "n_layer_sparsity")):
        gate = gaussian_topk(sb, gate)
    gate = g.unary("GELU", gate)
    t = b.mm(sb.weight("ffn_down"), g.mul(up, gate))
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("altup_correct")
def altup_correct(sb: SpecBuilder, a: dict) -> None:
    """``{predictions: predictions, activated: cur, out: corrected}``: graph::altup_correct
    -> [n_embd, n_tokens, n_altup]."""
    b, g, m, il = sb.b, sb.g, sb.m, sb.il
    pred, act = sb.var(a.get("predictions", "predictions")), sb.var(a["activated"])
    n_altup, T = int(_hp(sb, "n_altup")), b.n_tokens
    mod = g.cb(router_modalities(sb, act), "modalities", il)
    active = slice2d(sb, pred, int(_hp(sb, "i_altup_act")))
    innov = g.cb(g.sub(act, active), "innovation", il)
    coefs = b.mm(sb.weight("altup_correct_coef"), mod)
    coefs = g.cb(g.scale(coefs, 1.0, 1.0), "all_coefs", il)  # ggml_scale_bias: + 1
    coefs = g.cont(g.transpose(coefs), [1, T, n_altup])
    innov = g.repeat_4d(innov, [m.n_embd, T, n_altup, 1])
    corr = g.add(g.mul(innov, coefs), pred)
    sb.vars[a.get("out", "corrected")] = g.cb(corr, "corrected", il)


@statement("per_layer_mix")
def per_layer_mix(sb: SpecBuilder, a: dict) -> None:
    """``{x: corrected, per_layer: inp_per_layer, out: inpL}``: the active corrected stream
    gated by the layer's per-layer input, projected back to n_embd and added to the other
    streams (``corrected_predictions[1:] += first_prediction``); build_cvec (no control
    vector: unchanged); cb ``l_out``."""
    b, g, il = sb.b, sb.g, sb.il
    corr, per_layer = sb.var(a.get("x", "corrected")), sb.var(a.get("per_layer", "inp_per_layer"))
    first = slice2d(sb, corr, int(_hp(sb, "i_altup_act")))
    first = g.mul(first, sb.weight("altup_correct_scale"))
    first = b.mm(sb.weight("inp_gate"), first)
    first = g.cb(g.unary("GELU", first), "first_prediction_gated", il)
    first = g.cb(g.mul(first, slice2d(sb, per_layer, il)), "first_prediction_scaled", il)
    first = b.mm(sb.weight("proj"), first)
    first = g.cb(b.build_norm(first, sb.weight("post_norm"), None, il),
                 "first_prediction_out", il)
    head = slice2d(sb, corr, 0)
    tmp = g.add(_rest(sb, corr), first)
    sb.vars[a.get("out", "inpL")] = g.cb(g.concat(head, tmp, 2), "l_out", il)


@statement("altup_unembed")
def altup_unembed(sb: SpecBuilder, a: dict) -> None:
    """``{x: inpL, out: cur}``: the streams merged back to one: streams 1.. projected by
    ``altup_unembd_proj`` and rescaled to the active stream's magnitude (``altup_unembd``),
    then stream 0 plus each of them, / n_altup (``unembd_merged``) -> [n_embd, n_tokens]."""
    b, g = sb.b, sb.g
    cur = sb.var(a.get("x", "inpL"))
    n_altup = int(_hp(sb, "n_altup"))
    target = calc_magnitude(sb, slice2d(sb, cur, int(_hp(sb, "i_altup_act"))))
    un = b.mm(sb.weight("/altup_unembd_proj"), _rest(sb, cur))
    new = calc_magnitude(sb, un)
    un = g.cb(g.div(g.mul(un, target), new), "altup_unembd")
    t = slice2d(sb, cur, 0)
    for i in range(n_altup - 1):
        t = g.add(t, slice2d(sb, un, i))
    sb.vars[a.get("out", "cur")] = g.cb(g.scale(t, 1.0 / n_altup), "unembd_merged")
