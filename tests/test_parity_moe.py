"""Mixture of experts (llama with Mixtral-style experts, qwen3moe) and gemma2: their graphs
equal llama.cpp's node for node (the cases are in tests/test_parity.py's table); here: the
expert ops are really built."""
from __future__ import annotations

from parity import needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


def test_moe_graph_has_the_expert_ops(models):
    # guard against a vacuous pass: the MoE branch really is built (3 MUL_MAT_ID per layer)
    ops = [r["op"] for r in our_records(models["mixtral"], tokens=2)]
    assert ops.count("MUL_MAT_ID") == 3 * 3
    assert ops.count("ARGSORT") == 3 and ops.count("SUM_ROWS") == 3 and ops.count("CLAMP") == 3
