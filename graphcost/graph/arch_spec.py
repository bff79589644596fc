"""Architecture specs: one YAML file per GGUF architecture in ``specs/arch/``.

A spec says, as data, what llama.cpp's ``src/models/<arch>.cpp`` does: hyperparameter
defaults, the prologue (inputs), the statements of one layer, and the epilogue (output
head). :mod:`graphcost.graph.spec_builder` interprets it on top of the llama-graph helpers.
Statement reference: ``docs/architectures.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from graphcost.errors import GraphcostError
from graphcost.resources import bundled


@dataclass(frozen=True)
class TensorBranch:
    """One branch of a family's loader in its ``tensors:`` lists: ``{if: EXPR, then: [...],
    else: [...]}`` (EXPR over the hyperparameter names of
    :func:`graphcost.format.model.expr_names` and, in a block, ``il``, ``is_swa``,
    ``is_recr``, ``n_ff_layer``: ``n_expert == 0``, ``il < n_layer_dense_lead``) or ``{has: NAME, then: [...], else: [...]}`` (the file
    has the tensor NAME of the block, ``/NAME`` a model-level one: gemma4's
    ``ffn_gate_inp``, which the loader creates first and branches on); ``else: optional``
    is ``then`` with every name optional."""

    test: str  # "if" | "has"
    arg: str
    then: tuple[str | TensorBranch, ...]
    orelse: tuple[str | TensorBranch, ...] = ()


@dataclass(frozen=True)
class CreatedTensors:
    """The tensors llama.cpp's loader creates for a family (the spec's ``tensors:``, from
    ``load_arch_tensors`` in ``src/models/<family>.cpp``), as the loader's branches on the
    hyperparameters choose them: names outside blocks (``token_embd.weight``), names inside
    a trunk block (``attn_q.weight`` for ``blk.<il>.attn_q.weight``, il < n_layer) and
    inside a NextN/MTP block (n_layer <= il < block_count; None: the loader creates no such
    block). An entry is a name or a :class:`TensorBranch`; ``name?`` (``{optional: [name]}``
    in the YAML) is created TENSOR_NOT_REQUIRED, in a block ``/name`` is a model-level tensor the loader creates
    while loading the block (``/rope_freqs.weight``). A name without ``?`` is required:
    llama.cpp refuses a file without it (``llama_model_loader::create_tensor``: "tensor
    'X' not found");
    :mod:`graphcost.graph.created_tensors` evaluates the lists."""

    model: tuple[str | TensorBranch, ...]
    layer: tuple[str | TensorBranch, ...]
    nextn: tuple[str | TensorBranch, ...] | None = None
    #: the tensor whose absence, where the file has NextN blocks, makes it an MTP-only file
    #: (the loader's ``mtp_only`` probe, ``blk.0.attn_norm.weight``); None: no such probe
    mtp_only: str | None = None


@dataclass(frozen=True)
class ArchSpec:
    """A parsed ``specs/arch/<name>.yaml``."""

    name: str
    source: str
    rope: str  # norm | neox | none
    hparams: dict[str, Any]
    prologue: list[dict]
    layer: list[dict]
    epilogue: list[dict]
    unsupported_tensors: dict[str, str] = field(default_factory=dict)
    #: what is proven against llama.cpp, and by which test file: ``graph`` (node for node),
    #: ``memory`` (buffers to the byte), ``executor`` (numerics of ``graphcost profile``)
    proven: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    #: "kv" (a KV cache) or "none" (llama_model::create_memory returns nullptr: encoders)
    memory: str = "kv"
    #: every tensor the family's loader creates (required; None only for a flavour's spec,
    #: ``llama@2024-08``: files are checked against the head spec's list)
    tensors: CreatedTensors | None = None

    @property
    def has_lm_head(self) -> bool:
        """Whether the graph multiplies by an output matrix (an ``lm_head`` statement
        anywhere, branches included): such a family's loader creates ``output`` and, when
        the file has none, token_embd again as the output (TENSOR_DUPLICATED, e.g.
        src/models/gemma2.cpp, cohere2.cpp); encoders (bert) have no head."""
        return _mentions(self.prologue + self.layer + self.epilogue, "lm_head")


#: the aspects a spec's ``proven`` mapping may name
PROVEN_ASPECTS = ("graph", "memory", "executor")


#: rope modes by spec name: ggml.h GGML_ROPE_TYPE_NEOX 2, _MROPE 8, _IMROPE 40 (multi-section
#: rope, positions [4 * n_tokens]); "norm" is 0 (adjacent pairs)
_ROPE_MODES = {"norm": 0, "neox": 2, "mrope": 8, "imrope": 40, "none": None}
#: modes whose rope takes 4 positions per token (llama_hparams::n_pos_per_embd)
MULTI_ROPE_MODES = frozenset({8, 40})


def rope_mode(spec: ArchSpec, name: str | None = None) -> int | None:
    """The ggml rope mode of the spec (or of ``name``, a mode name)."""
    name = spec.rope if name is None else name
    if name not in _ROPE_MODES:
        raise GraphcostError(f"{spec.path}: rope {name!r} must be one of {', '.join(_ROPE_MODES)}")
    return _ROPE_MODES[name]


def _mentions(v: Any, name: str) -> bool:
    """Whether the statement ``name`` occurs in ``v`` (statements, branches included)."""
    if isinstance(v, dict):
        return name in v or any(_mentions(x, name) for x in v.values())
    if isinstance(v, list):
        return any(_mentions(x, name) for x in v)
    return False


def statement_list(v: Any, what: str, where: Any) -> list[dict]:
    """``v`` (None: empty) checked as a list of statements, each a mapping with one key
    (a spec's prologue, layer and epilogue, and every branch of if/when/kv_layer/...);
    ``where`` (the spec's path) starts the one-line error."""
    v = [] if v is None else v
    if not isinstance(v, list):
        raise GraphcostError(f"{where}: {what} must be a list of statements")
    for i, s in enumerate(v):
        if not isinstance(s, dict) or len(s) != 1:
            raise GraphcostError(f"{where}: {what}[{i}] must be a mapping with one statement")
    return v


def _items(v: Any, what: str, where: Any) -> tuple:
    """A ``tensors:`` list checked and parsed: names, ``{optional: [...]}`` (names created
    TENSOR_NOT_REQUIRED, kept as ``name?``), ``{if|has, then, else}`` branches; a nested
    list (a YAML alias of another list) is flattened."""
    if not isinstance(v, list):
        raise GraphcostError(f"{where}: tensors.{what} must be a list of tensor names")
    out: list = []
    for x in v:
        if isinstance(x, list):
            out += _items(x, what, where)
        elif isinstance(x, str) and x.strip("/?"):
            out.append(x)
        elif isinstance(x, dict) and set(x) == {"optional"}:
            out += _optional(_items(x["optional"], f"{what} optional", where))
        elif isinstance(x, dict) and len(set(x) & {"if", "has"}) == 1 and "then" in x \
                and set(x) <= {"if", "has", "then", "else"}:
            test = "if" if "if" in x else "has"
            if not isinstance(x[test], str) or not x[test]:
                raise GraphcostError(f"{where}: tensors.{what}: {test} must be a string: {x!r}")
            then = _items(x["then"], f"{what} then", where)
            orelse = (_optional(then) if x.get("else") == "optional"
                      else _items(x.get("else", []), f"{what} else", where))
            out.append(TensorBranch(test, x[test], then, orelse))
        else:
            raise GraphcostError(f"{where}: tensors.{what}: {x!r} is neither a tensor name, "
                                 "{optional: [...]} nor a branch {if: EXPR | has: NAME, "
                                 "then: [...], else: [...]}")
    return tuple(out)


def _optional(items: tuple) -> tuple:
    """``items`` with every name TENSOR_NOT_REQUIRED (``else: optional``: the loader creates
    the same tensors with flags that make them optional, deepseek2's trunk_only NextN)."""
    return tuple(TensorBranch(x.test, x.arg, _optional(x.then), _optional(x.orelse))
                 if isinstance(x, TensorBranch) else x if x.endswith("?") else x + "?"
                 for x in items)


def created_tensors(v: Any, where: Any) -> CreatedTensors | None:
    """The spec's ``tensors:`` (``model``, ``layer``, optional ``nextn`` and
    ``mtp_only``) checked and parsed."""
    if v is None:
        return None
    if not isinstance(v, dict) or not {"model", "layer"} <= set(v) \
            <= {"model", "layer", "nextn", "mtp_only"}:
        raise GraphcostError(f"{where}: tensors must map model, layer and (optionally) nextn "
                             "to lists of tensor names, and mtp_only to a tensor name")
    probe = v.get("mtp_only")
    if probe is not None and (not isinstance(probe, str) or not probe or "nextn" not in v):
        raise GraphcostError(f"{where}: tensors.mtp_only must be a tensor name, beside a "
                             f"nextn list: {probe!r}")
    return CreatedTensors(_items(v["model"], "model", where), _items(v["layer"], "layer", where),
                          _items(v["nextn"], "nextn", where) if "nextn" in v else None,
                          probe)


def parse_spec(path: Path) -> ArchSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise GraphcostError(f"{path}: cannot read architecture spec: {e}") from None
    if not isinstance(doc, dict) or "architecture" not in doc:
        raise GraphcostError(f"{path}: an architecture spec needs an 'architecture' key")
    rope = doc.get("rope", "norm")
    if rope not in _ROPE_MODES:
        raise GraphcostError(f"{path}: rope {rope!r} must be one of {', '.join(_ROPE_MODES)}")
    memory = doc.get("memory", "kv")
    if memory not in ("kv", "none"):
        raise GraphcostError(f"{path}: memory {memory!r} must be kv or none")
    proven = doc.get("proven") or {}
    if not isinstance(proven, dict) or not set(proven) <= set(PROVEN_ASPECTS):
        raise GraphcostError(f"{path}: 'proven' must map {', '.join(PROVEN_ASPECTS)} to a test file")
    if "graph_of" in doc:  # another architecture's graph (nemotron_h_moe: nemotron_h's)
        base = str(doc["graph_of"])
        if set(doc) - {"architecture", "source", "proven", "graph_of"} or "/" in base:
            raise GraphcostError(f"{path}: a 'graph_of' spec names only architecture, source, "
                                 "proven and the architecture whose graph it uses")
        b = parse_spec(path.parent / f"{base}.yaml")
        # the base's tensors too: nemotron_h_moe's loader is nemotron_h's (llama_model_nemotron_h_moe
        # derives from llama_model_nemotron_h, src/models/models.h)
        return replace(b, name=str(doc["architecture"]), source=str(doc.get("source", b.source)),
                       proven={k: str(v) for k, v in proven.items()}, path=path)
    if "tensors" not in doc and "@" not in str(doc["architecture"]):
        raise GraphcostError(f"{path}: 'tensors' is required: every tensor the family's "
                             "llama.cpp loader creates (docs/architectures.md)")
    return ArchSpec(
        name=str(doc["architecture"]), source=str(doc.get("source", "")), rope=rope,
        hparams=dict(doc.get("hparams") or {}),
        prologue=statement_list(doc.get("prologue"), "prologue", path),
        layer=statement_list(doc.get("layer"), "layer", path),
        epilogue=statement_list(doc.get("epilogue"), "epilogue", path),
        unsupported_tensors=dict(doc.get("unsupported_tensors") or {}),
        proven={k: str(v) for k, v in proven.items()}, path=path, memory=memory,
        tensors=created_tensors(doc.get("tensors"), path))


@lru_cache(maxsize=1)
def load_specs() -> dict[str, ArchSpec]:
    """All bundled architecture specs, by GGUF architecture name."""
    d = bundled("specs") / "arch"
    specs = {}
    for p in sorted(d.glob("*.yaml")):
        s = parse_spec(p)
        specs[s.name] = s
    return specs
