"""``--format summary``: rich tables of totals, per op kind, per block, per layer, memory.

Fits 80 columns; without a terminal (piped) rich drops colour and the tables stay plain.
"""
from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from graphcost.cost.analysis import READ_KINDS, Analysis, Cost
from graphcost.cost.costs import FLOP_KINDS
from graphcost.cost.experts import expert_weights
from graphcost.format.ggml_types import type_name
from graphcost.units import human_bytes, human_count, literal


def _cost_table(title: str, key: str, rows: list[tuple[str, Cost]]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column(key)
    for col in ("read", "weights", "kv", "written", "FLOPs"):
        t.add_column(col, justify="right")
    for k, c in rows:
        t.add_row(k, human_bytes(c.bytes_read), human_bytes(c.read.get("weights", 0)),
                  human_bytes(c.read.get("kv", 0)), human_bytes(c.bytes_written),
                  human_count(c.flops))
    return t


def render_summary(a: Analysis, *, width: int = 80, color: bool = False, hardware=None,
                   cpu_features=None) -> str:
    bg, m, run = a.graph, a.graph.model, a.graph.run
    buf = io.StringIO()
    # markup and emoji codes off: strings from the file are shown literally, never parsed
    con = Console(file=buf, width=width, force_terminal=color, no_color=not color,
                  color_system="standard" if color else None, highlight=False, markup=False,
                  emoji=False)
    con.print(Text(literal(m.name), style="bold"))
    con.print(f"model: {m.arch}, {m.n_layer} layers, {human_count(m.n_params)} params, "
              f"{human_bytes(m.weights_bytes)} weights")
    con.print(f"run: -c {run.n_ctx} -ub {run.n_ubatch} -fa {'on' if run.flash_attn else 'off'} "
              f"-ctk {type_name(run.type_k)} -ctv {type_name(run.type_v)}"
              f"{' --swa-full' if run.settings.swa_full else ''}"
              f"{f' -np {run.n_seq_max}' if run.n_seq_max != 1 else ''}"
              f"{' -kvu' if run.settings.kv_unified else ''}"
              f"{run.flavour.cli_flag()}")
    con.print(f"step: --tokens {run.n_tokens} --past {run.past} --outputs {run.n_outputs}")
    if a.graph.caches:
        con.print(f"attends n_kv = {run.n_kv} cells"
                  f"{'' if run.n_kv_swa is None else f' ({run.n_kv_swa} in sliding-window layers)'}")
    else:
        con.print(f"no KV cache: attends the ubatch's own {run.n_tokens} tokens")
    for note in run.notes:
        con.print(f"note: {literal(note)}")
    if m.header.data_note:
        con.print(f"note: {literal(m.header.data_note)}")

    tot = a.total
    t = Table(title="Totals for one ubatch", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_column("exact", justify="right")
    t.add_row("nodes", str(len(a.nodes)), "")
    t.add_row("bytes read", human_bytes(tot.bytes_read), f"{tot.bytes_read:,}")
    for k in READ_KINDS:
        t.add_row(f"  {k}", human_bytes(tot.read.get(k, 0)), f"{tot.read.get(k, 0):,}")
    t.add_row("  work buffer", human_bytes(tot.work), f"{tot.work:,}")
    t.add_row("bytes written", human_bytes(tot.bytes_written), f"{tot.bytes_written:,}")
    t.add_row("FLOPs (FMA = 2)", human_count(tot.flops), f"{tot.flops:,}")
    for k in FLOP_KINDS + ("cvt",):
        if tot.ops.get(k):
            t.add_row(f"  {k}", human_count(tot.ops[k]), f"{tot.ops[k]:,}")
    con.print(t)

    by_op = sorted(a.by_op.items(), key=lambda kv: (-kv[1].flops, -kv[1].bytes_read, kv[0]))
    con.print(_cost_table("Per op kind", "op", by_op))
    con.print(_cost_table("Per block", "block", sorted(a.by_block.items())))
    layers = [(("-" if k is None else str(k)), c) for k, c in
              sorted(a.by_layer.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]
    con.print(_cost_table("Per layer ('-' = outside the layers)", "layer", layers))

    mt = Table(title="Memory", box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    mt.add_column("what")
    mt.add_column("size", justify="right")
    mt.add_column("bytes", justify="right")
    mt.add_row("model weights", human_bytes(a.weights_bytes), f"{a.weights_bytes:,}")
    for c in bg.caches:
        mt.add_row(f"KV cache {c.name} ({c.size} cells, {len(c.layers)} layers)",
                   human_bytes(c.bytes()), f"{c.bytes():,}")
    mt.add_row("KV cache total", human_bytes(a.kv_cache_bytes), f"{a.kv_cache_bytes:,}")
    if bg.states:
        mt.add_row("recurrent state (R + S)", human_bytes(a.recurrent_state_bytes),
                   f"{a.recurrent_state_bytes:,}")
    con.print(mt)

    if a.schedule is not None:
        sc = a.schedule
        count: dict[str, int] = {}
        for i, nc in enumerate(a.nodes):
            if not nc.node.is_view:
                count[sc.device_of(i)] = count.get(sc.device_of(i), 0) + 1
        con.print(f"devices: {', '.join(f'{d} {n} nodes' for d, n in count.items())}; "
                  f"{len(sc.splits)} splits; {human_bytes(sc.copy_bytes)} "
                  f"({sc.copy_bytes:,} bytes) copied between devices per step")

    ew = expert_weights(a)
    if ew is not None:
        con.print(_experts_table(ew))

    if hardware is not None:
        con.print(_roofline_table(a, hardware))
        con.print(_llama_cpp_line(a, hardware, cpu_features))

    if a.unmodelled:
        ops = sorted({nc.node.op for nc in a.unmodelled})
        con.print(f"unmodelled: {len(a.unmodelled)} nodes ({', '.join(ops)}) are not costed")
    else:
        con.print("unmodelled: none (every node has a cost model)")
    return buf.getvalue()


def _experts_table(ew) -> Table:
    """Mixture of experts: expert weights in total, for one token, and read by this ubatch."""
    t = Table(title=f"Expert weights ({ew.n_expert_used} of {ew.n_expert} experts per token)",
              box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("what")
    t.add_column("size", justify="right")
    t.add_column("bytes", justify="right")
    t.add_row("total", human_bytes(ew.total_bytes), f"{ew.total_bytes:,}")
    t.add_row(f"active per token ({ew.active_fraction:.1%})",
              human_bytes(ew.active_bytes_per_token), f"{ew.active_bytes_per_token:,}")
    # experts per tensor for the ubatch's tokens: worst case min(n, k*T), and the expectation
    # under uniform routing n*(1 - (1 - k/n)**T) (docs/counting.md)
    t.add_row(f"read, worst case ({ew.worst_case_experts} of {ew.n_expert})",
              human_bytes(ew.read_bytes), f"{ew.read_bytes:,}")
    exp = round(ew.expected_read_bytes)
    t.add_row(f"read, expected, uniform routing ({float(ew.expected_experts):.2f} of "
              f"{ew.n_expert})", human_bytes(exp), f"{exp:,}")
    return t


def _llama_cpp_line(a: Analysis, hw, cpu_features=None) -> str:
    """--hardware: the step's predicted time on llama.cpp's CPU backend (graphcost speed's
    model, graphcost.cost.speed_model), with its error band or UNVERIFIED."""
    from graphcost.cost.speed_model import step_estimate

    e = step_estimate(a, hw, features=cpu_features)
    tps = e["tokens_per_second"]
    line = (f"llama.cpp CPU, predicted: {e['seconds'] * 1e3:.3f} ms per step"
            + (f", {tps:.1f} tokens/s" if tps else ""))
    if "error_band" in e:
        b = e["error_band"]
        line += (f"\n  error band (held-out llama-bench cases): median {100 * b['median']:.1f}%, "
                 f"worst {100 * b['worst']:.1f}%")
    line += (f"\n  weights placed for CPU features {', '.join(e['cpu_features']) or 'none'} "
             f"({e['cpu_features_from']})")
    if "warning" in e:
        line += f"\nUNVERIFIED: {e['warning']}"
    return line + "\n"


def _roofline_table(a: Analysis, hw) -> Table:
    """--hardware: per op kind, the roofline time max(bytes/bandwidth, FLOPs/peak)."""
    from graphcost.cost.roofline import estimate

    est = estimate(a, hw)
    t = Table(title=f"Roofline on {literal(hw.name)} ({hw.kind}: {hw.bandwidth / 1e9:.1f} GB/s, "
                    f"{hw.peak_flops / 1e9:.0f} GFLOP/s)",
              box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    t.add_column("op")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    t.add_column("memory-bound", justify="right")
    t.add_column("compute-bound", justify="right")
    for o in est.by_op:
        t.add_row(o.op, f"{o.seconds * 1e3:.3f} ms", f"{o.seconds / est.seconds:.1%}"
                  if est.seconds else "-", str(o.memory_bound_nodes), str(o.compute_bound_nodes))
    n = a.graph.run.n_tokens
    t.add_row("total", f"{est.seconds * 1e3:.3f} ms", "100.0%", "", "")
    t.add_row(f"tokens/s ({n} per step)", f"{est.tokens_per_second(n):.1f}", "", "", "")
    return t
