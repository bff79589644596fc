"""Tiny but valid GGUFs for the DeepSeek-style MoE families (shared experts, selection
bias, leading dense layers).

* :func:`write_deepseek2` -- arch ``deepseek2`` (DeepSeek V2/V3/R1, Kimi K2): multi-head
  latent attention with the MLA head sizes (K-only cache), Q through a LoRA or one
  matrix, leading dense layers, MoE layers with shared experts, optional expert-selection
  bias (``exp_probs_b``) and expert groups;
* :func:`write_glm4moe` -- arch ``glm4moe`` (GLM-4.5): the same MoE layout on standard
  attention with Q/K/V biases and partial rope, plus NextN/MTP blocks llama.cpp's trunk
  graph skips;
* :func:`write_ernie4_5_moe` -- arch ``ernie4_5-moe`` (ERNIE 4.5 MoE);
* :func:`write_minimax_m2` -- arch ``minimax-m2`` (MiniMax-M2).

Each writes exactly the tensors the family's ``load_arch_tensors`` creates in the llama.cpp
vendored by llama-cpp-python 0.3.36 (it refuses missing and unexpected tensors); deepseek2
gets the keys the converter writes for an MLA model: ``key_length = kv_lora_rank + n_rot``
(one K row of the cache), ``value_length = kv_lora_rank``, and the decompressed head sizes
``key_length_mla = qk_nope + n_rot`` and ``value_length_mla``. Sizes are odd on purpose.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import gguf
from gguf_writer import (ATTN_TYPES, QT, GATE_DOWN_UP, TensorSink, attention, embeddings,
                         expert_counts, ffn, ffn_types, finish, moe, qk_norms, qkv, start)

__all__ = ["write_deepseek2", "write_glm4moe", "write_ernie4_5_moe", "write_minimax_m2",
           "DeepseekInfo", "DEEPSEEK2_DEFAULT_TYPES", "GLM4MOE_DEFAULT_TYPES",
           "ERNIE_MINIMAX_DEFAULT_TYPES"]

# n_embd 224 (7 * 32), q_lora 160, kv_lora 96, nope 48 (F16: not a multiple of 32)
DEEPSEEK2_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "output": QT.Q8_0, "attn_q_a": QT.Q4_0, "attn_q_b": QT.Q8_0,
    "attn_q": QT.Q5_0, "attn_kv_a_mqa": QT.Q8_0, "attn_k_b": QT.F16, "attn_kv_b": QT.Q8_0,
    "attn_v_b": QT.Q8_0, "attn_output": QT.Q4_1, "nextn.eh_proj": QT.Q8_0,
    "ffn_gate_inp": QT.F32, **ffn_types(QT.Q4_0, QT.Q8_0, QT.Q5_0, "_exps"),
    **ffn_types(QT.Q8_0, QT.Q4_0, QT.F16, "_shexp"),
}


@dataclass
class DeepseekInfo:
    """What was written (for expectations in tests)."""

    path: Path
    n_layer: int
    n_embd: int
    n_head: int
    kv_lora_rank: int
    n_rot: int
    n_vocab: int

    def __fspath__(self) -> str:
        return str(self.path)


def write_deepseek2(
    path: str | Path, *, n_embd: int = 224, n_head: int = 3, n_layer: int = 3,
    n_vocab: int = 301, q_lora_rank: int = 160, kv_lora_rank: int = 96, qk_nope: int = 48,
    n_rot: int = 32, v_head: int = 64, n_ff: int = 416, n_ff_exp: int = 96,
    n_expert: int = 8, n_expert_used: int = 3, n_expert_shared: int = 1,
    n_layer_dense_lead: int = 1, expert_groups: tuple[int, int] | None = (4, 2),
    gating: int | None = 2, weights_norm: bool | None = True,
    weights_scale: float | None = 2.5, probs_bias: bool = True,
    n_nextn: int = 0, legacy_kv_b: bool = False, attn_temp_scale: float | None = None,
    merged_gate_up: bool = False,
    tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 10_000.0, rms_eps: float = 1e-6,
    seed: int = 0,
) -> DeepseekInfo:
    """Arch ``deepseek2`` with MLA. Default: DeepSeek V3 layout -- Q LoRA of 160, KV LoRA
    of 96, 3 heads of 48 + 32 (rope) for K and 64 for V, layer 0 dense, then 8 experts of
    96 in 4 groups (2 groups used), 3 experts used, one shared expert, sigmoid gating with
    a selection bias, normalised weights scaled by 2.5. ``q_lora_rank=0`` writes ``attn_q``
    (the lite layout; the key is then written as 0); ``None`` leaves a key out.
    ``n_nextn`` NextN/MTP blocks follow the ``n_layer`` trunk layers (``block_count`` counts
    both). ``legacy_kv_b`` writes a pre-MLA file (no MLA head sizes, ``attn_kv_b``);
    ``merged_gate_up`` one ``ffn_gate_up_exps`` per MoE layer instead of gate and up."""
    arch = "deepseek2"
    n_all = n_layer + n_nextn
    sink = start(path, arch, DEEPSEEK2_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head if legacy_kv_b else 1, n_ff=n_ff,
                 n_layer=n_all, n_vocab=n_vocab, context_length=context_length,
                 rms_eps=rms_eps, rope_freq_base=rope_freq_base, n_rot=n_rot)
    w = sink.w
    if legacy_kv_b:
        w.add_key_length(qk_nope + n_rot)
        w.add_value_length(v_head)
    else:
        w.add_key_length(kv_lora_rank + n_rot)
        w.add_value_length(kv_lora_rank)
        w.add_key_length_mla(qk_nope + n_rot)
        w.add_value_length_mla(v_head)
    if n_nextn:
        w.add_nextn_predict_layers(n_nextn)
    if attn_temp_scale is not None:  # Mistral Large 3's query temperature tuning
        w.add_attn_temperature_scale(attn_temp_scale)
        w.add_attn_temperature_length(16)
    w.add_q_lora_rank(q_lora_rank)
    w.add_kv_lora_rank(kv_lora_rank)
    _moe_keys(w, arch, n_layer_dense_lead, n_expert, n_expert_used, n_expert_shared, n_ff_exp,
              gating, weights_norm, weights_scale)
    if expert_groups is not None:
        w.add_expert_group_count(expert_groups[0])
        w.add_expert_group_used_count(expert_groups[1])
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    k_mla = qk_nope + n_rot
    for i in range(n_all):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        if q_lora_rank > 0:
            sink.vector(p + "attn_q_a_norm.weight", q_lora_rank)
        sink.vector(p + "attn_kv_a_norm.weight", kv_lora_rank)
        if q_lora_rank > 0:
            sink.matrix("attn_q_a", p + "attn_q_a.weight", n_embd, q_lora_rank)
            sink.matrix("attn_q_b", p + "attn_q_b.weight", q_lora_rank, n_head * k_mla)
        else:
            sink.matrix("attn_q", p + "attn_q.weight", n_embd, n_head * k_mla)
        sink.matrix("attn_kv_a_mqa", p + "attn_kv_a_mqa.weight", n_embd, kv_lora_rank + n_rot)
        if legacy_kv_b:
            sink.matrix("attn_kv_b", p + "attn_kv_b.weight", kv_lora_rank,
                        n_head * (qk_nope + v_head))
        else:
            # per-head 3-D weights: ne [qk_nope, kv_lora, n_head], [kv_lora, v_head, n_head]
            sink.experts("attn_k_b", p + "attn_k_b.weight", qk_nope, kv_lora_rank, n_head)
            sink.experts("attn_v_b", p + "attn_v_b.weight", kv_lora_rank, v_head, n_head)
        sink.matrix("attn_output", p + "attn_output.weight", n_head * v_head, n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        if i < n_layer_dense_lead:
            ffn(sink, p, n_embd, n_ff, order=GATE_DOWN_UP)
        else:
            if merged_gate_up:  # one tensor: gate rows, then up rows
                moe(sink, p, n_embd, n_ff_exp, n_expert, gate_exps=False, probs_bias=probs_bias,
                    order=("down",))
                sink.experts("ffn_gate_exps", p + "ffn_gate_up_exps.weight", n_embd,
                             2 * n_ff_exp, n_expert)
            else:
                moe(sink, p, n_embd, n_ff_exp, n_expert, probs_bias=probs_bias,
                    order=("down", "gate", "up"))
            shared = n_ff_exp * n_expert_shared
            ffn(sink, p, n_embd, shared, suffix="_shexp", order=GATE_DOWN_UP)
        if i >= n_layer:
            _nextn(sink, p, n_embd)
    return _done(sink, n_layer=n_layer, kv_lora_rank=kv_lora_rank, n_rot=n_rot)


GLM4MOE_DEFAULT_TYPES: dict[str, QT] = {
    **ATTN_TYPES, "output": QT.Q8_0, "attn_output": QT.Q5_1, "nextn.eh_proj": QT.Q8_0,
    "ffn_gate_inp": QT.F32, **ffn_types(QT.Q8_0, QT.Q4_0, QT.Q4_1, "_exps"),
    **ffn_types(QT.Q8_0, QT.Q8_0, QT.Q8_0, "_shexp"),
}


def write_glm4moe(
    path: str | Path, *, n_embd: int = 288, n_head: int = 4, n_head_kv: int = 2,
    head_dim: int = 96, n_rot: int = 48, n_layer: int = 3, n_nextn: int = 1,
    n_vocab: int = 305, n_ff: int = 352, n_ff_exp: int = 64, n_expert: int = 6,
    n_expert_used: int = 2, n_expert_shared: int = 1, n_layer_dense_lead: int = 1,
    qk_norm: bool = False, gating: int | None = None, weights_norm: bool | None = True,
    weights_scale: float | None = 1.5, tie_embeddings: bool = False,
    weight_types: Mapping[str, QT] | None = None, context_length: int = 4096,
    rope_freq_base: float = 1_000_000.0, rms_eps: float = 1e-5, seed: int = 0,
) -> DeepseekInfo:
    """Arch ``glm4moe`` (GLM-4.5): Q/K/V biases, partial NEOX rope (``n_rot`` of
    ``head_dim``), optional per-head Q/K norms, ``post_attention_norm``, layers below
    ``n_layer_dense_lead`` dense, the others MoE with ``exp_probs_b`` and shared experts.
    ``n_layer`` trunk layers plus ``n_nextn`` NextN/MTP blocks (``block_count`` counts both;
    each NextN block has a full MoE layer's tensors plus ``nextn.eh_proj/enorm/hnorm`` and
    ``nextn.shared_head_norm``). ``gating=None`` leaves the key out (llama.cpp: sigmoid)."""
    arch = "glm4moe"
    n_all = n_layer + n_nextn
    sink = start(path, arch, GLM4MOE_DEFAULT_TYPES, weight_types=weight_types, seed=seed,
                 n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_layer=n_all,
                 n_vocab=n_vocab, context_length=context_length, rms_eps=rms_eps,
                 rope_freq_base=rope_freq_base, head_dim=head_dim, n_rot=n_rot)
    _moe_keys(sink.w, arch, n_layer_dense_lead, n_expert, n_expert_used, n_expert_shared, n_ff_exp,
              gating, weights_norm, weights_scale)
    if n_nextn:
        sink.w.add_nextn_predict_layers(n_nextn)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_all):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        qkv(sink, p, n_embd, q_dim, kv_dim)
        for x, n in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
            sink.vector(p + f"attn_{x}.bias", n, center=0.0)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        if qk_norm:
            qk_norms(sink, p, head_dim, head_dim)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        if i < n_layer_dense_lead:
            ffn(sink, p, n_embd, n_ff, order=GATE_DOWN_UP)
        else:
            moe(sink, p, n_embd, n_ff_exp, n_expert, probs_bias=True)
            if n_expert_shared > 0:
                shared = n_ff_exp * n_expert_shared
                ffn(sink, p, n_embd, shared, suffix="_shexp", order=GATE_DOWN_UP)
        if i >= n_layer:
            _nextn(sink, p, n_embd)
    return _done(sink, n_layer=n_layer, n_rot=n_rot)


ERNIE_MINIMAX_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0, "output": QT.Q8_0, "attn_q": QT.Q4_0, "attn_k": QT.Q8_0,
    "attn_v": QT.F16, "attn_output": QT.Q5_0, "ffn_gate_inp": QT.F32,
    **ffn_types(QT.Q4_1, QT.Q8_0, QT.Q4_0, "_exps"),
    **ffn_types(QT.Q8_0, QT.Q4_0, QT.Q8_0, "_shexp"),
}


def _moe_keys(w: gguf.GGUFWriter, arch: str, n_dense_lead: int, n_expert: int,
              n_expert_used: int, n_expert_shared: int, n_ff_exp: int, gating: int | None,
              weights_norm: bool | None, weights_scale: float | None) -> None:
    """The MoE keys of the DeepSeek-style families (``None``: left out)."""
    w.add_leading_dense_block_count(n_dense_lead)
    expert_counts(w, arch, n_expert, n_expert_used)
    w.add_expert_shared_count(n_expert_shared)
    w.add_expert_feed_forward_length(n_ff_exp)
    if gating is not None:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    if weights_norm is not None:
        w.add_expert_weights_norm(weights_norm)
    if weights_scale is not None:
        w.add_expert_weights_scale(weights_scale)


def _nextn(sink: TensorSink, p: str, n_embd: int) -> None:
    """A NextN/MTP block's own tensors (beside a full layer's)."""
    sink.matrix("nextn.eh_proj", p + "nextn.eh_proj.weight", 2 * n_embd, n_embd)
    sink.vector(p + "nextn.enorm.weight", n_embd)
    sink.vector(p + "nextn.hnorm.weight", n_embd)
    sink.vector(p + "nextn.shared_head_norm.weight", n_embd)


def _done(sink: TensorSink, *, n_layer: int, n_rot: int, kv_lora_rank: int = 0) -> DeepseekInfo:
    """Write the file; its :class:`DeepseekInfo` (``n_layer`` the trunk's)."""
    finish(sink.w)
    return DeepseekInfo(path=sink.sizes["path"], n_layer=n_layer, n_embd=sink.sizes["n_embd"],
                        n_head=sink.sizes["n_head"], kv_lora_rank=kv_lora_rank, n_rot=n_rot,
                        n_vocab=sink.sizes["n_vocab"])


_PLAIN_KEYS = ("weight_types", "seed", "n_embd", "n_head", "n_head_kv", "head_dim", "n_layer",
               "n_ff", "n_vocab", "context_length", "rope_freq_base", "rms_eps")


def _plain_start(path: str | Path, arch: str, args: Mapping, *, n_rot: int,
                 n_ff_exp: int) -> TensorSink:
    """:func:`start` with :data:`ERNIE_MINIMAX_DEFAULT_TYPES` and the writer's own
    arguments named in ``_PLAIN_KEYS`` (``args``: the writer's ``locals()``), then the
    expert counts and width and the optional expert weights scale."""
    sink = start(path, arch, ERNIE_MINIMAX_DEFAULT_TYPES, n_rot=n_rot,
                 **{k: args[k] for k in _PLAIN_KEYS})
    expert_counts(sink.w, arch, args["n_expert"], args["n_expert_used"])
    sink.w.add_expert_feed_forward_length(n_ff_exp)
    if args["weights_scale"] is not None:
        sink.w.add_expert_weights_scale(args["weights_scale"])
    return sink


def write_ernie4_5_moe(
    path: str | Path, *, n_embd: int = 256, n_head: int = 4, n_head_kv: int = 2,
    head_dim: int = 64, n_layer: int = 4, n_vocab: int = 303, n_ff: int = 416,
    n_ff_exp: int = 96, n_expert: int = 6, n_expert_used: int = 2, n_ff_shexp: int = 160,
    n_layer_dense_lead: int = 1, moe_step: int = 1, probs_bias: bool = True,
    gate_exps: bool = True, out_bias: bool = True, weights_scale: float | None = None,
    tie_embeddings: bool = False, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 500_000.0, rms_eps: float = 1e-5,
    seed: int = 0,
) -> DeepseekInfo:
    """Arch ``ernie4_5-moe``: llama attention (``attn_output.bias`` loaded, never used),
    layers below ``n_layer_dense_lead`` dense, the others MoE (llama.cpp loads expert
    tensors for every layer from the dense lead on: real files use step 1); optional
    selection bias, ``ffn_gate_exps`` and shared expert (``n_ff_shexp=0``: none)."""
    sink = _plain_start(path, "ernie4_5-moe", locals(), n_rot=head_dim, n_ff_exp=n_ff_exp)
    w = sink.w
    w.add_interleave_moe_layer_step(moe_step)
    w.add_leading_dense_block_count(n_layer_dense_lead)
    if n_ff_shexp:
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
    embeddings(sink, n_embd, n_vocab, tie_embeddings)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        attention(sink, p, n_embd, q_dim, kv_dim)
        if out_bias:
            sink.vector(p + "attn_output.bias", n_embd, center=0.0)
        sink.vector(p + "ffn_norm.weight", n_embd)
        if i >= n_layer_dense_lead:
            moe(sink, p, n_embd, n_ff_exp, n_expert, gate_exps=gate_exps, probs_bias=probs_bias)
            if n_ff_shexp:
                ffn(sink, p, n_embd, n_ff_shexp, suffix="_shexp", order=GATE_DOWN_UP)
        else:
            ffn(sink, p, n_embd, n_ff, order=GATE_DOWN_UP)
    return _done(sink, n_layer=n_layer, n_rot=head_dim)


def write_minimax_m2(
    path: str | Path, *, n_embd: int = 288, n_head: int = 6, n_head_kv: int = 2,
    head_dim: int = 64, n_rot: int = 32, n_layer: int = 3, n_vocab: int = 307,
    n_ff: int = 96, n_expert: int = 7, n_expert_used: int = 3, gating: int | None = 2,
    weights_scale: float | None = None, weight_types: Mapping[str, QT] | None = None,
    context_length: int = 4096, rope_freq_base: float = 5_000_000.0, rms_eps: float = 1e-6,
    seed: int = 0,
) -> DeepseekInfo:
    """Arch ``minimax-m2``: whole-projection Q/K norms, partial NEOX rope (``n_rot`` of
    ``head_dim``), ``n_expert`` experts of ``n_ff`` (feed_forward_length; llama.cpp sizes
    the experts by it) in every layer with the required ``exp_probs_b`` and the GGUF's
    gating function (``None`` leaves it out: llama.cpp aborts); untied output."""
    sink = _plain_start(path, "minimax-m2", locals(), n_rot=n_rot, n_ff_exp=n_ff)
    if gating is not None:
        sink.w.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    embeddings(sink, n_embd, n_vocab, tie=False)
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    for i in range(n_layer):
        p = f"blk.{i}."
        qkv(sink, p, n_embd, q_dim, kv_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "attn_norm.weight", n_embd)
        qk_norms(sink, p, q_dim, kv_dim)
        sink.vector(p + "ffn_norm.weight", n_embd)
        moe(sink, p, n_embd, n_ff, n_expert)
        sink.vector(p + "exp_probs_b.bias", n_expert, center=0.0, spread=0.1)
    return _done(sink, n_layer=n_layer, n_rot=n_rot)
