"""glm4moe (GLM-4.5, GLM-4.5-Air, GLM-4.6): graphcost's graph equals llama.cpp's node for
node (order, name, op, type, ne, sources), through llama-cpp-python's cb_eval
(graphcost/judge/oracle.py), on tiny models from tests/fixtures_deepseek.py. The files carry
NextN/MTP blocks after the trunk, which llama.cpp's trunk graph and KV cache leave out.
"""
from __future__ import annotations

import pytest

import fixtures_deepseek as D
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import SettingsError
from graphcost.judge.oracle import OracleError, capture_graph
from graphcost.graph.settings import RunSettings
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_glm4moe")
    return {
        # 3 trunk layers + 1 NextN block; 4 heads of 96 over 2 KV heads, rope on 48 of 96;
        # layer 0 dense; 6 experts of 64, 2 used, one shared; no gating key (sigmoid)
        "glm45": D.write_glm4moe(d / "glm45.gguf"),
        # GLM-4.5 355B style: per-head Q/K norms, head_dim 64 (Hadamard rotation for
        # quantized caches), 5 heads over 1 KV head, 2 dense layers, 1 expert used (CONT),
        # explicit sigmoid gating, no norm/scale keys, tied output, no NextN block
        "glm45_qknorm": D.write_glm4moe(d / "glm45_qknorm.gguf", n_embd=320, n_head=5,
                                        n_head_kv=1, head_dim=64, n_rot=32, n_layer=4,
                                        n_nextn=0, n_layer_dense_lead=2, n_expert=5,
                                        n_expert_used=1, n_expert_shared=2, qk_norm=True,
                                        gating=2, weights_norm=None, weights_scale=None,
                                        tie_embeddings=True),
        # head_dim 48: a Q8_0 block (32) does not divide it
        "glm_hd48": D.write_glm4moe(d / "glm_hd48.gguf", n_head=6, head_dim=48, n_rot=24,
                                    n_layer=2, n_nextn=0),
    }


CASES = [
    # (model, settings)
    ("glm45", dict(tokens=1, past=3)),
    ("glm45", dict(tokens=7, past=0)),
    ("glm45", dict(tokens=5, past=300, n_outputs=2)),
    ("glm45", dict(tokens=1, past=0, type_k="q8_0")),
    ("glm45", dict(tokens=3, past=2, type_k="q8_0", type_v="q4_0", fa=True)),
    ("glm45_qknorm", dict(tokens=1, past=2)),
    ("glm45_qknorm", dict(tokens=6, past=0, n_outputs=3)),
    ("glm45_qknorm", dict(tokens=2, past=1, type_k="q4_0")),
    ("glm45_qknorm", dict(tokens=4, past=0, type_k="q8_0", type_v="q8_0", fa=True)),
]


@graph_cases(CASES)
def test_glm4moe_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


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
