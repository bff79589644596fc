"""Statements for the embedding encoders (``bert``): no KV cache, non-causal attention over
the ubatch's own keys, token-type embeddings, and the pooling llama.cpp adds after the
architecture's graph.

* ``view_1d``            -- ``ggml_view_1d(weight, n, offset)`` (bert's token-type row 0:
  "token types are hardcoded to zero");
* ``cb_at``              -- ``cb(t, name, il)`` with an explicit layer (bert names its
  embedding norm ``inp_norm-0`` from outside the layer loop);
* ``attn_inp_no_cache``  -- ``build_attn_inp_no_cache`` (src/llama-graph.cpp): the mask;
* ``attention_no_cache`` -- ``build_attn`` for ``llm_graph_input_attn_no_cache``;
* ``pooling``            -- ``llama_model::build_graph``'s ``build_pooling`` with the
  model's ``cls``/``cls.output`` heads, when embeddings are on (``--embeddings``).
"""
from __future__ import annotations

from gguf import Keys

from graphcost.errors import GraphcostError
from graphcost.format.ggml_types import row_size
from graphcost.graph.spec_builder import SpecBuilder, statement

#: LLM_KV_CLASSIFIER_POOLING_TYPE (src/llama-arch.cpp); gguf 0.19 on PyPI predates the key
CLASSIFIER_POOLING_TYPE = getattr(Keys.Classifier, "POOLING_TYPE",
                                  "{arch}.classifier.pooling_type")


@statement("view_1d")
def view_1d(sb: SpecBuilder, a: dict) -> None:
    """``{weight: token_types, n: n_embd, offset: 0, out: type_row0}``: the first ``n``
    elements of a weight as a 1-D view (offset in elements)."""
    w = sb.weight(a["weight"])
    n, offs = int(sb.expr(a.get("n", "n_embd"))), int(sb.expr(a.get("offset", 0)))
    if n <= 0 or offs < 0 or offs + n > w.n_elements:
        raise GraphcostError(sb.where(f"view_1d of {a['weight']}: {n} elements at {offs} do "
                                      f"not fit its {w.n_elements}"))
    sb.vars[a["out"]] = sb.g.view(w, [n], offset=row_size(w.type, offs))


@statement("cb_at")
def cb_at(sb: SpecBuilder, a: dict) -> None:
    """``{layer: 0, inpL: inp_norm}``: ``cb(var, name, layer)``."""
    a = dict(a)
    layer = int(a.pop("layer"))
    for var, name in a.items():
        sb.g.cb(sb.var(var), name, layer)


@statement("attn_inp_no_cache")
def attn_inp_no_cache(sb: SpecBuilder, a: dict) -> None:
    """``{out: inp_attn}``: build_attn_inp_no_cache (the mask; no KV cache exists)."""
    sb.vars[a.get("out", "inp_attn")] = sb.b.build_attn_inp_no_cache()


@statement("attention_no_cache")
def attention_no_cache(sb: SpecBuilder, a: dict) -> None:
    """``{wo: attn_output, wo_bias: attn_output.bias?, kq_scale: ..., cb: kqv_out, out: cur}``:
    build_attn over ``Qcur Kcur Vcur`` (or ``q k v``) with the mask in ``inp_attn``."""
    t = sb.b.build_attn_no_cache(
        sb.var(a.get("inp", "inp_attn")), sb.weight(a.get("wo", "attn_output")),
        sb.weight(a.get("wo_bias", "attn_output.bias?")), sb.var(a.get("q", "Qcur")),
        sb.var(a.get("k", "Kcur")), sb.var(a.get("v", "Vcur")),
        sb.expr(a.get("kq_scale", "1/sqrt(head_dim)")), sb.il)
    sb.vars[a.get("out", "cur")] = sb.cb(t, a.get("cb"))


@statement("pooling")
def pooling(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur}``: build_pooling(cls, cls_b, cls_out, cls_out_b) when the run asks for
    embeddings (cparams.embeddings); nothing otherwise. The pooling type is the GGUF's
    ``<arch>.pooling_type`` (llama_context: cparams.pooling_type UNSPECIFIED takes the
    model's, absent means NONE); RANK's first step follows ``<arch>.classifier.pooling_type``."""
    if not sb.b.run.settings.embeddings:
        return
    md = sb.m.header.metadata
    key = Keys.LLM.POOLING_TYPE.format(arch=sb.m.arch)
    ptype = md.get(key, 0)
    if isinstance(ptype, bool) or not isinstance(ptype, int):
        raise GraphcostError(f"{sb.m.header.path}: metadata key {key!r} must be an integer")
    cls_key = CLASSIFIER_POOLING_TYPE.format(arch=sb.m.arch)
    rank_mean = md.get(cls_key, 0) == 1  # LLAMA_POOLING_TYPE_MEAN
    t = sb.b.build_pooling(sb.var(a.get("x", "cur")), ptype,
                           sb.weight("/cls?"), sb.weight("/cls.bias?"),
                           sb.weight("/cls.output?"), sb.weight("/cls.output.bias?"),
                           rank_mean=rank_mean)
    sb.vars[a.get("out", "pooled")] = t
