"""One renderer interface for every ``--format`` (pip-audit's ``VulnerabilityFormat``).

A command's formats are an enum; each value has one :class:`Renderer` in a registry keyed
by it (tests check the registry is exhaustive). A renderer declares the command-line
options it uses (:attr:`Renderer.uses`); :func:`render` refuses an option the chosen format
does not use, with one line naming both, instead of dropping it without a word.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from graphcost.errors import GraphcostError

#: the options a user may give, by RenderOptions field, with the flag that sets each
FLAGS = {"layers": "--layers", "hardware": "--hardware", "top": "--top"}


@dataclass(frozen=True)
class RenderOptions:
    """What a renderer may be asked for. The :data:`FLAGS` fields are ``None`` when the
    user did not give the option; ``width`` and ``color`` describe the output device."""

    layers: set[int] | None = None      # --layers: only these model layers
    hardware: Any = None                # --hardware: a graphcost.cost.hardware.Hardware
    #: --cpu-features with --hardware: the ggml CPU features llama.cpp's weight placement is
    #: counted with for the predicted step (None: the profile's calibration's, else its
    #: CPU's, else this machine's; graphcost.cost.speed_model.placement_features)
    cpu_features: frozenset[str] | None = None
    top: int | None = None              # --top: rows of the slowest-nodes table
    width: int = 80                     # characters per line
    color: bool = False                 # the output is a colour terminal


class Renderer(ABC):
    """Renders one command's result in one format."""

    #: :data:`FLAGS` fields this format uses; any other given option is refused
    uses: frozenset[str] = frozenset()
    #: True if the format draws colour on a terminal
    colour: bool = False
    #: True if the format shows the memory plan (the caller then analyzes with it:
    #: ``analyze_graph(bg, memory=True)``)
    memory: bool = False

    @abstractmethod
    def render(self, data: Any, opts: RenderOptions) -> str:
        """The whole output text."""


def refuse_unused(renderers: Mapping[Enum, Renderer], fmt: Enum, opts: RenderOptions) -> None:
    """GraphcostError (one line, exit 2) for a given option ``fmt`` does not use."""
    r = renderers[fmt]
    for field, flag in FLAGS.items():
        if getattr(opts, field) is not None and field not in r.uses:
            users = [f.value for f, x in renderers.items() if field in x.uses]
            hint = f" (used by --format {' or '.join(users)})" if users else ""
            raise GraphcostError(f"--format {fmt.value} does not use {flag}{hint}")


def render(renderers: Mapping[Enum, Renderer], fmt: Enum, data: Any, opts: RenderOptions) -> str:
    """``renderers[fmt]`` applied to ``data``, after :func:`refuse_unused`."""
    refuse_unused(renderers, fmt, opts)
    return renderers[fmt].render(data, opts)


def wants_colour(r: Renderer, to_file: bool, isatty: bool) -> bool:
    """Colour only for a colour format written to a terminal."""
    return r.colour and not to_file and isatty
