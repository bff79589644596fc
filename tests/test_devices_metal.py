"""Metal devices without an Apple GPU: the backend facts of specs/backends/metal.yaml (each
cited from ggml-metal) applied to compute buffers, with the numbers worked out by hand from
the ggml rules: which ops Metal runs (ggml_metal_device_supports_op), the scratch its buffer
type adds to a compute tensor (ggml_backend_metal_buffer_type_get_alloc_size), the
allocation dependencies of its fusion table (ggml_metal_fusion_add_alloc_deps) and the
node reorder of ggml_graph_optimize (ggml-metal-common.cpp), which the allocator sees."""
from __future__ import annotations

import json

import pytest

from fixtures import write_llama
from fixtures_moe import write_qwen3moe
from graphcost.format import ggml_types as gt
from graphcost.graph.build import build_graph, load_model, resolve_for
from graphcost.graph.settings import RunSettings
from graphcost.memory.alloc_deps import SplitGraph, collect, metal_fusions, use_counts
from graphcost.memory.backends import load
from graphcost.memory.metal_fusion import fusion_max
from graphcost.memory.op_rules import compute_alloc_size, evaluate
from graphcost.memory.placement import PlacementFlags, parse_device, plan_devices
from graphcost.memory.reorder import MemRanges, metal_graph_optimize
from test_devices_cuda import tensor

