"""deepseek2 costs: MLA's attention reads its K-only cache once (V is a view of the same
rows), the group-routing FILL writes without reading, and the v3 fixture's graph has no
unmodelled op. Exact numbers with the arithmetic beside them."""
from __future__ import annotations

import pytest

import fixtures_deepseek as D
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.cost.costs import op_cost
from graphcost.graph.settings import RunSettings


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # Q LoRA 160, KV LoRA 96 + rope 32 (cache rows of 128), 3 heads, V 64; 8 experts in
    # 4 groups, 2 groups used; layer 0 dense
    return load_model(D.write_deepseek2(tmp_path_factory.mktemp("costs_ds") / "v3.gguf"))


def nodes(model, **kw):
    return build_graph(model, RunSettings(ctx_size=512, **kw)).nodes


def cost(ns, op, name=None, layer=0):
    return op_cost(next(n for n in ns if n.op == op and n.layer == layer
                        and (name is None or n.name == name)))


def test_flash_attention_reads_the_mla_cache_once(model):
    c = cost(nodes(model, flash_attn="on", tokens=1, past=5), "FLASH_ATTN_EXT")
    # q F32 [128, 1 token, 3 heads] = 1,536 B; K F16 [128, 256 cells] = 65,536 B;
    # V = the first 96 elements of the same K rows: 0 B more; mask F16 [256, 1] = 512 B
    assert c.reads == (128 * 3 * 4, 128 * 256 * 2, 0, 256 * 2)


def test_without_flash_attention_v_is_copied_out_of_the_k_rows(model):
    c = cost(nodes(model, flash_attn="off", tokens=1, past=5), "CONT", "v_cont-0")
    # cont(transpose(view of K rows, 96 of 128 elements)) over 256 cells: F16 96 x 256
    assert (c.reads, c.write) == ((96 * 256 * 2,), 96 * 256 * 2)


def test_group_mask_fill_writes_without_reading(model):
    fills = [op_cost(n) for n in nodes(model, flash_attn="on", tokens=3) if n.op == "FILL"]
    # layers 1 and 2 (layer 0 is dense); [2 experts per group, 4 groups, tokens] F32 with
    # 3 tokens in layer 1 and the one output row in the last layer: written, source not read
    assert [(c.reads, c.write, c.flops) for c in fills] == [((0,), 2 * 4 * 3 * 4, 0),
                                                             ((0,), 2 * 4 * 1 * 4, 0)]


@pytest.mark.parametrize("fa", ["on", "off"])
def test_no_op_is_unmodelled(model, fa):
    a = analyze_graph(build_graph(model, RunSettings(ctx_size=512, flash_attn=fa, tokens=4,
                                                     past=2)))
    assert all(nc.cost is not None for nc in a.nodes)


def test_legacy_repeat_reads_once_writes_every_head(tmp_path):
    # pre-MLA file: k_pe F32 [32 rope dims, 1, 3 tokens] repeated to [32, 3 heads, 3 tokens]
    m = load_model(D.write_deepseek2(tmp_path / "legacy.gguf", legacy_kv_b=True, n_layer=2,
                                     qk_nope=32))
    c = cost(nodes(m, flash_attn="on", tokens=3), "REPEAT")
    assert (c.reads, c.write, c.flops) == ((32 * 3 * 4,), 32 * 3 * 3 * 4, 0)
