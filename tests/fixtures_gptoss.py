"""Tiny but valid gpt-oss GGUFs (arch ``gpt-oss``, llama.cpp's LLM_ARCH_OPENAI_MOE).

:func:`write_gptoss` writes exactly the tensors ``llama_model_openai_moe::load_arch_tensors``
creates in the llama.cpp vendored by llama-cpp-python 0.3.36 (``src/models/openai-moe.cpp``):
Q/K/V with biases, the output projection with its bias, per-head ``attn_sinks``, the
router with its bias and stacked experts with per-expert biases (all F32, as ADD_ID
requires), and an untied output matrix. Experts are MXFP4 by default, as in the released
gpt-oss files. Sizes are odd on purpose (5 experts of width 160, 2 used; 6 heads of 64 over
2 KV heads; window 40; 3 layers: 0 and 2 sliding, 1 full).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import gguf
from gguf_writer import (QT, FixtureInfo, done, embeddings, expert_counts, ffn_types, moe, qkv,
                         sliding_window_keys, start, swa_layers)

__all__ = ["write_gptoss", "GPTOSS_DEFAULT_TYPES"]

# n_embd 288 (9 * 32), q width 384, expert width 160 (5 * 32): no k-quant fits the experts
GPTOSS_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "output": QT.Q8_0, "attn_q": QT.Q8_0, "attn_k": QT.F16,
    "attn_v": QT.Q8_0, "attn_output": QT.Q4_0, "ffn_gate_inp": QT.F32,
    **ffn_types(QT.MXFP4, QT.MXFP4, QT.MXFP4, "_exps"),
}


def write_gptoss(
    path: str | Path, *, n_embd: int = 288, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_ff_exp: int = 160, n_layer: int = 3, n_vocab: int = 301,
    n_expert: int = 5, n_expert_used: int | Sequence[int] = 2, sliding_window: int | None = 40,
    swa_pattern: int | Sequence[bool] | None = None, yarn: bool = True,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    rope_freq_base: float = 150_000.0, rms_eps: float = 1e-5, seed: int = 0,
) -> FixtureInfo:
    """Arch ``gpt-oss``. ``swa_pattern``: None -> key absent (llama.cpp's default 2: even
    layers sliding), an int or a per-layer list of bools otherwise. ``yarn`` writes the
    YaRN rope scaling the released files carry (factor 32 over 4096 trained positions)."""
    arch = "gpt-oss"
    sink = start(path, arch, GPTOSS_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff_exp,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, head_dim=head_dim,
                 n_rot=head_dim)
    w = sink.w
    # sliding_window None: leave the required key out (bad-input tests)
    sliding_window_keys(w, arch, sliding_window, swa_pattern)
    if yarn:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    expert_counts(w, arch, n_expert, n_expert_used)
    w.add_expert_feed_forward_length(n_ff_exp)
    embeddings(sink, n_embd, n_vocab, tie=False)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim

    def f32(name: str, *shape: int, scale: float = 0.02) -> None:
        # ggml ne = shape; numpy rows last
        sink.array(name, scale * sink.rng.standard_normal(tuple(reversed(shape))))

    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        qkv(sink, p, n_embd, q_dim, kv_dim)
        f32(p + "attn_q.bias", q_dim)
        f32(p + "attn_k.bias", kv_dim)
        f32(p + "attn_v.bias", kv_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "attn_sinks.weight", n_head, center=0.0, spread=1.0)
        moe(sink, p, n_embd, n_ff_exp, n_expert)
        f32(p + "attn_output.bias", n_embd)
        f32(p + "ffn_gate_inp.bias", n_expert, scale=0.5)
        f32(p + "ffn_gate_exps.bias", n_ff_exp, n_expert)
        f32(p + "ffn_down_exps.bias", n_embd, n_expert)
        f32(p + "ffn_up_exps.bias", n_ff_exp, n_expert)
    return done(sink, tie=False, sliding_window=sliding_window or 0,
                layers_swa=swa_layers(n_layer, 2 if swa_pattern is None else swa_pattern))
