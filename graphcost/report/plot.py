"""The memory sweep as a picture (``graphcost memory --sweep ... -o FILE.png|.svg``),
drawn with matplotlib (the optional extra ``graphcost[plot]``).

Three panels share the swept axis, each with its own byte unit, so no series lies flat
against a larger one: the total (model weights dashed beneath it), the KV cache, and
the compute buffer (with the output buffer where it is not negligible). The compute
points are labelled with the tensor that sets the peak, once per run of points where
it stays the same; labels that would overlap another label, the legend or a tick label
move, and are dropped (the table printed beside the plot has them all) when no place is
free. Only matplotlib's object API is used (no pyplot state, no backend switch).
"""
from __future__ import annotations

import io
from pathlib import Path

from graphcost.errors import GraphcostError
from graphcost.files import write_atomic
from graphcost.memory.plan import MemoryPlan
from graphcost.units import literal

#: binary units, largest first: a panel uses the largest unit its maximum reaches
UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
SUFFIXES = (".png", ".svg")
#: a panel whose series span this ratio or more is drawn on a log scale
LOG_Y_SPAN = 16
#: label offsets (points) tried in turn before a label is dropped
_OFFSETS = ((4, 6), (4, -14), (-4, 18), (-4, -26), (4, 30), (4, -38))


def byte_unit(max_bytes: float) -> tuple[str, int]:
    """The unit a panel whose largest value is ``max_bytes`` is drawn in: 100 GiB -> GiB,
    300 MiB -> MiB (the largest unit the maximum reaches at least once)."""
    for name, size in UNITS:
        if max_bytes >= size:
            return name, size
    return UNITS[-1]


def _import_matplotlib(path: Path):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator
    except ImportError:
        raise GraphcostError(f"-o {path}: plots need matplotlib: pip install 'graphcost[plot]'") \
            from None
    return (lambda **kw: FigureCanvasAgg(Figure(**kw)).figure), FixedLocator, FuncFormatter, \
        LogLocator, NullLocator


def _base_name(plan: MemoryPlan) -> str:
    """The peak tensor's name without its layer suffix (``kq-31`` -> ``kq``)."""
    a = plan.worst.alloc
    if not a.peak_tensors:
        return ""
    t = a.peak_tensors[0][0]
    return t.name.rsplit("-", 1)[0] if t.layer is not None else t.name


def sweep_figure(key: str, values: list[int], plans: list[MemoryPlan], path: Path | str = "plot"):
    """The sweep as a matplotlib ``Figure`` (3 panels); labels already decluttered."""
    Figure, FixedLocator, FuncFormatter, LogLocator, NullLocator = _import_matplotlib(Path(path))
    first = plans[0]
    fig = Figure(figsize=(8.0, 8.4), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    fa = "on" if first.run.flash_attn else "off"
    # the name from the file shown literally: control characters escaped (not allowed in
    # the SVG's XML), no mathtext ('$...$' would be parsed as math)
    fig.suptitle(f"{literal(first.model.name)} ({first.model.arch}): memory vs {key}, "
                 f"flash attention {fa}", fontsize=12, parse_math=False)
    logx = len(values) > 1 and min(values) > 0 and max(values) / min(values) >= 8
    weights = [p.weights_bytes for p in plans]
    compute = [p.compute_buffer_bytes for p in plans]
    output = [p.output_buffer_bytes for p in plans]
    panels = [
        ("total at start-up", [("total", [p.total_bytes for p in plans], "#222222", "-"),
                               ("model weights", weights, "#7f7f7f", "--")]),
        ("KV cache", [("KV cache", [p.kv_cache_bytes for p in plans], "#1f77b4", "-")]),
        ("compute buffer", [("compute buffer", compute, "#d62728", "-")]),
    ]
    # the output buffer (logits) joins the compute panel only where it would be visible
    if max(output) * 20 >= max(compute):
        panels[2][1].append(("output buffer", output, "#ff7f0e", "-"))
        note = ""
    else:
        note = (f"; the output buffer is {_fmt(max(output))} at every point" if min(output) == max(output)
                else f"; output buffer up to {_fmt(max(output))}")
    for i, (ax, (title, series)) in enumerate(zip(axes, panels)):
        top = max(max(ys) for _, ys, _, _ in series)
        low = min(min(ys) for _, ys, _, _ in series)
        unit, size = byte_unit(top)
        for label, ys, color, style in series:
            ax.plot(values, [y / size for y in ys], marker="o", color=color, linestyle=style,
                    label=label)
        ax.set_ylabel(unit)
        # a series spanning 16x or more: log scale, so its small values stay readable
        logy = low > 0 and top / low >= LOG_Y_SPAN
        if logy:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_locator(NullLocator())
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylim(low / size / 1.6, top / size * 2.5)
        else:
            ax.set_ylim(0, top / size * 1.25 if top else 1)
        ax.grid(True, color="#e5e5e5")
        ax.set_title(title + (" (log scale)" if logy else "") + (
            "\nred labels: the tensor that sets its peak" + note if i == 2 else ""),
            fontsize=10, loc="left")
        if len(series) > 1:
            ax.legend(loc="best", fontsize=9)
    ax = axes[-1]
    if logx:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(values, [str(v) for v in values])
    ax.set_xlabel(key + (" (log scale)" if logx else ""))
    # the tensor that sets the compute peak, once per run of equal names
    runs: list[list[int]] = []  # indices of consecutive points with the same peak tensor
    names = [_base_name(p) for p in plans]
    for i, name in enumerate(names):
        if i and name == names[i - 1]:
            runs[-1].append(i)
        else:
            runs.append([i])
    labels = []
    csize = byte_unit(max(compute))[1]
    for run in runs:
        i, j = run[0], run[-1]
        if not names[i]:
            continue
        text = names[i] + (f" ({values[i]}-{values[j]})" if j > i else "")
        labels.append(axes[2].annotate(text, (values[i], compute[i] / csize),
                                       textcoords="offset points", xytext=_OFFSETS[0],
                                       fontsize=8, color="#d62728",
                                       bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none",
                                                 alpha=0.85)))
    _declutter(fig, axes, labels)
    return fig


