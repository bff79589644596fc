"""Vulkan devices without a GPU: the backend facts of specs/backends/vulkan.yaml (each cited
from ggml-vulkan) applied to compute buffers, with the numbers worked out by hand from the
ggml rules: which ops Vulkan runs (ggml_backend_vk_device_supports_op, device features as
options), the node reorder of ggml_vk_graph_optimize, which the allocator sees, and the
1 GiB suballocation block (get_max_size) that ggml-alloc splits a compute buffer by
(ggml_dyn_tallocr chunks, the sum of which llama.cpp logs)."""
from __future__ import annotations

import json

import pytest

from fixtures import write_llama
from graphcost.format import ggml_types as gt
from graphcost.graph.ops import Op
from graphcost.graph.settings import RunSettings
from graphcost.memory.alloc import MAX_CHUNKS, DynAllocator, reserved_chunks
from graphcost.memory.backends import load
from graphcost.memory.op_rules import Unmodelled, evaluate
from graphcost.memory.placement import PlacementFlags, parse_device, plan_devices
import test_devices_metal
from test_devices_cuda import tensor

AVX2 = frozenset({"avx2"})
T = gt.GGMLType
#: model(name): test_devices_metal's fixture models (llama2: 2 layers, n_embd 256, n_ff 768,
#: 8 heads of 32, 2 KV heads, vocab 300, output Q6_K; qwen3moe: 2 layers, n_embd 320,
#: 5 heads of 64 over 1 KV head, 4 experts of width 96, 2 used)
model = test_devices_metal.model


def _vk(node, **opts) -> bool:
    """ggml_backend_vk_device_supports_op: the tensor-size check, then the op's case."""
    rules = load("vulkan").supports_op
    return (evaluate(rules["require"], node, opts, "test")
            and evaluate(rules["ops"].get(str(node.op), rules["default"]), node, opts, "test"))


def _compute(m, dev: str, **settings) -> dict:
    """Compute bytes by device row for ``m`` on one device (-ngl all unless given)."""
    flags = PlacementFlags(cpu_features=AVX2, n_gpu_layers=settings.pop("ngl", -1))
    dp = plan_devices(m, RunSettings(ctx_size=512, **settings), [parse_device(dev)], flags)
    return {r.device: r.compute_bytes for r in dp.rows}


# ---- supports_op ---------------------------------------------------------------------------

def test_vulkan_tensor_size_check_before_the_switch():
    """Every source and the result must fit maxStorageBufferRange (2^32 - 1 by default) unless
    VK_EXT_shader_64bit_indexing, and maxBufferSize. The output weight, Q6_K [256, 300]:
    300 rows of one 256-element block (210 bytes) = 63,000 bytes."""
    w = tensor(T.Q6_K, (256, 300))
    assert w.nbytes == 300 * 210 == 63000
    mm = tensor(T.F32, (300, 7), "MUL_MAT", [w, tensor(T.F32, (256, 7))])
    assert _vk(mm)
    assert _vk(mm, storage_range="63000")          # <=: fits
    assert not _vk(mm, storage_range="62999")      # the weight is 1 byte over: to the CPU
    assert _vk(mm, storage_range="62999", int64_indexing="1")
    assert not _vk(mm, storage_range="62999", int64_indexing="1", max_buffer="62999")
    # sizes also with a unit, as --device's memory: 63KB = 63,000 bytes fits, 61.5KiB =
    # 62,976 does not
    assert _vk(mm, storage_range="63KB") and not _vk(mm, storage_range="61.5KiB")
    # IM2COL with shaderInt64 + bufferDeviceAddress is not bound by the storage range
    im = tensor(T.F32, (9, 64), "IM2COL", [tensor(T.F32, (3, 3)), tensor(T.F32, (8, 8))])
    assert _vk(im, storage_range="1") and not _vk(im, storage_range="1", bda="0")


@pytest.mark.parametrize("w,b,opts,ok", [
    (T.Q4_K, T.F32, {}, True),
    (T.F16, T.F16, {}, True),
    (T.BF16, T.F16, {}, False),       # no bf16 x f16 shader
    (T.Q4_0, T.BF16, {}, False),      # BF16 src1 only with BF16 src0
    (T.BF16, T.BF16, {}, True),
    (T.I32, T.F32, {}, False),        # not a src0 type with shaders
], ids=["q4_k", "f16-f16", "bf16-f16", "q4_0-bf16", "bf16-bf16", "i32"])
def test_vulkan_mul_mat_rule(w, b, opts, ok):
    node = tensor(T.F32, (64, 7), "MUL_MAT", [tensor(w, (256, 64)), tensor(b, (256, 7))])
    assert _vk(node, **opts) is ok


