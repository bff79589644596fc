"""Roofline time estimates for an analysed graph on a hardware profile.

Each node's lower bound is ``max(bytes / bandwidth, FLOPs / peak)``
(:func:`graphcost.cost.hardware.roofline_seconds`) with the bytes (read + written) and FLOPs of
the cost model; nodes run one after another, so the graph's estimate is the sum over
nodes. Views (VIEW, RESHAPE, PERMUTE, TRANSPOSE) cost nothing; unmodelled nodes have no estimate and are left out (they are
listed under ``unmodelled`` in every report).
"""
from __future__ import annotations

from dataclasses import dataclass

from graphcost.cost.analysis import Analysis
from graphcost.graph import ops
from graphcost.cost.hardware import Hardware, roofline_seconds


@dataclass(frozen=True)
class OpEstimate:
    op: str
    seconds: float
    memory_bound_nodes: int
    compute_bound_nodes: int


@dataclass(frozen=True)
class RooflineEstimate:
    hardware: Hardware
    seconds: float                    # sum of the per-node bounds
    memory_seconds: float             # of which in memory-bound nodes
    compute_seconds: float            # of which in compute-bound nodes
    per_node: list[float | None]      # seconds per node (None: unmodelled)
    by_op: list[OpEstimate]

    def tokens_per_second(self, n_tokens: int) -> float:
        return n_tokens / self.seconds if self.seconds else float("inf")

    def to_dict(self, n_tokens: int) -> dict:
        return {
            "hardware": self.hardware.to_dict(),
            "seconds": self.seconds,
            "memory_bound_seconds": self.memory_seconds,
            "compute_bound_seconds": self.compute_seconds,
            "tokens_per_second": self.tokens_per_second(n_tokens),
            "by_op": [{"op": o.op, "seconds": o.seconds, "memory_bound_nodes": o.memory_bound_nodes,
                       "compute_bound_nodes": o.compute_bound_nodes} for o in self.by_op],
        }


def estimate(a: Analysis, hw: Hardware) -> RooflineEstimate:
    per_node: list[float | None] = []
    mem = cmp = 0.0
    acc: dict[str, list] = {}  # op -> [seconds, memory-bound nodes, compute-bound nodes]
    for nc in a.nodes:
        if nc.cost is None:
            per_node.append(None)
            continue
        if nc.node.op in ops.EMPTY:              # SET_ROWS/CPY are views that do work
            per_node.append(0.0)
            continue
        c = nc.cost
        sec, bound = roofline_seconds(c.bytes_read + c.bytes_written, c.flops, hw)
        per_node.append(sec)
        o = acc.setdefault(nc.node.op, [0.0, 0, 0])
        o[0] += sec
        if bound == "memory":
            mem += sec
            o[1] += 1
        else:
            cmp += sec
            o[2] += 1
    by_op = sorted((OpEstimate(k, *v) for k, v in acc.items()), key=lambda o: -o.seconds)
    return RooflineEstimate(hw, mem + cmp, mem, cmp, per_node, by_op)
