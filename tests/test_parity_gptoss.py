"""gpt-oss: the graph equals llama.cpp's node for node: attention sinks on FLASH_ATTN_EXT /
SOFT_MAX, the sliding-window pattern, Q/K/V and output biases, the router bias, per-expert
biases (ADD_ID), SWIGLU_OAI, softmax over the chosen experts' logits, and the output rows
picked after the layers (the graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
ops are really built, and llama.cpp runs the MXFP4 fixture to finite logits)."""
from __future__ import annotations

from parity import fa_off_on, needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


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
