"""Hybrid (recurrent + attention) models: lfm2, lfm2moe, granitehybrid, qwen3next, qwen35,
qwen35moe, nemotron_h. Their graphs equal llama.cpp's node for node (a fresh sequence,
past 0, zeroes the recurrent state in place; a continued one does not) and their memory
(the KV cache of the attention layers and the recurrent state, ``RS buffer size``)
llama.cpp's log (the graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
recurrent state's bytes, the recurrent ops' costs, the keys each family requires."""
from __future__ import annotations

import pytest

import fixtures_hybrid as H
from graphcost.graph.build import build_graph, load_model
from graphcost.memory.plan import plan_memory
from graphcost.graph.settings import RunSettings


def test_lfm2_recurrent_state_bytes(models):
    """R: one F32 row of n_embd_r = n_embd * (l_cache - 1) per conv layer, S empty."""
    plan = plan_memory(load_model(models["lfm2"]), RunSettings(ctx_size=4096))
    (st,) = plan.states
    # 3 conv layers x 160 * (3 - 1) floats x 4 bytes = 3 x 1280 = 3840 (1280 is 32-aligned)
    assert (st.cells, st.layers, st.r_bytes, st.s_bytes) == (1, 3, 3840, 0)
    # it does not grow with the context, unlike the KV cache (2 attention layers)
    big = plan_memory(load_model(models["lfm2"]), RunSettings(ctx_size=32768))
    assert big.recurrent_state_bytes == plan.recurrent_state_bytes
    # KV: 2 layers x (K + V) x 32 (1 KV head of 32) x cells x 2 bytes (F16)
    assert plan.kv_cache_bytes == 2 * 2 * 32 * 4096 * 2
    assert big.kv_cache_bytes == 8 * plan.kv_cache_bytes
    assert plan.total_bytes == (plan.weights_bytes + plan.kv_cache_bytes + 3840
                                + plan.compute_buffer_bytes + plan.output_buffer_bytes)


def test_lfm2_fresh_sequence_zeroes_its_state(models):
    """past 0: build_rs zeroes cell rs_z = 0 in place (SCALE by 0 of n_embd_r floats);
    a continued sequence has rs_z = -1 and the view is empty."""
    m = load_model(models["lfm2"])

    def zeroing(past):
        bg = build_graph(m, RunSettings(tokens=2, past=past))
        return [n.ne[0] for n in bg.nodes if n.op == "SCALE" and n.storage.role == "kv"]
    assert zeroing(0) == [160 * 2] * 3
    assert zeroing(5) == [0] * 3


def test_ssm_conv_cost(models):
    """SSM_CONV: a d_conv-long dot product per output element (ggml_compute_forward_ssm_conv_f32)."""
    from graphcost.cost.costs import op_cost
    bg = build_graph(load_model(models["lfm2"]), RunSettings(tokens=4, past=2))
    conv = [n for n in bg.nodes if n.op == "SSM_CONV"]
    assert [n.name for n in conv] == [f"model.layers.{{}}.conv.conv-{il}" for il in (0, 1, 3)]
    c = op_cost(conv[0])
    # kernel width 3, output [160, 4, 1]: 3 * 640 = 1920 multiplies and as many adds
    assert (c.ops["mul"], c.ops["add"]) == (1920, 1920)
    # reads sx [2 + 4, 160] F32 = 3840 B and the kernel [3, 160] F32 = 1920 B; writes 640 * 4
    assert (c.reads, c.write) == ((3840, 1920), 2560)


def test_granitehybrid_recurrent_state_bytes(models):
    """Mamba-2: R = (d_conv - 1) * (d_inner + 2 * n_group * d_state) floats, S = d_state *
    d_inner floats, per recurrent layer, one cell."""
    plan = plan_memory(load_model(models["granitehybrid"]), RunSettings(ctx_size=4096))
    (st,) = plan.states
    # R: 3 layers x 3 * (192 + 2 * 2 * 16) = 768 floats x 4 B = 3 x 3072 = 9216
    # S: 3 layers x 16 * 192 = 3072 floats x 4 B = 3 x 12288 = 36864
    assert (st.cells, st.layers, st.r_bytes, st.s_bytes) == (1, 3, 9216, 36864)


def test_ssm_scan_cost(models):
    from graphcost.cost.costs import op_cost
    bg = build_graph(load_model(models["granitehybrid"]), RunSettings(tokens=2, past=5))
    scans = [n for n in bg.nodes if n.op == "SSM_SCAN"]
    assert len(scans) == 3
    c = op_cost(scans[0])
    # 2 tokens x 6 heads = 12 (th); x head_dim 32 = 384 (thd); x d_state 16 = 6144 (thds)
    # mul = th (dA) + thd (x*dt) + 3 thds = 12 + 384 + 18432; add = th (softplus) + 2 thds
    assert (c.ops["mul"], c.ops["add"], c.ops["exp"], c.ops["log"]) == (18828, 12300, 24, 12)
    # reads: the state row 16*32*6*4 = 12288, x [32, 6, 2] 1536, dt [6, 2] 48, A [1, 6] 24,
    # B and C [16, 2, 2] 256 each, ids 4; writes y (384) + state (3072) floats = 13824 B
    assert c.reads == (12288, 1536, 48, 24, 256, 256, 4)
    assert c.write == 13824


