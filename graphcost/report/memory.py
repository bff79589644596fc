"""``graphcost memory``: the start-up memory breakdown, the sweep table and plot, and the
fused-attention what-if, as plain text (fixed width, no colour) and SVG.

Sizes are printed the way llama.cpp logs them (MiB with two decimals, ``%8.2f`` of
bytes / 1024 / 1024) beside the exact byte counts, so a line can be checked against a
llama.cpp log by eye.
"""
from __future__ import annotations

import math
from html import escape
from pathlib import Path

from ..errors import GraphcostError
from ..ggml_types import type_name
from ..memory_plan import FusionWhatIf, MemoryPlan, describe_tensor

MiB = 1024 * 1024


def mib(n: int) -> str:
    """Bytes as llama.cpp prints them: MiB with two decimals."""
    return f"{n / MiB:.2f}"


def _settings_line(plan: MemoryPlan, swept: str | None = None) -> str:
    """The llama.cpp flags of ``plan`` (without the swept one), and what they resolve to."""
    run = plan.run
    s = run.settings
    flags = [] if swept == "ctx" else [f"-c {s.ctx_size}"]
    flags += [] if swept == "ub" else [f"-ub {s.ubatch_size}"]
    flags += [f"-fa {'on' if run.flash_attn else 'off'}", f"-ctk {type_name(run.type_k)}",
              f"-ctv {type_name(run.type_v)}"] + (["--swa-full"] if s.swa_full else [])
    if swept is not None:
        return "other settings: " + " ".join(flags)
    return f"run: {' '.join(flags)}  (n_ctx {run.n_ctx}, n_ubatch {run.n_ubatch})"


def _rows(rows: list[tuple[str, int | None, str]]) -> list[str]:
    """Label, bytes, remark -> aligned lines: label, MiB, exact bytes, remark."""
    lw = max(len(r[0]) for r in rows)
    bw = max(len(f"{r[1]:,}") for r in rows if r[1] is not None)
    out = [f"  {'':<{lw}}  {'MiB':>10}  {'bytes':>{bw}}"]
    for label, n, note in rows:
        if n is None:
            out.append(f"  {label}")
            continue
        line = f"  {label:<{lw}}  {mib(n):>10}  {n:>{bw},}"
        out.append(line + (f"  ({note})" if note else ""))
    return out


def _peak(plan: MemoryPlan) -> tuple[str, list[str]]:
    """The sentence naming the tensor that sets the peak, and the largest live tensors."""
    w = plan.worst
    a = w.alloc
    node = w.peak_node
    where = f"#{a.peak_index} {node.name} ({node.op})"
    if not a.peak_tensors:
        return f"peak: nothing is live ({w.label} graph)", []
    top, size = a.peak_tensors[0]
    head = (f"peak: {mib(a.peak_bytes)} MiB live at {where} in the {w.label} graph; "
            f"the largest is {top.name} {list(top.ne)} {type_name(top.type)}, "
            f"{mib(size)} MiB: {describe_tensor(top, plan.run)}")
    lines = [f"largest tensors live at the peak ({w.label} graph, {where}):"]
    for t, n in a.peak_tensors[:5]:
        lines.append(f"  {mib(n):>10} MiB  {t.name}  {t.op}  {list(t.ne)} {type_name(t.type)}"
                     f"  {describe_tensor(t, plan.run)}")
    return head, lines


def render_memory(plan: MemoryPlan, fusion: list[FusionWhatIf] | None = None) -> str:
    """The breakdown llama.cpp logs at start-up (weights, KV caches, compute and output
    buffers, total), then how the compute buffer comes about, then the what-if."""
    m = plan.model
    lines = [f"graphcost memory: {m.name} ({m.arch}, {m.n_layer} layers)", _settings_line(plan), ""]
    rows: list[tuple[str, int | None, str]] = [
        ("model weights", plan.weights_bytes, "tensor data in the file")]
    for c in plan.caches:
        rows.append((f"KV cache {c.name}", c.bytes,
                     f"{c.cells} cells, {c.layers} layers, K {c.type_k} {mib(c.k_bytes)} MiB, "
                     f"V {c.type_v} {mib(c.v_bytes)} MiB"))
    if len(plan.caches) > 1:
        rows.append(("KV cache total", plan.kv_cache_bytes, ""))
    w = plan.worst
    rows.append(("compute buffer (CPU)", plan.compute_buffer_bytes,
                 f"set by the {w.label} graph"))
    rows.append(("output buffer (CPU)", plan.output_buffer_bytes,
                 "logits and embeddings of 1 output" if plan.run.settings.embeddings
                 else "logits of 1 output"))
    rows.append(("total", plan.total_bytes, ""))
    lines += _rows(rows)
    lines += ["", "compute buffer: llama.cpp allocates these worst-case graphs (every KV cell "
              "attended) and keeps the larger buffer:"]
    for r in plan.reserves:
        tok = (f"{r.n_tokens} token{'s' if r.n_tokens != 1 else ''}, "
               f"{r.n_outputs} output{'s' if r.n_outputs != 1 else ''}")
        lines.append(f"  {r.label:<10} {tok:<26} {mib(r.alloc.buffer_bytes):>10} MiB"
                     f"   peak live {mib(r.alloc.peak_bytes)} MiB at #{r.alloc.peak_index} "
                     f"{r.peak_node.name}")
    head, live = _peak(plan)
    lines += ["", head] + live
    if fusion:
        lines += [""] + render_fusion(plan, fusion)
    return "\n".join(lines).rstrip() + "\n"


