"""Nemotron-H mixture of experts (``nemotron_h_moe``: Nemotron 3 Nano/Super; the same MoE
layers in a ``nemotron_h`` file): llama_model_nemotron_h::graph's build_ffn_layer MoE branch
(optional latent projections, router logits on the block input, sigmoid routing with the
selection bias and each layer's own expert_used_count, squared-ReLU experts without gate,
normalised and scaled weights, a squared-ReLU shared expert) beside Mamba-2 and attention
layers. The graph equals llama.cpp's node for node (tests/test_parity.py), the memory
(compute buffer, the attention layers' KV cache, the Mamba-2 layers' recurrent state, the
output buffer) llama.cpp's log (tests/test_memory_parity.py), on the ``nemotron_h_moe*``
and ``nemotron_h_e`` models of tests/parity_models.py. Here: per-layer routing."""
from __future__ import annotations

from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from parity import our_records


def test_moe_layers_route_with_their_own_expert_count(models):
    # layer 1 routes top-1 (its count), layer 4 top-3: llama.cpp passes n_expert_used(il)
    recs = {r["name"]: r for r in our_records(models["nemotron_h_moe_latent"], tokens=4)}
    assert recs["ffn_moe_topk-1"]["ne"][:2] == [1, 4]
    assert recs["ffn_moe_topk-4"]["ne"][:2] == [3, 4]
    # experts in the latent space of 64, projected back to n_embd 96 after aggregation
    assert recs["ffn_moe_down-4"]["ne"][:3] == [64, 3, 4]
    bg = build_graph(load_model(models["nemotron_h_moe"]), RunSettings(tokens=2))
    assert [c.layers for c in bg.caches] == [(3,)]  # only the attention layer is cached
