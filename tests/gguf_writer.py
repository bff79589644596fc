"""The one GGUF-writing toolkit of the test fixtures (tests/fixtures*.py): weights of any
type, the tensor sink with its type choice and fallbacks, the SentencePiece vocabulary,
the header keys every family writes (family keys after it or, with ``after=``, between
them), the tensor groups most families share (embeddings, Q/K/V, Q/K norms, FFN, experts,
llama's layer), the default-type building blocks, and the :class:`FixtureInfo` a writer
returns. A writer is ``sink = start(...)``, its tensors, ``return done(sink, tie=...)``.

Weights are deterministic (``numpy`` seed) and small so the logits are finite. Types
gguf-py can quantize (F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) go through
``gguf.quants.quantize``; k-quants (Q2_K..Q6_K) are built by hand from random bytes with
their f16 super-block scales overwritten by small finite values.

``weight_types`` maps a tensor *kind* (the name without ``blk.N.`` and ``.weight``, e.g.
``"attn_q"``, ``"ffn_down"``, ``"token_embd"``, ``"output"``) or a full tensor name
(``"blk.1.attn_q.weight"``) to a ``gguf.GGMLQuantizationType``; full names win over
kinds. Norm weights and ``rope_freqs`` are always F32. An explicit type whose block size
does not divide the row length raises ``ValueError``; default types silently fall back
(k-quant -> Q8_0 -> F16) when the row length does not fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

# float16 byte offsets (inside one block) of the scale fields of the k-quants,
# from gguf/quants.py (== ggml-common.h block_qX_K)
KQUANT_F16_OFFSETS: dict[QT, tuple[int, ...]] = {
    QT.Q2_K: (80, 82),          # scales[16] qs[64] d dmin                 (84 B)
    QT.Q3_K: (108,),            # hmask[32] qs[64] scales[12] d            (110 B)
    QT.Q4_K: (0, 2),            # d dmin scales[12] qs[128]                (144 B)
    QT.Q5_K: (0, 2),            # d dmin scales[12] qh[32] qs[128]         (176 B)
    QT.Q6_K: (208,),            # ql[128] qh[64] scales[16](int8) d        (210 B)
}
# magnitude of the f16 scales: keeps |w| roughly <= 0.1 for every k-quant
_KQUANT_SCALE: dict[QT, float] = {
    QT.Q2_K: 2e-3,   # d*sc(<=15)*q(<=3) - dmin*m(<=15)
    QT.Q3_K: 2e-4,   # d*(sc-32 in [-32,31])*q(in [-4,3])
    QT.Q4_K: 1e-4,   # d*sc(<=63)*q(<=15) - dmin*m(<=63)
    QT.Q5_K: 5e-5,   # d*sc(<=63)*q(<=31) - dmin*m(<=63)
    QT.Q6_K: 2e-5,   # d*sc(int8)*(q-32)
}


@dataclass
class FixtureInfo:
    """What was written (handy for computing expectations in tests)."""

    path: Path
    arch: str
    n_vocab: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_layer: int
    context_length: int
    tie_embeddings: bool
    sliding_window: int = 0
    swa_layers: list[bool] = field(default_factory=list)
    tensor_types: dict[str, str] = field(default_factory=dict)

    def __fspath__(self) -> str:  # so FixtureInfo can be passed where a path is expected
        return str(self.path)


# --------------------------------------------------------------------------- weights


def _block_of(qtype: QT) -> tuple[int, int]:
    return GGML_QUANT_SIZES[qtype]


def _fits(qtype: QT, row_len: int) -> bool:
    return row_len % _block_of(qtype)[0] == 0


def make_weight(rng: np.random.Generator, shape: Sequence[int], qtype: QT,
                scale: float = 0.05) -> np.ndarray:
    """Return the on-disk array for a tensor of numpy ``shape`` (rows last) and type.

    For F32/F16/BF16 and quantized types the result is what ``GGUFWriter.add_tensor``
    expects (the raw quantized bytes, shaped ``(*rows, bytes_per_row)``, for
    quantized types).
    """
    shape = tuple(int(s) for s in shape)
    if qtype == QT.F32:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    if qtype == QT.F16:
        return (rng.standard_normal(shape) * scale).astype(np.float16)
    if qtype in KQUANT_F16_OFFSETS:
        blck, tsize = _block_of(qtype)
        row_len = shape[-1]
        if row_len % blck:
            raise ValueError(f"{qtype.name}: row length {row_len} not a multiple of {blck}")
        n_blocks = int(np.prod(shape[:-1], dtype=np.int64)) * (row_len // blck)
        raw = rng.integers(0, 256, size=(n_blocks, tsize), dtype=np.uint8)
        s = _KQUANT_SCALE[qtype]
        for off in KQUANT_F16_OFFSETS[qtype]:
            vals = (rng.uniform(0.5, 1.0, size=n_blocks) * s).astype(np.float16)
            raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
        return raw.reshape(*shape[:-1], (row_len // blck) * tsize)
    # everything else: let gguf-py quantize (BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4,
    # TQ1_0, TQ2_0, ...)
    data = (rng.standard_normal(shape) * scale).astype(np.float32)
    blck, tsize = _block_of(qtype)
    if shape[-1] % blck:
        raise ValueError(f"{qtype.name}: row length {shape[-1]} not a multiple of {blck}")
    try:
        return gguf.quants.quantize(data, qtype)
    except NotImplementedError:
        # the IQ types (gguf-py has no quantizer for them): all-zero blocks of the right
        # size, i.e. zero scales and zero weights -- enough for header-level analysis
        return np.zeros((*shape[:-1], shape[-1] // blck * tsize), dtype=np.uint8)


def pick_type(kind: str, name: str, row_len: int, explicit: Mapping[str, QT],
              defaults: Mapping[str, QT]) -> QT:
    if name in explicit:
        qt = QT(explicit[name])
    elif kind in explicit:
        qt = QT(explicit[kind])
    else:
        qt = defaults.get(kind, QT.F16)
        for cand in (qt, QT.Q8_0, QT.F16):
            if _fits(cand, row_len):
                return cand
        return QT.F32
    if not _fits(qt, row_len):
        raise ValueError(f"{name}: type {qt.name} needs rows of multiples of "
                         f"{_block_of(qt)[0]}, row length is {row_len}")
    return qt


#: the types of the token embedding and the Q/K/V inputs that most fixtures share (each
#: family's default table adds its own)
ATTN_TYPES: dict[str, QT] = {"token_embd": QT.Q8_0, "attn_q": QT.Q4_0, "attn_k": QT.F16,
                             "attn_v": QT.Q8_0}


def ffn_types(gate: QT, up: QT, down: QT, suffix: str = "") -> dict[str, QT]:
    """A default-types entry for ``ffn_gate``, ``ffn_up``, ``ffn_down`` (``suffix``
    ``_exps``: the stacked experts, ``_shexp``: the shared expert)."""
    return {f"ffn_gate{suffix}": gate, f"ffn_up{suffix}": up, f"ffn_down{suffix}": down}


class TensorSink:
    """Adds tensors to a writer: weights drawn from ``rng`` in call order, each of the type
    ``explicit`` (by full name or kind) or ``defaults`` (by kind, with fallbacks) gives it;
    :attr:`types` records what was written (name -> type name)."""

    def __init__(self, writer: gguf.GGUFWriter, rng: np.random.Generator,
                 explicit: Mapping[str, QT] | None, defaults: Mapping[str, QT],
                 sizes: Mapping[str, object] | None = None):
        self.w = writer
        self.rng = rng
        self.explicit = dict(explicit or {})
        self.defaults = defaults
        self.types: dict[str, str] = {}
        #: path, arch and the header's sizes, for :func:`done`
        self.sizes = dict(sizes or {})

    def matrix(self, kind: str, name: str, ne0: int, ne1: int, scale: float = 0.05) -> None:
        """A 2-D weight with ggml ne = [ne0, ne1] (rows of length ne0)."""
        qt = pick_type(kind, name, ne0, self.explicit, self.defaults)
        arr = make_weight(self.rng, (ne1, ne0), qt, scale=scale)
        self._add(name, arr, qt)

    def experts(self, kind: str, name: str, ne0: int, ne1: int, n_expert: int,
                scale: float = 0.05) -> None:
        """A stacked expert tensor with ggml ne = [ne0, ne1, n_expert]."""
        qt = pick_type(kind, name, ne0, self.explicit, self.defaults)
        self._add(name, make_weight(self.rng, (n_expert, ne1, ne0), qt, scale=scale), qt)

    def vector(self, name: str, n: int, center: float = 1.0, spread: float = 0.05) -> None:
        arr = (center + spread * self.rng.standard_normal(n)).astype(np.float32)
        self._add(name, arr, QT.F32)

    def array(self, name: str, arr: np.ndarray) -> None:
        """A tensor of given F32 values (``ssm_a``, ``rope_freqs``, ...)."""
        self._add(name, np.asarray(arr, dtype=np.float32), QT.F32)

    def _add(self, name: str, arr: np.ndarray, qt: QT) -> None:
        if qt in (QT.F32, QT.F16):
            self.w.add_tensor(name, arr)
        else:
            self.w.add_tensor(name, arr, raw_dtype=qt)
        self.types[name] = qt.name


# --------------------------------------------------------------------------- vocab


def add_spm_vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
    """A minimal SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``): ``<unk> <s>
    </s>``, the 256 byte tokens and filler pieces up to ``n_vocab``."""
    if n_vocab < 3 + 256 + 1:
        raise ValueError("n_vocab must be >= 260 (3 special + 256 byte tokens + 1)")
    toks: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        toks.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(toks) < n_vocab:
        # distinct, printable pieces: "▁a", "▁b", ..., "ab", "ac", ...
        if i < len(letters):
            piece = "\u2581" + letters[i]
        else:
            j = i - len(letters)
            piece = letters[(j // 26) % 26] + letters[j % 26] + (str(j // 676) if j >= 676 else "")
        toks.append(piece)
        types.append(gguf.TokenType.NORMAL)
        i += 1
    scores = [0.0] * 3 + [-1000.0] * 256 + [-float(k) for k in range(n_vocab - 259)]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def swa_layers(n_layer: int, swa_pattern: int | Sequence[bool] | None = None) -> list[bool]:
    """Which layers are sliding-window, as llama.cpp's ``set_swa_pattern`` decides
    for gemma3 (default pattern 6: every 6th layer, il % 6 == 5, is global)."""
    if swa_pattern is None:
        swa_pattern = 6
    if isinstance(swa_pattern, int):
        if swa_pattern == 0:
            return [True] * n_layer
        return [(il % swa_pattern) < (swa_pattern - 1) for il in range(n_layer)]
    pat = [bool(x) for x in swa_pattern]
    if len(pat) != n_layer:
        raise ValueError("swa_pattern list must have n_layer entries")
    return pat


# --------------------------------------------------------------------------- header


def header(path: Path, arch: str, *, n_embd: int, n_head: int,
           n_head_kv: int | Sequence[int] | None, n_ff: int | Sequence[int], n_layer: int,
           n_vocab: int, context_length: int, rms_eps: float | None,
           rope_freq_base: float | None, head_dim: int | None = None, n_rot: int | None = None,
           name: str | None = None,
           after: Mapping[str, Callable[[gguf.GGUFWriter], None]] | None = None,
           ) -> gguf.GGUFWriter:
    """A writer with the keys every family here reads: name, context, sizes, heads (a
    per-layer ``n_ff`` or ``n_head_kv`` as an array), ``key_length = value_length = head_dim`` and
    ``rope.dimension_count = n_rot`` when given, RMS epsilon and rope base (``None``:
    left out, as ``n_head_kv``), file type, and the vocabulary. ``name`` replaces
    ``graphcost-fixture-<arch>``.

    Family keys go after it, or, where a family's files have them in the middle,
    ``after[step]`` writes them right after the standard key ``step`` (its name without
    ``<arch>.``: ``"block_count"``, ``"value_length"``, ``"rope.freq_base"``, ...; run
    whether or not that key was written)."""
    if isinstance(n_head_kv, int) and n_head_kv and n_head % n_head_kv:
        raise ValueError("n_head must be a multiple of n_head_kv")
    w = gguf.GGUFWriter(str(path), arch)
    kv = n_head_kv if isinstance(n_head_kv, int) or n_head_kv is None else list(n_head_kv)
    keys = (("name", w.add_name, name or f"graphcost-fixture-{arch}"),
            ("context_length", w.add_context_length, context_length),
            ("embedding_length", w.add_embedding_length, n_embd),
            ("block_count", w.add_block_count, n_layer),
            ("feed_forward_length", w.add_feed_forward_length,
             n_ff if isinstance(n_ff, int) else list(n_ff)),
            ("head_count", w.add_head_count, n_head),
            ("head_count_kv", w.add_head_count_kv, kv),
            ("key_length", w.add_key_length, head_dim),
            ("value_length", w.add_value_length, head_dim),
            ("rope.dimension_count", w.add_rope_dimension_count, n_rot),
            ("layer_norm_rms_epsilon", w.add_layer_norm_rms_eps, rms_eps),
            ("rope.freq_base", w.add_rope_freq_base, rope_freq_base),
            ("vocab_size", w.add_vocab_size, n_vocab))
    after = dict(after or {})
    unknown = set(after) - {step for step, _, _ in keys}
    if unknown:
        raise ValueError(f"header: no step {sorted(unknown)} to write keys after")
    for step, add, value in keys:
        if value is not None:
            add(value)
        if step in after:
            after[step](w)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_spm_vocab(w, n_vocab)
    return w


def sliding_window_keys(w: gguf.GGUFWriter, arch: str, sliding_window: int | None,
                        swa_pattern: int | Sequence[bool] | None) -> None:
    """``attention.sliding_window`` (None: left out) and its pattern: None -> key absent
    (the family's default), int -> u32, a list of bools -> the per-layer array form."""
    if sliding_window is not None:
        w.add_sliding_window(sliding_window)
    key = gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch)
    if isinstance(swa_pattern, int):
        w.add_uint32(key, swa_pattern)
    elif swa_pattern is not None:
        w.add_array(key, [bool(x) for x in swa_pattern])


