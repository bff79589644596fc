"""Helpers of the cost tests (tests/test_costs*.py): a model's analysis for given run
settings, and one node's costs by name."""
from __future__ import annotations

from graphcost.cost.analysis import Analysis, NodeCost, analyze_graph
from graphcost.format.model import ModelInfo
from graphcost.graph.build import build_graph
from graphcost.graph.settings import RunSettings


def run(model: ModelInfo, **kw) -> Analysis:
    """The analysis of ``model``'s graph with a context of 512 and ``kw`` as run settings
    (flash attention off unless given)."""
    kw.setdefault("flash_attn", "off")
    return analyze_graph(build_graph(model, RunSettings(ctx_size=512, **kw)))


def node(a: Analysis, name: str, op: str | None = None) -> NodeCost:
    """The first node named ``name`` (and of op ``op``, if given)."""
    for nc in a.nodes:
        if nc.node.name == name and (op is None or nc.node.op == op):
            return nc
    raise KeyError(name)