def test_vulkan_mul_mat_id_needs_its_shared_memory_tile():
    # 4 experts Q4_0 [256, 96], 2 used of 4 tokens: ids I32 [2, 4]
    ids = tensor(T.I32, (2, 4))
    mmid = tensor(T.F32, (96, 2, 4), "MUL_MAT_ID",
                  [tensor(T.Q4_0, (256, 96, 4)), tensor(T.F32, (256, 1, 4)), ids])
    assert _vk(mmid) and not _vk(mmid, mul_mat_id="0")


def _fa(k_type, v_type, d=64, dv=None, mask=T.F16):
    q = tensor(T.F32, (d, 7, 8))
    k, v = tensor(k_type, (d, 256, 2)), tensor(v_type, (dv or d, 256, 2))
    srcs = [q, k, v] + ([tensor(mask, (256, 7))] if mask is not None else [])
    return tensor(T.F32, (dv or d, 8, 7), "FLASH_ATTN_EXT", srcs, scale=1.0, max_bias=0.0)


@pytest.mark.parametrize("node,opts,ok", [
    (_fa(T.F16, T.F16), {}, True),
    (_fa(T.Q8_0, T.Q8_0), {}, True),
    (_fa(T.Q4_K, T.Q4_K), {}, False),            # not a K/V type with shaders
    (_fa(T.BF16, T.F16), {}, False),             # BF16 K needs BF16 V
    (_fa(T.F16, T.F16, d=68), {}, False),        # head sizes must be multiples of 8
    (_fa(T.F16, T.F16, mask=T.F32), {}, False),  # the mask must be F16
    (_fa(T.F16, T.F16), {"subgroup_shuffle": "0"}, True),  # coopmat2 serves it
    (_fa(T.F16, T.F16), {"subgroup_shuffle": "0", "coopmat2": "0"}, False),
], ids=["f16", "q8_0", "q4_k", "bf16-f16", "hs68", "f32-mask", "coopmat2", "no-subgroups"])
def test_vulkan_flash_attention_rule(node, opts, ok):
    assert _vk(node, **opts) is ok


def test_vulkan_rules_of_other_ops():
    x = tensor(T.F32, (64, 4))
    assert _vk(tensor(T.F32, (64, 4), Op.SILU, [x]))
    assert not _vk(tensor(T.BF16, (64, 4), Op.SILU, [tensor(T.BF16, (64, 4))]))  # F32/F16 only
    # ARGSORT: rows of any length with the Vulkan memory model, else up to 1024
    row = tensor(T.F32, (2048, 4))
    sort = tensor(T.I32, (2048, 4), "ARGSORT", [row])
    assert _vk(sort) and not _vk(sort, memory_model="0")
    assert _vk(tensor(T.I32, (1024, 4), "ARGSORT", [tensor(T.F32, (1024, 4))]), memory_model="0")
    # CUMSUM needs subgroup arithmetic with full subgroups
    cs = tensor(T.F32, (64, 4), "CUMSUM", [x])
    assert _vk(cs) and not _vk(cs, full_subgroups="0") and not _vk(cs, subgroup_arithmetic="0")
    # SOLVE_TRI: (N + K) floats of shared memory: (64 + 16) * 4 = 320 bytes
    st = tensor(T.F32, (16, 64), "SOLVE_TRI", [tensor(T.F32, (64, 64)), tensor(T.F32, (16, 64))])
    assert _vk(st, shared_memory="320") and not _vk(st, shared_memory="319")
    # an op the switch does not list is refused
    assert not _vk(tensor(T.F32, (64, 4), "WIN_PART", [x]))


def test_vulkan_lightning_indexer_is_not_modelled():
    """Its operands' buffer offsets must be multiples of minStorageBufferOffsetAlignment:
    where ggml-alloc puts them, which supports_op cannot know beforehand in graphcost."""
    q = tensor(T.F32, (128, 64, 4))
    li = tensor(T.F32, (256, 4), "LIGHTNING_INDEXER",
                [q, tensor(T.F16, (128, 256)), tensor(T.F32, (64, 4)), tensor(T.F16, (256, 4))])
    with pytest.raises(Unmodelled, match="LIGHTNING_INDEXER operand offset alignment"):
        _vk(li)
    assert not _vk(li, fp16="0")  # decided before the unmodelled part