def granite_keys(w: gguf.GGUFWriter, *, logit_scale: float | None,
                 embedding_scale: float | None, residual_scale: float | None,
                 attention_scale: float | None, rope_finetuned: bool | None) -> None:
    """The Granite multipliers (granite, granitehybrid) and ``rope.scaling.finetuned``
    (``None``: left out)."""
    for value, add in ((logit_scale, w.add_logit_scale), (embedding_scale, w.add_embedding_scale),
                       (residual_scale, w.add_residual_scale),
                       (attention_scale, w.add_attention_scale),
                       (rope_finetuned, w.add_rope_scaling_finetuned)):
        if value is not None:
            add(value)


def ssm_keys(w: gguf.GGUFWriter, *, d_conv: int, d_inner: int, d_state: int, n_rank: int,
             n_group: int) -> None:
    """The ``ssm.*`` keys of the Mamba-2 and delta-net layers: conv kernel, inner size,
    state size, time-step rank (heads), group count."""
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_rank)
    w.add_ssm_group_count(n_group)


def expert_counts(w: gguf.GGUFWriter, arch: str, n_expert: int,
                  n_expert_used: int | Sequence[int]) -> None:
    """``expert_count`` and ``expert_used_count`` (per layer: an array, which llama.cpp
    reads with get_key_or_arr)."""
    w.add_expert_count(n_expert)
    if isinstance(n_expert_used, int):
        w.add_expert_used_count(n_expert_used)
    else:
        w.add_array(gguf.Keys.LLM.EXPERT_USED_COUNT.format(arch=arch), list(n_expert_used))


