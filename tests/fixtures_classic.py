"""Tiny but valid GGUFs (llama.cpp loads and runs them) for the classic families:

* :func:`write_gpt2`       -- learned position embeddings, LayerNorm with bias, fused QKV
  with bias, GELU FFN with biases, no RoPE;
* :func:`write_starcoder2` -- separate (or fused) Q/K/V with biases, NEOX RoPE, GELU FFN
  with biases;
* :func:`write_falcon`     -- parallel attention + FFN, fused QKV, MQA/GQA, optional
  second attention norm (Falcon-40B);
* :func:`write_phi3`       -- fused (or separate) QKV, RMS norms, [2F] SWIGLU FFN,
  LongRoPE factors with an original context length.

Shared machinery (vocabulary, weight makers, type choice) comes from :mod:`gguf_writer`;
``weight_types`` works the same way (a tensor kind such as ``"attn_qkv"`` or a full
name). Default types mix F16/Q8_0/Q4_0/Q4_K and fall back (k-quant -> Q8_0 -> F16) where a
row length does not fit the block size; norm weights, biases and RoPE factors are F32.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from gguf_writer import (QT, FixtureInfo, TensorSink, bias, done, embeddings, ffn, layer_norm, longrope,
                         start)

__all__ = ["write_gpt2", "write_starcoder2", "write_falcon", "write_phi3"]

GPT2_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "position_embd": QT.F16, "output": QT.Q4_0,
    "attn_qkv": QT.Q4_0, "attn_output": QT.F16, "ffn_up": QT.Q8_0, "ffn_down": QT.Q4_K,
}
STARCODER2_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "attn_q": QT.Q4_K, "attn_k": QT.F16, "attn_v": QT.Q8_0,
    "attn_qkv": QT.Q4_0, "attn_output": QT.Q4_0, "ffn_up": QT.Q4_K, "ffn_down": QT.Q8_0,
}
FALCON_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "output": QT.F16, "attn_qkv": QT.Q4_0, "attn_output": QT.Q8_0,
    "ffn_up": QT.Q4_0, "ffn_down": QT.Q4_K,
}
PHI3_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "output": QT.Q4_0, "attn_qkv": QT.Q4_0, "attn_q": QT.Q4_0,
    "attn_k": QT.F16, "attn_v": QT.Q8_0, "attn_output": QT.F16, "ffn_up": QT.Q8_0,
    "ffn_down": QT.Q4_K,
}


def _start(path: str | Path, arch: str, defaults: Mapping[str, QT], **kw) -> TensorSink:
    """:func:`gguf_writer.start` without RMS epsilon and rope base (each family adds its
    own), named ``graphcost-fixture-<arch>`` but not "phi3": llama-vocab.cpp gives models
    named phi-3/phi3 special tokens our tiny vocabulary lacks (<|endoftext|>) and then
    fails to load."""
    return start(path, arch, defaults, rms_eps=None, rope_freq_base=None,
                 name=f"graphcost-fixture-{arch.replace('phi3', 'p3')}", **kw)


def _mlp(sink: TensorSink, p: str, n_embd: int, n_ff: int) -> None:
    """The GELU MLP of gpt2 and starcoder2: ``ffn_up`` and ``ffn_down``, each with its bias."""
    sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, n_ff)
    bias(sink, p + "ffn_up.bias", n_ff)
    sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
    bias(sink, p + "ffn_down.bias", n_embd)


def write_gpt2(path: str | Path, *, n_embd: int = 192, n_head: int = 3, n_ff: int = 512,
               n_layer: int = 2, n_vocab: int = 301, context_length: int = 1024,
               tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None,
               norm_eps: float = 1e-5, seed: int = 0) -> FixtureInfo:
    """Arch ``gpt2``. ``context_length`` is also the number of position embeddings: it must
    cover every position a test decodes (llama.cpp's GET_ROWS asserts on it)."""
    sink = _start(path, "gpt2", GPT2_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                  n_embd=n_embd, n_head=n_head, n_head_kv=None, n_ff=n_ff, n_layer=n_layer,
                  n_vocab=n_vocab, context_length=context_length)
    sink.w.add_layer_norm_eps(norm_eps)
    embeddings(sink, n_embd, n_vocab, tie_embeddings, norm_bias=True)
    sink.matrix("position_embd", "position_embd.weight", n_embd, context_length, scale=0.1)
    for i in range(n_layer):
        p = f"blk.{i}."
        layer_norm(sink, p + "attn_norm", n_embd)
        sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, 3 * n_embd)
        bias(sink, p + "attn_qkv.bias", 3 * n_embd)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        bias(sink, p + "attn_output.bias", n_embd)
        layer_norm(sink, p + "ffn_norm", n_embd)
        _mlp(sink, p, n_embd, n_ff)
    return done(sink, tie=tie_embeddings, n_head_kv=n_head)


