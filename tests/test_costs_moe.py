"""Mixture-of-experts costs: MUL_MAT_ID counted for the experts tokens use, exact numbers with
the arithmetic beside them; the routing ops; the expert-weight roll-up; gemma2's soft-cap."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures_moe as M
from graphcost.cost import costs
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import load_model
from graphcost.cost.costs import experts_touched
from graphcost.cost.experts import expert_weights
from graphcost.graph.ggml_graph import Graph
from graphcost.document import document
from graphcost.report.summary import render_summary
from costing import node, run

# mixtral fixture: n_embd 256, 3 layers, 6 experts of width 352, 2 used per token.
# Bytes of one expert's matrix (row size x rows):
GATE_EXPERT = 256 // 32 * 18 * 352   # Q4_0 [256, 352]: 8 blocks of 18 B a row = 50,688
UP_EXPERT = 256 // 32 * 34 * 352     # Q8_0 [256, 352]: 8 blocks of 34 B a row = 95,744
DOWN_EXPERT = 352 // 32 * 22 * 256   # Q5_0 [352, 256]: 11 blocks of 22 B a row = 61,952


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(M.write_mixtral(tmp_path_factory.mktemp("costs_moe") / "mixtral.gguf"))


@pytest.mark.parametrize("n,k,T,want", [
    (6, 2, 1, 2),      # decode: exactly the k experts of the one token
    (6, 2, 2, 4),      # worst case: no two tokens share an expert
    (6, 2, 3, 6),      # k*T == n: every expert
    (6, 2, 7, 6),      # saturated at n
    (128, 8, 15, 120),
    (128, 8, 16, 128),
], ids=["decode", "two_tokens", "exactly_all", "saturated", "128x8_T15", "128x8_T16"])
def test_experts_touched_is_the_worst_case(n, k, T, want):
    assert experts_touched(n, k, T) == want


def test_mul_mat_id_decode_reads_only_the_used_experts(model):
    c = node(run(model, tokens=1), "ffn_moe_up-0", "MUL_MAT_ID").cost
    # experts Q8_0 [256, 352, 6] x x F32 [256, 1, 1] for ids [2, 1] -> [352, 2, 1]
    macs = 352 * 2 * 1 * 256                  # 180,224 multiply-adds (2 experts, 1 token)
    blocks = macs // 32                       # Q8_0 x Q8_0 block pairs: 5,632
    assert c.ops["mul"] == macs + 2 * blocks + 256   # + d_a*d_b*sum + quantize x: 191,744
    assert c.ops["add"] == macs + blocks             # 185,856
    assert c.ops["max"] == 256 and c.ops["div"] == 256 // 32 and c.ops["cvt"] == 256
    # 2 of the 6 experts: 2 * 95,744 = 191,488 B; act: x 256*4 = 1,024 B + ids 2*4 = 8 B
    assert c.read == {"weights": 2 * UP_EXPERT, "act": 256 * 4 + 2 * 4}
    assert c.work == 256 // 32 * 34           # x as Q8_0: 8 blocks of 34 B = 272 B
    assert c.write == 352 * 2 * 4             # 2,816 B
    g = node(run(model, tokens=1), "ffn_moe_gate-0", "MUL_MAT_ID").cost
    assert g.read["weights"] == 2 * GATE_EXPERT   # 101,376 B of the Q4_0 gate experts


def test_mul_mat_id_prefill_down_converts_every_slot(model):
    c = node(run(model, tokens=7), "ffn_moe_down-0", "MUL_MAT_ID").cost
    # experts Q5_0 [352, 256, 6] x SwiGLU F32 [352, 2, 7] for ids [2, 7] -> [256, 2, 7]
    macs = 256 * 2 * 7 * 352                  # 1,261,568
    blocks = macs // 32                       # Q5_0 x Q8_0 block pairs: 39,424
    n_b = 352 * 2 * 7                         # 4,928 activations converted to Q8_0
    assert c.ops == {"mul": macs + 2 * blocks + n_b, "add": macs + blocks,   # 1,345,344 / 1,300,992
                     "max": n_b, "div": n_b // 32, "cvt": n_b}
    # 7 tokens x 2 = 14 > 6 experts: all six, 6 * 61,952 = 371,712 B (the whole tensor)
    assert c.read == {"weights": 6 * DOWN_EXPERT, "act": n_b * 4 + 2 * 7 * 4}   # act 19,768 B
    assert c.work == n_b // 32 * 34           # 154 blocks of 34 B = 5,236 B
    assert c.write == 256 * 2 * 7 * 4         # 14,336 B


@pytest.mark.parametrize("tokens,experts", [(1, 2), (2, 4), (3, 6), (4, 6)],
                         ids=["T1", "T2", "T3", "T4_saturated"])
def test_expert_weight_reads_grow_with_tokens_until_all_are_read(model, tokens, experts):
    c = node(run(model, tokens=tokens), "ffn_moe_up-0", "MUL_MAT_ID").cost
    assert c.read["weights"] == experts * UP_EXPERT


def test_mul_mat_id_ops_equal_a_dense_matmul_over_the_used_slots(model):
    # down: experts Q5_0 [352, 256, 6] x [352, 2, 5] -> [256, 2, 5] does the arithmetic of a
    # dense Q5_0 [352, 256] x F32 [352, 2*5] (same multiply-adds, same Q8_0 conversion)
    c = node(run(model, tokens=5), "ffn_moe_down-0", "MUL_MAT_ID").cost
    g = Graph()
    dense = g.mul_mat(g.new_tensor(QT.Q5_0, [352, 256]), g.new_tensor(QT.F32, [352, 2 * 5]))
    assert c.ops == costs.mul_mat(dense).ops and c.work == costs.mul_mat(dense).work
    # ... but reads only the experts touched: min(6, 2*5) = 6 here, i.e. all of them
    assert c.read["weights"] == costs.mul_mat(dense).reads[0] * 6


def test_routing_ops_exact(model):
    a = run(model, tokens=1)
    # ARGSORT of 6 probabilities: 6 * ceil(log2 6) = 18 comparisons; reads/writes 6 * 4 B
    s = node(a, "ffn_moe_argsort-0", "ARGSORT").cost
    assert s.ops == {"max": 18} and s.read == {"act": 24} and s.write == 24
    # SUM_ROWS of the 2 chosen weights: 2 adds, [2] F32 in, [1] out
    s = node(a, "ffn_moe_weights_sum-0", "SUM_ROWS").cost
    assert s.ops == {"add": 2} and s.read == {"act": 8} and s.write == 4
    # CLAMP of one sum: MIN then MAX
    assert node(a, "ffn_moe_weights_sum_clamped-0", "CLAMP").cost.ops == {"max": 2}
    # softmax over 6 logits (no mask): 2*6 mul, 2*6 add, 6 max, 6 exp, 1 div
    assert node(a, "ffn_moe_probs-0", "SOFT_MAX").cost.ops == \
        {"mul": 12, "add": 12, "max": 6, "exp": 6, "div": 1}


def test_expert_weights_active_against_total(model):
    a = run(model, tokens=1)
    ew = expert_weights(a)
    per_expert = GATE_EXPERT + UP_EXPERT + DOWN_EXPERT      # 208,384 B per expert and layer
    assert (ew.tensors, ew.n_expert, ew.n_expert_used) == (9, 6, 2)
    assert ew.total_bytes == 3 * 6 * per_expert            # 3,750,912 B
    assert ew.active_bytes_per_token == 3 * 2 * per_expert  # 1,250,304 B: one third
    assert ew.read_bytes == ew.active_bytes_per_token      # decode reads what one token uses
    # 7 tokens: layers 0 and 1 read all 6 experts; the last layer runs the 1 output row only
    ew7 = expert_weights(run(model, tokens=7))
    assert ew7.read_bytes == 2 * 6 * per_expert + 2 * per_expert    # 2,917,376 B
    # the roll-up is the MUL_MAT_ID weight reads of the analysis
    assert ew7.read_bytes == run(model, tokens=7).by_op["MUL_MAT_ID"].read["weights"]


def test_reports_show_expert_weights(model):
    a = run(model, tokens=1)
    d = document(analyze_graph(a.graph, memory=True))["experts"]
    # one token: worst case min(6, 2) = 2 experts; uniform routing 6 * (1 - 4/6) = 2 as well
    assert d == {"tensors": 9, "n_expert": 6, "n_expert_used": 2, "total_bytes": 3750912,
                 "active_bytes_per_token": 1250304, "read_bytes": 1250304,
                 "read_assumption": "worst case", "n_tokens": 1, "worst_case_experts": 2,
                 "expected_experts_uniform_routing": 2.0,
                 "expected_read_bytes_uniform_routing": 1250304}
    text = render_summary(a)
    assert "Expert weights (2 of 6 experts per token)" in text
    assert "active per token (33.3%)" in text and "1,250,304" in text and "3,750,912" in text
    assert "read, expected, uniform routing (2.00 of 6)" in text


def test_expected_expert_reads_follow_each_layers_tokens(model):
    # 4 tokens, 1 output: layers 0 and 1 route 4 tokens, the last layer only the output row.
    # Expected experts per tensor: 6 * (1 - (2/3)**4) = 6 * 65/81 = 130/27 for 4 tokens, 2 for one
    from fractions import Fraction
    ew = expert_weights(run(model, tokens=4))
    per_expert = GATE_EXPERT + UP_EXPERT + DOWN_EXPERT      # 208,384 B per expert and layer
    assert ew.expected_experts == Fraction(130, 27) and ew.worst_case_experts == 6
    assert ew.expected_read_bytes == 2 * Fraction(130, 27) * per_expert + 2 * per_expert
    assert ew.read_bytes == 2 * 6 * per_expert + 2 * per_expert   # worst case: all 6, then 2


def test_dense_models_have_no_expert_section(tmp_path):
    import fixtures as F
    a = run(load_model(F.write_llama(tmp_path / "llama.gguf", n_layer=1)), tokens=1)
    assert expert_weights(a) is None and document(analyze_graph(a.graph, memory=True))["experts"] is None
    assert "Expert weights" not in render_summary(a)


def test_gemma2_flash_attention_counts_the_softcap(tmp_path):
    m = load_model(M.write_gemma2(tmp_path / "gemma2.gguf"))
    a = run(m, tokens=1, past=3, flash_attn="on")
    c = next(nc.cost for nc in a.nodes if nc.node.op == "FLASH_ATTN_EXT" and nc.node.layer == 0)
    # q [64, 1 token, 4 heads] against 256 cells: 4 * 256 = 1,024 (row, cell) pairs, each
    # s = 50 * tanh(s): 1 tanh, 1 mul more than without soft-capping
    pairs = 4 * 256
    assert c.ops["tanh"] == pairs
    assert c.ops["mul"] == pairs * (64 + 3 + 64) + 4 * 64 + pairs   # 135,424
    # without flash attention the cap is three nodes before the softmax, costed as such
    a = run(m, tokens=1, past=3)
    assert node(a, "kq_tanh-0", "TANH").cost.ops == {"tanh": pairs}
    assert node(a, "kq_scaled_1-0", "SCALE").cost.ops == {"mul": pairs}
