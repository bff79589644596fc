"""Backend facts as data: one YAML per ggml backend in ``specs/backends/``.

Each file gives what decides the bytes a device's weight and KV buffers take, each fact
with its ``source`` (file and function in the ggml that llama-cpp-python 0.3.36 vendors):

* ``alignment``: bytes every tensor is padded to inside a buffer
  (``ggml_backend_buft_get_alignment``; ``null`` where it depends on the device);
* ``max_buffer_size``: the largest single buffer (``ggml_backend_buft_get_max_size``;
  ``null`` = SIZE_MAX or device-dependent);
* ``alloc_padding``: bytes a tensor takes beyond ``ggml_nbytes``
  (``ggml_backend_buft_get_alloc_size``): ``none``, or ``quantized_row_padding`` (CUDA:
  quantized rows padded to ``row_padding`` elements);
* ``host_buffer``: the pinned host buffer type llama.cpp puts CPU weights in, if any;
* ``buffer_from_host_ptr``: whether weights can be views of the mmapped file (then the
  buffer is ``mapped_buffer_name`` and spans the file range of its tensors);
* the CPU's ``extra_buffer_types`` (``CPU_REPACK`` and its repacking rules);
* for the backend scheduler (:mod:`graphcost.memory.sched`): ``scheduler`` (async and
  events, ``offload_op``'s minimum batch, graph optimisation, and ``host_buffer``: the host
  buffer type's own alignment and max size where they are not the CPU's, Vulkan_Host's),
  ``supports_op`` (which ops
  the device runs: rules in :mod:`graphcost.memory.op_rules`) and ``compute_alloc_size``
  (``get_alloc_size`` for compute tensors); a backend without ``supports_op`` has its
  compute buffers reported as not modelled unless ``scheduler.all_ops`` says it runs every op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from graphcost.errors import GraphcostError
from graphcost.resources import bundled


@dataclass(frozen=True)
class RepackRule:
    """One layout ``ggml_repack_get_optimal_repack_type`` may choose for a weight type."""

    features: frozenset[str]
    ne1_multiple: int


@dataclass(frozen=True)
class ExtraBufferType:
    """A CPU extra buffer type (``ggml_backend_cpu_get_extra_buffer_types``)."""

    name: str
    source: str
    modelled: bool
    #: the CPU features the type exists with (ggml compiles it in only with them)
    features: frozenset[str] = frozenset()
    alignment: int = 32
    ops: tuple[str, ...] = ()
    #: CPU_REPACK: the layouts by weight type (ggml_repack_get_optimal_repack_type)
    rules: dict[str, tuple[RepackRule, ...]] = field(default_factory=dict)
    #: AMX: the weight's ne[1] must be a multiple of this (supports_op: TILE_N * 2)
    ne1_multiple: int = 1
    #: AMX: weight type -> (ne[0] multiple, bytes added a block; None: not packed, nbytes)
    types: dict[str, tuple[int, int | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    """One ggml backend's buffer facts (see the module docstring)."""

    name: str  # the specs/backends file name: cpu, cuda, rpc, ...
    device_name: str  # template: "CUDA{i}"
    buffer_type: str  # template: "RPC{i}[{endpoint}]"
    device_type: str  # cpu | gpu
    alignment: int | None  # None: device-dependent (not modelled)
    max_buffer_size: int | None  # None: SIZE_MAX or device-dependent
    alloc_padding: str  # none | quantized_row_padding
    row_padding: int
    host_buffer: str | None
    buffer_from_host_ptr: bool
    mapped_buffer_name: str | None
    mmap_support: bool
    extra_buffer_types: tuple[ExtraBufferType, ...]
    sources: dict[str, str]
    #: what the backend scheduler needs (graphcost.memory.sched): ``async_events``
    #: (pipeline parallelism possible), ``offload_min_batch`` (offload_op), and that every
    #: op is supported; None: not read from the source, compute buffers not modelled
    scheduler: dict | None = None
    #: the split buffer type -sm row uses (ggml_backend_split_buffer_type), if any
    split_buffer: str | None = None
    #: supports_op rules: {"default": bool, "require": rule or None, "ops": {op: rule}}
    #: (graphcost.memory.op_rules; ``require``: a rule every op must pass first)
    supports_op: dict | None = None
    #: get_alloc_size for compute tensors: {"row_padding": n, "ops": {op: rule}}; None: ggml_nbytes
    compute_alloc_size: dict | None = None
    #: device options this backend reads (--device KIND,name=value): name -> what it is
    options: dict[str, str] = field(default_factory=dict)


