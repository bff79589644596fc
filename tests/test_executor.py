"""The executor without llama.cpp: KV cells and masks, views without copies, memory-mapped
weights, the cache kept across steps, header-only files on random data, bad input.

The comparisons with llama.cpp are in tests/test_numerics.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import fixtures as F
from gguf import GGMLQuantizationType as QT
from graphcost.format import ggml_types as gt
from graphcost.errors import GraphcostError, SettingsError, UnsupportedError
from graphcost.execute.exec_ops import OPS, tensor_view, unsupported_ops
from graphcost.execute.executor import Executor
from graphcost.execute.kv_cells import CellState, hadamard
from graphcost.execute.weights import mapped_weights
from graphcost.graph.ggml_graph import Graph
from graphcost.format.gguf_reader import read_header
from graphcost.graph.settings import RunSettings, n_kv_for


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return F.write_llama(tmp_path_factory.mktemp("exec") / "llama.gguf", n_layer=2)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    # 7 layers, window 64: layer 5 global, the others sliding
    return F.write_gemma3(tmp_path_factory.mktemp("exec") / "gemma3.gguf")


# ---------------------------------------------------------------------------- cells


def test_cells_fill_from_zero_and_pad_n_kv():
    c = CellState(1024)
    idx = c.find_slot(5)
    c.apply(idx, np.arange(5))
    assert idx.tolist() == [0, 1, 2, 3, 4] and c.head == 5
    # used_max_p1 = 5 -> padded to 256 cells
    assert c.n_kv() == 256
    idx = c.find_slot(1)
    c.apply(idx, np.array([5]))
    assert idx.tolist() == [5]


def test_causal_mask_rows():
    c = CellState(256)
    c.apply(c.find_slot(3), np.arange(3))
    m = c.mask(256, np.arange(3))
    assert m.shape == (3, 256)
    # token i sees cells 0..i, nothing else (empty cells are masked too)
    for i in range(3):
        assert (m[i, :i + 1] == 0).all() and np.isneginf(m[i, i + 1:]).all()
    # written in place into the graph's F16 input (every value of the rows set)
    out = np.full((3, 256), 7, dtype=np.float16)
    assert c.mask(256, np.arange(3), out=out) is out
    assert np.array_equal(out, m.astype(np.float16))


def test_sliding_window_mask_and_cell_reuse():
    # window 4: p1 - p0 >= 4 is masked (LLAMA_SWA_TYPE_STANDARD)
    c = CellState(8, n_swa=4)
    c.apply(c.find_slot(6), np.arange(6))
    m = c.mask(8, np.array([5]))
    assert m[0].tolist()[:6] == [-np.inf, -np.inf, 0, 0, 0, 0]
    # positions 6, 7 fill the last cells; 8 reuses cell 0 (position 0 is out of the window
    # of the newest position 7 + 1: 8 - 0 >= 4); llama.cpp then purges the positions from
    # the sequence's minimum (now 1) up to the overwritten one (0): none
    c.apply(c.find_slot(2), np.array([6, 7]))
    idx = c.find_slot(1)
    assert idx.tolist() == [0]
    c.apply(idx, np.array([8]))
    assert c.pos.tolist() == [8, 1, 2, 3, 4, 5, 6, 7] and c.head == 1
    # every cell still visible to position 8 is inside the window
    vis = c.pos[(c.mask(8, np.array([8]))[0] == 0)]
    assert sorted(vis.tolist()) == [5, 6, 7, 8]


def test_cell_figures_kept_beside_the_cells_equal_a_recount():
    # used, used_max_p1 and the highest position are kept up to date by apply (no pass
    # over the cells a decode step); each equals the pass over pos after every apply,
    # through fills, sliding-window reuse, purges of stale positions and a restore
    def recount(c):
        filled = np.flatnonzero(c.pos >= 0)
        return (filled.size, int(filled[-1]) + 1 if filled.size else 0,
                int(c.pos.max()) if filled.size else -1)

    rng = np.random.default_rng(7)
    for size, n_swa in ((64, 0), (40, 16), (37, 5)):
        c = CellState(size, n_swa)
        past, saved, restored, purged = 0, None, 0, 0
        for step in range(300):
            if step == 5:
                saved = (c.pos.copy(), c.head, past)        # Executor.checkpoint's
            n = int(rng.integers(1, 6))
            if c.used + n > size and n_swa == 0:            # full: back to the checkpoint
                c.restore(saved[0], saved[1])
                past, restored = saved[2], restored + 1
                assert (c.used, c.used_max_p1(), c.seq_pos_max()) == recount(c)
                continue
            idx = c.find_slot(n)
            # now and then a ubatch that rewinds (positions below ones held): the purge
            p0 = past - int(rng.integers(1, 4)) if past > 4 and rng.random() < 0.1 else past
            filled = c.used + int((c.pos[idx] < 0).sum())   # after apply, unless purged
            c.apply(idx, np.arange(p0, p0 + n))
            purged += c.used < filled
            past = p0 + n
            assert (c.used, c.used_max_p1(), c.seq_pos_max()) == recount(c), (size, step)
            assert c.n_kv() == n_kv_for(recount(c)[1], size)
        assert (restored if n_swa == 0 else purged) > 0         # each path ran


def test_full_cache_is_an_error():
    c = CellState(4)
    c.apply(c.find_slot(4), np.arange(4))
    with pytest.raises(SettingsError, match="full"):
        c.find_slot(1)


def test_hadamard_is_orthonormal_walsh():
    h = hadamard(64)
    assert h.dtype == np.float32 and h[0, 0] == np.float32(1 / 8)
    np.testing.assert_allclose(h @ h.T, np.eye(64), atol=1e-6)
    # Sylvester: H_2n = [[H, H], [H, -H]]
    np.testing.assert_array_equal(h[32:, 32:], -h[:32, :32])


# ---------------------------------------------------------------------------- views


def test_views_are_strided_numpy_views_of_the_storage():
    g = Graph()
    a = g.new_tensor(gt.F32, [4, 3, 2])
    p = g.permute(a, 0, 2, 1, 3)          # [4, 2, 3]
    t = g.transpose(g.reshape(a, [12, 2]))
    raw = np.arange(24, dtype=np.float32).view(np.uint8)
    base = tensor_view(raw, a, 0)
    pv = tensor_view(raw, p, p.view_offs)
    tv = tensor_view(raw, t, t.view_offs)
    assert np.shares_memory(pv, raw) and np.shares_memory(tv, raw)
    np.testing.assert_array_equal(pv[0], base[0].transpose(1, 0, 2))
    np.testing.assert_array_equal(tv[0, 0], base.reshape(2, 12).T)


def test_quantized_tensors_are_byte_rows():
    g = Graph()
    q = g.new_tensor(gt.GGMLType.Q8_0, [64, 5])
    v = tensor_view(np.zeros(q.nbytes, np.uint8), q, 0)
    # 64 values of Q8_0 = 2 blocks of 34 bytes
    assert v.shape == (1, 1, 5, 68) and v.dtype == np.uint8


# ---------------------------------------------------------------------------- running


def test_weights_are_memory_mapped_not_copied(llama):
    ex = Executor(llama, RunSettings(ctx_size=256, flash_attn="off"))
    w = ex.weights["blk.0.ffn_down.weight"]
    assert isinstance(w.base, np.memmap) or isinstance(w, np.memmap)
    assert not w.flags.owndata and not w.flags.writeable
    assert w.nbytes == ex.model.tensor("blk.0.ffn_down.weight").nbytes


@pytest.mark.warm_up
def test_kv_cache_persists_across_steps(llama):
    ex = Executor(llama, RunSettings(ctx_size=256, flash_attn="off"))
    r1 = ex.step([5, 6, 7])
    k = ex.kv["cache_k_l0"].view(np.float16).reshape(256, -1)
    v = ex.kv["cache_v_l0"].view(np.float16).reshape(-1, 256)      # transposed V: [dim, cell]
    assert (k[:3] != 0).any(axis=1).all() and not k[3:].any()
    assert v[:, :3].any() and not v[:, 3:].any()
    r2 = ex.step([8])
    assert (r1.past, r2.past, ex.past) == (0, 3, 4)
    assert (k[3] != 0).any() and not k[4:].any()
    assert np.isfinite(r2.logits).all() and r2.logits.shape == (1, ex.model.n_vocab)


@pytest.mark.warm_up
def test_plans_are_reused_for_the_same_shape(llama):
    ex = Executor(llama, RunSettings(ctx_size=256))
    ex.step([1, 2])
    p1 = ex.plan(1)
    ex.step([3])
    assert ex.plan(1) is p1
    assert ex.plan(2) is not p1


def test_same_tokens_same_logits_after_reset(llama):
    ex = Executor(llama, RunSettings(ctx_size=256))
    a = [ex.step([4, 5, 6]).logits, ex.step([7]).logits]
    ex.reset()
    b = [ex.step([4, 5, 6]).logits, ex.step([7]).logits]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_repeated_runs_of_a_step_are_idempotent(llama):
    ex = Executor(llama, RunSettings(ctx_size=256))
    r = ex.step([9, 10], repeat=3, warmup=True)
    assert len(r.timings) == 3 and r.warmup_ns is not None
    ex2 = Executor(llama, RunSettings(ctx_size=256))
    np.testing.assert_array_equal(ex2.step([9, 10]).logits, r.logits)


def test_a_step_times_its_nodes_only_when_asked(llama):
    from graphcost.execute.plan import FIXED, VIEW
    ex = Executor(llama, RunSettings(ctx_size=256))
    plain = ex.step([9, 10], repeat=2)
    ex.reset()
    timed = ex.step([9, 10], repeat=2, time_nodes=True, capture=["result_norm"])
    np.testing.assert_array_equal(plain.logits, timed.logits)
    assert [t.ns for t in plain.timings] == [None, None]
    assert all(t.wall_ns > 0 for t in plain.timings)
    kinds = [st.kind for st in ex.plan(2).steps]
    for t in timed.timings:
        # a time for every node that computes, none for views; the nodes ran in the wall
        assert [n is None for n in t.ns] == [k in (FIXED, VIEW) for k in kinds]
        assert all(n > 0 for n in t.ns if n is not None)
        assert sum(n for n in t.ns if n is not None) <= t.wall_ns
    assert set(timed.captured) == {next(i for i, n in enumerate(timed.graph.nodes)
                                        if n.name == "result_norm")}


def test_a_checkpoint_puts_the_sequence_back(gemma3):
    # gemma3: a sliding-window cache beside the full one, both cells put back
    once = Executor(gemma3, RunSettings(ctx_size=256))
    twice = Executor(gemma3, RunSettings(ctx_size=256))
    a = [once.step([4, 5, 6]), once.step([7]), once.step([8])]
    b = [twice.step([4, 5, 6])]
    back = twice.checkpoint()
    twice.step([9])                   # another token: other rows, cells, past
    back()
    b += [twice.step([7]), twice.step([8])]
    for x, y in zip(a, b):
        assert x.past == y.past
        np.testing.assert_array_equal(x.logits, y.logits)
    assert twice.past == 5 and set(twice.cells) == set(once.cells)
    for k in once.cells:
        np.testing.assert_array_equal(once.cells[k].pos, twice.cells[k].pos)


def test_small_nodes_are_preallocated_bound_and_return_copies(llama):
    from graphcost.execute.plan import BOUND, COMPUTE
    ex = Executor(llama, RunSettings(ctx_size=256))
    ex.step([1, 2, 3])
    a = ex.step([4])
    plan = ex.plan(1)
    bound = [st for st in plan.steps if st.kind == BOUND]
    assert len(bound) > len(plan.steps) // 4
    for st in bound:
        out = getattr(st.fn, "out", None)
        assert out is None or plan.fixed[st.slot] is out      # one array for every run
    logits = a.logits.copy()
    b = ex.step([5])                  # the same plan rewrites the same output arrays
    np.testing.assert_array_equal(a.logits, logits)           # returned logits are copies
    # every node called through its function (no bound calls): the same bits
    ex2 = Executor(llama, RunSettings(ctx_size=256))
    ex2.step([1, 2, 3])
    ex2.step([4])
    ex2.plan(1).grouped = None        # no grouped matvecs either
    for st in ex2.plan(1).steps:
        if st.kind == BOUND:
            st.kind, st.call = COMPUTE, None
    np.testing.assert_array_equal(ex2.step([5]).logits, b.logits)


@pytest.mark.warm_up
def test_decode_matvecs_of_one_input_run_as_one_group(tmp_path):
    # Q8_0 Q (256 x 256: 256 * 272 = 69632 bytes, over SERIAL_BELOW's 65536), Q5_0 K and
    # Q8_0 V (64 rows: serial alone) of attn_norm's output; the fixture's Q4_0 gate and
    # Q8_0 up (768 rows each) of ffn_norm's. An untimed run computes each set in one call
    # at the first one's place, a node-timed run each alone: the same bits
    from graphcost.execute.plan import BOUND, FIXED
    llama = F.write_llama(tmp_path / "qkv.gguf", n_layer=2, weight_types={
        "attn_q": QT.Q8_0, "attn_k": QT.Q5_0, "attn_v": QT.Q8_0})
    ex = Executor(llama, RunSettings(ctx_size=256))
    ex.step([1, 2, 3])
    back = ex.checkpoint()
    a = ex.step([4], capture=["Vcur-1"])
    back()
    b = ex.step([4], time_nodes=True, capture=["Vcur-1"])
    np.testing.assert_array_equal(a.logits, b.logits)
    assert a.captured.keys() == b.captured.keys() and a.captured    # Vcur-1 and its views
    for i in a.captured:
        np.testing.assert_array_equal(a.captured[i], b.captured[i])
    plan = ex.plan(1)
    moved = [(st.node.name, g.kind) for st, g in zip(plan.steps, plan.grouped) if st is not g]
    assert [n for n, kind in moved if kind == BOUND] == ["Qcur-0", "ffn_gate-0", "Qcur-1",
                                                         "ffn_gate-1"]
    assert sorted(n for n, kind in moved if kind == FIXED) == sorted(
        f"{n}-{il}" for il in range(2) for n in ("Kcur", "Vcur", "ffn_up"))
    # the K and V projections' nodes stay where llama.cpp has them (after the Q rope),
    # their values made at Q's place
    names = [st.node.name for st in plan.steps]
    assert names.index("Qcur-0") + 1 < min(names.index("Kcur-0"), names.index("Vcur-0"))


def test_a_write_into_the_input_ends_a_group():
    from types import SimpleNamespace
    from graphcost.execute.plan import BOUND, COMPUTE, FIXED, Step, group_matvecs
    # three matvecs of slot 1 and a node writing into slot 1's memory between the 2nd
    # and 3rd: the first two are grouped, the third stays alone (a group of one)
    def group(*args):
        pass
    K = SimpleNamespace(matmul=SimpleNamespace(
        _matvec_ggml_fused="par", _matvec_ggml_fused_serial="ser", SERIAL_BELOW=0,
        group_matvecs=lambda members, shares: (group, members)))
    w = np.zeros((4, 8), dtype=np.uint8)

    def mv(i, kern="par"):
        call = SimpleNamespace(args=(w, 0, "x", 0, True, None, None, None))
        return Step(i, None, SimpleNamespace(kern=kern), (0, 1), 10 + i, 10 + i, 0, (), (),
                    None, BOUND, call)
    write = Step(2, None, SimpleNamespace(kern="add"), (1,), 20, 1, 0, (), (), None, COMPUTE)
    steps = [mv(0), mv(1), write, mv(3)]
    out = group_matvecs(steps, K, np.ones(1, dtype=np.int64))
    assert [s.kind for s in out] == [BOUND, FIXED, COMPUTE, BOUND]
    assert out[0].call.func is group and out[3] is steps[3]
    # without the write all three are one group
    out = group_matvecs([mv(0), mv(1), mv(3)], K, np.ones(1, dtype=np.int64))
    assert [s.kind for s in out] == [BOUND, FIXED, FIXED]
    assert len(out[0].call.args) == 3               # the three members


def test_captured_values_are_copies_by_node_name(llama):
    ex = Executor(llama, RunSettings(ctx_size=256))
    r = ex.step([1, 2, 3], capture=["attn_norm-0", "result_output"])
    names = {r.graph.nodes[i].name for i in r.captured}
    assert names == {"attn_norm-0", "result_output"}
    out = r.captured[len(r.graph.nodes) - 1]
    np.testing.assert_array_equal(out.reshape(-1), r.logits.reshape(-1))


@pytest.mark.warm_up
def test_fast_and_ggml_numerics_agree_to_activation_rounding(llama):
    ids = [11, 12, 13, 14]
    a = Executor(llama, RunSettings(ctx_size=256), numerics="ggml").step(ids).logits
    b = Executor(llama, RunSettings(ctx_size=256), numerics="fast").step(ids).logits
    # Q8 activations round to ~0.4% per value; the logits of this 2-layer model stay within 5%
    assert np.abs(a - b).max() <= 0.05 * np.abs(a).max()
    assert not np.array_equal(a, b)


@pytest.mark.warm_up
def test_sliding_window_model_runs_past_its_window(gemma3):
    # window 64, ubatch 64: the SWA cache has pad(64 + 64, 256) = 256 cells and is reused
    # from position 256 on
    ex = Executor(gemma3, RunSettings(ctx_size=512, ubatch_size=64))
    ex.step(list(range(3, 63)))
    for t in range(200):
        r = ex.step([3 + t % 200])
    assert ex.past == 260 and np.isfinite(r.logits).all()
    swa = ex.cells["swa"]
    assert swa.size == 256 and swa.used <= 256 and swa.pos.max() == 259
    assert ex.cells["base"].pos.max() == 259 and ex.cells["base"].size == 512


def test_header_only_file_runs_on_random_weights(llama, tmp_path):
    header_only = tmp_path / "header_only.gguf"
    data = llama.path.read_bytes()
    header_only.write_bytes(data[:read_header(llama.path).data_offset])
    ex = Executor(header_only, RunSettings(ctx_size=256))
    assert not ex.model.header.has_data
    assert any("random" in n for n in ex.notes)
    r = ex.step([1, 2, 3])
    assert np.isfinite(r.logits).all()
    for name, w in ex.weights.items():
        assert w.nbytes == ex.model.tensor(name).nbytes


@pytest.mark.parametrize("t", [t for t in gt.GGMLType if gt.f16_scale_offsets(t)],
                         ids=lambda t: t.name)
def test_random_block_weights_put_small_scales_where_ggml_keeps_them(t):
    # random bytes with F16 scales written at gt.f16_scale_offsets: decoded by gguf-py,
    # finite and around 0.02 (a wrong offset leaves random F16 scales: inf, NaN, 1e4...)
    from gguf import quants as gq
    from graphcost.execute.weights import random_raw
    blk = gt.block(t)[0]
    raw = random_raw(t, (blk * 64, 1), np.random.default_rng(0))
    x = gq.dequantize(raw.reshape(1, -1), t)
    assert np.isfinite(x).all() and 1e-3 < float(np.abs(x).mean()) < 0.2


def test_mapped_weights_cover_every_tensor(llama):
    ex = Executor(llama, RunSettings(ctx_size=256))
    w = mapped_weights(ex.model)
    assert set(w) == set(ex.model.tensors)
    t = ex.model.tensor("output_norm.weight")
    # F32 norm weights are around 1 (fixtures.write_llama: 1 + 0.05 N(0, 1))
    assert abs(float(w[t.name].view(np.float32).mean()) - 1) < 0.1


def test_bad_input_is_one_line_errors(llama):
    ex = Executor(llama, RunSettings(ctx_size=256))
    with pytest.raises(SettingsError, match="token ids"):
        ex.step([llama.n_vocab])
    with pytest.raises(SettingsError, match="at least one token"):
        ex.step([])
    with pytest.raises(GraphcostError, match="numerics"):
        Executor(llama, RunSettings(), numerics="exact")
    with pytest.raises(UnsupportedError, match="head graph"):
        Executor(llama, RunSettings(llama_cpp="2024-08"))


def test_every_op_of_the_supported_graphs_has_an_implementation(llama, gemma3):
    for path, fa in ((llama, "on"), (llama, "off"), (gemma3, "on"), (gemma3, "off")):
        ex = Executor(path, RunSettings(ctx_size=256, flash_attn=fa))
        assert unsupported_ops(ex.plan(3).graph.nodes) == []
    assert {"MUL_MAT", "FLASH_ATTN_EXT", "SET_ROWS", "ROPE", "SOFT_MAX", "GEGLU"} <= set(OPS)
