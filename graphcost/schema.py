"""Type checks for the documents graphcost reads back (baselines, hardware profiles).

One small vocabulary of value kinds; a value of the wrong kind is one line naming the
file, the field (``run.ctx_size``, ``memory_bandwidth.by_type.q4_K``) and what it holds.
Numbers must be finite: a NaN in a baseline would make every comparison false, so the
``check`` gate could never fail.
"""
from __future__ import annotations

import math
from typing import Any

from graphcost.errors import GraphcostError

_WHAT = {
    "int": "an integer",
    "count": "a non-negative integer",
    "number": "a finite number",
    "nonneg": "a finite number >= 0",
    "positive": "a finite number > 0",
    "str": "a string",
    "bool": "true or false",
    "dict": "a mapping",
    "list": "a list",
}


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _ok(v: Any, kind: str) -> bool:
    if kind == "str":
        return isinstance(v, str)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "dict":
        return isinstance(v, dict)
    if kind == "list":
        return isinstance(v, list)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    if kind in ("int", "count"):
        return isinstance(v, int) and (kind == "int" or v >= 0)
    if not math.isfinite(v):
        return False
    return {"number": True, "nonneg": v >= 0, "positive": v > 0}[kind]


def need(v: Any, kind: str, where: str, file: object, *, null: bool = False) -> Any:
    """``v`` if it is of ``kind`` (or None when ``null``); else one line naming it."""
    if (v is None and null) or _ok(v, kind):
        return v
    raise GraphcostError(f"{file}: {where} must be {_WHAT[kind]}{' or null' if null else ''}, "
                         f"got {_show(v)}")


def field(doc: dict, key: str, kind: str, where: str, file: object, *,
          required: bool = True, null: bool = False) -> Any:
    """``doc[key]`` checked as :func:`need` (``where`` is the dotted path of ``doc``)."""
    path = f"{where}.{key}" if where else key
    if key not in doc:
        if required:
            raise GraphcostError(f"{file}: {path} is missing")
        return None
    return need(doc[key], kind, path, file, null=null)


def mapping_of(doc: Any, kind: str, where: str, file: object) -> dict:
    """A mapping whose keys are strings and whose values are of ``kind``."""
    need(doc, "dict", where, file)
    for k, v in doc.items():
        need(k, "str", f"a key of {where}", file)
        need(v, kind, f"{where}.{k}", file)
    return doc
