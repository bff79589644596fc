"""The gemma3n graph equals llama.cpp's, node for node (order, name, op, type, ne, sources):
per-layer embeddings, AltUp predict/correct, LAuReL, activation sparsity (layers < 10),
KV sharing (layers >= 20 attend layer 18's or 19's cache), for decode and prefill, flash
attention off and on, quantized KV caches (head_dim 64: Hadamard rotations), several
outputs. Fixtures: tests/fixtures_gemma3n.py; comparison: tests/parity.py."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures_gemma3n as G
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError
from graphcost.graph.settings import RunSettings
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_gemma3n")
    return {
        # 6 layers: 5 sliding + 1 global, all with activation sparsity, 3 heads of 64 over 1
        "gemma3n": G.write_gemma3n(d / "gemma3n.gguf"),
        # 25 layers: 20..23 (sliding) read layer 18's cache, 24 (global) layer 19's;
        # layers 10.. without sparsity; fused QKV, untied output, 2 KV heads of 32
        "gemma3n_shared": G.write_gemma3n(d / "gemma3n_shared.gguf", n_layer=25, n_embd=96,
                                          n_head=4, n_head_kv=2, head_dim=32, n_ff=192,
                                          fused_qkv=True, tie_embeddings=False,
                                          weight_types={"attn_qkv": QT.Q8_0}),
    }


CASES = [
    # (model, settings); fa=True: the case needs flash attention (quantized V cache)
    ("gemma3n", dict(tokens=1, past=3)),
    ("gemma3n", dict(tokens=7, past=0)),
    ("gemma3n", dict(tokens=5, past=40, n_outputs=3)),
    ("gemma3n", dict(tokens=2, past=1, type_k="q8_0")),
    ("gemma3n", dict(tokens=3, past=2, type_k="q8_0", type_v="q4_0", fa=True)),
    ("gemma3n", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600, swa_full=True)),
    ("gemma3n_shared", dict(tokens=1, past=5)),
    ("gemma3n_shared", dict(tokens=6, past=0, n_outputs=2)),
    ("gemma3n_shared", dict(tokens=2, past=3, type_k="q8_0", type_v="q8_0", fa=True)),
]


@needs_llama_cpp
@graph_cases(CASES)
def test_gemma3n_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


def test_gemma3n_kv_sharing_layers_have_no_cache(tmp_path):
    fx = G.write_gemma3n(tmp_path / "g.gguf", n_layer=25, n_embd=96, n_head=4, n_head_kv=2,
                         head_dim=32, n_ff=192)
    bg = build_graph(load_model(fx), RunSettings(ctx_size=512, tokens=1))
    base, swa = bg.caches
    # pattern 5: layers 4, 9, 14, 19 (and 24) are global; only layers < 20 have buffers
    assert base.layers == (4, 9, 14, 19) and swa.layers == tuple(
        il for il in range(20) if il % 5 != 4)
    assert base.reuse == {24: 19} and swa.reuse == {20: 18, 21: 18, 22: 18, 23: 18}
    # a sharing layer stores nothing: SET_ROWS only for the 20 layers with KV (K and V)
    assert sum(n.op == "SET_ROWS" for n in bg.nodes) == 2 * 20


def test_gemma3n_without_sliding_window_is_refused(tmp_path):
    # load_arch_hparams reads attention.sliding_window as required: llama.cpp refuses the file
    fx = G.write_gemma3n(tmp_path / "g.gguf", n_layer=1, sliding_window=None)
    with pytest.raises(GraphcostError, match=r"'gemma3n\.attention\.sliding_window' is missing"):
        our_records(fx, tokens=1)
