"""graphcost's memory plan equals what llama.cpp allocates, read from llama.cpp's own log.

For each case the JSON document (``graphcost analyze --format json``, built in-process)
is compared with the log of a real llama.cpp context (graphcost/judge/oracle.py
``capture_log``) at the precision llama.cpp prints:

* ``memory.compute_buffer_bytes``: the ``CPU compute buffer size = %8.2f MiB`` line of
  sched_reserve and the ``%8.4f MiB`` DEBUG line ``~llama_context`` prints on free;
* every KV cache (``memory.kv_caches``, in creation order: base then sliding-window):
  ``KV buffer size`` and its K and V parts (``%8.2f MiB``), and the cells;
* ``memory.output_buffer_bytes``: ``output buffer size``.

The cases span -c 512..32768 (and a context that is padded), -ub 1..512, flash attention
on/off, F16 and Q8_0 caches (Q8_0 with head_dim 64/256 adds llama.cpp's Hadamard rotation
inputs), --swa-full on/off, on the real gemma3 270M and the tiny fixtures (gpt-oss
included: sliding-window and full caches, MXFP4 experts). The logs are
captured in parallel once per module (each capture loads the model in a subprocess).
"""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures as F
import fixtures_deepseek as D
import fixtures_gptoss as G
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.document import document
from graphcost.graph.settings import RunSettings
from parity import MiB, mib2, capture_logs, memory_case_id, needs_llama_cpp

pytestmark = needs_llama_cpp


# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v, swa_full)
CASES = [
    ("gemma3_270m", 512, 512, False, "f16", "f16", False),
    ("gemma3_270m", 32768, 1, False, "f16", "f16", False),
    ("gemma3_270m", 4096, 64, True, "q8_0", "q8_0", True),
    ("gemma3_270m", 32768, 512, True, "f16", "f16", True),
    ("gemma3_270m", 4096, 512, False, "q8_0", "f16", False),
    ("gemma3", 512, 512, False, "f16", "f16", False),
    ("gemma3", 32768, 512, False, "f16", "f16", True),
    ("gemma3", 32768, 64, True, "q8_0", "q8_0", False),
    ("gemma3", 4096, 1, True, "f16", "f16", True),
    ("gemma3", 1000, 100, False, "q8_0", "f16", False),
    ("llama", 512, 1, False, "f16", "f16", False),
    ("llama", 32768, 512, False, "f16", "f16", False),
    ("llama", 32768, 512, True, "q8_0", "q8_0", False),
    ("llama", 4096, 64, True, "f16", "f16", False),
    ("llama", 700, 300, False, "q8_0", "f16", False),
    ("llama64", 4096, 512, True, "q8_0", "q8_0", False),
    ("llama64", 512, 64, False, "q8_0", "f16", False),
    ("gptoss", 512, 512, False, "f16", "f16", False),
    ("gptoss", 4096, 64, True, "q8_0", "q8_0", False),
    ("gptoss", 1000, 100, False, "f16", "f16", True),
    ("gptoss", 32768, 1, True, "f16", "f16", False),
    ("gptoss_k3", 8192, 512, True, "q4_0", "q4_0", False),
    ("gptoss_k3", 700, 300, False, "q8_0", "f16", True),
    # MLA (deepseek2): one K-only cache of kv_lora_rank + n_rot per cell, V 0 bytes
    ("deepseek2", 512, 512, False, "f16", "f16", False),
    ("deepseek2", 4096, 64, True, "q8_0", "q8_0", False),
    ("deepseek2", 32768, 512, True, "f16", "f16", False),
    ("deepseek2", 700, 1, False, "f16", "f16", False),
    ("deepseek2_lite", 1000, 100, False, "f16", "f16", False),
    # legacy non-MLA deepseek2 (attn_kv_b): a full K and V cache
    ("deepseek2_legacy", 4096, 512, False, "q8_0", "f16", False),
    ("deepseek2_legacy", 2048, 64, True, "q8_0", "q8_0", False),
    # glm4moe with a NextN block: its cache has the 3 trunk layers, not the 4 blocks
    ("glm4moe", 512, 512, False, "f16", "f16", False),
    ("glm4moe", 4096, 64, True, "q8_0", "q8_0", False),
    ("glm4moe", 32768, 512, True, "f16", "f16", False),
    ("glm4moe_qknorm", 1000, 100, False, "q8_0", "f16", False),
    ("glm4moe_qknorm", 4096, 512, True, "q8_0", "q8_0", False),
    # architectures ernie4_5-moe and minimax-m2
    ("ernie4_5_moe", 2048, 256, False, "f16", "f16", False),
    ("ernie4_5_moe", 4096, 512, True, "q8_0", "q8_0", False),
    ("minimax_m2", 512, 512, False, "q8_0", "f16", False),
    ("minimax_m2", 32768, 64, True, "f16", "f16", False),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory, gemma3_270m):
    d = tmp_path_factory.mktemp("memparity")
    return {
        "gemma3_270m": gemma3_270m,
        # 7 layers, window 64, pattern 6: a base and a sliding-window cache; head_dim 64
        "gemma3": F.write_gemma3(d / "gemma3.gguf").path,
        # GQA 8/2, head_dim 32 (no Hadamard rotation for quantized caches)
        "llama": F.write_llama(d / "llama.gguf").path,
        # head_dim 64: quantized caches add the rotation matmuls
        "llama64": F.write_llama(d / "llama64.gguf", n_embd=384, n_head=6, n_head_kv=3,
                                 head_dim=64, n_ff=1024, n_layer=2, n_vocab=333,
                                 weight_types={"attn_q": QT.Q4_0, "ffn_down": QT.Q4_K}).path,
        # gpt-oss: window 40 on layers 0 and 2, MXFP4 experts with biases, head_dim 64
        "gptoss": G.write_gptoss(d / "gptoss.gguf").path,
        # 4 layers, 3 of 7 experts, head_dim 32, window 17
        "gptoss_k3": G.write_gptoss(d / "gptoss_k3.gguf", n_embd=224, n_head=8, n_head_kv=4,
                                    head_dim=32, n_ff_exp=96, n_layer=4, n_expert=7,
                                    n_expert_used=3, sliding_window=17).path,
        # Q LoRA, KV LoRA 96 + rope 32 (cache rows of 128), grouped routing, layer 0 dense
        "deepseek2": D.write_deepseek2(d / "deepseek2.gguf").path,
        # attn_q, no dense layer, 5 experts
        "deepseek2_lite": D.write_deepseek2(d / "deepseek2_lite.gguf", q_lora_rank=0, n_layer=2,
                                            n_layer_dense_lead=0, n_expert=5,
                                            expert_groups=None).path,
        # pre-MLA file: attn_kv_b, K heads of 64, V heads of 64, 3 KV heads
        "deepseek2_legacy": D.write_deepseek2(d / "deepseek2_legacy.gguf", legacy_kv_b=True,
                                              n_layer=2, qk_nope=32).path,
        # 3 trunk layers + 1 NextN block, head_dim 96, layer 0 dense
        "glm4moe": D.write_glm4moe(d / "glm4moe.gguf").path,
        # Q/K norms, head_dim 64 (Hadamard rotation with quantized caches), no NextN
        "glm4moe_qknorm": D.write_glm4moe(d / "glm4moe_qknorm.gguf", n_embd=320, n_head=5,
                                          n_head_kv=1, head_dim=64, n_rot=32, n_layer=4,
                                          n_nextn=0, n_layer_dense_lead=2, qk_norm=True).path,
        # layer 0 dense, shared expert, head_dim 64
        "ernie4_5_moe": D.write_ernie4_5_moe(d / "ernie4_5_moe.gguf").path,
        # whole-projection Q/K norms, 7 experts, 3 used
        "minimax_m2": D.write_minimax_m2(d / "minimax_m2.gguf").path,
    }


