"""glm4moe (GLM-4.5, GLM-4.5-Air, GLM-4.6): the graph equals llama.cpp's node for node
(the graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
NextN/MTP block after the trunk, which llama.cpp's trunk graph and KV cache leave out, and
a quantized K cache that does not divide the head, refused as llama.cpp does."""
from __future__ import annotations

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.errors import SettingsError
from graphcost.judge.oracle import OracleError, capture_graph
from graphcost.graph.settings import RunSettings
from parity import needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


def test_nextn_block_is_left_out(models):
    # 4 blocks in the file, 3 in the graph: one MoE per trunk layer after the dense one
    m = load_model(models["glm45"])
    assert (m.n_layer, m.n_layer_nextn) == (3, 1)
    recs = our_records(models["glm45"], tokens=2)
    ops = [r["op"] for r in recs]
    names = {r["name"] for r in recs}
    assert ops.count("MUL_MAT_ID") == 3 * 2
    assert "l_out-2" in names and "l_out-3" not in names
    assert "ffn_moe_probs_biased-1" in names and "ffn_shexp_out-2" in names


def test_quantized_k_must_divide_the_head(models):
    # llama_init_from_model: "K cache type q8_0 with block size 32 does not divide
    # n_embd_head_k=48" -- graphcost refuses the same settings in one line (and with flash
    # attention off too: settings.refuse_cache_types)
    for fa in ("on", "off"):
        with pytest.raises(SettingsError, match="block size 32 does not divide n_embd_head_k=48"):
            build_graph(load_model(models["glm_hd48"]),
                        RunSettings(ctx_size=512, flash_attn=fa, cache_type_k="q8_0"))
    with pytest.raises(OracleError, match="does not divide"):
        capture_graph(models["glm_hd48"], n_ctx=512, flash_attn=True, type_k="q8_0")
