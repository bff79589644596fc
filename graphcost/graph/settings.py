"""Run settings under llama.cpp's flag names, and the sizes llama.cpp derives from them.

Derivations follow ``src/llama-context.cpp`` (n_ctx padded to 256, n_batch and n_ubatch
clamped), ``src/llama-kv-cache.cpp`` (``get_n_kv``: cells attended) and
``src/llama-kv-cache-iswa.cpp`` (size of the sliding-window cache).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

from graphcost.format import ggml_types as gt
from graphcost.errors import SettingsError
from graphcost.graph.flavour import KV_PAD, Flavour, flavour

#: cache types llama.cpp's ``-ctk/-ctv`` accept (common/arg.cpp kv_cache_types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
@dataclass(frozen=True)
class RunSettings:
    """What the user asked for, with llama-cli's defaults."""

    ctx_size: int = 4096  # -c; 0 = the model's training context
    batch_size: int = 2048  # -b
    ubatch_size: int = 512  # -ub
    flash_attn: str | None = None  # -fa on|off|auto; None: the flavour's default
    # (Flavour.flash_attn_default; auto is on for the CPU backend)
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
    #: internal, not a flag: the V cache layout when it differs from what flash attention
    #: implies (llama.cpp creates the cache with ``-fa auto`` as on, ``v_trans = false``, and
    #: resolve_fused_ops may turn flash attention off afterwards: graphcost.memory.sched)
    v_trans: bool | None = None

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__
                if k not in ("memory_full", "v_trans")}


@dataclass(frozen=True)
class Resolved:
    """Settings after llama.cpp's own adjustments; all sizes in cells or tokens.

    The context (n_ctx, batch sizes, flash attention, cache types and sizes) is resolved
    once; :meth:`step` derives another ubatch (tokens, past, outputs) of the same context
    (the reserve graphs of graphcost.memory.plan, the executor's steps)."""

    settings: RunSettings
    flavour: Flavour
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
    #: the architecture keeps a memory (KV cache or recurrent state) between ubatches
    memory: bool = True

    @property
    def flash_attn_auto(self) -> bool:
        """``-fa auto`` (given, or the flavour's default): on for the CPU backend, but
        llama.cpp may turn it off with devices (graphcost.memory.sched.flash_attn_auto_fails)."""
        return _fa_flag(self.settings, self.flavour) == "auto"

    def step(self, tokens: int, past: int, outputs: int, memory_full: bool = False) -> "Resolved":
        """The same context for a ubatch of ``tokens`` after ``past`` filled cells, of which
        ``outputs`` are outputs; ``memory_full``: built against the memory's full state."""
        s = dataclasses.replace(self.settings, tokens=tokens, past=past, outputs=outputs,
                                memory_full=memory_full)
        return dataclasses.replace(self, settings=s, **_ubatch(s, self))

    def to_dict(self) -> dict:
        return {
            **self.settings.to_dict(),
            "n_ctx": self.n_ctx, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "flash_attn": "on" if self.flash_attn else "off",
            "kv_size": self.kv_size, "kv_size_swa": self.kv_size_swa,
            "n_kv": self.n_kv, "n_kv_swa": self.n_kv_swa,
        }


def _fa_flag(s: RunSettings, fl: Flavour) -> str:
    """The -fa value in force: the one given, else the flavour's default (lower case)."""
    return (s.flash_attn or fl.flash_attn_default).lower()


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
    fl = flavour(s.llama_cpp)
    fa = _fa_flag(s, fl)
    if fa not in ("on", "off", "auto", "true", "false", "1", "0"):
        raise SettingsError(f"--flash-attn {s.flash_attn!r}: use on, off or auto")
    if fa == "auto" and not fl.has_fa_auto:
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
    n_ctx = gt.ggml_pad(ctx, fl.kv_pad(flash))
    n_batch = min(n_ctx, s.batch_size)
    n_ubatch = min(n_batch, s.ubatch_size)
    kv_size = n_ctx
    kv_size_swa = None
    notes = []
    if fa == "auto":
        notes.append("flash attention 'auto' resolves to on for the CPU backend")
    if not memory:
        notes.append("no KV cache (encoder): every token is an output, --past and "
                     "--outputs have no effect")
    if n_swa > 0:
        kv_size_swa = kv_size if s.swa_full else gt.ggml_pad(min(kv_size, n_swa + n_ubatch), KV_PAD)
    context = Resolved(s, fl, n_ctx, n_batch, n_ubatch, flash, type_k, type_v, 0, 0, 0, kv_size,
                       kv_size_swa, 0, None, notes, memory)
    return dataclasses.replace(context, **_ubatch(s, context))


def _ubatch(s: RunSettings, ctx: Resolved) -> dict:
    """The ubatch fields of a :class:`Resolved` for ``s.tokens`` after ``s.past`` cells in
    the context ``ctx``; refuses a ubatch that does not fit (as llama_decode would)."""
    if s.tokens < 1:
        raise SettingsError(f"--tokens {s.tokens} must be >= 1")
    if s.tokens > ctx.n_ubatch:
        raise SettingsError(f"--tokens {s.tokens} is more than one ubatch holds "
                            f"(-ub {ctx.n_ubatch})")
    if s.past < 0:
        raise SettingsError(f"--past {s.past} must be >= 0")
    if s.past + s.tokens > ctx.n_ctx:
        raise SettingsError(f"--past {s.past} + --tokens {s.tokens} exceed the context of "
                            f"{ctx.n_ctx} cells")
    outputs = s.outputs if ctx.memory else s.tokens
    if not 1 <= outputs <= s.tokens:
        raise SettingsError(f"--outputs {s.outputs} must be between 1 and --tokens {s.tokens}")
    used = s.past + s.tokens
    n_kv_swa = None
    if ctx.kv_size_swa is not None:
        n_kv_swa = n_kv_for(min(used, ctx.kv_size_swa), ctx.kv_size_swa)
    return dict(n_tokens=s.tokens, n_outputs=outputs, past=s.past, n_kv_swa=n_kv_swa,
                n_kv=n_kv_for(used, ctx.kv_size, ctx.flavour.kv_pad(ctx.flash_attn)))


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
    fa_disabled = not run.flash_attn and not run.flash_attn_auto
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