# --------------------------------------------------------------------------- tensor groups


def bias(sink: TensorSink, name: str, n: int) -> None:
    sink.vector(name, n, center=0.0, spread=0.02)


def layer_norm(sink: TensorSink, name: str, n: int, with_bias: bool = True) -> None:
    """A LayerNorm's ``<name>.weight`` and, ``with_bias``, ``<name>.bias``."""
    sink.vector(f"{name}.weight", n)
    if with_bias:
        bias(sink, f"{name}.bias", n)


def embeddings(sink: TensorSink, n_embd: int, n_vocab: int, tie: bool,
               output_bias: bool = False, scale: float | None = None,
               norm: str = "output_norm", norm_bias: bool = False) -> None:
    """``token_embd``, the output norm ``norm`` (with a bias: a LayerNorm) and, untied,
    ``output`` (and its bias). Tied, the embedding is also the output matrix, so it is
    kept small (logits O(1)); untied it is larger (``scale`` overrides), which gives the
    residual stream some signal."""
    if scale is None:
        scale = 0.05 if tie else 0.5
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=scale)
    layer_norm(sink, norm, n_embd, norm_bias)
    if not tie:
        sink.matrix("output", "output.weight", n_embd, n_vocab)
    if output_bias:
        bias(sink, "output.bias", n_vocab)


