"""The table ``graphcost check`` prints when costs drifted from the baseline."""
from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from graphcost.check import Drift
from graphcost.units import literal


def _fmt(v: float | None) -> str:
    return "(absent)" if v is None else f"{v:,}"


def render_drift(drifts: list[Drift], rtol: float) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=100, no_color=True, highlight=False, markup=False, emoji=False)
    t = Table(title=f"{len(drifts)} metric(s) moved more than rtol {rtol}", box=box.SIMPLE_HEAD,
              title_justify="left", pad_edge=False)
    t.add_column("metric")
    t.add_column("baseline", justify="right")
    t.add_column("now", justify="right")
    t.add_column("change", justify="right")
    for d in drifts:
        rel = "new" if d.baseline is None else "gone" if d.current is None else \
            ("inf" if d.rel == float("inf") else f"{(d.current - d.baseline) / d.baseline:+.3%}")
        t.add_row(literal(d.metric), _fmt(d.baseline), _fmt(d.current), rel)
    con.print(t)
    return buf.getvalue()
