"""The dense gemma4 graph equals llama.cpp's, node for node (order, name, op, type, ne,
sources): sliding and full layers with different head sizes (the transposed V cache is as
wide as the widest layer, narrower V rows are PADded), proportional RoPE factors on full
layers, per-layer embeddings, KV sharing of the last layers, V = K without ``attn_v``,
output scales; decode and prefill, flash attention off and on, quantized KV caches
(Hadamard rotations), several outputs. Fixtures: tests/fixtures_gemma4.py; comparison:
tests/parity.py."""
from __future__ import annotations

import pytest

import fixtures_gemma4 as G
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.settings import RunSettings
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_gemma4")
    return {
        # 7 layers (full: 3, 6), heads 128 full / 64 sliding, layers 4..6 share KV,
        # per-layer embeddings of 48, no attn_v on layer 1, output scales on 0 and 6
        "gemma4": G.write_gemma4(d / "gemma4.gguf"),
        # fused QKV, no per-layer embeddings, no sharing, untied, soft-cap 20,
        # 4 heads over 2 KV heads, pattern with the full layer first
        "gemma4_fused": G.write_gemma4(d / "gemma4_fused.gguf", fused_qkv=True,
                                       n_embd_per_layer=0, shared_kv_layers=0,
                                       tie_embeddings=False, final_logit_softcap=20.0,
                                       n_head=4, n_head_kv=2, out_scale_layers=(),
                                       swa_pattern=(False, True, True, True)),
    }


CASES = [
    # (model, settings); fa=True: the case needs flash attention (quantized V cache)
    ("gemma4", dict(tokens=1, past=3)),
    ("gemma4", dict(tokens=7, past=0)),
    ("gemma4", dict(tokens=5, past=60, n_outputs=2)),
    ("gemma4", dict(tokens=2, past=1, type_k="q8_0")),
    ("gemma4", dict(tokens=3, past=2, type_k="q8_0", type_v="q8_0", fa=True)),
    ("gemma4", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600, swa_full=True)),
    ("gemma4_fused", dict(tokens=1, past=2)),
    ("gemma4_fused", dict(tokens=6, past=0, n_outputs=3)),
    ("gemma4_fused", dict(tokens=2, past=3, type_k="q4_0", type_v="q8_0", fa=True)),
]


@needs_llama_cpp
@graph_cases(CASES)
def test_gemma4_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


def test_gemma4_caches_and_head_sizes(tmp_path):
    fx = G.write_gemma4(tmp_path / "g.gguf")
    m = load_model(fx)
    assert [m.head_k(il) for il in range(7)] == [64, 64, 64, 128, 64, 64, 128]
    assert [m.rot(il) for il in range(7)] == [64, 64, 64, 128, 64, 64, 128]
    bg = build_graph(m, RunSettings(ctx_size=512, tokens=1, flash_attn="off"))
    base, swa = bg.caches
    assert base.layers == (3,) and swa.layers == (0, 1, 2)
    assert base.reuse == {6: 3} and swa.reuse == {4: 2, 5: 2}
    # transposed V: every layer's rows are n_embd_v_gqa_max = 128 * 1 KV head
    assert {t.ne[0] for t in swa.v.values()} == {128}
    assert {t.ne[0] for t in swa.k.values()} == {64}


def test_gemma4_moe_is_refused(tmp_path):
    # a router on layer 0 marks the 26B-A4B mixture of experts, which is not modelled
    fx = G.write_gemma4(tmp_path / "g.gguf", n_embd_per_layer=0, shared_kv_layers=0,
                        moe_router=True)
    with pytest.raises(UnsupportedError, match="mixture-of-experts layers"):
        our_records(fx, tokens=1)


def test_gemma4_without_pattern_is_refused(tmp_path):
    # load_arch_hparams reads the sliding-window pattern array as required
    fx = G.write_gemma4(tmp_path / "g.gguf", write_pattern=False)
    with pytest.raises(GraphcostError,
                       match=r"'gemma4\.attention\.sliding_window_pattern' is missing"):
        our_records(fx, tokens=1)