@pytest.fixture(scope="module")
def logs(paths):
    """llama.cpp's parsed log for every case."""
    return capture_logs(paths, CASES)


def _document(path, c) -> dict:
    m, ctx, ub, fa, tk, tv, swa = c
    s = RunSettings(ctx_size=ctx, ubatch_size=ub, batch_size=ub, flash_attn="on" if fa else "off",
                    cache_type_k=tk, cache_type_v=tv, swa_full=swa)
    return document(analyze_graph(build_graph(load_model(path), s), memory=True))


@pytest.mark.parametrize("case", CASES, ids=[memory_case_id(c) for c in CASES])
def test_memory_matches_llama_cpp_log(paths, logs, case):
    log = logs[memory_case_id(case)]
    mem = _document(paths[case[0]], case)["memory"]
    # compute buffer: the INFO line (2 decimals) and the DEBUG line at free (4 decimals)
    assert mib2(mem["compute_buffer_bytes"]) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{mem['compute_buffer_bytes'] / MiB:.4f}" == f"{exact['mib']:.4f}"
    # the buffer is the larger of the prompt and generation reserve graphs
    assert mem["compute_buffer_bytes"] == max(g["buffer_bytes"] for g in mem["reserve_graphs"])
    # KV caches, one by one (base, then sliding-window), and their total
    assert len(mem["kv_caches"]) == len(log["kv_caches"])
    for ours, theirs in zip(mem["kv_caches"], log["kv_caches"]):
        assert ours["cells"] == theirs["cells"]
        assert ours["layers"] == theirs["layers"]
        assert mib2(ours["bytes"]) == theirs["buffer_mib"]
    assert mem["kv_cache_bytes"] == sum(c["bytes"] for c in mem["kv_caches"])
    assert mib2(mem["output_buffer_bytes"]) == log["output_buffer_mib"]


def test_kv_split_matches_llama_cpp_k_and_v(paths, logs):
    """The per-cache K and V parts (``K (q8_0): x MiB, V (f16): y MiB``)."""
    from graphcost.memory.plan import plan_memory
    for c in CASES:
        m, ctx, ub, fa, tk, tv, swa = c
        s = RunSettings(ctx_size=ctx, ubatch_size=ub, batch_size=ub,
                        flash_attn="on" if fa else "off", cache_type_k=tk, cache_type_v=tv,
                        swa_full=swa)
        plan = plan_memory(load_model(paths[m]), s)
        for ours, theirs in zip(plan.caches, logs[memory_case_id(c)]["kv_caches"]):
            assert (ours.type_k, ours.type_v) == (theirs["type_k"], theirs["type_v"]), memory_case_id(c)
            assert (mib2(ours.k_bytes), mib2(ours.v_bytes)) == (theirs["k_mib"], theirs["v_mib"]), memory_case_id(c)


def test_mla_cache_is_k_only(paths):
    """deepseek2's cache holds K rows of kv_lora_rank + n_rot and no V:
    3 layers x (96 + 32) x 512 cells x 2 bytes (F16) = 393216 bytes."""
    from graphcost.memory.plan import plan_memory
    plan = plan_memory(load_model(paths["deepseek2"]),
                       RunSettings(ctx_size=512, flash_attn="off"))
    (c,) = plan.caches
    assert (c.k_bytes, c.v_bytes) == (3 * (96 + 32) * 512 * 2, 0)
