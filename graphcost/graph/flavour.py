"""Graph flavours: which llama.cpp the graph mirrors (``--llama-cpp``), and everything that
differs between those versions, in one object each.

``head`` is llama.cpp as vendored by llama-cpp-python 0.3.36 (the judge); ``2024-08`` is
llama.cpp of August 2024 (6e02327e8). Modules ask the :class:`Flavour` (``run.flavour``
of a resolved run, :class:`graphcost.graph.settings.Resolved`) instead of testing the
flavour's name.
"""
from __future__ import annotations

from dataclasses import dataclass

from graphcost.errors import SettingsError

#: head: llama.cpp pads n_ctx and the attended KV length to this many cells
#: (llama_kv_cache::get_padding, src/llama-kv-cache.cpp)
KV_PAD = 256


@dataclass(frozen=True)
class Flavour:
    """One ``--llama-cpp`` value and what it changes."""

    name: str
    description: str
    #: what ``-fa`` means when it is not given: ``auto`` since 2025-08-30 (e81b8e4b7);
    #: before that flash attention was a switch, off unless ``-fa`` was passed
    flash_attn_default: str
    #: cells n_ctx and n_kv are padded to, without and with flash attention
    kv_pad_no_fa: int
    kv_pad_fa: int
    #: the worst-case graphs allocated at start-up (graphcost.memory.plan)
    reserve_graphs: tuple[str, ...]
    #: suffix of the spec's architecture name in specs/arch/ (``llama@2024-08``)
    spec_suffix: str
    #: graphcost's executor runs this flavour's graphs
    executable: bool
    #: ``-np N`` and ``-kvu`` are modelled: KV caches with n_stream streams and per-stream
    #: attention views (llama_kv_cache, 2025-07 on); 2024-08 is modelled with one sequence
    has_kv_streams: bool = False

    @property
    def has_fa_auto(self) -> bool:
        """``-fa auto`` exists (it is refused where it does not)."""
        return self.flash_attn_default == "auto"

    def kv_pad(self, flash_attn: bool) -> int:
        """Cells n_ctx and n_kv are padded to (llama_kv_cache_get_padding in 2024-08)."""
        return self.kv_pad_fa if flash_attn else self.kv_pad_no_fa

    def spec_key(self, arch: str) -> str:
        """The spec (``architecture:`` of specs/arch/*.yaml) that builds ``arch`` here."""
        return arch + self.spec_suffix

    def cli_flag(self) -> str:
        """`` --llama-cpp NAME`` when not the default flavour, else empty."""
        return "" if self is HEAD else f" --llama-cpp {self.name}"


HEAD = Flavour(
    name="head",
    description="llama.cpp as vendored by llama-cpp-python 0.3.36 (2026): SET_ROWS KV store, "
                "n_ctx and n_kv padded to 256",
    flash_attn_default="auto", kv_pad_no_fa=KV_PAD, kv_pad_fa=KV_PAD,
    # llama_context::sched_reserve: a prompt and a token-generation graph
    reserve_graphs=("prompt", "generation"),
    spec_suffix="", executable=True, has_kv_streams=True)

AUG_2024 = Flavour(
    name="2024-08",
    description="llama.cpp of August 2024 (6e02327e8): KV stored by CPY into cache views, 1-D "
                "caches, n_ctx and n_kv padded to 32 without flash attention (256 with), mask "
                "rows padded to 32, names of that time (inp_embd, k_cache_view, kq_soft_max_ext)",
    # llama_kv_cache_get_padding: 256 with flash attention, else 32
    flash_attn_default="off", kv_pad_no_fa=32, kv_pad_fa=256,
    # llama_new_context_with_model: only the prompt graph (llama_build_graph(..., worst_case
    # = true)); not checked against that llama.cpp
    reserve_graphs=("prompt",),
    spec_suffix="@2024-08", executable=False)

#: every flavour by its ``--llama-cpp`` name
FLAVOURS: dict[str, Flavour] = {f.name: f for f in (HEAD, AUG_2024)}


def flavour(name: str) -> Flavour:
    """The flavour ``--llama-cpp name`` selects; SettingsError for an unknown name."""
    f = FLAVOURS.get(name)
    if f is None:
        raise SettingsError(f"--llama-cpp {name!r}: known flavours are {', '.join(FLAVOURS)}")
    return f
