"""Hybrid (recurrent + attention) graphs and memory equal llama.cpp's: lfm2, lfm2moe, granitehybrid,
qwen3next, qwen35, qwen35moe, nemotron_h.

Graphs, node for node (order, name, op, type, ne, sources), for prefill and decode, a
fresh sequence (past 0: the recurrent state is zeroed in place) and a continued one,
several outputs, flash attention off and on, quantized KV caches; fixtures in
tests/fixtures_hybrid.py, comparison in tests/parity.py. Memory: the compute buffer, the
KV cache of the attention layers and the recurrent state buffer (``RS buffer size``) of
llama.cpp's log (graphcost/judge/oracle.py ``capture_log``), at the precision it prints.
"""
from __future__ import annotations


import pytest
from gguf import GGMLQuantizationType as QT

import fixtures_hybrid as H
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.memory.plan import plan_memory
from graphcost.document import document
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import llama_cpp_available, llama_cpp_unavailable_reason
from parity import MiB, capture_logs, memory_case_id, mib2, assert_same_graph, graph_cases, needs_llama_cpp




@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_hybrid")
    return {
        # conv, conv, attn, conv, attn; 5 heads of 32 over 1 KV head; kernel 3; tied
        "lfm2": H.write_lfm2(d / "lfm2.gguf"),
        # attention first, head_dim 64 (Hadamard rotation for quantized KV), kernel 4,
        # 3 heads over 3 KV heads, untied output
        "lfm2_hd64": H.write_lfm2(d / "lfm2_hd64.gguf", n_embd=192, n_head=3, n_head_kv=3,
                                  n_ff=544, pattern=(False, True, True, False), l_cache=4,
                                  tie_embeddings=False, n_vocab=277,
                                  weight_types={"shortconv.in_proj": QT.Q4_0}),
        # lfm2moe: layer 0 dense, then 5 experts (2 used) of 96, sigmoid gating with the
        # expert selection bias
        "lfm2moe": H.write_lfm2(d / "lfm2moe.gguf", n_expert=5),
        # softmax gating, 2 dense layers, 1 expert used, untied
        "lfm2moe_softmax": H.write_lfm2(d / "lfm2moe_softmax.gguf", n_expert=4, n_expert_used=1,
                                        dense_lead=2, gating=1, tie_embeddings=False),
        # mamba2, attn, mamba2, mamba2; 6 SSM heads of 32 in 2 groups, d_state 16,
        # kernel 4; all Granite multipliers, rope on
        "granitehybrid": H.write_granitehybrid(d / "granitehybrid.gguf"),
        # attention first, no rope (rope.scaling.finetuned false), no multipliers, biases,
        # 1 group, d_state 8, kernel 3, untied output, 3 KV heads
        "granitehybrid_plain": H.write_granitehybrid(
            d / "granitehybrid_plain.gguf", pattern=(False, True, False, True, True),
            rope_finetuned=False, embedding_scale=None, residual_scale=None,
            logit_scale=None, attention_scale=None, biases=True, n_group=1, d_state=8,
            d_conv=3, tie_embeddings=False, n_head_kv=3),
        # Granite 4.0 H Tiny/Small layout: 5 experts (2 used) of 224 and a shared expert
        "granitehybrid_moe": H.write_granitehybrid(d / "granitehybrid_moe.gguf", n_expert=5,
                                                   n_ff_shexp=192),
        # 4 experts, 1 used, no shared expert, no rope
        "granitehybrid_moe1": H.write_granitehybrid(d / "granitehybrid_moe1.gguf", n_expert=4,
                                                    n_expert_used=1, rope_finetuned=False),
        # 3 delta net + 1 gated attention layer; 2 K heads, 4 V heads of 32 (REPEAT),
        # kernel 4; 4 heads of 32 over 2 KV heads; 6 experts (2 used) + shared expert
        "qwen3next": H.write_qwen3next(d / "qwen3next.gguf"),
        # interval 3 written in the file over 5 layers (attention at 2), K heads = V heads
        # (no REPEAT), head_dim 64 (Hadamard for quantized KV), kernel 3, tied output
        "qwen3next_i3": H.write_qwen3next(d / "qwen3next_i3.gguf", n_layer=5,
                                          full_attention_interval=3, n_k_heads=3,
                                          n_v_heads=3, head_dim=64, n_head=2, n_head_kv=1,
                                          d_conv=3, tie_embeddings=True, n_expert_used=3),
        # qwen35: separate beta/alpha, IMRoPE sections (4, 6, 6, 0), dense FFN 224; 2 K heads
        # over 4 V heads broadcast by the fused op (no REPEAT); 5 layers, attention at 3
        "qwen35": H.write_qwen3next(d / "qwen35.gguf", arch="qwen35", n_layer=5),
        # qwen35moe: head_dim 64, sections (8, 12, 12, 0), tied output, interval 2
        # merged gate/up experts (ffn_gate_up_exps: one MUL_MAT_ID, two views), 7 of 3
        "qwen35moe_gate_up": H.write_qwen3next(d / "qwen35moe_gate_up.gguf", arch="qwen35moe",
                                               n_expert=7, n_expert_used=3,
                                               gate_up_merged=True),
        "qwen3next_gate_up": H.write_qwen3next(d / "qwen3next_gate_up.gguf", n_layer=2,
                                               full_attention_interval=2,
                                               gate_up_merged=True),
        "qwen35moe": H.write_qwen3next(d / "qwen35moe.gguf", arch="qwen35moe", head_dim=64,
                                       n_head=2, n_head_kv=1, rope_sections=(8, 12, 12, 0),
                                       full_attention_interval=2, tie_embeddings=True),
        # nemotron_h: M - M * - M (Mamba-2, MLP, attention without rope); 4 SSM heads of 32
        # in 2 groups, d_state 16, kernel 4; 3 heads of 32 over 1 KV head; untied
        "nemotron_h": H.write_nemotron_h(d / "nemotron_h.gguf"),
        # attention first and last, biases, head_dim 64 (Hadamard for quantized KV),
        # 6 SSM heads of 32 in 3 groups, d_state 8, kernel 3, tied
        "nemotron_h_b": H.write_nemotron_h(d / "nemotron_h_b.gguf", pattern="*M-M-*",
                                           n_embd=128, n_head=2, n_head_kv=1, d_inner=192,
                                           n_ssm_head=6, n_group=3, d_state=8, d_conv=3,
                                           biases=True, tie_embeddings=True),
    }


