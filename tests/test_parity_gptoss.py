"""gpt-oss: graphcost's graph equals llama.cpp's node for node (order, name, op, type, ne,
sources): attention sinks on FLASH_ATTN_EXT / SOFT_MAX, the sliding-window pattern, Q/K/V
and output biases, the router bias, per-expert biases (ADD_ID), SWIGLU_OAI, softmax over
the chosen experts' logits, and the output rows picked after the layers.

llama.cpp (through llama-cpp-python) reports every node its scheduler runs via cb_eval;
see graphcost/judge/oracle.py. Fixtures: tests/fixtures_gptoss.py (MXFP4 experts by default).
"""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures_gptoss as G
from parity import assert_same_graph, fa_off_on, graph_cases, needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_gptoss")
    return {
        # 3 layers (0, 2 sliding, window 40), 5 MXFP4 experts of 160, 2 used, head_dim 64
        "gptoss": G.write_gptoss(d / "gptoss.gguf"),
        # one expert used: the CONT after the single view; per-layer pattern (layer 1 slides
        # only), no YaRN; Q8_0 experts
        "gptoss_k1": G.write_gptoss(d / "gptoss_k1.gguf", n_expert_used=1, n_layer=2,
                                    swa_pattern=[False, True], yarn=False,
                                    weight_types={"ffn_gate_exps": QT.Q8_0,
                                                  "ffn_up_exps": QT.Q8_0,
                                                  "ffn_down_exps": QT.Q4_0}),
        # 4 layers, 3 of 7 experts used (two aggregation ADDs), head_dim 32 (no Hadamard
        # rotation for quantized caches), 8 heads over 4 KV heads
        "gptoss_k3": G.write_gptoss(d / "gptoss_k3.gguf", n_embd=224, n_head=8, n_head_kv=4,
                                    head_dim=32, n_ff_exp=96, n_layer=4, n_expert=7,
                                    n_expert_used=3, sliding_window=17),
    }


CASES = [
    # (model, settings)
    ("gptoss", dict(tokens=1, past=3)),
    ("gptoss", dict(tokens=9, past=0)),
    ("gptoss", dict(tokens=5, past=300, n_outputs=2)),
    ("gptoss", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600)),
    ("gptoss", dict(tokens=3, past=2, swa_full=True)),
    ("gptoss", dict(tokens=1, past=0, type_k="q8_0")),
    ("gptoss", dict(tokens=6, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("gptoss_k1", dict(tokens=1, past=2)),
    ("gptoss_k1", dict(tokens=7, past=0, n_outputs=7)),
    ("gptoss_k3", dict(tokens=1, past=50)),
    ("gptoss_k3", dict(tokens=8, past=0, n_outputs=3)),
    ("gptoss_k3", dict(tokens=2, past=1, type_k="q4_0", type_v="q4_0", fa=True)),
]


@graph_cases(CASES)
def test_fixture_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


@fa_off_on
def test_gptoss_graph_has_its_ops(models, fa):
    # guard against a vacuous pass: sinks, expert biases and SWIGLU_OAI are really built
    recs = our_records(models["gptoss"], tokens=2, flash_attn=fa)
    ops = [r["op"] for r in recs]
    assert ops.count("MUL_MAT_ID") == 3 * 3 and ops.count("ADD_ID") == 3 * 3
    assert ops.count("SWIGLU_OAI") == 3
    attn = [r for r in recs if r["op"] == "FLASH_ATTN_EXT" or r["name"].startswith("kq_soft_max")]
    assert [r["src"][-1] for r in attn] == [f"blk.{il}.attn_sinks.weight" for il in range(3)]


def test_llama_cpp_runs_the_mxfp4_fixture_to_finite_logits(models):
    # the random MXFP4 experts, biases and sinks give finite logits, the same greedy tokens
    # with and without flash attention (so the fixture exercises real arithmetic)
    import numpy as np

    from graphcost.judge.oracle import run_model
    runs = [run_model(models["gptoss"], prompt=[5, 17, 40, 99, 123], greedy=3, flash_attn=fa)
            for fa in (False, True)]
    for r in runs:
        assert all(np.isfinite(lg).all() for lg in r["logits"])
    assert runs[0]["tokens"] == runs[1]["tokens"]
