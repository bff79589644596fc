"""A mirror of ggml's graph allocator (``ggml/src/ggml-alloc.c``): where every tensor of a
graph lands in the compute buffer, how big the buffer must be, and how many bytes are live
when each node runs.

This is a pure function over a node list and a leaf list (:func:`allocate`). It follows
``ggml_gallocr_alloc_graph_impl`` step by step, for one buffer type (the CPU backend, one
chunk):

1. every leaf that has no memory of its own yet (graph inputs; weights and KV cache
   buffers already have data) is allocated, in leaf order;
2. a pass over the nodes counts, per tensor, its consumers (``n_children``: one per
   ``src`` slot) and the views of it (``n_views``), and allocates tensors flagged as
   inputs;
3. in node order: allocate the node's sources (only leaves can still be missing), then
   the node itself, then decrement each source's consumer count and free a source whose
   count and view count reached zero (a view, when its own consumers are done, releases
   one view count of the tensor it looks at, which is freed once its counts are zero).

Allocating a node (``ggml_gallocr_allocate_node``): views and tensors with external
memory get nothing; an op that can run in place (``ggml_op_can_inplace``) takes over the
block of the first source that the allocator owns, that is not a graph output, has the
same type, shape and strides, and has this node as its only consumer and no views; the
unused tail of a larger block is freed. Otherwise the block comes from the dynamic
allocator (``ggml_dyn_tallocr_alloc``): the best-fitting free block other than the last
one (on equal sizes the later block wins), else the last block, whose end is the
buffer's high-water mark. Sizes are ``ggml_nbytes`` rounded up to the alignment (32 bytes
for the CPU buffer type, ``TENSOR_ALIGNMENT`` in ``ggml/src/ggml-impl.h``). Freeing
(``ggml_dyn_tallocr_free_bytes``) merges the block with a free neighbour on either side,
or inserts it into the address-sorted free list. Graph outputs are never freed.

All sizes are bytes. ``live`` per node is the bytes the allocator holds (aligned blocks of
every allocated, not yet freed tensor, inputs included) at the moment the node runs:
after its result is allocated and before its dying sources are freed.

Several buffer types (``ggml_gallocr_new_n``, as the backend scheduler uses it): each node
and leaf names the buffer it is allocated in (``node_buffer_ids`` / ``leaf_buffer_ids``),
each buffer has its own dynamic allocator and alignment, and a node that runs in place
takes over its source's block in the source's buffer. :mod:`graphcost.memory.sched`
passes these; with one buffer everything above is unchanged.

A buffer type with a maximum size (``ggml_backend_buft_get_max_size``: Vulkan's 1 GiB
suballocation block) bounds each chunk of its buffer: a block that fits in no chunk opens
a new one (up to 16), and the buffer is the sum of its chunks (:class:`DynAllocator`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from graphcost.format.ggml_types import ggml_pad
from graphcost.graph import ops
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import Op

#: TENSOR_ALIGNMENT (ggml/src/ggml-impl.h), returned by the CPU buffer type's get_alignment
CPU_ALIGNMENT = 32



def can_inplace(t: Tensor) -> bool:
    """ggml_op_can_inplace(t->op) (:data:`graphcost.graph.ops.INPLACE`)."""
    return t.op in ops.INPLACE


def ggml_nbytes(t: Tensor) -> int:
    """ggml_nbytes, what the CPU buffer type allocates for a tensor (its get_alloc_size
    is NULL, so ``ggml_backend_buft_get_alloc_size`` falls back to this)."""
    return t.nbytes


def same_layout(a: Tensor, b: Tensor) -> bool:
    """ggml_are_same_layout (ggml-impl.h): same type, ``ne`` and ``nb``."""
    return a.type == b.type and a.ne == b.ne and a.nb == b.nb


#: INT64_MIN, ggml_dyn_tallocr_alloc's first best_reuse
INT64_MIN = -(1 << 63)
#: ggml-alloc.c GGML_VBUFFER_MAX_CHUNKS: the most chunks (backend buffers) one buffer splits into
MAX_CHUNKS = 16


class DynAllocator:
    """ggml_dyn_tallocr: per chunk, an address-sorted free list; ``max_size`` (the buffer size
    ggml_gallocr_reserve_n_size reports) is the sum of the chunks' high-water marks.

    ``max_chunk_size`` is the buffer type's ``get_max_size`` (ggml_dyn_tallocr_new clamps it
    to SIZE_MAX/2; None: SIZE_MAX, one unbounded chunk, the CPU's case). A chunk
    (ggml_dyn_tallocr_new_chunk, made when no chunk has room) starts as one free block of
    ``max(size, max_chunk_size)`` bytes, the 16th of SIZE_MAX/2; each chunk becomes its own
    backend buffer of its high-water mark (ggml_vbuffer_alloc)."""

    #: SIZE_MAX/2 on 64-bit, the unbounded block; only ever compared against
    UNBOUNDED = (1 << 63) - 1

    def __init__(self, alignment: int = CPU_ALIGNMENT, max_chunk_size: int | None = None):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of 2")
        self.alignment = alignment
        self.max_chunk_size = min(max_chunk_size or self.UNBOUNDED, self.UNBOUNDED)
        self.chunks: list[list[list[int]]] = []  # per chunk: free blocks [offset, size], sorted
        self.chunk_max: list[int] = []  # per chunk: its high-water mark
        self.in_use = 0  # bytes handed out and not freed (not in ggml; for live bytes)

    @property
    def blocks(self) -> list[list[int]]:
        """The first chunk's free list (the whole free list of an unbounded allocator)."""
        return self.chunks[0] if self.chunks else [[0, self.UNBOUNDED]]

    @property
    def max_size(self) -> int:
        return sum(self.chunk_max)

    def _new_chunk(self, min_size: int) -> int:
        """ggml_dyn_tallocr_new_chunk."""
        if len(self.chunks) >= MAX_CHUNKS:
            raise ValueError(f"graph allocation: more than {MAX_CHUNKS} chunks of "
                             f"{self.max_chunk_size} bytes (ggml aborts)")
        size = max(min_size, self.max_chunk_size)
        if len(self.chunks) == MAX_CHUNKS - 1:
            size = self.UNBOUNDED
        self.chunks.append([[0, size]])
        self.chunk_max.append(0)
        return len(self.chunks) - 1

    def alloc_at(self, size: int) -> tuple[int, int]:
        """ggml_dyn_tallocr_alloc: (chunk, offset) of a new block of ``size`` bytes. The
        best-fitting free block other than a chunk's last, searched chunk by chunk (a later
        chunk's fit wins: the best size restarts per chunk; on equal sizes the later block);
        else the chunk whose last block wastes least (reuse factor: its high-water mark
        less the block's offset and the size; growing the chunk least when all must grow);
        else a new chunk."""
        size = ggml_pad(size, self.alignment)
        best_chunk = best_block = -1
        for c, blocks in enumerate(self.chunks):
            best_size = None
            for i, (_, bsize) in enumerate(blocks[:-1]):
                if bsize >= size and (best_size is None or bsize <= best_size):
                    best_chunk, best_block, best_size = c, i, bsize
        if best_block == -1:
            best_reuse = INT64_MIN
            for c, blocks in enumerate(self.chunks):
                if not blocks:
                    continue
                offset, bsize = blocks[-1]
                reuse = self.chunk_max[c] - offset - size
                better_reuse = best_reuse < 0 and reuse > best_reuse
                better_fit = reuse >= 0 and reuse < best_reuse
                if bsize >= size and (better_reuse or better_fit):
                    best_chunk, best_block, best_reuse = c, len(blocks) - 1, reuse
        if best_block == -1:
            best_chunk, best_block = self._new_chunk(size), 0
        blocks = self.chunks[best_chunk]
        block = blocks[best_block]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del blocks[best_block]
        self.chunk_max[best_chunk] = max(self.chunk_max[best_chunk], offset + size)
        self.in_use += size
        return best_chunk, offset

    def alloc(self, size: int) -> int:
        """The offset of a new block (in its chunk: :meth:`alloc_at` says which)."""
        return self.alloc_at(size)[1]

    def free(self, offset: int, size: int, chunk: int = 0) -> None:
        """ggml_dyn_tallocr_free_bytes: give a block back, merging with its neighbours."""
        size = ggml_pad(size, self.alignment)
        self.in_use -= size
        blocks = self.chunks[chunk]
        for i, block in enumerate(blocks):
            if block[0] + block[1] == offset:  # the freed bytes follow this block
                block[1] += size
                if i < len(blocks) - 1:
                    nxt = blocks[i + 1]
                    if block[0] + block[1] == nxt[0]:
                        block[1] += nxt[1]
                        del blocks[i + 1]
                return
            if offset + size == block[0]:  # the freed bytes precede this block
                block[0] = offset
                block[1] += size
                if i > 0:
                    prev = blocks[i - 1]
                    if prev[0] + prev[1] == block[0]:
                        prev[1] += block[1]
                        del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


