"""Which GGUF architectures graphcost models, what is proven for each, and which it does not.

The modelled families are the specs in ``specs/arch/`` (:func:`graphcost.graph.arch_spec.load_specs`);
each names the test files that prove its graph, memory and executor against llama.cpp
(``proven``). The architectures a GGUF can name come from the ``gguf`` package
(``gguf.MODEL_ARCH_NAMES``, the list llama.cpp's converter writes); those without a spec
are listed as not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

import gguf

from graphcost.graph.arch_spec import PROVEN_ASPECTS, load_specs


@dataclass(frozen=True)
class Family:
    """One modelled architecture (``name@flavour`` for a flavour's own graph)."""

    name: str
    source: str                 # the llama.cpp file it mirrors
    proven: dict[str, str]      # aspect -> test file


def families() -> list[Family]:
    return [Family(k, s.source, dict(s.proven)) for k, s in sorted(load_specs().items())]


def not_modelled() -> list[str]:
    """Architectures a GGUF may carry (gguf's list) that have no spec here."""
    have = {k.split("@")[0] for k in load_specs()}
    return sorted(set(gguf.MODEL_ARCH_NAMES.values()) - have)


def archs_document() -> dict:
    """The ``graphcost archs`` report as data."""
    return {
        "families": [{"architecture": f.name, "source": f.source,
                      "proven": {a: f.proven.get(a) for a in PROVEN_ASPECTS}}
                     for f in families()],
        "not_modelled": not_modelled(),
        "gguf_version": _gguf_version(),
    }


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown"
