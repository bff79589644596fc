"""``--format html``: one self-contained page (inline CSS and JS, nothing fetched) that
shows the same document ``--format json`` writes (:func:`graphcost.document.document`)
or, for ``graphcost memory``, :func:`graphcost.document.memory_document`.

The page is the template ``html_template.html`` (shipped in the package) with the
document embedded as JSON in a ``<script type="application/json">`` element; every
``<``, ``>`` and ``&`` in it is written as a ``\\u`` escape, so nothing from the file (a
model called ``</script><img onerror=...>``) can end the element or form markup, and the
page's script puts every string on screen with ``textContent``, never as HTML.
"""
from __future__ import annotations

import json
from importlib.resources import files

TEMPLATE = "html_template.html"
_SLOT = "/*GRAPHCOST_DATA*/"
_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
            "\u2029": "\\u2029"}
_TABLE = str.maketrans(_ESCAPES)


def embed_json(data: dict) -> str:
    """``data`` as JSON that is safe inside a ``<script>`` element (and still the same
    JSON to ``JSON.parse``)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.translate(_TABLE)


def render_page(kind: str, doc: dict) -> str:
    """The page for ``kind`` ("analyze" or "memory") showing ``doc``."""
    template = files(__package__).joinpath(TEMPLATE).read_text(encoding="utf-8")
    assert template.count(_SLOT) == 1, "the template has one data slot"
    payload = embed_json({"kind": kind, "doc": doc})
    return template.replace(_SLOT, payload)


def render_analysis(a, *, hardware=None, cpu_features=None) -> str:
    """``analyze --format html``: the JSON report's document, drawn."""
    from graphcost.document import document
    return render_page("analyze", document(a, hardware=hardware, cpu_features=cpu_features))


def render_memory_page(plan, sweep=None) -> str:
    """``memory --format html``."""
    from graphcost.document import memory_document
    return render_page("memory", memory_document(plan, sweep))
