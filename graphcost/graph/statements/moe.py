"""Mixture-of-experts spec statement ``moe_ffn``.

``moe_ffn`` mirrors ``llm_graph_context::build_moe_ffn`` (``src/llama-graph.cpp`` of the
llama.cpp vendored by llama-cpp-python 0.3.36): router logits, softmax/sigmoid gating,
top-k by ARGSORT + view, GET_ROWS of the chosen weights, optional normalisation
(SUM_ROWS, CLAMP, DIV) and scaling, MUL_MAT_ID for up/gate/down, the weighting MUL, and
the aggregation of the k expert outputs (views, then ADDs). A family that builds the MoE
FFN only in some layers chooses with ``when: {tensor: ffn_gate_inp, then, else}``, like
``if (model.layers[il].ffn_gate_inp == nullptr)`` in ``src/models/llama.cpp``.

Creation and expand order are llama.cpp's, because they decide auto-names and node order.
"""
from __future__ import annotations

from typing import Any

from graphcost.format.hparam_expr import evaluate
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.llm_graph import LlmGraph
from graphcost.graph.spec_builder import SpecBuilder, statement

#: llama_expert_gating_func_type (src/llama-hparams.h) by spec name
GATING = {"softmax": 1, "sigmoid": 2, "softmax_weight": 3}
#: build_moe_ffn: the activation between gate/up and down, with and without a gate
_ACT = {"silu": (("SWIGLU", "ffn_moe_swiglu"), ("SILU", "ffn_moe_silu")),
        "gelu": (("GEGLU", "ffn_moe_geglu"), ("GELU", "ffn_moe_gelu"))}
#: weights_sum clamp floor: the smallest normal F16 (build_moe_ffn)
_SUM_FLOOR = 6.103515625e-5
#: LLM_FFN_SWIGLU_OAI_MOE: "constexpr float alpha = 1.702f; limit = 7.0f" (build_moe_ffn)
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


