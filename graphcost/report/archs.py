"""``graphcost archs``: the modelled families with what is proven for each, then the GGUF
architectures that are not modelled. Plain text (one row per family) or JSON."""
from __future__ import annotations

import json
from enum import Enum

from graphcost.graph.arch_spec import PROVEN_ASPECTS
from graphcost.report.renderer import Renderer, RenderOptions


class ArchsFormat(str, Enum):
    text = "text"
    json = "json"


def render_archs_text(doc: dict) -> str:
    fams = doc["families"]
    rows = [[f["architecture"]] + [(f["proven"][a] or "-").removeprefix("tests/")
                                   for a in PROVEN_ASPECTS] for f in fams]
    head = ["architecture", *PROVEN_ASPECTS]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines = [f"{len(fams)} families modelled; proven against llama.cpp by these tests:"]
    for r in [head] + rows:
        lines.append(("  " + "  ".join(f"{c:{w}s}" for c, w in zip(r, widths))).rstrip())
    nm = doc["not_modelled"]
    lines.append("")
    lines.append(f"{len(nm)} architectures not modelled (names from gguf {doc['gguf_version']}):")
    row = "  "
    for name in nm:
        if len(row) + len(name) + 2 > 80:
            lines.append(row.rstrip())
            row = "  "
        row += name + "  "
    lines.append(row.rstrip())
    return "\n".join(lines) + "\n"


def render_archs_json(doc: dict) -> str:
    return json.dumps(doc, indent=1) + "\n"


class Text(Renderer):
    def render(self, doc: dict, opts: RenderOptions) -> str:
        return render_archs_text(doc)


class Json(Renderer):
    def render(self, doc: dict, opts: RenderOptions) -> str:
        return render_archs_json(doc)


#: every ArchsFormat has exactly one renderer
RENDERERS: dict[ArchsFormat, Renderer] = {ArchsFormat.text: Text(), ArchsFormat.json: Json()}