def test_flash_attention_without_subgroups_runs_on_the_cpu(model):
    """-fa on with a GPU that has neither subgroup shuffle/vote nor coopmat2: every
    FLASH_ATTN_EXT goes to the CPU (2 layers: 2 nodes), the layers around it stay on Vulkan0,
    so the prompt graph has 2 more splits per layer (to the CPU and back) than with -fa on
    a default GPU; with -fa auto, llama.cpp's probe then turns flash attention off."""
    from graphcost.memory.sched import flash_attn_auto_fails
    llama2 = model("llama2")
    flags = PlacementFlags(cpu_features=AVX2)
    devs, splits = {}, {}
    for name, dev in (("default", "vulkan,align=64"),
                      ("none", "vulkan,align=64,subgroup_shuffle=0,coopmat2=0")):
        dp = plan_devices(llama2, RunSettings(ctx_size=512, flash_attn="on"),
                          [parse_device(dev)], flags)
        pp = dict(dp.compute.schedules)["prompt"]
        devs[name] = [pp.device_of(i) for i, n in enumerate(pp.nodes) if n.op == Op.FLASH_ATTN_EXT]
        splits[name] = dp.compute.n_splits("prompt")
    assert devs == {"default": ["Vulkan0"] * 2, "none": ["CPU"] * 2}
    assert splits["none"] == splits["default"] + 2 * 2
    settings = RunSettings(ctx_size=512, flash_attn="auto")
    dp = plan_devices(llama2, settings, [parse_device("vulkan,align=64,subgroup_shuffle=0,coopmat2=0")],
                      flags)
    msg = flash_attn_auto_fails(llama2, settings, dp.placement, flags)
    assert msg is not None and "layer 0 is on Vulkan0 but its flash attention on CPU" in msg


# ---- compute buffers -----------------------------------------------------------------------

def test_vulkan_compute_buffer_with_and_without_the_reorder(model):
    """Vulkan0's compute buffer for a 2-layer llama (-ngl all, 512-token prompt, -fa off) is
    set by a kq, F32 [512 cells, 512 tokens, 8 heads] = 512*512*8*4 = 8,388,608 bytes.
    Built order (graph_optimize=0): Qcur-0's RoPE runs while attn_norm-0 is still read by
    Vcur-0 and Kcur-0, so it takes a new block after Qcur-0's (2,891,776, 524,288 bytes:
    F32 [32, 8, 512]) that is still live at kq-0: kq-0 at 2,891,776 + 524,288 = 3,416,064,
    the buffer 3,416,064 + 8,388,608 = 11,804,672. ggml_vk_graph_optimize runs the V and K
    products beside Q's (they only read attn_norm-0), so layer 0's RoPE lands in attn_norm-0's
    freed block and kq-0 at 2,367,488; but in layer 1 it also pulls the output rows
    (GET_ROWS of l_out-0 by out_ids, F32 [256, 512] = 524,288 bytes), which read nothing of
    the layer, ahead of kq-1: they take Qcur-1's freed block [2,367,488, 2,891,776), and kq-1
    starts at 2,891,776: 2,891,776 + 8,388,608 = 11,280,384, one 524,288 block less."""
    llama2 = model("llama2")
    res = {}
    for dev in ("vulkan,align=64", "vulkan,align=64,graph_optimize=0"):
        flags = PlacementFlags(cpu_features=AVX2)
        dp = plan_devices(llama2, RunSettings(ctx_size=512, flash_attn="off"),
                          [parse_device(dev)], flags)
        pp = dict(dp.compute.schedules)["prompt"]
        off = {n.name: pp.alloc.offsets.get(id(n)) for n in pp.nodes}
        order = [n.name for n in pp.nodes]
        res[dev] = ({r.device: r.compute_bytes for r in dp.rows}["Vulkan0"], off, order)
    c_on, on, order_on = res["vulkan,align=64"]
    c_off, off, order_off = res["vulkan,align=64,graph_optimize=0"]
    assert off["kq-0"] == 2891776 + 524288 == 3416064 and c_off == 3416064 + 8388608 == 11804672
    assert on["kq-0"] == 2367488
    assert order_on.index("node_66") < order_on.index("kq-1") < order_off.index("node_66")
    assert on["node_66"] == 2367488 and on["kq-1"] == 2891776
    assert c_on == 2891776 + 8388608 == 11280384 == c_off - 524288


