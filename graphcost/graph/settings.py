"""Run settings under llama.cpp's flag names, and the sizes llama.cpp derives from them.

Derivations follow ``src/llama-context.cpp`` (n_ctx padded to 256, n_batch and n_ubatch
clamped), ``src/llama-kv-cache.cpp`` (``get_n_kv``: cells attended) and
``src/llama-kv-cache-iswa.cpp`` (size of the sliding-window cache).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from graphcost.format import ggml_types as gt
from graphcost.errors import SettingsError

#: cache types llama.cpp's ``-ctk/-ctv`` accept (common/arg.cpp kv_cache_types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
#: llama.cpp pads n_ctx and the attended KV length to this many cells
KV_PAD = 256

#: graph flavours: which llama.cpp the graph mirrors (``--llama-cpp``)
FLAVOURS = {
    "head": "llama.cpp as vendored by llama-cpp-python 0.3.36 (2026): SET_ROWS KV store, "
            "n_ctx and n_kv padded to 256",
    "2024-08": "llama.cpp of August 2024 (6e02327e8): KV stored by CPY into cache views, 1-D "
               "caches, n_ctx and n_kv padded to 32 without flash attention (256 with), mask "
               "rows padded to 32, names of that time (inp_embd, k_cache_view, kq_soft_max_ext)",
}


#: what ``-fa`` means when it is not given, per flavour: ``auto`` since 2025-08-30
#: (e81b8e4b7); before that flash attention was a switch, off unless ``-fa`` was passed
FLASH_ATTN_DEFAULT = {"head": "auto", "2024-08": "off"}


def kv_pad(flavour: str, flash_attn: bool) -> int:
    """Cells n_ctx and n_kv are padded to (llama_kv_cache_get_padding in 2024-08)."""
    if flavour == "2024-08":
        return 256 if flash_attn else 32
    return KV_PAD


@dataclass(frozen=True)
class RunSettings:
    """What the user asked for, with llama-cli's defaults."""

    ctx_size: int = 4096  # -c; 0 = the model's training context
    batch_size: int = 2048  # -b
    ubatch_size: int = 512  # -ub
    flash_attn: str | None = None  # -fa on|off|auto; None: the flavour's default
    # (FLASH_ATTN_DEFAULT; auto is on for the CPU backend)
    cache_type_k: str = "f16"  # -ctk
    cache_type_v: str = "f16"  # -ctv
    swa_full: bool = False  # --swa-full
    tokens: int = 1  # --tokens: tokens in this ubatch
    past: int = 0  # --past: cells already filled
    outputs: int = 1  # --outputs: tokens whose logits are computed
    llama_cpp: str = "head"  # graph flavour
    embeddings: bool = False  # --embeddings: cparams.embeddings (pooling of encoders)
    #: internal, not a flag: build against the memory's ``init_full()`` state, as
    #: sched_reserve does (a recurrent state then zeroes cell 0 and copies all rs_size
    #: cells: llama_memory_recurrent_context::get_rs_z / get_n_rs with is_full)
    memory_full: bool = False

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "memory_full"}


@dataclass(frozen=True)
class Resolved:
    """Settings after llama.cpp's own adjustments; all sizes in cells or tokens."""

    settings: RunSettings
    n_ctx: int
    n_batch: int
    n_ubatch: int
    flash_attn: bool
    type_k: gt.GGMLType
    type_v: gt.GGMLType
    n_tokens: int
    n_outputs: int
    past: int
    kv_size: int
    kv_size_swa: int | None
    n_kv: int
    n_kv_swa: int | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            **self.settings.to_dict(),
            "n_ctx": self.n_ctx, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "flash_attn": "on" if self.flash_attn else "off",
            "kv_size": self.kv_size, "kv_size_swa": self.kv_size_swa,
            "n_kv": self.n_kv, "n_kv_swa": self.n_kv_swa,
        }


def _cache_type(flag: str, value: str) -> gt.GGMLType:
    if value.lower() not in CACHE_TYPES:
        raise SettingsError(f"{flag} {value!r} is not a KV cache type llama.cpp accepts "
                            f"({', '.join(CACHE_TYPES)})")
    return gt.type_from_name(value)


def n_kv_for(used: int, size: int, p: int = KV_PAD) -> int:
    """llama_kv_cache::get_n_kv: attended cells for ``used`` filled cells in a cache of ``size``."""
    return min(size, max(p, gt.ggml_pad(used, p)))


#: llama.cpp parses -c, -b, -ub as C ``int`` (common/arg.cpp: the handler takes ``int
#: value``, read with std::stoi, which throws out_of_range above INT32_MAX)
INT32_MAX = 2**31 - 1
_INT_FLAGS = (("--ctx-size", "ctx_size"), ("--batch-size", "batch_size"),
              ("--ubatch-size", "ubatch_size"), ("--tokens", "tokens"), ("--past", "past"),
              ("--outputs", "outputs"))


