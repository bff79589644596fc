"""Costs of the ops gemma3n and bert add (SQR, SQRT, MEAN, REPEAT, RELU, SUB, the F32->F16
casts before flash attention without a KV cache): exact numbers with the arithmetic
beside them, on nodes of real graphs built from the tiny fixtures."""
from __future__ import annotations

import pytest

import fixtures_encoder as E
import fixtures_gemma3n as G
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings


@pytest.fixture(scope="module")
def g3n(tmp_path_factory):
    # n_embd 160, n_ff 288, 6 layers, 4 AltUp streams
    return load_model(G.write_gemma3n(tmp_path_factory.mktemp("c3n") / "g.gguf"))


def _analysis(model, **kw):
    kw.setdefault("flash_attn", "off")
    return analyze_graph(build_graph(model, RunSettings(ctx_size=512, **kw)))


def _ops(a, op, layer=None):
    return [nc for nc in a.nodes if nc.node.op == op and (layer is None or nc.node.layer == layer)]


def test_sparsity_ops(g3n):
    a = _analysis(g3n, tokens=3)
    # gaussian_topk on the gate [288, 3] of layer 0
    (mean,) = _ops(a, "MEAN", 0)
    assert mean.node.ne == (1, 3, 1, 1)
    assert mean.cost.ops == {"add": 288 * 3, "div": 3}           # 864 adds, 1 div per row
    (relu,) = _ops(a, "RELU", 0)
    assert relu.cost.ops == {"max": 288 * 3}                      # 864 compare-selects
    assert relu.cost.write == 288 * 3 * 4                         # F32 result, 3,456 B
    subs = _ops(a, "SUB", 0)
    # x - mean, x - cutoff ([288, 3]) and AltUp's innovation ([160, 3])
    assert sorted(s.cost.ops["add"] for s in subs) == [160 * 3, 288 * 3, 288 * 3]


def test_magnitude_and_repeat_ops(g3n):
    a = _analysis(g3n, tokens=2)
    # calc_magnitude, outside the layers: stacking (inpL [160, 2], the 3 projected streams
    # [160, 2, 3]) and the final merge (active stream [160, 2], unembedded [160, 2, 3])
    sqr = [nc for nc in _ops(a, "SQR") if nc.node.layer is None]
    assert sorted(nc.cost.ops["mul"] for nc in sqr) == [320, 320, 960, 960]
    sqrt = [nc for nc in _ops(a, "SQRT") if nc.node.layer is None]
    # sqrt of the row sums: [1, 2] twice and [1, 2, 3] twice
    assert sorted(nc.cost.ops["sqrt"] for nc in sqrt) == [2, 2, 6, 6]
    rep = [nc for nc in _ops(a, "REPEAT") if nc.node.layer is None]
    (r,) = rep   # inpL [160, 2] tiled to [160, 2, 3]: read 1,280 B, write 3,840 B
    assert r.cost.ops == {} and r.cost.write == 160 * 2 * 3 * 4
    assert r.cost.read == {"act": 160 * 2 * 4}


def test_bert_flash_attention_casts_k_and_v(tmp_path):
    # 5 heads of 32, 4 tokens: K and V [32, 4, 5] F32 -> F16 before FLASH_ATTN_EXT
    m = load_model(E.write_bert(tmp_path / "b.gguf", n_layer=1))
    a = _analysis(m, tokens=4, flash_attn="on")
    casts = _ops(a, "CPY", 0)
    assert [c.node.name for c in casts] == ["Kcur-0 (permuted) (copy)", "Vcur-0 (permuted) (copy)"]
    for c in casts:
        assert c.cost.ops == {"cvt": 32 * 4 * 5}                    # 640 values converted
        assert c.cost.write == 32 * 4 * 5 * 2                       # 1,280 B of F16
