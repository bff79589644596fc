"""ernie4_5-moe (ERNIE 4.5 MoE) and minimax-m2 (MiniMax-M2): their graphs equal
llama.cpp's node for node (the graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: each
family's constructs, and minimax-m2 without a gating function refused."""
from __future__ import annotations

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.errors import UnsupportedError
from graphcost.graph.settings import RunSettings
from parity import needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


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
