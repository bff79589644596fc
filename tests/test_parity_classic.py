"""gpt2, starcoder2, falcon and phi3 graphs equal llama.cpp's, node for node (order, name,
op, type, ne, sources), for decode and prefill, with flash attention off and on and with
quantized KV caches. Fixtures: tests/fixtures_classic.py; comparison: tests/parity.py."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures_classic as C
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import capture_graph
from parity import assert_same_graph, graph_cases, needs_llama_cpp

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_classic")
    return {
        # 3 heads of 64 (Hadamard for quantized KV), fused QKV + bias, position embeddings
        "gpt2": C.write_gpt2(d / "gpt2.gguf"),
        # 5 heads of 32, odd FFN and vocab, tied output, Q8_0 QKV
        "gpt2_odd": C.write_gpt2(d / "gpt2_odd.gguf", n_embd=160, n_head=5, n_ff=416,
                                 n_vocab=299, tie_embeddings=True, context_length=600,
                                 weight_types={"attn_qkv": QT.Q8_0}),
        # separate Q/K/V with biases, GQA 8/2, tied
        "starcoder2": C.write_starcoder2(d / "starcoder2.gguf"),
        # fused QKV with bias, untied
        "starcoder2_fused": C.write_starcoder2(d / "starcoder2_fused.gguf", fused_qkv=True,
                                               tie_embeddings=False, n_layer=1),
        # Falcon-7B style: one LayerNorm feeds attention and FFN, MQA (5 heads, 1 KV head)
        "falcon": C.write_falcon(d / "falcon.gguf"),
        # Falcon-40B style: attn_norm_2 for attention, GQA 8/2, tied
        "falcon40": C.write_falcon(d / "falcon40.gguf", n_embd=256, n_head=8, n_head_kv=2,
                                   n_ff=1024, attn_norm_2=True, tie_embeddings=True),
        # fused QKV, head_dim 96, LongRoPE factors (long above 256 cells of context)
        "phi3": C.write_phi3(d / "phi3.gguf"),
        # fused QKV with separate Q/K/V biases (CONCAT), GQA 4/2 of 64, no rope factors
        "phi3_gqa": C.write_phi3(d / "phi3_gqa.gguf", n_embd=256, n_head=4, n_head_kv=2,
                                 qkv="fused_split_bias", rope_factors=False, n_layer=1),
        # separate Q/K/V, LongRoPE factors
        "phi3_sep": C.write_phi3(d / "phi3_sep.gguf", n_embd=256, n_head=4, n_head_kv=2,
                                 qkv="separate", n_layer=1),
    }


CASES = [
    # (model, settings); fa=True: the case needs flash attention (quantized V cache)
    ("gpt2", dict(tokens=1, past=3)),
    ("gpt2", dict(tokens=7, past=0)),
    ("gpt2", dict(tokens=5, past=300, n_outputs=2)),
    ("gpt2", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("gpt2_odd", dict(tokens=4, past=2, type_k="q4_0")),
    ("starcoder2", dict(tokens=1, past=3)),
    ("starcoder2", dict(tokens=6, past=0, n_outputs=3)),
    ("starcoder2", dict(tokens=3, past=2, type_k="q8_0", type_v="q4_0", fa=True)),
    ("starcoder2_fused", dict(tokens=2, past=1)),
    ("falcon", dict(tokens=1, past=3)),
    ("falcon", dict(tokens=7, past=0)),
    ("falcon", dict(tokens=4, past=100, n_outputs=2, type_k="q8_0")),
    ("falcon", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("falcon40", dict(tokens=3, past=1)),
    ("phi3", dict(tokens=1, past=3)),
    ("phi3", dict(tokens=6, past=0, n_outputs=2)),
    # n_ctx 256 is not above the original context: the short factors
    ("phi3", dict(tokens=3, past=2, n_ctx=256)),
    ("phi3", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("phi3_gqa", dict(tokens=5, past=0, type_k="q8_0")),
    ("phi3_sep", dict(tokens=1, past=2)),
]


@graph_cases(CASES)
def test_fixture_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


@pytest.mark.parametrize("model", ["gpt2", "phi3_gqa"])
def test_fused_qkv_views_have_llama_cpp_strides(models, model):
    """The Q/K/V slices of the fused projection are strided views: their byte strides and
    offsets (what a kernel reads) equal llama.cpp's, as do those of every other node."""
    kw = dict(n_ctx=512, n_ubatch=512, flash_attn=False, tokens=3, past=2)
    theirs = capture_graph(models[model], details=True, **kw)
    bg = build_graph(load_model(models[model]),
                     RunSettings(ctx_size=512, ubatch_size=512, batch_size=512,
                                 flash_attn="off", tokens=3, past=2))
    assert len(bg.nodes) == len(theirs)
    views = 0
    for ours, t in zip(bg.nodes, theirs):
        assert (ours.name, list(ours.nb), ours.view_offs) == (t["name"], t["nb"], t["view_offs"])
        views += ours.name.startswith(("Qcur-", "Kcur-", "Vcur-")) and ours.op == "VIEW"
    assert views > 0


@pytest.mark.parametrize("n_ctx,which", [(256, "short"), (512, "long")], ids=["short", "long"])
def test_phi3_rope_factors_follow_context_size(models, n_ctx, which):
    """llama_model::get_rope_factors: the long factors only when n_ctx_seq exceeds
    rope.scaling.original_context_length (256 in the fixture)."""
    bg = build_graph(load_model(models["phi3"]),
                     RunSettings(ctx_size=n_ctx, ubatch_size=512, batch_size=512,
                                 flash_attn="on", tokens=1))
    factors = {n.src[2].name for n in bg.nodes if n.op == "ROPE"}
    assert factors == {f"rope_factors_{which}.weight"}
