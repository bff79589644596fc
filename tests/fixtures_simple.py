"""Tiny but valid GGUFs for the families that mostly reuse existing statements: qwen2moe,
olmoe, smollm3, seed_oss, glm4, exaone4, cohere2, mistral3, qwen3vl and qwen3vlmoe.

Each writer mirrors the tensors the family's ``load_arch_tensors`` creates in the
llama.cpp vendored by llama-cpp-python 0.3.36 (``src/models/<arch>.cpp``; llama.cpp
refuses a missing required tensor and any tensor it did not ask for). Sizes are odd on
purpose (7 or 6 heads over fewer KV heads, head_dim != n_embd / n_head where the family
allows it, expert widths of 96 or 160) and weight types are mixed; the helpers come from
:mod:`gguf_writer`, the dense default types from :mod:`fixtures_dense`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import gguf
from gguf_writer import (GATE_DOWN_UP, QT, FixtureInfo, TensorSink, attention, done, embeddings,
                         expert_counts, ffn, ffn_types, llama_layers, moe, qk_norms, qkv,
                         rope_freqs_tensor, start, swa_layers)
from fixtures_dense import DENSE_DEFAULT_TYPES

__all__ = ["write_qwen2moe", "write_olmoe", "write_smollm3", "write_seed_oss", "write_glm4",
           "write_exaone4", "write_cohere2", "write_mistral3", "write_qwen3vl",
           "write_qwen3vlmoe", "write_llama4"]

#: dense defaults plus the router and experts (fallbacks as in gguf_writer.pick_type)
TYPES: dict[str, QT] = {**DENSE_DEFAULT_TYPES, "ffn_gate_inp": QT.F16,
                        **ffn_types(QT.Q8_0, QT.Q4_0, QT.Q4_1, "_exps"),
                        **ffn_types(QT.Q5_0, QT.Q8_0, QT.Q4_0, "_shexp")}


def _key(arch: str, template: str) -> str:
    return template.format(arch=arch)


def _nextn_extras(sink: TensorSink, p: str, n_embd: int, shared_head_norm: bool = True) -> None:
    """A NextN/MTP block's own tensors (``load_arch_tensors``: ``nextn.eh_proj`` [2 n_embd,
    n_embd], ``enorm``, ``hnorm``, optional ``shared_head_norm``), after the layer's."""
    sink.matrix("nextn.eh_proj", p + "nextn.eh_proj.weight", 2 * n_embd, n_embd)
    sink.vector(p + "nextn.enorm.weight", n_embd)
    sink.vector(p + "nextn.hnorm.weight", n_embd)
    if shared_head_norm:
        sink.vector(p + "nextn.shared_head_norm.weight", n_embd)


def _start(path: str | Path, arch: str, **kw) -> TensorSink:
    """:func:`gguf_writer.start` with :data:`TYPES` and the header values these writers do
    not take as arguments (context 4096, rope base 1e6, RMS epsilon 1e-6)."""
    return start(path, arch, TYPES, **{"context_length": 4096, "rope_freq_base": 1_000_000.0,
                                       "rms_eps": 1e-6, **kw})


def _moe_mlp(sink: TensorSink, n_embd: int, n_ff: int, n_expert: int):
    """For :func:`llama_layers`: ``n_expert`` experts of ``n_ff`` (none: the dense FFN)."""
    if not n_expert:
        return None
    return lambda il, p: moe(sink, p, n_embd, n_ff, n_expert)


