"""gpt-oss costs, exact numbers with the arithmetic beside them: ADD_ID (per-expert biases),
SWIGLU_OAI, attention sinks on SOFT_MAX and FLASH_ATTN_EXT, MUL_MAT_ID over MXFP4 experts,
and the expected distinct experts under uniform routing beside the worst case."""
from __future__ import annotations

from fractions import Fraction

import pytest

import fixtures_gptoss as G
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import load_model
from graphcost.cost.costs import experts_expected, experts_touched
from graphcost.cost.experts import expert_weights
from graphcost.document import document
from graphcost.report.summary import render_summary
from costing import node, run

# fixture: n_embd 288, 6 heads of 64 over 2 KV heads, 3 layers (0, 2 sliding), 5 MXFP4
# experts of width 160, 2 used. One MXFP4 expert matrix: 32 values in 17 B, so
#   gate/up [288, 160]: 288/32 * 17 * 160 = 24,480 B; down [160, 288]: 160/32 * 17 * 288 = 24,480 B
EXPERT = 24_480


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(G.write_gptoss(tmp_path_factory.mktemp("costs_gptoss") / "g.gguf"))


def test_add_id_reads_the_bias_rows_of_the_used_experts(model):
    c = node(run(model, tokens=1), "ffn_moe_up_biased-0", "ADD_ID").cost
    # [160, 2 slots, 1 token] + bias row ids[slot] of F32 [160, 5]: 320 adds
    assert c.ops == {"add": 320}
    # a 320 * 4 = 1,280 B, ids 2 * 4 = 8 B (activations); 2 of the 5 bias rows: 2 * 640 B
    assert c.read == {"act": 1_280 + 8, "weights": 2 * 160 * 4}
    assert c.write == 1_280
    # 3 tokens: min(5, 2 * 3) = 5 rows, the whole bias
    c3 = node(run(model, tokens=3), "ffn_moe_down_biased-0", "ADD_ID").cost
    assert c3.read["weights"] == 5 * 288 * 4 and c3.ops == {"add": 288 * 2 * 3}


def test_swiglu_oai_exact(model):
    c = node(run(model, tokens=1), "ffn_moe_swiglu_oai-0", "SWIGLU_OAI").cost
    n = 160 * 2                      # 320 outputs: gate and up [160, 2, 1]
    # min, clamp (3 max), alpha*(-x) and the final product (2 mul), exp, 1+e and y+1 (2 add), div
    assert c.ops == {"max": 3 * n, "mul": 2 * n, "exp": n, "add": 2 * n, "div": n}
    assert c.read == {"act": 2 * n * 4} and c.write == n * 4


def test_softmax_with_sinks(model):
    c = node(run(model, tokens=1, past=3), "kq_soft_max-0", "SOFT_MAX")
    assert c.node.ne[:3] == (256, 1, 6)     # 256 cells (4 used, padded to 256) x 1 token x 6 heads
    n, r = 256, 6
    # masked softmax: 3n mul, 3n add, n max, n exp per row, 1 div; sinks: +1 max, +1 exp, +2 add a row
    assert c.cost.ops == {"mul": 3 * n * r, "add": 3 * n * r + 2 * r, "max": n * r + r,
                          "exp": n * r + r, "div": r}
    # the sinks are a weight: 6 F32 logits = 24 B
    assert c.cost.read["weights"] == 6 * 4


def test_flash_attention_with_sinks(model):
    a = run(model, tokens=1, past=3, flash_attn="on")
    c = next(nc.cost for nc in a.nodes if nc.node.op == "FLASH_ATTN_EXT" and nc.node.layer == 0)
    pairs, rows = 6 * 256, 6                      # 6 head rows x 256 cells = 1,536 pairs
    assert c.ops == {"mul": pairs * (64 + 3 + 64) + rows * 64 + rows,       # 201,606
                     "add": pairs * (64 + 3 + 64) + 2 * rows,               # 201,228
                     "max": pairs + rows, "exp": pairs + rows, "div": rows,
                     "cvt": rows * 64}
    assert c.read["weights"] == 6 * 4


