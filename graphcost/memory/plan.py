"""What llama.cpp allocates at start-up, predicted from the header: KV caches, the output
buffer and the compute buffer, plus the live temporary memory at every node.

The compute buffer is sized by ``llama_context::sched_reserve`` (``src/llama-context.cpp``),
which builds worst-case graphs and runs the graph allocator over them
(``ggml_backend_sched_reserve`` -> ``ggml_gallocr_reserve_n``):

* the memory module is put in its "full" state (``init_full``: every cache attends all
  of its cells, ``n_kv = size``);
* a prompt graph with ``n_tokens = min(n_ctx, n_ubatch)`` tokens, all of them outputs
  (``n_outputs = min(n_tokens, n_outputs_max)``, and ``n_outputs_max = n_batch``);
* a token-generation graph with one token and one output;
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

from graphcost.format import ggml_types as gt
from graphcost.memory.alloc import CPU_ALIGNMENT, Allocation, allocate, ggml_nbytes
from graphcost.graph.build import BuiltGraph, build_graph, resolve_for
from graphcost.graph.ggml_graph import Tensor
from graphcost.format.model import ModelInfo
from graphcost.graph.ops import Op
from graphcost.graph.settings import Resolved, RunSettings

#: llm_graph_result::set_outputs flags t_logits, t_embd and t_h_nextn as graph outputs
#: (GGML_TENSOR_FLAG_OUTPUT: never freed, never overwritten in place)
OUTPUT_NAMES = ("result_output", "result_norm",
                # t_embd and t_embd_pooled of the embedding encoders (bert)
                "result_embd", "result_embd_pooled",
                # t_h_nextn (gemma4: the final norm before the output rows are selected;
                # qwen3next: the output-norm state for its MTP head)
                "h_nextn")
#: llama_context default n_seq_max (llama-cli uses one sequence unless -np is given)
N_SEQ_MAX = 1


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
    """The graphs llama.cpp allocates at start-up (``run.flavour.reserve_graphs``): prompt
    (n_ubatch tokens, all outputs) and generation (one token), every KV cell attended,
    built against the memory's full state."""
    out = []
    for label, tokens in (("prompt", run.n_ubatch), ("generation", N_SEQ_MAX)):
        if label in run.flavour.reserve_graphs:
            # past + tokens = n_ctx makes every cache attend all its cells (n_kv = size)
            out.append((label, run.step(tokens, run.n_ctx - tokens, tokens, memory_full=True)))
    return out


@dataclass(frozen=True)
class CacheMemory:
    """One KV cache's buffers, as llama_kv_cache logs them."""

    name: str
    cells: int
    layers: int
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int

    @property
    def bytes(self) -> int:
        return self.k_bytes + self.v_bytes


@dataclass(frozen=True)
class RecurrentMemory:
    """One recurrent state's buffer (llama_memory_recurrent, of a recurrent or hybrid
    model), as llama.cpp logs it: ``RS buffer size`` and its R and S parts (F32)."""

    cells: int
    layers: int
    r_bytes: int
    s_bytes: int

    @property
    def bytes(self) -> int:
        return self.r_bytes + self.s_bytes


@dataclass(frozen=True)
class LayerFusion:
    """Fused-attention what-if for one layer: bytes of the attention block's results
    (norm -> QKV -> rope -> attention -> output projection) before and after fusing."""

    layer: int
    first: int  # node index range of the block
    last: int
    nodes: int
    before: int  # bytes of every non-view result in the block (aligned, as allocated)
    after: int  # bytes of the results that leave the block (must still reach memory)

    @property
    def saved(self) -> int:
        return self.before - self.after


@dataclass(frozen=True)
class FusionWhatIf:
    """The what-if on one graph: per layer, and the compute buffer with fused blocks."""

    graph_label: str
    layers: list[LayerFusion]
    unfused: list[tuple[int, str]]  # (layer, why) for layers left as they are
    buffer_before: int
    buffer_after: int

    @property
    def before(self) -> int:
        return sum(f.before for f in self.layers)

    @property
    def after(self) -> int:
        return sum(f.after for f in self.layers)

    @property
    def saved(self) -> int:
        return self.before - self.after


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


def output_buffer_bytes(model: ModelInfo, embeddings: bool = False) -> int:
    """llama_context::output_reserve(n_seq_max) at start-up: logits for one output per
    sequence, ``n_vocab * max(n_outputs, n_seq_max)`` floats, plus ``n_embd`` floats per
    output with embeddings on (n_embd_out = n_embd: no dense output layers modelled; no
    backend samplers). A batch that asks for more outputs regrows it."""
    return (model.n_vocab + (model.n_embd if embeddings else 0)) * N_SEQ_MAX * 4


def cache_memory(bg: BuiltGraph) -> list[CacheMemory]:
    out = []
    for c in bg.caches:
        out.append(CacheMemory(c.name, c.size, len(c.layers), gt.type_name(bg.run.type_k),
                               gt.type_name(bg.run.type_v),
                               sum(gt.ggml_pad(t.nbytes, CPU_ALIGNMENT) for t in c.k.values()),
                               sum(gt.ggml_pad(t.nbytes, CPU_ALIGNMENT) for t in c.v.values())))
    return out


def state_memory(bg: BuiltGraph) -> list[RecurrentMemory]:
    """Each recurrent state's R and S buffers, every tensor aligned as allocated."""
    return [RecurrentMemory(st.size, len(st.layers),
                            sum(gt.ggml_pad(t.nbytes, CPU_ALIGNMENT) for t in st.r.values()),
                            sum(gt.ggml_pad(t.nbytes, CPU_ALIGNMENT) for t in st.s.values()))
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
                      output_buffer_bytes(model, run.settings.embeddings), reserves, step,
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


# ---- what-if: the attention block as one fused kernel ------------------------------------

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
    return FusionWhatIf(label, layers, unfused, simulate(bg).buffer_bytes, fused_alloc.buffer_bytes)


def fuse_plan(plan: MemoryPlan) -> list[FusionWhatIf]:
    """The what-if on every reserve graph, the one that sets the compute buffer first."""
    order = [plan.worst] + [r for r in plan.reserves if r is not plan.worst]
    return [fuse_attention(r.graph, r.label) for r in order]


# ---- what sets the peak -------------------------------------------------------------------

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
