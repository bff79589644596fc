"""Node reorders a backend's ``graph_optimize`` makes to each graph split before ggml-alloc
plans the compute buffer (the allocator then sees the nodes in the new order, which changes
which blocks are free when, and so the buffer's size).

The hook (``ggml/src/ggml-backend.cpp`` ``ggml_backend_sched_split_graph``, as vendored by
llama-cpp-python 0.3.36): after the splits are made, each split's graph
(``ggml_graph_view``: a window on the whole graph's node array) goes to its backend's
``graph_optimize``, which may permute the window in place; ``graph_copy`` is made from the
permuted array. A reorder here is a pure function of the split (:class:`SplitGraph`), the
device options and ``address`` (where a tensor that already has memory lives), returning the
split's nodes in their new order. :data:`REORDERS` holds them by the name a backend spec gives
under ``scheduler.graph_optimize_reorder``:

* ``metal``: ``ggml-metal/ggml-metal-common.cpp`` ``ggml_graph_optimize`` (called by
  ``ggml_metal_graph_optimize``, ggml-metal-context.m, unless
  ``GGML_METAL_GRAPH_OPTIMIZE_DISABLE``: device option ``graph_optimize=0``);
* ``vulkan``: ``ggml-vulkan/ggml-vulkan.cpp`` ``ggml_vk_graph_optimize``
  (:mod:`graphcost.memory.reorder_vulkan`), unless ``GGML_VK_DISABLE_GRAPH_OPTIMIZE``
  (device option ``graph_optimize=0``).

Memory ranges (``ggml_mem_range_from_tensor``): a tensor stands for its view source's memory.
When the graph is optimized only the weights, the KV cache and recurrent states have memory
(``tensor->buffer``): their range is their bytes in their buffer, ``address(t)`` =
``(buffer, begin, end)``; every other tensor gets a range of its own, ``[0, 1024)`` in a
"buffer" that is the tensor itself, so it meets only its own views. Two ranges conflict when
they are in the same buffer, at least one is written (a node's result), and
``p0 < other.p1 and p1 >= other.p0`` (ggml_mem_ranges_check: ranges that merely touch
conflict too).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import EMPTY, GLU, UNARY, Op
from graphcost.memory.alloc_deps import SplitGraph
from graphcost.memory.metal_fusion import fusion_max
from graphcost.memory.op_rules import device_flag
from graphcost.memory.reorder_vulkan import vulkan_graph_optimize

#: where a tensor with memory lives: (buffer, first byte, end byte); None: not allocated yet
Address = Callable[[Tensor], "tuple[Hashable, int, int] | None"]
#: ggml-metal-common.cpp ggml_mem_range_from_tensor: the dummy range of an unallocated tensor
DUMMY_RANGE_END = 1024


@dataclass
class MemRanges:
    """ggml_mem_ranges: the ranges of a set of nodes, by buffer."""

    address: Address
    by_buffer: dict[Hashable, list[tuple[int, int, bool]]] = field(default_factory=dict)

    def range_of(self, t: Tensor) -> tuple[Hashable, int, int]:
        """ggml_mem_range_from_tensor: the view source's memory, or the tensor's own dummy."""
        base = t.storage
        a = self.address(base)
        return a if a is not None else (("tensor", id(base)), 0, DUMMY_RANGE_END)

    def add(self, t: Tensor, dst: bool) -> None:
        pb, p0, p1 = self.range_of(t)
        self.by_buffer.setdefault(pb, []).append((p0, p1, dst))

    def check(self, t: Tensor, dst: bool) -> bool:
        """ggml_mem_ranges_check: False when ``t`` read (or written, ``dst``) conflicts."""
        pb, p0, p1 = self.range_of(t)
        for c0, c1, cdst in self.by_buffer.get(pb, ()):
            if not dst and not cdst:
                continue  # intersecting source ranges are allowed
            if p0 < c1 and p1 >= c0:
                return False
        return True

    def reset(self) -> None:
        self.by_buffer.clear()


@dataclass
class NodeInfo:
    """ggml-metal-common.cpp node_info: a packed unit, its first node and the fused rest."""

    node: Tensor
    fused: list[Tensor] = field(default_factory=list)

    def members(self) -> list[Tensor]:
        return [self.node] + self.fused

    def is_output(self, t: Tensor) -> bool:
        return any(t is m for m in self.members())

    def external_srcs(self) -> list[Tensor]:
        """Sources of the unit's nodes that the unit does not produce, in ggml's order."""
        return [s for m in self.members() for s in m.src
                if s is not None and not self.is_output(s)]


def _add(mrs: MemRanges, n: NodeInfo) -> None:
    """h_add: the unit's external sources read, every member written."""
    for s in n.external_srcs():
        mrs.add(s, False)
    for m in n.members():
        mrs.add(m, True)


