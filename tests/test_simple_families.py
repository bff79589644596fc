"""Without llama.cpp: the PAD cost, the expression forms the new families use, and the
one-line refusals of files llama.cpp refuses or graphcost does not model yet
(tests/fixtures_simple.py builds the files)."""
from __future__ import annotations

import pytest

import fixtures_simple as S
from graphcost.format import ggml_types as gt
from graphcost.format.hparam_expr import evaluate
from graphcost.graph.build import build_graph, load_model
from graphcost.cost.costs import op_cost
from graphcost.errors import GraphcostError, UnsupportedError
from graphcost.graph.ggml_graph import Graph
from graphcost.graph.settings import RunSettings


def test_pad_cost_reads_source_writes_padded_result():
    g = Graph()
    a = g.new_tensor(gt.F32, [160, 3])
    p = g.pad(a, [320, 0, 0, 0])
    assert p.ne == (480, 3, 1, 1)
    c = op_cost(p)
    # read 160 * 3 * 4 = 1920 bytes, write 480 * 3 * 4 = 5760 bytes, no arithmetic
    assert (c.reads, c.write, c.flops) == ((1920,), 5760, 0)


@pytest.mark.parametrize("expr,names,value", [
    ("(il + 1) % 4 != 0", {"il": 3}, 0.0),
    ("(il + 1) % 4 != 0", {"il": 4}, 1.0),
    ("is_swa or n_swa == 0", {"is_swa": 0.0, "n_swa": 0}, 1.0),
    ("is_swa or n_swa == 0", {"is_swa": 0.0, "n_swa": 40}, 0.0),
    ("not is_swa and n_swa > 0", {"is_swa": 0.0, "n_swa": 40}, 1.0),
], ids=["nope-layer", "rope-layer", "no-swa", "global-layer", "not-and"])
def test_expression_forms(expr, names, value):
    assert evaluate(expr, names, "test") == value


def _build(path, **kw):
    return build_graph(load_model(path), RunSettings(**kw))


def test_rope_sections_must_have_four_entries(tmp_path):
    p = tmp_path / "glm4_bad.gguf"
    S.write_glm4(p, n_layer=1, rope_sections=[4, 6, 6])
    with pytest.raises(GraphcostError, match=r"rope\.dimension_sections.*4 non-negative"):
        _build(p)


def test_deepstack_reaching_the_last_layer_is_refused(tmp_path):
    # llama.cpp's ggml_add asserts when the last layer's rows were cut to the outputs
    p = tmp_path / "qwen3vl_ds.gguf"
    S.write_qwen3vl(p, n_layer=2, n_deepstack=2)
    assert _build(p, tokens=1).nodes  # one token, one output: the add broadcasts
    with pytest.raises(GraphcostError, match="n_deepstack_layers = 2 reaches the last layer"):
        _build(p, tokens=3)


def test_temperature_scale_needs_a_context_length(tmp_path):
    p = tmp_path / "mistral3_t.gguf"
    S.write_mistral3(p, n_layer=1, original_context=0)
    with pytest.raises(GraphcostError, match="temperature_scale needs"):
        _build(p)


def test_llama4_without_chunking_is_refused(tmp_path):
    # llama.cpp loads it, then GGML_ASSERT(f_attn_temp_scale != 0) aborts the first decode
    p = tmp_path / "llama4_nochunk.gguf"
    S.write_llama4(p, n_layer=2, sliding_window=0)
    with pytest.raises(UnsupportedError, match="sliding_window = 0"):
        _build(p)


def test_repeat_cost_reads_source_once():
    g = Graph()
    a = g.new_tensor(gt.F32, [192, 1, 3])
    r = g.repeat_4d(a, [192, 2, 3, 1])
    # read 192 * 3 * 4 = 2304 bytes, write 192 * 2 * 3 * 4 = 4608 bytes, no arithmetic
    assert (op_cost(r).reads, op_cost(r).write, op_cost(r).flops) == ((2304,), 4608, 0)
