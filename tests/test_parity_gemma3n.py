"""The gemma3n graph equals llama.cpp's, node for node: per-layer embeddings, AltUp
predict/correct, LAuReL, activation sparsity (layers < 10), KV sharing (layers >= 20
attend layer 18's or 19's cache), for decode and prefill, flash attention off and on,
quantized KV caches (head_dim 64: Hadamard rotations), several outputs. The
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: KV
sharing and the keys gemma3n requires."""
from __future__ import annotations

import pytest

import fixtures_gemma3n as G
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError
from graphcost.graph.settings import RunSettings
from parity import our_records


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
