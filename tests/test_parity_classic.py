"""gpt2, starcoder2, falcon and phi3: their graphs equal llama.cpp's node for node (the
graph cases are in tests/test_parity.py's table, the memory cases in
tests/test_memory_parity.py's, on the models of tests/parity_models.py; here: the
fused-QKV views' strides and phi3's rope factors."""
from __future__ import annotations

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import capture_graph
from parity import needs_llama_cpp

pytestmark = needs_llama_cpp


@pytest.mark.parametrize("model", ["gpt2", "phi3_gqa"])
def test_fused_qkv_views_have_llama_cpp_strides(models, model):
    """The Q/K/V slices of the fused projection are strided views: their byte strides and
    offsets (what a kernel reads) equal llama.cpp's, as do those of every other node."""
    kw = dict(n_ctx=512, n_ubatch=512, flash_attn=False, tokens=3, past=2)
    theirs = capture_graph(models[model], details=True, **kw)
    bg = build_graph(load_model(models[model]),
                     RunSettings(ctx_size=512, ubatch_size=512, batch_size=512,
                                 flash_attn="off", tokens=3, past=2))
    assert len(bg.nodes) == len(theirs)
    views = 0
    for ours, t in zip(bg.nodes, theirs):
        assert (ours.name, list(ours.nb), ours.view_offs) == (t["name"], t["nb"], t["view_offs"])
        views += ours.name.startswith(("Qcur-", "Kcur-", "Vcur-")) and ours.op == "VIEW"
    assert views > 0


@pytest.mark.parametrize("n_ctx,which", [(256, "short"), (512, "long")], ids=["short", "long"])
def test_phi3_rope_factors_follow_context_size(models, n_ctx, which):
    """llama_model::get_rope_factors: the long factors only when n_ctx_seq exceeds
    rope.scaling.original_context_length (256 in the fixture)."""
    bg = build_graph(load_model(models["phi3"]),
                     RunSettings(ctx_size=n_ctx, ubatch_size=512, batch_size=512,
                                 flash_attn="on", tokens=1))
    factors = {n.src[2].name for n in bg.nodes if n.op == "ROPE"}
    assert factors == {f"rope_factors_{which}.weight"}
