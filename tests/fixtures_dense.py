"""Tiny but valid GGUFs for the dense llama-like families: qwen2, qwen3, olmo2, granite.

Each writer mirrors the tensors the family's ``load_arch_tensors`` creates in the
llama.cpp vendored by llama-cpp-python 0.3.36 (``src/models/<arch>.cpp``): llama.cpp
refuses a file with a missing required tensor *or* with a tensor it did not ask for,
so every optional tensor here is one that file creates as ``TENSOR_NOT_REQUIRED``.

Sizes are odd on purpose (7 heads over 1 KV head, head_dim != n_embd / n_head, n_ff
not a power of two) and weight types are mixed (F16, Q8_0, Q4_0, Q4_K) wherever the
row length allows; see :mod:`gguf_writer` for ``weight_types`` and the type fallbacks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from gguf_writer import (ATTN_TYPES, QT, FixtureInfo, attention, bias, done, embeddings, ffn,
                         ffn_types, granite_keys, llama_layers, longrope, qk_norms, qkv, rope_freqs_tensor,
                         sliding_window_keys, start, swa_layers)

__all__ = ["write_qwen2", "write_qwen3", "write_olmo2", "write_granite"]

# defaults per tensor kind; a type whose block does not divide the row length falls
# back (k-quant -> Q8_0 -> F16), so every fixture below still mixes four types
DENSE_DEFAULT_TYPES: dict[str, QT] = {**ATTN_TYPES, "output": QT.Q4_0, "attn_output": QT.Q4_K,
                                       **ffn_types(QT.Q4_K, QT.Q8_0, QT.Q4_K)}


def write_qwen2(
    path: str | Path, *, n_embd: int = 224, n_head: int = 7, n_head_kv: int = 1,
    n_ff: int = 768, n_layer: int = 3, n_vocab: int = 301, tie_embeddings: bool = False,
    output_bias: bool = True, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 1_000_000.0, rms_eps: float = 1e-6,
    seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen2``: Q/K/V biases (as every Qwen2 has), optional ``output.bias``.

    Default: 7 heads over 1 KV head of 32, n_ff 768 (Q4_K ffn_down), untied output
    with a bias."""
    sink = start(path, "qwen2", DENSE_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base)
    embeddings(sink, n_embd, n_vocab, tie_embeddings, output_bias)
    llama_layers(sink, n_layer, n_embd, n_embd, n_head_kv * (n_embd // n_head), n_ff,
                 qkv_bias=True)
    return done(sink, tie=tie_embeddings)


def write_qwen3(
    path: str | Path, *, n_embd: int = 256, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_ff: int = 544, n_layer: int = 3, n_vocab: int = 333,
    tie_embeddings: bool = True, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 1_000_000.0, rms_eps: float = 1e-6,
    seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen3``: per-head Q/K RMS norms, head_dim independent of n_embd / n_head.

    Default: 6 heads of 64 (q width 384 > n_embd 256; head_dim 64 takes the Hadamard
    path for quantized KV), 2 KV heads, n_ff 544 (17 * 32), tied embeddings."""
    sink = start(path, "qwen3", DENSE_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    llama_layers(sink, n_layer, n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff,
                 qk_norm=head_dim)
    return done(sink, tie=tie_embeddings)


def write_olmo2(
    path: str | Path, *, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2,
    n_ff: int = 640, n_layer: int = 3, n_vocab: int = 317, sliding_window: int = 0,
    swa_pattern: int | Sequence[bool] | None = None, fused_qkv: bool = False,
    qkv_bias: bool = False,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    rope_freq_base: float = 500_000.0, rms_eps: float = 1e-6, seed: int = 0,
) -> FixtureInfo:
    """Arch ``olmo2``: no pre-norms; Q/K RMS norms over the whole projection; post-attention
    and post-FFN norms; an output matrix is required (never tied).

    ``sliding_window > 0`` writes ``attention.sliding_window`` (the OLMo 3 layout:
    llama.cpp then builds the iSWA graph, pattern default 4: three sliding layers, then
    one global). ``fused_qkv`` writes one ``attn_qkv`` matrix instead of three;
    ``qkv_bias`` adds the optional Q/K/V biases (fused: one ``attn_qkv.bias``)."""
    sink = start(path, "olmo2", DENSE_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base)
    layers = None
    if sliding_window:
        sliding_window_keys(sink.w, "olmo2", sliding_window, swa_pattern)
        layers = swa_layers(n_layer, 4 if swa_pattern is None else swa_pattern)
    embeddings(sink, n_embd, n_vocab, tie=False)
    kv_dim = n_head_kv * (n_embd // n_head)
    for i in range(n_layer):
        p = f"blk.{i}."
        if fused_qkv:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, n_embd + 2 * kv_dim)
            if qkv_bias:
                bias(sink, p + "attn_qkv.bias", n_embd + 2 * kv_dim)
        else:
            qkv(sink, p, n_embd, n_embd, kv_dim, biases=qkv_bias)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        qk_norms(sink, p, n_embd, kv_dim)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
    return done(sink, tie=False, sliding_window=sliding_window, layers_swa=layers)


def write_granite(
    path: str | Path, *, n_embd: int = 256, n_head: int = 4, n_head_kv: int = 2,
    n_ff: int = 544, n_layer: int = 3, n_vocab: int = 299, tie_embeddings: bool = False,
    biases: bool = True, rope_freqs: bool = False, rope_finetuned: bool | None = None,
    longrope_ctx: int | None = None,
    embedding_scale: float | None = 12.0, residual_scale: float | None = 0.22,
    logit_scale: float | None = 8.0, attention_scale: float | None = 0.015625,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    rope_freq_base: float = 10_000.0, rms_eps: float = 1e-5, seed: int = 0,
) -> FixtureInfo:
    """Arch ``granite``: embedding, residual, attention and logit multipliers.

    ``None`` leaves a key out (llama.cpp refuses a granite file without
    ``logit_scale``). ``biases`` adds the optional Q/K/V, attention-output and FFN
    biases; ``rope_finetuned=False`` writes ``rope.scaling.finetuned = false``, which
    granite uses to switch rope off; ``rope_freqs`` adds the optional
    ``rope_freqs.weight``; ``longrope_ctx=N`` LongRoPE's long/short factors with original
    context N (:func:`gguf_writer.longrope`)."""
    hd = n_embd // n_head
    sink = start(path, "granite", DENSE_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base)
    granite_keys(sink.w, logit_scale=logit_scale, embedding_scale=embedding_scale,
                 residual_scale=residual_scale, attention_scale=attention_scale,
                 rope_finetuned=rope_finetuned)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_freqs:
        rope_freqs_tensor(sink, hd // 2)
    if longrope_ctx is not None:
        longrope(sink, hd // 2, longrope_ctx)
    kv_dim = n_head_kv * hd
    for i in range(n_layer):
        p = f"blk.{i}."
        attention(sink, p, n_embd, n_embd, kv_dim, biases=biases)
        if biases:
            bias(sink, p + "attn_output.bias", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff, biases=biases)
    return done(sink, tie=tie_embeddings)