def build_moe_ffn(b: LlmGraph, cur: Tensor, gate_inp: Tensor | None, gate_inp_b: Tensor | None,
                  up_exps: Tensor, gate_exps: Tensor | None, down_exps: Tensor,
                  exp_probs_b: Tensor | None, n_expert: int, n_expert_used: int,
                  n_expert_used_il: int, act: str, norm_w: bool, w_scale: float, gating: int,
                  il: int, n_expert_groups: int = 0, n_group_used: int = 0,
                  gate_up_exps: Tensor | None = None, up_b: Tensor | None = None,
                  gate_b: Tensor | None = None, down_b: Tensor | None = None,
                  llama4: bool = False, probs_in: Tensor | None = None,
                  up_s: Tensor | None = None, gate_s: Tensor | None = None,
                  down_s: Tensor | None = None) -> Tensor:
    """build_moe_ffn without adapters; with DeepSeek V3's grouped
    routing when ``n_expert_groups > 1`` (:func:`mask_expert_groups`) and the merged
    ``gate_up_exps`` path (one MUL_MAT_ID, gate and up as views) when given. ``up_b``,
    ``gate_b``, ``down_b``: per-expert biases [n, n_expert] (gpt-oss), each an ADD_ID of
    the rows the selected experts pick. ``act`` ``swiglu_oai``: LLM_FFN_SWIGLU_OAI_MOE.
    ``llama4``: its ``arch == LLM_ARCH_LLAMA4`` branches: experts chosen by the raw logits,
    and the input scaled by the weights before the experts (REPEAT, MUL
    ``ffn_moe_weighted``), not their outputs after. ``probs_in``: router logits the
    family computed itself (gemma4; ``gate_inp`` is then unused). ``up_s``, ``gate_s``,
    ``down_s``: per-expert weight scales [n_expert] (:func:`mm_id`; ``up_s`` scales the
    merged ``gate_up`` product too, as build_moe_ffn passes it there)."""
    g = b.g
    n_embd, n_tokens = cur.ne[0], cur.ne[1]
    cb = g.cb

    if probs_in is None:
        logits = cb(b.mm(gate_inp, cur), "ffn_moe_logits", il)  # [n_expert, n_tokens]
    else:
        logits = probs_in
    if gate_inp_b is not None:
        logits = cb(g.add(logits, gate_inp_b), "ffn_moe_logits_biased", il)

    if gating == 1:
        probs = g.soft_max(logits)
    elif gating == 2:
        probs = g.unary("SIGMOID", logits)
    elif gating == 3:
        probs = logits
    else:
        raise UnsupportedError(f"expert gating function {gating} is not modelled")
    cb(probs, "ffn_moe_probs", il)

    selection_probs = probs
    if exp_probs_b is not None:
        selection_probs = cb(g.add(probs, exp_probs_b), "ffn_moe_probs_biased", il)

    if llama4:  # "sigmoid is only used after top_k"
        selection_probs = logits

    if n_expert_groups > 1 and n_tokens > 0:
        selection_probs = mask_expert_groups(b, selection_probs, n_expert, n_expert_groups,
                                             n_group_used, il)

    selected = g.argsort_top_k(selection_probs, n_expert_used)  # [n_expert_used, n_tokens]
    cb(selected.src[0], "ffn_moe_argsort", il)
    cb(selected, "ffn_moe_topk", il)

    probs = g.reshape(probs, [1, n_expert, n_tokens])
    weights = cb(g.get_rows(probs, selected), "ffn_moe_weights", il)  # [1, k, n_tokens]

    if gating == 3:
        weights = g.reshape(weights, [n_expert_used, n_tokens])
        weights = g.soft_max(weights)
        weights = g.reshape(weights, [1, n_expert_used, n_tokens])
        cb(weights, "ffn_moe_weights_softmax", il)

    if norm_w:
        weights = g.reshape(weights, [n_expert_used, n_tokens])
        weights_sum = cb(g.sum_rows(weights), "ffn_moe_weights_sum", il)  # [1, n_tokens]
        weights_sum = cb(g.clamp(weights_sum, _SUM_FLOOR, float("inf")),
                         "ffn_moe_weights_sum_clamped", il)
        weights = cb(g.div(weights, weights_sum), "ffn_moe_weights_norm", il)
        weights = g.reshape(weights, [1, n_expert_used, n_tokens])
    if w_scale != 0.0 and w_scale != 1.0:
        weights = cb(g.scale(weights, w_scale), "ffn_moe_weights_scaled", il)

    g.expand(weights)  # "call early so that topk-moe can be used"

    cur = g.reshape(cur, [n_embd, 1, n_tokens])
    if llama4:  # weight_before_ffn
        repeated = g.repeat_4d(cur, [n_embd, n_expert_used, n_tokens, 1])
        cur = cb(g.mul(repeated, weights), "ffn_moe_weighted", il)
    if gate_up_exps is not None:
        # one MUL_MAT_ID [2*n_ff, k, n_tokens]; gate is the first n_ff rows, up the rest
        gate_up = cb(mm_id(g, gate_up_exps, cur, selected, up_s), "ffn_moe_gate_up", il)
        if up_s is not None:
            cb(gate_up, "ffn_moe_gate_up_scaled", il)
        n_ff = gate_up.ne[0] // 2
        shape, nb = [n_ff, gate_up.ne[1], gate_up.ne[2]], [gate_up.nb[1], gate_up.nb[2]]
        cur = cb(g.view(gate_up, shape, nb, 0), "ffn_moe_gate", il)
        up = cb(g.view(gate_up, shape, nb, n_ff * gate_up.nb[0]), "ffn_moe_up", il)
    else:
        up = cb(mm_id(g, up_exps, cur, selected, up_s), "ffn_moe_up", il)  # [n_ff, k, T]
        if up_s is not None:
            cb(up, "ffn_moe_up_scaled", il)
        if up_b is not None:
            up = cb(g.add_id(up, up_b, selected), "ffn_moe_up_biased", il)
        if gate_exps is not None:
            cur = cb(mm_id(g, gate_exps, cur, selected, gate_s), "ffn_moe_gate", il)
        else:
            cur = up
        if gate_s is not None:
            cb(cur, "ffn_moe_gate_scaled", il)
        if gate_b is not None:
            cur = cb(g.add_id(cur, gate_b, selected), "ffn_moe_gate_biased", il)

    if act == "swiglu_oai":  # alpha and limit are constexpr in build_moe_ffn
        cur = cb(g.swiglu_oai(cur, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT),
                 "ffn_moe_swiglu_oai", il)
    elif act == "relu_sqr":  # LLM_FFN_RELU_SQR: no gated form ("not implemented": aborts)
        if gate_exps is not None or gate_up_exps is not None:
            raise UnsupportedError("gated squared-ReLU experts (llama.cpp aborts on them)")
        cur = cb(g.sqr(g.unary("RELU", cur)), "ffn_moe_relu_sqr", il)
    elif act not in _ACT:
        raise UnsupportedError(f"mixture-of-experts activation {act!r} is not modelled")
    else:
        (glu_op, glu_name), (op, name) = _ACT[act]
        if gate_exps is not None or gate_up_exps is not None:
            cur = cb(g.glu_split(glu_op, cur, up), glu_name, il)
        else:
            cur = cb(g.unary(op, cur), name, il)

    experts = cb(mm_id(g, down_exps, cur, selected, down_s), "ffn_moe_down", il)  # [n_embd, k, T]
    if down_s is not None:
        cb(experts, "ffn_moe_down_scaled", il)
    if down_b is not None:
        experts = cb(g.add_id(experts, down_b, selected), "ffn_moe_down_biased", il)
    if not llama4:
        experts = cb(g.mul(experts, weights), "ffn_moe_weighted", il)
    g.expand(experts)

    # order the views before the adds
    views = []
    for i in range(n_expert_used_il):
        v = g.view(experts, [n_embd, n_tokens], [experts.nb[2]], i * experts.nb[1])
        g.expand(v)
        views.append(v)
    moe_out = views[0]
    for v in views[1:]:
        moe_out = g.add(moe_out, v)
        g.expand(moe_out)
    if n_expert_used_il == 1:
        moe_out = g.cont(moe_out)  # avoid returning a non-contiguous tensor
    return cb(moe_out, "ffn_moe_out", il)


