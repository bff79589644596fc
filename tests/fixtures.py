"""Tiny but valid GGUF files for tests (llama.cpp loads and runs them).

Two writers:

* :func:`write_llama`  -- arch ``llama`` (GQA, optional separate head_dim, optional
  ``rope_freqs`` tensor, optional tied embeddings);
* :func:`write_gemma3` -- arch ``gemma3`` (interleaved sliding-window attention,
  q/k norms, post-norms).

Both write a minimal SentencePiece-style vocabulary (``tokenizer.ggml.model =
"llama"``: ``<unk> <s> </s>``, the 256 byte tokens ``<0x00>..<0xFF>`` and filler
pieces up to ``n_vocab``), which is all llama-vocab.cpp needs.

Weights are deterministic (``numpy`` seed) and small so the logits are finite.
Types gguf-py can quantize (F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0) go through
``gguf.quants.quantize``; k-quants (Q2_K..Q6_K) are built by hand from random
bytes with their f16 super-block scales overwritten by small finite values.

``weight_types`` maps a tensor *kind* (the name without ``blk.N.`` and
``.weight``, e.g. ``"attn_q"``, ``"ffn_down"``, ``"token_embd"``, ``"output"``)
or a full tensor name (``"blk.1.attn_q.weight"``) to a
``gguf.GGMLQuantizationType``; full names win over kinds.  Norm weights and
``rope_freqs`` are always F32.  An explicit type whose block size does not divide
the row length raises ``ValueError``; default types silently fall back
(k-quant -> Q8_0 -> F16) when the row length does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES

__all__ = [
    "QT",
    "LLAMA_DEFAULT_TYPES",
    "GEMMA3_DEFAULT_TYPES",
    "FixtureInfo",
    "write_llama",
    "write_gemma3",
    "make_weight",
    "swa_layers",
]

# defaults for the llama fixture (n_embd=256, n_ff=768, q/o width 256):
# every row length is a multiple of 256, so k-quants fit everywhere.
LLAMA_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0,
    "output": QT.Q6_K,
    "attn_q": QT.Q4_0,
    "attn_k": QT.F16,
    "attn_v": QT.Q8_0,
    "attn_output": QT.Q4_K,
    "ffn_gate": QT.Q4_0,
    "ffn_up": QT.Q8_0,
    "ffn_down": QT.Q4_K,
}

# defaults for the gemma3 fixture (n_embd=320, q/o width n_head*head_dim=256,
# n_ff=640): only attn_output has a row length that is a multiple of 256.
GEMMA3_DEFAULT_TYPES: dict[str, QT] = {
    "token_embd": QT.Q8_0,
    "attn_q": QT.Q4_0,
    "attn_k": QT.F16,
    "attn_v": QT.Q8_0,
    "attn_output": QT.Q4_K,
    "ffn_gate": QT.Q4_0,
    "ffn_up": QT.Q8_0,
    "ffn_down": QT.Q5_0,
}

# float16 byte offsets (inside one block) of the scale fields of the k-quants,
# from gguf/quants.py (== ggml-common.h block_qX_K)
_KQUANT_F16_OFFSETS: dict[QT, tuple[int, ...]] = {
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
    if qtype in _KQUANT_F16_OFFSETS:
        blck, tsize = _block_of(qtype)
        row_len = shape[-1]
        if row_len % blck:
            raise ValueError(f"{qtype.name}: row length {row_len} not a multiple of {blck}")
        n_blocks = int(np.prod(shape[:-1], dtype=np.int64)) * (row_len // blck)
        raw = rng.integers(0, 256, size=(n_blocks, tsize), dtype=np.uint8)
        s = _KQUANT_SCALE[qtype]
        for off in _KQUANT_F16_OFFSETS[qtype]:
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


def _pick_type(kind: str, name: str, row_len: int, explicit: Mapping[str, QT],
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


class _TensorSink:
    def __init__(self, writer: gguf.GGUFWriter, rng: np.random.Generator,
                 explicit: Mapping[str, QT] | None, defaults: Mapping[str, QT]):
        self.w = writer
        self.rng = rng
        self.explicit = dict(explicit or {})
        self.defaults = defaults
        self.types: dict[str, str] = {}

    def matrix(self, kind: str, name: str, ne0: int, ne1: int, scale: float = 0.05) -> None:
        """A 2-D weight with ggml ne = [ne0, ne1] (rows of length ne0)."""
        qt = _pick_type(kind, name, ne0, self.explicit, self.defaults)
        arr = make_weight(self.rng, (ne1, ne0), qt, scale=scale)
        self._add(name, arr, qt)

    def vector(self, name: str, n: int, center: float = 1.0, spread: float = 0.05) -> None:
        arr = (center + spread * self.rng.standard_normal(n)).astype(np.float32)
        self._add(name, arr, QT.F32)

    def _add(self, name: str, arr: np.ndarray, qt: QT) -> None:
        if qt in (QT.F32, QT.F16):
            self.w.add_tensor(name, arr)
        else:
            self.w.add_tensor(name, arr, raw_dtype=qt)
        self.types[name] = qt.name


# --------------------------------------------------------------------------- vocab


def _add_spm_vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
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


# --------------------------------------------------------------------------- writers


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_llama(
    path: str | Path,
    *,
    n_embd: int = 256,
    n_head: int = 8,
    n_head_kv: int = 2,
    n_ff: int = 768,
    n_layer: int = 3,
    n_vocab: int = 300,
    head_dim: int | None = None,
    weight_types: Mapping[str, QT] | None = None,
    tie_embeddings: bool = False,
    context_length: int = 2048,
    rope_freqs: bool = False,
    rope_freq_base: float = 10000.0,
    rms_eps: float = 1e-5,
    seed: int = 0,
) -> FixtureInfo:
    """Write a tiny arch-``llama`` GGUF and return a :class:`FixtureInfo` (os.PathLike).

    ``head_dim`` defaults to ``n_embd // n_head``; when it differs, key_length,
    value_length and rope.dimension_count are written (llama requires
    n_rot == head_dim).  ``rope_freqs=True`` adds the optional ``rope_freqs.weight``
    tensor (n_rot/2 F32 factors, as llama-3.1 style models have).
    """
    path = Path(path)
    hd = head_dim if head_dim is not None else n_embd // n_head
    if n_head % n_head_kv:
        raise ValueError("n_head must be a multiple of n_head_kv")
    rng = np.random.default_rng(seed)
    arch = "llama"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("graphcost-fixture-llama")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_freq_base(rope_freq_base)
    w.add_rope_dimension_count(hd)
    if hd != n_embd // n_head or head_dim is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_spm_vocab(w, n_vocab)

    sink = _TensorSink(w, rng, weight_types, LLAMA_DEFAULT_TYPES)
    q_dim = n_head * hd
    kv_dim = n_head_kv * hd
    # larger embeddings give the residual stream some signal; when tied they are also the
    # output matrix, so keep them small then (logits stay O(1))
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab,
                scale=0.05 if tie_embeddings else 0.5)
    sink.vector("output_norm.weight", n_embd)
    if not tie_embeddings:
        sink.matrix("output", "output.weight", n_embd, n_vocab)
    if rope_freqs:
        # llama-3 style long-context factors: 1 for high freqs, growing for low freqs
        f = np.linspace(1.0, 8.0, hd // 2).astype(np.float32)
        w.add_tensor("rope_freqs.weight", f)
        sink.types["rope_freqs.weight"] = "F32"
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        sink.matrix("attn_q", p + "attn_q.weight", n_embd, q_dim)
        sink.matrix("attn_k", p + "attn_k.weight", n_embd, kv_dim)
        sink.matrix("attn_v", p + "attn_v.weight", n_embd, kv_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        sink.matrix("ffn_gate", p + "ffn_gate.weight", n_embd, n_ff)
        sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, n_ff)
        sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
    _finish(w)
    return FixtureInfo(path=path, arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                       n_head_kv=n_head_kv, head_dim=hd, n_ff=n_ff, n_layer=n_layer,
                       context_length=context_length, tie_embeddings=tie_embeddings,
                       tensor_types=sink.types)


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


def write_gemma3(
    path: str | Path,
    *,
    n_embd: int = 320,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 64,
    n_ff: int = 640,
    n_layer: int = 7,
    n_vocab: int = 300,
    sliding_window: int = 64,
    swa_pattern: int | Sequence[bool] | None = None,
    weight_types: Mapping[str, QT] | None = None,
    tie_embeddings: bool = True,
    context_length: int = 4096,
    rope_freq_base: float = 1_000_000.0,
    rope_freq_base_swa: float | None = 10_000.0,
    rms_eps: float = 1e-6,
    seed: int = 0,
) -> FixtureInfo:
    """Write a tiny arch-``gemma3`` GGUF and return a :class:`FixtureInfo` (os.PathLike).

    ``sliding_window=0`` writes no sliding-window key (gemma3 then builds a
    non-iSWA graph with a single KV cache).  ``swa_pattern``: None -> key absent
    (llama.cpp default 6), int -> ``attention.sliding_window_pattern`` u32, a list of
    bools -> the per-layer array form.  Tied embeddings by default (like the real
    gemma3 files, which have no output.weight).
    """
    path = Path(path)
    if n_head % n_head_kv:
        raise ValueError("n_head must be a multiple of n_head_kv")
    rng = np.random.default_rng(seed)
    arch = "gemma3"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("graphcost-fixture-gemma3")
    w.add_context_length(context_length)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(rms_eps)
    w.add_rope_freq_base(rope_freq_base)
    if sliding_window:
        w.add_sliding_window(sliding_window)
        if rope_freq_base_swa is not None:
            w.add_rope_freq_base_swa(rope_freq_base_swa)
        if isinstance(swa_pattern, int):
            w.add_uint32(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch), swa_pattern)
        elif swa_pattern is not None:
            w.add_array(gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch),
                        [bool(x) for x in swa_pattern])
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_spm_vocab(w, n_vocab)

    sink = _TensorSink(w, rng, weight_types, GEMMA3_DEFAULT_TYPES)
    q_dim = n_head * head_dim
    kv_dim = n_head_kv * head_dim
    sink.matrix("token_embd", "token_embd.weight", n_embd, n_vocab, scale=0.05)
    sink.vector("output_norm.weight", n_embd)
    if not tie_embeddings:
        sink.matrix("output", "output.weight", n_embd, n_vocab)
    for i in range(n_layer):
        p = f"blk.{i}."
        sink.vector(p + "attn_norm.weight", n_embd)
        sink.matrix("attn_q", p + "attn_q.weight", n_embd, q_dim)
        sink.matrix("attn_k", p + "attn_k.weight", n_embd, kv_dim)
        sink.matrix("attn_v", p + "attn_v.weight", n_embd, kv_dim)
        sink.vector(p + "attn_q_norm.weight", head_dim)
        sink.vector(p + "attn_k_norm.weight", head_dim)
        sink.matrix("attn_output", p + "attn_output.weight", q_dim, n_embd)
        sink.vector(p + "post_attention_norm.weight", n_embd)
        sink.vector(p + "ffn_norm.weight", n_embd)
        sink.matrix("ffn_gate", p + "ffn_gate.weight", n_embd, n_ff)
        sink.matrix("ffn_up", p + "ffn_up.weight", n_embd, n_ff)
        sink.matrix("ffn_down", p + "ffn_down.weight", n_ff, n_embd)
        sink.vector(p + "post_ffw_norm.weight", n_embd)
    _finish(w)
    layers = swa_layers(n_layer, swa_pattern) if sliding_window else [False] * n_layer
    return FixtureInfo(path=path, arch=arch, n_vocab=n_vocab, n_embd=n_embd, n_head=n_head,
                       n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_layer=n_layer,
                       context_length=context_length, tie_embeddings=tie_embeddings,
                       sliding_window=sliding_window, swa_layers=layers,
                       tensor_types=sink.types)