def render_fusion(plan: MemoryPlan, fusion: list[FusionWhatIf]) -> list[str]:
    """Per layer for the graph that sets the compute buffer (``fusion[0]``), then the
    compute buffer each reserve graph would need with fused blocks."""
    f = fusion[0]
    lines = [
        "what-if: each attention block (norm -> QKV -> rope -> attention -> output projection) "
        "as one fused kernel",
        f"{f.graph_label} graph; 'before' = bytes of every result the block writes to the compute "
        "buffer, 'after' = only what leaves the block",
        f"  {'layer':>5}  {'nodes':>5}  {'before MiB':>12}  {'after MiB':>12}  {'never stored MiB':>16}",
    ]
    for lf in f.layers:
        lines.append(f"  {lf.layer:>5}  {lf.nodes:>5}  {mib(lf.before):>12}  {mib(lf.after):>12}"
                     f"  {mib(lf.saved):>16}")
    lines.append(f"  {'total':>5}  {sum(x.nodes for x in f.layers):>5}  {mib(f.before):>12}  "
                 f"{mib(f.after):>12}  {mib(f.saved):>16}")
    for il, why in f.unfused:
        lines.append(f"  layer {il} left unfused: {why}")
    lines.append("compute buffer with fused blocks (the allocator re-run on each fused graph; "
                 "a fused kernel's own scratch is not counted):")
    for g in fusion:
        lines.append(f"  {g.graph_label:<10} {mib(g.buffer_before):>10} MiB -> "
                     f"{mib(g.buffer_after):>10} MiB")
    after = max(g.buffer_after for g in fusion)
    lines.append(f"  {'buffer':<10} {mib(plan.compute_buffer_bytes):>10} MiB -> {mib(after):>10} MiB")
    return lines


# ---- sweep ---------------------------------------------------------------------------------

def _peak_tag(plan: MemoryPlan) -> str:
    a = plan.worst.alloc
    if not a.peak_tensors:
        return "-"
    t, n = a.peak_tensors[0]
    return f"{t.name} {mib(n)} MiB"


def render_sweep(key: str, values: list[int], plans: list[MemoryPlan]) -> str:
    """One row per value: KV cache, compute and output buffers, total, and the tensor
    that sets the compute peak, then what those tensors are."""
    first = plans[0]
    lines = [f"graphcost memory sweep: {first.model.name} ({first.model.arch}), {key} = "
             + ", ".join(str(v) for v in values), _settings_line(first, swept=key),
             f"model weights {mib(first.weights_bytes)} MiB in every row (in the total)", ""]
    hdr = (f"  {key:>7}  {'KV cache':>10}  {'compute':>10}  {'output':>8}  {'total':>10}  "
           "compute peak set by")
    lines += [hdr, "  " + "-" * (len(hdr) - 2)]
    for v, p in zip(values, plans):
        lines.append(f"  {v:>7}  {mib(p.kv_cache_bytes):>10}  {mib(p.compute_buffer_bytes):>10}  "
                     f"{mib(p.output_buffer_bytes):>8}  {mib(p.total_bytes):>10}  {_peak_tag(p)}")
    lines.append("  (MiB)")
    seen: dict[str, str] = {}
    for p in plans:
        if p.worst.alloc.peak_tensors:
            t = p.worst.alloc.peak_tensors[0][0]
            base = t.name.rsplit("-", 1)[0] if t.layer is not None else t.name
            seen.setdefault(base, describe_tensor(t, p.run))
    if seen:
        lines.append("")
        for base, what in seen.items():
            lines.append(f"{base}: {what}")
    if first.run.flash_attn:
        lines.append("flash attention is on: the KQ scores never reach memory; with context only "
                     "the KQ mask (n_kv x tokens, F16) and the KV cache grow")
    else:
        lines.append("flash attention is off: the KQ scores (n_kv x tokens x heads, F32) are "
                     "stored, so the compute buffer grows with context x ubatch")
    return "\n".join(lines) + "\n"


# ---- plot ----------------------------------------------------------------------------------