def test_mul_mat_id_over_mxfp4_experts(model):
    c = node(run(model, tokens=1), "ffn_moe_up-0", "MUL_MAT_ID").cost
    # MXFP4 [288, 160, 5] x F32 [288, 1, 1] for ids [2, 1]; vec_dot_type Q8_0 (blocks of 32)
    macs = 160 * 2 * 288                          # 92,160
    blocks = macs // 32                           # 2,880 block pairs
    assert c.ops == {"mul": macs + 2 * blocks + 288, "add": macs + blocks,   # 98,208 / 95,040
                     "max": 288, "div": 288 // 32, "cvt": 288}
    assert c.read == {"weights": 2 * EXPERT, "act": 288 * 4 + 2 * 4}
    assert c.work == 288 // 32 * 34               # x as Q8_0: 9 blocks of 34 B


def test_graph_is_fully_modelled(model):
    for fa in ("off", "on"):
        assert run(model, tokens=4, flash_attn=fa).unmodelled == []


@pytest.mark.parametrize("n,k,T,want", [
    (5, 2, 1, Fraction(2)),               # one token: exactly its k experts
    (5, 2, 3, Fraction(98, 25)),          # 5 * (1 - (3/5)**3) = 5 * 98/125 = 3.92
    (6, 2, 2, Fraction(10, 3)),           # 6 * (1 - (2/3)**2) = 6 * 5/9
    (128, 8, 1, Fraction(8)),
    (32, 4, 16, 32 * (1 - Fraction(7, 8) ** 16)),   # gpt-oss-20b, 16 tokens
    (4, 4, 9, Fraction(4)),               # every token uses every expert
], ids=["decode", "5x2_T3", "6x2_T2", "128x8_decode", "32x4_T16", "all_used"])
def test_expected_experts_under_uniform_routing(n, k, T, want):
    got = experts_expected(n, k, T)
    assert got == want
    assert got <= experts_touched(n, k, T)   # never above the worst case


def test_expected_experts_matches_enumeration():
    # brute force over every routing of T = 2 tokens, each a k = 2 subset of n = 4 experts
    from itertools import combinations, product
    subsets = list(combinations(range(4), 2))
    total = sum(len(set(a) | set(b)) for a, b in product(subsets, repeat=2))
    # 4 * (1 - (1/2)**2) = 3
    assert Fraction(total, len(subsets) ** 2) == experts_expected(4, 2, 2) == Fraction(3)


def test_reports_give_expected_beside_worst_case(model):
    a = run(model, tokens=3)
    ew = expert_weights(a)
    # gpt-oss picks the output rows after the layers: all 3 layers route 3 tokens.
    # worst case min(5, 2*3) = 5 experts per tensor, 9 tensors of EXPERT bytes each
    assert ew.worst_case_experts == 5 and ew.read_bytes == 9 * 5 * EXPERT        # 1,101,600
    assert ew.expected_experts == Fraction(98, 25)
    assert ew.expected_read_bytes == 9 * EXPERT * Fraction(98, 25)              # 863,654.4
    d = document(analyze_graph(a.graph, memory=True))["experts"]
    assert d["read_bytes"] == 1_101_600 and d["read_assumption"] == "worst case"
    assert d["expected_experts_uniform_routing"] == 3.92
    assert d["expected_read_bytes_uniform_routing"] == 863_654
    text = render_summary(a)
    assert "read, worst case (5 of 5)" in text and "1,101,600" in text
    assert "read, expected, uniform routing (3.92 of 5)" in text and "863,654" in text


def test_a_file_without_the_required_window_is_refused_in_one_line(tmp_path):
    # openai-moe.cpp: ml.get_key(LLM_KV_ATTENTION_SLIDING_WINDOW, hparams.n_swa) is required
    import subprocess
    import sys
    p = G.write_gptoss(tmp_path / "no_window.gguf", sliding_window=None, n_layer=1).path
    r = subprocess.run([sys.executable, "-m", "graphcost", "analyze", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == (f"graphcost: {p}: required metadata key "
                                "'gpt-oss.attention.sliding_window' is missing "
                                "(llama.cpp refuses the model)")


def test_roofline_covers_the_gptoss_ops(model):
    # every node is costed, so the roofline table has the new ops and no unmodelled line
    from graphcost.cost.hardware import load
    from graphcost.cost.roofline import estimate
    a = run(model, tokens=4)
    est = estimate(a, load("amd-ryzen9-7950x"))
    assert {"ADD_ID", "SWIGLU_OAI", "MUL_MAT_ID"} <= {o.op for o in est.by_op}
    assert None not in est.per_node
    text = render_summary(a, hardware=load("amd-ryzen9-7950x"))
    assert "SWIGLU_OAI" in text and "unmodelled: none" in text
