"""Refuse a file with a tensor llama.cpp's loader would not create for its architecture,
or without one it requires.

llama.cpp counts the tensors it creates (``llama_model_loader::create_tensor``, called by
the family's ``load_arch_tensors`` in ``src/models/<family>.cpp`` and by the generic pass of
``llama_model_base::load_tensors`` in ``src/llama-model.cpp``) and, when fewer were created
than the file holds, refuses the file (``llama_model_loader::done_getting_tensors`` in
``src/llama-model-loader.cpp``: "wrong number of tensors; expected N, got M"). Optional
tensors (TENSOR_NOT_REQUIRED), tensors the graph never reads and skipped ones (TENSOR_SKIP:
NextN blocks) are created and count; token_embd created again as the output
(TENSOR_DUPLICATED) and per-layer copies of ``rope_freqs`` count once. A required tensor
(created without TENSOR_NOT_REQUIRED) the file lacks stops the load before that
(``llama_model_loader::check_tensor_dims``: "tensor 'X' not found"), whether or not the
graph reads it.

What each family creates is data: the ``tensors:`` of its spec
(:class:`graphcost.graph.arch_spec.CreatedTensors`), with the loader's branches on the
hyperparameters (``{if: n_expert == 0, then: [dense FFN], else: [experts]}``, ``il <
n_layer_dense_lead``, ``is_recr``, ``longrope``...) and on a tensor the loader probes first (``{has: ffn_gate_inp.weight, ...}``: gemma4),
evaluated here for the file's hyperparameters, block by block (:func:`created`). What the
generic pass adds (weight and input scales) and which fused tensors replace separate ones
(``attn_qkv`` for ``attn_q``/``attn_k``/``attn_v``) is ``specs/loader.yaml``.

The probe deepseek2, glm4moe, qwen35(moe), qwen3next and nemotron_h make for MTP-only
files (NextN blocks and no ``blk.0.attn_norm.weight``: the trunk's tensors optional) is the
spec's ``tensors: mtp_only``; such a file is refused as not modelled (graphcost builds the
trunk graph only), before any tensor is checked. deepseek2's and
glm4moe's trunk_only probe is modelled: one probe of the first NextN block's
``blk.<n_layer>.nextn.eh_proj.weight`` (``has: /blk.{n_layer}.nextn.eh_proj.weight``)
makes every NextN block's tensors optional when absent, required when present.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator

import yaml

from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.format import ggml_types as gt
from graphcost.format.consistency import check_shapes
from graphcost.format.hparam_expr import evaluate
from graphcost.format.model import ModelInfo, expr_names
from graphcost.graph.arch_spec import ArchSpec, TensorBranch
from graphcost.resources import bundled

#: tensors named in a refusal before "and N more"
_SHOWN = 3


@dataclass(frozen=True)
class LoaderRules:
    """``specs/loader.yaml``: the generic pass of llama_model_base::load_tensors."""

    scale_suffixes: tuple[str, ...]
    #: block weights (``attn_q``) beside which ``<w>.scale`` / ``<w>.input_scale`` are created
    scaled_layer_weights: frozenset[str]
    #: the type of the output matrix that makes ``output.scale`` / ``output.input_scale`` created
    scaled_output_type: gt.GGMLType
    #: fused block tensor -> the separate ones it replaces in a trunk block that has it
    fused: dict[str, frozenset[str]]
    #: block tensor -> the tensor without which a trunk block does not create it
    only_with: dict[str, str]


@lru_cache(maxsize=1)
def loader_rules() -> LoaderRules:
    path = bundled("specs") / "loader.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
        return LoaderRules(tuple(doc["scale_suffixes"]), frozenset(doc["scaled_layer_weights"]),
                           gt.GGMLType[doc["scaled_output_type"]],
                           {k: frozenset(v) for k, v in doc["fused"].items()},
                           {str(k): str(v) for k, v in doc["only_with"].items()})
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise GraphcostError(f"{path}: cannot read the loader rules: {e}") from None


def _take(items: tuple, names: dict[str, float], has: Callable[[str], bool],
          where: str) -> Iterator[tuple[str, bool]]:
    """The (name, required) pairs a ``tensors:`` list creates: a branch's ``then`` where
    its test holds, else its ``else``; ``name?`` is not required."""
    for it in items:
        if isinstance(it, TensorBranch):
            ok = has(it.arg) if it.test == "has" else bool(evaluate(it.arg, names, where))
            yield from _take(it.then if ok else it.orelse, names, has, where)
        else:
            yield it.rstrip("?"), not it.endswith("?")


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _probed(x: str, prefix: str, names: dict[str, float], where: str) -> str:
    """The file tensor a ``has:`` branch probes: ``name`` in the block (``prefix`` +
    name), ``/name`` a model-level name, whose ``{h}`` placeholders take the hyperparameter
    ``h`` (``/blk.{n_layer}.nextn.eh_proj.weight``: deepseek2's one trunk_only probe, the
    first NextN block's)."""
    if not x.startswith("/"):
        return prefix + x

    def value(mt: re.Match) -> str:
        if mt[1] not in names:
            raise GraphcostError(f"{where}: has: {x!r} names {mt[1]!r}, not a hyperparameter")
        return str(int(names[mt[1]]))

    return _PLACEHOLDER.sub(value, x[1:])


def _block_expr_names(m: ModelInfo, il: int) -> dict[str, float]:
    """The names a block's branches may use besides :func:`expr_names`: its index, and
    llama_hparams::is_swa(il), is_recr(il) and n_ff(il) (``n_ff_layer``); a NextN block is
    neither sliding nor recurrent (qwen3next's load_arch_hparams: is_recr_impl[il] only for
    il < n_layer) and takes n_ff."""
    if il >= m.n_layer:
        return {"il": il, "is_swa": 0.0, "is_recr": 0.0, "n_ff_layer": m.n_ff[0]}
    return {"il": il, "is_swa": float(m.is_swa[il]), "is_recr": float(m.recurrent(il)),
            "n_ff_layer": m.n_ff[il]}


def created(m: ModelInfo, spec: ArchSpec) -> dict[str, bool]:
    """Every tensor llama.cpp's loader creates for this file, in the loader's order: full
    name -> whether it is required (a name required in any block is). Trunk blocks (il <
    n_layer) take ``layer``, less the separate tensors a fused one the block has replaces
    and the fused bias of a block without the fused weight;
    NextN blocks (up to block_count = n_layer + nextn_predict_layers) take ``nextn``, fused
    and separate alike (create_tensor_qkv and create_tensor_gate_up_exps under TENSOR_SKIP
    create both, optional). Empty when the spec lists none (a flavour's spec)."""
    t = spec.tensors
    if t is None:
        return {}
    files, rules, where = m.header.tensors, loader_rules(), str(spec.path)
    base = expr_names(m)
    out: dict[str, bool] = {}

    def add(name: str, required: bool) -> None:
        out[name] = out.get(name, False) or required

    for name, req in _take(t.model, base, lambda x: _probed(x, "", base, where) in files,
                           where):
        add(name.lstrip("/"), req)
    n_blocks = m.n_layer + (m.n_layer_nextn if t.nextn is not None else 0)
    for il in range(n_blocks):
        prefix = f"blk.{il}."

        def has(x: str) -> bool:
            return _probed(x, prefix, base, where) in files

        block: dict[str, bool] = {}
        items = t.layer if il < m.n_layer else t.nextn
        for name, req in _take(items, {**base, **_block_expr_names(m, il)}, has, where):
            if name.startswith("/"):
                add(name[1:], req)
            else:
                block[name] = block.get(name, False) or req
        for fused, separate in rules.fused.items():
            if fused not in block:
                continue
            if il >= m.n_layer:  # TENSOR_SKIP: fused and separate, all TENSOR_NOT_REQUIRED
                block.update((n, False) for n in (fused, *separate) if n in block)
            elif prefix + fused in files:
                for name in separate:
                    block.pop(name, None)
        for name, needs in rules.only_with.items():
            if il < m.n_layer and name in block and prefix + needs not in files:
                del block[name]
        for name, req in block.items():
            add(prefix + name, req)
    return out


def _is_created(name: str, made: dict[str, bool], m: ModelInfo, spec: ArchSpec,
                rules: LoaderRules) -> bool:
    files = m.header.tensors
    if name in made:
        return True
    base, _, suffix = name.rpartition(".")
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit():
        # the generic pass: <w>.scale / <w>.input_scale beside a block weight it created
        w = parts[2].rpartition(".")[0]
        return (suffix in rules.scale_suffixes and w in rules.scaled_layer_weights
                and f"{base}.weight" in made and f"{base}.weight" in files)
    # output.scale / output.input_scale: when the output matrix (output.weight, else the
    # tied token_embd.weight) is NVFP4
    if base == "output" and suffix in rules.scale_suffixes and spec.has_lm_head:
        out = files.get("output.weight") or files.get("token_embd.weight")
        return out is not None and out.type == rules.scaled_output_type
    return False


def extra_tensors(m: ModelInfo, spec: ArchSpec) -> list[str]:
    """The file's tensors that llama.cpp's loader does not create for ``spec``, in file order
    (empty when the spec lists none: a flavour's spec)."""
    return _extra(created(m, spec), m, spec)


def _extra(made: dict[str, bool], m: ModelInfo, spec: ArchSpec) -> list[str]:
    if spec.tensors is None:
        return []
    rules = loader_rules()
    return [n for n in m.header.tensors if not _is_created(n, made, m, spec, rules)]


def missing_tensors(m: ModelInfo, spec: ArchSpec) -> list[str]:
    """The required tensors llama.cpp's loader creates for ``spec`` that the file lacks, in
    the loader's order."""
    return _missing(created(m, spec), m)


def _missing(made: dict[str, bool], m: ModelInfo) -> list[str]:
    return [n for n, required in made.items() if required and n not in m.header.tensors]


def _listed(names: list[str]) -> str:
    """``'a', 'b', 'c' and 2 more``."""
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(repr(n) for n in names[:_SHOWN]) + more


def refuse_uncreated_tensors(m: ModelInfo, spec: ArchSpec) -> None:
    """One line for the first fault llama.cpp's loader meets, in its order: it creates the
    tensors one by one (``create_tensor``), stopping at a required one the file lacks
    ("not found") or one of the wrong shape (:func:`check_shapes`), and counts them last.
    So: a wrong shape among the tensors created before the first missing one; else the
    required tensors the file lacks (all named, the first as llama.cpp names it); else a
    wrong shape among all created; else the tensors it would not create and its count."""
    where = f"llama.cpp's {m.arch} loader (load_arch_tensors in {spec.source})"
    probe = spec.tensors.mtp_only if spec.tensors is not None else None
    if probe is not None and m.n_layer_nextn > 0 and probe not in m.header.tensors:
        raise UnsupportedError(
            f"{m.header.path}: an MTP-only file (nextn_predict_layers {m.n_layer_nextn}, no "
            f"{probe!r}: the mtp_only probe of {where}, which makes the trunk's tensors "
            "optional): graphcost builds the trunk graph only; not modelled")
    made = created(m, spec)
    missing = _missing(made, m)
    order = list(made)
    check_shapes(m, order[:order.index(missing[0])] if missing else order)
    if missing:
        what = "tensor" if len(missing) == 1 else f"{len(missing)} tensors"
        raise GraphcostError(
            f"{m.header.path}: {what} {_listed(missing)} required by {where} missing from the "
            f"file; llama.cpp refuses it: tensor {missing[0]!r} not found")
    extra = _extra(made, m, spec)
    if not extra:
        return
    n_file = len(m.header.tensors)
    what = "tensor" if len(extra) == 1 else f"{len(extra)} tensors"
    raise GraphcostError(
        f"{m.header.path}: {what} {_listed(extra)} not created by {where}; llama.cpp refuses "
        f"the file: wrong number of tensors; expected {n_file}, got {n_file - len(extra)}")
