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


class DynAllocator:
    """ggml_dyn_tallocr for one chunk: an address-sorted free list whose last block is
    unbounded (``SIZE_MAX/2``); ``max_size`` is the high-water mark (the buffer size)."""

    #: the last block's size in ggml (SIZE_MAX/2 on 64-bit); only ever compared against
    UNBOUNDED = (1 << 63) - 1

    def __init__(self, alignment: int = CPU_ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of 2")
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, self.UNBOUNDED]]  # [offset, size], sorted
        self.max_size = 0
        self.in_use = 0  # bytes handed out and not freed (not in ggml; for live bytes)

    def alloc(self, size: int) -> int:
        """ggml_dyn_tallocr_alloc: the offset of a new block of ``size`` bytes."""
        size = ggml_pad(size, self.alignment)
        best, best_size = -1, None
        for i, (_, bsize) in enumerate(self.blocks[:-1]):
            if bsize >= size and (best_size is None or bsize <= best_size):
                best, best_size = i, bsize
        if best == -1:  # the last block: one chunk, so its reuse factor always wins
            best = len(self.blocks) - 1
        block = self.blocks[best]
        offset = block[0]
        block[0] += size
        block[1] -= size
        if block[1] == 0:
            del self.blocks[best]
        self.max_size = max(self.max_size, offset + size)
        self.in_use += size
        return offset

    def free(self, offset: int, size: int) -> None:
        """ggml_dyn_tallocr_free_bytes: give a block back, merging with its neighbours."""
        size = ggml_pad(size, self.alignment)
        self.in_use -= size
        for i, block in enumerate(self.blocks):
            if block[0] + block[1] == offset:  # the freed bytes follow this block
                block[1] += size
                if i < len(self.blocks) - 1:
                    nxt = self.blocks[i + 1]
                    if block[0] + block[1] == nxt[0]:
                        block[1] += nxt[1]
                        del self.blocks[i + 1]
                return
            if offset + size == block[0]:  # the freed bytes precede this block
                block[0] = offset
                block[1] += size
                if i > 0:
                    prev = self.blocks[i - 1]
                    if prev[0] + prev[1] == block[0]:
                        prev[1] += block[1]
                        del self.blocks[i]
                return
        pos = 0
        while pos < len(self.blocks) and self.blocks[pos][0] < offset:
            pos += 1
        self.blocks.insert(pos, [offset, size])


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
    buffer_sizes: tuple[int, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return self.live[self.peak_index] if self.live else 0


class _Hash:
    """hash_node: per-tensor allocator state."""

    __slots__ = ("n_children", "n_views", "allocated", "offset", "size", "buffer")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.allocated = False
        self.offset = 0
        self.size = 0  # aligned bytes this tensor's block spans (for live accounting)
        self.buffer = 0  # hash_node.buffer_id


def allocate(nodes: Sequence[Tensor], leafs: Sequence[Tensor], *,
             outputs: Iterable[Tensor] = (),
             inputs: Iterable[Tensor] | None = None,
             external: Callable[[Tensor], bool] | None = None,
             alignment: int = CPU_ALIGNMENT,
             node_buffers: Sequence[int] | None = None,
             leaf_buffers: Sequence[int] | None = None,
             alignments: Sequence[int] | None = None,
             alloc_sizes: Sequence[Callable[[Tensor], int] | None] | None = None) -> Allocation:
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
    """
    out_ids = {id(t) for t in outputs}
    if inputs is None:
        in_ids = {id(t) for t in leafs if t.role == "input"}
    else:
        in_ids = {id(t) for t in inputs}
    if external is None:
        def external(t: Tensor) -> bool:
            return t.role in ("weight", "kv")

    dyns = [DynAllocator(a) for a in (alignments or (alignment,))]
    state: dict[int, _Hash] = {}
    owner: dict[int, Tensor] = {}  # id -> tensor for every allocated block (live set)
    offsets: dict[int, int] = {}
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
            dyn.free(hp.offset + nsize, psize - nsize)
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
                            hp.allocated = False
                            vs.allocated = False
                            _take(node, parent.view_src)
                            free_extra_space(node, parent.view_src)
                            return
                    else:
                        hn.offset = hp.offset
                        hn.buffer = hp.buffer
                        hp.allocated = False
                        _take(node, parent)
                        free_extra_space(node, parent)
                        return
        size = size_of(node, buffer)
        dyn = dyns[buffer]
        before = dyn.max_size
        hn.buffer = buffer
        hn.offset = dyn.alloc(size)
        hn.size = ggml_pad(size, dyn.alignment)
        owner[id(node)] = node
        offsets[id(node)] = hn.offset
        if dyn.max_size > before:
            high[0] = node

    def _take(node: Tensor, parent: Tensor) -> None:
        owner.pop(id(parent), None)
        owner[id(node)] = node
        offsets[id(node)] = h(parent).offset
        inplace[id(node)] = parent

    def free_node(node: Tensor) -> None:
        if is_output(node):
            return
        hn = h(node)
        dyns[hn.buffer].free(hn.offset, size_of(node, hn.buffer))
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
                      sizes)
