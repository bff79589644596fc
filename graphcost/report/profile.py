"""``graphcost profile --format table|json``: one :class:`~.renderer.Renderer` per format."""
from __future__ import annotations

import io
import json
import math
from enum import Enum

from rich import box
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from graphcost.document import SCHEMA
from graphcost.execute.profile import NodeRow, Profile, Rollup
from graphcost.document import non_finite
from graphcost.report.renderer import Renderer, RenderOptions
from graphcost.units import human_bytes, human_count, literal


class ProfileFormat(str, Enum):
    table = "table"
    json = "json"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f}"


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:.1f}"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _overhead(p: Profile) -> str:
    o = p.timing_overhead()
    _, steps = p.phase()
    pairs = sum(len(s.timed_runs) for s in steps)
    return "" if o is None else (f"; node timing adds {o:+.1%} to a step (median of "
                                 f"{pairs} timed/untimed pairs)")


def _rollup_table(title: str, key: str, rows: list[Rollup]) -> RichTable:
    t = RichTable(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    # FLOPs are in the JSON document; here GFLOP/s says the same beside the time
    for col, just in ((key, "left"), ("nodes", "right"), ("ms", "right"), ("bytes", "right"),
                      ("GB/s", "right"), ("GFLOP/s", "right"), ("roof ms", "right"),
                      ("ratio", "right"), ("model ms", "right"), ("ratio", "right")):
        t.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        t.add_row("-" if r.key is None else str(r.key), str(r.count), _ms(r.seconds),
                  human_bytes(r.bytes), _rate(r.gbps), _rate(r.gflops),
                  _ms(r.predicted), _ratio(r.ratio), _ms(r.modelled), _ratio(r.model_ratio))
    return t


def _node_table(title: str, rows: list[NodeRow]) -> RichTable:
    t = RichTable(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    for col, just in (("#", "right"), ("node", "left"), ("op", "left"), ("us", "right"),
                      ("bytes", "right"), ("FLOPs", "right"), ("GB/s", "right"),
                      ("GFLOP/s", "right"), ("roof us", "right"), ("ratio", "right")):
        t.add_column(col, justify=just, overflow="ellipsis", no_wrap=True,
                     max_width=20 if col == "node" else None)
    for n in rows:
        t.add_row(str(n.index), n.name, n.op + ("*" if n.numpy else ""), _us(n.seconds),
                  "-" if n.bytes is None else human_bytes(n.bytes),
                  "-" if n.flops is None else human_count(n.flops), _rate(n.gbps),
                  _rate(n.gflops), _us(n.predicted), _ratio(n.ratio))
    return t


def render_table(p: Profile, *, width: int = 100, top: int = 20, color: bool = False) -> str:
    buf = io.StringIO()
    # markup and emoji codes off: strings from files are shown literally, never parsed
    con = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                  color_system="standard" if color else None, highlight=False, markup=False,
                  emoji=False)
    s, hw = p.settings, p.hardware
    con.print(Text(literal(p.model_name), style="bold")
              + Text(f" ({p.arch}) on graphcost's Numba kernels"))
    con.print(f"run: -c {s['n_ctx']} -ub {s['n_ubatch']} -fa {s['flash_attn']} "
              f"-ctk {s['cache_type_k']} -ctv {s['cache_type_v']}"
              + (f" -d {p.depth} (cells filled first, untimed)" if p.depth else "")
              + f"; numerics {p.numerics}; "
              f"{p.threads} threads; median of {p.repeat}")
    con.print(f"hardware: {literal(hw.name)} ({hw.kind}): {hw.bandwidth / 1e9:.2f} GB/s, "
              f"{hw.peak_flops / 1e9:.1f} GFLOP/s"
              + (f", {hw.overhead * 1e6:.1f} us per op" if hw.overhead else ""))
    nc = p.numba_cache
    con.print(f"kernels: import {p.kernels_import:.2f} s; first-run overhead "
              f"{p.first_run_overhead:.2f} s (Numba: {nc['misses']} compiled, "
              f"{nc['hits']} loaded from cache) -- not in any timing below")
    tps = p.tokens_per_second()

    def rate(key):
        return "-" if tps[key] is None else f"{tps[key]:.2f}"
    con.print(f"tokens/s: prompt {rate('prompt_untimed')} ({p.prompt.n_tokens} tokens), decode "
              f"{rate('decode_untimed')} untimed (Executor.step replayed, median of {p.repeat}); "
              f"with every node timed: prompt {rate('prompt')}, decode {rate('decode')}"
              + _overhead(p))

    st = RichTable(title="Steps", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    # untimed / timed: Executor.step replayed (medians); graph: the node-timed runs of the
    # graph alone (inputs filled before), whose node times sum to about it
    for col in ("step", "tokens", "past", "argmax", "logit", "untimed ms", "timed ms",
                "graph ms", "nodes ms"):
        st.add_column(col, justify="right")
    for i, step in enumerate(p.steps):
        st.add_row(str(i), str(step.n_tokens), str(step.past), str(step.argmax),
                   f"{step.top5[0][1]:.3f}", _ms(step.untimed), _ms(step.timed),
                   _ms(step.wall), _ms(step.node_seconds))
    con.print(st)

    phase, steps = p.phase()
    per = "per token" if phase == "decode" else "prompt step"
    con.print(_rollup_table(f"Per op kind ({phase}, {per})", "op", p.by_op()))
    con.print(_rollup_table(f"Per layer ({phase}, {per}; '-' = outside the layers)", "layer",
                            p.by_layer()))
    last = steps[-1]
    ran = [n for n in last.nodes if not n.view]
    ran.sort(key=lambda n: -(n.seconds or 0))
    shown = ran if top <= 0 else ran[:top]
    con.print(_node_table(f"Slowest nodes (step {p.steps.index(last)}: "
                          f"{len(shown)} of {len(ran)} executed; * = numpy)", shown))
    # the roll-ups' phase, then the prompt step's own when there are decode steps
    for ph in [phase] + (["prompt"] if phase == "decode" else []):
        acc = p.estimate_accuracy(phase=ph)
        if acc["median_abs_error"] is None:
            continue
        con.print(f"estimate accuracy ({ph}, {acc['nodes']} nodes > 10 us): median "
                  f"|estimate/measured - 1| = {acc['median_abs_error']:.2f} for the roofline, "
                  f"{acc['median_abs_error_model']:.2f} for the executor model; the model per "
                  "op kind: " + ", ".join(f"{op} {a['median_abs_error_model']:.2f} ({a['nodes']})"
                                         for op, a in sorted(acc["by_op"].items(),
                                                             key=lambda kv: -kv[1]["nodes"])))
    for note in p.notes:
        con.print(f"note: {literal(note)}")
    return buf.getvalue()


def _node_dict(n: NodeRow) -> dict:
    return {"index": n.index, "name": n.name, "op": n.op, "layer": n.layer, "block": n.block,
            "view": n.view, "seconds": n.seconds, "bytes": n.bytes, "flops": n.flops,
            "gbps": n.gbps, "gflops": n.gflops, "predicted_seconds": n.predicted,
            "modelled_seconds": n.modelled, "bound": n.bound, "ratio": n.ratio, "numpy": n.numpy}


def _rollup_dict(r: Rollup) -> dict:
    return {"key": r.key, "nodes": r.count, "seconds": r.seconds, "bytes": r.bytes,
            "flops": r.flops, "predicted_seconds": r.predicted, "ratio": r.ratio,
            "modelled_seconds": r.modelled, "model_ratio": r.model_ratio}


def document(p: Profile) -> dict:
    phase, _ = p.phase()
    return {
        "schema": SCHEMA,
        "model": {"path": p.model_path, "name": p.model_name, "architecture": p.arch},
        "run": p.settings,
        "executor": {"numerics": p.numerics, "threads": p.threads, "repeat": p.repeat,
                     "depth": p.depth},
        "hardware": p.hardware.to_dict(),
        "compile": {"kernels_import_seconds": p.kernels_import,
                    "first_run_overhead_seconds": p.first_run_overhead,
                    "numba_cache": p.numba_cache},
        "tokens_per_second": p.tokens_per_second(),
        "node_timing_overhead": p.timing_overhead(),
        "rollup_phase": phase,
        "by_op": [_rollup_dict(r) for r in p.by_op()],
        "by_layer": [_rollup_dict(r) for r in p.by_layer()],
        "estimate_accuracy": p.estimate_accuracy(),
        "estimate_accuracy_all_nodes": p.estimate_accuracy(0.0),
        # the prompt step's own (the two above are the roll-ups' phase: decode if any)
        "estimate_accuracy_prompt": p.estimate_accuracy(phase="prompt"),
        "notes": p.notes,
        "steps": [{"n_tokens": s.n_tokens, "past": s.past, "argmax": s.argmax,
                   "top5": [[t, v] for t, v in s.top5], "wall_seconds": s.wall,
                   "untimed_seconds": s.untimed, "timed_seconds": s.timed,
                   "untimed_runs_seconds": s.untimed_runs, "timed_runs_seconds": s.timed_runs,
                   "warmup_seconds": s.warmup, "nodes": [_node_dict(n) for n in s.nodes]}
                  for s in p.steps],
    }


def _nulled(doc):
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: _nulled(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_nulled(v) for v in doc]
    return doc


class Json(Renderer):
    """Every step and node (:func:`document`). Measured values can be non-finite (NaN
    logits from a model that overflows): they are written as null and flagged in
    ``notes``, never as the ``NaN`` json.dumps would write (not JSON)."""

    def render(self, p: Profile, opts: RenderOptions) -> str:
        doc = document(p)
        bad = non_finite(doc)
        if bad:
            doc = _nulled(doc)
            doc["notes"] = list(doc["notes"]) + [
                f"{len(bad)} non-finite value(s) written as null, first at {bad[0]}"]
        return json.dumps(doc, indent=1, allow_nan=False) + "\n"


class Table(Renderer):
    """Rollups and the ``--top`` slowest nodes (default 20, 0 = all)."""

    uses = frozenset({"top"})
    colour = True

    def render(self, p: Profile, opts: RenderOptions) -> str:
        return render_table(p, width=opts.width, top=20 if opts.top is None else opts.top,
                            color=opts.color)


#: every ProfileFormat has exactly one renderer (tests check this)
RENDERERS: dict[ProfileFormat, Renderer] = {
    ProfileFormat.table: Table(),
    ProfileFormat.json: Json(),
}