def test_vulkan_flash_attention_and_moe_figures(model):
    """-fa on needs no kq: the 2-layer llama's Vulkan0 buffer drops to 6,303,744 bytes
    (6,828,032 in the built order); qwen3moe (MUL_MAT_ID experts, its top-k routing kept
    together by the reorder) with and without flash attention, and the CPU's Vulkan_Host
    buffer (inputs, output rows) beside them, which the reorder does not touch."""
    fig = {}
    for name in ("llama2", "qwen3moe"):
        for fa in ("on", "off"):
            for opt in ("", ",graph_optimize=0"):
                fig[name, fa, opt] = _compute(model(name), "vulkan,align=64" + opt, flash_attn=fa)
    assert fig["llama2", "on", ""] == {"Vulkan0": 6303744, "CPU": 0, "Vulkan_Host": 1587200}
    assert fig["llama2", "on", ",graph_optimize=0"]["Vulkan0"] == 6828032
    assert fig["llama2", "off", ""]["Vulkan0"] == 11280384
    assert {k[2]: v["Vulkan0"] for k, v in fig.items() if k[:2] == ("qwen3moe", "on")} == {
        "": 3182592, ",graph_optimize=0": 3813376}
    assert {k[2]: v["Vulkan0"] for k, v in fig.items() if k[:2] == ("qwen3moe", "off")} == {
        "": 8527872, ",graph_optimize=0": 9183232}
    assert all(fig[n, fa, ""]["Vulkan_Host"] == fig[n, fa, ",graph_optimize=0"]["Vulkan_Host"]
               for n in ("llama2", "qwen3moe") for fa in ("on", "off"))


def test_vulkan_host_compute_alignment_is_min_memory_map_alignment(model):
    """-ngl 1: only the output layer on Vulkan0 (i_gpu_start = 2 + 1 - 1 = 2), both layers'
    weights on the CPU; the prompt's products still run on Vulkan0 (offload_op: a batch of
    512 >= 32), the rest on the CPU, whose compute buffer type is Vulkan_Host (the first
    device's host buffer type), aligned to minMemoryMapAlignment (map_align, default 64),
    not to Vulkan0's align. A 4,096-byte map alignment rounds every block up to a page:
    inp_tokens, I32 [512] = 2,048 bytes, takes 4,096."""
    llama2 = model("llama2")
    c64 = _compute(llama2, "vulkan,align=64", ngl=1, flash_attn="off")
    c4k = _compute(llama2, "vulkan,align=64,map_align=4096", ngl=1, flash_attn="off")
    assert c64["Vulkan0"] == c4k["Vulkan0"]  # map_align is the host buffer type's only
    assert c64["Vulkan_Host"] % 64 == 0 and c4k["Vulkan_Host"] % 4096 == 0
    assert c4k["Vulkan_Host"] > c64["Vulkan_Host"] > 0


# ---- chunks: get_max_size (the suballocation block) ---------------------------------------

def test_dyn_allocator_chunks_worked_example():
    """ggml_dyn_tallocr with max_chunk_size 256 and alignment 32 (sizes rounded up to 32)."""
    d = DynAllocator(32, max_chunk_size=256)
    assert d.alloc_at(200) == (0, 0)    # 224 bytes: chunk 0 opens with one 256-byte block
    assert d.alloc_at(64) == (1, 0)     # chunk 0's last block [224, 256) is 32 bytes: new chunk
    assert d.alloc_at(300) == (2, 0)    # 320 > 256: a chunk of max(320, 256) = 320, now full
    assert d.chunk_max == [224, 64, 320] and d.max_size == 224 + 64 + 320 == 608
    d.free(0, 200, chunk=0)             # [0, 224) joins chunk 0's free tail: [0, 256)
    # 128 bytes: no hole but chunks' last blocks; chunk 0's wastes 224 - 0 - 128 = 96 >= 0,
    # chunk 1's would grow it (64 - 64 - 128 < 0): chunk 0, within its high-water mark
    assert d.alloc_at(100) == (0, 0)
    assert d.alloc_at(96) == (0, 128)   # reuse 224 - 128 - 96 = 0: an exact fit
    # 64 bytes: chunk 0's tail [224, 256) is too small; chunk 1 grows by 64
    assert d.alloc_at(64) == (1, 64)
    assert d.chunk_max == [224, 128, 320] and d.max_size == 672


