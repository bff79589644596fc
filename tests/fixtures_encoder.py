"""Tiny but valid GGUFs (llama.cpp loads and runs them) for the embedding encoders:

* :func:`write_bert` -- arch ``bert``: learned position embeddings, optional token-type
  embeddings, embedding LayerNorm, separate or fused Q/K/V with biases, post-attention and
  post-FFN LayerNorms, GELU FFN with biases, a pooling type, optional classification
  heads (``cls``, ``cls.output``) for RANK pooling.

* ``write_bert(..., arch="nomic-bert")`` -- nomic-bert (``src/models/nomic-bert.cpp``): no
  position embeddings (NEOX RoPE instead), a gated FFN without biases, token types required.
The writer mirrors ``llama_model_bert::load_arch_tensors`` (src/models/bert.cpp in the
llama.cpp vendored by llama-cpp-python 0.3.36): llama.cpp refuses a missing required
tensor and any tensor it did not ask for. Shared machinery (vocabulary, weight makers,
type choice) comes from :mod:`gguf_writer`; ``weight_types`` works the same way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import gguf
from gguf_writer import QT, FixtureInfo, bias, done, layer_norm, start

__all__ = ["write_bert"]

BERT_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "position_embd": QT.F16, "token_types": QT.F32,
    "attn_q": QT.Q4_0, "attn_k": QT.F16, "attn_v": QT.Q8_0, "attn_qkv": QT.Q4_0,
    "attn_output": QT.Q8_0, "ffn_up": QT.Q4_0, "ffn_down": QT.Q4_K, "cls": QT.F16,
    "cls.output": QT.F16,
}


def write_bert(path: str | Path, *, n_embd: int = 160, n_head: int = 5, n_ff: int = 416,
               n_layer: int = 2, n_vocab: int = 301, context_length: int = 512,
               pooling: gguf.PoolingType | None = gguf.PoolingType.MEAN,
               token_types: int = 2, fused_qkv: bool = False, qkv_bias: bool = True,
               out_bias: bool = True, ffn_bias: bool = True, cls: bool = False,
               cls_out: int = 0, causal: bool | None = False,
               weight_types: Mapping[str, QT] | None = None,
               norm_eps: float | None = 1e-12, arch: str = "bert",
               seed: int = 0) -> FixtureInfo:
    """Arch ``bert``. Default: 5 heads of 32 (n_embd 160), n_ff 416, 2 layers, two token
    types, MEAN pooling, separate Q/K/V with biases. ``pooling=None`` writes no
    ``bert.pooling_type`` (llama.cpp: NONE); ``token_types=0`` writes a type count of 1
    and no ``token_types`` tensor (it is optional; the count is required); ``cls``/
    ``cls_out`` (labels) add RANK's classification heads; ``causal=None`` leaves out
    ``bert.attention.causal``. ``context_length`` rows of position embeddings must cover
    every position a test encodes."""
    nomic = arch == "nomic-bert"

    def encoder_keys(w: gguf.GGUFWriter) -> None:
        if norm_eps is not None:  # required by llama.cpp: None writes a file it refuses
            w.add_layer_norm_eps(norm_eps)
        if causal is not None:
            w.add_causal_attention(causal)
        if pooling is not None:
            w.add_pooling_type(pooling)

    sink = start(path, arch, BERT_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=None, n_ff=n_ff, n_layer=n_layer,
                 n_vocab=n_vocab, context_length=context_length, rms_eps=None,
                 rope_freq_base=1000.0 if nomic else None, after={"rope.freq_base": encoder_keys})
    sink.w.add_token_type_count(max(token_types, 1))
    if cls_out:
        sink.w.add_array(gguf.Keys.Classifier.OUTPUT_LABELS.format(arch=arch),
                         [f"label{i}" for i in range(cls_out)])
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=0.5)
    if token_types:
        sink.matrix("token_types", "token_types.weight", n_embd, token_types, scale=0.1)
    if not nomic:
        sink.matrix("position_embd", "position_embd.weight", n_embd, context_length, scale=0.1)
    if cls:
        sink.matrix("cls", "cls.weight", n_embd, n_embd)
        bias(sink, "cls.bias", n_embd)
    if cls_out:
        sink.matrix("cls.output", "cls.output.weight", n_embd, cls_out)
        bias(sink, "cls.output.bias", cls_out)
    layer_norm(sink, "token_embd_norm", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        if fused_qkv:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, 3 * n_embd)
            if qkv_bias:
                bias(sink, p + "attn_qkv.bias", 3 * n_embd)
        else:
            for x in "qkv":
                sink.matrix(f"attn_{x}", p + f"attn_{x}.weight", n_embd, n_embd)
                if qkv_bias:
                    bias(sink, p + f"attn_{x}.bias", n_embd)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        if out_bias:
            bias(sink, p + "attn_output.bias", n_embd)
        layer_norm(sink, p + "attn_output_norm", n_embd)
        sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, n_ff)
        sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
        if nomic:
            sink.matrix("ffn_gate", p + "ffn_gate.weight", n_embd, n_ff)
        elif ffn_bias:
            bias(sink, p + "ffn_up.bias", n_ff)
            bias(sink, p + "ffn_down.bias", n_embd)
        layer_norm(sink, p + "layer_output_norm", n_embd)
    return done(sink, tie=False, n_head_kv=n_head)
