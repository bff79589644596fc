"""Statements for the classic (pre-llama) families: gpt2, starcoder2, falcon, phi3.

Most of what these need is in the core: LayerNorm with bias is ``norm`` with ``kind:
layer`` and ``bias``; the fused QKV path is ``qkv`` (``build_qkv`` takes it when the layer
has ``attn_qkv.weight``); the gate-less FFN is ``ffn`` with ``kind: seq``. What is left:

* ``get_rows``     -- ``ggml_get_rows(weight, rows)``: GPT-2's learned position embeddings;
* ``when``         -- run statements only if a tensor is in the file (Falcon-40B's second
  attention norm);
* ``rope_factors`` -- ``llama_model::get_rope_factors``: the per-layer RoPE frequency
  factors, LongRoPE's long or short set chosen by the context size (Phi-3).
"""
from __future__ import annotations

from graphcost.errors import GraphcostError
from graphcost.graph.spec_builder import SpecBuilder, statement


@statement("get_rows")
def get_rows(sb: SpecBuilder, a: dict) -> None:
    """``{weight: position_embd, rows: inp_pos, cb: pos_embd, out: pos}``"""
    t = sb.g.get_rows(sb.weight(a["weight"]), sb.var(a.get("rows", "inp_pos")))
    sb.vars[a["out"]] = sb.cb(t, a.get("cb"))


@statement("when")
def when(sb: SpecBuilder, a: dict) -> None:
    """``{tensor: attn_norm_2, then: [...], else: [...]}``: a C++ ``if (layer.x)`` on an
    optional tensor (short name, as in other statements)."""
    if "tensor" not in a:
        raise GraphcostError(sb.where("when needs a 'tensor' to test"))
    name = str(a["tensor"]).rstrip("?") + "?"
    taken = "then" if sb.weight(name) is not None else "else"
    sb.run_branch(f"when: {taken}", a.get(taken))


@statement("rope_factors")
def rope_factors(sb: SpecBuilder, a: dict) -> None:
    """``{out: rope_factors}``: llama_model::get_rope_factors(cparams, il) -- the
    ``rope_freqs`` tensor if there is one, else ``rope_factors_long`` when n_ctx_seq
    (one sequence's context: n_ctx / n_seq_max padded, with -np N and no -kvu) exceeds
    n_ctx_orig_yarn, else ``rope_factors_short``; any of them may be absent (then no
    factors). Use with ``rope: {factors_var: ...}``."""
    f = sb.weight("/rope_freqs?")
    if f is None:
        long = sb.b.run.n_ctx_seq > sb.m.n_ctx_orig_yarn
        f = sb.weight("/rope_factors_long?" if long else "/rope_factors_short?")
    sb.vars[a.get("out", "rope_factors")] = f
