"""Tiny but valid GGUFs for the hybrid (recurrent + attention) families: lfm2, granitehybrid, qwen3next
(also qwen35, qwen35moe), nemotron_h.

Each writer mirrors the tensors the family's ``load_arch_tensors`` creates in the
llama.cpp vendored by llama-cpp-python 0.3.36 (``src/models/<arch>.cpp``): llama.cpp
refuses a file with a missing required tensor or with a tensor it did not ask for.
Sizes are odd on purpose; the per-layer pattern of recurrent and attention layers is an
argument. See :mod:`gguf_writer` for ``weight_types`` and the type fallbacks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import gguf
from fixtures_dense import DENSE_DEFAULT_TYPES
from gguf_writer import (QT, GATE_DOWN_UP, FixtureInfo, TensorSink, bias, done, embeddings,
                         expert_counts, ffn, granite_keys, moe, qkv, ssm_keys, start)

__all__ = ["write_lfm2", "LFM2_PATTERN", "write_granitehybrid", "GRANITE_HYBRID_PATTERN",
           "write_qwen3next", "write_nemotron_h"]

HYBRID_DEFAULT_TYPES: dict[str, QT] = {
    **DENSE_DEFAULT_TYPES, "ffn_down": QT.Q4_0,
    "shortconv.in_proj": QT.Q8_0, "shortconv.out_proj": QT.Q4_0, "ssm_in": QT.Q8_0,
    "ssm_out": QT.Q4_K,
    # ggml_compute_forward_ssm_conv reads the kernel as F32
    "shortconv.conv": QT.F32, "ssm_conv1d": QT.F32,
}

#: the routers' weight scale here (the MoE families elsewhere use gguf_writer.moe's 0.5)
ROUTER_SCALE = 0.05


def _kv_heads(recurrent: Sequence[bool], n_head_kv: int) -> list[int]:
    """``head_count_kv`` per layer: 0 on recurrent layers."""
    return [0 if r else n_head_kv for r in recurrent]


def _mamba2(sink: TensorSink, p: str, n_embd: int, d_conv: int, d_inner: int, d_state: int,
            n_ssm_head: int, n_group: int) -> None:
    """A Mamba-2 layer's tensors (granitehybrid, nemotron_h): ``ssm_in``, ``ssm_conv1d``
    and its bias, ``ssm_dt.bias``, ``ssm_a`` and ``ssm_d`` ({1, n_head}, no ``.weight``
    suffix), the grouped ``ssm_norm``, ``ssm_out``."""
    d_xbc = d_inner + 2 * n_group * d_state
    sink.matrix("ssm_in", p + "ssm_in.weight", n_embd, d_inner + d_xbc + n_ssm_head)
    sink.matrix("ssm_conv1d", p + "ssm_conv1d.weight", d_conv, d_xbc, scale=0.3)
    bias(sink, p + "ssm_conv1d.bias", d_xbc)
    sink.vector(p + "ssm_dt.bias", n_ssm_head, center=0.0, spread=0.1)
    sink.array(p + "ssm_a", -np.linspace(1.0, 4.0, n_ssm_head).reshape(n_ssm_head, 1))
    sink.array(p + "ssm_d", np.ones((n_ssm_head, 1)))
    sink.array(p + "ssm_norm.weight", np.ones((n_group, d_inner // n_group)))
    sink.matrix("ssm_out", p + "ssm_out.weight", d_inner, n_embd)


#: LFM2's layout in small: conv, conv, attention, conv, attention (True = recurrent)
LFM2_PATTERN = (True, True, False, True, False)


def write_lfm2(
    path: str | Path, *, n_embd: int = 160, n_head: int = 5, n_head_kv: int = 1,
    n_ff: int = 416, pattern: Sequence[bool] = LFM2_PATTERN, l_cache: int = 3,
    n_vocab: int = 301, tie_embeddings: bool = True,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    rope_freq_base: float = 1_000_000.0, rms_eps: float = 1e-5, n_expert: int = 0,
    n_expert_used: int = 2, n_ff_exp: int = 96, dense_lead: int = 1, gating: int = 2,
    seed: int = 0,
) -> FixtureInfo:
    """Arch ``lfm2`` (``n_expert > 0``: ``lfm2moe``, MoE FFNs of ``n_ff_exp`` with an
    expert selection bias after ``dense_lead`` dense layers, ``gating`` the
    expert_gating_func: 1 softmax, 2 sigmoid): ``pattern[il]`` True makes layer il a short-convolution layer
    (``head_count_kv`` 0 there, ``shortconv.{conv,in_proj,out_proj}``), False an attention
    layer with per-head Q/K RMS norms. ``l_cache`` is the conv width (``shortconv.l_cache``).

    Default: n_embd 160, 5 heads of 32 over 1 KV head, n_ff 416 (13 * 32), kernel 3, the
    output norm ``token_embd_norm`` (llama.cpp's LLM_TENSOR_OUTPUT_NORM_LFM2), tied output."""
    n_layer = len(pattern)
    hd = n_embd // n_head
    arch = "lfm2moe" if n_expert else "lfm2"

    def family_keys(w: gguf.GGUFWriter) -> None:
        w.add_uint32(gguf.Keys.ShortConv.L_CACHE.format(arch=arch), l_cache)
        if n_expert:
            expert_counts(w, arch, n_expert, n_expert_used)
            w.add_expert_feed_forward_length(n_ff_exp)
            w.add_leading_dense_block_count(dense_lead)
            w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))

    sink = start(path, arch, HYBRID_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=_kv_heads(pattern, n_head_kv), n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length, rms_eps=rms_eps,
                 rope_freq_base=rope_freq_base, after={"vocab_size": family_keys})
    embeddings(sink, n_embd, n_vocab, tie_embeddings, norm="token_embd_norm")
    kv_dim = n_head_kv * hd
    for i, recurrent in enumerate(pattern):
        p = f"blk.{i}."
        sink.vector(p + "ffn_norm.weight", n_embd)
        if n_expert and i >= dense_lead:
            moe(sink, p, n_embd, n_ff_exp, n_expert, router_scale=ROUTER_SCALE)
            sink.vector(p + "exp_probs_b.bias", n_expert, center=0.0, spread=0.1)
        else:
            ffn(sink, p, n_embd, n_ff, order=GATE_DOWN_UP)
        sink.vector(p + "attn_norm.weight", n_embd)
        if recurrent:
            sink.matrix("shortconv.conv", p + "shortconv.conv.weight", l_cache, n_embd, scale=0.3)
            sink.matrix("shortconv.in_proj", p + "shortconv.in_proj.weight", n_embd, 3 * n_embd)
            sink.matrix("shortconv.out_proj", p + "shortconv.out_proj.weight", n_embd, n_embd)
        else:
            sink.vector(p + "attn_q_norm.weight", hd)
            sink.vector(p + "attn_k_norm.weight", hd)
            qkv(sink, p, n_embd, n_embd, kv_dim)
            sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
    return done(sink, tie=tie_embeddings, n_head_kv=n_head_kv)


