"""Mixture-of-experts weight accounting for one analysed ubatch: how many bytes of expert
weights the model has, how many one token runs through, and how many this ubatch reads.

Every MUL_MAT_ID node multiplies by one stacked expert tensor ``[K, M, n_expert]``: each
token uses ``ids.ne0`` (n_expert_used) of its ``n_expert`` matrices, and the ubatch reads
the distinct experts touched, assumed ``min(n_expert, n_expert_used * n_tokens)``
(:func:`graphcost.costs.experts_touched`, the worst case; docs/counting.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from .analysis import Analysis
from .costs import expert_bytes
from .ops import Op


@dataclass(frozen=True)
class ExpertWeights:
    """Bytes of the expert tensors the graph's MUL_MAT_ID nodes multiply by."""

    tensors: int  # stacked expert tensors (e.g. up, gate, down per MoE layer)
    n_expert: int  # experts per tensor (largest)
    n_expert_used: int  # experts one token uses per tensor (largest)
    total_bytes: int  # all experts of those tensors
    active_bytes_per_token: int  # the n_expert_used experts one token runs through
    read_bytes: int  # read by this ubatch (distinct experts touched, per node)

    @property
    def active_fraction(self) -> float:
        return self.active_bytes_per_token / self.total_bytes if self.total_bytes else 0.0

    def to_dict(self) -> dict:
        return {"tensors": self.tensors, "n_expert": self.n_expert,
                "n_expert_used": self.n_expert_used, "total_bytes": self.total_bytes,
                "active_bytes_per_token": self.active_bytes_per_token,
                "read_bytes": self.read_bytes}


def expert_weights(a: Analysis) -> ExpertWeights | None:
    """Expert weight bytes of the analysed graph; ``None`` when it has no MUL_MAT_ID."""
    seen: set[int] = set()
    total = active = read = 0
    n_expert = n_used = 0
    for nc in a.nodes:
        n = nc.node
        if n.op != Op.MUL_MAT_ID:
            continue
        w, ids = n.src[0], n.src[2]
        if nc.cost is not None:
            read += nc.cost.read.get("weights", 0)
        if id(w) in seen:
            continue
        seen.add(id(w))
        total += expert_bytes(w) * w.ne[2]
        active += expert_bytes(w) * ids.ne[0]
        n_expert, n_used = max(n_expert, w.ne[2]), max(n_used, ids.ne[0])
    if not seen:
        return None
    return ExpertWeights(len(seen), n_expert, n_used, total, active, read)
