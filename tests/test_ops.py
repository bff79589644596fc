"""The op vocabulary (graphcost.graph.ops): one list of ggml op names that the graph, costs,
allocator, hardware model and executor share, so that a typo fails instead of making an
op silently unmodelled."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphcost.format import ggml_types as gt
from graphcost.graph import ops
from graphcost.memory.alloc import can_inplace
from graphcost.cost.costs import COSTS
from graphcost.execute.exec_ops import NUMPY_OPS, OPS
from graphcost.graph.ggml_graph import Graph
from graphcost.graph.ops import Op

GGML_C = Path("/work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/ggml.c")


def _table(src: str, name: str) -> list[str]:
    body = re.search(rf"static const char \* {name}\[[A-Z_]+\] = \{{(.*?)\}};", src, re.S)
    return re.findall(r'"([A-Z0-9_]+)"', body.group(1))


@pytest.mark.skipif(not GGML_C.exists(), reason="needs the vendored llama.cpp source")
def test_names_are_ggmls_tables():
    # GGML_OP_NAME with UNARY and GLU replaced by their sub-ops' tables
    src = GGML_C.read_text()
    want = ([n for n in _table(src, "GGML_OP_NAME") if n not in ("UNARY", "GLU")]
            + _table(src, "GGML_UNARY_OP_NAME") + _table(src, "GGML_GLU_OP_NAME"))
    assert [o.value for o in Op] == want
    assert set(ops.UNARY) == set(_table(src, "GGML_UNARY_OP_NAME"))
    assert set(ops.GLU) == set(_table(src, "GGML_GLU_OP_NAME"))


def test_members_are_their_strings():
    assert Op.MUL_MAT == "MUL_MAT" and "MUL_MAT" in ops.MATMUL
    assert {Op.SILU: 1}["SILU"] == 1   # a str-keyed lookup finds an Op key


@pytest.mark.parametrize("registry", [COSTS, OPS], ids=["costs", "executor"])
def test_registries_are_keyed_by_ops(registry):
    assert registry and all(isinstance(k, Op) for k in registry)


def test_groups_are_ops():
    groups = [ops.VIEWS, ops.EMPTY, ops.UNARY, ops.GLU, ops.BINARY, ops.INPLACE, ops.MATMUL,
              NUMPY_OPS]
    assert all(isinstance(o, Op) for grp in groups for o in grp)
    assert ops.UNARY <= ops.INPLACE and not ops.GLU & ops.INPLACE  # ggml_op_can_inplace


def test_a_misspelt_op_fails_at_creation():
    g = Graph()
    x = g.new_tensor(gt.F32, [4, 3])
    with pytest.raises(ValueError, match="MUL_MATT"):
        g._new("MUL_MATT", gt.F32, [4], [x])
    with pytest.raises(ValueError, match="SILUU"):
        g.unary("SILUU", x)
    with pytest.raises(ValueError, match="not a ggml unary op"):
        g.unary("SWIGLU", x)              # a GLU op is not a unary one
    with pytest.raises(ValueError, match="not a ggml GLU op"):
        g.glu_split("SILU", x, x)


def test_unary_nodes_run_in_place_and_glu_nodes_do_not():
    g = Graph()
    x = g.new_tensor(gt.F32, [4, 3])
    assert can_inplace(g.unary("SILU", x))
    assert not can_inplace(g.glu_split("SWIGLU", x, x))