CASES = [
    # (model, settings); fa=True: the case needs flash attention (quantized V cache)
    ("lfm2", dict(tokens=1, past=3)),
    ("lfm2", dict(tokens=1, past=0)),
    ("lfm2", dict(tokens=7, past=0)),
    ("lfm2", dict(tokens=6, past=4)),
    ("lfm2", dict(tokens=5, past=300, n_outputs=2)),
    ("lfm2", dict(tokens=2, past=1, type_k="q8_0", type_v="q4_0", fa=True)),
    ("lfm2_hd64", dict(tokens=1, past=2)),
    ("lfm2_hd64", dict(tokens=9, past=0, n_outputs=3)),
    ("lfm2_hd64", dict(tokens=3, past=2, type_k="q8_0")),
    ("lfm2_hd64", dict(tokens=2, past=5, type_k="q8_0", type_v="q8_0", fa=True)),
    ("lfm2moe", dict(tokens=1, past=3)),
    ("lfm2moe", dict(tokens=7, past=0, n_outputs=3)),
    ("lfm2moe_softmax", dict(tokens=4, past=2, type_k="q8_0")),
    ("granitehybrid", dict(tokens=1, past=3)),
    ("granitehybrid", dict(tokens=1, past=0)),
    ("granitehybrid", dict(tokens=7, past=0)),
    ("granitehybrid", dict(tokens=5, past=300, n_outputs=2)),
    ("granitehybrid", dict(tokens=2, past=1, type_k="q8_0", type_v="q4_0", fa=True)),
    ("granitehybrid_plain", dict(tokens=1, past=2)),
    ("granitehybrid_plain", dict(tokens=8, past=0, n_outputs=8)),
    ("granitehybrid_plain", dict(tokens=3, past=4, type_k="q8_0")),
    ("granitehybrid_moe", dict(tokens=1, past=3)),
    ("granitehybrid_moe", dict(tokens=6, past=0, n_outputs=2)),
    ("granitehybrid_moe1", dict(tokens=4, past=2, n_outputs=2)),
    ("qwen3next", dict(tokens=1, past=3)),
    ("qwen3next", dict(tokens=1, past=0)),
    ("qwen3next", dict(tokens=7, past=0)),
    ("qwen3next", dict(tokens=5, past=300, n_outputs=2)),
    ("qwen3next", dict(tokens=2, past=1, type_k="q8_0", type_v="q4_0", fa=True)),
    ("qwen3next_i3", dict(tokens=1, past=2)),
    ("qwen3next_i3", dict(tokens=9, past=0, n_outputs=9)),
    ("qwen3next_i3", dict(tokens=3, past=4, type_k="q8_0", type_v="q8_0", fa=True)),
    ("qwen35", dict(tokens=1, past=3)),
    ("qwen35", dict(tokens=6, past=0, n_outputs=2)),
    ("qwen35", dict(tokens=2, past=1, type_k="q8_0", type_v="q4_0", fa=True)),
    ("qwen35moe", dict(tokens=1, past=0)),
    ("qwen35moe", dict(tokens=5, past=300, n_outputs=5)),
    ("qwen35moe", dict(tokens=3, past=2, type_k="q8_0")),
    ("qwen35moe_gate_up", dict(tokens=1, past=2)),
    ("qwen35moe_gate_up", dict(tokens=6, past=0, n_outputs=2)),
    ("qwen3next_gate_up", dict(tokens=4, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("nemotron_h", dict(tokens=1, past=3)),
    ("nemotron_h", dict(tokens=1, past=0)),
    ("nemotron_h", dict(tokens=7, past=0)),
    ("nemotron_h", dict(tokens=5, past=300, n_outputs=2)),
    ("nemotron_h", dict(tokens=2, past=1, type_k="q8_0", type_v="q4_0", fa=True)),
    ("nemotron_h_b", dict(tokens=1, past=2)),
    ("nemotron_h_b", dict(tokens=8, past=0, n_outputs=8)),
    ("nemotron_h_b", dict(tokens=3, past=4, type_k="q8_0", type_v="q8_0", fa=True)),
]


@needs_llama_cpp
@graph_cases(CASES)
def test_hybrid_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


# ---- memory ------------------------------------------------------------------------------

# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v)
MEM_CASES = [
    ("lfm2", 512, 512, False, "f16", "f16"),
    ("lfm2", 4096, 64, True, "q8_0", "q8_0"),
    ("lfm2", 1000, 100, False, "q8_0", "f16"),
    ("lfm2_hd64", 32768, 512, True, "f16", "f16"),
    ("lfm2_hd64", 2048, 1, False, "q8_0", "f16"),
    ("lfm2moe", 2048, 128, True, "q8_0", "q8_0"),
    ("granitehybrid", 512, 512, False, "f16", "f16"),
    ("granitehybrid", 4096, 64, True, "q8_0", "q8_0"),
    ("granitehybrid_plain", 1000, 100, False, "f16", "f16"),
    ("granitehybrid_moe", 2048, 256, True, "f16", "f16"),
    ("qwen3next", 512, 512, False, "f16", "f16"),
    ("qwen3next", 4096, 64, True, "q8_0", "q8_0"),
    ("qwen3next_i3", 2048, 1, False, "q8_0", "f16"),
    ("qwen35", 1000, 100, True, "f16", "f16"),
    ("qwen35moe", 4096, 512, False, "q8_0", "f16"),
    ("qwen35moe_gate_up", 2048, 256, True, "f16", "f16"),
    ("nemotron_h", 512, 512, False, "f16", "f16"),
    ("nemotron_h_b", 4096, 64, True, "q8_0", "q8_0"),
]



@pytest.fixture(scope="module")
def logs(models):
    if not llama_cpp_available():
        pytest.skip("llama-cpp-python: " + llama_cpp_unavailable_reason())
    return capture_logs(models, MEM_CASES)


def _settings(c) -> RunSettings:
    m, ctx, ub, fa, tk, tv = c
    return RunSettings(ctx_size=ctx, ubatch_size=ub, batch_size=ub,
                       flash_attn="on" if fa else "off", cache_type_k=tk, cache_type_v=tv)


@pytest.mark.parametrize("case", MEM_CASES, ids=[memory_case_id(c) for c in MEM_CASES])
def test_hybrid_memory_matches_llama_cpp_log(models, logs, case):
    log = logs[memory_case_id(case)]
    mem = document(analyze_graph(build_graph(load_model(models[case[0]]), _settings(case)), memory=True))["memory"]
    assert mib2(mem["compute_buffer_bytes"]) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{mem['compute_buffer_bytes'] / MiB:.4f}" == f"{exact['mib']:.4f}"
    # the KV cache holds the attention layers only
    assert len(mem["kv_caches"]) == len(log["kv_caches"]) == 1
    ours, theirs = mem["kv_caches"][0], log["kv_caches"][0]
    assert (ours["cells"], ours["layers"]) == (theirs["cells"], theirs["layers"])
    assert mib2(ours["bytes"]) == theirs["buffer_mib"]
    # the recurrent state: one cell (n_seq_max 1), F32 R and S buffers
    (rs,) = log["recurrent_states"]
    (st,) = mem["recurrent_states"]
    assert (st["cells"], rs["type_r"], rs["type_s"]) == (rs["cells"], "f32", "f32")
    assert (mib2(st["r_bytes"]), mib2(st["s_bytes"])) == (rs["r_mib"], rs["s_mib"])
    assert mib2(mem["recurrent_state_bytes"]) == rs["buffer_mib"]
    assert mib2(mem["output_buffer_bytes"]) == log["output_buffer_mib"]


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
