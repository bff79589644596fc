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


# (-c, -np, -kvu, factors): the context of one sequence decides, not n_ctx. With -np 2 -c 256
# n_ctx is 512 but n_ctx_seq = GGML_PAD(512 / 2, 256) = 256, not above 256: short (graphcost
# took n_ctx and chose long until the QA sweep of 2026-11-27); -kvu keeps n_ctx_seq = n_ctx
PHI3_FACTORS = [(256, 1, False, "short"), (512, 1, False, "long"), (256, 2, False, "short"),
                (512, 2, False, "short"), (1024, 2, False, "long"), (512, 2, True, "long")]


@pytest.mark.parametrize("n_ctx,np_,kvu,which", PHI3_FACTORS,
                         ids=[f"c{c}-np{n}{'-kvu' if u else ''}-{w}" for c, n, u, w in PHI3_FACTORS])
def test_phi3_rope_factors_follow_context_size(models, n_ctx, np_, kvu, which):
    """llama_model::get_rope_factors: the long factors only when n_ctx_seq exceeds
    rope.scaling.original_context_length (256 in the fixture); llama.cpp's graph agrees."""
    bg = build_graph(load_model(models["phi3"]),
                     RunSettings(ctx_size=n_ctx, ubatch_size=512, batch_size=512,
                                 flash_attn="on", tokens=1, n_seq_max=np_, kv_unified=kvu))
    factors = {n.src[2].name for n in bg.nodes if n.op == "ROPE"}
    assert factors == {f"rope_factors_{which}.weight"}
    theirs = capture_graph(models["phi3"], n_ctx=n_ctx, flash_attn=True, n_seq_max=np_,
                           kv_unified=kvu, details=True)
    assert [n.src[2].name for n in bg.nodes if n.op == "ROPE"] == \
        [t["src"][2] for t in theirs if t["op"] == "ROPE"]
