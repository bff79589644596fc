"""The bert and nomic-bert graphs equal llama.cpp's, node for node: no KV cache (llama.cpp
encodes: every token is an output), flash attention off and on (on casts the F32 K and V
to F16), embeddings on (each pooling type the GGUF can name: NONE, MEAN, CLS, LAST, RANK
with and without classification heads) and off (no pooling); nomic-bert: RoPE on Q and
K, no position embeddings, SwiGLU FFN, fused or separate QKV. The
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
encoder's graph shape and the keys bert requires."""
from __future__ import annotations

import pytest

import fixtures_encoder as E
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError
from graphcost.graph.settings import RunSettings
from parity import our_records


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