def resolve(s: RunSettings, n_ctx_train: int, n_swa: int, memory: bool = True) -> Resolved:
    """Apply llama.cpp's padding and clamping; reject what llama.cpp would reject.

    ``memory=False``: the architecture has no KV cache (llama_model::create_memory returns
    nullptr: bert); llama_context::decode then calls encode, which outputs every token
    of the ubatch (``n_outputs = n_tokens``) and keeps nothing between calls."""
    for flag, name in _INT_FLAGS:
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int):
            raise SettingsError(f"{flag} {v!r} must be an integer")
        if v > INT32_MAX:
            raise SettingsError(f"{flag} {v} is above {INT32_MAX}, the largest value llama.cpp "
                                "accepts (it reads the flag as a 32-bit int)")
    if s.ctx_size < 0:
        raise SettingsError(f"--ctx-size {s.ctx_size} must be >= 0")
    if s.batch_size < 1 or s.ubatch_size < 1:
        raise SettingsError("--batch-size and --ubatch-size must be >= 1")
    if s.llama_cpp not in FLAVOURS:
        raise SettingsError(f"--llama-cpp {s.llama_cpp!r}: known flavours are "
                            f"{', '.join(FLAVOURS)}")
    fa = (s.flash_attn or FLASH_ATTN_DEFAULT[s.llama_cpp]).lower()
    if fa not in ("on", "off", "auto", "true", "false", "1", "0"):
        raise SettingsError(f"--flash-attn {s.flash_attn!r}: use on, off or auto")
    if fa == "auto" and FLASH_ATTN_DEFAULT[s.llama_cpp] != "auto":
        raise SettingsError(f"--flash-attn auto: llama.cpp {s.llama_cpp} has no 'auto' (flash "
                            "attention was a switch, off unless -fa was given): use on or off")
    flash = fa in ("on", "auto", "true", "1")
    type_k = _cache_type("--cache-type-k", s.cache_type_k)
    type_v = _cache_type("--cache-type-v", s.cache_type_v)
    if gt.is_quantized(type_v) and not flash:
        raise SettingsError(f"--cache-type-v {s.cache_type_v} needs --flash-attn on "
                            "(llama.cpp: V cache quantization requires flash_attn)")
    ctx = s.ctx_size or n_ctx_train
    if ctx <= 0:
        raise SettingsError("--ctx-size 0 needs the model's context_length, which is missing")
    p = kv_pad(s.llama_cpp, flash)
    n_ctx = gt.ggml_pad(ctx, p)
    n_batch = min(n_ctx, s.batch_size)
    n_ubatch = min(n_batch, s.ubatch_size)
    if s.tokens < 1:
        raise SettingsError(f"--tokens {s.tokens} must be >= 1")
    if s.tokens > n_ubatch:
        raise SettingsError(f"--tokens {s.tokens} is more than one ubatch holds (-ub {n_ubatch})")
    if s.past < 0:
        raise SettingsError(f"--past {s.past} must be >= 0")
    if s.past + s.tokens > n_ctx:
        raise SettingsError(f"--past {s.past} + --tokens {s.tokens} exceed the context of "
                            f"{n_ctx} cells")
    outputs = s.outputs if memory else s.tokens
    if not 1 <= outputs <= s.tokens:
        raise SettingsError(f"--outputs {s.outputs} must be between 1 and --tokens {s.tokens}")
    used = s.past + s.tokens
    kv_size = n_ctx
    kv_size_swa = None
    n_kv_swa = None
    notes = []
    if fa == "auto":
        notes.append("flash attention 'auto' resolves to on for the CPU backend")
    if not memory:
        notes.append("no KV cache (encoder): every token is an output, --past and "
                     "--outputs have no effect")
    if n_swa > 0:
        kv_size_swa = kv_size if s.swa_full else gt.ggml_pad(min(kv_size, n_swa + n_ubatch), KV_PAD)
        n_kv_swa = n_kv_for(min(used, kv_size_swa), kv_size_swa)
    return Resolved(s, n_ctx, n_batch, n_ubatch, flash, type_k, type_v, s.tokens, outputs,
                    s.past, kv_size, kv_size_swa, n_kv_for(used, kv_size, p), n_kv_swa, notes)


def refuse_cache_types(run: Resolved, head_dims_k: Sequence[int], head_dims_v: Sequence[int],
                       path: str = "") -> None:
    """Refuse the cache types llama.cpp cannot create for this model.

    ``llama_init_from_model`` (src/llama-context.cpp) returns no context when flash
    attention is not disabled (``on`` or ``auto``) and a quantized K (V) cache type's block
    size does not divide some layer's ``n_embd_head_k`` (``n_embd_head_v``). With flash
    attention off it creates the context, but the K cache is viewed per head
    (``ggml_view_4d`` with ``nb1 = ggml_row_size(type_k, n_embd_head_k)``, whose
    divisibility check is a plain ``assert``, compiled out) and the run cannot work:
    measured with llama-cpp-python 0.3.36, it aborts (a view past its source) reserving
    the graph or in the first decode, or every logit is NaN (tests/test_refusals.py). Both are refused. ``head_dims_*`` are per layer, in
    elements."""
    fa_disabled = not run.flash_attn and (run.settings.flash_attn or "").lower() != "auto"
    where = f"{path}: " if path else ""
    for flag, t, dims, kind in (("--cache-type-k", run.type_k, head_dims_k, "k"),
                                ("--cache-type-v", run.type_v, head_dims_v, "v")):
        if not gt.is_quantized(t):
            continue
        blck = gt.block(t)[0]
        bad = sorted({d for d in dims if d % blck})
        if not bad:
            continue
        if not fa_disabled:
            raise SettingsError(
                f"{where}{flag} {gt.type_name(t)}: its block size {blck} does not divide "
                f"n_embd_head_{kind}={bad[0]} (llama_init_from_model refuses a quantized cache "
                "whose block size does not divide the head size when flash attention is on "
                "or auto)")
        raise SettingsError(
            f"{where}{flag} {gt.type_name(t)}: its block size {blck} does not divide "
            f"n_embd_head_{kind}={bad[0]} (with flash attention off llama.cpp creates the "
            "context but views the cache per head across quant blocks: it aborts or "
            "returns NaN logits)")
