"""Refuse a file with a tensor llama.cpp's loader would not create for its architecture.

llama.cpp counts the tensors it creates (``llama_model_loader::create_tensor``, called by
the family's ``load_arch_tensors`` in ``src/models/<family>.cpp`` and by the generic pass of
``llama_model_base::load_tensors`` in ``src/llama-model.cpp``) and, when fewer were created
than the file holds, refuses the file (``llama_model_loader::done_getting_tensors`` in
``src/llama-model-loader.cpp``: "wrong number of tensors; expected N, got M"). Optional
tensors (TENSOR_NOT_REQUIRED), tensors the graph never reads and skipped ones (TENSOR_SKIP:
NextN blocks) are created and count; token_embd created again as the output
(TENSOR_DUPLICATED) and per-layer copies of ``rope_freqs`` count once.

What each family creates is data: the ``tensors:`` of its spec (:class:`CreatedTensors`);
what the generic pass adds (weight and input scales) and which fused tensors replace
separate ones (``attn_qkv`` for ``attn_q``/``attn_k``/``attn_v``) is ``specs/loader.yaml``.
The lists are unions over the loader's branches that hyperparameters choose, so a tensor
of a branch the file's hyperparameters do not take (``ffn_gate_inp`` in a dense llama) is
accepted here though llama.cpp refuses it; the one branch told apart is LongRoPE's
(``rope_factors_long/short`` only under rope.scaling.type longrope, ``rope_freqs`` only
without it: :class:`CreatedTensors`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import yaml

from graphcost.errors import GraphcostError
from graphcost.format import ggml_types as gt
from graphcost.format.model import ModelInfo
from graphcost.graph.arch_spec import ArchSpec, CreatedTensors
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


@lru_cache(maxsize=1)
def loader_rules() -> LoaderRules:
    path = bundled("specs") / "loader.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
        return LoaderRules(tuple(doc["scale_suffixes"]), frozenset(doc["scaled_layer_weights"]),
                           gt.GGMLType[doc["scaled_output_type"]],
                           {k: frozenset(v) for k, v in doc["fused"].items()})
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise GraphcostError(f"{path}: cannot read the loader rules: {e}") from None


def _block_names(t: CreatedTensors, il: int, m: ModelInfo, rules: LoaderRules) -> frozenset[str]:
    """What the loader creates in block ``il``: a trunk block's names below n_layer (less
    the separate tensors a fused one the block has replaces), a NextN block's up to
    block_count (n_layer + nextn_predict_layers), nothing past it."""
    if il < m.n_layer:
        files = m.header.tensors
        replaced = [v for k, v in rules.fused.items() if f"blk.{il}.{k}" in files and k in t.layer]
        return t.layer.difference(*replaced)
    if il < m.n_layer + m.n_layer_nextn and t.nextn is not None:
        return t.nextn
    return frozenset()


def _is_created(name: str, t: CreatedTensors, m: ModelInfo, spec: ArchSpec,
                rules: LoaderRules) -> bool:
    files = m.header.tensors
    base, _, suffix = name.rpartition(".")
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit():
        il, short = int(parts[1]), parts[2]
        names = _block_names(t, il, m, rules)
        if short in names:
            return True
        # the generic pass: <w>.scale / <w>.input_scale beside a block weight it created
        w = short.rpartition(".")[0]
        return (suffix in rules.scale_suffixes and w in rules.scaled_layer_weights
                and f"{w}.weight" in names and f"{base}.weight" in files)
    if name in t.model:
        return True
    if name in (t.longrope if m.rope_scaling_type == "longrope" else t.not_longrope):
        return True
    # output.scale / output.input_scale: when the output matrix (output.weight, else the
    # tied token_embd.weight) is NVFP4
    if base == "output" and suffix in rules.scale_suffixes and spec.has_lm_head:
        out = files.get("output.weight") or files.get("token_embd.weight")
        return out is not None and out.type == rules.scaled_output_type
    return False


def extra_tensors(m: ModelInfo, spec: ArchSpec) -> list[str]:
    """The file's tensors that llama.cpp's loader does not create for ``spec``, in file order
    (empty when the spec lists none: a flavour's spec)."""
    t = spec.tensors
    if t is None:
        return []
    rules = loader_rules()
    return [n for n in m.header.tensors if not _is_created(n, t, m, spec, rules)]


def refuse_extra_tensors(m: ModelInfo, spec: ArchSpec) -> None:
    """One line naming the tensors llama.cpp would not create and its count, if any."""
    extra = extra_tensors(m, spec)
    if not extra:
        return
    n_file = len(m.header.tensors)
    shown = ", ".join(repr(n) for n in extra[:_SHOWN])
    more = f" and {len(extra) - _SHOWN} more" if len(extra) > _SHOWN else ""
    what = "tensor" if len(extra) == 1 else f"{len(extra)} tensors"
    raise GraphcostError(
        f"{m.header.path}: {what} {shown}{more} not created by llama.cpp's {m.arch} loader "
        f"(load_arch_tensors in {spec.source}); llama.cpp refuses the file: "
        f"wrong number of tensors; expected {n_file}, got {n_file - len(extra)}")