def test_the_sixteenth_chunk_is_unbounded():
    """GGML_VBUFFER_MAX_CHUNKS = 16: the last chunk ggml_dyn_tallocr_new_chunk makes gets
    SIZE_MAX/2 bytes, so 32-byte blocks that fill a 32-byte chunk each open chunks 0..15 and
    then stay in chunk 15."""
    d = DynAllocator(32, max_chunk_size=32)
    assert [d.alloc_at(32)[0] for _ in range(MAX_CHUNKS + 2)] == list(range(16)) + [15, 15]
    assert d.max_size == 18 * 32


def test_reserved_chunks_follow_ggml_gallocr_reserve_n():
    """A graph reallocates the buffer to its own chunks when one of them is larger than the
    buffer's chunk of that index; sched_reserve runs prompt, generation, prompt."""
    assert reserved_chunks([(10,), (5,), (10,)]) == (10,)          # one chunk: the largest
    assert reserved_chunks([(10, 2), (9, 5)]) == (9, 5)            # chunk 1 grew: realloc
    assert reserved_chunks([(10, 2), (9, 5), (10, 2)]) == (10, 2)  # and back with the prompt
    assert reserved_chunks([(10, 2), (10,)]) == (10, 2)            # nothing larger: kept


def test_compute_buffer_split_by_a_small_suballocation_block(model):
    """suballoc=4MiB (GGML_VK_SUBALLOCATION_BLOCK_SIZE): the llama2 prompt's kq blocks
    (8,388,608 bytes) fit no 4 MiB chunk, so kq-0 opens chunk 1 of max(8,388,608, 4 MiB)
    bytes and kq-1 reuses it (reuse factor 8,388,608 - 0 - 8,388,608 = 0); chunk 0 keeps
    everything else, up to Kcur-1's end, 3,022,848 + 131,072 = 3,153,920. llama.cpp logs the
    sum, 3,153,920 + 8,388,608 = 11,542,528: 262,144 bytes more than one 1 GiB chunk
    (11,280,384), where kq-1 overlapped the V and K products' freed blocks."""
    llama2 = model("llama2")
    flags = PlacementFlags(cpu_features=AVX2)
    dp = plan_devices(llama2, RunSettings(ctx_size=512, flash_attn="off"),
                      [parse_device("vulkan,align=64,suballoc=4MiB")], flags)
    assert dp.compute.chunks_by_buft["Vulkan0"] == (3153920, 8388608)
    assert {r.device: r.compute_bytes for r in dp.rows}["Vulkan0"] == 3153920 + 8388608 == 11542528
    assert 11542528 - 11280384 == 262144
    default = plan_devices(llama2, RunSettings(ctx_size=512, flash_attn="off"),
                           [parse_device("vulkan,align=64")], flags)
    assert default.compute.chunks_by_buft["Vulkan0"] == (11280384,)


# ---- the command line ----------------------------------------------------------------------

def test_memory_json_carries_vulkan_compute(tmp_path, cli):
    f = write_llama(tmp_path / "m.gguf", n_layer=2)
    r = cli("memory", f.path, "--device", "vulkan:16GiB,align=64", "-ngl", "all", "-c", "512",
            "-fa", "off", "--format", "json")
    assert r.returncode == 0, r.stderr
    devs = {d["device"]: d for d in json.loads(r.stdout)["memory"]["devices"]}
    assert devs["Vulkan0"]["compute_bytes"] == 11280384
    assert devs["Vulkan_Host"]["compute_bytes"] > 0


