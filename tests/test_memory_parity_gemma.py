"""gemma3n's and gemma4's memory plans equal what llama.cpp allocates, read from llama.cpp's
own log (as tests/test_memory_parity.py does for the other families): the base and
sliding-window KV caches hold only the layers with KV (gemma3n: layers >= 20 reuse layer
18's or 19's; gemma4: the last shared_kv_layers) and get no buffer, their cells, K and V
parts (gemma4: sliding layers have smaller heads, but a transposed V cache is as wide as
the widest layer); the compute buffer to the 4-decimal DEBUG line; the output buffer."""
from __future__ import annotations

import pytest

import fixtures_gemma3n as G
import fixtures_gemma4 as G4
from graphcost.graph.build import load_model
from graphcost.memory.plan import plan_memory
from graphcost.graph.settings import RunSettings
from parity import MiB, mib2, capture_logs, memory_case_id, needs_llama_cpp

pytestmark = needs_llama_cpp


# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v, swa_full)
CASES = [
    ("gemma3n", 512, 512, False, "f16", "f16", False),
    ("gemma3n", 4096, 64, True, "q8_0", "q8_0", False),
    ("gemma3n", 8192, 1, False, "f16", "f16", True),
    ("shared", 512, 512, False, "f16", "f16", False),
    ("shared", 32768, 256, True, "q8_0", "f16", False),
    ("shared", 2000, 100, False, "q8_0", "f16", True),
    ("gemma4", 512, 512, False, "f16", "f16", False),
    ("gemma4", 4096, 128, True, "q8_0", "q8_0", False),
    ("gemma4", 16384, 512, False, "q8_0", "f16", True),
    ("gemma4_fused", 1024, 1, True, "f16", "f16", False),
    ("gemma4_moe", 512, 512, False, "f16", "f16", False),
    ("gemma4_moe", 2048, 96, True, "q8_0", "q8_0", False),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("memparity_gemma3n")
    return {
        "gemma3n": G.write_gemma3n(d / "gemma3n.gguf").path,
        # 25 layers: 20 with KV (16 sliding, 4 global), 5 sharing
        "shared": G.write_gemma3n(d / "shared.gguf", n_layer=25, n_embd=96, n_head=4,
                                  n_head_kv=2, head_dim=64, n_ff=192).path,
        # 7 layers: 3 sliding + 1 full with KV, 3 sharing; heads 64 sliding / 128 full
        "gemma4": G4.write_gemma4(d / "gemma4.gguf").path,
        "gemma4_fused": G4.write_gemma4(d / "gemma4_fused.gguf", fused_qkv=True,
                                        n_embd_per_layer=0, shared_kv_layers=0,
                                        n_head=4, n_head_kv=2,
                                        swa_pattern=(False, True, True, True)).path,
        # 26B-A4B style: MoE (5 experts, 3 used) on layers 0, 2, 3, 5
        "gemma4_moe": G4.write_gemma4(d / "gemma4_moe.gguf", n_embd_per_layer=0,
                                      moe_layers=(0, 2, 3, 5)).path,
    }


@pytest.fixture(scope="module")
def logs(paths):
    """llama.cpp's parsed log for every case."""
    return capture_logs(paths, CASES)


@pytest.mark.parametrize("case", CASES, ids=[memory_case_id(c) for c in CASES])
def test_gemma_memory_matches_llama_cpp_log(paths, logs, case):
    m, ctx, ub, fa, tk, tv, swa = case
    log = logs[memory_case_id(case)]
    plan = plan_memory(load_model(paths[m]), RunSettings(
        ctx_size=ctx, ubatch_size=ub, batch_size=ub, flash_attn="on" if fa else "off",
        cache_type_k=tk, cache_type_v=tv, swa_full=swa))
    assert mib2(plan.compute_buffer_bytes) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{plan.compute_buffer_bytes / MiB:.4f}" == f"{exact['mib']:.4f}"
    assert len(plan.caches) == len(log["kv_caches"]) == 2
    for ours, theirs in zip(plan.caches, log["kv_caches"]):
        assert (ours.cells, ours.layers) == (theirs["cells"], theirs["layers"])
        assert (ours.type_k, ours.type_v) == (theirs["type_k"], theirs["type_v"])
        assert (mib2(ours.k_bytes), mib2(ours.v_bytes)) == (theirs["k_mib"], theirs["v_mib"])
        assert mib2(ours.bytes) == theirs["buffer_mib"]
    assert mib2(plan.output_buffer_bytes) == log["output_buffer_mib"]
    if m == "shared":  # 20 layers with KV: 4 global in the base cache, 16 sliding
        assert [c.layers for c in plan.caches] == [4, 16]
    if m.startswith("gemma4") and m != "gemma4_fused":  # layer 3 in the base cache, 0..2 sliding; 4..6 reuse them
        assert [c.layers for c in plan.caches] == [1, 3]
