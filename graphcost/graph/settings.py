"""Run settings under llama.cpp's flag names, and the sizes llama.cpp derives from them.

Derivations follow ``src/llama-context.cpp`` (n_batch and n_ubatch clamped to the context
as given, n_ctx padded to 256, n_ctx_seq per KV stream with ``-np``), ``src/llama-kv-cache.cpp``
(``get_n_kv``: cells attended; ``n_stream``) and ``src/llama-kv-cache-iswa.cpp`` (size of the
sliding-window cache).
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
    n_seq_max: int = 1  # -np/--parallel: cparams.n_seq_max, sequences the context serves
    kv_unified: bool = False  # -kvu/--kv-unified: one KV stream shared by all sequences
    #: internal, not a flag: sequences this ubatch spans (ubatch.n_seqs = n_seqs_unq; the
    #: reserve graphs span n_seq_max: llama_batch_allocr::ubatch_reserve)
    seqs: int = 1
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
                if k not in ("memory_full", "v_trans", "seqs")}


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
    #: KV streams of each cache (llama_kv_cache::n_stream: 1 with -kvu, else n_seq_max);
    #: ``kv_size`` cells each
    n_stream: int = 1
    #: sequences in this ubatch (ubatch.n_seqs; the reserve graphs: n_seq_max)
    n_seqs: int = 1
    #: cparams.n_seq_max: ``max(1, -np)``
    n_seq_max: int = 1

    @property
    def n_ctx_seq(self) -> int:
        """cparams.n_ctx_seq, the context of one sequence in cells (llama_context
        constructor: n_ctx with -kvu or one sequence, else ``GGML_PAD(n_ctx / n_seq_max,
        256)``): the cells of one KV stream, ``kv_size``."""
        return self.kv_size

    @property
    def graph_streams(self) -> int:
        """Streams this ubatch's attention is split into: the KQ mask's ne[3] and the
        4-D K/V views' (build_attn_inp_kq_mask: ``kv_unified ? 1 : ubatch.n_seqs_unq``;
        llama_kv_cache::get_k: ``sinfo.s1 - sinfo.s0 + 1``, the same count)."""
        return 1 if self.settings.kv_unified else self.n_seqs

    @property
    def flash_attn_auto(self) -> bool:
        """``-fa auto`` (given, or the flavour's default): on for the CPU backend, but
        llama.cpp may turn it off with devices (graphcost.memory.sched.flash_attn_auto_fails)."""
        return _fa_flag(self.settings, self.flavour) == "auto"

    def step(self, tokens: int, past: int, outputs: int, memory_full: bool = False,
             seqs: int = 1) -> "Resolved":
        """The same context for a ubatch of ``tokens`` after ``past`` filled cells, of which
        ``outputs`` are outputs; ``memory_full``: built against the memory's full state
        (every cache attends all its cells); ``seqs``: sequences the ubatch spans."""
        s = dataclasses.replace(self.settings, tokens=tokens, past=past, outputs=outputs,
                                memory_full=memory_full, seqs=seqs)
        return dataclasses.replace(self, settings=s, **self.ubatch(tokens, past, outputs,
                                                                   memory_full, seqs))

    def ubatch(self, tokens: int, past: int, outputs: int, memory_full: bool = False,
               seqs: int = 1) -> dict:
        """The fields :meth:`step` sets for that ubatch (``n_tokens``, ``n_outputs``,
        ``past``, ``n_seqs``, ``n_kv``, ``n_kv_swa``), checked the same way, without
        making the new :class:`Resolved` (the executor's plan lookup a step: ~4 us here
        against ~28 us for :meth:`step`)."""
        return _ubatch(self, tokens, past, outputs, memory_full, seqs)

    @property
    def kv_pads(self) -> tuple[int, int]:
        """Cells ``n_kv`` and ``n_kv_swa`` are padded to (llama_kv_cache::get_n_kv's
        ``n_pad``: the flavour's, and 256 for the SWA cache)."""
        return self.flavour.kv_pad(self.flash_attn), KV_PAD

    def kv_cells_sum(self, tokens: int, rows: "Rows", lo: int, hi: int) -> tuple[int, int]:
        """``(sum of n_kv, sum of n_kv_swa or 0)`` over the ubatches ``m`` in ``lo..hi`` of
        ``rows`` (``rows.used``: past + ``tokens``), each ``step(tokens, rows.at(m) - tokens,
        1)`` (one sequence), in closed form (:func:`n_kv_sum`): cells. Refuses a ubatch that
        does not fit, as :meth:`step`."""
        if hi > lo:
            self.step(tokens, rows.at(hi - 1) - tokens, 1)   # the fullest one fits
        pad, pad_swa = self.kv_pads
        # n_kv_swa = n_kv_for(min(used, S), S): for used >= 1 it equals n_kv_for(used, S)
        # (at used >= S both are S: p * ceil(min(used, S) / p) >= S and p * ceil(used / p)
        # >= used >= S, each capped at S)
        swa = (0 if self.kv_size_swa is None
               else n_kv_sum(rows, lo, hi, self.kv_size_swa, pad_swa))
        return n_kv_sum(rows, lo, hi, self.kv_size, pad), swa

    def to_dict(self) -> dict:
        return {
            **self.settings.to_dict(),
            "n_ctx": self.n_ctx, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "n_stream": self.n_stream,
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


@dataclass(frozen=True)
class Rows:
    """Ubatches laid out in rows: ubatch ``m`` (``0 <= m < row * rows``) is ``j = m % row``
    of row ``k = m // row`` and has ``used + j * step + k * row_step`` filled cells after it
    (``used >= 1``, ``step >= 0``; with several rows ``row_step >= (row - 1) * step``: the
    cells never fall along ``m``). One row is an arithmetic run of ubatches; rows of them are the ubatches without
    output of a prompt's full batches (a row per batch)."""

    used: int
    step: int
    row: int
    row_step: int = 0
    rows: int = 1

    def __post_init__(self):
        if (self.used < 1 or self.step < 0 or self.row < 1 or self.rows < 0
                or (self.rows > 1 and self.row_step < (self.row - 1) * self.step)):
            raise ValueError(f"{self}: needs used >= 1, step >= 0, row >= 1, rows >= 0 and "
                             "(between rows) row_step >= (row - 1) * step")

    @property
    def length(self) -> int:
        return self.row * self.rows

    def at(self, m: int) -> int:
        """Filled cells after ubatch ``m``."""
        k, j = divmod(m, self.row)
        return self.used + j * self.step + k * self.row_step


def n_kv_sum(r: Rows, lo: int, hi: int, size: int, p: int = KV_PAD) -> int:
    """``sum(n_kv_for(r.at(m), size, p) for m in range(lo, hi))`` in closed form (cells),
    in O(log + p) integer operations whatever ``hi - lo``.

    For ``u >= 1``, ``n_kv_for(u) = min(size, p * ceil(u / p))`` (the ``max`` with ``p`` never
    binds); it is ``size`` from the first ``u > p * (ceil(size / p) - 1)`` on (a suffix of
    ``lo..hi``: the cells never fall along ``m``, found by bisection), and before that
    ``p * floor((u + p - 1) / p)``, summed row by row by :func:`floor_sum`
    (:func:`ceil_sum_rows`)."""
    cap = p * (-(-size // p) - 1)            # n_kv_for(u) == size exactly when u > cap
    a, b = lo, max(lo, hi)
    while a < b:                             # the first ubatch past the cap
        mid = (a + b) // 2
        if r.at(mid) > cap:
            b = mid
        else:
            a = mid + 1
    return p * ceil_sum_rows(r, lo, a, p) + (max(lo, hi) - a) * size


def ceil_sum_rows(r: Rows, lo: int, hi: int, p: int) -> int:
    """``sum(ceil(r.at(m) / p) for m in range(lo, hi))`` (``floor((r.at(m) + p - 1) / p)``;
    with ``p = 1`` the cells summed): the partial first and
    last rows by :func:`floor_sum`, the whole rows between them grouped by their row number
    modulo ``p`` (row ``k + p t`` is row ``k`` with ``t p row_step`` more cells, so each of its
    ``row`` terms is ``t row_step`` more): ``min(rows, p)`` floor sums."""
    if lo >= hi:
        return 0
    (k_lo, j_lo), (k_hi, j_hi) = divmod(lo, r.row), divmod(hi, r.row)
    c = r.used + p - 1

    def row_part(k: int, j0: int, j1: int) -> int:      # row k, j0 <= j < j1
        return floor_sum(j1 - j0, p, r.step, c + k * r.row_step + j0 * r.step)

    if k_lo == k_hi:
        return row_part(k_lo, j_lo, j_hi)
    total = row_part(k_lo, j_lo, r.row) + row_part(k_hi, 0, j_hi)
    whole = k_hi - k_lo - 1                              # rows k_lo + 1 .. k_hi - 1
    for k0 in range(min(whole, p)):
        n = -(-(whole - k0) // p)                        # rows k0, k0 + p, ... of them
        total += (n * row_part(k_lo + 1 + k0, 0, r.row)
                  + r.row * r.row_step * n * (n - 1) // 2)
    return total


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a * i + b) / m) for i in range(n))`` for ``n, a, b >= 0``, ``m >= 1``, by
    Euclid-like reduction (the standard floor-sum identity: take ``a // m`` and ``b // m``
    out, then swap the roles of ``a`` and ``m`` on the lattice points under the line)."""
    total = 0
    while n > 0:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            break
        n, b = divmod(y_max, m)
        m, a = a, m
    return total


#: llama.cpp parses -c, -b, -ub, -np as C ``int`` (common/arg.cpp: the handler takes ``int
#: value``, read with std::stoi, which throws out_of_range above INT32_MAX)
INT32_MAX = 2**31 - 1
_INT_FLAGS = (("--ctx-size", "ctx_size"), ("--batch-size", "batch_size"),
              ("--ubatch-size", "ubatch_size"), ("--tokens", "tokens"), ("--past", "past"),
              ("--outputs", "outputs"), ("--parallel", "n_seq_max"))
#: LLAMA_MAX_SEQ (src/llama-cparams.h): the llama_context constructor throws above it
LLAMA_MAX_SEQ = 256


def resolve(s: RunSettings, n_ctx_train: int, n_swa: int, memory: bool = True) -> Resolved:
    """Apply llama.cpp's padding and clamping; reject what llama.cpp would reject.

    The llama_context constructor (src/llama-context.cpp) clamps n_batch to the context
    *as given* (before padding; only with causal attention) and n_ubatch to n_batch, then
    pads n_ctx to 256; without ``-kvu`` each of the n_seq_max streams holds ``n_ctx_seq =
    GGML_PAD(n_ctx / n_seq_max, 256)`` cells and n_ctx becomes ``n_ctx_seq * n_seq_max``.

    ``memory=False``: the architecture has no KV cache (llama_model::create_memory returns
    nullptr: bert) and non-causal attention (n_batch is not clamped); llama_context::decode
    then calls encode, which outputs every token of the ubatch (``n_outputs = n_tokens``)
    and keeps nothing between calls."""
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
    if not 0 <= s.n_seq_max <= LLAMA_MAX_SEQ:
        # common/arg.cpp passes -np as given into the uint32 cparams.n_seq_max (a negative
        # value wraps); llama_context throws "n_seq_max must be <= LLAMA_MAX_SEQ"
        raise SettingsError(f"--parallel {s.n_seq_max} must be between 0 and {LLAMA_MAX_SEQ} "
                            "(llama_context refuses n_seq_max above LLAMA_MAX_SEQ)")
    n_seq = max(1, s.n_seq_max)  # llama_context: n_seq_max = max(1u, params.n_seq_max)
    fl = flavour(s.llama_cpp)
    if (n_seq > 1 or s.kv_unified) and not fl.has_kv_streams:
        raise SettingsError(f"--parallel/--kv-unified: llama.cpp {fl.name} is modelled with one "
                            "sequence only (its KV cache had no streams)")
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
    # llama_context constructor: "with causal attention, the batch size is limited by the
    # context size" -- the context as given, before it is padded
    n_batch = min(ctx, s.batch_size) if memory else s.batch_size
    n_ubatch = min(n_batch, s.ubatch_size)
    n_ctx = gt.ggml_pad(ctx, fl.kv_pad(flash))
    n_stream = 1 if s.kv_unified else n_seq
    # n_ctx_seq: GGML_PAD(n_ctx / n_seq_max, 256) cells per stream (the whole context when
    # unified); n_ctx rounds to n_ctx_seq * n_seq_max ("n_ctx is not divisible by
    # n_seq_max - rounding down": up as well, when the padding adds a block per stream)
    # (never 0: n_ctx >= 256 >= n_seq_max, so llama.cpp's "n_ctx_seq == 0" cannot happen)
    kv_size = n_ctx if n_stream == 1 else gt.ggml_pad(n_ctx // n_seq, KV_PAD)
    if n_stream > 1:
        n_ctx = kv_size * n_seq
    kv_size_swa = None
    notes = []
    if fa == "auto":
        notes.append("flash attention 'auto' resolves to on for the CPU backend")
    if not memory:
        notes.append("no KV cache (encoder): every token is an output, --past and "
                     "--outputs have no effect")
    if n_stream > 1:
        notes.append(f"{n_stream} KV streams (-np {n_seq}) of {kv_size} cells each")
    if n_swa > 0:
        # llama_kv_cache_iswa: n_swa * (unified ? n_seq_max : 1) + n_ubatch, padded to 256
        swa_cells = n_swa * (n_seq if s.kv_unified else 1) + n_ubatch
        kv_size_swa = kv_size if s.swa_full else gt.ggml_pad(min(kv_size, swa_cells), KV_PAD)
    context = Resolved(s, fl, n_ctx, n_batch, n_ubatch, flash, type_k, type_v, 0, 0, 0, kv_size,
                       kv_size_swa, 0, None, notes, memory, n_stream, 1, n_seq)
    return dataclasses.replace(context, **context.ubatch(s.tokens, s.past, s.outputs,
                                                         s.memory_full, s.seqs))


def _ubatch(ctx: Resolved, tokens: int, past: int, outputs: int, memory_full: bool,
            seqs: int) -> dict:
    """The ubatch fields of a :class:`Resolved` for ``tokens`` after ``past`` cells in
    the context ``ctx``; refuses a ubatch that does not fit (as llama_decode would).

    ``seqs`` sequences of ``tokens / seqs`` tokens each (equal splits: the reserve
    graphs, whose tokens llama_context::graph_reserve rounds up to a multiple of n_seqs,
    so they may exceed n_ubatch by up to n_seqs - 1); ``past`` cells are filled in each
    sequence's stream. Built against the full memory (``memory_full``, init_full) every
    cache attends all its cells (llama_kv_cache_context: ``n_kv = get_size()``)."""
    if not 1 <= seqs <= ctx.n_seq_max:
        raise SettingsError(f"a ubatch of {seqs} sequences: the context serves "
                            f"--parallel {ctx.n_seq_max}")
    if tokens < 1:
        raise SettingsError(f"--tokens {tokens} must be >= 1")
    if tokens % seqs:
        raise SettingsError(f"--tokens {tokens} is not {seqs} equal sequences")
    limit = ctx.n_ubatch + (seqs - 1 if memory_full else 0)
    if tokens > limit:
        raise SettingsError(f"--tokens {tokens} is more than one ubatch holds "
                            f"(-ub {ctx.n_ubatch})")
    if past < 0:
        raise SettingsError(f"--past {past} must be >= 0")
    per_seq = tokens // seqs
    if not memory_full and past + per_seq > ctx.kv_size:
        what = "context" if ctx.n_stream == 1 else "KV stream"
        raise SettingsError(f"--past {past} + --tokens {per_seq} exceed the {what} of "
                            f"{ctx.kv_size} cells")
    n_out = outputs if ctx.memory or memory_full else tokens
    if not 1 <= n_out <= tokens:
        raise SettingsError(f"--outputs {outputs} must be between 1 and --tokens {tokens}")
    if memory_full:
        return dict(n_tokens=tokens, n_outputs=n_out, past=past, n_seqs=seqs,
                    n_kv=ctx.kv_size, n_kv_swa=ctx.kv_size_swa)
    used = past + per_seq
    n_kv_swa = None
    pad, pad_swa = ctx.kv_pads
    if ctx.kv_size_swa is not None:
        n_kv_swa = n_kv_for(min(used, ctx.kv_size_swa), ctx.kv_size_swa, pad_swa)
    return dict(n_tokens=tokens, n_outputs=n_out, past=past, n_kv_swa=n_kv_swa,
                n_seqs=seqs, n_kv=n_kv_for(used, ctx.kv_size, pad))


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
