"""``analyze --format``: one enum, one :class:`~.renderer.Renderer` per value."""
from __future__ import annotations

from enum import Enum

import yaml

from graphcost.cost.analysis import Analysis
from graphcost.document import document, to_json
from graphcost.report.renderer import Renderer, RenderOptions


class Format(str, Enum):
    summary = "summary"
    tree = "tree"
    json = "json"
    yaml = "yaml"
    html = "html"


class Summary(Renderer):
    """The one-screen report; with ``--hardware``, the roofline time estimate."""

    uses = frozenset({"hardware"})
    colour = True

    def render(self, a: Analysis, opts: RenderOptions) -> str:
        from graphcost.report.summary import render_summary
        return render_summary(a, width=opts.width, color=opts.color, hardware=opts.hardware,
                              cpu_features=opts.cpu_features)


class Tree(Renderer):
    """Every node with its sources and cost; ``--layers`` narrows the node blocks."""

    uses = frozenset({"layers"})
    memory = True

    def render(self, a: Analysis, opts: RenderOptions) -> str:
        from graphcost.report.tree import render_tree
        return render_tree(a, layers=opts.layers)


class Json(Renderer):
    """The document (graphcost.document); ``--hardware`` adds the roofline."""

    uses = frozenset({"hardware"})
    memory = True

    def render(self, a: Analysis, opts: RenderOptions) -> str:
        return to_json(document(a, hardware=opts.hardware, cpu_features=opts.cpu_features))


class Yaml(Renderer):
    """The document as YAML (what ``graphcost check --baseline`` reads)."""

    uses = frozenset({"hardware"})
    memory = True

    def render(self, a: Analysis, opts: RenderOptions) -> str:
        return yaml.safe_dump(document(a, hardware=opts.hardware, cpu_features=opts.cpu_features),
                              sort_keys=False, width=100)


class Html(Renderer):
    """One self-contained page (graphcost/report/html.py) drawn from the same document;
    ``--hardware`` adds the roofline times."""

    uses = frozenset({"hardware"})
    memory = True

    def render(self, a: Analysis, opts: RenderOptions) -> str:
        from graphcost.report.html import render_analysis
        return render_analysis(a, hardware=opts.hardware, cpu_features=opts.cpu_features)


#: every Format has exactly one renderer (tests/test_cli.py checks this)
RENDERERS: dict[Format, Renderer] = {
    Format.summary: Summary(),
    Format.tree: Tree(),
    Format.json: Json(),
    Format.yaml: Yaml(),
    Format.html: Html(),
}