def _check(mrs: MemRanges, n: NodeInfo) -> bool:
    """h_check: the unit can run concurrently with the set ``mrs``."""
    return (all(mrs.check(s, False) for s in n.external_srcs())
            and all(mrs.check(m, True) for m in n.members()))


#: ggml_metal_graph_optimize_reorder h_safe: ops a node may be moved across (UNARY and GLU:
#: their sub-ops), besides the empty ones (ggml_op_is_empty)
METAL_SAFE = frozenset({
    Op.MUL_MAT, Op.MUL_MAT_ID, Op.ROPE, Op.NORM, Op.RMS_NORM, Op.GROUP_NORM, Op.L2_NORM,
    Op.SUM_ROWS, Op.SSM_CONV, Op.SSM_SCAN, Op.CLAMP, Op.TRI, Op.DIAG, Op.MUL, Op.ADD, Op.SUB,
    Op.DIV, Op.SCALE, Op.GET_ROWS, Op.SET_ROWS, Op.SET, Op.CPY, Op.CONT, Op.REPEAT,
}) | UNARY | GLU | EMPTY
#: ggml_metal_graph_optimize_reorder N_FORWARD: how far ahead a node is looked for
METAL_N_FORWARD = 64


def metal_reorder_units(units: list[NodeInfo], address: Address) -> list[int]:
    """ggml_metal_graph_optimize_reorder: the order of the packed units. A unit that
    conflicts with the current concurrent set first pulls forward the later units (within
    64, stopping at an op not in :data:`METAL_SAFE`) that conflict neither with that set nor
    with the units they would jump over, then closes the set and starts a new one with
    itself."""
    n = len(units)
    res: list[int] = []
    used = [False] * n
    mrs0, mrs1 = MemRanges(address), MemRanges(address)
    for i0 in range(n):
        if used[i0]:
            continue
        node0 = units[i0]
        if node0.node.op not in EMPTY and not _check(mrs0, node0):
            mrs1.reset()
            _add(mrs1, node0)
            for i1 in range(i0 + 1, min(i0 + METAL_N_FORWARD, n)):
                if used[i1]:
                    continue
                node1 = units[i1]
                if node1.node.op not in METAL_SAFE:
                    break
                empty = node1.node.op in EMPTY
                if (empty or _check(mrs0, node1)) and _check(mrs1, node1):
                    _add(mrs0, node1)
                    res.append(i1)
                    used[i1] = True
                else:
                    _add(mrs1, node1)
            mrs0.reset()
        _add(mrs0, node0)
        res.append(i0)
    return res


def metal_graph_optimize(g: SplitGraph, address: Address, options: dict[str, Any]) -> list[Tensor]:
    """ggml_graph_optimize (ggml-metal-common.cpp): pack each fusable run
    (:func:`graphcost.memory.metal_fusion.fusion_max`) into one unit, reorder the units
    (:func:`metal_reorder_units`) and unpack them; the split unchanged with
    ``graph_optimize=0`` (GGML_METAL_GRAPH_OPTIMIZE_DISABLE)."""
    if not device_flag(options, "graph_optimize", True):
        return list(g.nodes)
    units: list[NodeInfo] = []
    i = 0
    while i < len(g.nodes):
        f = fusion_max(g, i)
        units.append(NodeInfo(g.nodes[i], list(g.nodes[i + 1:i + f])))
        i += f
    return [m for k in metal_reorder_units(units, address) for m in units[k].members()]


#: graph_optimize_reorder rules by name (specs/backends/*.yaml scheduler); a reorder may also
#: add allocation dependencies (``g.add``), as Vulkan's does
REORDERS: dict[str, Callable[[SplitGraph, Address, dict[str, Any]], list[Tensor]]] = {
    "metal": metal_graph_optimize,
    "vulkan": vulkan_graph_optimize,
}
