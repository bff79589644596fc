"""qwen2, qwen3, olmo2 and granite: their graphs equal llama.cpp's node for node (the
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
keys granite requires and reads."""
from __future__ import annotations

import pytest

import fixtures_dense as D
from gguf import GGUFValueType as VT
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


# (rope.scaling.type in the file, freq_scale of every ROPE node): llama.cpp reads a missing
# type as "linear", so a factor of 4 alone scales by 1/4; graphcost read it as "none" and
# built freq_scale 1 (QA sweep 2026-11-27); "none" keeps 1 (llama_context)
SCALING_CASES = [(None, 0.25), ("linear", 0.25), ("none", 1.0)]


@pytest.mark.parametrize("scaling,freq_scale", SCALING_CASES, ids=["absent", "linear", "none"])
def test_rope_scaling_factor_without_a_type_is_linear(tmp_path, scaling, freq_scale):
    import struct

    from fixtures import LLAMA_DEFAULT_TYPES
    from gguf_writer import done, embeddings, llama_layers, start
    from graphcost.graph.build import build_graph
    from graphcost.graph.settings import RunSettings
    from graphcost.judge.oracle import capture_graph
    from graphcost.judge.oracle import llama_cpp_available

    sink = start(tmp_path / "m.gguf", "llama", LLAMA_DEFAULT_TYPES, weight_types=None, seed=0,
                 n_embd=64, n_head=2, n_head_kv=1, n_ff=96, n_layer=1, n_vocab=260,
                 context_length=2048, rms_eps=1e-5, rope_freq_base=10000.0, head_dim=None,
                 n_rot=32)
    sink.w.add_rope_scaling_factor(4.0)
    if scaling is not None:
        sink.w.add_key_value("llama.rope.scaling.type", scaling, VT.STRING)
    embeddings(sink, 64, 260, False)
    llama_layers(sink, 1, 64, 64, 32, 96)
    fx = done(sink, tie=False)
    graph = build_graph(load_model(fx), RunSettings(ctx_size=256))
    ours = {n.params["freq_scale"] for n in graph.nodes if n.op == "ROPE"}
    assert ours == {freq_scale}
    if llama_cpp_available():
        theirs = {struct.unpack("<f", struct.pack("<i", t["op_params"][6]))[0]
                  for t in capture_graph(fx, n_ctx=256, details=True) if t["op"] == "ROPE"}
        assert theirs == {freq_scale}  # ggml_rope_ext: op_params[6] is freq_scale
