"""Tiny but valid GGUFs for the dense llama-like families: qwen2, qwen3, olmo2, granite.

Each writer mirrors the tensors the family's ``load_arch_tensors`` creates in the
llama.cpp vendored by llama-cpp-python 0.3.36 (``src/models/<arch>.cpp``): llama.cpp
refuses a file with a missing required tensor *or* with a tensor it did not ask for,
so every optional tensor here is one that file creates as ``TENSOR_NOT_REQUIRED``.

Sizes are odd on purpose (7 heads over 1 KV head, head_dim != n_embd / n_head, n_ff
not a power of two) and weight types are mixed (F16, Q8_0, Q4_0, Q4_K) wherever the
row length allows; see :mod:`fixtures` for ``weight_types`` and the type fallbacks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import gguf
from fixtures import QT, FixtureInfo, _add_spm_vocab, _finish, _TensorSink, swa_layers

__all__ = ["write_qwen2", "write_qwen3", "write_olmo2", "write_granite"]

# defaults per tensor kind; a type whose block does not divide the row length falls
# back (k-quant -> Q8_0 -> F16), so every fixture below still mixes four types
DENSE_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0,
    "output": QT.Q4_0,
    "attn_q": QT.Q4_0,
    "attn_k": QT.F16,
    "attn_v": QT.Q8_0,
    "attn_output": QT.Q4_K,
    "ffn_gate": QT.Q4_K,
    "ffn_up": QT.Q8_0,
    "ffn_down": QT.Q4_K,
}


def _header(path: Path, arch: str, *, n_embd: int, n_head: int, n_head_kv: int, n_ff: int,
            n_layer: int, n_vocab: int, context_length: int, rms_eps: float,
            rope_freq_base: float, head_dim: int | None) -> gguf.GGUFWriter:
    """The keys every family here reads: sizes, RMS epsilon (required), rope base."""
    if n_head % n_head_kv:
        raise ValueError("n_head must be a multiple of n_head_kv")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"graphcost-fixture-{arch}")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_freq_base(rope_freq_base)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_spm_vocab(w, n_vocab)
    return w


def _bias(sink: _TensorSink, name: str, n: int) -> None:
    sink.vector(name, n, center=0.0, spread=0.02)


def _embeddings(sink: _TensorSink, n_embd: int, n_vocab: int, tie: bool,
                output_bias: bool = False) -> None:
    # tied: the embedding is also the output matrix, so keep it small (logits O(1))
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=0.05 if tie else 0.5)
    sink.vector("output_norm.weight", n_embd)
    if not tie:
        sink.matrix("output", "output.weight", n_embd, n_vocab)
    if output_bias:
        _bias(sink, "output.bias", n_vocab)


def _ffn(sink: _TensorSink, p: str, n_embd: int, n_ff: int, biases: bool = False) -> None:
    sink.matrix("ffn_gate", p + "ffn_gate.weight", n_embd, n_ff)
    sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, n_ff)
    sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
    if biases:
        _bias(sink, p + "ffn_gate.bias", n_ff)
        _bias(sink, p + "ffn_up.bias", n_ff)
        _bias(sink, p + "ffn_down.bias", n_embd)


def _qkv(sink: _TensorSink, p: str, n_embd: int, q_dim: int, kv_dim: int,
         biases: bool) -> None:
    sink.matrix("attn_q", p + "attn_q.weight", n_embd, q_dim)
    sink.matrix("attn_k", p + "attn_k.weight", n_embd, kv_dim)
    sink.matrix("attn_v", p + "attn_v.weight", n_embd, kv_dim)
    if biases:
        _bias(sink, p + "attn_q.bias", q_dim)
        _bias(sink, p + "attn_k.bias", kv_dim)
        _bias(sink, p + "attn_v.bias", kv_dim)


def _info(path: Path, arch: str, sink: _TensorSink, *, n_vocab, n_embd, n_head, n_head_kv,
          head_dim, n_ff, n_layer, context_length, tie, sliding_window=0,
          layers_swa=None) -> FixtureInfo:
    return FixtureInfo(path=path, arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                       n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_layer=n_layer,
                       context_length=context_length, tie_embeddings=tie,
                       sliding_window=sliding_window,
                       swa_layers=layers_swa or [False] * n_layer, tensor_types=sink.types)


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
    path = Path(path)
    hd = n_embd // n_head
    w = _header(path, "qwen2", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=None)
    sink = _TensorSink(w, np.random.default_rng(seed), weight_types, DENSE_DEFAULT_TYPES)
    _embeddings(sink, n_embd, n_vocab, tie_embeddings, output_bias)
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        _qkv(sink, p, n_embd, n_embd, n_head_kv * hd, biases=True)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        _ffn(sink, p, n_embd, n_ff)
    _finish(w)
    return _info(path, "qwen2", sink, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                 n_head_kv=n_head_kv, head_dim=hd, n_ff=n_ff, n_layer=n_layer,
                 context_length=context_length, tie=tie_embeddings)


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
    path = Path(path)
    w = _header(path, "qwen3", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim)
    sink = _TensorSink(w, np.random.default_rng(seed), weight_types, DENSE_DEFAULT_TYPES)
    _embeddings(sink, n_embd, n_vocab, tie_embeddings)
    q_dim = n_head * head_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        _qkv(sink, p, n_embd, q_dim, n_head_kv * head_dim, biases=False)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "attn_k_norm.weight", head_dim)
        sink.vector(p + "attn_q_norm.weight", head_dim)
        sink.vector(p + "ffn_norm.weight", n_embd)
        _ffn(sink, p, n_embd, n_ff)
    _finish(w)
    return _info(path, "qwen3", sink, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                 n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_layer=n_layer,
                 context_length=context_length, tie=tie_embeddings)


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
    path = Path(path)
    hd = n_embd // n_head
    w = _header(path, "olmo2", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=None)
    layers = [False] * n_layer
    if sliding_window:
        w.add_sliding_window(sliding_window)
        key = gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch="olmo2")
        if isinstance(swa_pattern, int):
            w.add_uint32(key, swa_pattern)
        elif swa_pattern is not None:
            w.add_array(key, [bool(x) for x in swa_pattern])
        layers = swa_layers(n_layer, 4 if swa_pattern is None else swa_pattern)
    sink = _TensorSink(w, np.random.default_rng(seed), weight_types, DENSE_DEFAULT_TYPES)
    _embeddings(sink, n_embd, n_vocab, tie=False)
    kv_dim = n_head_kv * hd
    for i in range(n_layer):
        p = f"blk.{i}."
        if fused_qkv:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, n_embd + 2 * kv_dim)
            if qkv_bias:
                _bias(sink, p + "attn_qkv.bias", n_embd + 2 * kv_dim)
        else:
            _qkv(sink, p, n_embd, n_embd, kv_dim, biases=qkv_bias)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        sink.vector(p + "attn_q_norm.weight", n_embd)
        sink.vector(p + "attn_k_norm.weight", kv_dim)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        _ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
    _finish(w)
    return _info(path, "olmo2", sink, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                 n_head_kv=n_head_kv, head_dim=hd, n_ff=n_ff, n_layer=n_layer,
                 context_length=context_length, tie=False, sliding_window=sliding_window,
                 layers_swa=layers)


def write_granite(
    path: str | Path, *, n_embd: int = 256, n_head: int = 4, n_head_kv: int = 2,
    n_ff: int = 544, n_layer: int = 3, n_vocab: int = 299, tie_embeddings: bool = False,
    biases: bool = True, rope_freqs: bool = False, rope_finetuned: bool | None = None,
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
    ``rope_freqs.weight``."""
    path = Path(path)
    hd = n_embd // n_head
    arch = "granite"
    w = _header(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=None)
    if logit_scale is not None:
        w.add_logit_scale(logit_scale)
    if embedding_scale is not None:
        w.add_embedding_scale(embedding_scale)
    if residual_scale is not None:
        w.add_residual_scale(residual_scale)
    if attention_scale is not None:
        w.add_attention_scale(attention_scale)
    if rope_finetuned is not None:
        w.add_rope_scaling_finetuned(rope_finetuned)
    sink = _TensorSink(w, np.random.default_rng(seed), weight_types, DENSE_DEFAULT_TYPES)
    _embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, hd // 2).astype(np.float32))
        sink.types["rope_freqs.weight"] = "F32"
    kv_dim = n_head_kv * hd
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        _qkv(sink, p, n_embd, n_embd, kv_dim, biases=biases)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        if biases:
            _bias(sink, p + "attn_output.bias", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        _ffn(sink, p, n_embd, n_ff, biases=biases)
    _finish(w)
    return _info(path, arch, sink, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                 n_head_kv=n_head_kv, head_dim=hd, n_ff=n_ff, n_layer=n_layer,
                 context_length=context_length, tie=tie_embeddings)
