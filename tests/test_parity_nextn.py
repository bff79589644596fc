"""NextN / MTP blocks (``nextn_predict_layers``): llama.cpp loads them after the trunk
(``block_count`` counts them) but its trunk graph runs ``n_layer() = n_layer_all -
n_layer_nextn`` layers and its memory holds only trunk layers (create_memory's
``filter = il < n_layer()`` for plain and sliding-window caches, ``filter_attn`` /
``filter_recr`` with ``il < n_layer()`` for qwen3next/qwen35/qwen35moe, and
llama_memory_recurrent over ``n_layer()``). graphcost does the same; this module proves
it against llama.cpp for every family whose files can carry such blocks and that
graphcost models: glm4, exaone4 (64 trunk layers + 1: the sliding window still applies,
as ``n_layer() == 64``), qwen3next, qwen35, qwen35moe, nemotron_h_moe (its MTP block is
an attention + MoE block with feed_forward_length != 0, so the nemotron attention filter
``!is_recr && n_ff == 0`` over all blocks leaves it out too) (graph and memory), deepseek2 (the
graph is in tests/test_parity_deepseek.py; its memory here) and glm4moe (graph and
memory in tests/test_parity_glm4moe.py and tests/test_memory_parity.py).

Graph: node for node, decode and prefill, flash attention off and on (tests/parity.py).
Memory: compute buffer (4 decimals), every KV cache (cells, layers, bytes), the
recurrent state and the output buffer, from llama.cpp's log (graphcost/judge/oracle.py
``capture_log``), captured in parallel once per module.
"""
from __future__ import annotations


import pytest

import fixtures_deepseek as D
import fixtures_hybrid as H
import fixtures_simple as S
from graphcost.cost.analysis import analyze_graph
from graphcost.document import document
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import llama_cpp_available, llama_cpp_unavailable_reason
from parity import MiB, capture_logs, memory_case_id, mib2, assert_same_graph, case_ids

needs_llama_cpp = pytest.mark.skipif(not llama_cpp_available(),
                                     reason="llama-cpp-python: " + llama_cpp_unavailable_reason())



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_nextn")
    return {
        # 3 trunk layers + 2 NextN blocks (eh_proj, enorm, hnorm, shared_head_norm)
        "glm4": S.write_glm4(d / "glm4.gguf", n_nextn=2),
        # 2 trunk layers + 1 NextN block without the optional shared_head_norm
        "exaone4": S.write_exaone4(d / "exaone4.gguf", n_layer=2, n_nextn=1),
        # 64 trunk layers + 1: sliding window 40, pattern 4 (n_layer() decides, not 65)
        "exaone4_swa": S.write_exaone4(d / "exaone4_swa.gguf", n_layer=64, n_embd=64,
                                       n_head=2, n_head_kv=1, n_ff=96, n_vocab=261,
                                       sliding_window=40, n_nextn=1),
        # 4 trunk layers (3 delta net, 1 attention) + 1 MTP block (full attention, MoE)
        "qwen3next": H.write_qwen3next(d / "qwen3next.gguf", n_nextn=1),
        # interval 3, 5 trunk layers + 1 MTP block with a dense FFN
        "qwen35": H.write_qwen3next(d / "qwen35.gguf", arch="qwen35", n_layer=5,
                                    full_attention_interval=3, n_nextn=1),
        # interval 2, 4 trunk layers (attention: 1, 3) + 2 MTP blocks
        "qwen35moe": H.write_qwen3next(d / "qwen35moe.gguf", arch="qwen35moe", n_layer=4,
                                       full_attention_interval=2, n_nextn=2),
        # MLA (K-only cache of kv_lora + rope rows), 2 trunk layers + 1 NextN block
        "deepseek2": D.write_deepseek2(d / "deepseek2.gguf", n_layer=2, n_nextn=1),
        # Nemotron 3: M * E M + 1 MTP block (attention + MoE, n_ff != 0: not cached)
        "nemotron_h_moe": H.write_nemotron_h(d / "nemotron_h_moe.gguf", pattern="M*EM",
                                             arch="nemotron_h_moe", n_nextn=1),
    }