def _fmt(n: int) -> str:
    unit, size = byte_unit(n)
    return f"{n / size:.2f} {unit}" if size > 1 else f"{n} B"


def _declutter(fig, axes, labels) -> None:
    """Move each label to the first offset where it overlaps no tick label, legend, title
    or earlier label and stays inside its panel; hide it if there is none (bounded:
    len(_OFFSETS) tries per label)."""
    fig.canvas.draw()  # lay out once so tick labels and legends have their boxes
    r = fig.canvas.get_renderer()
    last = None  # swept values close together: keep every tick label that has room
    for t in _tick_labels(axes[-1].xaxis, axes[-1].get_xlim()):
        b = t.get_window_extent(r)
        if last is not None and b.overlaps(last):
            t.set_visible(False)
        else:
            last = b
    taken = [t.get_window_extent(r) for ax in axes for t in _fixed_texts(ax) if _shown(t)]
    for lab in labels:
        box = None
        for off in _OFFSETS:
            lab.set_position(off)
            b = lab.get_window_extent(r)
            inside = lab.axes.bbox.contains(b.x0, b.y0) and lab.axes.bbox.contains(b.x1, b.y1)
            if inside and not any(b.overlaps(t) for t in taken):
                box = b
                break
        if box is None:
            lab.set_visible(False)
        else:
            taken.append(box)


def _tick_labels(axis, lim) -> list:
    """The tick labels matplotlib draws: those of ticks inside the view limits."""
    lo, hi = sorted(lim)
    span = (hi - lo) * 1e-9
    return [t.label1 for t in axis.get_major_ticks()
            if lo - span <= t.get_loc() <= hi + span and t.label1.get_visible()]


def _fixed_texts(ax):
    out = _tick_labels(ax.xaxis, ax.get_xlim()) + _tick_labels(ax.yaxis, ax.get_ylim()) + [
        ax.title, ax.xaxis.label, ax.yaxis.label]
    leg = ax.get_legend()
    if leg is not None:
        out.append(leg)
    return out


def visible_text_boxes(fig) -> list[tuple[str, object]]:
    """Every visible, non-empty text (and legend) of the figure with its window box, for
    the overlap test."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        for t in _fixed_texts(ax) + list(ax.texts):
            if _shown(t):
                out.append((getattr(t, "get_text", lambda: "legend")(), t.get_window_extent(r)))
    return out


def _shown(t) -> bool:
    """A visible artist with something in it (an empty title takes no room)."""
    return t.get_visible() and (not hasattr(t, "get_text") or bool(t.get_text()))


def check_plot_path(path: Path) -> None:
    """Refuse a plot file graphcost cannot write (suffix, or no matplotlib) before any
    work is done."""
    if path.suffix.lower() not in SUFFIXES:
        raise GraphcostError(f"-o {path}: the plot is written as .svg or .png")
    _import_matplotlib(path)


def write_sweep_plot(path: Path, key: str, values: list[int], plans: list[MemoryPlan]) -> None:
    """``.png`` or ``.svg`` by the file's suffix."""
    check_plot_path(path)
    fig = sweep_figure(key, values, plans, path)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lower()[1:], dpi=120)
    write_atomic(path, buf.getvalue())  # temp file beside it, then rename
