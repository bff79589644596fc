"""qwen2moe, olmoe, smollm3, seed_oss, glm4, exaone4, cohere2, mistral3, qwen3vl and
qwen3vlmoe: graphcost's graph equals llama.cpp's node for node (order, name, op, type, ne,
sources), for prefill and decode, flash attention off and on, quantized caches and
several outputs.

llama.cpp (through llama-cpp-python) reports every node its scheduler runs via cb_eval;
see graphcost/judge/oracle.py. Fixtures (tests/fixtures_simple.py) are tiny GGUFs with odd
sizes and mixed weight types, built once per module.
"""
from __future__ import annotations

import pytest

import fixtures_simple as S
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_simple")
    return {
        # 5 experts of 96, 2 used, shared expert of 160 with its sigmoid gate; 7/1 heads
        "qwen2moe": S.write_qwen2moe(d / "qwen2moe.gguf"),
        # one expert used (CONT); expert_weights_scale 2.5 in the file, which qwen2moe
        # never reads (no ffn_moe_weights_scaled)
        "qwen2moe_k1": S.write_qwen2moe(d / "qwen2moe_k1.gguf", n_expert_used=1,
                                        expert_weights_scale=2.5, n_layer=2),
        # Q/K normed over the whole projection, 6 experts of 96, 2 used
        "olmoe": S.write_olmoe(d / "olmoe.gguf"),
        # 5 layers: layer 3 has no RoPE; head_dim 64 != 200 / 6; tied output
        "smollm3": S.write_smollm3(d / "smollm3.gguf"),
        # untied, Q/K/V biases; a variant without biases and tied
        "seed_oss": S.write_seed_oss(d / "seed_oss.gguf"),
        "seed_oss_nobias": S.write_seed_oss(d / "seed_oss_nb.gguf", qkv_biases=False,
                                            tie_embeddings=True, n_layer=2),
        # head_dim 64, rope over 32 of it; MROPE variant with sections [4, 6, 6, 0]
        "glm4": S.write_glm4(d / "glm4.gguf"),
        "glm4_mrope": S.write_glm4(d / "glm4_mrope.gguf", rope_sections=[4, 6, 6, 0],
                                   n_layer=2, tie_embeddings=True, qkv_biases=False),
        # 3 layers: no sliding window (llama.cpp builds SWA only for 64 layers)
        "exaone4": S.write_exaone4(d / "exaone4.gguf", rope_freqs=True),
        # 64 layers: window 40, pattern 4 (layers 3, 7, ... global and NoPE)
        "exaone4_swa": S.write_exaone4(d / "exaone4_swa.gguf", n_layer=64, n_embd=64,
                                       n_head=2, n_head_kv=1, n_ff=96, n_vocab=261,
                                       sliding_window=40),
        # 5 layers, window 48, pattern 4 (layer 3 global, NoPE), logit scale 0.125
        "cohere2": S.write_cohere2(d / "cohere2.gguf"),
        # pattern 2: layers 1 and 3 global
        "cohere2_p2": S.write_cohere2(d / "cohere2_p2.gguf", swa_pattern=2, n_layer=4),
        # temperature tuning (inp_attn_scale), head_dim 48 != 256 / 6
        "mistral3": S.write_mistral3(d / "mistral3.gguf"),
        # no temperature scale; MoE FFN, 5 experts of 96, 2 used, rope_freqs factors,
        # head_dim 32 (quantized caches need head_dim a multiple of the block: 48 is not)
        "mistral3_moe": S.write_mistral3(d / "mistral3_moe.gguf", temperature_scale=None,
                                         n_expert=5, n_ff=96, rope_freqs=True, head_dim=32),
        # IMROPE sections [12, 10, 10, 0], 2 deepstack layers of 3
        "qwen3vl": S.write_qwen3vl(d / "qwen3vl.gguf"),
        # no deepstack (no PAD, no deepstack_out)
        "qwen3vl_nods": S.write_qwen3vl(d / "qwen3vl_nods.gguf", n_deepstack=0, n_layer=2,
                                        tie_embeddings=False),
        # 5 experts of 96, 2 used, 1 deepstack layer
        "qwen3vlmoe": S.write_qwen3vlmoe(d / "qwen3vlmoe.gguf"),
        # 5 layers: chunked 0, 1, 2, 4, full + NoPE 3; MoE in layers 1 and 3 (5 experts,
        # top-1, shared expert), dense FFN in 0, 2, 4
        "llama4": S.write_llama4(d / "llama4.gguf"),
        # top-2, rope_freqs factors, sliding_window 100 in the file (llama.cpp still
        # chunks by 8192), MoE every layer
        "llama4_k2": S.write_llama4(d / "llama4_k2.gguf", n_expert_used=2, rope_freqs=True,
                                    sliding_window=100, moe_step=1, n_layer=4),
        # 128 experts: no Q/K norm (use_kq_norm is false for the 17B-128E)
        "llama4_128e": S.write_llama4(d / "llama4_128e.gguf", n_embd=64, n_head=2,
                                      n_head_kv=1, n_ff=96, n_ff_exp=32, n_expert=128,
                                      n_layer=4, n_vocab=263),
    }


