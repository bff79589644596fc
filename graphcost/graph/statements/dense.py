"""Statements for the dense llama-like families: qwen2, qwen3, olmo2, granite.

qwen2 and qwen3 need nothing beyond the core. What the others add:

* ``require_keys``    -- ``ml.get_key(LLM_KV_..., x)`` without ``false``: llama.cpp refuses
  a file without the key (granite's ``logit_scale``, everyone's RMS epsilon);
* ``unsupported_keys`` -- refuse a file with a key whose graph we do not model (Granite
  Vision's ``deepstack_mapping``);
* ``if``              -- a C++ ``if`` on hyperparameters (granite: ``if
  (hparams.f_residual_scale)``, ``if (hparams.has_rope(il))``);
* ``qkv_flat``        -- ``build_qkv(..., reshape = false)``: Q/K/V left 2-D, unnamed
  (olmo2 norms Q and K over the whole projection before splitting heads);
* ``reshape``         -- ``ggml_reshape_Nd`` with sizes given as expressions;
* ``rope_ctx``        -- ``ggml_rope_ext`` with the context's ``freq_base`` on every layer
  and ``freq_scale`` 1 on sliding-window layers (olmo2.cpp), not ``get_rope_freq_base``;
* ``cb_model``        -- ``cb(t, name, -1)`` inside a layer (olmo2's ``ffn_post_norm``).
"""
from __future__ import annotations


from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.spec_builder import SpecBuilder, statement


def _key(sb: SpecBuilder, short: str) -> str:
    """``logit_scale`` -> ``granite.logit_scale`` (llama-arch.cpp's ``"%s.logit_scale"``)."""
    return f"{sb.m.arch}.{short}"


@statement("require_keys")
def require_keys(sb: SpecBuilder, a: list) -> None:
    """``[logit_scale, attention.layer_norm_rms_epsilon]``: keys (without the ``<arch>.``
    prefix) that ``load_arch_hparams`` reads as required."""
    md = sb.m.header.metadata
    for short in a:
        if _key(sb, short) not in md:
            raise GraphcostError(f"{sb.m.header.path}: required metadata key "
                                 f"{_key(sb, short)!r} is missing (llama.cpp refuses the model)")


@statement("unsupported_keys")
def unsupported_keys(sb: SpecBuilder, a: dict) -> None:
    """``{deepstack_mapping: "why"}``: refuse a model that has one of these keys."""
    md = sb.m.header.metadata
    for short, why in a.items():
        if _key(sb, short) in md:
            raise UnsupportedError(f"{sb.m.header.path}: {sb.m.arch} with {why} "
                                   f"({_key(sb, short)!r}) is not modelled yet")


@statement("if")
def if_(sb: SpecBuilder, a: dict) -> None:
    """``{test: "residual_scale != 0", then: [...], else: [...]}``: the test is an
    expression over the hyperparameter names (non-zero is true, as in C++)."""
    if "test" not in a:
        raise GraphcostError(sb.where("if needs a 'test' expression"))
    taken = "then" if sb.expr(a["test"]) else "else"
    sb.run_branch(f"if: {taken}", a.get(taken))


@statement("qkv_flat")
def qkv_flat(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur}``: build_qkv with ``reshape = false``; sets 2-D ``Qcur Kcur Vcur``
    ([n_head * head_dim, T] ...), named by nothing inside (no ``cb`` when not reshaping)."""
    q, k, v = build_qkv_flat(sb, sb.var(a.get("x", "cur")))
    sb.vars.update(Qcur=q, Kcur=k, Vcur=v)


def build_qkv_flat(sb: SpecBuilder, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """llm_graph_context::build_qkv(..., reshape = false) (src/llama-graph.cpp).

    Separate weights: MUL_MAT (+ ADD bias) each, unnamed. Fused ``attn_qkv``: one MUL_MAT
    named ``wqkv`` (+ bias ``wqkv_b``), then 2-D row views of it made contiguous (CONT),
    Q, K, V in that order."""
    b, g, il = sb.b, sb.g, sb.il
    wqkv = sb.weight("attn_qkv?")
    if wqkv is None:
        out = []
        for short in ("attn_q", "attn_k", "attn_v"):
            t = b.mm(sb.weight(short), cur)
            bias = sb.weight(f"{short}.bias?")
            out.append(g.add(t, bias) if bias is not None else t)
        return out[0], out[1], out[2]
    q, k, v = b.split_qkv(il, b.fused_qkv(il, cur, wqkv), per_head=False)
    return g.cont(q), g.cont(k), g.cont(v)


@statement("reshape")
def reshape(sb: SpecBuilder, a: dict) -> None:
    """``{x: Qcur, ne: [head_dim, n_head, n_tokens], cb: name, out: var}``: ggml_reshape_Nd;
    each size is an expression (``n_tokens`` is the ubatch's token count)."""
    sb.shape_op(a, "reshape", sb.g.reshape)


@statement("rope_ctx")
def rope_ctx(sb: SpecBuilder, a: dict) -> None:
    """``{x: Qcur, pos: inp_pos, cb: name, out: var}``: ggml_rope_ext with the graph
    context's ``freq_base`` (the model's, sliding layer or not) and ``freq_scale`` 1 on
    sliding-window layers (olmo2.cpp: "Olmo3 use regular rope with no yarn rope scaling")."""
    mode = sb.rope_mode
    if mode is None:
        raise GraphcostError(sb.where("rope_ctx statement in an architecture with rope: none"))
    m, il = sb.m, sb.il
    fs = 1.0 if m.n_swa > 0 and m.is_swa[il] else m.rope_freq_scale
    t = sb.b.rope(sb.var(a["x"]), sb.var(a.get("pos", "inp_pos")), None, il, mode,
                  m.rope_freq_base, fs)
    sb.vars[a.get("out", a["x"])] = sb.cb(t, a.get("cb"))


@statement("cb_model")
def cb_model(sb: SpecBuilder, a: dict) -> None:
    """``{cur: ffn_post_norm}``: ``cb(t, name, -1)`` -- a name without ``-<il>``."""
    for var, name in a.items():
        sb.g.cb(sb.var(var), name, -1)
