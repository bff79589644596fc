"""The tree report: totals, then every node in execution order with wires on the left.

The layout follows the older analyzer's text report (``shared/reference/sample-report.txt``,
described in section 9 of ``shared/reference/llamacpp-graph.md``): a block per node
(``name: OP``, its type, size and shape, its costs, one line per source) and, in a gutter
on the left, one column per live value. A value's wire starts at the node that makes it
(``<---`` into the node's header line) and runs down (``|``) to the source lines that
consume it (``>---``); after its last consumer the column is free and is reused by the
next value that needs one (lowest free column first, like a register allocator). Views
are values too: the consumers of a view are wired to the view, not to its storage.
Leaves (weights, graph inputs, KV cache buffers) get no wire; their source lines say
what they are.

Numbers are exact integers: bytes and FLOPs (by kind, see the counting convention in
:mod:`graphcost.cost.costs`). Every node is tagged ``#<index>`` (its position in the graph),
because llama.cpp reuses names (``Qcur-0`` is a MUL_MAT, then its RESHAPE, then its
ROPE).

With ``layers`` only the nodes of those layers are drawn (nodes outside any layer are
dropped too); the totals stay those of the whole graph. A value made by a node that is
not drawn enters just above its first drawn consumer, on a ``<---`` line of its own.
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

from graphcost.cost.analysis import READ_KINDS, Analysis, NodeCost
from graphcost.cost.costs import FLOP_KINDS
from graphcost.graph.ggml_graph import Tensor
from graphcost.format.ggml_types import type_name
from graphcost.units import human_bytes, human_count, literal

#: most wire columns drawn; a value that finds no free column is drawn without a wire
#: (the examples need 5 columns, see tests/test_tree.py)
MAX_WIRES = 40
#: source labels for src[0..3], as ggml's docs and the older report name them
SRC_LABELS = ("x", "y", "z", "w")
#: what a leaf source is, by its role
LEAF_KIND = {"weight": "weight", "input": "input", "kv": "KV cache", "activation": "leaf"}


def render_tree(a: Analysis, *, layers: set[int] | None = None, max_wires: int = MAX_WIRES) -> str:
    """The whole report as plain text (no colour), one ``\\n``-terminated line per line.

    ``layers`` narrows the node blocks to those model layers; ``max_wires`` caps the
    gutter at that many columns.
    """
    nodes = [nc.node for nc in a.nodes]
    if layers is None:
        shown = list(range(len(nodes)))
    else:
        shown = [i for i, n in enumerate(nodes) if n.layer is not None and n.layer in layers]
    index_of = {id(n): i for i, n in enumerate(nodes)}
    wires = _plan_wires(nodes, shown, index_of, max_wires)
    lines = _totals(a, shown, layers, wires)
    lines.append("")
    lines += _node_blocks(a, shown, index_of, wires, narrowed=layers is not None)
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    # names from the file (model, tensors) are shown literally: control characters escaped
    return "".join(literal(line) + "\n" for line in lines)


# ---- wires ------------------------------------------------------------------------------

@dataclass
class _Wires:
    """Where each value's wire runs.

    ``col``: producer node index -> gutter column; ``last``: producer -> (consumer node
    index, source slot) of its last drawn use; ``enter``: drawn node index -> producers
    not drawn that enter just above it; ``unwired``: producers that found no free column.
    """

    width: int
    col: dict[int, int]
    last: dict[int, tuple[int, int]]
    enter: dict[int, list[int]]
    unwired: set[int]


def _node_sources(nodes: list[Tensor], j: int, index_of: dict[int, int]):
    """(slot, producer index) for each source of node ``j`` made by another node."""
    for k, s in enumerate(nodes[j].src):
        i = index_of.get(id(s))
        if i is not None and i != j:  # ggml_cast lists its own result as src[1]
            yield k, i


def _plan_wires(nodes: list[Tensor], shown: list[int], index_of: dict[int, int],
                max_wires: int) -> _Wires:
    """Give each value with a drawn consumer the lowest column free at its birth.

    A column stays taken down to the block of the value's last consumer (its source line
    is drawn below the consumer's header), so a node never reuses the column of a value
    it consumes. O(edges * log(width)).
    """
    shown_set = set(shown)
    last: dict[int, tuple[int, int]] = {}
    enter: dict[int, list[int]] = {}
    entered: set[int] = set()
    for j in shown:
        for k, i in _node_sources(nodes, j, index_of):
            last[i] = (j, k)
            if i not in shown_set and i not in entered:
                entered.add(i)
                enter.setdefault(j, []).append(i)
    ends: dict[int, list[int]] = {}
    for i, (j, _) in last.items():
        ends.setdefault(j, []).append(i)

    col: dict[int, int] = {}
    unwired: set[int] = set()
    free: list[int] = []
    width = 0

    def take(i: int) -> None:
        nonlocal width
        if free:
            col[i] = heapq.heappop(free)
        elif width < max_wires:
            col[i] = width
            width += 1
        else:
            unwired.add(i)

    for j in shown:
        for i in enter.get(j, ()):
            take(i)
        if j in last:
            take(j)
        for i in ends.get(j, ()):
            if i in col:
                heapq.heappush(free, col[i])
    return _Wires(width, col, last, enter, unwired)


class _Gutter:
    """The live columns and how one line of the gutter looks (2 characters a column)."""

    def __init__(self, width: int):
        self.live: list[int | None] = [None] * width

    def plain(self, text: str, indent: str = "  ") -> str:
        return "".join("| " if v is not None else "  " for v in self.live) + indent + text

    def arrow(self, head: str, c: int, text: str, indent: str = "") -> str:
        """``head`` ('<' or '>') at column ``c``, dashes to the text; live wires cross as '|'."""
        left = "".join("| " if v is not None else "  " for v in self.live[:c])
        right = "".join("|-" if v is not None else "--" for v in self.live[c + 1:])
        return left + head + "-" + right + indent + text


# ---- totals -----------------------------------------------------------------------------



def _ranges(values: set[int]) -> str:
    """{0, 1, 2, 5} -> '0-2, 5'."""
    out: list[str] = []
    vs = sorted(values)
    start = prev = None
    for v in vs + [None]:
        if start is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    return ", ".join(out)


def _table(rows: list[tuple[str, int, str]]) -> list[str]:
    """Label, exact number (right-aligned), remark: one aligned line each."""
    w = max(len(f"{v:,}") for _, v, _ in rows)
    return [f"{label:<18}{v:>{w},}" + (f"  ({note})" if note else "") for label, v, note in rows]


def _totals(a: Analysis, shown: list[int], layers: set[int] | None, wires: _Wires) -> list[str]:
    bg = a.graph
    m, run = bg.model, bg.run
    t = a.total
    n_kv = f"n_kv {run.n_kv}" + (f" (swa {run.n_kv_swa})" if run.n_kv_swa is not None else "")
    if not bg.caches:
        n_kv = "no KV cache"
    lines = [
        "graphcost tree report",
        f"model:   {m.name} ({m.arch}, {m.n_layer} layer{'s' if m.n_layer != 1 else ''})",
        f"run:     n_ctx {run.n_ctx}, tokens {run.n_tokens}, past {run.past}, "
        f"outputs {run.n_outputs}, {n_kv}, flash attention {'on' if run.flash_attn else 'off'}, "
        f"cache k {type_name(run.type_k)}, v {type_name(run.type_v)}",
        f"graph:   {len(a.nodes)} nodes, {len(bg.leafs)} leaves",
    ]
    if layers is None:
        lines.append(f"shown:   all {len(a.nodes)} nodes")
    else:
        which = f"layer{'s' if len(layers) != 1 else ''} {_ranges(layers)}" if layers else "no layers"
        lines.append(f"shown:   {which}: {len(shown)} of {len(a.nodes)} nodes "
                     "(narrowed; the totals are for the whole graph)")
    wire_note = f"wires:   {wires.width} column{'s' if wires.width != 1 else ''}"
    if wires.unwired:
        wire_note += (f" (the cap); {len(wires.unwired)} values found no free column and "
                      "are drawn without a wire, marked 'no wire'")
    lines.append(wire_note)
    for note in run.notes:
        lines.append(f"note:    {note}")
    if m.header.data_note:
        lines.append(f"note:    {m.header.data_note}")

    lines.append("")
    lines.append("totals for the whole graph (bytes, FLOPs):")
    rows: list[tuple[str, int, str]] = [("bytes read", t.bytes_read, human_bytes(t.bytes_read))]
    rows += [(f"  {k}", t.read.get(k, 0), human_bytes(t.read.get(k, 0))) for k in READ_KINDS]
    rows.append(("  work", t.work, "work buffer read back; " + human_bytes(t.work)))
    rows.append(("bytes written", t.bytes_written, human_bytes(t.bytes_written)))
    rows.append(("  results", t.write, human_bytes(t.write)))
    rows.append(("  work", t.work, "work buffer; " + human_bytes(t.work)))
    rows.append(("flops", t.flops, human_count(t.flops)))
    rows += [(f"  {k}", t.ops.get(k, 0), "") for k in FLOP_KINDS]
    rows.append(("cvt", t.ops.get("cvt", 0), "elements converted, not in flops"))
    rows += [(k, v, "") for k, v in sorted(t.ops.items()) if k not in FLOP_KINDS and k != "cvt"]
    rows.append(("weights", a.weights_bytes, "model tensors; " + human_bytes(a.weights_bytes)))
    rows.append(("KV cache", a.kv_cache_bytes, "all K and V buffers; " + human_bytes(a.kv_cache_bytes)))
    step = a.require_memory().step
    rows.append(("peak live", step.peak_bytes, f"compute buffer, at #{step.peak_index} "
                 f"{a.graph.nodes[step.peak_index].name}; " + human_bytes(step.peak_bytes)))
    lines += ["  " + r for r in _table(rows)]
    lines.append("  " + _unmodelled(a))
    return lines


def _unmodelled(a: Analysis) -> str:
    if not a.unmodelled:
        return "unmodelled ops: none"
    by_op = Counter(nc.node.op for nc in a.unmodelled)
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(by_op.items()))
    first = ", ".join(f"#{nc.index}" for nc in a.unmodelled[:8])
    more = ", ..." if len(a.unmodelled) > 8 else ""
    return f"unmodelled ops: {ops} (nodes {first}{more}; not counted in the totals)"


# ---- node blocks ------------------------------------------------------------------------

def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(n) for n in t.ne) + "]"


def _parts(items) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in items if v)


def _cost_lines(nc: NodeCost) -> list[str]:
    """Bytes read by kind and written, FLOPs by kind and conversions; zero kinds omitted."""
    c = nc.cost
    if c is None:
        return [f"cost: unmodelled ({nc.why})"]
    if not c.bytes_read and not c.bytes_written and not c.ops:
        return ["cost: none"]
    read = list((k, c.read.get(k, 0)) for k in READ_KINDS) + [("work", c.work)]
    written = [("result", c.write), ("work", c.work)] if c.work else []
    line = f"bytes: read {c.bytes_read:,}"
    if c.bytes_read:
        line += f" ({_parts(read)})"
    line += f", written {c.bytes_written:,}" + (f" ({_parts(written)})" if written else "")
    out = [line]
    extra = [(k, v) for k, v in sorted(c.ops.items()) if k not in FLOP_KINDS]
    if c.flops or extra:
        flops = f"flops: {c.flops:,}"
        if c.flops:
            flops += f" ({_parts((k, c.ops.get(k, 0)) for k in FLOP_KINDS)})"
        if extra:
            flops += ", " + _parts(extra)
        out.append(flops)
    return out


def _node_blocks(a: Analysis, shown: list[int], index_of: dict[int, int], wires: _Wires,
                 narrowed: bool) -> list[str]:
    nodes = [nc.node for nc in a.nodes]
    if not shown:
        return ["(no nodes in the selected layers)"]
    shown_set = set(shown)
    consumers: dict[int, list[int]] = {}
    for j in range(len(nodes)):
        for _, i in _node_sources(nodes, j, index_of):
            if not consumers.get(i) or consumers[i][-1] != j:
                consumers.setdefault(i, []).append(j)

    g = _Gutter(wires.width)
    live = a.require_memory().step.live
    out: list[str] = []
    prev: int | None = None
    layer: int | None = None  # nodes before the first layer (the prologue) get no title

    def gap(lo: int, hi: int) -> None:
        n = hi - lo + 1
        span = f"#{lo}" if lo == hi else f"#{lo}-#{hi}"
        out.append(g.plain(f"... {n} node{'s' if n != 1 else ''} not shown ({span}) ..."))
        out.append(g.plain(""))

    for j in shown:
        node = nodes[j]
        if prev is None and j > 0:
            gap(0, j - 1)
        elif prev is not None and j > prev + 1:
            gap(prev + 1, j - 1)
        if node.layer != layer:
            title = f"layer {node.layer}" if node.layer is not None else "output"
            out += [g.plain(f"== {title} =="), g.plain("")]
            layer = node.layer

        for i in wires.enter.get(j, ()):
            p = nodes[i]
            text = f"{p.name}: {p.op}  #{i} (made by a node not shown)"
            if i in wires.col:
                c = wires.col[i]
                g.live[c] = i
                out.append(g.arrow("<", c, text))
        head = f"{node.name}: {node.op}  #{j}"
        c = wires.col.get(j)
        if c is not None:
            g.live[c] = j
            out.append(g.arrow("<", c, head))
        else:
            out.append(g.plain(head, indent=""))

        out += [g.plain(s) for s in _about(node, index_of)]
        out.append(g.plain(f"live: {live[j]:,} bytes in the compute buffer while it runs"))
        out += [g.plain(s) for s in _cost_lines(a.nodes[j])]
        used = consumers.get(j, [])
        if not used:
            out.append(g.plain("not used by other nodes"))
        elif narrowed:
            hidden = [k for k in used if k not in shown_set]
            if hidden:
                more = ", ..." if len(hidden) > 4 else ""
                out.append(g.plain("also used by nodes not shown: "
                                   + ", ".join(f"#{k}" for k in hidden[:4]) + more))

        for k, s in enumerate(node.src):
            label = SRC_LABELS[k] if k < len(SRC_LABELS) else f"src{k}"
            text = f"{label}: {s.name}, {type_name(s.type)}, {_shape(s)}"
            i = index_of.get(id(s))
            if i is None:
                out.append(g.plain(f"{text}  ({LEAF_KIND[s.role]})"))
            elif i == j:
                out.append(g.plain(f"{text}  (#{i}, the node itself)"))
            elif i not in wires.col:
                out.append(g.plain(f"{text}  (#{i}, no wire)"))
            else:
                c = wires.col[i]
                out.append(g.arrow(">", c, f"{text}  (#{i})", indent="  "))
                if wires.last[i] == (j, k):
                    g.live[c] = None
        out.append(g.plain(""))
        prev = j
    if prev is not None and prev < len(nodes) - 1:
        gap(prev + 1, len(nodes) - 1)
    return out


def _about(node: Tensor, index_of: dict[int, int]) -> list[str]:
    """Type, bytes allocated (0 for a view, which names its storage) and shape."""
    if node.is_view:
        st = node.storage
        i = index_of.get(id(st))
        what = f"#{i}" if i is not None else LEAF_KIND[st.role]
        size = f"0 bytes (view of {st.name}, {what})"
    else:
        size = f"{node.nbytes:,} bytes"
    return [f"{type_name(node.type)}, {size}, {_shape(node)}"]