CASES = [
    # (model, settings)
    ("qwen2moe", dict(tokens=1, past=3)),
    ("qwen2moe", dict(tokens=7, past=0, n_outputs=3)),
    ("qwen2moe", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("qwen2moe_k1", dict(tokens=1, past=0)),
    ("qwen2moe_k1", dict(tokens=5, past=2)),
    ("olmoe", dict(tokens=1, past=2)),
    ("olmoe", dict(tokens=6, past=0, n_outputs=2)),
    ("olmoe", dict(tokens=3, past=1, type_k="q4_0")),
    ("smollm3", dict(tokens=1, past=3)),
    ("smollm3", dict(tokens=8, past=0, n_outputs=8)),
    ("smollm3", dict(tokens=2, past=5, type_k="q8_0", type_v="q5_0", fa=True)),
    ("smollm3", dict(tokens=3, past=0, type_k="q4_0")),
    ("seed_oss", dict(tokens=1, past=1)),
    ("seed_oss", dict(tokens=5, past=0, n_outputs=2)),
    ("seed_oss_nobias", dict(tokens=3, past=2, type_k="q8_0")),
    ("glm4", dict(tokens=1, past=2)),
    ("glm4", dict(tokens=6, past=0)),
    ("glm4", dict(tokens=2, past=3, type_k="q8_0", type_v="q8_0", fa=True)),
    ("glm4_mrope", dict(tokens=1, past=0)),
    ("glm4_mrope", dict(tokens=4, past=2, n_outputs=2)),
    ("exaone4", dict(tokens=1, past=3)),
    ("exaone4", dict(tokens=5, past=0, type_k="q8_0")),
    ("exaone4_swa", dict(tokens=1, past=2)),
    ("exaone4_swa", dict(tokens=6, past=50, n_outputs=2, n_ubatch=64, n_ctx=300)),
    ("exaone4_swa", dict(tokens=2, past=0, swa_full=True)),
    ("cohere2", dict(tokens=1, past=3)),
    ("cohere2", dict(tokens=9, past=0, n_outputs=4)),
    ("cohere2", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600)),
    ("cohere2", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("cohere2_p2", dict(tokens=3, past=1, swa_full=True)),
    ("mistral3", dict(tokens=1, past=4)),
    ("mistral3", dict(tokens=7, past=0, n_outputs=3)),
    ("mistral3_moe", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("mistral3_moe", dict(tokens=1, past=0)),
    ("mistral3_moe", dict(tokens=5, past=2)),
    ("qwen3vl", dict(tokens=1, past=3)),
    ("qwen3vl", dict(tokens=6, past=0, n_outputs=6)),
    ("qwen3vl", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("qwen3vl_nods", dict(tokens=4, past=0)),
    ("qwen3vlmoe", dict(tokens=1, past=1, type_k="q8_0")),
    ("qwen3vlmoe", dict(tokens=5, past=0, n_outputs=2)),
    ("llama4", dict(tokens=1, past=3)),
    ("llama4", dict(tokens=7, past=0, n_outputs=3)),
    ("llama4", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600)),
    ("llama4", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("llama4", dict(tokens=3, past=0, swa_full=True)),
    ("llama4_k2", dict(tokens=1, past=0)),
    ("llama4_k2", dict(tokens=6, past=2, n_outputs=2)),
    ("llama4_128e", dict(tokens=1, past=1)),
    ("llama4_128e", dict(tokens=5, past=0)),
]


@graph_cases(CASES)
def test_fixture_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


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
