"""Nemotron-H mixture of experts (``nemotron_h_moe``: Nemotron 3 Nano/Super; the same MoE
layers in a ``nemotron_h`` file): llama_model_nemotron_h::graph's build_ffn_layer MoE branch
(optional latent projections, router logits on the block input, sigmoid routing with the
selection bias and each layer's own expert_used_count, squared-ReLU experts without gate,
normalised and scaled weights, a squared-ReLU shared expert) beside Mamba-2 and attention
layers. The graph equals llama.cpp's node for node (decode and prefill, flash attention
off and on, quantized caches, several outputs; tests/parity.py); memory (compute buffer,
the attention layers' KV cache, the Mamba-2 layers' recurrent state, the output buffer)
equals llama.cpp's log (graphcost/judge/oracle.py ``capture_log``), captured once per
module. Fixtures: tests/fixtures_hybrid.py ``write_nemotron_h``."""
from __future__ import annotations


import pytest

import fixtures_hybrid as H
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import llama_cpp_available, llama_cpp_unavailable_reason
from graphcost.memory.plan import plan_memory
from parity import MiB, capture_logs, memory_case_id, mib2, assert_same_graph, case_ids, our_records

needs_llama_cpp = pytest.mark.skipif(not llama_cpp_available(),
                                     reason="llama-cpp-python: " + llama_cpp_unavailable_reason())



@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity_nemotron_moe")
    return {
        # M E M * E M: 6 experts of 64 (2 used), shared expert 96, weights normalised and
        # scaled by 2.5; 3 heads of 32 over 1 KV head
        "nemotron_h_moe": H.write_nemotron_h(d / "nemotron_h_moe.gguf", pattern="MEM*EM",
                                             arch="nemotron_h_moe"),
        # Super style: latent 64 between ffn_latent_down/up, top-k per layer (1 on layer
        # 1, 3 on layer 4), no weight normalisation or scale (a MoE file has no MLP layer:
        # with experts, every layer with n_ff != 0 is MoE)
        "nemotron_h_moe_latent": H.write_nemotron_h(
            d / "nemotron_h_moe_latent.gguf", pattern="*EMME", arch="nemotron_h_moe",
            n_expert=5, n_expert_used=[1, 1, 1, 1, 3], latent=64,
            expert_weights_norm=False, expert_weights_scale=1.0),
        # the same MoE layers in a file that says nemotron_h
        "nemotron_h_e": H.write_nemotron_h(d / "nemotron_h_e.gguf", pattern="M*E"),
    }


CASES = [
    ("nemotron_h_moe", dict(tokens=1, past=3)),
    ("nemotron_h_moe", dict(tokens=7, past=0, n_outputs=3)),
    ("nemotron_h_moe", dict(tokens=2, past=1, type_k="q8_0", type_v="q8_0", fa=True)),
    ("nemotron_h_moe_latent", dict(tokens=1, past=2)),
    ("nemotron_h_moe_latent", dict(tokens=5, past=0)),
    ("nemotron_h_e", dict(tokens=3, past=1, type_k="q8_0")),
]


@needs_llama_cpp
@pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("model,settings", CASES, ids=case_ids(CASES))
def test_nemotron_moe_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v)
MEM_CASES = [
    ("nemotron_h_moe", 4096, 512, False, "f16", "f16"),
    ("nemotron_h_moe", 2048, 64, True, "q8_0", "q8_0"),
    ("nemotron_h_moe_latent", 1000, 100, False, "f16", "f16"),
]



@pytest.fixture(scope="module")
def logs(models):
    if not llama_cpp_available():
        pytest.skip("llama-cpp-python: " + llama_cpp_unavailable_reason())
    return capture_logs(models, MEM_CASES)


@pytest.mark.parametrize("case", MEM_CASES, ids=[memory_case_id(c) for c in MEM_CASES])
def test_nemotron_moe_memory_matches_llama_cpp_log(models, logs, case):
    m, ctx, ub, fa, tk, tv = case
    log = logs[memory_case_id(case)]
    plan = plan_memory(load_model(models[m]), RunSettings(
        ctx_size=ctx, ubatch_size=ub, batch_size=ub, flash_attn="on" if fa else "off",
        cache_type_k=tk, cache_type_v=tv))
    assert mib2(plan.compute_buffer_bytes) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{plan.compute_buffer_bytes / MiB:.4f}" == f"{exact['mib']:.4f}"
    (ours,), (theirs,) = plan.caches, log["kv_caches"]  # the attention layers only
    assert (ours.cells, ours.layers) == (theirs["cells"], theirs["layers"])
    assert mib2(ours.bytes) == theirs["buffer_mib"]
    (st,), (rs,) = plan.states, log["recurrent_states"]
    assert st.layers == sum(c == "M" for c in {"nemotron_h_moe": "MEM*EM",
                                               "nemotron_h_moe_latent": "*EMME"}[m])
    assert mib2(plan.recurrent_state_bytes) == rs["buffer_mib"]
    assert mib2(plan.output_buffer_bytes) == log["output_buffer_mib"]


def test_moe_layers_route_with_their_own_expert_count(models):
    # layer 1 routes top-1 (its count), layer 4 top-3: llama.cpp passes n_expert_used(il)
    recs = {r["name"]: r for r in our_records(models["nemotron_h_moe_latent"], tokens=4)}
    assert recs["ffn_moe_topk-1"]["ne"][:2] == [1, 4]
    assert recs["ffn_moe_topk-4"]["ne"][:2] == [3, 4]
    # experts in the latent space of 64, projected back to n_embd 96 after aggregation
    assert recs["ffn_moe_down-4"]["ne"][:3] == [64, 3, 4]
    bg = build_graph(load_model(models["nemotron_h_moe"]), RunSettings(tokens=2))
    assert [c.layers for c in bg.caches] == [(3,)]  # only the attention layer is cached
