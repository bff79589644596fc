"""qwen2, qwen3, olmo2 and granite: their graphs equal llama.cpp's node for node (the
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
keys granite requires and reads."""
from __future__ import annotations

import pytest

import fixtures_dense as D
from graphcost.graph.build import load_model
from graphcost.errors import GraphcostError
from parity import our_records


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
