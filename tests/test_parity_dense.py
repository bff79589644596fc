"""qwen2, qwen3, olmo2 and granite graphs equal llama.cpp's, node for node (order, name,
op, type, ne, sources), for decode and prefill, with flash attention off and on and with
quantized KV caches. Fixtures: tests/fixtures_dense.py; comparison: tests/parity.py."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures_dense as D
from graphcost.graph.build import load_model
from graphcost.errors import GraphcostError
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_dense")
    return {
        # 7 heads of 32 over 1 KV head, Q/K/V biases, untied output with a bias
        "qwen2": D.write_qwen2(d / "qwen2.gguf"),
        # tied embeddings, no output bias, 2 layers
        "qwen2_tied": D.write_qwen2(d / "qwen2_tied.gguf", tie_embeddings=True,
                                    output_bias=False, n_layer=2, n_head_kv=7,
                                    weight_types={"attn_v": QT.Q4_0}),
        # head_dim 64 != n_embd / n_head (q width 384 > n_embd 256): Hadamard for quantized KV
        "qwen3": D.write_qwen3(d / "qwen3.gguf"),
        # untied, head_dim 48 (no Hadamard), 3 KV heads of 6
        "qwen3_hd48": D.write_qwen3(d / "qwen3_hd48.gguf", head_dim=48, n_head_kv=3,
                                    tie_embeddings=False, n_layer=2),
        "olmo2": D.write_olmo2(d / "olmo2.gguf"),
        # OLMo 3 layout: window 32, pattern 4 over 5 layers -> two caches
        "olmo2_swa": D.write_olmo2(d / "olmo2_swa.gguf", sliding_window=32, n_layer=5),
        # fused attn_qkv with a bias: the reshape = false views + CONTs
        "olmo2_fused": D.write_olmo2(d / "olmo2_fused.gguf", fused_qkv=True, qkv_bias=True,
                                     n_head_kv=4, n_layer=2),
        # all multipliers, Q/K/V/O and FFN biases, head_dim 64
        "granite": D.write_granite(d / "granite.gguf"),
        # no rope (rope.scaling.finetuned = false), no residual/embedding/attention scale,
        # tied, rope_freqs present but unused, no biases
        "granite_norope": D.write_granite(d / "granite_norope.gguf", rope_finetuned=False,
                                          tie_embeddings=True, biases=False,
                                          residual_scale=None, embedding_scale=None,
                                          attention_scale=None, rope_freqs=True, n_layer=2),
        # rope on with llama-3 style rope_freqs, no biases
        "granite_freqs": D.write_granite(d / "granite_freqs.gguf", rope_freqs=True,
                                         biases=False, n_layer=2),
    }


CASES = [
    # (model, settings); fa=True: the case needs flash attention (quantized V cache)
    ("qwen2", dict(tokens=1, past=3)),
    ("qwen2", dict(tokens=7, past=0)),
    ("qwen2", dict(tokens=5, past=300, n_outputs=2)),
    ("qwen2", dict(tokens=2, past=1, type_k="q8_0", type_v="q4_0", fa=True)),
    ("qwen2_tied", dict(tokens=3, past=1, type_k="q8_0")),
    ("qwen3", dict(tokens=1, past=5)),
    ("qwen3", dict(tokens=6, past=0, n_outputs=6)),
    ("qwen3", dict(tokens=2, past=1, type_k="q4_0")),
    ("qwen3", dict(tokens=3, past=2, type_k="q8_0", type_v="q8_0", fa=True)),
    ("qwen3_hd48", dict(tokens=4, past=2)),
    ("olmo2", dict(tokens=1, past=3)),
    ("olmo2", dict(tokens=7, past=0, n_outputs=3)),
    ("olmo2", dict(tokens=2, past=0, type_k="q8_0", type_v="q8_0", fa=True)),
    ("olmo2_swa", dict(tokens=1, past=3)),
    ("olmo2_swa", dict(tokens=9, past=0, n_outputs=2)),
    ("olmo2_swa", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600)),
    ("olmo2_swa", dict(tokens=3, past=2, swa_full=True)),
    ("olmo2_fused", dict(tokens=3, past=2)),
    ("granite", dict(tokens=1, past=3)),
    ("granite", dict(tokens=7, past=0)),
    ("granite", dict(tokens=5, past=300, n_outputs=2)),
    ("granite", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("granite_norope", dict(tokens=3, past=1)),
    ("granite_norope", dict(tokens=1, past=2, type_k="q4_0")),
    ("granite_freqs", dict(tokens=2, past=4)),
]


@needs_llama_cpp
@graph_cases(CASES)
def test_dense_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


def test_granite_without_logit_scale_is_refused(tmp_path):
    # granite's load_arch_hparams reads logit_scale as required: llama.cpp refuses the file
    fx = D.write_granite(tmp_path / "g.gguf", logit_scale=None, n_layer=1)
    with pytest.raises(GraphcostError, match=r"'granite\.logit_scale' is missing"):
        our_records(fx, tokens=1)


def test_granite_hparams_are_read(tmp_path):
    fx = D.write_granite(tmp_path / "g.gguf", n_layer=1, rope_finetuned=False)
    m = load_model(fx)
    # float32 in the file: compare with the float32 roundings of 0.22 and 8.0
    assert (round(m.residual_scale, 6), m.logit_scale, m.embedding_scale) == (0.22, 8.0, 12.0)
    assert m.attn_scale == 0.015625 and m.rope_finetuned is False
    assert load_model(D.write_qwen2(tmp_path / "q.gguf", n_layer=1)).rope_finetuned is False
