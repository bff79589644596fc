"""deepseek2 (DeepSeek V2/V3/R1, Kimi K2): graphcost's graph equals llama.cpp's node for
node (order, name, op, type, ne, sources), through llama-cpp-python's cb_eval
(graphcost/judge/oracle.py), on tiny MLA models from tests/fixtures_deepseek.py.

MLA cache rules (llama_kv_cache, llama_init_from_model): one K-only cache of
``kv_lora_rank + n_rot`` per token, V read as a view of it; K and V types must be equal,
so a quantized cache is quantized V too, which needs flash attention.
"""
from __future__ import annotations

import pytest

import fixtures_deepseek as D
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import SettingsError, UnsupportedError
from graphcost.graph.settings import RunSettings
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_deepseek")
    return {
        # DeepSeek V3 layout: Q LoRA 160, KV LoRA 96, 3 heads (48 nope + 32 rope, V 64),
        # layer 0 dense, 8 experts in 4 groups (2 used), 3 experts used, sigmoid gating with
        # a selection bias, normalised weights scaled by 2.5, one shared expert
        "v3": D.write_deepseek2(d / "v3.gguf"),
        # lite layout (attn_q, q_lora_rank 0), no dense layer, 5 experts, 2 used, no groups,
        # no gating/norm/scale keys (softmax, unnormalised, unscaled), no bias, 2 shared
        "lite": D.write_deepseek2(d / "lite.gguf", q_lora_rank=0, n_layer=2,
                                  n_layer_dense_lead=0, n_expert=5, n_expert_used=2,
                                  n_expert_shared=2, expert_groups=None, gating=None,
                                  weights_norm=None, weights_scale=None, probs_bias=False),
        # Kimi K2 style: one expert group (no group routing), 2 dense layers, one expert
        # used (the CONT after the single view), KV LoRA 64 + rope 16, tied output
        "k2": D.write_deepseek2(d / "k2.gguf", n_layer=4, n_layer_dense_lead=2,
                                kv_lora_rank=64, n_rot=16, qk_nope=32, v_head=32, n_head=5,
                                n_expert=6, n_expert_used=1, expert_groups=(1, 0),
                                weights_scale=1.0, tie_embeddings=True),
        # Mistral Large 3 style: query temperature tuning (inp_attn_scale times Qcur)
        "temp": D.write_deepseek2(d / "temp.gguf", n_layer=2, attn_temp_scale=0.1),
        # merged ffn_gate_up_exps: one MUL_MAT_ID, gate and up as views of it
        "gate_up": D.write_deepseek2(d / "gate_up.gguf", n_layer=2, merged_gate_up=True),
        # GLM-4.7-Flash style: 2 trunk layers + 1 NextN/MTP block the trunk graph skips
        "nextn": D.write_deepseek2(d / "nextn.gguf", n_layer=2, n_nextn=1),
        # a pre-MLA file (attn_kv_b, no MLA head sizes): llama.cpp's non-MLA path, MHA over
        # a full K/V cache (K heads of 32 + 32 = 64: the Hadamard path with quantized K;
        # V heads of 64)
        "legacy": D.write_deepseek2(d / "legacy.gguf", legacy_kv_b=True, n_layer=2,
                                    qk_nope=32),
    }


