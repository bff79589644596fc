"""The ggml-alloc mirror (graphcost.memory.alloc) on hand-made tiny graphs, with exact numbers.

Rules under test, all from ggml/src/ggml-alloc.c: sizes are ggml_nbytes rounded up to 32
(the CPU TENSOR_ALIGNMENT); the best-fitting free block other than the last wins, the
last block grows the buffer; freed blocks merge with both neighbours; ops that can run
in place take over a dying source's block; views allocate nothing and keep their source
alive until their own consumers are done; outputs are never freed; leaves with data of
their own (weights, KV cache) are never allocated.
"""
from __future__ import annotations

import pytest

from graphcost.format import ggml_types as gt
from graphcost.memory.alloc import DynAllocator, allocate, can_inplace
from graphcost.graph.ggml_graph import Graph

F32 = gt.F32


# ---- the dynamic allocator ---------------------------------------------------------------

def _free_list(d: DynAllocator) -> list[tuple[int, int]]:
    """Free blocks, the unbounded last one shown with size -1."""
    return [(o, -1 if s > 1 << 60 else s) for o, s in d.blocks]


def test_sizes_round_up_to_the_alignment():
    d = DynAllocator(32)
    assert d.alloc(10) == 0        # 10 -> 32 bytes
    assert d.alloc(33) == 32       # 33 -> 64 bytes, after the first block
    assert d.alloc(32) == 96       # 32 + 64 = 96
    assert d.max_size == 128       # 96 + 32
    assert d.in_use == 32 + 64 + 32
    with pytest.raises(ValueError):
        DynAllocator(24)           # not a power of 2


def test_freed_blocks_merge_with_both_neighbours():
    d = DynAllocator(32)
    a, b, c, e = (d.alloc(32) for _ in range(4))   # 0, 32, 64, 96; the last block starts at 128
    assert (a, b, c, e) == (0, 32, 64, 96)
    d.free(a, 32)
    d.free(c, 32)
    assert _free_list(d) == [(0, 32), (64, 32), (128, -1)]
    d.free(b, 32)                  # joins [0,32) on its left and [64,96) on its right
    assert _free_list(d) == [(0, 96), (128, -1)]
    d.free(e, 32)                  # joins [0,96) and the unbounded last block: all free again
    assert _free_list(d) == [(0, -1)]
    assert d.max_size == 128 and d.in_use == 0


def test_best_fit_prefers_the_smallest_block_and_the_later_one_on_a_tie():
    d = DynAllocator(32)
    offs = [d.alloc(n) for n in (64, 32, 32, 32, 32)]  # 0, 64, 96, 128, 160; end 192
    assert offs == [0, 64, 96, 128, 160]
    d.free(0, 64)                  # free: [0,64)
    d.free(96, 32)                 # free: [96,128)
    assert d.alloc(32) == 96       # best fit: the 32-byte hole, not the 64-byte one
    d.free(96, 32)
    d.free(160, 32)                # [160,192) merges with the last block -> last starts at 160
    assert _free_list(d) == [(0, 64), (96, 32), (160, -1)]
    d.free(64, 32)                 # [0,64) + [64,96) + [96,128) -> one 128-byte hole
    assert _free_list(d) == [(0, 128), (160, -1)]
    assert d.alloc(160) == 160     # too big for the hole: taken from the last block
    assert d.max_size == 320       # 160 + 160
    d2 = DynAllocator(32)
    for _ in range(5):
        d2.alloc(32)               # 0 .. 160
    d2.free(0, 32)
    d2.free(64, 32)                # two equal 32-byte holes at 0 and 64
    assert d2.alloc(32) == 64      # ggml keeps the later of equal best fits (size <= best)


# ---- the graph allocator ----------------------------------------------------------------

def test_inplace_ops_take_over_a_dying_source():
    # x [16] f32 = 64 B (input); y = rms_norm(x) and z = y * w run in place on x's block;
    # out = W[16,8] x z is a MUL_MAT (never in place): 8 floats = 32 B at offset 64.
    g = Graph()
    x = g.new_tensor(F32, [16], name="x")
    w = g.new_tensor(F32, [16], name="w", role="weight")
    W = g.new_tensor(F32, [16, 8], name="W", role="weight")
    y = g.rms_norm(x, 1e-6)
    z = g.mul(y, w)
    out = g.cb(g.mul_mat(W, z), "out")
    g.expand(out)
    a = allocate(g.nodes, g.leafs, outputs=[out])
    assert [a.offsets[id(t)] for t in (x, y, z, out)] == [0, 0, 0, 64]
    assert a.inplace == {id(y): x, id(z): y}
    assert id(w) not in a.offsets and id(W) not in a.offsets   # weights have their own memory
    assert a.live == [64, 64, 96]  # one 64-byte block passed along, then + the 32-byte out
    assert a.buffer_bytes == 96


