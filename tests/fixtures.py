"""Tiny but valid GGUF files for tests (llama.cpp loads and runs them).

Two writers:

* :func:`write_llama`  -- arch ``llama`` (GQA, optional separate head_dim, optional
  ``rope_freqs`` tensor, optional tied embeddings);
* :func:`write_gemma3` -- arch ``gemma3`` (interleaved sliding-window attention,
  q/k norms, post-norms).

Weights, types and their fallbacks, the vocabulary and the header come from
:mod:`gguf_writer`, as for every fixtures_*.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from gguf_writer import (ATTN_TYPES, QT, FixtureInfo, done, embeddings, ffn, ffn_types, llama_layers, longrope as longrope_factors, qkv, rope_freqs_tensor,
                         sliding_window_keys, start, swa_layers)

__all__ = ["LLAMA_DEFAULT_TYPES", "GEMMA3_DEFAULT_TYPES", "LLAMA64", "write_llama",
           "write_gemma3"]

# defaults for the llama fixture (n_embd=256, n_ff=768, q/o width 256):
# every row length is a multiple of 256, so k-quants fit everywhere.
LLAMA_DEFAULT_TYPES: dict[str, QT] = {**ATTN_TYPES, "output": QT.Q6_K, "attn_output": QT.Q4_K,
                                       **ffn_types(QT.Q4_0, QT.Q8_0, QT.Q4_K)}

# defaults for the gemma3 fixture (n_embd=320, q/o width n_head*head_dim=256,
# n_ff=640): only attn_output has a row length that is a multiple of 256.
GEMMA3_DEFAULT_TYPES: dict[str, QT] = {**ATTN_TYPES, "attn_output": QT.Q4_K,
                                        **ffn_types(QT.Q4_0, QT.Q8_0, QT.Q5_0)}


#: write_llama's head_dim-64 variant shared by the parity and numerics tests: 6 heads of 64
#: over 3 KV heads (quantized caches get the Hadamard rotation), tied embeddings, llama-3
#: rope_freqs, odd vocabulary, mixed weight types
LLAMA64: dict = dict(n_embd=384, n_head=6, n_head_kv=3, head_dim=64, n_ff=1024, n_layer=2,
                     n_vocab=333, tie_embeddings=True, rope_freqs=True,
                     weight_types={"attn_q": QT.Q4_0, "ffn_down": QT.Q4_K, "attn_v": QT.F16,
                                   "ffn_up": QT.Q8_0})


def write_llama(
    path: str | Path, *, n_embd: int = 256, n_head: int = 8, n_head_kv: int = 2,
    n_ff: int = 768, n_layer: int = 3, n_vocab: int = 300, head_dim: int | None = None,
    weight_types: Mapping[str, QT] | None = None, tie_embeddings: bool = False,
    context_length: int = 2048, rope_freqs: bool = False, rope_freq_base: float = 10000.0,
    longrope: int | None = None, rms_eps: float = 1e-5, seed: int = 0,
) -> FixtureInfo:
    """Write a tiny arch-``llama`` GGUF and return a :class:`FixtureInfo` (os.PathLike).

    ``head_dim`` defaults to ``n_embd // n_head``; when it differs, key_length,
    value_length and rope.dimension_count are written (llama requires
    n_rot == head_dim).  ``rope_freqs=True`` adds the optional ``rope_freqs.weight``
    tensor (n_rot/2 F32 factors, as llama-3.1 style models have). ``longrope=N`` adds
    LongRoPE's ``rope_factors_long/short`` (n_rot/2 each) and rope.scaling.original_context_length
    N: llama_model::get_rope_factors picks the long ones when a sequence's context exceeds N.
    """
    hd = head_dim if head_dim is not None else n_embd // n_head
    sink = start(path, "llama", LLAMA_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim, n_rot=hd)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    if rope_freqs:
        rope_freqs_tensor(sink, hd // 2)
    if longrope is not None:
        longrope_factors(sink, hd // 2, longrope)
    llama_layers(sink, n_layer, n_embd, n_head * hd, n_head_kv * hd, n_ff)
    return done(sink, tie=tie_embeddings)


def write_gemma3(
    path: str | Path, *, n_embd: int = 320, n_head: int = 4, n_head_kv: int = 2,
    head_dim: int = 64, n_ff: int = 640, n_layer: int = 7, n_vocab: int = 300,
    sliding_window: int = 64, swa_pattern: int | Sequence[bool] | None = None,
    weight_types: Mapping[str, QT] | None = None, tie_embeddings: bool = True,
    context_length: int = 4096, rope_freq_base: float = 1_000_000.0,
    rope_freq_base_swa: float | None = 10_000.0, rms_eps: float = 1e-6, seed: int = 0,
) -> FixtureInfo:
    """Write a tiny arch-``gemma3`` GGUF and return a :class:`FixtureInfo` (os.PathLike).

    ``sliding_window=0`` writes no sliding-window key (gemma3 then builds a
    non-iSWA graph with a single KV cache).  ``swa_pattern``: None -> key absent
    (llama.cpp default 6), int -> ``attention.sliding_window_pattern`` u32, a list of
    bools -> the per-layer array form.  Tied embeddings by default (like the real
    gemma3 files, which have no output.weight).
    """
    sink = start(path, "gemma3", GEMMA3_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim)
    if sliding_window:
        sliding_window_keys(sink.w, "gemma3", sliding_window, swa_pattern)
        if rope_freq_base_swa is not None:
            sink.w.add_rope_freq_base_swa(rope_freq_base_swa)
    q_dim = n_head * head_dim
    embeddings(sink, n_embd, n_vocab, tie_embeddings, scale=0.05)
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        qkv(sink, p, n_embd, q_dim, n_head_kv * head_dim)
        sink.vector(p + "attn_q_norm.weight", head_dim)
        sink.vector(p + "attn_k_norm.weight", head_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
    return done(sink, tie=tie_embeddings, sliding_window=sliding_window,
                layers_swa=swa_layers(n_layer, swa_pattern) if sliding_window else None)
