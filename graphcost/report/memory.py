"""``graphcost memory``: the start-up memory breakdown, the sweep table, and the
fused-attention what-if, as plain text (fixed width, no colour); the sweep plot is
drawn by :mod:`graphcost.report.plot`.

Sizes are printed the way llama.cpp logs them (MiB with two decimals:
:func:`graphcost.units.mib`) beside the exact byte counts, so a line can be checked
against a llama.cpp log by eye.
"""
from __future__ import annotations

from pathlib import Path

from graphcost.format.ggml_types import type_name
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import Op
from graphcost.graph.settings import Resolved
from graphcost.memory.fusion import FusionWhatIf
from graphcost.memory.plan import MemoryPlan
from graphcost.units import literal, mib


def describe_tensor(t: Tensor, run: Resolved) -> str:
    """A short human label for a big tensor: what it is and what it grows with."""
    base = t.name.rsplit("-", 1)[0] if t.layer is not None else t.name
    if base in ("kq", "kq_soft_max"):
        return "KQ scores (n_kv x tokens x heads; grows with context x ubatch)"
    if base == "result_output":
        return "logits (n_vocab x outputs; grows with ubatch)"
    if base == "attn_inp_kq_mask":
        return ("KQ mask (n_kv x tokens, " + ("F16" if run.flash_attn else "F32")
                + "; grows with context x ubatch)")
    if t.op == Op.FLASH_ATTN_EXT:
        return "flash-attention output (head_dim x heads x tokens)"
    if t.role == "input":
        return "graph input"
    if base == "result_norm":
        return "final norm (graph output, kept to the end)"
    return f"{t.op} result (grows with ubatch)"


def _settings_line(plan: MemoryPlan, swept: str | None = None) -> str:
    """The llama.cpp flags of ``plan`` (without the swept one), and what they resolve to."""
    run = plan.run
    s = run.settings
    flags = [] if swept == "ctx" else [f"-c {s.ctx_size}"]
    flags += [] if swept == "ub" else [f"-ub {s.ubatch_size}"]
    flags += [f"-fa {'on' if run.flash_attn else 'off'}", f"-ctk {type_name(run.type_k)}",
              f"-ctv {type_name(run.type_v)}"] + (["--swa-full"] if s.swa_full else [])
    flags += ([f"-np {run.n_seq_max}"] if run.n_seq_max != 1 else []) + (
        ["-kvu"] if s.kv_unified else [])
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
    lines = [f"graphcost memory: {m.name} ({m.arch}, {m.n_layer} layers)", _settings_line(plan)]
    if m.header.data_note:
        lines.append(f"note: {m.header.data_note}")
    lines.append("")
    rows: list[tuple[str, int | None, str]] = [
        ("model weights", plan.weights_bytes, "tensor data in the file")]
    for c in plan.caches:
        rows.append((f"KV cache {c.name}", c.bytes,
                     f"{c.cells} cells"
                     + (f" x {c.streams} streams" if c.streams != 1 else "")
                     + f", {c.layers} layers, K {c.type_k} {mib(c.k_bytes)} MiB, "
                     f"V {c.type_v} {mib(c.v_bytes)} MiB"))
    if len(plan.caches) > 1:
        rows.append(("KV cache total", plan.kv_cache_bytes, ""))
    for st in plan.states:
        rows.append(("recurrent state", st.bytes,
                     f"{st.cells} cell{'s' if st.cells != 1 else ''}, {st.layers} layers, "
                     f"R f32 {mib(st.r_bytes)} MiB, S f32 {mib(st.s_bytes)} MiB"))
    w = plan.worst
    rows.append(("compute buffer (CPU)", plan.compute_buffer_bytes,
                 f"set by the {w.label} graph"))
    n_out = plan.run.n_seq_max  # output_reserve(n_seq_max): one output per sequence
    rows.append(("output buffer (CPU)", plan.output_buffer_bytes,
                 ("logits and embeddings" if plan.run.settings.embeddings else "logits")
                 + f" of {n_out} output{'s' if n_out != 1 else ''}"))
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
    return literal("\n".join(lines).rstrip(), keep_newlines=True) + "\n"


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
             f"model weights {mib(first.weights_bytes)} MiB in every row (in the total)"]
    if first.states:
        lines.append(f"recurrent state {mib(first.recurrent_state_bytes)} MiB in every row "
                     "(in the total)")
    if first.model.header.data_note:
        lines.append(f"note: {first.model.header.data_note}")
    lines.append("")
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
    return literal("\n".join(lines), keep_newlines=True) + "\n"


# ---- plot ----------------------------------------------------------------------------------

def write_plot(path: Path, key: str, values: list[int], plans: list[MemoryPlan]) -> None:
    """The sweep as ``.png`` or ``.svg`` (graphcost.report.plot, matplotlib)."""
    from graphcost.report.plot import write_sweep_plot
    write_sweep_plot(path, key, values, plans)


# ---- devices -------------------------------------------------------------------------------

def _cell(n: int | None) -> str:
    return "n/m" if n is None else mib(n)