def reserved_chunks(graphs: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """The chunk sizes of one buffer after ggml_gallocr_reserve_n over several graphs in turn
    (llama_context::sched_reserve: prompt, generation, prompt): a graph reallocates the
    buffer, to exactly its own chunk sizes, when the buffer is not there yet or one of its
    chunks is larger than the buffer's chunk of that index (ggml_gallocr_reserve_n_impl);
    otherwise the buffer stays. With one chunk this is the largest size."""
    cur: tuple[int, ...] | None = None
    for new in graphs:
        if cur is None or any(n > (cur[c] if c < len(cur) else 0) for c, n in enumerate(new)):
            cur = tuple(new)
    return cur or ()


@dataclass(frozen=True)
class Allocation:
    """What the allocator decided for one graph.

    ``offsets``: id(tensor) -> byte offset, for every tensor that got a block (a tensor
    that ran in place has its source's offset); ``buffer_bytes``: the buffer size (the
    high-water mark); ``live``: per node, bytes held when it runs; ``peak_index``: the
    first node with the most live bytes; ``peak_tensors``: the tensors holding the bytes
    there, with their aligned block sizes, largest first; ``inplace``: id(node) -> the
    source whose block it took; ``high_water``: the tensor whose block last raised the
    buffer size.
    """

    offsets: dict[int, int]
    buffer_bytes: int
    live: list[int]
    peak_index: int
    peak_tensors: list[tuple[Tensor, int]]
    inplace: dict[int, Tensor]
    high_water: Tensor | None
    #: per buffer (``alignments``' order): its size, the high-water mark of its allocator
    #: (the sum over its chunks)
    buffer_sizes: tuple[int, ...] = ()
    #: per buffer: each chunk's size (one chunk unless the buffer type has a max size)
    chunk_sizes: tuple[tuple[int, ...], ...] = ()
    #: id(tensor) -> its chunk, for tensors in a chunk other than the first
    chunks: dict[int, int] | None = None

    @property
    def peak_bytes(self) -> int:
        return self.live[self.peak_index] if self.live else 0


class _Hash:
    """hash_node: per-tensor allocator state."""

    __slots__ = ("n_children", "n_views", "allocated", "offset", "size", "buffer", "chunk")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.allocated = False
        self.offset = 0
        self.size = 0  # aligned bytes this tensor's block spans (for live accounting)
        self.buffer = 0  # hash_node.buffer_id
        self.chunk = 0  # hash_node.addr.chunk


def allocate(nodes: Sequence[Tensor], leafs: Sequence[Tensor], *,
             outputs: Iterable[Tensor] = (),
             inputs: Iterable[Tensor] | None = None,
             external: Callable[[Tensor], bool] | None = None,
             alignment: int = CPU_ALIGNMENT,
             node_buffers: Sequence[int] | None = None,
             leaf_buffers: Sequence[int] | None = None,
             alignments: Sequence[int] | None = None,
             alloc_sizes: Sequence[Callable[[Tensor], int] | None] | None = None,
             max_sizes: Sequence[int | None] | None = None) -> Allocation:
    """Run ggml_gallocr_alloc_graph_impl over ``nodes`` (execution order) and ``leafs``.

    ``outputs``: tensors flagged GGML_TENSOR_FLAG_OUTPUT (never freed, never reused in
    place); ``inputs``: tensors flagged GGML_TENSOR_FLAG_INPUT (default: leaves with role
    ``input``); ``external``: tensors whose memory exists already (``t->data`` set:
    default, weights and KV cache buffers). Several buffers: ``alignments`` (one per
    buffer) and the buffer of each node and leaf (``node_buffers``, ``leaf_buffers``,
    parallel to ``nodes`` and ``leafs``; default: buffer 0). ``alloc_sizes``: per buffer,
    its buffer type's ``get_alloc_size`` (bytes a tensor takes; None or a None entry:
    ``ggml_nbytes``, as for the CPU), used wherever ggml-alloc.c asks
    ``ggml_backend_buft_get_alloc_size`` (allocating, freeing, the in-place tail).
    ``max_sizes``: per buffer, its buffer type's ``get_max_size`` (None: SIZE_MAX): a
    buffer whose tensors outgrow it is split into chunks (:class:`DynAllocator`).
    """
    out_ids = {id(t) for t in outputs}
    if inputs is None:
        in_ids = {id(t) for t in leafs if t.role == "input"}
    else:
        in_ids = {id(t) for t in inputs}
    if external is None:
        def external(t: Tensor) -> bool:
            return t.role in ("weight", "kv")

    aligns = alignments or (alignment,)
    dyns = [DynAllocator(a, max_sizes[k] if max_sizes is not None else None)
            for k, a in enumerate(aligns)]
    state: dict[int, _Hash] = {}
    owner: dict[int, Tensor] = {}  # id -> tensor for every allocated block (live set)
    offsets: dict[int, int] = {}
    chunk_of: dict[int, int] = {}
    inplace: dict[int, Tensor] = {}
    high: list[Tensor | None] = [None]  # the tensor whose block raised max_size last

    def size_of(t: Tensor, buffer: int) -> int:  # ggml_backend_buft_get_alloc_size
        f = alloc_sizes[buffer] if alloc_sizes is not None else None
        return f(t) if f is not None else ggml_nbytes(t)

    def h(t: Tensor) -> _Hash:
        s = state.get(id(t))
        if s is None:
            s = state[id(t)] = _Hash()
        return s

    def is_output(t: Tensor) -> bool:
        return id(t) in out_ids

    def is_own(t: Tensor) -> bool:
        return h(t).allocated

    def is_allocated(t: Tensor) -> bool:
        return external(t) or is_own(t)

    def free_extra_space(node: Tensor, parent: Tensor) -> None:
        hp = h(parent)
        dyn = dyns[hp.buffer]  # the parent's allocator and its alignment
        psize = ggml_pad(size_of(parent, hp.buffer), dyn.alignment)
        nsize = ggml_pad(size_of(node, hp.buffer), dyn.alignment)
        assert psize >= nsize
        if psize > nsize:
            dyn.free(hp.offset + nsize, psize - nsize, hp.chunk)
        h(node).size = nsize

    def allocate_node(node: Tensor, buffer: int = 0) -> None:
        hn = h(node)
        if is_allocated(node) or node.is_view:
            return
        hn.allocated = True
        if can_inplace(node):
            for parent in node.src:
                if not is_own(parent):
                    continue  # external, a view, or not allocated by us
                if is_output(parent) or (parent.view_src is not None and is_output(parent.view_src)):
                    continue
                if not same_layout(node, parent):
                    continue
                hp = h(parent)
                if hp.n_children == 1 and hp.n_views == 0:
                    if parent.is_view:  # unreachable in ggml too: a view is never "own"
                        vs = h(parent.view_src)
                        if vs.n_views == 1 and vs.n_children == 0:
                            hn.offset = hp.offset
                            hn.buffer = hp.buffer
                            hn.chunk = hp.chunk
                            hp.allocated = False
                            vs.allocated = False
                            _take(node, parent.view_src)
                            free_extra_space(node, parent.view_src)
                            return
                    else:
                        hn.offset = hp.offset
                        hn.buffer = hp.buffer
                        hn.chunk = hp.chunk
                        hp.allocated = False
                        _take(node, parent)
                        free_extra_space(node, parent)
                        return
        size = size_of(node, buffer)
        dyn = dyns[buffer]
        before = dyn.max_size
        hn.buffer = buffer
        hn.chunk, hn.offset = dyn.alloc_at(size)
        if hn.chunk:
            chunk_of[id(node)] = hn.chunk
        hn.size = ggml_pad(size, dyn.alignment)
        owner[id(node)] = node
        offsets[id(node)] = hn.offset
        if dyn.max_size > before:
            high[0] = node

    def _take(node: Tensor, parent: Tensor) -> None:
        owner.pop(id(parent), None)
        owner[id(node)] = node
        offsets[id(node)] = h(parent).offset
        if h(parent).chunk:
            chunk_of[id(node)] = h(parent).chunk
        inplace[id(node)] = parent

    def free_node(node: Tensor) -> None:
        if is_output(node):
            return
        hn = h(node)
        dyns[hn.buffer].free(hn.offset, size_of(node, hn.buffer), hn.chunk)
        hn.allocated = False
        owner.pop(id(node), None)

    def node_buffer(i: int) -> int:  # get_node_buffer_id
        return node_buffers[i] if node_buffers is not None else 0

    # 1. leaves
    for i, leaf in enumerate(leafs):
        allocate_node(leaf, leaf_buffers[i] if leaf_buffers is not None else 0)
    # 2. count children and views; allocate flagged inputs
    for i, node in enumerate(nodes):
        if node.is_view and node.op != Op.NONE:
            h(node.view_src).n_views += 1
        if id(node) in in_ids:
            allocate_node(node, node_buffer(i))
        for src in node.src:
            h(src).n_children += 1
            if id(src) in in_ids:
                allocate_node(src, node_buffer(i))
    # 3. allocate and free in execution order
    live: list[int] = []
    peak_index, peak, peak_tensors = 0, -1, []
    for i, node in enumerate(nodes):
        for parent in node.src:
            allocate_node(parent, node_buffer(i))
        allocate_node(node, node_buffer(i))
        in_use = sum(d.in_use for d in dyns)
        live.append(in_use)
        if in_use > peak:
            peak, peak_index = in_use, i
            peak_tensors = [(t, h(t).size) for t in owner.values()]
        for parent in node.src:
            hp = h(parent)
            hp.n_children -= 1
            if hp.n_children == 0 and hp.n_views == 0:
                if parent.is_view:
                    vs = h(parent.view_src)
                    vs.n_views -= 1
                    if vs.n_views == 0 and vs.n_children == 0 and vs.allocated:
                        free_node(parent.view_src)
                elif hp.allocated:
                    free_node(parent)
    peak_tensors.sort(key=lambda ts: -ts[1])
    sizes = tuple(d.max_size for d in dyns)
    return Allocation(offsets, sum(sizes), live, peak_index, peak_tensors, inplace, high[0],
                      sizes, tuple(tuple(d.chunk_max) for d in dyns), chunk_of)