def test_no_inplace_while_the_source_has_other_consumers():
    # x [16] f32 (64 B). y = scale(x) cannot take x (x is read again by z); z = x + y can:
    # when z is allocated, y has already used x, so z is x's last consumer.
    g = Graph()
    x = g.new_tensor(F32, [16], name="x")
    y = g.scale(x, 2.0)
    z = g.add(x, y)
    g.expand(z)
    a = allocate(g.nodes, g.leafs, outputs=[z])
    assert a.offsets[id(y)] == 64                 # a block of its own after x
    assert a.offsets[id(z)] == 0                  # took x's block
    assert a.inplace == {id(z): x}
    assert a.live == [128, 128]                   # x + y, then z (=x's block) + y
    assert a.buffer_bytes == 128


def test_non_inplace_op_and_layout_change_get_new_blocks():
    # MUL_MAT is not in ggml_op_can_inplace; a same-op result with another shape is not
    # the same layout: both get fresh blocks.
    g = Graph()
    x = g.new_tensor(F32, [16, 2], name="x")       # 128 B
    W = g.new_tensor(F32, [16, 16], name="W", role="weight")
    m = g.mul_mat(W, x)                            # [16, 2] f32 = 128 B, new block
    b = g.new_tensor(F32, [16, 1], name="b")       # 64 B input, broadcast
    s = g.add(b, b)                                # [16, 1]: in place on b? b has 2 uses
    t = g.add(m, s)                                # same layout as m: in place on m
    g.expand(t)
    assert not can_inplace(m) and can_inplace(t)
    a = allocate(g.nodes, g.leafs, outputs=[t])
    # leaves: x at 0 (128), b at 128 (64); m at 192 (128); x is dead after m -> [0,128)
    # free; s (64 B): best fit among holes -> 0; t takes m's block (192)
    assert a.offsets[id(x)] == 0 and a.offsets[id(b)] == 128
    assert a.offsets[id(m)] == 192
    assert a.offsets[id(s)] == 0                   # reuses the hole x left
    assert a.offsets[id(t)] == 192
    assert a.buffer_bytes == 320                   # 192 + 128


def test_views_allocate_nothing_and_keep_their_source_alive():
    # x [16] f32 (64 B); v = reshape(x, [4, 4]) is a view: no block. s = soft_max(v) cannot
    # run in place on a view (ggml: a view is never the allocator's "own" tensor), so it
    # gets 64 B at offset 64. x is freed only when v's last consumer (s) is done, so a
    # later 64-byte result lands at 0.
    g = Graph()
    x = g.new_tensor(F32, [16], name="x")
    v = g.reshape(x, [4, 4])
    s = g.soft_max_ext(v, None, 1.0, 0.0)
    W = g.new_tensor(F32, [4, 4], name="W", role="weight")
    m = g.mul_mat(W, s)                            # [4, 4] f32, 64 B
    g.expand(m)
    a = allocate(g.nodes, g.leafs, outputs=[m])
    assert id(v) not in a.offsets
    assert a.offsets[id(s)] == 64
    assert a.offsets[id(m)] == 0                   # x's block, freed after s
    assert a.live == [64, 128, 128]                # at v: x; at s: x + s; at m: s + m
    assert a.buffer_bytes == 128


def test_a_view_of_a_source_blocks_inplace_reuse():
    # x [16] f32 (64 B) has a view v (run first) and one more consumer y = scale(x). When y
    # is allocated x has one consumer left, but n_views = 1: y gets a block of its own, and
    # x stays allocated after y (the view was never consumed, so it never lets go of x).
    g = Graph()
    x = g.new_tensor(F32, [16], name="x")
    v = g.view(x, [8], offset=0)
    g.expand(v)
    y = g.scale(x, 2.0)
    g.expand(y)
    a = allocate(g.nodes, g.leafs, outputs=[y])
    assert [n.op for n in g.nodes] == ["VIEW", "SCALE"]
    assert a.offsets[id(y)] == 64
    assert a.inplace == {}
    assert a.live == [64, 128]


def test_outputs_are_never_freed_nor_reused():
    # o = scale(x) is an output; p = scale(o) would take o's block, but outputs cannot be
    # reused in place, and after p the output still holds its 64 bytes.
    g = Graph()
    x = g.new_tensor(F32, [16], name="x")
    o = g.scale(x, 2.0)
    p = g.scale(o, 3.0)
    g.expand(p)
    a = allocate(g.nodes, g.leafs, outputs=[o, p])
    assert a.offsets[id(o)] == 0                   # in place on the input x
    assert a.offsets[id(p)] == 64                  # not on o: o is an output
    assert a.live == [64, 128]
    assert a.buffer_bytes == 128


def test_unconsumed_inputs_stay_allocated_for_the_whole_graph():
    # like llama.cpp's inp_embd in a token batch: an input leaf no node reads is allocated
    # with the leaves and never freed (its consumer count never reaches zero from a use)
    g = Graph()
    unused = g.new_tensor(F32, [8], name="inp_embd")          # 32 B
    x = g.new_tensor(F32, [16], name="x")                     # 64 B
    y = g.scale(x, 2.0)
    g.expand(y)
    g.leafs.insert(0, unused)                                 # in the graph, read by nobody
    a = allocate(g.nodes, g.leafs, outputs=[y])
    assert a.offsets[id(unused)] == 0 and a.offsets[id(x)] == 32
    assert a.live == [96]
    assert [(t.name, n) for t, n in a.peak_tensors] == [(y.name, 64), ("inp_embd", 32)]