@pytest.mark.parametrize("dev,msg", [
    ("vulkan,align=64,suballoc=lots", "use a size like"),
    ("vulkan,align=64,map_align=48", "map_align=48: use a power of 2"),
    ("vulkan,align=64,coopmat=1", "unknown option 'coopmat'"),
    # a repeated option was taken silently, the last value winning (QA sweep 2026-11-27)
    ("vulkan,align=64,align=256", "option 'align' is given twice"),
    ("vulkan,align=64,FP16=0,fp16=1", "option 'fp16' is given twice"),
], ids=["suballoc", "map-align", "unknown", "repeated", "repeated-any-case"])
def test_bad_vulkan_options_are_one_line(tmp_path, cli, dev, msg):
    f = write_llama(tmp_path / "m.gguf", n_layer=2)
    r = cli("memory", f.path, "--device", dev, "-c", "512")
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_host_buffer_weights_take_the_host_types_facts(model):
    """--no-mmap: the CPU layers' weights go to the first device's pinned host buffer type,
    whose alignment and get_alloc_size are not the device's: CUDA_Host takes the CPU's (32,
    ggml_nbytes), so blk.0.ffn_down, Q4_K [768, 256] = 256 rows x 3 blocks x 144 bytes =
    110,592 bytes, gets no 512-element row padding there (on CUDA0: 110,592 + 144 = 110,736,
    padded to 128: 110,848); Vulkan_Host takes minMemoryMapAlignment (map_align), so
    blk.0.attn_norm, F32 [256] = 1,024 bytes, stays 1,024 at 64 and becomes 4,096 at 4,096."""
    llama2 = model("llama2")
    s = RunSettings(ctx_size=512)
    flags = PlacementFlags(n_gpu_layers=2, cpu_features=AVX2, load_mode="none", repack=False)

    def weights(dev):
        dp = plan_devices(llama2, s, [parse_device(dev)], flags)
        return {(w.name, w.buft.name): w.bytes for w in dp.placement.weights}
    cuda = weights("cuda")
    assert cuda[("blk.0.ffn_down.weight", "CUDA_Host")] == 256 * 3 * 144 == 110592
    assert cuda[("blk.1.ffn_down.weight", "CUDA0")] == 110848
    assert weights("vulkan,align=64")[("blk.0.attn_norm.weight", "Vulkan_Host")] == 1024
    assert weights("vulkan,align=64,map_align=4096")[("blk.0.attn_norm.weight", "Vulkan_Host")] == 4096


def test_chunked_allocation_equals_ggml_alloc(capsys):
    """benchmarks/check_alloc_chunks.py: ggml-alloc.c itself (the tools build's
    libggml-base.so) sizes graphcost's graphs (llama with and without flash attention at 512
    and 7 tokens, gpt2, qwen3moe; each in its built order and in ggml_vk_graph_optimize's)
    for a buffer type of alignment 64 or 32 and max size SIZE_MAX, 4 MiB, 1 MiB, 256 KiB,
    100,000 bytes and 4 KiB (one chunk per tensor, up to the 16th, unbounded): every buffer
    size equals graphcost's; and reserving the prompt, a 1-token graph and the prompt again
    on one allocator (ggml_gallocr_reserve_n) gives after each the size reserved_chunks gives
    (in 5 of those runs the 1-token graph has a larger first chunk and shrinks the buffer to
    its own, which the prompt then restores)."""
    from test_reorder import run_ggml_check
    check, rows = run_ggml_check("check_alloc_chunks", capsys)
    assert len(rows) == 3 * len(check.CASES) == 15
    assert all(" equal " in ln for ln in rows), rows
    # the 4 MiB limit splits the 512-token llama's compute buffer (fa off): more bytes
    built = next(ln for ln in rows if ln.startswith("llama fa=off, 512") and " built " in ln)
    sizes = [int(x) for x in built.split("equal")[1].split()]
    assert sizes[1] > sizes[0]


def test_supports_op_equals_ggmls_own_code(capsys):
    """benchmarks/check_vulkan_supports_op.py: ggml_backend_vk_device_supports_op and its
    helpers copied verbatim from the vendored ggml-vulkan source, compiled beside a stub
    device set from the same device options, answer every node of 10 graphs (llama with and
    without flash attention, q8_0 caches, gpt2, qwen3moe, glm4moe, qwen3next) under 11
    option sets (the defaults, no subgroups, small storage ranges with and without 64-bit
    indexing, a small maxBufferSize, no MUL_MAT_ID tile, no memory model, ...) as the spec's
    rules do; some sets refuse nodes (a case with flash attention and no subgroups: its FA
    nodes)."""
    from test_reorder import run_ggml_check
    check, rows = run_ggml_check("check_vulkan_supports_op", capsys)
    assert len(rows) == len(check.CASES) * len(check.OPTIONS) == 110
    assert all(ln.endswith(" equal") for ln in rows), rows
    refused = [int(ln.split()[-3]) for ln in rows]
    assert sum(1 for r in refused if r) >= 30  # the option sets do refuse nodes
