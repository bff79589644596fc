"""The gemma4 graph equals llama.cpp's, node for node: sliding and full layers with
different head sizes (the transposed V cache is as wide as the widest layer, narrower V
rows are PADded), proportional RoPE factors on full layers, per-layer embeddings, KV
sharing of the last layers, V = K without ``attn_v``, output scales; the 26B-A4B mixture
of experts (router on attn_out with its own norm and scale, shared dense MLP, separate or
merged gate/up experts, per-expert output scales); decode and prefill, flash attention
off and on, quantized KV caches (Hadamard rotations), several outputs. The
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: caches
and head sizes, the MoE layers, refusals."""
from __future__ import annotations

import pytest

import fixtures_gemma4 as G
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.settings import RunSettings
from parity import our_records


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


def test_gemma4_moe_layers(models):
    # build_lora_mm_id's per-expert scale on ffn_moe_down: RESHAPE [1, 5, 1], REPEAT
    # [1, 5, T], GET_ROWS by the 3 chosen experts [1, 3, T], MUL; on MoE layers only
    recs = {r["name"]: r for r in our_records(models["gemma4_moe"], tokens=4)}
    assert recs["ffn_moe_down_scaled-0"]["op"] == "MUL"
    assert recs["ffn_moe_down_scaled-0"]["ne"][:3] == [160, 3, 4]
    assert recs["ffn_moe_logits-2"]["ne"][:2] == [5, 4]
    assert "ffn_moe_combined-5" in recs and "ffn_moe_combined-4" not in recs
    assert "ffn_out-4" in recs and "ffn_out-5" not in recs
    merged = {r["name"] for r in our_records(models["gemma4_moe_merged"], tokens=4)}
    assert "ffn_moe_gate_up-0" in merged and not any(n.startswith("ffn_moe_down_scaled") for n in merged)


def test_unmodelled_weight_scale_is_refused(tmp_path):
    # llama.cpp multiplies blk.0.attn_q.scale into Q (build_lora_mm's w_s); graphcost's
    # gemma4 reads only the router's and the experts' scales, so it refuses the file
    fx = G.write_gemma4(tmp_path / "g.gguf", n_embd_per_layer=0, extra_scales=("attn_q",))
    with pytest.raises(UnsupportedError, match=r"weight scale 'blk\.0\.attn_q\.scale'"):
        our_records(fx, tokens=1)


def test_gemma4_without_pattern_is_refused(tmp_path):
    # load_arch_hparams reads the sliding-window pattern array as required
    fx = G.write_gemma4(tmp_path / "g.gguf", write_pattern=False)
    with pytest.raises(GraphcostError,
                       match=r"'gemma4\.attention\.sliding_window_pattern' is missing"):
        our_records(fx, tokens=1)
