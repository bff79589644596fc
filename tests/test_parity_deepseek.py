"""deepseek2 (DeepSeek V2/V3/R1, Kimi K2): the graph equals llama.cpp's node for node on
tiny MLA models (the graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: MLA,
grouped routing, the NextN block, the pre-MLA path, temperature tuning, merged gate/up.

MLA cache rules (llama_kv_cache, llama_init_from_model): one K-only cache of
``kv_lora_rank + n_rot`` per token, V read as a view of it; K and V types must be equal,
so a quantized cache is quantized V too, which needs flash attention.
"""
from __future__ import annotations

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.errors import SettingsError
from graphcost.graph.settings import RunSettings
from parity import needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


def test_v3_graph_has_mla_and_grouped_routing(models):
    # guard against a vacuous pass: 2 MoE layers (layer 0 dense), each with grouped routing
    # (FILL + SET_ROWS of the masked groups) and 3 MUL_MAT_ID; MLA's wk_b/wv_b per layer
    recs = our_records(models["deepseek2"], tokens=2)
    ops = [r["op"] for r in recs]
    names = [r["name"] for r in recs]
    assert ops.count("MUL_MAT_ID") == 3 * 2
    assert ops.count("FILL") == 2
    assert names.count("ffn_moe_probs_masked-1") == 1 and "ffn_moe_group_topk-2" in names
    assert "ffn_moe_probs_biased-1" in names and "ffn_moe_weights_scaled-2" in names
    assert names.count("kqv_mla-0") == 1 and "cache_v_l0" not in str(recs)
    # lite: no group routing, no scaling, no bias
    lite = [r["name"] for r in our_records(models["deepseek2_lite"], tokens=2)]
    assert not any(n.startswith(("ffn_moe_probs_masked", "ffn_moe_weights_scaled",
                                 "ffn_moe_probs_biased")) for n in lite)


def test_mla_refuses_different_k_and_v_types(models):
    s = RunSettings(ctx_size=512, flash_attn="on", cache_type_k="q8_0", cache_type_v="f16")
    with pytest.raises(SettingsError, match="must be equal"):
        build_graph(load_model(models["deepseek2"]), s)


def test_nextn_block_is_left_out(models):
    # 3 blocks in the file, 2 in the graph and in the cache
    m = load_model(models["deepseek2_nextn"])
    assert (m.n_layer, m.n_layer_nextn) == (2, 1)
    names = {r["name"] for r in our_records(models["deepseek2_nextn"], tokens=2)}
    assert "l_out-1" in names and "l_out-2" not in names and "cache_k_l2" not in names


def test_legacy_file_takes_the_non_mla_path(models):
    recs = our_records(models["deepseek2_legacy"], tokens=2)
    names = {r["name"] for r in recs}
    ops = [r["op"] for r in recs]
    # attn_kv_b decompression, the shared k_pe repeated per head, a V cache
    assert {"kv-0", "Vcur_cont-1", "cache_v_l1"} <= names | {r["src"][-1] for r in recs}
    assert ops.count("REPEAT") == 2 and "kqv_mla-0" not in names


def test_temperature_scaling_multiplies_q(models):
    recs = our_records(models["deepseek2_temp"], tokens=3)
    scaled = [r for r in recs if r["name"].startswith("Qcur_attn_temp_scaled")
              and r["op"] == "MUL"]
    assert [r["src"] for r in scaled] == [[f"Qcur-{il}", "inp_attn_scale"] for il in (0, 1)]


def test_merged_gate_up_is_one_expert_matmul(models):
    recs = our_records(models["deepseek2_gate_up"], tokens=2)
    mm = [r for r in recs if r["op"] == "MUL_MAT_ID"]
    # layer 1 (layer 0 dense; the last layer keeps its one output row): ffn_moe_gate_up
    # [2 x 96, 3 used, 1 row] and ffn_moe_down; gate and up are views of the first
    gu = [(r["name"], r["ne"][:3]) for r in mm]
    assert gu == [("ffn_moe_gate_up-1", [192, 3, 1]), ("ffn_moe_down-1", [224, 3, 1])]
    views = {r["name"]: r for r in recs if r["op"] == "VIEW"}
    assert views["ffn_moe_gate-1"]["src"] == views["ffn_moe_up-1"]["src"] == ["ffn_moe_gate_up-1"]