def render_devices(dp) -> str:
    """``graphcost memory ... --device``: one row per device, in llama.cpp's device order
    and names, then the model buffers llama.cpp logs by name and where each layer went.
    "n/m" = not modelled (never a zero standing in for an unknown)."""
    plan, p, flags = dp.plan, dp.placement, dp.flags
    m = plan.model
    lines = [f"graphcost memory: {m.name} ({m.arch}, {m.n_layer} layers)", _settings_line(plan)]
    feats = ", ".join(sorted(p.cpu_features)) or "none"
    lines.append(f"placement: {'mmap' if p.use_mmap else 'no mmap'}, "
                 f"{'KV on the CPU (-nkvo)' if flags.no_kv_offload else 'KV with its layer'}, "
                 f"repack {'on' if flags.repack else 'off'} (CPU features: {feats})")
    if any(d.backend.name == "metal" for d in p.devices) and "neon" not in p.cpu_features:
        # a Metal device sits beside an Apple (ARM) CPU: x86 features repack other weights
        lines.append("note: a Metal device runs beside an Apple CPU, but these CPU features are "
                     "not ARM's: give the Mac's (--cpu-features neon,dotprod[,i8mm]) for its "
                     "CPU_REPACK")
    lines.append("")
    hdr = (f"  {'device':<12} {'model':>10} {'KV':>10} {'recurrent':>10} {'compute':>10} "
           f"{'output':>8} {'total':>10} {'free':>10} {'left':>10}")
    lines += [hdr, "  " + "-" * (len(hdr) - 2)]
    for r in dp.rows:
        parts = [r.model_bytes, r.kv_bytes, r.recurrent_state_bytes, r.compute_bytes, r.output_bytes]
        total = None if any(x is None for x in parts) else sum(parts)
        left = None
        if r.free_bytes is not None and total is not None:
            left = r.free_bytes - total
        lines.append(f"  {r.device:<12} {_cell(r.model_bytes):>10} {_cell(r.kv_bytes):>10} "
                     f"{_cell(r.recurrent_state_bytes):>10} {_cell(r.compute_bytes):>10} "
                     f"{_cell(r.output_bytes):>8} {_cell(total):>10} "
                     f"{'' if r.free_bytes is None else mib(r.free_bytes):>10} "
                     f"{'' if left is None else mib(left):>10}")
    lines.append("  (MiB; n/m = not modelled)")
    if (any(r.compute_bytes is None for r in dp.rows)
            and not any(n.startswith("compute buffers not modelled") for n in p.notes)):
        lines.append("  compute buffers are not modelled for these devices (their scheduler "
                     "facts - supported ops, offload, graph optimisation - are not in "
                     "specs/backends)")
    if dp.compute is not None:
        c = dp.compute
        per = ", ".join(f"{lab} {len(s.splits)} splits, {mib(s.copy_bytes)} MiB copied"
                        for lab, s in c.schedules)
        lines.append(f"scheduler: {per}; input copies x{c.n_copies}"
                     + (" (pipeline parallelism)" if c.n_copies > 1 else ""))
    lines += ["", "model buffers (as llama.cpp logs them: load_tensors: NAME model buffer size):"]
    for b in p.model_buffers:
        lines.append(f"  {b.name:<14} {_cell(b.bytes):>10} MiB  "
                     f"{'' if b.bytes is None else f'{b.bytes:,} bytes'}")
    spans = []
    start = 0
    for il in range(1, len(p.dev_layer) + 1):
        if il == len(p.dev_layer) or p.dev_layer[il] != p.dev_layer[start]:
            rng = f"{start}" if il - 1 == start else f"{start}-{il - 1}"
            spans.append(f"{rng} {p.dev_layer[start]}")
            start = il
    lines.append(f"layers: {', '.join(spans)}; output layer {p.dev_output}; input layer CPU")
    if p.repacked:
        lines.append(f"CPU_REPACK holds {len(p.repacked)} weight(s) (repack.cpp: "
                     "ggml_repack_get_optimal_repack_type for these CPU features)")
    lines += p.notes
    return "\n".join(lines) + "\n"


def devices_json(dp) -> dict:
    """``memory.devices`` and the model buffers, for --format json."""
    return {"devices": dp.as_dict(),
            "model_buffers": [{"name": b.name, "device": b.row, "bytes": b.bytes}
                              for b in dp.placement.model_buffers],
            "kv_buffers": [{"cache": b.cache, "device": b.row, "bytes": b.bytes}
                           for b in dp.kv_buffers],
            "layers": dp.placement.dev_layer, "output_layer": dp.placement.dev_output,
            "repacked": dp.placement.repacked, "use_mmap": dp.placement.use_mmap,
            "cpu_features": sorted(dp.placement.cpu_features),
            "notes": list(dp.placement.notes),
            "scheduler": None if dp.compute is None else sched_json(dp.compute)}


def sched_json(c) -> dict:
    """The scheduler's view of each reserve graph: splits (backend, first and last node,
    inputs copied in) and the bytes copied between backends; n_copies (4: pipeline
    parallelism)."""
    from graphcost.memory.sched import schedule_dict
    return {"n_copies": c.n_copies,
            "compute_buffers": c.bytes_by_buft,
            "graphs": [{"graph": lab, **schedule_dict(s)} for lab, s in c.schedules]}
