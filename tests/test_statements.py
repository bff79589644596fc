"""The spec statement registry (graphcost.graph.spec_builder.STATEMENTS): one mechanism for core
and family statements; a name registered twice is an error; every statement the bundled
specs use is registered."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

import graphcost.graph.statements  # noqa: F401  (fills the registry)
from graphcost.resources import bundled
from graphcost.graph.spec_builder import STATEMENTS, statement
from graphcost.graph.statements import core

#: the statements of spec_builder.py's former ``s_*`` methods, now in statements/core.py
CORE = {"embed", "positions", "attention_inputs", "out_ids", "set", "block", "norm", "qkv",
        "rope", "cb", "scale", "attention", "select_rows", "add", "mul", "ffn", "lm_head",
        "softcap", "expand"}


def _used(stmts: Any) -> set[str]:
    """Statement names in a statement list, including nested branches (if/when/...)."""
    out: set[str] = set()
    if isinstance(stmts, list):
        for s in stmts:
            if isinstance(s, dict) and len(s) == 1:
                (key, args), = s.items()
                out.add(key)
                out |= _used(args)
    elif isinstance(stmts, dict):
        for v in stmts.values():
            out |= _used(v)
    return out


def test_core_statements_are_registered_from_core():
    got = {name for name, fn in STATEMENTS.items() if fn.__module__ == core.__name__}
    assert got == CORE   # 19 statements


@pytest.mark.parametrize("path", sorted((bundled("specs") / "arch").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_statement_a_spec_uses_is_registered(path):
    doc = yaml.safe_load(path.read_text())
    if "graph_of" in doc:   # builds another family's graph: its statements are checked there
        assert (path.parent / f"{doc['graph_of']}.yaml").is_file(), doc["graph_of"]
        return
    used = set().union(*(_used(doc.get(k, [])) for k in ("prologue", "layer", "epilogue")))
    assert used and used <= set(STATEMENTS), used - set(STATEMENTS)


def test_a_name_registered_twice_is_an_error():
    with pytest.raises(ValueError, match="'norm' registered twice"):
        statement("norm")(lambda sb, a: None)
    assert STATEMENTS["norm"].__module__ == core.__name__   # the first one stays