def rope_freqs_tensor(sink: TensorSink, n: int, top: float = 8.0) -> None:
    """The optional ``rope_freqs.weight``, F32 [n]: llama-3 style long-context factors,
    1 for high frequencies, growing to ``top`` for low ones."""
    sink.array("rope_freqs.weight", np.linspace(1.0, top, n).astype(np.float32))


def longrope(sink: TensorSink, n: int, original_context_length: int | None = None) -> None:
    """LongRoPE's ``rope_factors_long/short.weight`` (F32 [n] each, 1 up to 8 and 1.5).
    With ``original_context_length``: also rope.scaling.type longrope (llama and granite
    create the factors only then) and the context above which
    llama_model::get_rope_factors picks the long ones."""
    if original_context_length is not None:
        sink.w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        sink.w.add_rope_scaling_orig_ctx_len(original_context_length)
    for which, hi in (("long", 8.0), ("short", 1.5)):
        sink.array(f"rope_factors_{which}.weight", np.linspace(1.0, hi, n).astype(np.float32))


def attention(sink: TensorSink, p: str, n_embd: int, q_dim: int, kv_dim: int,
              biases: bool = False) -> None:
    """A pre-norm attention block of layer prefix ``p``: ``attn_norm``, Q/K/V (and their
    biases), ``attn_output``."""
    sink.vector(p + "attn_norm.weight", n_embd)
    qkv(sink, p, n_embd, q_dim, kv_dim, biases)
    sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)