def _nice_step(span: float, n: int = 5) -> float:
    raw = span / n if span > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt_tick(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 or v == 0 else f"{v:g}"


def sweep_svg(key: str, values: list[int], plans: list[MemoryPlan]) -> str:
    """A line chart (MiB against the swept value, log-2 x axis when the values span 8x or
    more) of weights, KV cache, compute buffer and total, each compute point labelled
    with the tensor that sets its peak. Hand-written SVG: no plotting dependency."""
    W, H = 760, 440
    left, right, top, bottom = 80, 200, 50, 60
    pw, ph = W - left - right, H - top - bottom
    series = [
        ("total", "#222222", [p.total_bytes for p in plans]),
        ("model weights", "#7f7f7f", [p.weights_bytes for p in plans]),
        ("KV cache", "#1f77b4", [p.kv_cache_bytes for p in plans]),
        ("compute buffer", "#d62728", [p.compute_buffer_bytes for p in plans]),
    ]
    ymax = max(max(s[2]) for s in series) / MiB or 1.0
    step = _nice_step(ymax)
    ytop = math.ceil(ymax / step) * step
    logx = len(values) > 1 and min(values) > 0 and max(values) / min(values) >= 8
    fx = (lambda v: math.log2(v)) if logx else (lambda v: float(v))
    x0, x1 = fx(min(values)), fx(max(values))

    def X(v: float) -> float:
        return left + (pw / 2 if x1 == x0 else (fx(v) - x0) / (x1 - x0) * pw)

    def Y(b: float) -> float:
        return top + ph - (b / MiB) / ytop * ph

    name = f"{plans[0].model.name} ({plans[0].model.arch})"
    fa = "on" if plans[0].run.flash_attn else "off"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{left}" y="24" font-size="15">{escape(name)}: memory vs {escape(key)} '
           f'(flash attention {fa})</text>']
    for k in range(round(ytop / step) + 1):
        t = k * step
        y = top + ph - t / ytop * ph
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{_fmt_tick(t)}</text>')
    for v in values:
        x = X(v)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 20}" text-anchor="middle">{v}</text>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2}" y="{H - 18}" text-anchor="middle">{escape(key)}'
               f'{" (log scale)" if logx else ""}</text>')
    out.append(f'<text x="18" y="{top + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {top + ph / 2})">MiB</text>')
    for i, (label, color, ys) in enumerate(series):
        pts = " ".join(f"{X(v):.1f},{Y(b):.1f}" for v, b in zip(values, ys))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for v, b in zip(values, ys):
            out.append(f'<circle cx="{X(v):.1f}" cy="{Y(b):.1f}" r="3" fill="{color}"/>')
        ly = top + 10 + i * 18
        out.append(f'<line x1="{left + pw + 16}" y1="{ly}" x2="{left + pw + 36}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{left + pw + 42}" y="{ly + 4}">{label}</text>')
    for v, p in zip(values, plans):  # what sets each compute point
        tag = p.worst.alloc.peak_tensors[0][0].name if p.worst.alloc.peak_tensors else ""
        last = v == max(values)  # label the rightmost point on its left, clear of the legend
        anchor = ' text-anchor="end"' if last else ""
        out.append(f'<text x="{X(v) + (-5 if last else 5):.1f}" y="{Y(p.compute_buffer_bytes) - 6:.1f}" '
                   f'font-size="10" fill="#d62728"{anchor}>{escape(tag)}</text>')
    out.append(f'<text x="{left + pw + 16}" y="{top + 100}" font-size="10">red labels: the tensor</text>')
    out.append(f'<text x="{left + pw + 16}" y="{top + 113}" font-size="10">that sets the compute peak</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_plot(path: Path, key: str, values: list[int], plans: list[MemoryPlan]) -> None:
    """``.svg``: hand-written; ``.png``: needs matplotlib, refused cleanly without it."""
    suffix = path.suffix.lower()
    if suffix == ".svg":
        text = sweep_svg(key, values, plans)
        try:
            path.write_text(text)
        except OSError as e:
            raise GraphcostError(f"{path}: cannot write: {e.strerror or e}") from None
        return
    if suffix != ".png":
        raise GraphcostError(f"-o {path}: the plot is written as .svg or .png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise GraphcostError(f"-o {path}: a PNG needs matplotlib (pip install matplotlib); "
                             "an .svg needs nothing") from None
    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    for label, ys in (("total", [p.total_bytes for p in plans]),
                      ("model weights", [p.weights_bytes for p in plans]),
                      ("KV cache", [p.kv_cache_bytes for p in plans]),
                      ("compute buffer", [p.compute_buffer_bytes for p in plans])):
        ax.plot(values, [y / MiB for y in ys], marker="o", label=label)
    for v, p in zip(values, plans):
        if p.worst.alloc.peak_tensors:
            ax.annotate(p.worst.alloc.peak_tensors[0][0].name, (v, p.compute_buffer_bytes / MiB),
                        fontsize=7, textcoords="offset points", xytext=(4, 4))
    if min(values) > 0 and max(values) / min(values) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(key)
    ax.set_ylabel("MiB")
    ax.set_title(f"{plans[0].model.name}: memory vs {key}")
    ax.legend()
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as e:
        raise GraphcostError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        plt.close(fig)
