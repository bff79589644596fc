"""Model file + run settings -> the graph llama.cpp would run for one ubatch."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from graphcost.graph.arch_spec import load_specs
from graphcost.format.consistency import check_hparams, check_tensors
from graphcost.graph.created_tensors import refuse_uncreated_tensors
from graphcost.errors import UnsupportedError
from graphcost.graph.ggml_graph import Tensor
from graphcost.format.gguf_reader import read_model
from graphcost.graph.llm_graph import AttnInputs, GraphInput, KVCache, LlmGraph
from graphcost.graph.llm_recurrent import RecurrentState
from graphcost.format.model import ModelInfo, model_info
from graphcost.graph.flavour import flavour
from graphcost.graph.settings import Resolved, RunSettings, refuse_cache_types, resolve
from graphcost.graph.spec_builder import build_from_spec


@dataclass
class BuiltGraph:
    """The nodes in execution order, the leaves they read, the KV caches, the attention
    inputs of each cache (index, mask and rotation leaves), the recurrent states and every
    input leaf with its kind (what fills it)."""

    model: ModelInfo
    run: Resolved
    nodes: list[Tensor]
    leafs: list[Tensor]
    caches: list[KVCache]
    attn_inputs: list[AttnInputs]
    states: list[RecurrentState] = field(default_factory=list)
    inputs: list[GraphInput] = field(default_factory=list)


def load_model(path: str | os.PathLike) -> ModelInfo:
    """Read the header (all shards) and the hyperparameters of a supported architecture,
    and check once that llama.cpp's loader creates every tensor of the file and finds every
    one it requires (:mod:`graphcost.graph.created_tensors`) and that they agree with each
    other (:mod:`graphcost.format.consistency`). ``path`` may be a URL or ``hf://ORG/REPO[@REV]/FILE`` (only the header is fetched)."""
    from graphcost.format.remote import is_remote
    if is_remote(path):
        from graphcost.format.remote import read_remote_model
        m = model_info(read_remote_model(str(path)), load_specs())
    else:
        m = model_info(read_model(path), load_specs())
    # llama.cpp's order: load_hparams, then load_tensors, which checks the shapes of the
    # tensors it creates (a missing one and a bad shape refused as it meets them, the count
    # last); then the checks of graphcost's own (every file tensor's shape: the same by now,
    # a norm weight's type, expert_used_count)
    check_hparams(m)
    refuse_uncreated_tensors(m, load_specs()[m.arch])
    check_tensors(m)
    return m


def resolve_for(model: ModelInfo, settings: RunSettings) -> Resolved:
    """``settings`` resolved for this model: an architecture without a KV cache (spec
    ``memory: none``) outputs every token (llama_context::encode)."""
    spec = load_specs().get(flavour(settings.llama_cpp).spec_key(model.arch))
    return resolve(settings, model.n_ctx_train, model.n_swa,
                   memory=spec is None or spec.memory != "none")


def build_graph(model: ModelInfo, settings: RunSettings | Resolved) -> BuiltGraph:
    """Rebuild llama.cpp's graph for ``settings`` (one ubatch of ``settings.tokens``);
    settings already resolved for ``model`` (:func:`resolve_for`, :meth:`Resolved.step`)
    are used as they are."""
    run = settings if isinstance(settings, Resolved) else resolve_for(model, settings)
    # per-layer head sizes (gemma4's sliding layers differ: llama_hparams::n_embd_head_k(il))
    refuse_cache_types(run, [model.head_k(il) for il in range(model.n_layer)],
                       [model.head_v(il) for il in range(model.n_layer)], str(model.header.path))
    specs = load_specs()
    fl = run.flavour
    key = fl.spec_key(model.arch)
    if key not in specs:
        have = sorted(k.removesuffix(fl.spec_suffix) for k in specs
                      if fl.spec_suffix and k.endswith(fl.spec_suffix))
        raise UnsupportedError(f"{model.header.path}: --llama-cpp {fl.name} has no "
                               f"{model.arch} graph (it has: {', '.join(have) or 'none'})")
    b = LlmGraph(model, run)
    build_from_spec(b, specs[key])
    return BuiltGraph(model, run, b.g.nodes, b.g.leafs, b.caches, b.attn_inputs, b.states,
                      b.inputs)
