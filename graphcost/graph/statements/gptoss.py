"""Statements for gpt-oss (``src/models/openai-moe.cpp``) beyond the core and ``moe_ffn``.

gpt-oss needs three constructs the first families lacked; two are arguments of existing
statements and one is a statement here:

* attention sinks -- ``attention: {sinks: attn_sinks}``: llama.cpp attaches the per-head
  sink logits to FLASH_ATTN_EXT (``ggml_flash_attn_ext_add_sinks``, ``src[4]``) or to the
  SOFT_MAX (``ggml_soft_max_add_sinks``, ``src[2]``);
* expert biases and the clamped SwiGLU -- ``moe_ffn: {up_bias, gate_bias, down_bias,
  act: swiglu_oai, gating: softmax_weight}``: ADD_ID after each MUL_MAT_ID, SWIGLU_OAI;
* ``get_rows_out`` -- the output rows are picked **after** the layer loop, from the final
  hidden state (``if (!cparams.embeddings_nextn_masked && inp_out_ids) cur =
  ggml_get_rows(ctx0, cur, inp_out_ids)``; ``embeddings_nextn_masked`` is false unless a
  NextN/MTP head asks for it), not inside the last layer as ``select_rows`` does.
"""
from __future__ import annotations

from graphcost.graph.spec_builder import SpecBuilder, statement


@statement("get_rows_out")
def get_rows_out(sb: SpecBuilder, a: dict) -> None:
    """``{x: cur, out: cur}``: ``ggml_get_rows(x, out_ids)`` (unnamed), in the epilogue."""
    t = sb.g.get_rows(sb.var(a.get("x", "cur")), sb.var("out_ids"))
    sb.vars[a.get("out", a.get("x", "cur"))] = sb.cb(t, a.get("cb"))