CASES = [
    # (model, settings)
    ("v3", dict(tokens=1, past=3)),
    ("v3", dict(tokens=7, past=0)),
    ("v3", dict(tokens=5, past=300, n_outputs=2)),
    ("v3", dict(tokens=3, past=2, type_k="q8_0", type_v="q8_0", fa=True)),
    ("v3", dict(tokens=1, past=0, type_k="q4_0", type_v="q4_0", fa=True)),
    ("lite", dict(tokens=1, past=2)),
    ("lite", dict(tokens=6, past=0, n_outputs=3)),
    ("lite", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("k2", dict(tokens=1, past=0)),
    ("k2", dict(tokens=4, past=1, n_outputs=4)),
    ("k2", dict(tokens=9, past=0, n_ubatch=64, n_ctx=600)),
    ("nextn", dict(tokens=1, past=1)),
    ("nextn", dict(tokens=5, past=0, n_outputs=2)),
    ("gate_up", dict(tokens=1, past=2)),
    ("gate_up", dict(tokens=5, past=0, n_outputs=5)),
    ("temp", dict(tokens=1, past=4)),
    ("temp", dict(tokens=6, past=0, n_outputs=2)),
    ("legacy", dict(tokens=1, past=2)),
    ("legacy", dict(tokens=6, past=0, n_outputs=3)),
    ("legacy", dict(tokens=2, past=1, type_k="q8_0")),
    ("legacy", dict(tokens=3, past=0, type_k="q8_0", type_v="q8_0", fa=True)),
]


@graph_cases(CASES)
def test_deepseek2_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


def test_v3_graph_has_mla_and_grouped_routing(models):
    # guard against a vacuous pass: 2 MoE layers (layer 0 dense), each with grouped routing
    # (FILL + SET_ROWS of the masked groups) and 3 MUL_MAT_ID; MLA's wk_b/wv_b per layer
    recs = our_records(models["v3"], tokens=2)
    ops = [r["op"] for r in recs]
    names = [r["name"] for r in recs]
    assert ops.count("MUL_MAT_ID") == 3 * 2
    assert ops.count("FILL") == 2
    assert names.count("ffn_moe_probs_masked-1") == 1 and "ffn_moe_group_topk-2" in names
    assert "ffn_moe_probs_biased-1" in names and "ffn_moe_weights_scaled-2" in names
    assert names.count("kqv_mla-0") == 1 and "cache_v_l0" not in str(recs)
    # lite: no group routing, no scaling, no bias
    lite = [r["name"] for r in our_records(models["lite"], tokens=2)]
    assert not any(n.startswith(("ffn_moe_probs_masked", "ffn_moe_weights_scaled",
                                 "ffn_moe_probs_biased")) for n in lite)


def test_mla_refuses_different_k_and_v_types(models):
    s = RunSettings(ctx_size=512, flash_attn="on", cache_type_k="q8_0", cache_type_v="f16")
    with pytest.raises(SettingsError, match="must be equal"):
        build_graph(load_model(models["v3"]), s)


def test_nextn_block_is_left_out(models):
    # 3 blocks in the file, 2 in the graph and in the cache
    m = load_model(models["nextn"])
    assert (m.n_layer, m.n_layer_nextn) == (2, 1)
    names = {r["name"] for r in our_records(models["nextn"], tokens=2)}
    assert "l_out-1" in names and "l_out-2" not in names and "cache_k_l2" not in names


def test_legacy_file_takes_the_non_mla_path(models):
    recs = our_records(models["legacy"], tokens=2)
    names = {r["name"] for r in recs}
    ops = [r["op"] for r in recs]
    # attn_kv_b decompression, the shared k_pe repeated per head, a V cache
    assert {"kv-0", "Vcur_cont-1", "cache_v_l1"} <= names | {r["src"][-1] for r in recs}
    assert ops.count("REPEAT") == 2 and "kqv_mla-0" not in names


def test_temperature_scaling_multiplies_q(models):
    recs = our_records(models["temp"], tokens=3)
    scaled = [r for r in recs if r["name"].startswith("Qcur_attn_temp_scaled")
              and r["op"] == "MUL"]
    assert [r["src"] for r in scaled] == [[f"Qcur-{il}", "inp_attn_scale"] for il in (0, 1)]


def test_merged_gate_up_is_one_expert_matmul(models):
    recs = our_records(models["gate_up"], tokens=2)
    mm = [r for r in recs if r["op"] == "MUL_MAT_ID"]
    # layer 1 (layer 0 dense; the last layer keeps its one output row): ffn_moe_gate_up
    # [2 x 96, 3 used, 1 row] and ffn_moe_down; gate and up are views of the first
    gu = [(r["name"], r["ne"][:3]) for r in mm]
    assert gu == [("ffn_moe_gate_up-1", [192, 3, 1]), ("ffn_moe_down-1", [224, 3, 1])]
    views = {r["name"]: r for r in recs if r["op"] == "VIEW"}
    assert views["ffn_moe_gate-1"]["src"] == views["ffn_moe_up-1"]["src"] == ["ffn_moe_gate_up-1"]
