"""``graphcost check``: compare a model's costs now with a baseline ``analyze --format yaml``.

Pure comparison on the two documents; the CLI decides exit codes (0 within tolerance,
1 drifted, 2 bad input).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from graphcost.errors import GraphcostError
from graphcost.document import SCHEMA
from graphcost.files import MAX_BASELINE_BYTES, load_yaml
from graphcost.schema import field, mapping_of, need
from graphcost.graph.settings import RunSettings


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


#: run-setting fields by their annotation -> schema kind
_RUN_KINDS = {"int": "count", "str": "str", "bool": "bool"}
#: totals fields that are numbers; ``read`` and ``ops`` are mappings of numbers
_TOTALS = ("nodes", "bytes_read", "bytes_written", "work", "flops")
_BY_OP = ("bytes_read", "bytes_written", "flops")
_MEMORY = ("weights_bytes", "kv_cache_bytes")


def load_baseline(path: str | Path) -> dict:
    """Read and validate a baseline: a regular file of at most MAX_BASELINE_BYTES, YAML
    without aliases, every compared field of the right type and every number finite
    (one line naming the field otherwise)."""
    p = Path(path)
    doc = load_yaml(p, "baseline", MAX_BASELINE_BYTES)
    if not isinstance(doc, dict):
        raise GraphcostError(f"{p}: a baseline is what 'graphcost analyze --format yaml' writes")
    if doc.get("schema") != SCHEMA or isinstance(doc.get("schema"), bool):
        raise GraphcostError(f"{p}: baseline schema {doc.get('schema')!r}, this graphcost "
                             f"writes schema {SCHEMA}")
    for key in ("run", "totals", "by_op"):
        if key not in doc:
            raise GraphcostError(f"{p}: baseline has no {key!r} section")
    run = need(doc["run"], "dict", "run", p)
    for name, f in RunSettings.__dataclass_fields__.items():
        kind, _, none = str(f.type).partition(" | ")
        field(run, name, _RUN_KINDS[kind], "run", p, required=False, null=none == "None")
    totals = need(doc["totals"], "dict", "totals", p)
    for k in _TOTALS:
        field(totals, k, "nonneg", "totals", p, required=False)
    for k in ("read", "ops"):
        if totals.get(k) is not None:
            mapping_of(totals[k], "nonneg", f"totals.{k}", p)
    for i, row in enumerate(need(doc["by_op"], "list", "by_op", p)):
        need(row, "dict", f"by_op[{i}]", p)
        field(row, "key", "str", f"by_op[{i}]", p)
        for k in _BY_OP:
            field(row, k, "nonneg", f"by_op[{i}]", p, required=False)
    if doc.get("memory") is not None:
        mem = need(doc["memory"], "dict", "memory", p)
        for k in _MEMORY:
            field(mem, k, "nonneg", "memory", p, required=False)
    return doc


def baseline_settings(doc: dict, path: str | Path) -> RunSettings:
    """The run settings the baseline was made with (types checked by load_baseline)."""
    run = doc["run"]
    return RunSettings(**{k: run[k] for k in RunSettings.__dataclass_fields__ if k in run})


def unknown_run_keys(baseline: dict, current: dict, path: str | Path) -> None:
    """Refuse a baseline whose ``run`` section holds a key this graphcost does not write
    (a typo such as ``ctx_sise`` would otherwise be ignored and the check run at the
    default): one line naming the keys. Missing keys are fine (the defaults)."""
    extra = sorted(set(baseline["run"]) - set(current.get("run", {})))
    if extra:
        raise GraphcostError(f"{path}: the baseline's run section has unknown key(s) "
                             f"{', '.join(map(repr, extra))}")


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
