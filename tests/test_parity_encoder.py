"""The bert and nomic-bert graphs equal llama.cpp's, node for node (order, name, op, type, ne, sources):
no KV cache (llama.cpp encodes: every token is an output), flash attention off and on
(on casts the F32 K and V to F16), embeddings on (each pooling type the GGUF can name:
NONE, MEAN, CLS, LAST, RANK with and without classification heads) and off (no pooling);
nomic-bert: RoPE on Q and K, no position embeddings, SwiGLU FFN, fused or separate QKV.
Fixtures: tests/fixtures_encoder.py; comparison: tests/parity.py."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT
from gguf import PoolingType as PT

import fixtures_encoder as E
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError
from graphcost.graph.settings import RunSettings
from parity import assert_same_graph, graph_cases, needs_llama_cpp, our_records



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_encoder")
    return {
        # 5 heads of 32, two token types, separate Q/K/V with biases, MEAN pooling
        "bert": E.write_bert(d / "bert.gguf"),
        # CLS pooling, 3 heads of 64, no token_types tensor, fused QKV + bias, 3 layers
        "bert_cls": E.write_bert(d / "bert_cls.gguf", n_embd=192, n_head=3, n_ff=352,
                                 n_layer=3, pooling=PT.CLS, token_types=0, fused_qkv=True,
                                 weight_types={"attn_qkv": QT.Q8_0}),
        # LAST pooling, no biases on Q/K/V, output or FFN, 1 layer
        "bert_last": E.write_bert(d / "bert_last.gguf", n_layer=1, pooling=PT.LAST,
                                  qkv_bias=False, out_bias=False, ffn_bias=False),
        # no pooling_type key (NONE), no causal key
        "bert_none": E.write_bert(d / "bert_none.gguf", pooling=None, causal=None, n_layer=1),
        # RANK with both heads (cls + tanh, cls.output with 3 labels)
        "bert_rank": E.write_bert(d / "bert_rank.gguf", pooling=PT.RANK, cls=True, cls_out=3,
                                  n_layer=1),
        # RANK with only cls.output (1 label: a reranker score)
        "bert_rank_out": E.write_bert(d / "bert_rank_out.gguf", pooling=PT.RANK, cls_out=1,
                                      n_layer=1),
        # nomic-bert: 5 heads of 32, fused QKV without bias (as nomic-embed-text), MEAN
        "nomic": E.write_bert(d / "nomic.gguf", arch="nomic-bert", fused_qkv=True,
                              qkv_bias=False, out_bias=False, ffn_bias=False, n_layer=3),
        # separate Q/K/V with biases, output bias, no token_types tensor, CLS pooling
        "nomic_sep": E.write_bert(d / "nomic_sep.gguf", arch="nomic-bert", n_embd=192,
                                  n_head=3, n_ff=352, token_types=0, pooling=PT.CLS,
                                  ffn_bias=False),
    }


CASES = [
    # (model, settings); llama.cpp outputs every token (n_outputs is ignored)
    ("bert", dict(tokens=1, embeddings=True)),
    ("bert", dict(tokens=7, embeddings=True)),
    ("bert", dict(tokens=7, embeddings=False)),
    ("bert", dict(tokens=5, past=3, embeddings=True)),  # past: nothing kept, same graph
    ("bert", dict(tokens=13, n_ubatch=16, n_ctx=256, embeddings=True)),
    ("bert_cls", dict(tokens=1, embeddings=True)),
    ("bert_cls", dict(tokens=9, embeddings=True)),
    ("bert_last", dict(tokens=4, embeddings=True)),
    ("bert_none", dict(tokens=6, embeddings=True)),
    ("bert_none", dict(tokens=2, embeddings=False)),
    ("bert_rank", dict(tokens=5, embeddings=True)),
    ("bert_rank_out", dict(tokens=3, embeddings=True)),
    ("nomic", dict(tokens=1, embeddings=True)),
    ("nomic", dict(tokens=9, embeddings=True)),
    ("nomic", dict(tokens=4, embeddings=False)),
    ("nomic_sep", dict(tokens=6, embeddings=True)),
]


@needs_llama_cpp
@graph_cases(CASES)
def test_encoder_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


def test_bert_has_no_kv_cache_and_outputs_every_token(tmp_path):
    fx = E.write_bert(tmp_path / "b.gguf", n_layer=1)
    bg = build_graph(load_model(fx), RunSettings(ctx_size=512, tokens=6, outputs=1,
                                                 embeddings=True))
    assert bg.caches == [] and bg.run.n_outputs == 6
    out_ids = next(t for t in bg.leafs if t.name == "out_ids")
    assert out_ids.ne == (6, 1, 1, 1)
    # MEAN pooling: [n_embd, T]^T x mean [T, 1] -> [n_embd, 1]
    assert bg.nodes[-1].name == "result_embd_pooled" and bg.nodes[-1].ne == (160, 1, 1, 1)
    mask = next(t for t in bg.leafs if t.name == "self_kq_mask")
    assert mask.ne == (6, 6, 1, 1)  # no KV cells: tokens x tokens


def test_bert_without_layer_norm_epsilon_is_refused(tmp_path):
    # llama_model_bert::load_arch_hparams reads it as required: llama.cpp refuses the file
    fx = E.write_bert(tmp_path / "b.gguf", n_layer=1, norm_eps=None)
    with pytest.raises(GraphcostError, match=r"'bert\.attention\.layer_norm_epsilon' is missing"):
        our_records(fx, tokens=1)
