"""What-if: each layer's attention block (norm -> QKV -> rope -> attention -> output
projection) as one fused kernel that writes only what leaves the block; the graph
allocator (:mod:`graphcost.memory.alloc`) is run over both graphs and the compute buffers
compared (``graphcost memory --fuse attention``). Not a llama.cpp mirror: a what-if on
llama.cpp's graph. All sizes are bytes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graphcost.format import ggml_types as gt
from graphcost.graph.build import BuiltGraph
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import Op
from graphcost.memory.alloc import CPU_ALIGNMENT, allocate, ggml_nbytes
from graphcost.memory.plan import MemoryPlan, graph_outputs, simulate


class _Saving:
    """``before`` and ``after`` (bytes of block results, unfused and fused) give ``saved``."""

    before: int
    after: int

    @property
    def saved(self) -> int:
        """Bytes of block results that fusing keeps out of memory."""
        return self.before - self.after


@dataclass(frozen=True)
class LayerFusion(_Saving):
    """Fused-attention what-if for one layer: bytes of the attention block's results
    (norm -> QKV -> rope -> attention -> output projection) before and after fusing."""

    layer: int
    first: int  # node index range of the block
    last: int
    nodes: int
    before: int  # bytes of every non-view result in the block (aligned, as allocated)
    after: int  # bytes of the results that leave the block (must still reach memory)


@dataclass(frozen=True)
class FusionWhatIf(_Saving):
    """The what-if on one graph: per layer, and the compute buffer with fused blocks;
    ``before``/``after``: the layers' sums (bytes)."""

    graph_label: str
    layers: list[LayerFusion]
    unfused: list[tuple[int, str]]  # (layer, why) for layers left as they are
    buffer_before: int
    buffer_after: int
    before: int
    after: int


def _attention_blocks(nodes: list[Tensor]) -> dict[int, tuple[int, int] | str]:
    """Per layer, the node index range norm .. output projection of its attention block
    (block == "attention", up to the MUL_MAT with ``attn_output.weight``), or why not."""
    spans: dict[int, tuple[int, int] | str] = {}
    first: dict[int, int] = {}
    for i, n in enumerate(nodes):
        if n.layer is None or n.block != "attention":
            continue
        first.setdefault(n.layer, i)
        if (n.op == Op.MUL_MAT and n.src and n.src[0].role == "weight"
                and n.src[0].name == f"blk.{n.layer}.attn_output.weight"):
            spans.setdefault(n.layer, (first[n.layer], i))
    for il in first:
        spans.setdefault(il, "no attention output projection found")
    return spans


def fuse_attention(bg: BuiltGraph, label: str = "analyzed") -> FusionWhatIf:
    """Replace each layer's attention block by one node that reads the block's inputs and
    writes only the results used after it; allocate both graphs and compare.

    ``before`` per layer counts every non-view result of the block (aligned, as the
    allocator sizes them), ``after`` only those read by later nodes (normally the output
    projection). KV cache writes (SET_ROWS) are views of the cache and count in neither.
    A real fused kernel needs some scratch of its own; that is not modelled.
    """
    nodes = bg.nodes
    index_of = {id(n): i for i, n in enumerate(nodes)}
    consumers: dict[int, list[int]] = {}
    for j, n in enumerate(nodes):
        for s in n.src:
            consumers.setdefault(id(s), []).append(j)
    outputs = {id(t) for t in graph_outputs(nodes)}
    layers, unfused = [], []
    replace: dict[int, Tensor] = {}  # id(original boundary) -> fused node
    drop: set[int] = set()
    for il, span in sorted(_attention_blocks(nodes).items()):
        if isinstance(span, str):
            unfused.append((il, span))
            continue
        lo, hi = span
        inside = set(range(lo, hi + 1))
        block = nodes[lo:hi + 1]
        # results used outside the block (through views too) must still be written
        leaving: list[Tensor] = []
        for k in inside:
            n = nodes[k]
            used_outside = any(j not in inside for j in consumers.get(id(n), ())) or id(n) in outputs
            if used_outside:
                st = n.storage
                if id(st) in {id(x) for x in leaving}:
                    continue
                if st.role in ("weight", "kv", "input"):
                    continue  # a view of the cache / an input: not a result of the block
                leaving.append(st)
        results = [n for n in block if not n.is_view]
        before = sum(gt.ggml_pad(ggml_nbytes(n), CPU_ALIGNMENT) for n in results)
        after = sum(gt.ggml_pad(ggml_nbytes(n), CPU_ALIGNMENT) for n in leaving)
        if len(leaving) != 1 or leaving[0] is not nodes[hi]:
            unfused.append((il, "more than the output projection leaves the block"))
            continue
        # the fused node reads what the block reads from outside (by storage)
        reads: list[Tensor] = []
        seen: set[int] = set()
        for n in block:
            for s in n.src:
                st = s.storage
                if index_of.get(id(st), -1) in inside or id(st) in seen:
                    continue
                seen.add(id(st))
                reads.append(st)
        fused = dataclasses.replace(nodes[hi], op="FUSED_ATTENTION", src=reads, params={},
                                    view_src=None, view_offs=0)
        replace[id(nodes[hi])] = fused
        drop.update(id(nodes[k]) for k in inside if k != hi)
        layers.append(LayerFusion(il, lo, hi, len(block), before, after))
    new_nodes: list[Tensor] = []
    copies: dict[int, Tensor] = dict(replace)
    for n in nodes:
        if id(n) in drop:
            continue
        if id(n) in replace:
            new_nodes.append(replace[id(n)])
            continue
        if any(id(s) in copies for s in n.src) or (n.view_src is not None and id(n.view_src) in copies):
            c = dataclasses.replace(n, src=[copies.get(id(s), s) for s in n.src],
                                    view_src=copies.get(id(n.view_src), n.view_src)
                                    if n.view_src is not None else None)
            copies[id(n)] = c
            new_nodes.append(c)
        else:
            new_nodes.append(n)
    new_outputs = [copies.get(id(t), t) for t in graph_outputs(nodes)]
    fused_alloc = allocate(new_nodes, bg.leafs, outputs=new_outputs)
    return FusionWhatIf(label, layers, unfused, simulate(bg).buffer_bytes, fused_alloc.buffer_bytes,
                        before=sum(f.before for f in layers), after=sum(f.after for f in layers))


def fuse_plan(plan: MemoryPlan) -> list[FusionWhatIf]:
    """The what-if on every reserve graph, the one that sets the compute buffer first."""
    order = [plan.worst] + [r for r in plan.reserves if r is not plan.worst]
    return [fuse_attention(r.graph, r.label) for r in order]
