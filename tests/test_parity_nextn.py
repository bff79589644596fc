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
``!is_recr && n_ff == 0`` over all blocks leaves it out too), deepseek2 and glm4moe.

The models are tests/parity_models.py's ``<family>_nextn`` (glm4moe's ``glm45``); their
graphs are proven node for node in tests/test_parity.py, their memory (compute buffer,
every KV cache, the recurrent state, the output buffer) in tests/test_memory_parity.py.
Here: the blocks are outside the trunk and its caches.
"""
from __future__ import annotations

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings


@pytest.mark.parametrize("model,trunk,kv_layers", [
    ("glm4", 3, [3]),            # 5 blocks, 2 NextN: 3 cached layers
    ("exaone4_swa", 64, [16, 48]),  # pattern 4 over the 64 trunk layers only
    ("qwen3next", 4, [1]),       # layer 3 attends; the MTP block (4) is not cached
    ("qwen35moe", 4, [2]),       # layers 1 and 3; not the MTP blocks 4 and 5
    ("deepseek2", 2, [2]),
    ("nemotron_h_moe", 4, [1]),  # layer 1 only; the MTP block 4 has n_ff != 0
])
def test_nextn_blocks_are_outside_the_trunk_and_its_cache(models, model, trunk, kv_layers):
    m = load_model(models[model + "_nextn"])
    assert m.n_layer == trunk and m.n_layer_nextn >= 1
    bg = build_graph(m, RunSettings(ctx_size=512, tokens=2))
    assert [len(c.layers) for c in bg.caches] == kv_layers
    assert not any(n.name.endswith(f"-{trunk}") for n in bg.nodes)  # no node of block n_layer