def qkv(sink: TensorSink, p: str, n_embd: int, q_dim: int, kv_dim: int,
        biases: bool = False) -> None:
    """``attn_q``, ``attn_k``, ``attn_v`` of layer prefix ``p`` (and their biases)."""
    sink.matrix("attn_q", p + "attn_q.weight", n_embd, q_dim)
    sink.matrix("attn_k", p + "attn_k.weight", n_embd, kv_dim)
    sink.matrix("attn_v", p + "attn_v.weight", n_embd, kv_dim)
    if biases:
        bias(sink, p + "attn_q.bias", q_dim)
        bias(sink, p + "attn_k.bias", kv_dim)
        bias(sink, p + "attn_v.bias", kv_dim)


def qk_norms(sink: TensorSink, p: str, q_width: int, k_width: int,
             k_first: bool = False) -> None:
    """``attn_q_norm`` [q_width] and ``attn_k_norm`` [k_width] of layer prefix ``p`` (per
    head: both the head size; over the whole projection: the Q and K widths), K's first
    where the family's loader creates it first."""
    norms = [("attn_q_norm", q_width), ("attn_k_norm", k_width)]
    for kind, n in (norms[::-1] if k_first else norms):
        sink.vector(f"{p}{kind}.weight", n)


#: the order most families write their FFN matrices in; lfm2, granitehybrid and the MoE
#: families' dense layers write gate, down, up, the GELU MLPs (bert, falcon) up, down (the
#: order decides the random draws)
GATE_UP_DOWN = ("gate", "up", "down")
GATE_DOWN_UP = ("gate", "down", "up")


def ffn(sink: TensorSink, p: str, n_embd: int, n_ff: int, biases: bool = False,
        suffix: str = "", order: Sequence[str] = GATE_UP_DOWN) -> None:
    """``ffn_gate``, ``ffn_up``, ``ffn_down`` of layer prefix ``p`` in ``order`` (and
    their biases, in the same order); ``suffix`` ``_shexp``: the shared expert."""
    ne = {"gate": (n_embd, n_ff), "up": (n_embd, n_ff), "down": (n_ff, n_embd)}
    for part in order:
        sink.matrix(f"ffn_{part}{suffix}", p + f"ffn_{part}{suffix}.weight", *ne[part])
    if biases:
        for part in order:
            bias(sink, p + f"ffn_{part}{suffix}.bias", ne[part][1])


def moe(sink: TensorSink, p: str, n_embd: int, n_ff_exp: int, n_expert: int,
        gate_exps: bool = True, router_scale: float = 0.5, probs_bias: bool = False,
        order: Sequence[str] = GATE_DOWN_UP) -> None:
    """The router ``ffn_gate_inp``, the expert-selection bias ``exp_probs_b`` when
    ``probs_bias``, and the stacked experts in ``order`` (``gate_exps`` False: no gate
    experts; ``"gate_up"``: gate and up merged in one ``ffn_gate_up_exps`` of twice the
    width)."""
    sink.matrix("ffn_gate_inp", p + "ffn_gate_inp.weight", n_embd, n_expert,
                scale=router_scale)
    if probs_bias:
        sink.vector(p + "exp_probs_b.bias", n_expert, center=0.0, spread=0.1)
    ne = {"gate": (n_embd, n_ff_exp), "up": (n_embd, n_ff_exp), "down": (n_ff_exp, n_embd),
          "gate_up": (n_embd, 2 * n_ff_exp)}
    for part in order:
        if part != "gate" or gate_exps:
            sink.experts(f"ffn_{part}_exps", p + f"ffn_{part}_exps.weight", *ne[part], n_expert)


