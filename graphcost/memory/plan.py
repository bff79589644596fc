"""What llama.cpp allocates at start-up, predicted from the header: KV caches, the output
buffer and the compute buffer, plus the live temporary memory at every node.

The compute buffer is sized by ``llama_context::sched_reserve`` (``src/llama-context.cpp``),
which builds worst-case graphs and runs the graph allocator over them
(``ggml_backend_sched_reserve`` -> ``ggml_gallocr_reserve_n``):

* the memory module is put in its "full" state (``init_full``: every cache attends all
  of its cells, ``n_kv = size``);
* a prompt graph with ``n_tokens = min(n_ctx, n_ubatch)`` tokens, all of them outputs
  (``n_outputs = min(n_tokens, n_outputs_max)``, and ``n_outputs_max = n_batch``), in
  ``n_seqs = n_seq_max`` sequences (``-np``; graph_reserve rounds n_tokens up to a multiple
  of n_seqs, the outputs stay);
* a token-generation graph with one token and one output per sequence (n_seq_max);
* the prompt graph again.

The buffer only ever grows (``ggml_gallocr_reserve_n`` reallocates when a graph needs more),
so its size is the larger of the two graphs' allocations. With one CPU backend the
scheduler hands the allocator the graph as built (one split, no input copies, no backend
graph optimisation), so :func:`graphcost.memory.alloc.allocate` on graphcost's node and leaf
lists is the whole computation.

All sizes are bytes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from graphcost.format import ggml_types as gt
from graphcost.memory.alloc import CPU_ALIGNMENT, Allocation, allocate
from graphcost.graph.build import BuiltGraph, build_graph, resolve_for
from graphcost.graph.ggml_graph import Tensor
from graphcost.format.model import ModelInfo
from graphcost.graph.settings import Resolved, RunSettings

#: llm_graph_result::set_outputs flags t_logits, t_embd and t_h_nextn as graph outputs
#: (GGML_TENSOR_FLAG_OUTPUT: never freed, never overwritten in place)
OUTPUT_NAMES = ("result_output", "result_norm",
                # t_embd and t_embd_pooled of the embedding encoders (bert)
                "result_embd", "result_embd_pooled",
                # t_h_nextn (gemma4: the final norm before the output rows are selected;
                # qwen3next: the output-norm state for its MTP head)
                "h_nextn")
def graph_outputs(nodes: list[Tensor]) -> list[Tensor]:
    """The tensors llama.cpp flags as outputs: the logits and the final-norm embeddings."""
    return [n for n in nodes if n.name in OUTPUT_NAMES]


def simulate(bg: BuiltGraph) -> Allocation:
    """Run the allocator over one built graph, with llama.cpp's input/output flags."""
    return allocate(bg.nodes, bg.leafs, outputs=graph_outputs(bg.nodes))


@dataclass(frozen=True)
class ReserveGraph:
    """One worst-case graph ``sched_reserve`` allocates, and what the allocator did."""

    label: str  # "prompt" | "generation"
    graph: BuiltGraph
    alloc: Allocation

    @property
    def n_tokens(self) -> int:
        return self.graph.run.n_tokens

    @property
    def n_outputs(self) -> int:
        return self.graph.run.n_outputs

    @property
    def peak_node(self) -> Tensor:
        return self.graph.nodes[self.alloc.peak_index]


