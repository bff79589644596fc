"""``--format``: one enum, one renderer per value, all with the same signature."""
from __future__ import annotations

from enum import Enum
from typing import Callable

import yaml

from ..analysis import Analysis
from .document import document, to_json
from .summary import render_summary


class Format(str, Enum):
    summary = "summary"
    tree = "tree"
    json = "json"
    yaml = "yaml"


def _json(a: Analysis, *, hardware=None, **_: object) -> str:
    return to_json(document(a, hardware=hardware))


def _yaml(a: Analysis, *, hardware=None, **_: object) -> str:
    return yaml.safe_dump(document(a, hardware=hardware), sort_keys=False, width=100)


def _tree(a: Analysis, *, layers: set[int] | None = None, **_: object) -> str:
    from .tree import render_tree
    return render_tree(a, layers=layers)


def _summary(a: Analysis, *, width: int = 80, color: bool = False, hardware=None,
             **_: object) -> str:
    return render_summary(a, width=width, color=color, hardware=hardware)


#: every Format has exactly one renderer (tests/test_formats.py checks this)
RENDERERS: dict[Format, Callable[..., str]] = {
    Format.summary: _summary,
    Format.tree: _tree,
    Format.json: _json,
    Format.yaml: _yaml,
}
