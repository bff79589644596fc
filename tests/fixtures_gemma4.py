"""Tiny but valid GGUFs (llama.cpp loads and runs them) for dense ``gemma4``.

:func:`write_gemma4` mirrors ``llama_model_gemma4::load_arch_tensors`` (src/models/
gemma4.cpp in the llama.cpp vendored by llama-cpp-python 0.3.36): per-layer sliding-window
pattern (required array), head size and rotated dims of sliding layers given apart
(``key_length_swa``, ``rope.dimension_count_swa``), ``rope_freqs`` for the full layers,
optional per-layer embeddings (``embedding_length_per_layer_input`` is required; 0 means
none), the last ``shared_kv_layers`` layers without K/V of their own, optional
``layer_output_scale``, optional ``attn_v`` (V is K without it); the 26B-A4B mixture of
experts: on ``moe_layers`` a router ``ffn_gate_inp`` (+ ``.scale``), its norms
``pre_ffw_norm_2``/``post_ffw_norm_1``/``post_ffw_norm_2``, experts as separate
``ffn_gate_exps``/``ffn_up_exps`` or merged ``ffn_gate_up_exps``, ``ffn_down_exps`` and
its optional per-expert ``.scale``; the dense FFN stays as the shared expert.

Shared machinery (vocabulary, weight makers, type choice) comes from :mod:`gguf_writer`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import gguf
from gguf_writer import (QT, FixtureInfo, done, expert_counts, ffn, per_layer_block,
                         per_layer_inputs, start)

__all__ = ["write_gemma4"]

GEMMA4_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "per_layer_token_embd": QT.Q8_0, "per_layer_model_proj": QT.F16,
    "attn_q": QT.Q4_0, "attn_k": QT.F16, "attn_v": QT.Q8_0, "attn_qkv": QT.Q8_0,
    "attn_output": QT.Q4_K, "ffn_gate": QT.Q4_0, "ffn_up": QT.Q8_0, "ffn_down": QT.Q4_K,
    "inp_gate": QT.F16, "proj": QT.Q8_0,
    "ffn_gate_inp": QT.F16, "ffn_gate_exps": QT.Q8_0, "ffn_up_exps": QT.Q4_0,
    "ffn_gate_up_exps": QT.Q8_0, "ffn_down_exps": QT.Q4_1,
}


def write_gemma4(path: str | Path, *, n_embd: int = 160, n_head: int = 2, n_head_kv: int = 1,
                 head_dim: int = 128, head_dim_swa: int = 64, n_ff: int = 288,
                 swa_pattern: Sequence[bool] = (True, True, True, False, True, True, False),
                 shared_kv_layers: int = 3, n_embd_per_layer: int = 48, n_vocab: int = 301,
                 context_length: int = 4096, sliding_window: int = 48,
                 fused_qkv: bool = False, tie_embeddings: bool = True,
                 no_v_layers: Sequence[int] = (1,), out_scale_layers: Sequence[int] = (0, 6),
                 final_logit_softcap: float | None = None, write_pattern: bool = True,
                 moe_layers: Sequence[int] = (), n_expert: int = 5, n_expert_used: int = 3,
                 n_ff_exp: int = 96, gate_up_merged: bool = False, down_scale: bool = True,
                 extra_scales: Sequence[str] = (),
                 weight_types: Mapping[str, QT] | None = None, rms_eps: float = 1e-6,
                 seed: int = 0) -> FixtureInfo:
    """Arch ``gemma4``. Default: 7 layers (full: 3 and 6), layers 4..6 share KV (4, 5 read
    layer 2's sliding cache, 6 layer 3's), 2 heads over 1 KV head of 128 on full layers and
    64 on sliding ones, per-layer embeddings of 48, no ``attn_v`` on layer 1, output scales
    on layers 0 and 6. Shared layers carry no ``attn_k``/``attn_v``/``attn_k_norm``.
    ``write_pattern=False`` writes a file to be refused. ``moe_layers``: layers with a
    router and ``n_expert`` experts of ``n_ff_exp`` (``n_expert_used`` per token).
    ``extra_scales``: per-tensor weight scales ``blk.0.<name>.scale`` [1] (NVFP4
    conversions' ``wq_s`` ...), which graphcost's gemma4 does not model."""
    n_layer = len(swa_pattern)
    arch = "gemma4"

    def swa_sizes(w: gguf.GGUFWriter) -> None:
        w.add_key_length_swa(head_dim_swa)
        w.add_value_length_swa(head_dim_swa)

    def sliding(w: gguf.GGUFWriter) -> None:
        w.add_sliding_window(sliding_window)
        if write_pattern:  # required: False writes a file llama.cpp refuses
            w.add_sliding_window_pattern(list(swa_pattern))
        w.add_shared_kv_layers(shared_kv_layers)
        w.add_embedding_length_per_layer_input(n_embd_per_layer)

    def softcap_experts(w: gguf.GGUFWriter) -> None:
        if final_logit_softcap is not None:
            w.add_final_logit_softcapping(final_logit_softcap)
        if moe_layers:
            expert_counts(w, arch, n_expert, n_expert_used)
            w.add_expert_feed_forward_length(n_ff_exp)

    sink = start(path, arch, GEMMA4_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_layer=n_layer,
                 n_vocab=n_vocab, context_length=context_length, rms_eps=rms_eps,
                 rope_freq_base=1_000_000.0, head_dim=head_dim, n_rot=head_dim,
                 after={"value_length": swa_sizes,
                        "rope.dimension_count": lambda w: w.add_uint32(
                            gguf.Keys.Rope.DIMENSION_COUNT_SWA.format(arch=arch), head_dim_swa),
                        "layer_norm_rms_epsilon": sliding, "rope.freq_base": softcap_experts})
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=0.05)
    if not tie_embeddings:
        sink.matrix("output", "output.weight", n_embd, n_vocab)
    if n_embd_per_layer:
        per_layer_inputs(sink, n_embd, n_vocab, n_embd_per_layer, n_layer)
    sink.vector("output_norm.weight", n_embd)
    sink.vector("rope_freqs.weight", head_dim // 2, center=1.0, spread=0.0)
    n_kv_from = n_layer - shared_kv_layers
    for i in range(n_layer):
        p = f"blk.{i}."
        hd = head_dim_swa if swa_pattern[i] else head_dim
        q_dim, kv_dim = hd * n_head, hd * n_head_kv
        has_kv = i < n_kv_from
        sink.vector(p + "attn_norm.weight", n_embd)
        if fused_qkv:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, q_dim + 2 * kv_dim)
        else:
            sink.matrix("attn_q", p + "attn_q.weight", n_embd, q_dim)
            if has_kv:
                sink.matrix("attn_k", p + "attn_k.weight", n_embd, kv_dim)
                if i not in no_v_layers:
                    sink.matrix("attn_v", p + "attn_v.weight", n_embd, kv_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "attn_q_norm.weight", hd)
        if has_kv:
            sink.vector(p + "attn_k_norm.weight", hd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        if i in out_scale_layers:
            sink.vector(p + "layer_output_scale.weight", 1, center=0.9, spread=0.0)
        sink.vector(p + "ffn_norm.weight", n_embd)
        ffn(sink, p, n_embd, n_ff)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
        if i == 0:
            for name in extra_scales:
                sink.vector(p + name + ".scale", 1, center=0.5, spread=0.0)
        if i in moe_layers:
            sink.matrix("ffn_gate_inp", p + "ffn_gate_inp.weight", n_embd, n_expert)
            sink.vector(p + "ffn_gate_inp.scale", n_embd)
            for norm in ("pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
                sink.vector(p + norm + ".weight", n_embd)
            if gate_up_merged:
                sink.experts("ffn_gate_up_exps", p + "ffn_gate_up_exps.weight", n_embd,
                         2 * n_ff_exp, n_expert)
            else:
                sink.experts("ffn_gate_exps", p + "ffn_gate_exps.weight", n_embd,
                         n_ff_exp, n_expert)
                sink.experts("ffn_up_exps", p + "ffn_up_exps.weight", n_embd,
                         n_ff_exp, n_expert)
            sink.experts("ffn_down_exps", p + "ffn_down_exps.weight", n_ff_exp, n_embd,
                     n_expert)
            if down_scale:
                sink.vector(p + "ffn_down_exps.scale", n_expert, center=0.8, spread=0.2)
        if n_embd_per_layer:
            per_layer_block(sink, p, n_embd, n_embd_per_layer)
    return done(sink, tie=tie_embeddings, sliding_window=sliding_window,
                layers_swa=list(swa_pattern))
