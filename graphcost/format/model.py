"""Model hyperparameters from GGUF metadata, read the way llama.cpp's loader reads them.

Key names come from ``gguf.Keys``; defaults and per-layer handling follow
``src/llama-model.cpp`` / ``src/llama-hparams.cpp`` (for example a head count may be a
scalar or one value per layer, and is read as an array either way).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gguf import Keys

from graphcost.format.hparam_expr import evaluate
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.format.gguf_reader import GGUFHeader, LazyArray, TensorInfo


@dataclass(frozen=True)
class ModelInfo:
    """What the graph builders need to know about a model (sizes in elements)."""

    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]  # per layer
    n_head_kv: tuple[int, ...]  # per layer
    head_dim_k: int
    head_dim_v: int
    n_rot: int
    n_ff: tuple[int, ...]  # per layer
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    norm_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    rope_freq_base_swa: float
    rope_scaling_type: str
    n_swa: int
    is_swa: tuple[bool, ...]  # per layer
    attn_scale: float  # f_attention_scale (0: 1/sqrt(head_dim))
    final_logit_softcap: float
    embedding_scale: float
    header: GGUFHeader = field(repr=False, compare=False)
    #: granite: f_residual_scale (0: no scaling), f_logit_scale (logits / it)
    residual_scale: float = 0.0
    logit_scale: float = 0.0
    #: rope.scaling.finetuned; granite fills rope_pattern (has_rope) with it
    rope_finetuned: bool = False
    #: hparams.n_ctx_orig_yarn: rope.scaling.original_context_length, else n_ctx_train
    #: (llama_model::get_rope_factors picks LongRoPE's long factors above it)
    n_ctx_orig_yarn: int = 0
    #: hparams.rope_attn_factor (rope.scaling.attn_factor, LongRoPE's magnitude scale): the
    #: context's yarn_attn_factor, the rope op's attn_factor, when YaRN is off
    rope_attn_factor: float = 1.0
    #: mixture of experts: expert_count, expert_used_count (per layer), and the keys some
    #: architectures read (expert_weights_scale/_norm, expert_gating_func: 1 softmax, 2 sigmoid)
    n_expert: int = 0
    n_expert_used: tuple[int, ...] = ()
    expert_weights_scale: float = 0.0
    expert_weights_norm: bool = False
    expert_gating_func: int = 0
    #: f_attn_logit_softcapping when the architecture sets attn_soft_cap (gemma2), else 0
    attn_softcap: float = 0.0
    #: rope.dimension_sections (hparams.rope_sections, 4 entries; 0 when absent): multi-section
    #: rope (qwen3vl's IMROPE, glm4's MROPE when sections are set, hparams.use_mrope)
    rope_sections: tuple[int, ...] = (0, 0, 0, 0)
    #: attention.temperature_scale (f_attn_temp_scale, llama4/mistral3 / Mistral Large 3 query
    #: temperature tuning; 0: none)
    attn_temp_scale: float = 0.0
    #: n_deepstack_layers (qwen3vl): the input embedding is n_embd * (1 + this) wide
    n_deepstack_layers: int = 0
    #: hparams.rope_freq_scale_train_swa: 1 unless the family copies the trained scale
    #: (spec hparam ``rope_swa_from_train``: gemma2, gpt-oss)
    rope_freq_scale_swa: float = 1.0
    #: nextn_predict_layers: NextN/MTP blocks stored after the trunk (block_count counts
    #: them; ``n_layer`` does not: llama_hparams::n_layer() = n_layer_all - n_layer_nextn)
    n_layer_nextn: int = 0
    #: leading_dense_block_count: layers before the first MoE layer (deepseek2, glm4moe)
    n_layer_dense_lead: int = 0
    #: expert_group_count / expert_group_used_count (DeepSeek V3's grouped routing; 0: none)
    n_expert_groups: int = 0
    n_group_used: int = 0
    #: expert_shared_feed_forward_length (ernie4_5-moe: shared expert width, 0: none) and
    #: interleave_moe_layer_step (MoE every step-th layer)
    n_ff_shexp: int = 0
    n_moe_layer_step: int = 0
    #: attention.temperature_length (n_attn_temp_floor_scale: positions per temperature
    #: step of inp_attn_scale, read by deepseek2.cpp's load_hparams; 0: not given)
    attn_temp_length: int = 0
    #: multi-head latent attention (deepseek2): attention.q_lora_rank (0: no Q LoRA),
    #: attention.kv_lora_rank, and the per-head sizes after decompression
    #: (attention.key_length_mla / value_length_mla; 0 when the file has none: not MLA)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    head_dim_k_mla: int = 0
    head_dim_v_mla: int = 0

    @property
    def is_mla(self) -> bool:
        """llama_hparams::is_mla: both MLA head sizes are set."""
        return self.head_dim_k_mla != 0 and self.head_dim_v_mla != 0

    #: head sizes and rotated dims of sliding-window layers (attention.key_length_swa,
    #: value_length_swa, rope.dimension_count_swa; llama.cpp reads them for every
    #: architecture, defaulting to the full layers' values): gemma4; 0 = as full layers
    head_dim_k_swa: int = 0
    head_dim_v_swa: int = 0
    n_rot_swa: int = 0
    #: attention.shared_kv_layers (gemma4: the last N layers reuse earlier layers' KV)
    n_kv_shared_layers: int = 0
    #: expert_shared_count (glm4moe: shared experts, 0: none) and
    #: embedding_length_per_layer_input (gemma4: per-layer inputs' width, 0: none): the
    #: hyperparameters their loaders branch on
    n_expert_shared: int = 0
    n_embd_per_layer: int = 0

    def head_k(self, il: int) -> int:
        """llama_hparams::n_embd_head_k(il): the sliding-window size on SWA layers."""
        return self.head_dim_k_swa if self.is_swa[il] and self.head_dim_k_swa else self.head_dim_k

    def head_v(self, il: int) -> int:
        """llama_hparams::n_embd_head_v(il)."""
        return self.head_dim_v_swa if self.is_swa[il] and self.head_dim_v_swa else self.head_dim_v

    def rot(self, il: int) -> int:
        """llama_hparams::n_rot(il)."""
        return self.n_rot_swa if self.is_swa[il] and self.n_rot_swa else self.n_rot

    def n_embd_v_gqa_max(self) -> int:
        """llama_hparams::n_embd_v_gqa_max(): the widest V row over all layers."""
        return max(self.n_embd_v_gqa(il) for il in range(self.n_layer))
    #: hybrid/recurrent models: hparams.is_recr per layer (empty: no recurrent layer), and
    #: the sizes llama_hparams::n_embd_r / n_embd_s are computed from
    is_recr: tuple[bool, ...] = ()
    shortconv_l_cache: int = 0  # LFM2: shortconv.l_cache (conv kernel width)
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_n_group: int = 0
    ssm_dt_rank: int = 0  # Mamba-2: the number of SSM heads

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        return self.header.tensors

    def tensor(self, name: str) -> TensorInfo | None:
        return self.header.tensors.get(name)

    def n_embd_k_gqa(self, il: int) -> int:
        return self.head_k(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.head_v(il) * self.n_head_kv[il]

    def recurrent(self, il: int) -> bool:
        """llama_hparams::is_recr(il)."""
        return bool(self.is_recr) and self.is_recr[il]

    def n_embd_r(self) -> int:
        """llama_hparams::n_embd_r (src/llama-hparams.cpp): elements of one cell's rolling
        (conv) state per layer. LFM2: n_embd * (l_cache - 1); Mamba:
        (d_conv - 1) * (d_inner + 2 * n_group * d_state)."""
        if self.shortconv_l_cache != 0:
            return self.n_embd * (self.shortconv_l_cache - 1)
        return (max(self.ssm_d_conv - 1, 0)
                * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state))

    def n_embd_s(self) -> int:
        """llama_hparams::n_embd_s: elements of one cell's SSM state per layer (Mamba:
        d_state * d_inner; 0 for LFM2)."""
        return self.ssm_d_state * self.ssm_d_inner

    @property
    def weights_bytes(self) -> int:
        return sum(t.nbytes for t in self.header.tensors.values())

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.header.tensors.values())


def expr_names(m: ModelInfo) -> dict[str, float]:
    """The hyperparameter names a spec expression may use (:mod:`graphcost.format.hparam_expr`:
    the graph's statements, the loader's branches in ``tensors:``); a layer adds its own
    (``il``, ``is_swa``...)."""
    return {
        "n_embd": m.n_embd, "n_head": m.n_head[0], "n_head_kv": m.n_head_kv[0],
        "head_dim": m.head_dim_k, "head_dim_v": m.head_dim_v, "n_layer": m.n_layer,
        "n_rot": m.n_rot, "attn_scale": m.attn_scale,
        "final_logit_softcap": m.final_logit_softcap,
        "embedding_scale": m.embedding_scale, "n_ff": m.n_ff[0],
        "residual_scale": m.residual_scale, "logit_scale": m.logit_scale,
        "rope_finetuned": float(m.rope_finetuned), "n_swa": m.n_swa,
        "attn_temp_scale": m.attn_temp_scale, "n_expert": m.n_expert,
        # deepseek2 / glm4moe: leading dense layers; MLA ranks and head sizes
        "n_layer_dense_lead": m.n_layer_dense_lead,
        "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
        "head_dim_k_mla": m.head_dim_k_mla or m.head_dim_k,
        "head_dim_v_mla": m.head_dim_v_mla or m.head_dim_v,
        "n_vocab": m.n_vocab,
        "n_ff_shexp": m.n_ff_shexp, "n_moe_layer_step": m.n_moe_layer_step,
        "is_mla": float(m.is_mla),
        "n_kv_shared_layers": m.n_kv_shared_layers,
        "n_expert_shared": m.n_expert_shared, "n_embd_per_layer": m.n_embd_per_layer,
        # rope.scaling.type longrope (llama_hparams::rope_scaling_type_train)
        "longrope": float(m.rope_scaling_type == "longrope"),
    }


#: YaRN keys only some families read (deepseek2: yarn_log_multiplier; grok: the others);
#: :func:`yarn_context` assumes their defaults, so a file carrying one is not modelled there
YARN_UNREAD_KEYS = (Keys.Rope.SCALING_YARN_LOG_MUL, Keys.Rope.SCALING_YARN_EXT_FACTOR,
                    Keys.Rope.SCALING_YARN_ATTN_FACTOR, Keys.Rope.SCALING_YARN_BETA_FAST,
                    Keys.Rope.SCALING_YARN_BETA_SLOW)


def yarn_context(m: ModelInfo) -> dict[str, float]:
    """The rope op's YaRN parameters as ``llama_context``'s constructor sets them
    (llama-context.cpp, default context params: yarn_* = -1, "not set"), float32 like it:

    - ``ext_factor`` = 1 if the rope scaling type is YaRN, else 0;
    - ``attn_factor``: with YaRN, ``get_mscale(factor, 1) / (1 + 0.1 ln factor)`` with
      ``factor = 1 / rope_freq_scale`` and ``get_mscale(s, m) = 1 + 0.1 m ln s`` (1 for
      s <= 1): ggml's rope_yarn multiplies by ``1 + 0.1 ln factor`` again, so the two
      cancel; times ``hparams.rope_attn_factor`` in every case;
    - ``beta_fast`` 32, ``beta_slow`` 1 (llama-hparams.h defaults).

    ``hparams.rope_yarn_log_mul`` (deepseek2) and grok's yarn keys are taken at their
    defaults (0 / unset): see :data:`YARN_UNREAD_KEYS`."""
    import numpy as np

    f32 = np.float32
    ext = m.rope_scaling_type == "yarn"
    attn = f32(1)
    if ext:
        factor = f32(1) / f32(m.rope_freq_scale)
        ln = f32(np.log(factor))
        mscale = f32(1) if factor <= 1 else f32(f32(f32(0.1) * ln) + f32(1))
        attn = f32(mscale * f32(f32(1) / f32(f32(1) + f32(f32(0.1) * ln))))
    attn = f32(attn * f32(m.rope_attn_factor))
    return {"ext_factor": 1.0 if ext else 0.0, "attn_factor": float(attn),
            "beta_fast": 32.0, "beta_slow": 1.0}


class _Meta:
    """Typed access to ``{arch}.*`` keys; a wrong type names the key."""

    def __init__(self, header: GGUFHeader, arch: str):
        self.md = header.metadata
        self.path = header.path
        self.arch = arch

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def get(self, template: str, default: Any = None, *, required: bool = False):
        k = self.key(template)
        if k not in self.md:
            if required:
                raise GraphcostError(f"{self.path}: required metadata key {k!r} is missing")
            return default
        return self.md[k]

    def int(self, template: str, default: int | None = None, *, required: bool = False) -> int:
        """A non-negative integer that fits the ``uint32_t`` llama.cpp reads it into (every
        hparam read here is one: src/llama-hparams.h; get_key refuses a wider key)."""
        v = self.get(template, default, required=required)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= UINT32_MAX:
            raise GraphcostError(f"{self.path}: metadata key {self.key(template)!r} must be a "
                                 f"32-bit non-negative integer, got {_show(v)}")
        return v

    def float(self, template: str, default: float) -> float:
        v = self.get(template, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise GraphcostError(f"{self.path}: metadata key {self.key(template)!r} must be a "
                                 f"finite number, got {_show(v)}")
        return float(v)

    def per_layer(self, template: str, n_layer: int, default: int | None = None) -> tuple[int, ...]:
        """A scalar repeated per layer, or an array with one entry per layer."""
        v = self.get(template, default, required=default is None)
        if isinstance(v, LazyArray):
            v = v.load()
        if isinstance(v, list):
            if len(v) != n_layer or not all(isinstance(x, int) and 0 <= x <= UINT32_MAX
                                            for x in v):
                raise GraphcostError(f"{self.path}: metadata key {self.key(template)!r} must hold "
                                     f"{n_layer} non-negative integers, got {_show(v)}")
            return tuple(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= UINT32_MAX:
            raise GraphcostError(f"{self.path}: metadata key {self.key(template)!r} must be a "
                                 f"32-bit integer or a per-layer array, got {_show(v)}")
        return (v,) * n_layer


#: src/llama-model.cpp: LLAMA_ROPE_SCALING_TYPES, the names rope.scaling.type may hold
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")

#: the largest hparam llama.cpp holds (uint32_t fields of llama_hparams)
UINT32_MAX = 2**32 - 1

#: src/llama-hparams.h: load_hparams asserts 0 < block_count <= LLAMA_MAX_LAYERS
LLAMA_MAX_LAYERS = 512


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def model_info(header: GGUFHeader, specs: dict) -> ModelInfo:
    """Read the hyperparameters of a supported architecture; reject others in one line.

    ``specs`` maps architecture names to :class:`~graphcost.graph.arch_spec.ArchSpec`; a spec's
    ``hparams.swa_pattern`` is the default of its ``load_swa_pattern(ml, N)`` call.
    """
    supported = tuple(sorted(k for k in specs if "@" not in k))
    arch = header.architecture
    if arch is None:
        raw = header.metadata.get("general.architecture")
        what = "is missing" if raw is None else f"must be a string, got {_show(raw)}"
        raise GraphcostError(f"{header.path}: metadata key 'general.architecture' {what}")
    if arch not in supported:
        raise UnsupportedError(f"{header.path}: architecture {_show(arch)} is not supported "
                               f"(supported: {', '.join(supported)}; see `graphcost archs`)")
    m = _Meta(header, arch)
    n_layer_all = m.int(Keys.LLM.BLOCK_COUNT, required=True)
    n_embd = m.int(Keys.LLM.EMBEDDING_LENGTH, required=True)
    if n_layer_all == 0 or n_embd == 0 or n_layer_all > LLAMA_MAX_LAYERS:
        raise GraphcostError(f"{header.path}: block_count {n_layer_all} / embedding_length "
                             f"{n_embd} are not a model llama.cpp can build (1 to "
                             f"{LLAMA_MAX_LAYERS} layers)")
    # llama_model_base::load_hparams: per-layer arrays span all blocks, NextN ones included;
    # the trunk graph and its KV cache see the first n_layer = n_layer_all - n_layer_nextn
    n_layer_nextn = m.int(Keys.LLM.NEXTN_PREDICT_LAYERS, 0)
    if n_layer_nextn >= n_layer_all:
        raise GraphcostError(f"{header.path}: {m.key(Keys.LLM.NEXTN_PREDICT_LAYERS)!r} = "
                             f"{n_layer_nextn} leaves no trunk layer of {n_layer_all}")
    n_layer = n_layer_all - n_layer_nextn
    n_head = m.per_layer(Keys.Attention.HEAD_COUNT, n_layer_all)[:n_layer]
    n_head_kv = m.per_layer(Keys.Attention.HEAD_COUNT_KV, n_layer_all, default=None)[:n_layer] \
        if m.key(Keys.Attention.HEAD_COUNT_KV) in m.md else n_head
    n_ff = m.per_layer(Keys.LLM.FEED_FORWARD_LENGTH, n_layer_all, default=0)[:n_layer]
    if n_head[0] == 0:
        raise GraphcostError(f"{header.path}: {m.key(Keys.Attention.HEAD_COUNT)!r} is 0")
    is_recr = _recurrent_layers(m, specs[arch], n_layer, n_head, n_head_kv, n_ff)
    for il in range(n_layer):
        if is_recr and n_head_kv[il] == 0:
            continue  # a hybrid's recurrent (and nemotron_h's MLP-only) layers have no KV heads
        if n_head_kv[il] == 0 or n_head[il] % n_head_kv[il]:
            raise GraphcostError(f"{header.path}: layer {il} has {n_head[il]} heads and "
                                 f"{n_head_kv[il]} KV heads; heads must be a multiple of KV heads")
    head_dim_k = m.int(Keys.Attention.KEY_LENGTH, n_embd // n_head[0])
    head_dim_v = m.int(Keys.Attention.VALUE_LENGTH, n_embd // n_head[0])
    n_rot = m.int(Keys.Rope.DIMENSION_COUNT, head_dim_k)

    n_vocab = m.get(Keys.LLM.VOCAB_SIZE)
    if n_vocab is None:
        toks = header.metadata.get("tokenizer.ggml.tokens")
        n_vocab = len(toks) if isinstance(toks, (list, LazyArray)) else None
    if n_vocab is None:
        emb = header.tensors.get("token_embd.weight")
        n_vocab = emb.ne[1] if emb is not None and len(emb.ne) > 1 else 0
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, int) or n_vocab <= 0:
        raise GraphcostError(f"{header.path}: cannot tell the vocabulary size "
                             f"(no {m.key(Keys.LLM.VOCAB_SIZE)!r}, no tokenizer.ggml.tokens)")

    # llama_model::load_hparams: rope_scaling defaults to "linear"; rope_freq_scale_train is
    # 1 / factor whenever a factor is given (llama_context then uses 1 for type "none")
    scaling = m.get(Keys.Rope.SCALING_TYPE, "linear")
    if scaling not in ROPE_SCALING_TYPES:
        # llama_model::load_hparams: GGML_ASSERT(rope_scaling_type_train != UNSPECIFIED)
        raise GraphcostError(f"{header.path}: metadata key {m.key(Keys.Rope.SCALING_TYPE)!r} "
                             f"is {_show(scaling)}; llama.cpp knows "
                             f"{', '.join(ROPE_SCALING_TYPES)} (it aborts on any other)")
    factor = m.float(Keys.Rope.SCALING_FACTOR, 0.0)
    freq_scale = 1.0 if scaling == "none" or factor == 0.0 else 1.0 / factor

    n_swa = 0
    is_swa = (False,) * n_layer
    swa_train = bool(specs[arch].hparams.get("rope_swa_from_train", False))
    swa_default = specs[arch].hparams.get("swa_pattern")
    only = specs[arch].hparams.get("swa_only_n_layer")  # exaone4: SWA only for 64 layers
    if swa_default is not None and (only is None or n_layer == int(only)):
        n_swa = m.int(Keys.Attention.SLIDING_WINDOW, int(specs[arch].hparams.get("sliding_window", 0)))
        fixed = specs[arch].hparams.get("sliding_window_fixed")
        if fixed is not None and n_swa != 0:  # llama4: a 0 in the file turns it off, any
            n_swa = int(fixed)                # other value (or none) means the fixed chunk
        if n_swa > 0:
            if swa_default == "required":  # gemma4: ml.get_arr(..._PATTERN) without a default
                m.get(Keys.Attention.SLIDING_WINDOW_PATTERN, required=True)
                swa_default = 0
            is_swa = _swa_pattern(m, n_layer, int(swa_default))

    return ModelInfo(
        arch=arch,
        name=str(header.metadata.get("general.name", header.path.stem)),
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
        head_dim_k=head_dim_k, head_dim_v=head_dim_v, n_rot=n_rot, n_ff=n_ff,
        n_vocab=n_vocab,
        n_ctx_train=m.int(Keys.LLM.CONTEXT_LENGTH, 0),
        rms_eps=m.float(Keys.Attention.LAYERNORM_RMS_EPS, 1e-5),
        norm_eps=m.float(Keys.Attention.LAYERNORM_EPS, 1e-5),
        rope_freq_base=m.float(Keys.Rope.FREQ_BASE, 10000.0),
        rope_freq_scale=freq_scale,
        # llama_hparams: rope_freq_base_train_swa = 10000, scale 1, unless load_arch_hparams
        # copies the trained values first (gemma2.cpp, openai-moe.cpp)
        rope_freq_base_swa=m.float(Keys.Rope.FREQ_BASE_SWA,
                                   m.float(Keys.Rope.FREQ_BASE, 10000.0) if swa_train else 10000.0),
        rope_freq_scale_swa=freq_scale if swa_train else 1.0,
        rope_scaling_type=str(scaling),
        n_swa=n_swa, is_swa=is_swa,
        attn_scale=m.float(Keys.Attention.SCALE, 0.0),
        final_logit_softcap=m.float(Keys.LLM.FINAL_LOGIT_SOFTCAPPING,
                                    float(specs[arch].hparams.get("final_logit_softcap", 0.0))),
        embedding_scale=m.float(Keys.LLM.EMBEDDING_SCALE, 0.0),
        header=header,
        residual_scale=m.float(Keys.LLM.RESIDUAL_SCALE, 0.0),
        logit_scale=m.float(Keys.LLM.LOGIT_SCALE, 0.0),
        rope_finetuned=_bool(m, Keys.Rope.SCALING_FINETUNED,
                             bool(specs[arch].hparams.get("rope_finetuned", False))),
        n_ctx_orig_yarn=m.int(Keys.Rope.SCALING_ORIG_CTX_LEN, m.int(Keys.LLM.CONTEXT_LENGTH, 0)),
        rope_attn_factor=m.float(Keys.Rope.SCALING_ATTN_FACTOR, 1.0),
        attn_softcap=(m.float(Keys.LLM.ATTN_LOGIT_SOFTCAPPING,
                              float(specs[arch].hparams["attn_logit_softcap"]))
                      if "attn_logit_softcap" in specs[arch].hparams else 0.0),
        n_layer_nextn=n_layer_nextn,
        n_layer_dense_lead=m.int(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0),
        n_ff_shexp=m.int(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0),
        n_moe_layer_step=m.int(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP, 0),
        attn_temp_scale=m.float(Keys.Attention.TEMPERATURE_SCALE, 0.0),
        attn_temp_length=m.int(Keys.Attention.TEMPERATURE_LENGTH, 0),
        q_lora_rank=m.int(Keys.Attention.Q_LORA_RANK, 0),
        kv_lora_rank=m.int(Keys.Attention.KV_LORA_RANK, 0),
        head_dim_k_mla=m.int(Keys.Attention.KEY_LENGTH_MLA, 0),
        head_dim_v_mla=m.int(Keys.Attention.VALUE_LENGTH_MLA, 0),
        rope_sections=_sections(m),
        n_deepstack_layers=m.int(Keys.LLM.NUM_DEEPSTACK_LAYERS, 0),
        **_experts(m, n_layer_all, n_layer),
        head_dim_k_swa=m.int(Keys.Attention.KEY_LENGTH_SWA, head_dim_k),
        head_dim_v_swa=m.int(Keys.Attention.VALUE_LENGTH_SWA, head_dim_v),
        n_rot_swa=m.int(Keys.Rope.DIMENSION_COUNT_SWA, n_rot),
        n_kv_shared_layers=m.int(Keys.Attention.SHARED_KV_LAYERS, 0),
        n_expert_shared=m.int(Keys.LLM.EXPERT_SHARED_COUNT, 0),
        n_embd_per_layer=m.int(Keys.LLM.EMBD_LENGTH_PER_LAYER_INP, 0),
        is_recr=is_recr,
        **_recurrent_sizes(m, bool(is_recr)),
    )


def _recurrent_layers(m: _Meta, spec, n_layer: int, n_head: tuple[int, ...],
                      n_head_kv: tuple[int, ...], n_ff: tuple[int, ...]) -> tuple[bool, ...]:
    """hparams.is_recr per layer, from the spec's ``hparams.recurrent_layers`` expression
    over ``il n_head n_head_kv n_ff n_layer full_attention_interval`` (lfm2: ``n_head_kv ==
    0``, as its load_arch_hparams sets is_recr_impl); ``()`` for a family without recurrent
    layers."""
    expr = spec.hparams.get("recurrent_layers")
    if expr is None:
        return ()
    # qwen3next: (il + 1) % full_attention_interval != 0, the interval 4 unless the key says
    interval = m.int(Keys.LLM.FULL_ATTENTION_INTERVAL,
                     int(spec.hparams.get("full_attention_interval", 0)))
    if "full_attention_interval" in spec.hparams and interval == 0:
        raise GraphcostError(f"{m.path}: {m.key(Keys.LLM.FULL_ATTENTION_INTERVAL)!r} is 0")
    return tuple(bool(evaluate(expr, {"il": il, "n_head": n_head[il], "n_head_kv": n_head_kv[il],
                                      "n_ff": n_ff[il], "n_layer": n_layer,
                                      "full_attention_interval": interval}, str(spec.path)))
                 for il in range(n_layer))


def _recurrent_sizes(m: _Meta, recurrent: bool) -> dict:
    """The keys n_embd_r / n_embd_s are computed from, read only for recurrent models
    (a family's spec makes the ones its load_arch_hparams requires required)."""
    if not recurrent:
        return {}
    return dict(ssm_d_conv=m.int(Keys.SSM.CONV_KERNEL, 0), ssm_d_inner=m.int(Keys.SSM.INNER_SIZE, 0),
                ssm_d_state=m.int(Keys.SSM.STATE_SIZE, 0), ssm_n_group=m.int(Keys.SSM.GROUP_COUNT, 0),
                ssm_dt_rank=m.int(Keys.SSM.TIME_STEP_RANK, 0),
                shortconv_l_cache=m.int(Keys.ShortConv.L_CACHE, 0))


def _sections(m: _Meta) -> tuple[int, ...]:
    """rope.dimension_sections: ``get_key_or_arr(..., rope_sections, 4)``, zeros when absent."""
    v = m.get(Keys.Rope.DIMENSION_SECTIONS, None)
    if v is None:
        return (0, 0, 0, 0)
    if isinstance(v, LazyArray):
        v = v.load()
    if not isinstance(v, list) or len(v) != 4 or \
            not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise GraphcostError(f"{m.path}: metadata key {m.key(Keys.Rope.DIMENSION_SECTIONS)!r} "
                             f"must hold 4 non-negative integers, got {_show(v)}")
    return tuple(v)


def _bool(m: _Meta, template: str, default: bool) -> bool:
    v = m.get(template, default)
    if not isinstance(v, bool):
        raise GraphcostError(f"{m.path}: metadata key {m.key(template)!r} must be a boolean, "
                             f"got {_show(v)}")
    return v


def _swa_pattern(m: _Meta, n_layer: int, default: int) -> tuple[bool, ...]:
    """llama_model_base::load_swa_pattern + llama_hparams::set_swa_pattern (dense last)."""
    v = m.get(Keys.Attention.SLIDING_WINDOW_PATTERN, default)
    if isinstance(v, LazyArray):
        v = v.load()
    if isinstance(v, list):
        if len(v) != n_layer:
            raise GraphcostError(f"{m.path}: {m.key(Keys.Attention.SLIDING_WINDOW_PATTERN)!r} "
                                 f"has {len(v)} entries for {n_layer} layers")
        return tuple(bool(x) for x in v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GraphcostError(f"{m.path}: {m.key(Keys.Attention.SLIDING_WINDOW_PATTERN)!r} "
                             f"must be an integer, got {_show(v)}")
    return tuple(v == 0 or (il % v < v - 1) for il in range(n_layer))


def _experts(m: _Meta, n_layer_all: int, n_layer: int) -> dict:
    """llama_model::load_hparams: expert_count, expert_used_count (scalar or per layer),
    expert groups, and the optional expert keys; the same checks as llama.cpp's asserts,
    as one-line errors."""
    n_expert = m.int(Keys.LLM.EXPERT_COUNT, 0)
    n_used = m.per_layer(Keys.LLM.EXPERT_USED_COUNT, n_layer_all, default=0)
    if max(n_used) > n_expert or (n_expert > 0 and max(n_used) == 0):
        raise GraphcostError(f"{m.path}: {m.key(Keys.LLM.EXPERT_USED_COUNT)!r} = {max(n_used)} "
                             f"must be between 1 and {m.key(Keys.LLM.EXPERT_COUNT)!r} = {n_expert}")
    n_groups = m.int(Keys.LLM.EXPERT_GROUP_COUNT, 0)
    n_group_used = m.int(Keys.LLM.EXPERT_GROUP_USED_COUNT, 0)
    if n_groups > 1 and (n_groups >= n_expert or n_expert % n_groups
                         or not 0 < n_group_used < n_groups):
        raise GraphcostError(f"{m.path}: {m.key(Keys.LLM.EXPERT_GROUP_COUNT)!r} = {n_groups} and "
                             f"{m.key(Keys.LLM.EXPERT_GROUP_USED_COUNT)!r} = {n_group_used} "
                             f"must divide {n_expert} experts into groups, fewer used than there are")
    norm = m.get(Keys.LLM.EXPERT_WEIGHTS_NORM, False)
    if not isinstance(norm, bool):
        raise GraphcostError(f"{m.path}: metadata key {m.key(Keys.LLM.EXPERT_WEIGHTS_NORM)!r} "
                             f"must be a boolean, got {_show(norm)}")
    return dict(n_expert=n_expert, n_expert_used=n_used[:n_layer],
                n_expert_groups=n_groups, n_group_used=n_group_used,
                expert_weights_scale=m.float(Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0),
                expert_weights_norm=norm,
                expert_gating_func=m.int(Keys.LLM.EXPERT_GATING_FUNC, 0))