def write_qwen2moe(
    path: str | Path, *, n_embd: int = 224, n_head: int = 7, n_head_kv: int = 1,
    n_layer: int = 3, n_vocab: int = 301, n_expert: int = 5,
    n_expert_used: int | Sequence[int] = 2, n_ff_exp: int = 96, n_ff_shexp: int = 160,
    expert_weights_scale: float | None = None,
    weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen2moe``: Q/K/V biases, ``n_expert`` experts of ``n_ff_exp`` and a shared
    expert of ``n_ff_shexp`` with its 1-D sigmoid gate ``ffn_gate_inp_shexp``."""
    arch = "qwen2moe"
    hd = n_embd // n_head
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                  n_ff=n_ff_shexp, n_layer=n_layer, n_vocab=n_vocab, head_dim=None,
                  weight_types=weight_types, seed=seed)
    expert_counts(sink.w, arch, n_expert, n_expert_used)
    sink.w.add_expert_feed_forward_length(n_ff_exp)
    sink.w.add_uint32(_key(arch, gguf.Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH), n_ff_shexp)
    if expert_weights_scale is not None:
        sink.w.add_expert_weights_scale(expert_weights_scale)
    embeddings(sink, n_embd, n_vocab, tie=False)

    def mlp(il: int, p: str) -> None:
        moe(sink, p, n_embd, n_ff_exp, n_expert)
        sink.vector(p + "ffn_gate_inp_shexp.weight", n_embd, center=0.0, spread=0.05)
        ffn(sink, p, n_embd, n_ff_shexp, suffix="_shexp", order=GATE_DOWN_UP)

    llama_layers(sink, n_layer, n_embd, n_embd, n_head_kv * hd, n_ff_shexp, qkv_bias=True, mlp=mlp)
    return done(sink, tie=False, n_ff=n_ff_exp)


def write_olmoe(
    path: str | Path, *, n_embd: int = 192, n_head: int = 6, n_layer: int = 3,
    n_vocab: int = 307, n_expert: int = 6, n_expert_used: int = 2, n_ff: int = 96,
    weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``olmoe``: Q and K RMS-normed over the whole projection (``attn_q_norm`` and
    ``attn_k_norm`` are [n_embd], so KV heads = heads, as in OLMoE), experts of ``n_ff``."""
    arch = "olmoe"
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=None,
                  weight_types=weight_types, seed=seed)
    expert_counts(sink.w, arch, n_expert, n_expert_used)
    embeddings(sink, n_embd, n_vocab, tie=False)
    for i in range(n_layer):
        p = f"blk.{i}."
        attention(sink, p, n_embd, n_embd, n_embd)
        qk_norms(sink, p, n_embd, n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        moe(sink, p, n_embd, n_ff, n_expert)
    return done(sink, tie=False)


def write_smollm3(
    path: str | Path, *, n_embd: int = 200, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_ff: int = 352, n_layer: int = 5, n_vocab: int = 303,
    tie_embeddings: bool = True, weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``smollm3``: llama's layer where every 4th layer (il % 4 == 3) has no RoPE."""
    arch = "smollm3"
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=head_dim,
                  weight_types=weight_types, seed=seed)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    llama_layers(sink, n_layer, n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff)
    return done(sink, tie=tie_embeddings)


def write_seed_oss(
    path: str | Path, *, n_embd: int = 160, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 32, n_ff: int = 288, n_layer: int = 3, n_vocab: int = 305,
    qkv_biases: bool = True, tie_embeddings: bool = False,
    weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``seed_oss``: Q/K/V biases (optional in create_tensor_qkv), the FFN normed by
    ``attn_post_norm`` (no ``ffn_norm``), optional output matrix."""
    arch = "seed_oss"
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=head_dim,
                  weight_types=weight_types, seed=seed)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    for i in range(n_layer):
        p = f"blk.{i}."
        qkv(sink, p, n_embd, n_head * head_dim, n_head_kv * head_dim, biases=qkv_biases)
        sink.matrix("attn_output", p + "attn_output.weight", n_head * head_dim, n_embd)
        sink.vector(p + "attn_norm.weight", n_embd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff)
    return done(sink, tie=tie_embeddings)


def write_glm4(
    path: str | Path, *, n_embd: int = 192, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_rot: int = 32, n_ff: int = 320, n_layer: int = 3,
    n_vocab: int = 309, rope_sections: Sequence[int] | None = None,
    qkv_biases: bool = True, tie_embeddings: bool = False,
    extra_kv: Mapping[str, int] | None = None, n_nextn: int = 0,
    weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``glm4``: Q/K/V biases, partial rotary (``n_rot`` < head_dim), post-attention
    and post-MLP norms, single-input SwiGLU FFN (``ffn_up`` is [2 * n_ff]).
    ``rope_sections`` makes it multi-section rope (GLM-4.1V's MROPE); ``extra_kv`` adds
    uint32 keys (``{arch}`` templates from ``gguf.Keys``); ``n_nextn`` NextN/MTP blocks
    (a layer's tensors plus ``nextn.*``) follow the ``n_layer`` trunk layers."""
    arch = "glm4"
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer + n_nextn, n_vocab=n_vocab, head_dim=head_dim,
                  weight_types=weight_types, seed=seed)
    if n_nextn:
        sink.w.add_nextn_predict_layers(n_nextn)
    sink.w.add_rope_dimension_count(n_rot)
    if rope_sections is not None:
        sink.w.add_array(_key(arch, gguf.Keys.Rope.DIMENSION_SECTIONS), list(rope_sections))
    for k, v in (extra_kv or {}).items():  # e.g. {Keys.LLM.NEXTN_PREDICT_LAYERS: 1}
        sink.w.add_uint32(_key(arch, k), v)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer + n_nextn):
        p = f"blk.{i}."
        attention(sink, p, n_embd, q_dim, kv_dim, biases=qkv_biases)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
        sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, 2 * n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
        if i >= n_layer:
            _nextn_extras(sink, p, n_embd)
    return done(sink, tie=tie_embeddings, n_layer=n_layer)


