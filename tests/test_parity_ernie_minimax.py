"""ernie4_5-moe (ERNIE 4.5 MoE) and minimax-m2 (MiniMax-M2): graphcost's graph equals
llama.cpp's node for node (order, name, op, type, ne, sources), through
llama-cpp-python's cb_eval (graphcost/judge/oracle.py), on tiny models from
tests/fixtures_deepseek.py."""
from __future__ import annotations

import pytest

import fixtures_deepseek as D
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import UnsupportedError
from graphcost.graph.settings import RunSettings
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_ernie_minimax")
    return {
        # 4 layers, layer 0 dense; 6 experts of 96, 2 used; selection bias; shared expert of
        # 160; attn_output.bias in the file (llama.cpp does not use it); an
        # expert_weights_scale key llama.cpp never reads for this family
        "ernie": D.write_ernie4_5_moe(d / "ernie.gguf", weights_scale=2.0),
        # no dense layer, no shared expert, no bias, no ffn_gate_exps (SILU on up alone),
        # one expert used (CONT), tied output, head_dim 32
        "ernie_bare": D.write_ernie4_5_moe(d / "ernie_bare.gguf", n_head=8, head_dim=32,
                                           n_layer=2, n_layer_dense_lead=0, n_ff_shexp=0,
                                           probs_bias=False, gate_exps=False, out_bias=False,
                                           n_expert_used=1, tie_embeddings=True),
        # 6 heads of 64 over 2 KV heads, rope on 32 of 64, 7 experts of 96, 3 used, sigmoid
        "minimax": D.write_minimax_m2(d / "minimax.gguf"),
        # softmax gating, 1 KV head, 2 used of 5
        "minimax_softmax": D.write_minimax_m2(d / "minimax_softmax.gguf", gating=1, n_head=4,
                                              n_head_kv=1, n_expert=5, n_expert_used=2,
                                              n_layer=2, weights_scale=3.0),
        # no expert_gating_func: llama.cpp aborts in build_moe_ffn; graphcost refuses
        "minimax_nogating": D.write_minimax_m2(d / "minimax_nogating.gguf", gating=None,
                                               n_layer=1),
    }


CASES = [
    # (model, settings)
    ("ernie", dict(tokens=1, past=3)),
    ("ernie", dict(tokens=7, past=0)),
    ("ernie", dict(tokens=5, past=300, n_outputs=2)),
    ("ernie", dict(tokens=3, past=2, type_k="q8_0", type_v="q8_0", fa=True)),
    ("ernie_bare", dict(tokens=1, past=0)),
    ("ernie_bare", dict(tokens=6, past=1, n_outputs=3, type_k="q4_0")),
    ("minimax", dict(tokens=1, past=3)),
    ("minimax", dict(tokens=8, past=0)),
    ("minimax", dict(tokens=2, past=1, type_k="q8_0")),
    ("minimax", dict(tokens=4, past=0, type_k="q8_0", type_v="q4_0", fa=True)),
    ("minimax_softmax", dict(tokens=1, past=0)),
    ("minimax_softmax", dict(tokens=5, past=2, n_outputs=5)),
]


@graph_cases(CASES)
def test_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


def test_graphs_have_the_family_constructs(models):
    # ernie: 3 MoE layers of 4 (layer 0 dense), each with a shared expert; no weight
    # scaling although the file has a scale key; the output bias is not added
    names = [r["name"] for r in our_records(models["ernie"], tokens=2)]
    ops = [r["op"] for r in our_records(models["ernie"], tokens=2)]
    assert ops.count("MUL_MAT_ID") == 3 * 3 and names.count("ffn_shexp-1") == 1
    assert not any(n.startswith("ffn_moe_weights_scaled") for n in names)
    assert "blk.0.attn_output.bias" not in str(our_records(models["ernie"], tokens=2))
    # minimax: whole-projection Q/K norms, MoE in every layer with the selection bias
    mm = [r["name"] for r in our_records(models["minimax"], tokens=2)]
    assert "Qcur_normed-0" in mm and "ffn_moe_probs_biased-2" in mm
    assert not any(n.startswith("ffn_moe_weights_scaled") for n in mm)


def test_minimax_without_gating_function_is_refused(models):
    with pytest.raises(UnsupportedError, match="expert gating function 0"):
        build_graph(load_model(models["minimax_nogating"]), RunSettings(ctx_size=512))