def _fact(doc: dict, key: str, path: str) -> tuple[Any, str]:
    entry = doc.get(key)
    if not isinstance(entry, dict) or "source" not in entry:
        raise GraphcostError(f"{path}: {key!r} needs a mapping with 'value' and 'source'")
    return entry.get("value", entry.get("rule")), str(entry["source"])


def _extra(e: dict, path: str) -> ExtraBufferType:
    rules = {}
    for tname, lst in (e.get("rules") or {}).items():
        rules[tname] = tuple(RepackRule(frozenset(r["features"]), int(r["ne1_multiple"]))
                             for r in lst)
    return ExtraBufferType(name=str(e["name"]), source=str(e["source"]),
                           modelled=bool(e.get("modelled", True)),
                           features=frozenset(e.get("features", ())),
                           alignment=int(e.get("alignment", 32)),
                           ops=tuple(e.get("ops", ())), rules=rules,
                           ne1_multiple=int(e.get("ne1_multiple", 1)),
                           types={t: (int(v["ne0_multiple"]), None if v["block_extra"] is None
                                      else int(v["block_extra"]))
                                  for t, v in (e.get("types") or {}).items()})


def parse(doc: dict, path: str) -> Backend:
    """One backend YAML document -> :class:`Backend` (errors name the file and key)."""
    try:
        sources = {}
        vals = {}
        for key in ("alignment", "max_buffer_size", "alloc_padding", "host_buffer",
                    "buffer_from_host_ptr", "mmap_support"):
            vals[key], sources[key] = _fact(doc, key, path)
        mapped = None
        sched = split = None
        if "split_buffer_type" in doc:
            split, sources["split_buffer_type"] = _fact(doc, "split_buffer_type", path)
        if "scheduler" in doc:
            sched, sources["scheduler"] = _fact(doc, "scheduler", path)
            if not isinstance(sched, dict):
                raise GraphcostError(f"{path}: 'scheduler' value must be a mapping")
        if "mapped_buffer_name" in doc:
            mapped, sources["mapped_buffer_name"] = _fact(doc, "mapped_buffer_name", path)
        supports = alloc = None
        for key in ("supports_op", "compute_alloc_size"):
            entry = doc.get(key)
            if entry is None:
                continue
            if not isinstance(entry, dict) or "source" not in entry:
                raise GraphcostError(f"{path}: {key!r} needs a mapping with a 'source'")
            sources[key] = str(entry["source"])
            base: dict = {}
            if "from" in entry:  # another backend's entry (HIP: CUDA's), these ops replaced
                other = load(str(entry["from"]))
                base = (other.supports_op if key == "supports_op" else other.compute_alloc_size) or {}
            if not isinstance(entry.get("ops", {}), dict):
                raise GraphcostError(f"{path}: {key!r} needs 'ops', a mapping of op to rule")
            ops = {**base.get("ops", {}), **(entry.get("ops") or {})}
            if key == "supports_op":
                if not ops:
                    raise GraphcostError(f"{path}: 'supports_op' needs 'ops', a mapping of op to rule")
                supports = {"default": bool(entry.get("default", base.get("default", False))),
                            "require": entry.get("require", base.get("require")), "ops": ops}
            else:
                alloc = {"row_padding": int(entry.get("row_padding", base.get("row_padding", 0))),
                         "ops": ops}
        options = {str(k): str(v) for k, v in (doc.get("device_options") or {}).items()}
        pad = doc["alloc_padding"]
        return Backend(
            name=str(doc["backend"]), device_name=str(doc["device_name"]),
            buffer_type=str(doc["buffer_type"]), device_type=str(doc["device_type"]),
            alignment=vals["alignment"], max_buffer_size=vals["max_buffer_size"],
            alloc_padding=str(pad["rule"]), row_padding=int(pad.get("row_padding", 0)),
            host_buffer=vals["host_buffer"], buffer_from_host_ptr=bool(vals["buffer_from_host_ptr"]),
            mapped_buffer_name=mapped, mmap_support=bool(vals["mmap_support"]),
            extra_buffer_types=tuple(_extra(e, path) for e in doc.get("extra_buffer_types", ())),
            sources=sources, scheduler=sched, split_buffer=split, supports_op=supports,
            compute_alloc_size=alloc, options=options)
    except (KeyError, TypeError, ValueError) as e:
        raise GraphcostError(f"{path}: bad backend spec ({type(e).__name__}: {e})") from None


