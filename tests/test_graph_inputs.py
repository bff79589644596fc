"""Graph inputs are the builder's objects (issue 10): every input leaf of a graph is
registered with its kind (what llama.cpp's ``set_input`` fills it with), the attention
inputs with the cache they index, and the executor fills an input by its kind, never by
its name. No kernel is loaded here."""
from __future__ import annotations

import pytest

import fixtures as F
import fixtures_deepseek as D
import fixtures_hybrid as H
from graphcost.errors import UnsupportedError
from graphcost.execute.inputs import FILLERS, graph_inputs
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.llm_graph import InputKind as K
from graphcost.graph.settings import RunSettings


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    return {"llama": F.write_llama(d / "llama.gguf", n_layer=2),
            "gemma3": F.write_gemma3(d / "gemma3.gguf"),
            "deepseek2": D.write_deepseek2(d / "ds.gguf", n_layer=2, attn_temp_scale=0.1),
            "lfm2": H.write_lfm2(d / "lfm2.gguf")}


def _kinds(bg):
    return [gi.kind for gi in bg.inputs]


@pytest.mark.parametrize("name, settings, kinds", [
    # tokens, embd, pos, then per cache k_idxs, v_idxs, mask; out_ids in the last layer
    ("llama", RunSettings(ctx_size=256, tokens=3),
     [K.TOKENS, K.EMBD, K.POS, K.K_IDXS, K.V_IDXS, K.KQ_MASK, K.OUT_IDS]),
    # two caches (base, swa), quantized K: one Hadamard input per cache
    ("gemma3", RunSettings(ctx_size=256, tokens=3, cache_type_k="q8_0"),
     [K.TOKENS, K.EMBD, K.POS, K.K_IDXS, K.V_IDXS, K.KQ_MASK, K.K_ROT,
      K.K_IDXS, K.V_IDXS, K.KQ_MASK, K.K_ROT, K.OUT_IDS]),
    # MLA: a K-only cache (no v_idxs); the query temperature per token
    ("deepseek2", RunSettings(ctx_size=256, tokens=3),
     [K.TOKENS, K.EMBD, K.POS, K.ATTN_SCALE, K.K_IDXS, K.KQ_MASK, K.OUT_IDS]),
    # hybrid: attention cache and recurrent state source cells
    ("lfm2", RunSettings(ctx_size=256, tokens=3),
     [K.TOKENS, K.EMBD, K.POS, K.K_IDXS, K.V_IDXS, K.KQ_MASK, K.S_COPY, K.OUT_IDS]),
], ids=["llama", "gemma3-q8-cache", "deepseek2-mla", "lfm2-hybrid"])
def test_every_input_leaf_is_registered_with_its_kind(paths, name, settings, kinds):
    bg = build_graph(load_model(paths[name]), settings)
    assert sorted(k.name for k in _kinds(bg)) == sorted(k.name for k in kinds)
    leaves = [t for t in bg.leafs if t.role == "input"]
    assert {id(t) for t in leaves} == {id(gi.tensor) for gi in bg.inputs}
    assert [gi.tensor for gi in graph_inputs(bg)] == leaves      # leaf order
    for gi in bg.inputs:
        if gi.kind in (K.K_IDXS, K.V_IDXS, K.KQ_MASK, K.K_ROT, K.V_ROT):
            # tied to the attention inputs of its own cache, as the builder made them
            assert gi.attn in bg.attn_inputs
            assert gi.tensor in (gi.attn.k_idxs, gi.attn.v_idxs, gi.attn.kq_mask,
                                 gi.attn.k_rot, gi.attn.v_rot)
        else:
            assert gi.attn is None


def test_a_renamed_input_is_filled_by_its_kind(paths):
    bg = build_graph(load_model(paths["gemma3"]), RunSettings(ctx_size=256, tokens=2))
    for gi in bg.inputs:
        gi.tensor.name = "renamed"
    assert [gi.kind for gi in graph_inputs(bg)] == _kinds(bg)


def test_an_unregistered_or_encoder_input_is_refused_in_one_line(paths):
    bg = build_graph(load_model(paths["llama"]), RunSettings(ctx_size=256, tokens=2))
    bg.inputs.pop(0)                      # inp_tokens no longer registered
    with pytest.raises(UnsupportedError, match=r"graph input 'inp_tokens' \(i32 \[2, 1, 1, 1\]\) "
                                               r"has no filler in the executor"):
        graph_inputs(bg)
    # the encoders' inputs have kinds but no filler: the executor runs decoders
    assert {K.NO_CACHE_MASK, K.MEAN, K.CLS}.isdisjoint(FILLERS)
    assert set(K) - {K.NO_CACHE_MASK, K.MEAN, K.CLS} == set(FILLERS)
