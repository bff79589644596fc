"""Cost model: exact numbers with the arithmetic beside them, and relational checks."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import fixtures as F
from graphcost.cost import costs
from graphcost.graph.build import load_model
from graphcost.graph.ggml_graph import Graph
from graphcost.graph.ops import VIEWS, Op
from costing import node, run

# llama fixture: n_embd 256, 8 heads of 32, 2 KV heads, n_ff 768, 3 layers, vocab 300
TYPES = {"attn_q": QT.Q4_0, "attn_k": QT.Q8_0, "attn_v": QT.F16, "attn_output": QT.Q4_K,
         "ffn_gate": QT.Q8_0, "ffn_up": QT.Q8_0, "ffn_down": QT.Q4_K, "output": QT.Q8_0,
         "token_embd": QT.F16}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = F.write_llama(tmp_path_factory.mktemp("costs") / "llama.gguf", weight_types=TYPES)
    return load_model(path)


def test_quantized_matmul_counts_conversion_and_block_scales(model):
    a = run(model, tokens=1)
    c = node(a, "Qcur-0", "MUL_MAT").cost
    # W: Q4_0 [256, 256] x x: F32 [256, 1] -> [256, 1]
    macs = 256 * 256 * 1                      # 65,536 multiply-adds
    blocks = macs // 32                       # Q4_0 x Q8_0 block pairs: 2,048
    assert c.ops["mul"] == macs + 2 * blocks + 256   # + d_a*d_b*sum + quantize x (1 mul/value)
    assert c.ops["add"] == macs + blocks
    assert c.ops["max"] == 256 and c.ops["div"] == 256 // 32 and c.ops["cvt"] == 256
    assert c.read == {"weights": 256 * 256 // 32 * 18, "act": 256 * 4}   # 36,864 B + 1,024 B
    assert c.work == 256 // 32 * 34          # x as Q8_0: 8 blocks of 34 B = 272 B
    assert c.write == 256 * 4
    assert c.flops == c.ops["mul"] + c.ops["add"] + c.ops["max"] + c.ops["div"]


def test_f16_weights_convert_activations_to_f16(model):
    c = node(run(model, tokens=3), "Vcur-0", "MUL_MAT").cost
    # W: F16 [256, 64] x x: F32 [256, 3]: 64*3*256 = 49,152 MACs, x converted to F16
    assert c.ops == {"mul": 49152, "add": 49152, "cvt": 256 * 3}
    assert c.work == 256 * 3 * 2
    assert c.read["weights"] == 256 * 64 * 2


def test_rms_norm_exact(model):
    c = node(run(model, tokens=2), "norm-0", "RMS_NORM").cost
    # per row of 256: 2*256 mul, 256+1 add, 2 div, 1 sqrt; 2 rows
    assert c.ops == {"mul": 1024, "add": 514, "div": 4, "sqrt": 2}
    assert c.read == {"act": 256 * 2 * 4} and c.write == 256 * 2 * 4


def test_attention_reads_n_kv_cells_of_the_cache(model):
    a = run(model, tokens=1, past=3)
    kq = node(a, "kq-0").cost
    # K view: 256 cells (n_kv) x 2 KV heads x 32 dims x 2 B (f16) = 32,768 B
    assert kq.read["kv"] == 256 * 2 * 32 * 2
    # q [32, 1, 8] -> F16 for the dot products; 256 x 1 x 8 outputs of 32 MACs
    assert kq.ops == {"mul": 256 * 8 * 32, "add": 256 * 8 * 32, "cvt": 32 * 8}
    st = node(a, "cache_k_l0 (view)", "SET_ROWS").cost
    assert st.write == 64 * 2 and st.ops == {"cvt": 64}  # one row of 2x32 f16


def test_decode_kv_traffic_grows_with_context_in_256_cell_steps(model):
    kv = [run(model, tokens=1, past=p).total.read["kv"] for p in (0, 255, 256, 300)]
    # n_kv = 256, 256, 512, 512 cells; K and V, 3 layers, 64 values of 2 B per cell
    assert kv == [256 * 3 * 2 * 64 * 2] * 2 + [512 * 3 * 2 * 64 * 2] * 2


def test_flash_attention_does_not_materialise_scores(model):
    off = run(model, tokens=8, flash_attn="off")
    on = run(model, tokens=8, flash_attn="on")
    assert "SOFT_MAX" in off.by_op and "SOFT_MAX" not in on.by_op
    assert "FLASH_ATTN_EXT" in on.by_op
    # FA off, per layer: kq writes scores [n_kv=256, T=8, H=8] F32, soft_max writes them
    # again, kqv writes [32, 8, 8] F32; FA on writes only its [32, 8, 8] F32 result
    scores, kqv = 256 * 8 * 8 * 4, 32 * 8 * 8 * 4
    assert off.by_op["MUL_MAT"].write - on.by_op["MUL_MAT"].write == 3 * (scores + kqv)
    assert off.by_op["SOFT_MAX"].write == 3 * scores
    assert on.by_op["FLASH_ATTN_EXT"].write == 3 * kqv


def test_rollups_add_up_to_totals(model):
    a = run(model, tokens=5, past=20)
    for groups in (a.by_op, a.by_layer, a.by_block):
        s = sum(groups.values(), start=costs_zero())
        assert s == a.total


def costs_zero():
    from graphcost.cost.analysis import ZERO
    return ZERO


def test_views_cost_nothing(model):
    a = run(model, tokens=4)
    views = [nc for nc in a.nodes if nc.node.op in VIEWS]
    assert views, "the llama graph has views"
    for nc in views:
        assert nc.cost.bytes_read == 0 and nc.cost.bytes_written == 0 and nc.cost.flops == 0


def test_graph_inputs_count_once(model):
    a = run(model, tokens=4)
    # inp_pos (I32 [4]) is read by 6 ROPE nodes but counted once: 16 B
    rope_inputs = [nc.cost.read.get("inputs", 0) for nc in a.nodes if nc.node.op == "ROPE"]
    assert sorted(rope_inputs) == [0] * 5 + [4 * 4]


def test_unknown_op_is_unmodelled_not_zero(model, monkeypatch):
    monkeypatch.delitem(costs.COSTS, Op.GEGLU, raising=False)
    monkeypatch.delitem(costs.COSTS, Op.SWIGLU)
    a = run(model, tokens=1)
    assert [nc.node.name for nc in a.unmodelled] == ["ffn_swiglu-0", "ffn_swiglu-1", "ffn_swiglu-2"]
    assert all(nc.cost is None for nc in a.unmodelled)
    assert "SWIGLU" not in a.by_op
    assert {nc.why for nc in a.unmodelled} == {"no cost function for SWIGLU"}


def test_unsupported_weight_type_is_an_explicit_unmodelled_value():
    # F64 weights have no CPU vec_dot_type: MUL_MAT says so instead of raising
    g = Graph()
    w = g.new_tensor(QT.F64, [8, 4], role="weight")
    x = g.new_tensor(QT.F32, [8, 2])
    assert costs.op_cost(g.mul_mat(w, x)) == costs.Unmodelled("MUL_MAT with f64 weights")
    assert costs.op_cost(g.new_tensor(QT.F32, [8])) == costs.Unmodelled("no cost function for NONE")


def test_a_bug_in_a_cost_function_is_not_reported_as_unmodelled(model, monkeypatch):
    def broken(t):
        return {}["scale"]   # a bug: KeyError inside a cost function
    monkeypatch.setitem(costs.COSTS, Op.RMS_NORM, broken)
    with pytest.raises(KeyError, match="scale"):
        run(model, tokens=1)


def test_weights_read_once_per_use(model):
    a = run(model, tokens=1)
    # every weight matrix is read once by its matmul; token_embd only for 1 row (F16 256)
    w = a.total.read["weights"]
    m = a.graph.model
    matrices = sum(t.nbytes for n, t in m.tensors.items()
                   if len(t.ne) == 2 and n != "token_embd.weight")
    norms = sum(t.nbytes for n, t in m.tensors.items() if len(t.ne) == 1)
    assert w == matrices + norms + 256 * 2