def write_starcoder2(path: str | Path, *, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2,
                     n_ff: int = 736, n_layer: int = 2, n_vocab: int = 307,
                     context_length: int = 4096, fused_qkv: bool = False,
                     qkv_bias: bool = True, tie_embeddings: bool = True,
                     weight_types: Mapping[str, QT] | None = None, norm_eps: float = 1e-5,
                     seed: int = 0) -> FixtureInfo:
    """Arch ``starcoder2`` (tied embeddings like the real 3B/7B files)."""
    hd = n_embd // n_head
    sink = _start(path, "starcoder2", STARCODER2_DEFAULT_TYPES, weight_types=weight_types,
                  seed=seed, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, context_length=context_length)
    sink.w.add_layer_norm_eps(norm_eps)
    sink.w.add_rope_freq_base(100000.0)
    embeddings(sink, n_embd, n_vocab, tie_embeddings, norm_bias=True)
    kv = n_head_kv * hd
    for i in range(n_layer):
        p = f"blk.{i}."
        layer_norm(sink, p + "attn_norm", n_embd)
        if fused_qkv:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, n_embd + 2 * kv)
            if qkv_bias:
                bias(sink, p + "attn_qkv.bias", n_embd + 2 * kv)
        else:
            for x, n in (("q", n_embd), ("k", kv), ("v", kv)):
                sink.matrix(f"attn_{x}", f"{p}attn_{x}.weight", n_embd, n)
                if qkv_bias:
                    bias(sink, f"{p}attn_{x}.bias", n)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        bias(sink, p + "attn_output.bias", n_embd)
        layer_norm(sink, p + "ffn_norm", n_embd)
        _mlp(sink, p, n_embd, n_ff)
    return done(sink, tie=tie_embeddings)


def write_falcon(path: str | Path, *, n_embd: int = 320, n_head: int = 5, n_head_kv: int = 1,
                 n_ff: int = 1280, n_layer: int = 2, n_vocab: int = 311,
                 context_length: int = 2048, attn_norm_2: bool = False,
                 tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None,
                 norm_eps: float = 1e-5, seed: int = 0) -> FixtureInfo:
    """Arch ``falcon``: 7B style (one norm, MQA) by default; ``attn_norm_2=True`` gives the
    40B style (attention and FFN each get their own LayerNorm)."""
    hd = n_embd // n_head
    sink = _start(path, "falcon", FALCON_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                  n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_layer=n_layer,
                  n_vocab=n_vocab, context_length=context_length)
    sink.w.add_layer_norm_eps(norm_eps)
    embeddings(sink, n_embd, n_vocab, tie_embeddings, norm_bias=True)
    for i in range(n_layer):
        p = f"blk.{i}."
        layer_norm(sink, p + "attn_norm", n_embd)
        if attn_norm_2:
            layer_norm(sink, p + "attn_norm_2", n_embd)
        sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, n_embd + 2 * n_head_kv * hd)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        ffn(sink, p, n_embd, n_ff, order=("up", "down"))
    return done(sink, tie=tie_embeddings)


def write_phi3(path: str | Path, *, n_embd: int = 288, n_head: int = 3, n_head_kv: int = 3,
               n_ff: int = 512, n_layer: int = 2, n_vocab: int = 313,
               context_length: int = 4096, original_context_length: int | None = 256,
               rope_factors: bool = True, qkv: str = "fused",
               tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None,
               rms_eps: float = 1e-5, seed: int = 0) -> FixtureInfo:
    """Arch ``phi3``. ``qkv``: ``"fused"`` (attn_qkv), ``"fused_split_bias"`` (attn_qkv plus
    separate Q/K/V biases: llama.cpp CONCATs them), ``"separate"`` (attn_q/k/v).
    ``rope_factors`` writes LongRoPE's ``rope_factors_long/short`` ([head_dim/2] each) and
    ``original_context_length`` the context above which llama.cpp uses the long ones."""
    hd = n_embd // n_head
    sink = _start(path, "phi3", PHI3_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                  n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_layer=n_layer,
                  n_vocab=n_vocab, context_length=context_length)
    sink.w.add_layer_norm_rms_eps(rms_eps)
    sink.w.add_rope_dimension_count(hd)
    if original_context_length is not None:
        sink.w.add_rope_scaling_orig_ctx_len(original_context_length)
        sink.w.add_rope_scaling_attn_factors(1.19)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_factors:
        longrope(sink, hd // 2)
    kv = n_head_kv * hd
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        if qkv in ("fused", "fused_split_bias"):
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, n_embd + 2 * kv)
        if qkv == "separate":
            for x, n in (("q", n_embd), ("k", kv), ("v", kv)):
                sink.matrix(f"attn_{x}", f"{p}attn_{x}.weight", n_embd, n)
        if qkv == "fused_split_bias":
            for x, n in (("q", n_embd), ("k", kv), ("v", kv)):
                bias(sink, f"{p}attn_{x}.bias", n)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, 2 * n_ff)
        sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
    return done(sink, tie=tie_embeddings)
