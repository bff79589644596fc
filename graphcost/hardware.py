"""Hardware profiles and the roofline model they feed.

A profile is a YAML file in ``specs/hardware/`` (bundled) or given by path: a name, the
memory bandwidth (bytes/s, streaming read) and the peak FLOP rate (FLOP/s), each with
``how`` it was obtained and a ``source``. ``kind: theoretical`` profiles are datasheet
arithmetic (channels x bus width x transfer rate; cores x clock x FLOP/cycle) and cite
the datasheet; ``kind: measured`` ones come from ``graphcost hwprobe`` on that machine.

Roofline (Williams, Waterman, Patterson, CACM 52(4), 2009): a node that moves ``B`` bytes
and does ``F`` FLOPs takes at least ``max(B / bandwidth, F / peak)`` seconds; which term
wins says whether it is memory- or compute-bound. ``B`` is what graphcost's cost model
counts (bytes read + bytes written, see docs/counting.md), ``F`` its FLOPs (FMA = 2).

A measured profile also holds what graphcost's own executor achieves on that machine:
``op_overhead`` (seconds one tiny node of each op kind takes end to end: Python, Numba
dispatch, thread wake-up) and ``memory_bandwidth.by_type`` (bytes/s the executor's
matrix-vector kernel streams for each weight type). They are not part of the roofline,
which is the machine's limit; :func:`executor_seconds` adds them to it to model the
executor itself, and ``graphcost profile`` reports how close both come to the measured
node times.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import ops
from .errors import GraphcostError
from .resources import bundled

KINDS = ("theoretical", "measured")


@dataclass(frozen=True)
class Hardware:
    """One machine: bytes/s it streams from memory, FLOP/s it can compute."""

    name: str
    bandwidth: float          # bytes per second
    peak_flops: float         # FLOP per second (FMA = 2)
    kind: str = "theoretical"
    description: str = ""
    threads: int | None = None
    path: Path | None = None
    overhead: float = 0.0     # seconds per executed node (measured profiles only)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def matvec_rate(self, type_name: str) -> float:
        """Bytes/s the executor's matmul streams ``type_name`` weights at (the profile's
        ``by_type`` figure; the bandwidth if the profile has none)."""
        by_type = (self.extra.get("memory_bandwidth") or {}).get("by_type") or {}
        return float(by_type.get(type_name, self.bandwidth))

    def op_overhead(self, op: str) -> float:
        """Per-call overhead of ``op`` (its own measurement if the probe has one)."""
        by_op = (self.extra.get("op_overhead") or {}).get("by_op") or {}
        return float(by_op.get(op, self.overhead))

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "description": self.description,
                "threads": self.threads, "bandwidth_bytes_per_s": self.bandwidth,
                "peak_flops_per_s": self.peak_flops, "op_overhead_s": self.overhead,
                "path": None if self.path is None else str(self.path)}


def roofline_seconds(nbytes: float, flops: float, hw: Hardware,
                     bandwidth: float | None = None) -> tuple[float, str]:
    """(lower-bound seconds, ``"memory"`` or ``"compute"``) for one node or a sum; the
    memory roof is ``bandwidth`` bytes/s if given, else the profile's."""
    t_mem = nbytes / (bandwidth or hw.bandwidth)
    t_cmp = flops / hw.peak_flops
    return (t_mem, "memory") if t_mem >= t_cmp else (t_cmp, "compute")


def executor_seconds(op: str, nbytes: float, flops: float, hw: Hardware,
                     weight_type: str | None = None) -> float:
    """Modelled seconds of one node on graphcost's executor: the per-call overhead of ``op``
    plus the roofline with the memory roof lowered to the matvec kernel's measured rate
    for ``weight_type`` (MUL_MAT/MUL_MAT_ID; other ops stream at the bandwidth)."""
    rate = hw.matvec_rate(weight_type) if op in ops.MATMUL and weight_type else hw.bandwidth
    return hw.op_overhead(op) + roofline_seconds(nbytes, flops, hw, rate)[0]


# ---------------------------------------------------------------------------- files


def hardware_dir() -> Path:
    return bundled("specs") / "hardware"


def available() -> list[str]:
    """Names of the bundled profiles."""
    d = hardware_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def _number(doc: dict, key: str, unit_key: str, path: Path) -> float:
    section = doc.get(key)
    value = section.get(unit_key) if isinstance(section, dict) else None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise GraphcostError(f"{path}: {key}.{unit_key} must be a positive number")
    return float(value)


def parse(doc: Any, path: Path | None) -> Hardware:
    """The profile in ``doc`` (a YAML document; ``path`` names it in errors, None for one
    just measured)."""
    if not isinstance(doc, dict):
        raise GraphcostError(f"{path}: a hardware profile is a YAML mapping")
    kind = doc.get("kind", "theoretical")
    if kind not in KINDS:
        raise GraphcostError(f"{path}: kind {kind!r}: use {' or '.join(KINDS)}")
    overhead = _number(doc, "op_overhead", "seconds", path) if "op_overhead" in doc else 0.0
    return Hardware(name=str(doc.get("name") or (path.stem if path else "this machine")),
                    bandwidth=_number(doc, "memory_bandwidth", "bytes_per_second", path),
                    peak_flops=_number(doc, "peak_flops", "flops_per_second", path),
                    kind=kind, description=str(doc.get("description", "")),
                    threads=doc.get("threads"), path=path, overhead=overhead, extra=doc)


def load(name: str) -> Hardware:
    """A profile by bundled name, by ``<name>.yaml`` in the current directory, or by path."""
    candidates = [Path(name)] if name.endswith((".yaml", ".yml")) else []
    candidates += [hardware_dir() / f"{name}.yaml", Path.cwd() / f"{name}.yaml"]
    for p in candidates:
        if p.is_file():
            try:
                doc = yaml.safe_load(p.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise GraphcostError(f"{p}: cannot read the hardware profile: {e}") from None
            return parse(doc, p)
    have = ", ".join(available()) or "none"
    raise GraphcostError(f"--hardware {name!r}: no such profile (bundled: {have}; or give a "
                         "path to a .yaml written by graphcost hwprobe)")


def save(doc: dict, name: str) -> tuple[Path, str | None]:
    """Write ``doc`` as ``specs/hardware/<name>.yaml``; if that directory is read-only
    (an installed wheel), write ``./<name>.yaml`` and return a note saying so."""
    text = yaml.safe_dump(doc, sort_keys=False, width=100)
    target = hardware_dir() / f"{name}.yaml"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target, None
    except OSError:
        local = Path.cwd() / f"{name}.yaml"
        try:
            local.write_text(text)
        except OSError as e:
            raise GraphcostError(f"{local}: cannot write the hardware profile: {e}") from None
        return local, (f"{target.parent} is not writable (installed package): wrote {local} "
                       f"instead; use it with --hardware {local}")