def mm_id(g, w: Tensor, cur: Tensor, ids: Tensor, w_s: Tensor | None) -> Tensor:
    """build_lora_mm_id without adapters: MUL_MAT_ID, then with a per-expert scale ``w_s``
    [n_expert] each selected expert's rows times its scale: RESHAPE [1, n_expert, 1],
    REPEAT [1, n_expert, n_tokens], GET_ROWS by ``ids`` [1, k, n_tokens], MUL."""
    res = g.mul_mat_id(w, cur, ids)
    if w_s is None:
        return res
    n_expert, n_tokens = w_s.ne[0], cur.ne[2]
    s = g.repeat_4d(g.reshape(w_s, [1, n_expert, 1]), [1, n_expert, n_tokens, 1])
    return g.mul(res, g.get_rows(s, ids))


def mask_expert_groups(b: LlmGraph, selection_probs: Tensor, n_expert: int, n_groups: int,
                       n_group_used: int, il: int) -> Tensor:
    """build_moe_ffn's group selection (DeepSeek V3's ``n_group`` / ``topk_group``): score
    each group by the sum of its two best experts, keep the ``n_group_used`` best groups
    and set every expert of the others to -inf before the top-k."""
    g = b.g
    n_tokens = selection_probs.ne[1]
    per_group = n_expert // n_groups
    groups = g.reshape(selection_probs, [per_group, n_groups, n_tokens])
    top2 = g.argsort_top_k(groups, 2)  # [2, n_groups, n_tokens]
    scores = g.get_rows(g.reshape(groups, [1, per_group, n_groups, n_tokens]), top2)
    # [1, 2, n_groups, n_tokens] -> sum of the two -> [n_groups, n_tokens]
    scores = g.sum_rows(g.reshape(scores, [scores.ne[1], scores.ne[2], scores.ne[3]]))
    scores = g.reshape(scores, [scores.ne[1], scores.ne[2]])
    kept = g.cb(g.argsort_top_k(scores, n_group_used), "ffn_moe_group_topk", il)
    rows = g.get_rows(groups, kept)  # [per_group, n_group_used, n_tokens]
    masked = g.set_rows(g.fill(groups, float("-inf")), rows, kept)
    return g.cb(g.reshape(masked, [n_expert, n_tokens]), "ffn_moe_probs_masked", il)


