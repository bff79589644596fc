"""CUDA, ROCm and SYCL devices without a GPU: the backend facts of specs/backends/cuda.yaml,
rocm.yaml and sycl.yaml (each cited from ggml-cuda / ggml-sycl) applied to model, KV and compute buffers, with the
numbers worked out by hand from the ggml rules: flash attention's kernel choice and its
F16 copies or staging blocks (CUDA, ROCm, SYCL), and CUDA's MoE allocation dependencies
(graphcost/memory/alloc_deps.py). The scheduler mechanism itself is proven
against real llama.cpp runs on RPC devices (tests/test_devices_rpc.py); the check against
a CUDA build is benchmarks/check_cuda.py (needs an NVIDIA GPU)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import write_llama
from fixtures_deepseek import write_glm4moe
from fixtures_moe import write_mixtral, write_qwen3moe
from graphcost.format import ggml_types as gt
from graphcost.graph.build import load_model
from graphcost.graph.ggml_graph import Tensor, contiguous_nb
from graphcost.graph.settings import RunSettings
from graphcost.memory.alloc_deps import SplitGraph, collect, cuda_moe_fusions, use_counts
from graphcost.memory.backends import load
from graphcost.memory.op_rules import (Unmodelled, amd_arch, compute_alloc_size,
                                       cuda_fattn_alloc_size, cuda_fattn_kernel, evaluate,
                                       sycl_fattn_alloc_size, sycl_fattn_kernel)
from graphcost.memory.placement import DeviceArg, PlacementFlags, parse_device, plan_devices

ROOT = Path(__file__).resolve().parents[1]
AVX2 = frozenset({"avx2"})
T = gt.GGMLType


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def tensor(typ, ne, op="NONE", src=(), **params) -> Tensor:
    ne = tuple(ne) + (1,) * (4 - len(ne))
    return Tensor(op, typ, ne, contiguous_nb(typ, ne), src=list(src), params=params)


@pytest.fixture(scope="module")
def llama5(tmp_path_factory):
    # 5 layers, n_embd 256, n_ff 768, 8 heads of 32, 2 KV heads, vocab 300 (tests/fixtures.py)
    return load_model(write_llama(tmp_path_factory.mktemp("cu") / "llama5.gguf", n_layer=5).path)


@pytest.fixture(scope="module")
def hd128_path(tmp_path_factory):
    # heads of 128 (a size CUDA's flash attention has kernels for): 8 heads, 2 KV heads
    return write_llama(tmp_path_factory.mktemp("cu") / "hd128.gguf", n_layer=3, head_dim=128).path


@pytest.fixture(scope="module")
def llama_hd128(hd128_path):
    return load_model(hd128_path)


# ---- supports_op rules ---------------------------------------------------------------------------

def _cuda(node, **opts) -> bool:
    rule = load("cuda").supports_op["ops"].get(str(node.op), load("cuda").supports_op["default"])
    return evaluate(rule, node, opts, "test")


@pytest.mark.parametrize("src0,src1,ok", [
    (T.Q4_K, T.F32, True), (T.F16, T.F16, True), (T.Q4_0, T.F16, False),  # b F16 needs a F16
    (T.TQ1_0, T.F32, False),  # not in ggml_backend_cuda_device_supports_op's type list
], ids=["q4k", "f16-f16", "q40-by-f16", "tq1_0"])
def test_cuda_mul_mat_rule(src0, src1, ok):
    a, b = tensor(src0, (256, 64)), tensor(src1, (256, 7))
    assert _cuda(tensor(T.F32, (64, 7), "MUL_MAT", [a, b])) is ok


def test_cuda_rules_for_rows_unary_and_unlisted_ops():
    x = tensor(T.F32, (512, 4))
    idx = tensor(T.I64, (4,))
    assert _cuda(tensor(T.Q8_0, (512, 4), "SET_ROWS", [x, idx]))       # F32 -> Q8_0 cache
    assert not _cuda(tensor(T.Q4_K, (512, 4), "SET_ROWS", [x, idx]))   # no K-quant cache on CUDA
    # GET_ROWS of IQ4_NL needs rows of whole 256-blocks: ne0 % QK_K
    ids = tensor(T.I32, (3,))
    assert _cuda(tensor(T.F32, (512, 3), "GET_ROWS", [tensor(T.IQ4_NL, (512, 10)), ids]))
    assert not _cuda(tensor(T.F32, (288, 3), "GET_ROWS", [tensor(T.IQ4_NL, (288, 10)), ids]))
    # unary ops need a contiguous source: a transposed view is not
    v = tensor(T.F32, (8, 16))
    v.nb = (v.nb[1], v.nb[0], v.nb[2], v.nb[3])
    assert _cuda(tensor(T.F32, (16, 8), "SILU", [tensor(T.F32, (16, 8))]))
    assert not _cuda(tensor(T.F32, (8, 16), "SILU", [v]))
    # an op the switch does not list: default false
    assert not _cuda(tensor(T.F32, (4,), "WIN_PART", [x]))
    # CONCAT: F32 along any dim is supported; a quantized one is a case not transcribed
    a, b = tensor(T.F32, (64, 4)), tensor(T.F32, (64, 3))
    assert _cuda(tensor(T.F32, (64, 7), "CONCAT", [a, b], dim=1))
    qa, qb = tensor(T.Q8_0, (64, 4)), tensor(T.Q8_0, (64, 3))
    with pytest.raises(Unmodelled, match="CONCAT of quantized"):
        _cuda(tensor(T.Q8_0, (64, 7), "CONCAT", [qa, qb], dim=1))


def test_rocm_takes_cudas_rules_with_its_own_argsort():
    cuda, rocm = load("cuda").supports_op, load("rocm").supports_op
    assert {k: v for k, v in rocm["ops"].items() if k not in ("ARGSORT", "TOP_K")} == \
        {k: v for k, v in cuda["ops"].items() if k not in ("ARGSORT", "TOP_K")}
    # the bitonic argsort: the row padded to a power of 2, 4 bytes each, within 64 KiB
    def argsort(n):
        return evaluate(rocm["ops"]["ARGSORT"], tensor(T.I32, (n, 2), "ARGSORT",
                                                       [tensor(T.F32, (n, 2))]), {}, "t")
    assert argsort(16384)        # 16384 x 4 = 65536
    assert not argsort(16385)    # padded to 32768: 131072 bytes


# ---- flash attention: supported cases and the F16 copies in its allocation --------------------

def _fa(q_tokens, kt, vt, d=128, n_kv=512, heads=8, kv_heads=2):
    q = tensor(T.F32, (d, q_tokens, heads))
    k = tensor(kt, (d, n_kv, kv_heads))
    v = tensor(vt, (d, n_kv, kv_heads))
    mask = tensor(T.F16, (n_kv, q_tokens))
    return tensor(T.F32, (d, heads, q_tokens), "FLASH_ATTN_EXT", [q, k, v, mask], max_bias=0.0)


def test_cuda_flash_attention_supported_head_sizes():
    assert _cuda(_fa(7, T.F16, T.F16, d=128))
    assert not _cuda(_fa(7, T.F16, T.F16, d=32))   # ggml_cuda_get_best_fattn_kernel: no D=32
    assert not _cuda(_fa(7, T.Q4_K, T.Q4_K))      # ggml_cuda_fattn_kv_type_supported
    assert _cuda(_fa(7, T.Q8_0, T.Q8_0))


def test_cuda_flash_attention_alloc_size_by_hand():
    # result F32 [128, 8, 512]: 128*8*512*4 = 2,097,152 bytes; K and V q8_0 [128, 512, 2]
    # have 131,072 elements each, an F16 copy 262,144 bytes
    pp = _fa(512, T.Q8_0, T.Q8_0)
    assert cuda_fattn_kernel(pp, {"cc": "8.9"}) == "mma"
    assert cuda_fattn_alloc_size(pp, {"cc": "8.9"}) == 2097152 + 262144 + 262144
    # decode on Ada (cc 8.9): quantized K/V with 1 token -> the vector kernel, whose q8_0/q8_0
    # instance is compiled by default (GGML_CUDA_FA_QUANTS): no copies, 128*8*4 = 4096
    tg = _fa(1, T.Q8_0, T.Q8_0)
    assert cuda_fattn_kernel(tg, {"cc": "8.9"}) == "vec"
    assert cuda_fattn_alloc_size(tg, {"cc": "8.9"}) == 4096
    # q4_1/q4_1 has no compiled vector instance: it converts both to F16 (f16_fallback);
    # the result's 4096 bytes are already a multiple of 128
    assert cuda_fattn_alloc_size(_fa(1, T.Q4_1, T.Q4_1), {"cc": "8.9"}) == 4096 + 2 * 262144
    # Turing (7.5) takes the vector kernel only for exactly 1 token: 2 tokens -> mma, copies
    assert cuda_fattn_kernel(_fa(2, T.Q8_0, T.Q8_0), {"cc": "7.5"}) == "mma"
    assert cuda_fattn_kernel(_fa(2, T.Q8_0, T.Q8_0), {"cc": "8.9"}) == "vec"
    # F16 K/V: never a copy, whatever the GPU (no cc needed)
    assert cuda_fattn_alloc_size(_fa(512, T.F16, T.F16), {}) == 2097152
    with pytest.raises(Unmodelled, match="cc=8.9"):
        cuda_fattn_alloc_size(pp, {})


def test_rocm_flash_attention_kernel_and_alloc_size_by_hand():
    """ggml_cuda_get_best_fattn_kernel's AMD branches (fattn.cu; common.cuh): 8 heads over
    2 KV heads (GQA ratio 4, so gqa_ratio_eff 4), head size 128, 512 cells, a mask: the GQA
    optimisation applies. MFMA (CDNA) wants Q->ne[1] x 4 > 16 for head 128, WMMA
    (RDNA3/4) > 8; otherwise a quantized cache takes the vector kernel up to 2 tokens and
    the tile kernel beyond. tile and mma read F16 copies of K and V: q8_0 [128, 512, 2] is
    131,072 elements, 262,144 bytes as F16."""
    hip = {"hip": True}
    mi300, rx7900, rx6800 = {"arch": "gfx942"}, {"arch": "gfx1100"}, {"arch": "gfx1030"}
    assert cuda_fattn_kernel(_fa(512, T.Q8_0, T.Q8_0), mi300, **hip) == "mma"   # 2048 > 16
    assert cuda_fattn_kernel(_fa(4, T.Q8_0, T.Q8_0), mi300, **hip) == "tile"    # 16, 4 > 2
    assert cuda_fattn_kernel(_fa(5, T.Q8_0, T.Q8_0), mi300, **hip) == "mma"     # 20 > 16
    assert cuda_fattn_kernel(_fa(2, T.Q8_0, T.Q8_0), rx7900, **hip) == "vec"    # 8, not > 8
    assert cuda_fattn_kernel(_fa(3, T.Q8_0, T.Q8_0), rx7900, **hip) == "mma"    # 12 > 8
    assert cuda_fattn_kernel(_fa(3, T.Q8_0, T.Q8_0), rx6800, **hip) == "tile"   # RDNA2: no WMMA
    # sizes: the result F32 [128, 8, tokens] (4,096 bytes a token), then the copies
    assert cuda_fattn_alloc_size(_fa(512, T.Q8_0, T.Q8_0), mi300, **hip) == 2097152 + 2 * 262144
    assert cuda_fattn_alloc_size(_fa(4, T.Q8_0, T.Q8_0), mi300, **hip) == 16384 + 2 * 262144
    assert cuda_fattn_alloc_size(_fa(1, T.Q8_0, T.Q8_0), mi300, **hip) == 4096  # vec, compiled
    assert cuda_fattn_alloc_size(_fa(1, T.Q4_1, T.Q4_1), rx6800, **hip) == 4096 + 2 * 262144
    rule = load("rocm").compute_alloc_size
    assert compute_alloc_size(rule, _fa(4, T.Q8_0, T.Q8_0), mi300) == 16384 + 2 * 262144
    assert compute_alloc_size(rule, _fa(512, T.F16, T.F16), {}) == 2097152  # F16: no arch needed
    with pytest.raises(Unmodelled, match="arch=gfx1100"):
        compute_alloc_size(rule, _fa(4, T.Q8_0, T.Q8_0), {})
    # ggml_cuda_parse_id: the last two hex digits are the minor version
    assert [amd_arch({"arch": a}, "t") for a in ("gfx90a", "gfx942", "gfx1100", "gfx11-generic",
                                                  "gfx90c")] == [0x90A, 0x942, 0x1100, 0x1100, 0x90C]
    # gfx90c is a GCN APU (GGML_CUDA_CC_IS_GCN_APU), not CDNA: no MFMA, so 5 tokens -> tile
    assert cuda_fattn_kernel(_fa(5, T.Q8_0, T.Q8_0), {"arch": "gfx90c"}, **hip) == "tile"


def test_compute_alloc_size_pads_quantized_rows():
    rule = load("cuda").compute_alloc_size
    # a Q4_K copy [4352, 3] (17 blocks of 256 a row, 144 bytes each): 3*17*144 = 7344 bytes;
    # 4352 % 512 = 256, so one row of 512 - 256 = 256 elements more: 144 bytes
    assert compute_alloc_size(rule, tensor(T.Q4_K, (4352, 3)), {}) == 7344 + 144
    assert compute_alloc_size(rule, tensor(T.Q4_K, (4608, 3)), {}) == 3 * 18 * 144
    assert compute_alloc_size(None, tensor(T.Q4_K, (4352, 3)), {}) == 7344  # the CPU's


# ---- model, KV and compute buffers through the plan ---------------------------------------------

def test_cuda_model_buffer_pads_every_quantized_weight(llama5):
    dp = plan_devices(llama5, RunSettings(ctx_size=512), [DeviceArg("cuda")],
                      PlacementFlags(cpu_features=AVX2))
    w = {(x.name, x.buft.name): x.bytes for x in dp.placement.weights}
    # ffn_down Q4_K [768, 256]: 256 rows x 3 blocks x 144 = 110,592; 768 % 512 = 256 ->
    # + 144 = 110,736; padded to 128: 866 x 128 = 110,848
    assert w[("blk.0.ffn_down.weight", "CUDA0")] == 110848
    # attn_output Q4_K [256, 256]: 36,864 + 144 = 37,008 -> 290 x 128 = 37,120
    assert w[("blk.0.attn_output.weight", "CUDA0")] == 37120
    # attn_k F16 [256, 64]: 32,768, no padding (not quantized), a multiple of 128
    assert w[("blk.0.attn_k.weight", "CUDA0")] == 32768
    cuda0 = next(b for b in dp.placement.model_buffers if b.name == "CUDA0")
    assert cuda0.bytes == sum(b for (_, buft), b in w.items() if buft == "CUDA0")


def test_cuda_kv_cache_pads_quantized_rows(llama5):
    s = RunSettings(ctx_size=512, flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0")
    cuda = plan_devices(llama5, s, [DeviceArg("cuda", 8 << 30)], PlacementFlags(cpu_features=AVX2))
    rpc = plan_devices(llama5, s, [DeviceArg("rpc")], PlacementFlags(cpu_features=AVX2))
    # K per layer: q8_0 [64, 512]: 512 rows x 2 blocks x 34 = 34,816 bytes; 64 % 512 = 64 ->
    # + row_size(q8_0, 448) = 14 x 34 = 476 -> 35,292 -> padded to 128: 35,328. V the same;
    # 5 layers: 10 x 35,328 = 353,280 (an RPC server backed by a CPU: 10 x 34,816)
    assert {r.device: r.kv_bytes for r in cuda.rows}["CUDA0"] == 353280
    assert {r.device: r.kv_bytes for r in rpc.rows}["RPC0"] == 348160


def test_cuda_offloads_cpu_weights_for_large_batches(llama5):
    """-ngl 3: layers 0-2 on the CPU. In the prompt graph (512 tokens) their matrix products
    run on CUDA0, their weights copied to it (ggml_backend_cuda_device_offload_op: batch
    >= 32); in the generation graph (1 token) they stay on the CPU. An RPC device never
    takes them (offload_op = NULL)."""
    s = RunSettings(ctx_size=512)
    flags = PlacementFlags(n_gpu_layers=3, cpu_features=AVX2)
    cuda = plan_devices(llama5, s, [DeviceArg("cuda", 8 << 30)], flags)
    sched = dict(cuda.compute.schedules)
    pp, tg = sched["prompt"], sched["generation"]

    def device_of(sc, name):
        return next(sc.device_of(i) for i, n in enumerate(sc.nodes) if n.name == name)
    assert device_of(pp, "Qcur-0") == "CUDA0" and device_of(tg, "Qcur-0") == "CPU"
    copied = {t.name for sp in pp.splits for t in sp.inputs}
    assert {"blk.0.attn_q.weight", "blk.1.ffn_down.weight"} <= copied
    rpc = plan_devices(llama5, s, [DeviceArg("rpc")], flags)
    rpp = dict(rpc.compute.schedules)["prompt"]
    assert device_of(rpp, "Qcur-0") == "CPU"
    # the CPU's compute buffer type is CUDA0's pinned host type (llama_context: the first
    # device's host buffer type), reported in its own row
    rows = {r.device: r for r in cuda.rows}
    assert rows["CUDA_Host"].compute_bytes > 0 and rows["CPU"].compute_bytes == 0
    assert rows["CUDA0"].compute_bytes > 0


def test_cuda_flash_attention_auto_turns_off_for_unsupported_head_size(llama5, llama_hd128):
    s = RunSettings(ctx_size=512)  # -fa auto (the flavour's default)
    dp = plan_devices(llama5, s, [DeviceArg("cuda")], PlacementFlags(cpu_features=AVX2))
    assert any("turns flash attention off" in n for n in dp.placement.notes)  # head size 32
    dp = plan_devices(llama_hd128, s, [DeviceArg("cuda")], PlacementFlags(cpu_features=AVX2))
    assert not any("flash attention" in n for n in dp.placement.notes)
    fa = [n for _, sc in dp.compute.schedules for i, n in enumerate(sc.nodes)
          if n.op == "FLASH_ATTN_EXT"]
    assert fa and all(sc.device_of(i) == "CUDA0" for _, sc in dp.compute.schedules
                      for i, n in enumerate(sc.nodes) if n.op == "FLASH_ATTN_EXT")


@pytest.mark.parametrize("kind,option,device", [("cuda", "cc=8.9", "CUDA0"),
                                                ("rocm", "arch=gfx1100", "ROCm0")])
def test_quantized_cache_needs_the_gpu(llama_hd128, kind, option, device):
    s = RunSettings(ctx_size=512, flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0")
    flags = PlacementFlags(cpu_features=AVX2)
    dp = plan_devices(llama_hd128, s, [DeviceArg(kind)], flags)
    assert dp.compute is None and {r.device: r.compute_bytes for r in dp.rows}[device] is None
    assert any(option in n for n in dp.placement.notes)
    q8 = plan_devices(llama_hd128, s, [parse_device(f"{kind},{option}")], flags)
    f16 = plan_devices(llama_hd128, RunSettings(ctx_size=512, flash_attn="on"),
                       [DeviceArg(kind)], flags)
    # the prompt graph's attention (512 tokens: mma on Ada, WMMA's mma on RDNA3) converts K
    # and V to F16 inside its own allocation: the q8_0 cache's compute buffer is larger
    c_q8 = {r.device: r.compute_bytes for r in q8.rows}[device]
    c_f16 = {r.device: r.compute_bytes for r in f16.rows}[device]
    assert c_q8 > c_f16


@pytest.fixture(scope="module")
def qwen3moe(tmp_path_factory):
    # 2 layers, n_embd 320, 5 heads of 64 over 1 KV head, 4 experts of width 96, 2 used
    return load_model(write_qwen3moe(tmp_path_factory.mktemp("cu") / "q3m.gguf", n_layer=2).path)


def _deps_by_name(model, settings):
    from graphcost.graph.build import build_graph, resolve_for
    run = resolve_for(model, settings)
    bg = build_graph(model, run.step(7, 0, 7))
    g = SplitGraph(bg.nodes, None, use_counts(bg.nodes), set(), set())
    return {next(n.name for n in bg.nodes if id(n) == k): [t.name for t in v]
            for k, v in collect(cuda_moe_fusions(g, {})).items()}


def test_cuda_moe_fusion_matchers(qwen3moe, tmp_path):
    """ggml_backend_cuda_graph_optimize's add_alloc_dep calls on qwen3moe's layer 0
    (ggml-cuda.cu): the top-k routing SOFT_MAX, RESHAPE, ARGSORT, VIEW, GET_ROWS + the norm's
    RESHAPE, SUM_ROWS, CLAMP, DIV, RESHAPE (10 nodes, 4 experts: an instantiated count)
    and each one's sources are kept until the node after them (the reshaped ffn_norm);
    the weighted sum MUL, 2 VIEWs, ADD keeps the experts and router weights until its ADD."""
    deps = _deps_by_name(qwen3moe, RunSettings(ctx_size=512))
    assert deps["ffn_norm-0 (reshaped)"] == [
        "ffn_moe_probs-0", "ffn_moe_logits-0", "ffn_moe_probs-0 (reshaped)", "ffn_moe_argsort-0",
        "ffn_moe_topk-0", "ffn_moe_weights-0", "ffn_moe_weights-0 (reshaped)",
        "ffn_moe_weights_sum-0", "ffn_moe_weights_sum_clamped-0", "ffn_moe_weights_norm-0",
        "ffn_moe_weights_norm-0 (reshaped)"]  # 11 kept: two dependency nodes (10 + 1 sources)
    assert deps["ffn_moe_out-0"] == ["ffn_moe_down-0", "ffn_moe_weights_norm-0 (reshaped)"]
    assert len(deps) == 4  # the same two for layer 1
    # 6 experts: not an instantiated top-k count (ggml_cuda_should_use_topk_moe): only the sums
    mx = load_model(write_mixtral(tmp_path / "mx.gguf", n_layer=2).path)
    assert set(_deps_by_name(mx, RunSettings(ctx_size=512))) == {"ffn_moe_out-0", "ffn_moe_out-1"}
    # glm4moe, 8 experts: the sigmoid gate with the selection bias (ADD of exp_probs_b, a
    # weight among the kept sources), the norm and the SCALE of weights_scale: 14 kept
    glm = load_model(write_glm4moe(tmp_path / "glm.gguf", n_expert=8).path)
    deps = _deps_by_name(glm, RunSettings(ctx_size=512))
    assert deps["post_attn_norm-1 (reshaped)"] == [
        "ffn_moe_probs-1", "ffn_moe_logits-1", "ffn_moe_probs-1 (reshaped)",
        "ffn_moe_probs_biased-1", "blk.1.exp_probs_b.bias", "ffn_moe_argsort-1",
        "ffn_moe_topk-1", "ffn_moe_weights-1", "ffn_moe_weights-1 (reshaped)",
        "ffn_moe_weights_sum-1", "ffn_moe_weights_sum_clamped-1", "ffn_moe_weights_norm-1",
        "ffn_moe_weights_norm-1 (reshaped)", "ffn_moe_weights_scaled-1"]
    assert deps["ffn_moe_out-1"] == ["ffn_moe_down-1", "ffn_moe_weights_scaled-1"]
    assert len(deps) == 4  # layer 0 is dense (n_layer_dense_lead 1); layers 1 and 2


def test_moe_on_cuda_keeps_fused_tensors_alive(qwen3moe):
    """The dependencies in the allocation (qwen3moe, 512-token prompt, flash attention on).
    GGML_CUDA_DISABLE_FUSION=1 (fusion=0): ffn_moe_weighted (MUL) takes ffn_moe_down's
    block in place, F32 [320, 2, 512] = 320 x 2 x 512 x 4 = 1,310,720 bytes at offset
    2,502,656, and that block's end is the buffer: 3,813,376. With the fusions,
    ffn_moe_down is kept until ffn_moe_out, so the MUL cannot run in place and takes the
    next 1,310,720 bytes: 3,813,376 + 1,310,720 = 5,124,096. The top-k dependencies keep
    ffn_moe_logits (8,192 bytes at 0) alive, so the SOFT_MAX, in place at 0 without them,
    sits at 8,192."""
    s = RunSettings(ctx_size=512, flash_attn="on")
    flags = PlacementFlags(cpu_features=AVX2)
    res = {}
    for dev in ("cuda", "cuda,fusion=0"):
        dp = plan_devices(qwen3moe, s, [parse_device(dev)], flags)
        pp = dict(dp.compute.schedules)["prompt"]
        off = {n.name: pp.alloc.offsets.get(id(n)) for n in pp.nodes}
        res[dev] = ({r.device: r.compute_bytes for r in dp.rows}["CUDA0"], off)
    c_on, on = res["cuda"]
    c_off, off = res["cuda,fusion=0"]
    assert off["ffn_moe_down-0"] == off["ffn_moe_weighted-0"] == 2502656
    assert c_off == 2502656 + 320 * 2 * 512 * 4 == 3813376
    assert on["ffn_moe_down-0"] == 2502656 and on["ffn_moe_weighted-0"] == 3813376
    assert c_on == 3813376 + 1310720 == 5124096
    assert off["ffn_moe_probs-0"] == off["ffn_moe_logits-0"] == 0
    assert on["ffn_moe_logits-0"] == 0 and on["ffn_moe_probs-0"] == 8192


def test_sycl_rules_and_its_flash_attention_plan(llama_hd128):
    sycl = load("sycl").supports_op

    def mm(a_type, a_ne, b_ne):
        a, b = tensor(a_type, a_ne), tensor(T.F32, b_ne)
        node = tensor(T.F32, (a_ne[1],) + tuple(b_ne[1:]), "MUL_MAT", [a, b])
        return evaluate(sycl["ops"]["MUL_MAT"], node, {}, "t")
    assert mm(T.Q4_K, (256, 64), (256, 7))
    assert not mm(T.TQ1_0, (256, 64), (256, 7))                 # ternary types refused
    assert not mm(T.F16, (64, 8, 2, 1), (64, 7, 2, 3))          # a.ne[3] != b.ne[3]
    flags = PlacementFlags(n_gpu_layers=2, cpu_features=AVX2)
    off = plan_devices(llama_hd128, RunSettings(ctx_size=512, flash_attn="off"),
                       [DeviceArg("sycl")], flags)
    rows = {r.device: r.compute_bytes for r in off.rows}
    assert rows["SYCL0"] > 0 and rows["SYCL_Host"] > 0     # the CPU's compute type: SYCL_Host
    on = plan_devices(llama_hd128, RunSettings(ctx_size=512, flash_attn="on"),
                      [DeviceArg("sycl")], flags)
    assert on.compute is not None and not on.placement.notes
    fa = [(sc.device_of(i), lab) for lab, sc in on.compute.schedules
          for i, n in enumerate(sc.nodes) if n.op == "FLASH_ATTN_EXT" and n.layer == 2]
    assert fa and all(dev == "SYCL0" for dev, _ in fa)
    # oneDNN's staging (Q, scale, output) is in the prompt's attention allocation: without
    # oneDNN (onednn=0) the F16 cache needs none, so SYCL0's buffer is smaller
    no_dnn = plan_devices(llama_hd128, RunSettings(ctx_size=512, flash_attn="on"),
                          [parse_device("sycl,onednn=0")], flags)
    c = {r.device: r.compute_bytes for r in on.rows}["SYCL0"]
    assert {r.device: r.compute_bytes for r in no_dnn.rows}["SYCL0"] < c


def _sycl(dst, **opts):
    return sycl_fattn_kernel(dst, opts), sycl_fattn_alloc_size(dst, opts)


def test_sycl_flash_attention_kernel_and_alloc_size_by_hand():
    """ggml_sycl_get_best_fattn_kernel and ggml_sycl_fattn_get_extra (ggml-sycl/fattn.cpp,
    fattn-onednn.cpp): 8 heads over 2 KV heads of 128, a F16 mask. The result F32
    [128, 8, tokens] is 4,096 bytes a token; the staging blocks are F16, each at a 128-byte
    boundary: with oneDNN possible for the shape, Q and the output are 8 x tokens x 128
    halves (512 tokens: 1,048,576 bytes each) and the scale 2 bytes; a q8_0 K or V
    [128, cells, 2] is copied as 128 x cells x 2 halves (512 cells: 262,144 bytes)."""
    # F16 cache, 512-token prompt: oneDNN SDPA, the cache bound in place:
    # 2,097,152 + 1,048,576 (Q) = 3,145,728, + 2 (scale) -> 3,145,856 + 1,048,576 (output)
    assert _sycl(_fa(512, T.F16, T.F16)) == ("onednn", 4194432)
    # q8_0 over 512 cells: oneDNN dequantizes only from 1024 cells, MKL likewise: tile;
    # the reservation is still the worst case over kernels, oneDNN's included:
    # 3,145,728 + 262,144 (K) + 262,144 (V) = 3,670,016, + 2 -> 3,670,144 + 1,048,576
    assert _sycl(_fa(512, T.Q8_0, T.Q8_0)) == ("tile", 4718720)
    assert sycl_fattn_kernel(_fa(512, T.Q8_0, T.Q8_0, n_kv=1024), {}) == "onednn"
    # without oneDNN (onednn=0): the F16 cache needs nothing; q8_0 its tile copies
    assert _sycl(_fa(512, T.F16, T.F16), onednn=0) == ("tile", 2097152)
    assert _sycl(_fa(512, T.Q8_0, T.Q8_0), onednn=0) == ("tile", 2097152 + 2 * 262144)
    assert sycl_fattn_kernel(_fa(512, T.Q8_0, T.Q8_0, n_kv=1024), {"onednn": "0"}) == "mkl"
    # one token of an F16 cache: the GQA optimisation applies, so tile, not vec; oneDNN's
    # blocks are reserved all the same: 4,096 + 2,048 (Q) = 6,144, + 2 -> 6,272 + 2,048
    assert _sycl(_fa(1, T.F16, T.F16)) == ("tile", 8320)
    assert sycl_fattn_kernel(_fa(1, T.Q8_0, T.Q8_0), {}) == "vec"
    assert sycl_fattn_kernel(_fa(1, T.Q8_0, T.Q8_0), {"arch": "bmg"}) == "tile"  # Xe2
    # head size 32: oneDNN takes the prompt, nothing takes one token
    assert sycl_fattn_kernel(_fa(512, T.F16, T.F16, d=32), {}) == "onednn"
    assert sycl_fattn_kernel(_fa(1, T.F16, T.F16, d=32), {}) == "none"
    # Alchemist (arch=dg2): no SDPA for head size 64
    assert sycl_fattn_kernel(_fa(512, T.F16, T.F16, d=64), {"arch": "dg2"}) == "tile"
    # q4_1 needs GGML_SYCL_FA_ALL_QUANTS (off): unsupported, through supports_op too
    assert sycl_fattn_kernel(_fa(512, T.Q4_1, T.Q4_1), {}) == "none"
    rule = load("sycl").supports_op["ops"]["FLASH_ATTN_EXT"]
    assert evaluate(rule, _fa(512, T.F16, T.F16), {}, "t")
    assert not evaluate(rule, _fa(512, T.Q4_1, T.Q4_1), {}, "t")
    # the buffer type's get_alloc_size adds nothing to an F32 result
    assert compute_alloc_size(load("sycl").compute_alloc_size, _fa(512, T.F16, T.F16), {}) == 4194432


# ---- device options and the JSON ---------------------------------------------------------------

def test_device_options_parse_and_refuse_in_one_line():
    assert parse_device("cuda:24GiB,cc=8.9") == DeviceArg("cuda", 24 << 30, (("cc", "8.9"),))
    assert parse_device("vulkan,align=64").options == (("align", "64"),)
    r = cli("memory", "x.gguf", "--device", "cuda:8GiB,foo=1")
    assert r.returncode == 2 and "unknown option 'foo' for cuda" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_integrated_cuda_gpu(llama5):
    """integrated=1: caps.mmap_support is false (so -lm auto loads without mmap and the
    CPU layers' weights go to the pinned CUDA_Host buffer), and the GPU reads CUDA_Host
    buffers (ggml_backend_cuda_device_supports_buft): the scheduler runs layer 0's matrix
    products on CUDA0 even for one token, where a discrete GPU leaves them on the CPU."""
    s = RunSettings(ctx_size=512)
    flags = PlacementFlags(n_gpu_layers=3, cpu_features=AVX2)
    plans = {k: plan_devices(llama5, s, [parse_device(k)], flags)
             for k in ("cuda", "cuda,integrated=1")}
    assert [b.name for b in plans["cuda"].placement.model_buffers] == ["CPU_Mapped", "CUDA0"]
    assert [b.name for b in plans["cuda,integrated=1"].placement.model_buffers] == ["CUDA_Host", "CUDA0"]
    dev = {}
    for k, dp in plans.items():
        tg = dict(dp.compute.schedules)["generation"]
        dev[k] = next(tg.device_of(i) for i, n in enumerate(tg.nodes) if n.name == "Qcur-0")
    assert dev == {"cuda": "CPU", "cuda,integrated=1": "CUDA0"}


def test_vulkan_alignment_from_its_option(llama5):
    s = RunSettings(ctx_size=512)
    unknown = plan_devices(llama5, s, [DeviceArg("vulkan")], PlacementFlags(cpu_features=AVX2))
    assert {r.device: r.model_bytes for r in unknown.rows}["Vulkan0"] is None
    known = plan_devices(llama5, s, [parse_device("vulkan,align=64")],
                         PlacementFlags(cpu_features=AVX2))
    w = {(x.name, x.buft.name): x.bytes for x in known.placement.weights}
    # ffn_down Q4_K [768, 256]: 110,592 bytes (no padding on Vulkan), a multiple of 64
    assert w[("blk.0.ffn_down.weight", "Vulkan0")] == 110592
    # KV F16 [64, 512] per tensor: 65,536 bytes; 5 layers x 2 = 655,360
    assert {r.device: r.kv_bytes for r in known.rows}["Vulkan0"] == 655360
    # with the alignment its compute buffers are modelled too (tests/test_devices_vulkan.py)
    assert {r.device: r.compute_bytes for r in known.rows}["Vulkan0"] > 0
    assert {r.device: r.compute_bytes for r in unknown.rows}["Vulkan0"] is None


def test_memory_json_carries_cuda_figures(tmp_path):
    f = write_llama(tmp_path / "m.gguf", n_layer=5)
    r = cli("memory", f.path, "--device", "cuda:8GiB", "-ngl", "3", "-c", "512",
            "--cpu-features", "avx2", "--format", "json")
    assert r.returncode == 0, r.stderr
    devs = {d["device"]: d for d in json.loads(r.stdout)["memory"]["devices"]}
    assert list(devs) == ["CUDA0", "CPU", "CUDA_Host"]
    cuda0 = devs["CUDA0"]
    assert all(isinstance(cuda0[k], int) for k in ("model_bytes", "kv_bytes", "compute_bytes"))
    # -ngl 3 of the 5 + 1 layers: layers 3-4 and the output; 2 layers' K and V, 65,536 bytes
    # each (F16 [64, 512])
    assert cuda0["kv_bytes"] == 2 * 2 * 65536 and cuda0["free_bytes"] == 8 << 30
    assert devs["CUDA_Host"]["compute_bytes"] > 0
    # a Vulkan device without its alignment (align=N): not modelled, null, never 0
    r = cli("memory", f.path, "--device", "vulkan:8GiB", "-c", "512", "--format", "json")
    devs = {d["device"]: d for d in json.loads(r.stdout)["memory"]["devices"]}
    assert devs["Vulkan0"]["compute_bytes"] is None


# ---- benchmarks/check_cuda.py: its comparison, on a log written in llama.cpp's format --------

def test_check_cuda_compares_logged_lines(hd128_path):
    import importlib.util

    from typer.testing import CliRunner

    from graphcost.cli import app
    from llama_runs import parse_buffers
    spec = importlib.util.spec_from_file_location("check_cuda", ROOT / "benchmarks" / "check_cuda.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    r = CliRunner().invoke(app, ["memory", str(hd128_path), "-c", "512", "-ngl", "2",
                                 "--device", "cuda:8GiB,cc=8.9", "--cpu-features", "avx2",
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    mem = json.loads(r.stdout)["memory"]
    mib = lambda n: f"{n / (1 << 20):8.2f} MiB"  # noqa: E731  llama.cpp's "%8.2f MiB"
    lines = [f"load_tensors: {b['name']:>12} model buffer size = {mib(b['bytes'])}"
             for b in mem["model_buffers"]]
    lines += [f"llama_kv_cache: {b['device']:>10} KV buffer size = {mib(b['bytes'])}"
              for b in mem["kv_buffers"]]
    for d in mem["devices"]:
        if d["output_bytes"]:
            lines.append(f"llama_context: {d['device']:>10}  output buffer size = {mib(d['output_bytes'])}")
        if d["compute_bytes"] > 1:
            lines.append(f"sched_reserve: {d['device']:>10} compute buffer size = {mib(d['compute_bytes'])}")
    g = {x["graph"]: x["n_splits"] for x in mem["scheduler"]["graphs"]}
    # llama-context.cpp sched_reserve: "graph%s: nodes = %s, splits = %s, ..."
    lines.append(f"sched_reserve: graph: nodes = 100 / 90, splits = {g['prompt']} / "
                 f"{g['generation']}, input objects = 1")
    rows = check.compare("case", mem, parse_buffers("\n".join(lines)))
    assert rows and all(r[5] == "equal" for r in rows), rows
    assert {r[2] for r in rows if r[1] == "compute"} == {"CUDA0", "CUDA_Host"}
    # one compute line off by 0.01 MiB: that row differs
    cuda0 = next(d for d in mem["devices"] if d["device"] == "CUDA0")["compute_bytes"]
    lines = [ln.replace(mib(cuda0), mib(cuda0 + (1 << 20) // 100 + 1))
             if "CUDA0 compute" in ln else ln for ln in lines]
    rows = check.compare("case", mem, parse_buffers("\n".join(lines)))
    assert [r[2] for r in rows if r[5] == "DIFFERS"] == ["CUDA0"]