def names() -> list[str]:
    """The bundled backends: cpu, cuda, metal, ..."""
    return sorted(p.stem for p in bundled("specs").joinpath("backends").glob("*.yaml"))


@lru_cache(maxsize=None)
def load(name: str) -> Backend:
    """The bundled ``specs/backends/<name>.yaml``; an unknown name is one line."""
    path = bundled("specs") / "backends" / f"{name}.yaml"
    if not path.is_file():
        raise GraphcostError(f"unknown device kind {name!r}: use one of {', '.join(names())}")
    with open(path) as f:
        doc = yaml.safe_load(f)
    if not isinstance(doc, dict):
        raise GraphcostError(f"{path}: not a mapping")
    return parse(doc, str(path))


#: /proc/cpuinfo flags -> the ggml feature names the repack rules use
#: (ggml-cpu/ggml-cpu.c: ggml_cpu_has_avx2, ggml_cpu_has_avx512 (AVX512F), ...)
_CPUINFO_FEATURES = {"avx2": "avx2", "avx512f": "avx512", "avx512_vnni": "avx512_vnni",
                     "amx_int8": "amx_int8", "asimd": "neon", "asimddp": "dotprod",
                     "i8mm": "i8mm", "sve": "sve"}


def host_cpu_features(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """This machine's CPU features under ggml's names (empty when /proc/cpuinfo is absent).
    A native llama.cpp build (GGML_NATIVE, the default) compiles for exactly these."""
    try:
        with open(cpuinfo) as f:
            text = f.read()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(val.split())
    return frozenset(v for k, v in _CPUINFO_FEATURES.items() if k in flags)


def known_cpu_features() -> frozenset[str]:
    """Every ggml CPU feature name graphcost reads: those taken from /proc/cpuinfo and
    those the CPU backend spec's extra buffer types and repack rules name."""
    cpu = load("cpu")
    named = {f for e in cpu.extra_buffer_types for f in e.features}
    named |= {f for e in cpu.extra_buffer_types for rules in e.rules.values()
              for r in rules for f in r.features}
    return frozenset(_CPUINFO_FEATURES.values()) | named


def check_cpu_features(names, what: str) -> frozenset[str]:
    """``names`` as a set, each a ggml feature name graphcost knows
    (:func:`known_cpu_features`); one that is not is one line starting with ``what``, so
    that a typo (``avx-512``) does not silently place weights as if the feature were
    absent."""
    known = known_cpu_features()
    bad = sorted(set(names) - known)
    if bad:
        raise GraphcostError(f"{what}: unknown feature {', '.join(bad)} (known: "
                             f"{', '.join(sorted(known))}, or none)")
    return frozenset(names)


def parse_cpu_features(text: str | None) -> frozenset[str]:
    """``--cpu-features``: a comma list of ggml feature names (``none``: no feature; None:
    this machine's, :func:`host_cpu_features`), checked by :func:`check_cpu_features`."""
    if text is None:
        return host_cpu_features()
    names = {f.strip().lower() for f in text.split(",") if f.strip()} - {"none"}
    return check_cpu_features(names, f"--cpu-features {text!r}")


def host_total_memory() -> int | None:
    """Bytes of this machine's memory as llama.cpp's CPU device reports them (ggml-cpu.cpp
    ``ggml_backend_cpu_device_get_memory``: free = total = ``sysconf(_SC_PHYS_PAGES) *
    sysconf(_SC_PAGE_SIZE)``); None where sysconf does not say."""
    import os
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