def write_exaone4(
    path: str | Path, *, n_embd: int = 192, n_head: int = 3, n_head_kv: int = 1,
    n_ff: int = 224, n_layer: int = 3, n_vocab: int = 301, sliding_window: int | None = None,
    swa_pattern: int | None = None, rope_freqs: bool = False, tie_embeddings: bool = True,
    n_nextn: int = 0, weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``exaone4``: no pre-norms; per-head Q/K norms, post-attention and post-FFN norms.
    llama.cpp builds sliding-window attention only for 64 layers (EXAONE 4.0 32B): window
    4096 unless ``sliding_window``, pattern 4; RoPE then only on the sliding layers.
    ``n_nextn`` NextN/MTP blocks follow the ``n_layer`` trunk layers (the 64 that decide
    the sliding window are the trunk's: ``hparams.n_layer()``)."""
    arch = "exaone4"
    hd = n_embd // n_head
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer + n_nextn, n_vocab=n_vocab, head_dim=None,
                  weight_types=weight_types, seed=seed)
    if n_nextn:
        sink.w.add_nextn_predict_layers(n_nextn)
    if sliding_window is not None:
        sink.w.add_sliding_window(sliding_window)
    if swa_pattern is not None:
        sink.w.add_uint32(_key(arch, gguf.Keys.Attention.SLIDING_WINDOW_PATTERN), swa_pattern)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_freqs:
        rope_freqs_tensor(sink, hd // 2, top=4.0)
    for i in range(n_layer + n_nextn):
        p = f"blk.{i}."
        qkv(sink, p, n_embd, n_embd, n_head_kv * hd, biases=False)
        sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        qk_norms(sink, p, hd, hd)
        ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
        if i >= n_layer:
            _nextn_extras(sink, p, n_embd, shared_head_norm=False)
    swa = n_layer == 64
    return done(sink, tie=tie_embeddings, n_layer=n_layer,
                sliding_window=(sliding_window or 4096) if swa else 0,
                layers_swa=swa_layers(n_layer, swa_pattern or 4) if swa else None)


def write_cohere2(
    path: str | Path, *, n_embd: int = 224, n_head: int = 7, n_head_kv: int = 1,
    n_ff: int = 352, n_layer: int = 5, n_vocab: int = 303, sliding_window: int = 48,
    swa_pattern: int | None = None, logit_scale: float = 0.125,
    weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``cohere2`` (Command R7B, Command A): LayerNorm without bias, attention and FFN
    in parallel from the same norm, RoPE only on sliding-window layers (pattern 4: every
    4th layer global and NoPE), tied output scaled by ``logit_scale``."""
    arch = "cohere2"
    hd = n_embd // n_head
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=None,
                  weight_types=weight_types, seed=seed)
    sink.w.add_layer_norm_eps(1e-5)
    sink.w.add_sliding_window(sliding_window)
    sink.w.add_logit_scale(logit_scale)
    if swa_pattern is not None:
        sink.w.add_uint32(_key(arch, gguf.Keys.Attention.SLIDING_WINDOW_PATTERN), swa_pattern)
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=0.05)
    sink.vector("output_norm.weight", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        attention(sink, p, n_embd, n_embd, n_head_kv * hd)
        ffn(sink, p, n_embd, n_ff)
    return done(sink, tie=True, sliding_window=sliding_window,
                layers_swa=swa_layers(n_layer, swa_pattern or 4))


def write_mistral3(
    path: str | Path, *, n_embd: int = 256, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 48, n_ff: int = 416, n_layer: int = 3, n_vocab: int = 311,
    temperature_scale: float | None = 0.1, original_context: int = 1024,
    n_expert: int = 0, n_expert_used: int = 2, rope_freqs: bool = False,
    tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``mistral3`` (Ministral 3, Mistral Small 3.x/4 text): llama's layer with
    optional query temperature tuning (``attention.temperature_scale``: the input
    ``inp_attn_scale`` multiplies Q), and with ``n_expert`` > 0 a MoE FFN (normalised
    top-k) in every layer."""
    arch = "mistral3"
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=head_dim,
                  weight_types=weight_types, seed=seed)
    sink.w.add_rope_dimension_count(head_dim)
    if temperature_scale is not None:
        sink.w.add_float32(_key(arch, gguf.Keys.Attention.TEMPERATURE_SCALE), temperature_scale)
        sink.w.add_rope_scaling_orig_ctx_len(original_context)
    if n_expert:
        expert_counts(sink.w, arch, n_expert, n_expert_used)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_freqs:
        rope_freqs_tensor(sink, head_dim // 2)
    llama_layers(sink, n_layer, n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff,
                 mlp=_moe_mlp(sink, n_embd, n_ff, n_expert))
    return done(sink, tie=tie_embeddings)


def _qwen3vl(path: Path, arch: str, *, n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer,
             n_vocab, rope_sections, n_deepstack, tie_embeddings, weight_types, seed,
             n_expert=0, n_expert_used=0) -> FixtureInfo:
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=head_dim,
                  weight_types=weight_types, seed=seed)
    sink.w.add_array(_key(arch, gguf.Keys.Rope.DIMENSION_SECTIONS), list(rope_sections))
    if n_deepstack:
        sink.w.add_uint32(_key(arch, gguf.Keys.LLM.NUM_DEEPSTACK_LAYERS), n_deepstack)
    if n_expert:
        expert_counts(sink.w, arch, n_expert, n_expert_used)
        sink.w.add_expert_feed_forward_length(n_ff)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    llama_layers(sink, n_layer, n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff,
                 qk_norm=head_dim, mlp=_moe_mlp(sink, n_embd, n_ff, n_expert))
    return done(sink, tie=tie_embeddings)


def write_qwen3vl(
    path: str | Path, *, n_embd: int = 160, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_ff: int = 288, n_layer: int = 3, n_vocab: int = 301,
    rope_sections: Sequence[int] = (12, 10, 10, 0), n_deepstack: int = 2,
    tie_embeddings: bool = True, weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen3vl`` (the text model of Qwen3-VL): qwen3's layer with interleaved
    multi-section rope (IMROPE, 4 positions per token) and ``n_deepstack`` layers that add
    a slice of the (zero-padded) input embedding."""
    return _qwen3vl(Path(path), "qwen3vl", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                    head_dim=head_dim, n_ff=n_ff, n_layer=n_layer, n_vocab=n_vocab,
                    rope_sections=rope_sections, n_deepstack=n_deepstack,
                    tie_embeddings=tie_embeddings, weight_types=weight_types, seed=seed)


def write_qwen3vlmoe(
    path: str | Path, *, n_embd: int = 160, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_ff: int = 96, n_layer: int = 3, n_vocab: int = 301,
    rope_sections: Sequence[int] = (12, 10, 10, 0), n_deepstack: int = 1,
    n_expert: int = 5, n_expert_used: int = 2, tie_embeddings: bool = False,
    weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen3vlmoe``: qwen3vl with qwen3moe's FFN (normalised top-k, experts of
    ``n_ff`` from ``expert_feed_forward_length``)."""
    return _qwen3vl(Path(path), "qwen3vlmoe", n_embd=n_embd, n_head=n_head,
                    n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_layer=n_layer,
                    n_vocab=n_vocab, rope_sections=rope_sections, n_deepstack=n_deepstack,
                    tie_embeddings=tie_embeddings, weight_types=weight_types, seed=seed,
                    n_expert=n_expert, n_expert_used=n_expert_used)


def write_llama4(
    path: str | Path, *, n_embd: int = 192, n_head: int = 6, n_head_kv: int = 2,
    n_ff: int = 320, n_ff_exp: int = 96, n_layer: int = 5, n_vocab: int = 307,
    n_expert: int = 5, n_expert_used: int = 1, moe_step: int = 2,
    sliding_window: int | None = None, rope_freqs: bool = False,
    tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None, seed: int = 0,
) -> FixtureInfo:
    """Arch ``llama4``: chunked attention (pattern 4) unless ``sliding_window`` is 0, NoPE
    layers with temperature tuning, MoE layers every ``moe_step`` layers (``il + 1`` a
    multiple of it) with a shared expert of ``n_ff_exp``, dense layers of ``n_ff``."""
    arch = "llama4"
    hd = n_embd // n_head
    sink = _start(path, arch, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                  n_layer=n_layer, n_vocab=n_vocab, head_dim=None, rms_eps=1e-5,
                  weight_types=weight_types, seed=seed)
    sink.w.add_rope_dimension_count(hd)
    expert_counts(sink.w, arch, n_expert, n_expert_used)
    sink.w.add_expert_feed_forward_length(n_ff_exp)
    sink.w.add_uint32(_key(arch, gguf.Keys.LLM.INTERLEAVE_MOE_LAYER_STEP), moe_step)
    if sliding_window is not None:
        sink.w.add_sliding_window(sliding_window)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_freqs:
        rope_freqs_tensor(sink, hd // 2)

    def mlp(il: int, p: str) -> None:
        if moe_step > 0 and (il + 1) % moe_step == 0:
            moe(sink, p, n_embd, n_ff_exp, n_expert)
            ffn(sink, p, n_embd, n_ff_exp, suffix="_shexp", order=GATE_DOWN_UP)
        else:
            ffn(sink, p, n_embd, n_ff)

    llama_layers(sink, n_layer, n_embd, n_embd, n_head_kv * hd, n_ff, mlp=mlp)
    chunked = sliding_window != 0
    return done(sink, tie=tie_embeddings, sliding_window=8192 if chunked else 0,
                layers_swa=swa_layers(n_layer, 4) if chunked else None)
