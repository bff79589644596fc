"""qwen2moe, olmoe, smollm3, seed_oss, glm4, exaone4, cohere2, mistral3, qwen3vl,
qwen3vlmoe and llama4: their graphs equal llama.cpp's node for node (the
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: each
family's distinctive nodes are really built; multi-section rope positions."""
from __future__ import annotations

from parity import needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


def _ops(models, model, **kw):
    return [(r["name"], r["op"]) for r in our_records(models[model], **kw)]


def test_variants_are_really_built(models):
    """Guards against vacuous passes: each family's distinctive nodes are present."""
    ops = _ops(models, "qwen2moe", tokens=2)
    # per layer: one SILU / DIV pair for the shared expert's gate, 3 expert matmuls
    assert sum(op == "DIV" and n.startswith("ffn_shexp_gate-") for n, op in ops) == 3
    assert sum(op == "MUL_MAT_ID" for _, op in ops) == 3 * 3
    assert not any(op == "SCALE" for _, op in _ops(models, "qwen2moe_k1", tokens=2))
    # smollm3: 5 layers, layer 3 without rope: 4 * 2 ROPE nodes
    assert sum(op == "ROPE" for _, op in _ops(models, "smollm3", tokens=2)) == 8
    # cohere2 pattern 4 over 5 layers: layers 0, 1, 2, 4 sliding -> 8 ROPE; 2 masks
    ops = _ops(models, "cohere2", tokens=2)
    assert sum(op == "ROPE" for _, op in ops) == 8
    # exaone4 64 layers, pattern 4: 48 sliding layers with rope -> 96 ROPE
    assert sum(op == "ROPE" for _, op in _ops(models, "exaone4_swa", tokens=2)) == 96
    assert sum(op == "ROPE" for _, op in _ops(models, "exaone4", tokens=2)) == 6
    # mistral3: the temperature scale multiplies Q in each of 3 layers
    assert sum(op == "MUL" and n.startswith("Qcur_attn_temp_scaled-") for n, op in
               _ops(models, "mistral3", tokens=2)) == 3
    # qwen3vl: one PAD of the embeddings, deepstack in layers 0 and 1
    ops = _ops(models, "qwen3vl", tokens=2)
    assert sum(op == "PAD" for _, op in ops) == 1
    assert [n for n, _ in ops if n.startswith("deepstack_out")] == ["deepstack_out-0",
                                                                    "deepstack_out-1"]
    # llama4: 4 of 5 layers rope'd (3 is NoPE: Q x inp_attn_scale); Q/K norms on the 4;
    # MoE in 2 layers with the input repeated and weighted before the experts
    ops = _ops(models, "llama4", tokens=2)
    assert sum(op == "ROPE" for _, op in ops) == 8
    assert sum(n.startswith("Qcur_normed-") and op == "RMS_NORM" for n, op in ops) == 4
    assert sum(op == "REPEAT" for _, op in ops) == 2
    assert ("ffn_moe_weighted-1", "MUL") in ops and ("ffn_moe_out_merged-3", "ADD") in ops
    assert not any(n.startswith("Qcur_normed") for n, _ in _ops(models, "llama4_128e"))


def test_multi_section_rope_takes_four_positions(models):
    """llama_hparams::n_pos_per_embd: 4 positions per token for MROPE / IMROPE."""
    from graphcost.graph.build import build_graph, load_model
    from graphcost.graph.settings import RunSettings
    for name, mode in (("glm4_mrope", 8), ("qwen3vl", 40), ("glm4", 0)):
        bg = build_graph(load_model(models[name]), RunSettings(tokens=3))
        ropes = [n for n in bg.nodes if n.op == "ROPE"]
        assert {r.params["mode"] for r in ropes} == {mode}, name
        assert ropes[0].src[1].ne[0] == (12 if mode else 3), name  # 4 * 3 tokens, or 3