def test_qwen3next_layers_and_state(models):
    """is_recr: (il + 1) % interval != 0 (default 4, or the file's key); the delta state is
    S_v x S_v per V head: n_embd_s = d_state * d_inner."""
    m = load_model(models["qwen3next"])
    assert m.is_recr == (True, True, True, False)
    assert load_model(models["qwen3next_i3"]).is_recr == (True, True, False, True, True)
    (st,) = plan_memory(m, RunSettings(ctx_size=4096)).states
    # R: 3 layers x (4 - 1) * (128 + 2 * 2 * 32) = 768 floats x 4 B = 3 x 3072 = 9216
    # S: 3 layers x 32 * 128 = 4096 floats x 4 B = 3 x 16384 = 49152
    assert (st.layers, st.r_bytes, st.s_bytes) == (3, 9216, 49152)


def test_gated_delta_net_cost(models):
    from graphcost.cost.costs import op_cost
    bg = build_graph(load_model(models["qwen3next"]), RunSettings(tokens=2, past=5))
    gdn = [n for n in bg.nodes if n.op == "GATED_DELTA_NET"]
    assert len(gdn) == 3
    c = op_cost(gdn[0])
    # S = 32, 4 V heads x 2 tokens = 8 (token, head) pairs:
    # mul 8 * (4 * 32^2 + 2 * 32) = 33280, add 8 * (3 * 32^2 + 32) = 24832, exp 8
    assert (c.ops["mul"], c.ops["add"], c.ops["exp"]) == (33280, 24832, 8)
    # q, k (repeated to 4 heads), v: [32, 4, 2] F32 = 1024 B each; g, beta [1, 4, 2] 32 B;
    # state [32, 32, 4] 16384 B; writes [128, 2 + 32] F32 = 17408 B
    assert c.reads == (1024, 1024, 1024, 32, 32, 16384)
    assert c.write == 17408


def test_nemotron_h_memory_holds_only_its_kind_of_layer(models):
    """create_memory's filters: the KV cache holds the attention layers (not the MLP-only
    ones), the recurrent state the Mamba-2 layers."""
    m = load_model(models["nemotron_h"])
    assert m.is_recr == (True, False, True, False, False, True)  # M - M * - M
    plan = plan_memory(m, RunSettings(ctx_size=4096))
    ((cache,), (st,)) = (plan.caches, plan.states)
    # KV: layer 3 only: (K + V) x 32 (1 KV head of 32) x 4096 cells x 2 bytes (F16)
    assert (cache.layers, plan.kv_cache_bytes) == (1, 2 * 32 * 4096 * 2)
    # R: 3 layers x (4 - 1) * (128 + 2 * 2 * 16) = 576 floats x 4 B = 3 x 2304 = 6912
    # S: 3 layers x 16 * 128 = 2048 floats x 4 B = 3 x 8192 = 24576
    assert (st.layers, st.r_bytes, st.s_bytes) == (3, 6912, 24576)


def test_relu_sqr_costs(models):
    from graphcost.cost.costs import op_cost
    bg = build_graph(load_model(models["nemotron_h"]), RunSettings(tokens=2, past=5))
    relu = next(n for n in bg.nodes if n.op == "RELU")
    sqr = next(n for n in bg.nodes if n.op == "SQR")
    assert (relu.name, sqr.name) == ("ffn_relu-1", "ffn_sqr(relu)-1")
    # [160, 2]: 320 compare-selects, 320 multiplies, each reading and writing 1280 bytes
    assert op_cost(relu).ops == {"max": 320} and op_cost(sqr).ops == {"mul": 320}
    assert op_cost(sqr).reads == (1280,) and op_cost(sqr).write == 1280


@pytest.mark.parametrize("writer,key", [
    (lambda p: H.write_lfm2(p), "lfm2.shortconv.l_cache"),
    (lambda p: H.write_granitehybrid(p), "granitehybrid.ssm.state_size"),
    (lambda p: H.write_qwen3next(p), "qwen3next.ssm.conv_kernel"),
], ids=["lfm2", "granitehybrid", "qwen3next"])
def test_missing_required_key_is_one_line_exit_2(tmp_path, writer, key):
    """A hybrid file without a key its load_arch_hparams requires: one line, exit 2."""
    import subprocess
    import sys

    import gguf
    src = writer(tmp_path / "src.gguf").path
    reader = gguf.GGUFReader(src)
    out = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for name, f in reader.fields.items():
        if name == key or name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vtype)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = subprocess.run([sys.executable, "-m", "graphcost", "analyze", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and key in r.stderr, r.stderr


def test_memory_document_breakdown_adds_up_with_the_recurrent_state(models):
    """``graphcost memory`` (and its HTML page) lists the recurrent state beside the KV
    cache, and the parts add up to the total."""
    from graphcost.document import memory_document
    doc = memory_document(plan_memory(load_model(models["granitehybrid"]), RunSettings(ctx_size=4096)))
    b = doc["breakdown"]
    # 3 Mamba-2 layers: R 9216 + S 36864 bytes (test_granitehybrid_recurrent_state_bytes)
    assert b["recurrent_states"] == [{"cells": 1, "layers": 3, "r_bytes": 9216, "s_bytes": 36864,
                                      "bytes": 46080}]
    assert b["total_bytes"] == (b["weights_bytes"] + b["kv_cache_bytes"] + b["recurrent_state_bytes"]
                                + b["compute_buffer_bytes"] + b["output_buffer_bytes"])
