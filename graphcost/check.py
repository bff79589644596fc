"""``graphcost check``: compare a model's costs now with a baseline ``analyze --format yaml``.

Pure comparison on the two documents; the CLI decides exit codes (0 within tolerance,
1 drifted, 2 bad input).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from .errors import GraphcostError
from .document import SCHEMA
from .settings import RunSettings


@dataclass(frozen=True)
class Drift:
    metric: str
    baseline: float | None
    current: float | None

    @property
    def rel(self) -> float:
        if self.baseline is None or self.current is None:
            return math.inf
        if self.baseline == 0:
            return 0.0 if self.current == 0 else math.inf
        return abs(self.current - self.baseline) / abs(self.baseline)


def load_baseline(path: str | Path) -> dict:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise GraphcostError(f"{p}: cannot read baseline: {e.strerror or e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise GraphcostError(f"{p}: {where}not valid YAML/JSON") from None
    if not isinstance(doc, dict):
        raise GraphcostError(f"{p}: a baseline is what 'graphcost analyze --format yaml' writes")
    if doc.get("schema") != SCHEMA:
        raise GraphcostError(f"{p}: baseline schema {doc.get('schema')!r}, this graphcost "
                             f"writes schema {SCHEMA}")
    for key in ("run", "totals", "by_op"):
        if key not in doc:
            raise GraphcostError(f"{p}: baseline has no {key!r} section")
    return doc


def baseline_settings(doc: dict, path: str | Path) -> RunSettings:
    """The run settings the baseline was made with."""
    run = doc["run"]
    fields = RunSettings.__dataclass_fields__
    kw = {}
    for k in fields:
        if k in run:
            kw[k] = run[k]
    try:
        return RunSettings(**kw)
    except TypeError as e:
        raise GraphcostError(f"{path}: baseline 'run' section: {e}") from None


def metrics(doc: dict) -> dict[str, float]:
    """Flatten the compared numbers: totals, per-op totals, memory."""
    out: dict[str, float] = {}
    t = doc.get("totals", {})
    for k in ("nodes", "bytes_read", "bytes_written", "work", "flops"):
        if k in t:
            out[f"totals.{k}"] = t[k]
    for k, v in (t.get("read") or {}).items():
        out[f"totals.read.{k}"] = v
    for k, v in (t.get("ops") or {}).items():
        out[f"totals.ops.{k}"] = v
    for row in doc.get("by_op", []):
        for k in ("bytes_read", "bytes_written", "flops"):
            out[f"by_op.{row['key']}.{k}"] = row.get(k, 0)
    mem = doc.get("memory", {})
    for k in ("weights_bytes", "kv_cache_bytes"):
        if k in mem:
            out[f"memory.{k}"] = mem[k]
    return out


def compare(baseline: dict, current: dict, rtol: float) -> list[Drift]:
    """Every metric whose relative change exceeds ``rtol`` (appearing/vanishing: always)."""
    b, c = metrics(baseline), metrics(current)
    drifts = []
    for k in sorted(set(b) | set(c)):
        d = Drift(k, b.get(k), c.get(k))
        if d.rel > rtol:
            drifts.append(d)
    return drifts
