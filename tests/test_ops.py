"""The op vocabulary (graphcost.graph.ops): one list of ggml op names that the graph, costs,
allocator, hardware model and executor share, so that a typo fails instead of making an
op silently unmodelled."""
from __future__ import annotations

import ast
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


def _op_set_literals(path: Path) -> list[tuple[int, frozenset[str]]]:
    """(line, members) of every set literal in ``path`` made only of ``Op.X`` members."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Set) and len(node.elts) > 1 and all(
                isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                and e.value.id == "Op" for e in node.elts):
            out.append((node.lineno, frozenset(e.attr for e in node.elts)))
    return out


def test_no_module_keeps_its_own_copy_of_an_op_group():
    # a group written again elsewhere (sched.py's VIEW_OPS was ops.VIEWS retyped) drifts
    # from the one in graphcost/graph/ops.py when ggml adds an op
    groups = {name: frozenset(o.value for o in grp) for name, grp in
              [("VIEWS", ops.VIEWS), ("EMPTY", ops.EMPTY), ("UNARY", ops.UNARY),
               ("GLU", ops.GLU), ("BINARY", ops.BINARY), ("INPLACE", ops.INPLACE),
               ("MATMUL", ops.MATMUL)]}
    root = Path(ops.__file__).parents[1]
    copies = [f"{p.relative_to(root)}:{line} is ops.{name}"
              for p in sorted(root.rglob("*.py")) if p != Path(ops.__file__)
              for line, members in _op_set_literals(p)
              for name, grp in groups.items() if members == grp]
    assert not copies, copies


@pytest.mark.parametrize("add, op, n_mask_src", [
    ("soft_max_add_sinks", "SOFT_MAX", 2), ("flash_attn_ext_add_sinks", "FLASH_ATTN_EXT", 4)])
def test_sinks_join_a_masked_attention_node_only(add, op, n_mask_src):
    g = Graph()
    x = g.new_tensor(gt.F32, [8, 3, 2])
    sinks = g.new_tensor(gt.F32, [2])
    with pytest.raises(ValueError, match=f"attention sinks need a {op} with a mask"):
        getattr(g, add)(g.scale(x, 1.0), sinks)          # not the op
    mask = g.new_tensor(gt.F16, [8, 3])
    node = (g.soft_max_ext(x, mask, 1.0, 0.0) if op == "SOFT_MAX" else
            g.flash_attn_ext(x, x, x, mask, 1.0, 0.0, 0.0))
    assert len(node.src) == n_mask_src
    getattr(g, add)(node, None)                           # no sinks: unchanged
    assert len(node.src) == n_mask_src and "sinks" not in node.params
    getattr(g, add)(node, sinks)
    assert node.src[-1] is sinks and len(node.src) == n_mask_src + 1 and node.params["sinks"]


def _op_literals(path: Path) -> list[tuple[int, str]]:
    """(line, string) of every string literal compared with a node's ``.op``
    (``n.op == "X"``, ``n.op in ("X", ...)``) or passed as the op of a graph builder call
    (``g.unary("X", ...)``, ``g.glu_split("X", ...)``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare) and any(
                isinstance(s, ast.Attribute) and s.attr == "op" for s in [node.left, *node.comparators]):
            for c in [node.left, *node.comparators]:
                elts = c.elts if isinstance(c, (ast.Tuple, ast.Set, ast.List)) else [c]
                out += [(e.lineno, e.value) for e in elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("unary", "glu_split", "glu") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value))
    return out


def test_every_op_name_written_as_a_string_is_a_ggml_op():
    # a string compared with a node's op bypasses ops.check: a typo would never match
    root = Path(ops.__file__).parents[1]
    names = {o.value for o in Op}
    found = [(p, line, s) for p in sorted(root.rglob("*.py")) for line, s in _op_literals(p)]
    assert len(found) > 5                            # the scan sees the code's comparisons
    bad = [f"{p.relative_to(root)}:{line}: {s!r}" for p, line, s in found if s not in names]
    assert not bad, bad