def _names(sb: SpecBuilder) -> dict[str, float]:
    m = sb.m
    return {**sb.names, "n_expert": m.n_expert,
            "n_expert_used": m.n_expert_used[0] if m.n_expert_used else 0,
            "expert_weights_scale": m.expert_weights_scale,
            "expert_weights_norm": float(m.expert_weights_norm),
            "expert_gating_func": m.expert_gating_func}


def _gating(sb: SpecBuilder, v: Any) -> int:
    if isinstance(v, str) and v in GATING:
        return GATING[v]
    g = int(evaluate(v, _names(sb), str(sb.spec.path)))
    if g not in GATING.values():
        # 0 (none): build_moe_ffn aborts; 4 (sqrt_softplus) is not modelled
        raise UnsupportedError(f"{sb.m.header.path}: {sb.m.arch} with expert gating function "
                               f"{g} ({sb.m.arch}.expert_gating_func) is not modelled "
                               f"(modelled: " + ", ".join(f"{n} {i}" for n, i in GATING.items())
                               + ")")
    return g


@statement("moe_ffn")
def s_moe_ffn(sb: SpecBuilder, a: dict) -> None:
    """``moe_ffn: {x, gate_inp, gate_inp_bias, up, gate, gate_up, down, up_bias, gate_bias,
    down_bias, probs_bias, act, gating, norm_w, w_scale, llama4, cb, out}``; tensors default
    to ``ffn_gate_inp``, ``ffn_up_exps``, ``ffn_gate_exps?`` (optional, as in llama),
    ``ffn_down_exps``; no expert biases unless named; ``used: layer`` routes each layer's
    own ``expert_used_count`` (nemotron_h passes ``n_expert_used(il)``), not layer 0's;
    ``gate_up`` (e.g.
    ``ffn_gate_up_exps?``) takes the merged path when the file has it. ``logits``: a
    variable holding router logits computed by the family (gemma4), instead of
    ``gate_inp``; ``up_scale``, ``gate_scale``, ``down_scale``: per-expert weight scales
    (e.g. ``ffn_down_exps.scale?``)."""
    m, il = sb.m, sb.il
    if il is None:
        raise GraphcostError(sb.where("moe_ffn outside the layer statements"))
    if m.n_expert == 0:
        raise GraphcostError(f"{m.header.path}: layer {il} has expert tensors but "
                             f"{m.arch}.expert_count is missing or 0")
    # the merged gate_up_exps (families whose build_moe_ffn call passes it: ``gate_up``),
    # else separate up and (optional) gate experts
    gate_up = sb.weight(a.get("gate_up"))
    up = sb.weight(a.get("up", "ffn_up_exps")) if gate_up is None else None
    gate = sb.weight(a.get("gate", "ffn_gate_exps?")) if gate_up is None else None
    first = gate_up if gate_up is not None else up
    if first.ne[2] != m.n_expert:
        raise GraphcostError(f"{m.header.path}: {first.name} holds {first.ne[2]} experts, "
                             f"{m.arch}.expert_count says {m.n_expert}")
    names = _names(sb)
    where = str(sb.spec.path)
    probs_in = sb.var(a["logits"]) if "logits" in a else None
    gate_inp = sb.weight(a.get("gate_inp", "ffn_gate_inp")) if probs_in is None else None
    t = build_moe_ffn(
        sb.b, sb.var(a.get("x", "cur")), gate_inp,
        sb.weight(a.get("gate_inp_bias")), up, gate,
        sb.weight(a.get("down", "ffn_down_exps")), sb.weight(a.get("probs_bias")),
        m.n_expert, m.n_expert_used[il if a.get("used") == "layer" else 0],
        m.n_expert_used[il], a.get("act", "silu"),
        bool(evaluate(a.get("norm_w", 0), names, where)),
        evaluate(a.get("w_scale", 0), names, where), _gating(sb, a.get("gating", "softmax")), il,
        m.n_expert_groups, m.n_group_used, gate_up,
        up_b=sb.weight(a.get("up_bias")), gate_b=sb.weight(a.get("gate_bias")),
        down_b=sb.weight(a.get("down_bias")), llama4=bool(a.get("llama4", False)),
        probs_in=probs_in, up_s=sb.weight(a.get("up_scale")),
        gate_s=sb.weight(a.get("gate_scale")), down_s=sb.weight(a.get("down_scale")))
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))