CASES = [
    ("glm4", dict(tokens=1, past=2)),
    ("glm4", dict(tokens=6, past=0, n_outputs=2)),
    ("exaone4", dict(tokens=1, past=3)),
    ("exaone4", dict(tokens=5, past=0, type_k="q8_0")),
    ("exaone4_swa", dict(tokens=6, past=50, n_outputs=2, n_ubatch=64, n_ctx=300)),
    ("qwen3next", dict(tokens=1, past=3)),
    ("qwen3next", dict(tokens=5, past=0, n_outputs=2)),
    ("qwen35", dict(tokens=1, past=2)),
    ("qwen35", dict(tokens=4, past=0)),
    ("qwen35moe", dict(tokens=3, past=1)),
    ("nemotron_h_moe", dict(tokens=1, past=2)),
    ("nemotron_h_moe", dict(tokens=5, past=0, n_outputs=2)),
]


@needs_llama_cpp
@pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("model,settings", CASES, ids=case_ids(CASES))
def test_nextn_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v)
MEM_CASES = [
    ("glm4", 700, 300, False, "f16", "f16"),
    ("exaone4", 512, 512, True, "q8_0", "q8_0"),
    ("exaone4_swa", 4096, 512, False, "f16", "f16"),
    ("qwen3next", 4096, 64, True, "q8_0", "q8_0"),
    ("qwen35", 1000, 100, False, "f16", "f16"),
    ("qwen35moe", 2048, 512, False, "f16", "f16"),
    ("deepseek2", 4096, 256, True, "f16", "f16"),
    ("deepseek2", 1000, 512, True, "q8_0", "q8_0"),
    ("nemotron_h_moe", 2048, 256, False, "f16", "f16"),
]



@pytest.fixture(scope="module")
def logs(models):
    if not llama_cpp_available():
        pytest.skip("llama-cpp-python: " + llama_cpp_unavailable_reason())
    return capture_logs(models, MEM_CASES)


def _memory(path, c) -> dict:
    m, ctx, ub, fa, tk, tv = c
    s = RunSettings(ctx_size=ctx, ubatch_size=ub, batch_size=ub,
                    flash_attn="on" if fa else "off", cache_type_k=tk, cache_type_v=tv)
    return document(analyze_graph(build_graph(load_model(path), s), memory=True))["memory"]


@pytest.mark.parametrize("case", MEM_CASES, ids=[memory_case_id(c) for c in MEM_CASES])
def test_nextn_memory_matches_llama_cpp_log(models, logs, case):
    log = logs[memory_case_id(case)]
    mem = _memory(models[case[0]], case)
    assert mib2(mem["compute_buffer_bytes"]) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{mem['compute_buffer_bytes'] / MiB:.4f}" == f"{exact['mib']:.4f}"
    assert len(mem["kv_caches"]) == len(log["kv_caches"])
    for ours, theirs in zip(mem["kv_caches"], log["kv_caches"]):
        assert (ours["cells"], ours["layers"]) == (theirs["cells"], theirs["layers"])
        assert mib2(ours["bytes"]) == theirs["buffer_mib"]
    assert len(mem["recurrent_states"]) == len(log["recurrent_states"])
    for ours, theirs in zip(mem["recurrent_states"], log["recurrent_states"]):
        assert mib2(ours["r_bytes"] + ours["s_bytes"]) == theirs["buffer_mib"]
    assert mib2(mem["output_buffer_bytes"]) == log["output_buffer_mib"]


@pytest.mark.parametrize("model,trunk,kv_layers", [
    ("glm4", 3, [3]),            # 5 blocks, 2 NextN: 3 cached layers
    ("exaone4_swa", 64, [16, 48]),  # pattern 4 over the 64 trunk layers only
    ("qwen3next", 4, [1]),       # layer 3 attends; the MTP block (4) is not cached
    ("qwen35moe", 4, [2]),       # layers 1 and 3; not the MTP blocks 4 and 5
    ("deepseek2", 2, [2]),
    ("nemotron_h_moe", 4, [1]),  # layer 1 only; the MTP block 4 has n_ff != 0
])
def test_nextn_blocks_are_outside_the_trunk_and_its_cache(models, model, trunk, kv_layers):
    m = load_model(models[model])
    assert m.n_layer == trunk and m.n_layer_nextn >= 1
    bg = build_graph(m, RunSettings(ctx_size=512, tokens=2))
    assert [len(c.layers) for c in bg.caches] == kv_layers
    assert not any(n.name.endswith(f"-{trunk}") for n in bg.nodes)  # no node of block n_layer
