"""Where the bundled data lives: ``specs/``, ``kernels/`` and ``examples/``.

In a wheel they are installed inside the package (``graphcost/_bundled/<name>``, see
``pyproject.toml``); in a source checkout they sit beside the package.
"""
from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def bundled(name: str) -> Path:
    """Directory of bundled data ``name`` (``specs``, ``kernels`` or ``examples``)."""
    inside = _PKG / "_bundled" / name
    return inside if inside.is_dir() else _PKG.parent / name


#: the model ``graphcost analyze`` uses when given none
DEFAULT_EXAMPLE = "llama-3.1-8b-instruct-q4_k_m.gguf"


def default_model() -> Path:
    return bundled("examples") / DEFAULT_EXAMPLE
