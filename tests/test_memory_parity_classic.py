"""Memory parity for the first families whose graphs were proven without their memory:
gpt2, starcoder2, falcon, phi3 (tests/fixtures_classic.py), qwen2, qwen3, olmo2, granite
(tests/fixtures_dense.py), qwen3moe and gemma2 (tests/fixtures_moe.py). The compute buffer
(the INFO line and the 4-decimal DEBUG line), every KV cache (cells, layers, bytes) and the
output buffer equal llama.cpp's logged sizes, as tests/test_memory_parity.py checks for the
others. Logs are captured in parallel once per module.
"""
from __future__ import annotations


import pytest

import fixtures_classic as C
import fixtures_dense as D
import fixtures_moe as M
from fixtures import QT
from graphcost.graph.build import load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import llama_cpp_available, llama_cpp_unavailable_reason
from graphcost.memory.plan import plan_memory
from parity import capture_logs, memory_case_id as _id
from parity import MiB, mib2

pytestmark = pytest.mark.skipif(not llama_cpp_available(),
                                reason="llama-cpp-python: " + llama_cpp_unavailable_reason())

# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v, swa_full)
CASES = [
    ("gpt2", 512, 512, False, "f16", "f16", False),
    ("gpt2", 1024, 64, True, "q8_0", "q8_0", False),
    ("starcoder2", 4096, 512, True, "f16", "f16", False),
    ("falcon", 2048, 256, False, "q8_0", "f16", False),
    ("phi3", 1000, 100, False, "f16", "f16", False),   # LongRoPE: long factors past 256
    ("phi3", 4096, 512, True, "q8_0", "q8_0", False),
    ("qwen2", 4096, 512, False, "f16", "f16", False),
    ("qwen3", 2048, 1, True, "q8_0", "q8_0", False),
    ("qwen3", 8192, 512, False, "q4_0", "f16", False),
    ("olmo2", 512, 512, False, "f16", "f16", False),
    ("olmo2_swa", 4096, 128, True, "f16", "f16", False),
    ("olmo2_swa", 1000, 512, False, "f16", "f16", True),
    ("granite", 4096, 256, False, "f16", "f16", False),
    ("qwen3moe", 4096, 512, True, "q8_0", "q8_0", False),
    ("qwen3moe", 700, 300, False, "f16", "f16", False),
    ("gemma2", 4096, 512, False, "f16", "f16", False),
    ("gemma2", 2048, 64, True, "q8_0", "q8_0", True),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("memparity_classic")
    return {
        # 3 heads of 64, fused QKV + bias, position embeddings (context 1024)
        "gpt2": C.write_gpt2(d / "gpt2.gguf").path,
        # separate Q/K/V with biases, GQA 8/2, tied
        "starcoder2": C.write_starcoder2(d / "starcoder2.gguf").path,
        # Falcon-7B style: MQA (5 heads, 1 KV head)
        "falcon": C.write_falcon(d / "falcon.gguf").path,
        # fused QKV, head_dim 96, LongRoPE factors
        "phi3": C.write_phi3(d / "phi3.gguf").path,
        # 7 heads of 32 over 1 KV head
        "qwen2": D.write_qwen2(d / "qwen2.gguf").path,
        # head_dim 64 != n_embd / n_head: Hadamard rotation matmuls with quantized caches
        "qwen3": D.write_qwen3(d / "qwen3.gguf").path,
        "olmo2": D.write_olmo2(d / "olmo2.gguf").path,
        # OLMo 3 layout: window 32, pattern 4 over 5 layers -> a base and a sliding cache
        "olmo2_swa": D.write_olmo2(d / "olmo2_swa.gguf", sliding_window=32, n_layer=5).path,
        "granite": D.write_granite(d / "granite.gguf").path,
        # 4 experts of 96, 2 used, head_dim 64
        "qwen3moe": M.write_qwen3moe(d / "qwen3moe.gguf", weight_types={"attn_q": QT.Q4_0}).path,
        # window 64, layers 0, 2, 4 sliding; attention soft-capping
        "gemma2": M.write_gemma2(d / "gemma2.gguf").path,
    }


@pytest.fixture(scope="module")
def logs(paths):
    return capture_logs(paths, CASES)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_classic_memory_matches_llama_cpp_log(paths, logs, case):
    m, ctx, ub, fa, tk, tv, swa = case
    log = logs[_id(case)]
    plan = plan_memory(load_model(paths[m]), RunSettings(
        ctx_size=ctx, ubatch_size=ub, batch_size=ub, flash_attn="on" if fa else "off",
        cache_type_k=tk, cache_type_v=tv, swa_full=swa))
    assert mib2(plan.compute_buffer_bytes) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{plan.compute_buffer_bytes / MiB:.4f}" == f"{exact['mib']:.4f}"
    assert len(plan.caches) == len(log["kv_caches"])
    for ours, theirs in zip(plan.caches, log["kv_caches"]):
        assert (ours.cells, ours.layers) == (theirs["cells"], theirs["layers"])
        assert (ours.type_k, ours.type_v) == (theirs["type_k"], theirs["type_v"])
        assert (mib2(ours.k_bytes), mib2(ours.v_bytes)) == (theirs["k_mib"], theirs["v_mib"])
        assert mib2(ours.bytes) == theirs["buffer_mib"]
    assert mib2(plan.output_buffer_bytes) == log["output_buffer_mib"]
