"""Tiny but valid GGUFs for mixture-of-experts families and gemma2.

* :func:`write_mixtral`  -- arch ``llama`` with experts (Mixtral style: ``ffn_gate_inp``,
  ``ffn_{gate,up,down}_exps``; ``ffn_gate_exps`` optional, as llama.cpp allows);
* :func:`write_qwen3moe` -- arch ``qwen3moe`` (Q/K norms, experts in every layer, expert
  width from ``expert_feed_forward_length``);
* :func:`write_gemma2`   -- arch ``gemma2`` (sliding window every other layer, attention
  and final logit soft-capping, post norms).

Each writes exactly the tensors the family's ``load_arch_tensors`` creates in the llama.cpp
vendored by llama-cpp-python 0.3.36 (it refuses missing and unexpected tensors). Sizes are
odd on purpose (6 or 4 experts, 2 used; expert widths of 352 or 96) and weight types are
mixed; the vocabulary, weight makers and type fallbacks come from :mod:`gguf_writer`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from fixtures import GEMMA3_DEFAULT_TYPES
from gguf_writer import (ATTN_TYPES, QT, FixtureInfo, attention, done, embeddings, expert_counts,
                         ffn, ffn_types, llama_layers, moe, sliding_window_keys, start, swa_layers)

__all__ = ["write_mixtral", "write_qwen3moe", "write_gemma2", "MIXTRAL_DEFAULT_TYPES",
           "QWEN3MOE_DEFAULT_TYPES", "GEMMA2_DEFAULT_TYPES"]

# n_embd 256, expert width 352 (11 * 32): k-quants fit rows of 256 only
MIXTRAL_DEFAULT_TYPES: dict[str, QT] = {**ATTN_TYPES, "output": QT.Q6_K, "attn_output": QT.Q4_K,
                                         "ffn_gate_inp": QT.F32,
                                         **ffn_types(QT.Q4_0, QT.Q8_0, QT.Q5_0, "_exps")}

# n_embd 320, q width 320, expert width 96 (3 * 32)
QWEN3MOE_DEFAULT_TYPES: dict[str, QT] = {**ATTN_TYPES, "attn_output": QT.Q5_1,
                                          "ffn_gate_inp": QT.F16,
                                          **ffn_types(QT.Q8_0, QT.Q4_0, QT.Q4_1, "_exps")}

# n_embd 288, q width 256, n_ff 608 (19 * 32): gemma3's types
GEMMA2_DEFAULT_TYPES: dict[str, QT] = GEMMA3_DEFAULT_TYPES


def write_mixtral(
    path: str | Path, *, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2,
    n_ff: int = 352, n_layer: int = 3, n_vocab: int = 311, n_expert: int = 6,
    n_expert_used: int | Sequence[int] = 2, gate_exps: bool = True,
    tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 1_000_000.0, rms_eps: float = 1e-5,
    seed: int = 0,
) -> FixtureInfo:
    """Arch ``llama`` with ``n_expert`` experts of width ``n_ff`` (Mixtral layout).

    ``n_expert_used`` may be a per-layer list. ``gate_exps=False`` leaves out
    ``ffn_gate_exps`` (llama.cpp then applies SILU to the up projection alone)."""
    hd = n_embd // n_head
    sink = start(path, "llama", MIXTRAL_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, n_rot=hd)
    expert_counts(sink.w, "llama", n_expert, n_expert_used)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    llama_layers(sink, n_layer, n_embd, n_embd, n_head_kv * hd, n_ff,
                 mlp=lambda il, p: moe(sink, p, n_embd, n_ff, n_expert, gate_exps))
    return done(sink, tie=tie_embeddings)


def write_qwen3moe(
    path: str | Path, *, n_embd: int = 320, n_head: int = 5, n_head_kv: int = 1,
    head_dim: int = 64, n_ff: int = 480, n_ff_exp: int = 96, n_layer: int = 3,
    n_vocab: int = 303, n_expert: int = 4, n_expert_used: int | Sequence[int] = 2,
    tie_embeddings: bool = True, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 1_000_000.0, rms_eps: float = 1e-6,
    seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen3moe``: Q/K RMS norms, ``n_expert`` experts of ``n_ff_exp`` in every layer.

    Default: 5 heads of 64 over 1 KV head (head_dim 64: the Hadamard path for quantized
    KV), 4 experts of width 96, 2 used, tied embeddings."""
    sink = start(path, "qwen3moe", QWEN3MOE_DEFAULT_TYPES, weight_types=weight_types,
                 seed=seed, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim)
    expert_counts(sink.w, "qwen3moe", n_expert, n_expert_used)
    sink.w.add_expert_feed_forward_length(n_ff_exp)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    llama_layers(sink, n_layer, n_embd, n_head * head_dim, n_head_kv * head_dim, n_ff,
                 qk_norm=head_dim, mlp=lambda il, p: moe(sink, p, n_embd, n_ff_exp, n_expert))
    return done(sink, tie=tie_embeddings, n_ff=n_ff_exp)


def write_gemma2(
    path: str | Path, *, n_embd: int = 288, n_head: int = 4, n_head_kv: int = 2,
    head_dim: int = 64, n_ff: int = 608, n_layer: int = 5, n_vocab: int = 300,
    sliding_window: int | None = 64, swa_pattern: int | Sequence[bool] | None = None,
    attn_softcap: float | None = 50.0, final_softcap: float | None = 30.0,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 8192,
    rope_freq_base: float = 10_000.0, rms_eps: float = 1e-6, seed: int = 0,
) -> FixtureInfo:
    """Arch ``gemma2``: every other layer sliding (pattern 2 unless ``swa_pattern``),
    attention and final logit soft-capping, post-attention and post-FFN norms, tied
    embeddings (gemma2 has no output matrix). ``None`` leaves a key out: the window is then
    llama.cpp's default 4096, the soft-caps 50 and 30."""
    sink = start(path, "gemma2", GEMMA2_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim)
    sliding_window_keys(sink.w, "gemma2", sliding_window, swa_pattern)
    if attn_softcap is not None:
        sink.w.add_attn_logit_softcapping(attn_softcap)
    if final_softcap is not None:
        sink.w.add_final_logit_softcapping(final_softcap)
    embeddings(sink, n_embd, n_vocab, tie=True)
    q_dim = n_head * head_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        attention(sink, p, n_embd, q_dim, n_head_kv * head_dim)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
    return done(sink, tie=True, sliding_window=4096 if sliding_window is None else sliding_window,
                layers_swa=swa_layers(n_layer, 2 if swa_pattern is None else swa_pattern))