def reserve_runs(run: Resolved) -> list[tuple[str, Resolved]]:
    """The graphs llama.cpp allocates at start-up (``run.flavour.reserve_graphs``), as
    llama_context::sched_reserve asks graph_reserve for them: prompt (``min(n_ctx,
    n_ubatch)`` tokens, as many outputs up to n_batch) and generation (one token and one
    output per sequence), both in ``n_seqs = n_seq_max`` sequences, every KV cell attended
    (built against the memory's full state)."""
    n_seqs = run.n_seq_max
    n_tokens = min(run.n_ctx, run.n_ubatch)
    # graph_reserve: "making n_tokens a multiple of n_seqs" (rounded up; n_outputs kept)
    rounded = -(-n_tokens // n_seqs) * n_seqs
    graphs = {"prompt": (rounded, min(n_tokens, run.n_batch)), "generation": (n_seqs, n_seqs)}
    return [(label, run.step(tokens, 0, outputs, memory_full=True, seqs=n_seqs))
            for label, (tokens, outputs) in graphs.items()
            if label in run.flavour.reserve_graphs]


@dataclass(frozen=True)
class TwoPartMemory:
    """A memory of ``cells`` cells over ``layers`` layers, in two parts, as llama.cpp logs
    it (``size = S MiB (C cells, L layers, ...), A (type): MiB, B (type): MiB``: the line
    graphcost.judge.oracle reads with ``_size_fields``); sizes in bytes."""

    cells: int
    layers: int

    #: the names of the two part fields, in llama.cpp's log order (set by each subclass)
    PART_FIELDS: ClassVar[tuple[str, str]]

    @property
    def parts(self) -> tuple[int, int]:
        """The two parts' sizes (bytes), in llama.cpp's log order."""
        first, second = self.PART_FIELDS
        return getattr(self, first), getattr(self, second)

    @property
    def bytes(self) -> int:
        """Both parts: the buffer llama.cpp allocates."""
        return sum(self.parts)


@dataclass(frozen=True)
class CacheMemory(TwoPartMemory):
    """One KV cache's buffers, as llama_kv_cache logs them: K and V."""

    name: str
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int
    #: llama_kv_cache::n_stream: ``cells`` per stream (llama.cpp logs the cells of one)
    streams: int = 1

    PART_FIELDS = ("k_bytes", "v_bytes")


@dataclass(frozen=True)
class RecurrentMemory(TwoPartMemory):
    """One recurrent state's buffer (llama_memory_recurrent, of a recurrent or hybrid
    model), as llama.cpp logs it: ``RS buffer size`` and its R and S parts (F32)."""

    r_bytes: int
    s_bytes: int

    PART_FIELDS = ("r_bytes", "s_bytes")


@dataclass(frozen=True)
class MemoryPlan:
    """Start-up allocations for one model and setting (bytes), and, when a graph was
    analyzed, the allocator run over that graph (``step``: its live bytes per node)."""

    model: ModelInfo
    run: Resolved
    weights_bytes: int
    caches: list[CacheMemory]
    output_buffer_bytes: int
    reserves: list[ReserveGraph]
    step: Allocation | None = None
    states: list[RecurrentMemory] = dataclasses.field(default_factory=list)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(c.bytes for c in self.caches)

    @property
    def recurrent_state_bytes(self) -> int:
        return sum(s.bytes for s in self.states)

    @property
    def worst(self) -> ReserveGraph:
        """The reserve graph that sets the compute buffer size (the first on a tie)."""
        return max(self.reserves, key=lambda r: r.alloc.buffer_bytes)

    @property
    def compute_buffer_bytes(self) -> int:
        return self.worst.alloc.buffer_bytes

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.kv_cache_bytes + self.recurrent_state_bytes
                + self.compute_buffer_bytes + self.output_buffer_bytes)

    def reserve(self, label: str) -> ReserveGraph:
        return next(r for r in self.reserves if r.label == label)


def output_buffer_bytes(model: ModelInfo, embeddings: bool = False, n_seq_max: int = 1) -> int:
    """llama_context::output_reserve(n_seq_max) at start-up: logits for one output per
    sequence, ``n_vocab * max(n_outputs, n_seq_max)`` floats, plus ``n_embd`` floats per
    output with embeddings on (n_embd_out = n_embd: no dense output layers modelled; no
    backend samplers). A batch that asks for more outputs regrows it."""
    return (model.n_vocab + (model.n_embd if embeddings else 0)) * n_seq_max * 4


def _aligned_bytes(tensors: dict[int, Tensor]) -> int:
    """Bytes of one part of a memory (a tensor per layer), each tensor aligned as the
    backend buffer allocates it."""
    return sum(gt.ggml_pad(t.nbytes, CPU_ALIGNMENT) for t in tensors.values())


def cache_memory(bg: BuiltGraph) -> list[CacheMemory]:
    """Each KV cache's K and V buffers."""
    return [CacheMemory(cells=c.size, layers=len(c.layers), name=c.name,
                        type_k=gt.type_name(bg.run.type_k), type_v=gt.type_name(bg.run.type_v),
                        k_bytes=_aligned_bytes(c.k), v_bytes=_aligned_bytes(c.v),
                        streams=c.n_stream)
            for c in bg.caches]


def state_memory(bg: BuiltGraph) -> list[RecurrentMemory]:
    """Each recurrent state's R and S buffers."""
    return [RecurrentMemory(cells=st.size, layers=len(st.layers), r_bytes=_aligned_bytes(st.r),
                            s_bytes=_aligned_bytes(st.s))
            for st in bg.states]


def plan_memory(model: ModelInfo, settings: RunSettings | Resolved,
                analyzed: BuiltGraph | None = None) -> MemoryPlan:
    """Build the reserve graphs for ``settings`` and allocate them like sched_reserve;
    with ``analyzed`` (a graph built for the same model), also run the allocator over it
    for its live bytes per node."""
    run = settings if isinstance(settings, Resolved) else resolve_for(model, settings)
    reserves = []
    for label, r in reserve_runs(run):
        bg = build_graph(model, r)
        reserves.append(ReserveGraph(label, bg, simulate(bg)))
    step = simulate(analyzed) if analyzed is not None else None
    return MemoryPlan(model, run, model.weights_bytes, cache_memory(reserves[0].graph),
                      output_buffer_bytes(model, run.settings.embeddings, run.n_seq_max),
                      reserves, step,
                      state_memory(reserves[0].graph))


def plan_for(bg: BuiltGraph) -> MemoryPlan:
    """The memory plan for the settings ``bg`` was built with, with ``bg`` as the step."""
    return plan_memory(bg.model, bg.run, analyzed=bg)


#: sweep keys: the RunSettings field each one sets
SWEEP_KEYS = {"ctx": "ctx_size", "ub": "ubatch_size"}


def sweep(model: ModelInfo, settings: RunSettings, key: str, values: list[int]) -> list[MemoryPlan]:
    """One plan per value of ``key`` (``ctx`` or ``ub``), other settings as given."""
    field_ = SWEEP_KEYS[key]
    return [plan_memory(model, dataclasses.replace(settings, **{field_: v})) for v in values]