AVX2 = frozenset({"avx2"})
T = gt.GGMLType
#: the fixture models, by name: writer and arguments (tests/fixtures.py, fixtures_moe.py)
MODELS = {
    # 5 or 2 layers, n_embd 256, n_ff 768, 8 heads of 32, 2 KV heads, vocab 300
    "llama5": (write_llama, dict(n_layer=5)),
    "llama2": (write_llama, dict(n_layer=2)),
    # 2 layers, n_embd 320, 5 heads of 64 over 1 KV head, 4 experts of width 96, 2 used
    "qwen3moe": (write_qwen3moe, dict(n_layer=2)),
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """model(name): a fixture model of :data:`MODELS`, written and loaded on first use."""
    d, loaded = tmp_path_factory.mktemp("mtl"), {}

    def get(name):
        if name not in loaded:
            writer, kw = MODELS[name]
            loaded[name] = load_model(writer(d / f"{name}.gguf", **kw).path)
        return loaded[name]
    return get


def _metal(node, **opts) -> bool:
    """ggml_metal_device_supports_op: the require rule (BF16 needs bfloat), then the op's."""
    rules = load("metal").supports_op
    return (evaluate(rules["require"], node, opts, "test")
            and evaluate(rules["ops"].get(str(node.op), rules["default"]), node, opts, "test"))


# ---- supports_op ---------------------------------------------------------------------------

@pytest.mark.parametrize("w,b,tokens,opts,ok", [
    (T.Q4_0, T.F32, 7, {}, True),
    (T.F16, T.F16, 7, {}, True),       # F16 x F16: the mat-vec kernel (src0_f16_has_mv)
    (T.Q4_0, T.F16, 7, {}, False),     # F16 src1 needs the mat-mat path: ne11 > 8
    (T.Q4_0, T.F16, 9, {}, True),      # 9 > 8, ne00 256 >= 64, simdgroup_mm
    (T.Q4_0, T.F16, 9, {"simdgroup_mm": "0"}, False),
    (T.Q4_0, T.F32, 7, {"simdgroup_reduction": "0"}, False),
    (T.TQ1_0, T.F32, 7, {}, False),    # no TQ1_0 kernels
], ids=["q4_0", "f16-f16", "q4_0-f16-7", "q4_0-f16-9", "no-simdgroup-mm", "no-reduction", "tq1_0"])
def test_metal_mul_mat_rule(w, b, tokens, opts, ok):
    node = tensor(T.F32, (64, tokens), "MUL_MAT", [tensor(w, (256, 64)), tensor(b, (256, tokens))])
    assert _metal(node, **opts) is ok


def test_metal_rules_bf16_unary_and_unlisted_ops():
    ids = tensor(T.I32, (3,))
    bf16_rows = tensor(T.F32, (64, 3), "GET_ROWS", [tensor(T.BF16, (64, 10)), ids])
    assert _metal(bf16_rows)                     # has_bfloat (Apple6+/Metal3)
    assert not _metal(bf16_rows, bfloat="0")     # the check before the switch
    # unary ops: F32/F16 with contiguous rows; a transposed view is not
    v = tensor(T.F32, (8, 16))
    v.nb = (v.nb[1], v.nb[0], v.nb[2], v.nb[3])
    assert _metal(tensor(T.F32, (16, 8), "GELU_ERF", [tensor(T.F32, (16, 8))]))
    assert not _metal(tensor(T.F32, (8, 16), "SILU", [v]))
    # norms and softmax need simdgroup reduction
    x = tensor(T.F32, (256, 4))
    assert _metal(tensor(T.F32, (256, 4), "RMS_NORM", [x]))
    assert not _metal(tensor(T.F32, (256, 4), "RMS_NORM", [x]), simdgroup_reduction="0")
    # a quantized cache Metal cannot write: Q4_K (SET_ROWS takes F32 to F16/Q8_0/Q4_0/...)
    idx = tensor(T.I64, (4,))
    assert _metal(tensor(T.Q8_0, (256, 4), "SET_ROWS", [x, idx]))
    assert not _metal(tensor(T.Q4_K, (256, 4), "SET_ROWS", [x, idx]))
    # not in the switch: default false
    assert not _metal(tensor(T.F32, (4,), "WIN_PART", [x]))
    # an F32 Hadamard matrix by an F16 [64, 7]: the FWHT kernels take it when the product
    # carries llama_mul_mat_hadamard's hint (a row of 64, result of src1's shape); without
    # the hint the mat-mat path would be needed, and 7 tokens are not > 8
    def rot(**hint):
        return tensor(T.F32, (64, 7), "MUL_MAT", [tensor(T.F32, (64, 64)), tensor(T.F16, (64, 7))],
                      **hint)
    assert _metal(rot(hint="src0_is_hadamard")) and not _metal(rot())
    assert not _metal(rot(hint="src0_is_hadamard"), simdgroup_reduction="0")


def _fa(q_tokens, kt, vt, d=128, n_kv=512, heads=8, kv_heads=2, dv=None):
    q = tensor(T.F32, (d, q_tokens, heads))
    k = tensor(kt, (d, n_kv, kv_heads))
    v = tensor(vt, (dv or d, n_kv, kv_heads))
    mask = tensor(T.F16, (n_kv, q_tokens))
    return tensor(T.F32, (dv or d, heads, q_tokens), "FLASH_ATTN_EXT", [q, k, v, mask], max_bias=0.0)


def test_metal_flash_attention_cases():
    assert _metal(_fa(7, T.F16, T.F16, d=32))          # a head size CUDA has no kernel for
    assert not _metal(_fa(7, T.F16, T.F16, d=24))      # not in the list
    assert _metal(_fa(7, T.Q4_1, T.Q4_1))              # F32/F16/Q8_0/Q4_0/Q4_1/Q5_0/Q5_1
    assert not _metal(_fa(7, T.Q4_K, T.Q4_K))
    assert not _metal(_fa(7, T.F16, T.Q8_0))           # K and V of one type
    assert _metal(_fa(7, T.F16, T.F16, d=192, dv=128))  # DK >= DV
    assert not _metal(_fa(7, T.F16, T.F16, d=72, dv=64))  # 72 only with DV 72
    assert not _metal(_fa(7, T.F16, T.F16), simdgroup_mm="0")  # every kernel needs it


def test_unsupported_op_goes_to_the_cpu(model):
    """An op Metal refuses runs on the CPU: without simdgroup matrix multiply (device option
    simdgroup_mm=0) Metal has no flash attention, so with -fa on each layer's FLASH_ATTN_EXT
    is scheduled on the CPU; with -fa auto llama.cpp's probe sees that and turns flash
    attention off. On an Apple7+ GPU (the default) head size 32 has a kernel: -fa auto stays
    on, unlike CUDA (tests/test_devices_cuda.py)."""
    llama5 = model("llama5")
    flags = PlacementFlags(cpu_features=AVX2)
    on = plan_devices(llama5, RunSettings(ctx_size=512, flash_attn="on"),
                      [parse_device("metal,simdgroup_mm=0")], flags)
    fa = {(lab, sc.device_of(i)) for lab, sc in on.compute.schedules
          for i, n in enumerate(sc.nodes) if n.op == "FLASH_ATTN_EXT"}
    assert {dev for _, dev in fa} == {"CPU"} and {lab for lab, _ in fa} == {"prompt", "generation"}
    auto = plan_devices(llama5, RunSettings(ctx_size=512), [parse_device("metal,simdgroup_mm=0")], flags)
    assert any("turns flash attention off" in n for n in auto.placement.notes)
    default = plan_devices(llama5, RunSettings(ctx_size=512), [parse_device("metal")], flags)
    assert not any("flash attention" in n for n in default.placement.notes)
    assert all(sc.device_of(i) == "MTL0" for _, sc in default.compute.schedules
               for i, n in enumerate(sc.nodes) if n.op == "FLASH_ATTN_EXT")


# ---- get_alloc_size ------------------------------------------------------------------------

def test_metal_flash_attention_alloc_size_by_hand():
    """ggml_backend_metal_buffer_type_get_alloc_size for FLASH_ATTN_EXT: the result, then
    the scratch always reserved (ggml-metal-ops.cpp _extra_pad/_blk/_tmp/_kv_f16/_idx).
    Q F32 [128, tokens, 8], K and V [128, 512 cells, 2 heads], mask F16 [512, tokens]."""
    rule = load("metal").compute_alloc_size
    # 512-token prompt, F16 cache (rows of 128 halves: nb1 = 256):
    #   result F32 [128, 8, 512]          = 128*8*512*4            = 2,097,152
    #   pad: 64 cells x (256*2 (K) + 256*2 (V) + 2*512 (mask rows))= 64*2048 = 131,072
    #   blk: 8-query x 64-cell blocks: (512/8)*(512/64) = 512 bytes, padded to 32 = 512
    #   tmp: min(512, 32)*8 heads*32 workgroups*(128 + 2)*4        = 4,259,840
    #   kv_f16: K and V as F16: 2 x 128*512*2*2                    = 524,288
    assert compute_alloc_size(rule, _fa(512, T.F16, T.F16), {}) == \
        2097152 + 131072 + 512 + 4259840 + 524288 == 7012864
    # one token: the vec kernel's blocks (1 query x 32 cells, below 20 tokens):
    #   result 4,096; pad 64*(512 + 512 + 2*1) = 65,664; blk 1*16 = 16 -> 32;
    #   tmp 1*8*32*130*4 = 133,120; kv_f16 524,288
    assert compute_alloc_size(rule, _fa(1, T.F16, T.F16), {}) == \
        4096 + 65664 + 32 + 133120 + 524288 == 727200
    # q8_0 cache, 8 tokens (below 32: not dequantized, so pad uses q8_0 rows: 4 blocks of
    # 34 bytes = 136): result 32,768; pad 64*(136*2 + 136*2 + 2*8) = 35,840; blk 8*16 = 128;
    # tmp 8*8*32*130*4 = 1,064,960; kv_f16 still reserved: 524,288
    assert compute_alloc_size(rule, _fa(8, T.Q8_0, T.Q8_0), {}) == \
        32768 + 35840 + 128 + 1064960 + 524288 == 1657984
    # 512 tokens of q8_0: dequantized to F16 (use_kv_f16), so pad uses F16 rows: as F16
    assert compute_alloc_size(rule, _fa(512, T.Q8_0, T.Q8_0), {}) == 7012864


def test_metal_scratch_of_other_ops_by_hand():
    rule = load("metal").compute_alloc_size
    # MUL_MAT_ID: experts Q4_K [256, 96, 4 experts], b [256, 2, 7], ids I32 [2 used, 7 tokens]:
    # result F32 [96, 2, 7] = 5,376; + tpe 4*4 = 16 + ids 4*4*7 = 112 + amax 8 + 4*256 = 1,032
    mm_id = tensor(T.F32, (96, 2, 7), "MUL_MAT_ID", [tensor(T.Q4_K, (256, 96, 4)),
                                                     tensor(T.F32, (256, 2, 7)), tensor(T.I32, (2, 7))])
    assert compute_alloc_size(rule, mm_id, {}) == 5376 + 16 + 112 + 1032 == 6536
    # ARGSORT I32 [4, 7]: 112 bytes, doubled
    logits = tensor(T.F32, (4, 7))
    assert compute_alloc_size(rule, tensor(T.I32, (4, 7), "ARGSORT", [logits]), {}) == 224
    # TOP_K: 2 x 4 bytes per element of the source, whatever the result: 2*4*28 = 224
    assert compute_alloc_size(rule, tensor(T.I32, (2, 7), "TOP_K", [logits]), {}) == 224
    assert compute_alloc_size(rule, tensor(T.F32, (4, 7), "SOFT_MAX", [logits]), {}) == 112


# ---- graph_optimize: fusion allocation dependencies and the reorder ------------------------

def test_metal_fusion_alloc_deps(model):
    """ggml_metal_fusion_add_alloc_deps on qwen3moe's graph (7 tokens): each raw op run of
    the fusion table keeps its external sources until its last node: RMS_NORM + MUL (the
    attention, Q, K and FFN norms: input and weight), the top-k routing with its norm
    (SOFT_MAX .. RESHAPE, 10 nodes: only the logits are external) and the weighted sum
    (MUL, 2 VIEWs, ADD: the experts' output and the routing weights)."""
    qwen3moe = model("qwen3moe")
    run = resolve_for(qwen3moe, RunSettings(ctx_size=512))
    bg = build_graph(qwen3moe, run.step(7, 0, 7))
    g = SplitGraph(bg.nodes, None, use_counts(bg.nodes), set(), set())
    name = {id(n): n.name for n in bg.nodes}
    deps = {name[k]: [t.name for t in v] for k, v in collect(metal_fusions(g, {})).items()}
    assert deps["attn_norm-0"] == ["embd", "blk.0.attn_norm.weight"]
    assert deps["Qcur_normed-0"] == ["Qcur-0", "blk.0.attn_q_norm.weight"]
    assert deps["ffn_moe_weights_norm-0 (reshaped)"] == ["ffn_moe_logits-0"]
    assert deps["ffn_moe_out-0"] == ["ffn_moe_down-0", "ffn_moe_weights_norm-0 (reshaped)"]
    assert deps["result_norm"] == ["l_out-1", "output_norm.weight"]
    assert len(deps) == 2 * 6 + 1  # 6 per layer, and the output norm


def _split(nodes, weights=()):
    return SplitGraph(nodes, None, use_counts(nodes), set(), {id(w) for w in weights})


def test_metal_reorder_worked_example():
    """ggml_graph_optimize on a hand-made split: a = RMS_NORM(x), b = a * wn (one packed
    unit: the NORM_MUL fusion), c = w1 @ b, d = SCALE(c), e = w2 @ b.
    i0=0: [a, b] starts the concurrent set. i0=1: c reads b (written in the set): look
    ahead: d reads c (written by c, which it would jump): no; e reads b (written in the
    set): no; the set closes, c starts the next. i0=2: d reads c: look ahead: e reads only b
    and w2, neither written in the set {c} nor by d: e moves before d. Order: a b c e d."""
    x = tensor(T.F32, (64, 4))
    wn = tensor(T.F32, (64,))
    w1, w2 = tensor(T.F32, (64, 64)), tensor(T.F32, (64, 64))
    a = tensor(T.F32, (64, 4), "RMS_NORM", [x], eps=1e-6)
    b = tensor(T.F32, (64, 4), "MUL", [a, wn])
    c = tensor(T.F32, (64, 4), "MUL_MAT", [w1, b])
    d = tensor(T.F32, (64, 4), "SCALE", [c], scale=0.5)
    e = tensor(T.F32, (64, 4), "MUL_MAT", [w2, b])
    g = _split([a, b, c, d, e], (wn, w1, w2))
    assert fusion_max(g, 0) == 2 and fusion_max(g, 2) == 1

    def order(nodes, **opts):
        return [n for n in metal_graph_optimize(_split(nodes, (wn, w1, w2)), lambda t: None, opts)]
    assert order([a, b, c, d, e]) == [a, b, c, e, d]
    assert order([a, b, c, d, e], graph_optimize="0") == [a, b, c, d, e]
    # SOFT_MAX is not an op nodes are moved across: with s = SOFT_MAX(d) before e, the
    # look-aheads from c and from d stop at s, so e cannot jump d; from s (which reads d,
    # written in the set {d}) the look-ahead finds e free: a b c d e s
    s = tensor(T.F32, (64, 4), "SOFT_MAX", [d], scale=1.0, max_bias=0.0)
    assert order([a, b, c, d, s, e]) == [a, b, c, d, e, s]


def test_metal_memory_ranges_that_touch():
    """ggml_mem_ranges_check on tensors with memory (a KV buffer: K at [0, 64), V at
    [64, 128)): overlap is p0 < other.p1 and p1 >= other.p0, so a range that ends where
    a written one begins conflicts, and one that begins where a written one ends does not."""
    k, v = tensor(T.F16, (32,)), tensor(T.F16, (32,))
    where = {id(k): ("kv", 0, 64), id(v): ("kv", 64, 128)}
    written_k = MemRanges(lambda t: where.get(id(t)))
    written_k.add(k, True)
    assert written_k.check(v, False)
    written_v = MemRanges(lambda t: where.get(id(t)))
    written_v.add(v, True)
    assert not written_v.check(k, False)
    # tensors without memory meet only themselves and their views
    x, y = tensor(T.F32, (8,)), tensor(T.F32, (8,))
    written_x = MemRanges(lambda t: None)
    written_x.add(x, True)
    assert written_x.check(y, True) and not written_x.check(x, False)


def test_cache_addresses_the_reorder_sees(model):
    """ggml_mem_range_from_tensor reads the KV cache's real place: one MTL0 buffer per cache,
    per layer K then V (llama_kv_cache constructor), each F16 [64, 512 cells] = 64*512*2 =
    65,536 bytes, a multiple of 32: K0 [0, 65536), V0 [65536, 131072), K1 [131072, ...).
    Under llama.cpp's fit (no_alloc) the caches have a buffer but no data: every tensor at 0."""
    from graphcost.memory.placement import place
    from graphcost.memory.sched import _cache_addresses
    llama2 = model("llama2")
    run = resolve_for(llama2, RunSettings(ctx_size=512))
    bg = build_graph(llama2, run.step(7, 0, 7))
    flags = PlacementFlags(cpu_features=frozenset())
    p = place(llama2, [parse_device("metal")], flags)
    c = bg.caches[0]
    at = _cache_addresses(bg, p, flags, no_alloc=False)
    assert [at[id(t)] for t in (c.k[0], c.v[0], c.k[1], c.v[1])] == [
        (("base", "MTL0"), 0, 65536), (("base", "MTL0"), 65536, 131072),
        (("base", "MTL0"), 131072, 196608), (("base", "MTL0"), 196608, 262144)]
    at = _cache_addresses(bg, p, flags, no_alloc=True)
    assert {at[id(t)] for t in (c.k[0], c.v[0], c.k[1], c.v[1])} == {(("base", "MTL0"), 0, 65536)}


def test_metal_compute_buffer_with_and_without_the_reorder(model):
    """MTL0's compute buffer for a 2-layer llama (-ngl all, 512-token prompt, -fa off) is set
    by the prompt graph's kq-0, F32 [512 cells, 512 tokens, 8 heads] = 512*512*8*4 =
    8,388,608 bytes. In the built order Qcur-0's RoPE runs while attn_norm-0 is still read
    by Vcur-0 and Kcur-0, so it takes a new block after Qcur-0's (2,891,776, 524,288 bytes:
    F32 [32, 8, 512]) that is still live at kq-0: kq-0 goes at 2,891,776 + 524,288 =
    3,416,064 and the buffer is 3,416,064 + 8,388,608 = 11,804,672. ggml_graph_optimize runs
    the Q, V and K products first (they only read attn_norm-0), so the RoPE lands in
    attn_norm-0's freed block (1,843,200) and kq-0 from Qcur-0's freed block on:
    2,367,488 + 8,388,608 = 10,756,096, 1,048,576 bytes (two 524,288 blocks) less."""
    llama2 = model("llama2")
    s = RunSettings(ctx_size=512, flash_attn="off")
    res = {}
    for dev in ("metal", "metal,graph_optimize=0"):
        dp = plan_devices(llama2, s, [parse_device(dev)], PlacementFlags(cpu_features=AVX2))
        pp = dict(dp.compute.schedules)["prompt"]
        off = {n.name: pp.alloc.offsets.get(id(n)) for n in pp.nodes}
        order = [(n.op, n.name) for n in pp.nodes]
        res[dev] = ({r.device: r.compute_bytes for r in dp.rows}["MTL0"], off, order)
    c_on, on, order_on = res["metal"]
    c_off, off, order_off = res["metal,graph_optimize=0"]
    rope_q, vcur, kcur = ("ROPE", "Qcur-0"), ("MUL_MAT", "Vcur-0"), ("MUL_MAT", "Kcur-0")
    assert order_off.index(rope_q) < order_off.index(vcur)
    assert order_on.index(rope_q) > order_on.index(kcur)
    assert off["kq-0"] == 2891776 + 524288 == 3416064 and c_off == 3416064 + 8388608 == 11804672
    assert on["kq-0"] == 2367488 and c_on == 2367488 + 8388608 == 10756096
    assert c_off - c_on == 2 * 524288


def test_metal_moe_and_flash_attention_figures(model):
    """qwen3moe on Metal, -ngl all: with and without flash attention the compute buffer is
    modelled, and the reorder lowers it (4,723,200 against 5,378,560 bytes with -fa on)."""
    qwen3moe = model("qwen3moe")
    flags = PlacementFlags(cpu_features=AVX2)
    fig = {}
    for fa in ("on", "off"):
        for dev in ("metal", "metal,graph_optimize=0"):
            dp = plan_devices(qwen3moe, RunSettings(ctx_size=512, flash_attn=fa),
                              [parse_device(dev)], flags)
            fig[fa, dev] = {r.device: r.compute_bytes for r in dp.rows}["MTL0"]
    assert fig["on", "metal"] == 4723200 and fig["on", "metal,graph_optimize=0"] == 5378560
    assert fig["off", "metal"] < fig["off", "metal,graph_optimize=0"]


def test_memory_json_carries_metal_compute(tmp_path, cli):
    f = write_llama(tmp_path / "m.gguf", n_layer=2)
    r = cli("memory", f.path, "--device", "metal:64GiB", "-ngl", "all", "-c", "512", "-fa", "off",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    devs = {d["device"]: d for d in json.loads(r.stdout)["memory"]["devices"]}
    assert devs["MTL0"]["compute_bytes"] == 10756096  # as the schedule above
    r = cli("memory", f.path, "--device", "metal:64GiB,simdgroup=1", "-c", "512")
    assert r.returncode == 2 and "unknown option 'simdgroup' for metal" in r.stderr


def test_metal_with_x86_cpu_features_says_so(tmp_path, cli):
    # a Mac's CPU is ARM: x86 features (this machine's, or given) repack other weights
    f = write_llama(tmp_path / "m.gguf", n_layer=2)
    base = ("memory", f.path, "--device", "metal:64GiB", "-ngl", "1", "-c", "512")
    r = cli(*base, "--cpu-features", "avx2")
    assert r.returncode == 0 and "note: a Metal device runs beside an Apple CPU" in r.stdout
    r = cli(*base, "--cpu-features", "neon,dotprod")
    assert r.returncode == 0 and "Apple CPU" not in r.stdout


# ---- the BLAS backend of a macOS build ---------------------------------------------------

def test_blas_takes_large_cpu_products(model):
    """-ngl 3: layers 0-2 on the CPU (no repacking: no CPU features given). A macOS build
    has the BLAS backend between MTL0 and the CPU (llama_context: "add ACCEL backends"); it
    reads the CPU weight buffer and runs MUL_MAT with ne0, ne1 and ne10 >= 32
    (ggml_backend_blas_device_supports_op), so in the 512-token prompt the 3 CPU layers' 7
    products each (Q, K, V, output, gate, up, down: 21) run on BLAS; the scheduler offloads
    to Metal only from the last backend (ggml_backend_sched_backend_id_from_cur), so with
    BLAS none goes to MTL0. Without BLAS (blas=0) all 21 are offloaded to MTL0 (batch
    512 >= 32). One token (the generation graph) is below BLAS's 32: the CPU."""
    llama5 = model("llama5")
    s = RunSettings(ctx_size=512, flash_attn="on")
    flags = PlacementFlags(n_gpu_layers=3, cpu_features=frozenset())
    on_dev = {}
    for dev in ("metal", "metal,blas=0"):
        dp = plan_devices(llama5, s, [parse_device(dev)], flags)
        on_dev[dev] = {lab: sorted(sc.device_of(i) for i, n in enumerate(sc.nodes)
                                   if n.op == "MUL_MAT" and n.layer is not None and n.layer < 3)
                       for lab, sc in dp.compute.schedules}
    assert on_dev["metal"]["prompt"] == ["BLAS"] * 21
    assert on_dev["metal,blas=0"]["prompt"] == ["MTL0"] * 21
    assert on_dev["metal"]["generation"] == on_dev["metal,blas=0"]["generation"] == ["CPU"] * 21


def test_blas_turns_pipeline_parallelism_off(model):
    """Two Metal devices, every layer offloaded: pipeline parallelism needs async compute
    and events on every backend but the CPU, and BLAS has neither (llama_context checks the
    ACCEL backends too): one copy of each input; without BLAS, 4 (GGML_SCHED_MAX_COPIES)."""
    llama5 = model("llama5")
    s = RunSettings(ctx_size=512, flash_attn="on")
    flags = PlacementFlags(cpu_features=frozenset())
    two = [parse_device("metal:8GiB"), parse_device("metal:8GiB")]
    assert plan_devices(llama5, s, two, flags).compute.n_copies == 1
    two = [parse_device("metal:8GiB,blas=0"), parse_device("metal:8GiB,blas=0")]
    assert plan_devices(llama5, s, two, flags).compute.n_copies == 4



def test_blas_is_not_a_device(tmp_path, cli):
    f = write_llama(tmp_path / "m.gguf", n_layer=2)
    r = cli("memory", f.path, "--device", "blas")
    assert r.returncode == 2 and "BLAS comes with the build" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_weights_metal_cannot_run_stay_on_the_cpu(tmp_path):
    """llama-model-loader's weight_buft_supported asks the device's supports_op about the op
    built around each weight: without bfloat (metal,bfloat=0: an M1 without Metal3, or
    GGML_METAL_BF16_DISABLE) a BF16 ffn_down refuses, so it falls back to the CPU buffer
    type and its products run on the CPU (BLAS for the 512-token prompt)."""
    from gguf import GGMLQuantizationType as QT
    m = load_model(write_llama(tmp_path / "bf16.gguf", n_layer=2,
                               weight_types={"ffn_down": QT.BF16}).path)
    s = RunSettings(ctx_size=512, flash_attn="on")
    where = {}
    for dev in ("metal", "metal,bfloat=0"):
        dp = plan_devices(m, s, [parse_device(dev)], PlacementFlags(cpu_features=frozenset()))
        bufts = {w.name: w.buft.name for w in dp.placement.weights}
        runs = {lab: {sc.device_of(i) for i, n in enumerate(sc.nodes) if n.name.startswith("ffn_out")}
                for lab, sc in dp.compute.schedules}
        where[dev] = (bufts["blk.0.ffn_down.weight"], runs)
    assert where["metal"] == ("MTL0", {"prompt": {"MTL0"}, "generation": {"MTL0"}})
    assert where["metal,bfloat=0"] == ("CPU", {"prompt": {"BLAS"}, "generation": {"CPU"}})


def test_a_yes_no_option_with_another_value_is_refused(tmp_path, cli):
    # bfloat=2 must not silently mean the default (op_rules.device_flag)
    f = write_llama(tmp_path / "m.gguf", n_layer=2)
    r = cli("memory", f.path, "--device", "metal:64GiB,bfloat=2", "-c", "512")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "graphcost: device option bfloat=2: use 1 or 0 (also yes/no, true/false, on/off)"]
