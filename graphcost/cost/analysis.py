"""Costs for every node of a built graph, and their roll-ups (per op, layer, block).

Reads are filed under what their source's memory is: ``weights`` (GGUF tensors),
``kv`` (KV cache buffers), ``inputs`` (graph inputs: tokens, positions, masks, indices;
counted at first use only) and ``act`` (activations made by earlier nodes). See the
counting convention in :mod:`graphcost.cost.costs`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from graphcost.graph.build import BuiltGraph
from graphcost.cost.costs import FLOP_KINDS, Unmodelled, op_cost
from graphcost.graph.ggml_graph import Tensor
from graphcost.memory.plan import MemoryPlan, plan_for, state_memory

READ_KINDS = ("weights", "kv", "inputs", "act")
_ROLE_TO_READ = {"weight": "weights", "kv": "kv", "input": "inputs", "activation": "act"}


@dataclass(frozen=True)
class Cost:
    """Additive cost: bytes read by kind, bytes written, scratch bytes, ops by kind."""

    read: dict[str, int] = field(default_factory=dict)
    write: int = 0
    work: int = 0
    ops: dict[str, int] = field(default_factory=dict)

    def __add__(self, other: "Cost") -> "Cost":
        r = Counter(self.read)
        r.update(other.read)
        o = Counter(self.ops)
        o.update(other.ops)
        return Cost({k: v for k, v in r.items() if v}, self.write + other.write,
                    self.work + other.work, {k: v for k, v in o.items() if v})

    @property
    def bytes_read(self) -> int:
        """All bytes read, including the work buffer read back."""
        return sum(self.read.values()) + self.work

    @property
    def bytes_written(self) -> int:
        return self.write + self.work

    @property
    def flops(self) -> int:
        return sum(self.ops.get(k, 0) for k in FLOP_KINDS)

    def to_dict(self) -> dict:
        return {
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "read": {k: self.read.get(k, 0) for k in READ_KINDS},
            "work": self.work,
            "flops": self.flops,
            "ops": {k: self.ops[k] for k in sorted(self.ops)},
        }


ZERO = Cost()


@dataclass
class NodeCost:
    """One node with its cost (``None`` when unmodelled, ``why`` then says what is missing)."""

    index: int
    node: Tensor
    cost: Cost | None
    why: str = ""


@dataclass
class Analysis:
    graph: BuiltGraph
    nodes: list[NodeCost]
    total: Cost
    by_op: dict[str, Cost]
    by_layer: dict[int | None, Cost]
    by_block: dict[str, Cost]
    unmodelled: list[NodeCost]
    #: start-up buffers and this graph's live bytes per node (graphcost.memory.plan);
    #: present only when asked for (``analyze_graph(bg, memory=True)``: it builds and
    #: allocates the flavour's reserve graphs)
    memory: MemoryPlan | None = None
    #: with devices (``analyze --device``): the scheduler's splits and each node's
    #: backend (graphcost.memory.sched.Schedule); None on one CPU
    schedule: object | None = None

    @property
    def weights_bytes(self) -> int:
        return self.graph.model.weights_bytes

    @property
    def kv_cache_bytes(self) -> int:
        return sum(c.bytes() for c in self.graph.caches)

    @property
    def recurrent_state_bytes(self) -> int:
        """Bytes of the recurrent states' R and S buffers (hybrid/recurrent models), as
        llama.cpp logs its ``RS buffer size`` (graphcost.memory.plan.state_memory)."""
        return sum(r.bytes for r in state_memory(self.graph))

    def require_memory(self) -> MemoryPlan:
        """:attr:`memory`, or ValueError when the analysis was made without it."""
        if self.memory is None:
            raise ValueError("this analysis has no memory plan: use analyze_graph(bg, memory=True)")
        return self.memory


def analyze_graph(bg: BuiltGraph, *, memory: bool = False) -> Analysis:
    """Cost every node; inputs count at first use; unmodelled ops are listed, not zeroed.
    With ``memory``, also plan the start-up memory (:func:`graphcost.memory.plan.plan_for`,
    which builds and allocates the flavour's reserve graphs)."""
    seen_inputs: set[int] = set()
    out: list[NodeCost] = []
    total = ZERO
    by_op: dict[str, Cost] = {}
    by_layer: dict[int | None, Cost] = {}
    by_block: dict[str, Cost] = {}
    unmodelled: list[NodeCost] = []
    for i, node in enumerate(bg.nodes):
        oc = op_cost(node)
        if isinstance(oc, Unmodelled):
            nc = NodeCost(i, node, None, oc.reason)
            unmodelled.append(nc)
            out.append(nc)
            continue
        read: Counter = Counter()
        for src, nbytes in zip(node.src, oc.reads):
            if not nbytes:
                continue
            store = src.storage
            kind = _ROLE_TO_READ[store.role]
            if kind == "inputs":
                if id(store) in seen_inputs:
                    continue
                seen_inputs.add(id(store))
            read[kind] += nbytes
        c = Cost(dict(read), oc.write, oc.work, dict(oc.ops))
        out.append(NodeCost(i, node, c))
        total = total + c
        by_op[node.op] = by_op.get(node.op, ZERO) + c
        by_layer[node.layer] = by_layer.get(node.layer, ZERO) + c
        by_block[node.block] = by_block.get(node.block, ZERO) + c
    return Analysis(bg, out, total, by_op, by_layer, by_block, unmodelled,
                    memory=plan_for(bg) if memory else None)