#: a granitehybrid layout in small: mamba2, attention, mamba2, mamba2 (True = recurrent)
GRANITE_HYBRID_PATTERN = (True, False, True, True)


def write_granitehybrid(
    path: str | Path, *, n_embd: int = 96, n_head: int = 3, n_head_kv: int = 1,
    n_ff: int = 224, pattern: Sequence[bool] = GRANITE_HYBRID_PATTERN, d_conv: int = 4,
    d_state: int = 16, n_ssm_head: int = 6, n_group: int = 2, n_vocab: int = 289,
    tie_embeddings: bool = True, biases: bool = False,
    rope_finetuned: bool | None = None, embedding_scale: float | None = 12.0,
    residual_scale: float | None = 0.22, logit_scale: float | None = 8.0,
    attention_scale: float | None = 0.015625, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 10_000.0, rms_eps: float = 1e-5,
    n_expert: int = 0, n_expert_used: int = 2, n_ff_shexp: int = 0, seed: int = 0,
) -> FixtureInfo:
    """Arch ``granitehybrid`` (``n_expert > 0``: MoE FFN of ``n_ff`` per expert, and a
    shared expert of ``n_ff_shexp`` when non-zero, as Granite 4.0 H Tiny/Small): ``pattern[il]`` True makes layer il a Mamba-2 layer
    (``head_count_kv`` 0; ``ssm_in``, ``ssm_conv1d`` (+ bias), ``ssm_dt.bias``, ``ssm_a``,
    ``ssm_d``, ``ssm_norm``, ``ssm_out``), False an attention layer. d_inner = 2 * n_embd
    (llama.cpp asserts it); ``n_ssm_head`` is ``ssm.time_step_rank``.

    Default: n_embd 96, d_inner 192 in 6 SSM heads of 32, 2 groups, d_state 16, kernel 4;
    3 attention heads of 32 over 1 KV head; n_ff 224 (7 * 32); Granite multipliers."""
    n_layer = len(pattern)
    hd = n_embd // n_head
    d_inner = 2 * n_embd
    arch = "granitehybrid"

    def family_keys(w: gguf.GGUFWriter) -> None:
        ssm_keys(w, d_conv=d_conv, d_inner=d_inner, d_state=d_state, n_rank=n_ssm_head,
                 n_group=n_group)
        if n_expert:
            expert_counts(w, arch, n_expert, n_expert_used)
            if n_ff_shexp:
                w.add_expert_shared_feed_forward_length(n_ff_shexp)
        granite_keys(w, logit_scale=logit_scale, embedding_scale=embedding_scale,
                     residual_scale=residual_scale, attention_scale=attention_scale,
                     rope_finetuned=rope_finetuned)

    sink = start(path, arch, HYBRID_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=_kv_heads(pattern, n_head_kv), n_ff=n_ff,
                 n_layer=n_layer, n_vocab=n_vocab, context_length=context_length, rms_eps=rms_eps,
                 rope_freq_base=rope_freq_base, after={"vocab_size": family_keys})
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    kv_dim = n_head_kv * hd
    for i, recurrent in enumerate(pattern):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        if recurrent:
            _mamba2(sink, p, n_embd, d_conv, d_inner, d_state, n_ssm_head, n_group)
        else:
            qkv(sink, p, n_embd, n_embd, kv_dim)
            sink.matrix("attn_output", p + "attn_output.weight", n_embd, n_embd)
            if biases:
                bias(sink, p + "attn_output.bias", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        if n_expert:
            moe(sink, p, n_embd, n_ff, n_expert, router_scale=ROUTER_SCALE)
            if n_ff_shexp:
                ffn(sink, p, n_embd, n_ff_shexp, suffix="_shexp")
        else:
            ffn(sink, p, n_embd, n_ff, biases=biases, order=GATE_DOWN_UP)
    return done(sink, tie=tie_embeddings, n_head_kv=n_head_kv)


def write_qwen3next(
    path: str | Path, *, n_embd: int = 128, n_head: int = 4, n_head_kv: int = 2,
    head_dim: int = 32, n_layer: int = 4, full_attention_interval: int | None = None,
    d_conv: int = 4, d_state: int = 32, n_k_heads: int = 2, n_v_heads: int = 4,
    n_expert: int = 6, n_expert_used: int = 2, n_ff_exp: int = 96, n_ff_shexp: int = 160,
    n_vocab: int = 293, tie_embeddings: bool = False, arch: str = "qwen3next",
    n_ff: int = 224, rope_sections: Sequence[int] = (4, 6, 6, 0),
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    rope_freq_base: float = 10_000_000.0, rms_eps: float = 1e-6, n_nextn: int = 0,
    gate_up_merged: bool = False, seed: int = 0,
) -> FixtureInfo:
    """Arch ``qwen3next`` (also ``qwen35``, ``qwen35moe``: see below): layers ``il`` with ``(il + 1) % interval != 0`` are gated delta
    net layers (``attn_qkv``, ``attn_gate``, ``ssm_ba``, ``ssm_conv1d``, ``ssm_dt.bias``,
    ``ssm_a``, ``ssm_norm``, ``ssm_out``), the others gated attention (Q projection twice
    the head size, Q/K norms); every layer has ``attn_post_norm``, routed experts and a
    gated shared expert. ``full_attention_interval`` None leaves the key out (default 4).

    Default: 4 layers (3 delta net, 1 attention); d_inner = d_state * n_v_heads = 128,
    2 K heads and 4 V heads of 32 (K/V repeated), kernel 4; 4 heads of 32 over 2 KV heads;
    6 experts (2 used) of 96, shared expert 160.

    ``arch="qwen35"``/``"qwen35moe"``: beta and alpha projections ``ssm_beta``/``ssm_alpha``
    instead of ``ssm_ba``, ``rope.dimension_sections`` (``rope_sections``, IMRoPE); qwen35
    has a dense FFN of ``n_ff`` instead of experts.

    ``n_nextn`` MTP blocks follow the ``n_layer`` trunk layers: a full-attention layer's
    tensors plus ``nextn.eh_proj/enorm/hnorm/shared_head_norm`` (``load_block_mtp``; never
    recurrent: ``is_recr_impl[i] = i < n_layer() && ...``). ``gate_up_merged``: the
    experts' gate and up as one ``ffn_gate_up_exps`` [n_embd, 2 n_ff_exp, n_expert]
    (``create_tensor_gate_up_exps``; the converter's ``--fuse-gate-up-exps``)."""
    if arch not in ("qwen3next", "qwen35", "qwen35moe"):
        raise ValueError(f"arch {arch!r}")
    interval = 4 if full_attention_interval is None else full_attention_interval
    pattern = [(i + 1) % interval != 0 for i in range(n_layer)] + [False] * n_nextn
    d_inner = d_state * n_v_heads
    moe_ffn = arch != "qwen35"

    def family_keys(w: gguf.GGUFWriter) -> None:
        if moe_ffn:
            expert_counts(w, arch, n_expert, n_expert_used)
            w.add_expert_feed_forward_length(n_ff_exp)
            w.add_expert_shared_feed_forward_length(n_ff_shexp)
        ssm_keys(w, d_conv=d_conv, d_inner=d_inner, d_state=d_state, n_rank=n_v_heads,
                 n_group=n_k_heads)
        if full_attention_interval is not None:
            w.add_uint32(gguf.Keys.LLM.FULL_ATTENTION_INTERVAL.format(arch=arch),
                         full_attention_interval)

    after = {"vocab_size": family_keys}
    if n_nextn:
        after["block_count"] = lambda w: w.add_nextn_predict_layers(n_nextn)
    if arch != "qwen3next":
        after["feed_forward_length"] = lambda w: w.add_rope_dimension_sections(list(rope_sections))
    sink = start(path, arch, HYBRID_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                 n_ff=n_ff_exp if moe_ffn else n_ff, n_layer=n_layer + n_nextn, n_vocab=n_vocab,
                 context_length=context_length, rms_eps=rms_eps, rope_freq_base=rope_freq_base,
                 head_dim=head_dim, after=after)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    key_dim, value_dim = d_state * n_k_heads, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    for i, recurrent in enumerate(pattern):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        if recurrent:
            sink.matrix("attn_qkv", p + "attn_qkv.weight", n_embd, conv_dim)
            sink.matrix("attn_gate", p + "attn_gate.weight", n_embd, value_dim)
            sink.matrix("ssm_conv1d", p + "ssm_conv1d.weight", d_conv, conv_dim, scale=0.3)
            sink.vector(p + "ssm_dt.bias", n_v_heads, center=0.0, spread=0.1)
            sink.array(p + "ssm_a", -np.linspace(0.5, 2.0, n_v_heads))
            if arch == "qwen3next":
                sink.matrix("ssm_ba", p + "ssm_ba.weight", n_embd, 2 * n_v_heads)
            else:
                sink.matrix("ssm_beta", p + "ssm_beta.weight", n_embd, n_v_heads)
                sink.matrix("ssm_alpha", p + "ssm_alpha.weight", n_embd, n_v_heads)
            sink.vector(p + "ssm_norm.weight", d_state)
            sink.matrix("ssm_out", p + "ssm_out.weight", value_dim, n_embd)
        else:
            qkv(sink, p, n_embd, 2 * head_dim * n_head, head_dim * n_head_kv)
            sink.matrix("attn_output", p + "attn_output.weight", head_dim * n_head, n_embd)
            sink.vector(p + "attn_q_norm.weight", head_dim)
            sink.vector(p + "attn_k_norm.weight", head_dim)
        if i >= n_layer:  # the MTP block's own tensors
            sink.matrix("nextn.eh_proj", p + "nextn.eh_proj.weight", 2 * n_embd, n_embd)
            for t in ("enorm", "hnorm", "shared_head_norm"):
                sink.vector(p + f"nextn.{t}.weight", n_embd)
        if not moe_ffn:
            ffn(sink, p, n_embd, n_ff, order=GATE_DOWN_UP)
            continue
        moe(sink, p, n_embd, n_ff_exp, n_expert, router_scale=ROUTER_SCALE,
            order=("down", "gate_up") if gate_up_merged else ("down", "gate", "up"))
        sink.vector(p + "ffn_gate_inp_shexp.weight", n_embd, center=0.0, spread=0.05)
        ffn(sink, p, n_embd, n_ff_shexp, suffix="_shexp")
    return done(sink, tie=tie_embeddings, n_layer=n_layer)


def write_nemotron_h(
    path: str | Path, *, n_embd: int = 96, n_head: int = 3, n_head_kv: int = 1,
    n_ff: int = 160, pattern: str = "M-M*-M", d_conv: int = 4, d_inner: int = 128,
    d_state: int = 16, n_ssm_head: int = 4, n_group: int = 2, n_vocab: int = 281,
    tie_embeddings: bool = False, biases: bool = False,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    norm_eps: float = 1e-5, arch: str = "nemotron_h", n_expert: int = 6,
    n_expert_used: int | Sequence[int] = 2, n_ff_exp: int = 64, n_ff_shexp: int = 96,
    latent: int = 0, expert_weights_norm: bool = True, expert_weights_scale: float = 2.5,
    n_nextn: int = 0, seed: int = 0,
) -> FixtureInfo:
    """Arch ``nemotron_h`` (or ``nemotron_h_moe``, the same tensors): ``pattern`` as in the
    checkpoints' hybrid_override_pattern, one character per layer: ``M`` Mamba-2
    (head_count_kv 0, feed_forward_length 0), ``*`` attention (feed_forward_length 0, no
    rope), ``-`` a squared-ReLU MLP (head_count_kv 0, ``ffn_up``/``ffn_down``), ``E`` a MoE
    layer (``ffn_gate_inp``, ``exp_probs_b``, ``ffn_up_exps``/``ffn_down_exps`` of
    ``n_ff_exp``, shared expert ``ffn_up_shexp``/``ffn_down_shexp`` of ``n_ff_shexp``; with
    ``latent`` the experts work in a ``moe_latent_size`` space between ``ffn_latent_down``
    and ``ffn_latent_up``). ``biases`` adds the optional attention-output and MLP biases.
    ``n_nextn`` MTP blocks (MoE files) follow: attention + MoE sub-layers and the ``nextn.*``
    tensors, with head_count_kv and feed_forward_length non-zero, as the converter writes
    them (``_attn_layers`` and ``_mlp_layers`` both list the MTP block).

    Default: M - M * - M; n_embd 96, d_inner 128 in 4 SSM heads of 32, 2 groups, d_state
    16, kernel 4; 3 attention heads of 32 over 1 KV head; n_ff 160 (5 * 32)."""
    if set(pattern) - set("M*-E"):
        raise ValueError("pattern: M (mamba2), * (attention), - (MLP), E (MoE)")
    n_layer = len(pattern)
    hd = n_embd // n_head
    if n_nextn and "E" not in pattern:
        raise ValueError("MTP blocks belong to MoE files (pattern with E)")
    pattern = pattern + "T" * n_nextn  # T: an MTP block (attention + MoE)

    def expert_keys(w: gguf.GGUFWriter) -> None:
        if "E" not in pattern:
            return
        expert_counts(w, arch, n_expert, n_expert_used)
        w.add_expert_feed_forward_length(n_ff_exp)
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
        w.add_expert_weights_norm(expert_weights_norm)
        w.add_expert_weights_scale(expert_weights_scale)
        if latent:
            w.add_uint32(gguf.Keys.LLM.MOE_LATENT_SIZE.format(arch=arch), latent)

    after = {"feed_forward_length": expert_keys,
             "value_length": lambda w: w.add_layer_norm_eps(norm_eps),
             "vocab_size": lambda w: ssm_keys(w, d_conv=d_conv, d_inner=d_inner,
                                              d_state=d_state, n_rank=n_ssm_head,
                                              n_group=n_group)}
    if n_nextn:
        after["block_count"] = lambda w: w.add_nextn_predict_layers(n_nextn)
    sink = start(path, arch, HYBRID_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head,
                 n_head_kv=[n_head_kv if c in "*T" else 0 for c in pattern],
                 n_ff=[n_ff if c in "-ET" else 0 for c in pattern], n_layer=n_layer + n_nextn,
                 n_vocab=n_vocab, context_length=context_length, rms_eps=norm_eps,
                 rope_freq_base=None, head_dim=hd, after=after)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    kv_dim = n_head_kv * hd
    for i, c in enumerate(pattern):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        if c == "M":
            _mamba2(sink, p, n_embd, d_conv, d_inner, d_state, n_ssm_head, n_group)
        if c == "T":
            for t in ("enorm", "hnorm", "shared_head_norm"):
                sink.vector(p + f"nextn.{t}.weight", n_embd)
            sink.matrix("nextn.eh_proj", p + "nextn.eh_proj.weight", 2 * n_embd, n_embd)
            sink.vector(p + "post_attention_norm.weight", n_embd)
        if c in "*T":
            qkv(sink, p, n_embd, n_head * hd, kv_dim)
            sink.matrix("attn_output", p + "attn_output.weight", n_head * hd, n_embd)
            if biases:
                bias(sink, p + "attn_output.bias", n_embd)
        if c in "ET":
            moe_embd = latent or n_embd
            sink.matrix("ffn_gate_inp", p + "ffn_gate_inp.weight", n_embd, n_expert)
            sink.vector(p + "exp_probs_b.bias", n_expert, center=0.0, spread=0.1)
            if latent:
                sink.matrix("ffn_latent_down", p + "ffn_latent_down.weight", n_embd, latent)
                sink.matrix("ffn_latent_up", p + "ffn_latent_up.weight", latent, n_embd)
            sink.experts("ffn_down_exps", p + "ffn_down_exps.weight", n_ff_exp, moe_embd,
                     n_expert)
            sink.experts("ffn_up_exps", p + "ffn_up_exps.weight", moe_embd, n_ff_exp,
                     n_expert)
            sink.matrix("ffn_down_shexp", p + "ffn_down_shexp.weight", n_ff_shexp, n_embd)
            sink.matrix("ffn_up_shexp", p + "ffn_up_shexp.weight", n_embd, n_ff_shexp)
        if c == "-":
            ffn(sink, p, n_embd, n_ff, biases=biases, order=("up", "down"))
    return done(sink, tie=tie_embeddings, n_head_kv=n_head_kv, n_ff=n_ff, n_layer=n_layer)
