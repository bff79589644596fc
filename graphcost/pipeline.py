"""file -> metadata -> graph -> costs, in one call."""
from __future__ import annotations

import os

from graphcost.cost.analysis import Analysis, analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings


def analyze_model(path: str | os.PathLike, settings: RunSettings, *,
                  memory: bool = True) -> Analysis:
    """The analysis of one ubatch; with ``memory`` (the default) also its memory plan."""
    return analyze_graph(build_graph(load_model(path), settings), memory=memory)