def llama_layers(sink: TensorSink, n_layer: int, n_embd: int, q_dim: int, kv_dim: int,
                 n_ff: int, *, qkv_bias: bool = False, qk_norm: int = 0,
                 mlp: Callable[[int, str], None] | None = None) -> None:
    """``n_layer`` layers of llama's shape (llama, qwen2, qwen3, smollm3, mistral3, mixtral,
    ...): :func:`attention` (``qkv_bias``: with Q/K/V biases), per-head ``attn_k_norm`` and
    ``attn_q_norm`` of ``qk_norm`` when non-zero (in the qwen3 loaders' order),
    ``ffn_norm``, then ``mlp(il, prefix)`` or else the gated FFN of ``n_ff``."""
    for il in range(n_layer):
        p = f"blk.{il}."
        attention(sink, p, n_embd, q_dim, kv_dim, biases=qkv_bias)
        if qk_norm:
            qk_norms(sink, p, qk_norm, qk_norm, k_first=True)
        sink.vector(p + "ffn_norm.weight", n_embd)
        if mlp is None:
            ffn(sink, p, n_embd, n_ff)
        else:
            mlp(il, p)


def per_layer_inputs(sink: TensorSink, n_embd: int, n_vocab: int, n_per_layer: int,
                     n_layer: int) -> None:
    """The per-layer input embeddings of gemma3n and gemma4 (build_inp_per_layer):
    ``per_layer_token_embd``, ``per_layer_model_proj`` and its norm."""
    sink.matrix("per_layer_token_embd", "per_layer_token_embd.weight", n_per_layer * n_layer,
                n_vocab, scale=0.5)
    sink.matrix("per_layer_model_proj", "per_layer_model_proj.weight", n_embd,
                n_per_layer * n_layer)
    sink.vector("per_layer_proj_norm.weight", n_per_layer)


def per_layer_block(sink: TensorSink, p: str, n_embd: int, n_per_layer: int) -> None:
    """A layer's use of its per-layer input (gemma3n, gemma4): ``inp_gate``, ``proj``,
    ``post_norm``."""
    sink.matrix("inp_gate", p + "inp_gate.weight", n_embd, n_per_layer)
    sink.matrix("proj", p + "proj.weight", n_per_layer, n_embd)
    sink.vector(p + "post_norm.weight", n_embd)


def start(path: str | Path, arch: str, defaults: Mapping[str, QT], *,
          weight_types: Mapping[str, QT] | None, seed: int, **header_kw) -> TensorSink:
    """The file's :func:`header` (``header_kw``) and a :class:`TensorSink` on it: weights
    drawn from ``default_rng(seed)``, types from ``weight_types`` over ``defaults``. The
    sink keeps the path, arch and the header's sizes (``head_dim`` defaulting to
    ``n_embd // n_head``) for :func:`done`."""
    path = Path(path)
    w = header(path, arch, **header_kw)
    sizes = {k: header_kw[k] for k in ("n_vocab", "n_embd", "n_head", "n_head_kv", "n_ff",
                                        "n_layer", "context_length")}
    sizes["head_dim"] = header_kw.get("head_dim") or sizes["n_embd"] // sizes["n_head"]
    return TensorSink(w, np.random.default_rng(seed), weight_types, defaults,
                      dict(path=path, arch=arch, **sizes))


def done(sink: TensorSink, *, tie: bool, sliding_window: int = 0,
         layers_swa: Sequence[bool] | None = None, **sizes) -> FixtureInfo:
    """Write the file (:func:`finish`) and return its :class:`FixtureInfo`: the sizes
    :func:`start` kept, ``sizes`` overriding them (where the header's differ from what
    tests expect: a per-layer ``n_head_kv``, expert widths, NextN layers ...); no sliding
    layers unless given."""
    finish(sink.w)
    info = {**sink.sizes, **sizes}
    return FixtureInfo(**info, tie_embeddings=tie, sliding_window=sliding_window,
                       swa_layers=list(layers_swa or [False] * info["n_layer"]),
                       tensor_types=sink.types)
