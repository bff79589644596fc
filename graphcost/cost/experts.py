"""Mixture-of-experts weight accounting for one analysed ubatch: how many bytes of expert
weights the model has, how many one token runs through, and how many this ubatch reads.

Every MUL_MAT_ID node multiplies by one stacked expert tensor ``[K, M, n_expert]``: each
token uses ``ids.ne0`` (n_expert_used) of its ``n_expert`` matrices, and the ubatch reads
the distinct experts touched, assumed ``min(n_expert, n_expert_used * n_tokens)``
(:func:`graphcost.cost.costs.experts_touched`, the worst case; docs/counting.md). Beside it:
the expected distinct experts under uniform routing,
``n_expert * (1 - (1 - n_expert_used/n_expert)**n_tokens)``
(:func:`graphcost.cost.costs.experts_expected`), and the bytes that would read.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from graphcost.cost.analysis import Analysis
from graphcost.cost.costs import expert_bytes, experts_expected, experts_touched
from graphcost.graph.ops import Op


@dataclass(frozen=True)
class ExpertWeights:
    """Bytes of the expert tensors the graph's MUL_MAT_ID nodes multiply by."""

    tensors: int  # stacked expert tensors (e.g. up, gate, down per MoE layer)
    n_expert: int  # experts per tensor (largest)
    n_expert_used: int  # experts one token uses per tensor (largest)
    total_bytes: int  # all experts of those tensors
    active_bytes_per_token: int  # the n_expert_used experts one token runs through
    read_bytes: int  # read by this ubatch (distinct experts touched, per node): worst case
    n_tokens: int  # tokens of the ubatch (the routing of its full layers)
    #: distinct experts per tensor for n_tokens tokens: worst case min(n, k*T)
    worst_case_experts: int
    #: the same, expected under uniform routing: n*(1 - (1 - k/n)**T), exact
    expected_experts: Fraction
    #: expert bytes this ubatch reads if routing is uniform (per node, exact)
    expected_read_bytes: Fraction

    @property
    def active_fraction(self) -> float:
        return self.active_bytes_per_token / self.total_bytes if self.total_bytes else 0.0

    def to_dict(self) -> dict:
        return {"tensors": self.tensors, "n_expert": self.n_expert,
                "n_expert_used": self.n_expert_used, "total_bytes": self.total_bytes,
                "active_bytes_per_token": self.active_bytes_per_token,
                "read_bytes": self.read_bytes, "read_assumption": "worst case",
                "n_tokens": self.n_tokens, "worst_case_experts": self.worst_case_experts,
                "expected_experts_uniform_routing": float(self.expected_experts),
                "expected_read_bytes_uniform_routing": round(self.expected_read_bytes)}


def expert_weights(a: Analysis) -> ExpertWeights | None:
    """Expert weight bytes of the analysed graph; ``None`` when it has no MUL_MAT_ID."""
    seen: set[int] = set()
    total = active = read = 0
    expected = Fraction(0)
    n_expert = n_used = 0
    for nc in a.nodes:
        n = nc.node
        if n.op != Op.MUL_MAT_ID:
            continue
        w, ids = n.src[0], n.src[2]
        if nc.cost is not None:
            read += nc.cost.read.get("weights", 0)
        expected += experts_expected(w.ne[2], ids.ne[0], ids.ne[1]) * expert_bytes(w)
        if id(w) in seen:
            continue
        seen.add(id(w))
        total += expert_bytes(w) * w.ne[2]
        active += expert_bytes(w) * ids.ne[0]
        n_expert, n_used = max(n_expert, w.ne[2]), max(n_used, ids.ne[0])
    if not seen:
        return None
    T = a.graph.run.n_tokens
    return ExpertWeights(len(seen), n_expert, n_used, total, active, read, T,
                         experts_touched(n_expert, n_used, T),
                         experts_expected(n_expert, n_used, T), expected)
