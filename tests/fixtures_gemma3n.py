"""Tiny but valid GGUFs (llama.cpp loads and runs them) for ``gemma3n``.

:func:`write_gemma3n` mirrors ``llama_model_gemma3n::load_arch_tensors`` (src/models/
gemma3n.cpp in the llama.cpp vendored by llama-cpp-python 0.3.36), which fixes the AltUp
and per-layer sizes llama.cpp does not read from the file: 4 AltUp streams, per-layer
inputs of 256 per layer, LAuReL rank 64 (the tensors' shapes follow them). Layers from 20
on have no KV cache of their own (they reuse layer 18's or 19's), so a fixture needs more
than 20 layers to show KV sharing; the first 10 layers use activation sparsity.

Shared machinery (vocabulary, weight makers, type choice) comes from :mod:`gguf_writer`;
``weight_types`` works the same way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from gguf_writer import (QT, FixtureInfo, done, ffn, make_weight, per_layer_block, per_layer_inputs,
                         qk_norms, qkv, start, swa_layers)

__all__ = ["write_gemma3n", "N_ALTUP", "N_EMBD_ALTUP", "LAUREL_RANK"]

#: llama_hparams defaults gemma3n keeps (src/llama-hparams.h)
N_ALTUP, N_EMBD_ALTUP, LAUREL_RANK = 4, 256, 64

GEMMA3N_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "per_layer_token_embd": QT.Q8_0, "per_layer_model_proj": QT.F16,
    "attn_q": QT.Q4_0, "attn_k": QT.F16, "attn_v": QT.Q8_0, "attn_qkv": QT.Q4_0,
    "attn_output": QT.Q8_0, "ffn_gate": QT.Q4_0, "ffn_up": QT.Q8_0, "ffn_down": QT.Q4_K,
    "inp_gate": QT.Q8_0, "proj": QT.Q4_K, "laurel_l": QT.Q8_0, "laurel_r": QT.F16,
    "altup_router": QT.F16, "altup_predict_coef": QT.F32, "altup_correct_coef": QT.F32,
}


def write_gemma3n(path: str | Path, *, n_embd: int = 160, n_head: int = 3, n_head_kv: int = 1,
                  head_dim: int = 64, n_ff: int = 288, n_layer: int = 6, n_vocab: int = 301,
                  context_length: int = 4096, sliding_window: int | None = 32,
                  fused_qkv: bool = False, tie_embeddings: bool = True,
                  weight_types: Mapping[str, QT] | None = None, rms_eps: float = 1e-6,
                  seed: int = 0) -> FixtureInfo:
    """Arch ``gemma3n``. Default: 6 layers (pattern 5: layer 4 global, the others sliding), 3 heads of 64 over 1
    KV head (q width 192 != n_embd 160), n_ff 288, tied output, separate Q/K/V."""
    sink = start(path, "gemma3n", GEMMA3N_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=1_000_000.0, head_dim=head_dim)
    if sliding_window is not None:  # required: None writes a file llama.cpp refuses
        sink.w.add_sliding_window(sliding_window)
    q_dim, kv_dim = head_dim * n_head, head_dim * n_head_kv

    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=0.05)
    if not tie_embeddings:
        sink.matrix("output", "output.weight", n_embd, n_vocab)
    for name in ("altup_proj", "altup_unembd_proj"):  # [n_embd, n_embd, n_altup - 1]
        sink._add(f"{name}.weight",
                  make_weight(sink.rng, (N_ALTUP - 1, n_embd, n_embd), QT.F16), QT.F16)
    per_layer_inputs(sink, n_embd, n_vocab, N_EMBD_ALTUP, n_layer)
    sink.vector("output_norm.weight", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        if fused_qkv:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, q_dim + 2 * kv_dim)
        else:
            qkv(sink, p, n_embd, q_dim, kv_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        qk_norms(sink, p, head_dim, head_dim)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
        per_layer_block(sink, p, n_embd, N_EMBD_ALTUP)
        sink.matrix("altup_correct_coef", p + "altup_correct_coef.weight", N_ALTUP, N_ALTUP)
        sink.vector(p + "altup_correct_scale.weight", n_embd)
        sink.matrix("altup_predict_coef", p + "altup_predict_coef.weight", N_ALTUP,
                    N_ALTUP * N_ALTUP)
        sink.matrix("altup_router", p + "altup_router.weight", n_embd, N_ALTUP)
        sink.vector(p + "altup_router_norm.weight", n_embd)
        sink.matrix("laurel_l", p + "laurel_l.weight", n_embd, LAUREL_RANK)
        sink.matrix("laurel_r", p + "laurel_r.weight", LAUREL_RANK, n_embd)
        sink.vector(p + "laurel_post_norm.weight", n_embd)
    return done(sink, tie=tie_embeddings, sliding_window=sliding_window or 0,
                layers_swa=swa_layers(n_layer, 5))
