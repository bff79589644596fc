"""Placement without llama.cpp: the layer split, buffer-type choice (-ot, --cpu-moe,
--n-cpu-moe, CPU_REPACK), model and KV buffers per device, backend facts, and the
``graphcost memory --device`` command. Agreement with real llama.cpp multi-device runs is
in tests/test_devices_rpc.py."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fixtures import write_llama
from fixtures_moe import write_gemma2, write_mixtral, write_qwen3moe
from fixtures_simple import write_cohere2
from graphcost.format import ggml_types as gt
from graphcost.memory.backends import host_cpu_features, load, names
from graphcost.graph.build import load_model
from graphcost.errors import GraphcostError
from graphcost.memory.placement import (DeviceArg, PlacementFlags, alloc_size, cpu_moe_override, layer_devices, n_cpu_moe_overrides, parse_device, parse_overrides, place, plan_devices, resolve_devices)
from graphcost.graph.settings import RunSettings
from graphcost.units import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
AVX2 = frozenset({"avx2"})
RPC2 = [DeviceArg("rpc"), DeviceArg("rpc")]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def llama5(tmp_path_factory):
    # 5 layers, n_embd 256, 8 heads of 32, 2 KV heads, n_ff 768, vocab 300; types per
    # tests/fixtures.py LLAMA_DEFAULT_TYPES: attn_q/ffn_gate Q4_0, attn_output/ffn_down Q4_K,
    # attn_k F16, attn_v/ffn_up/token_embd Q8_0, output Q6_K
    return load_model(write_llama(tmp_path_factory.mktemp("pl") / "llama5.gguf", n_layer=5).path)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return load_model(write_mixtral(tmp_path_factory.mktemp("pl") / "mixtral.gguf", n_layer=4).path)


@pytest.fixture(scope="module")
def qwen3moe(tmp_path_factory):
    # tied embeddings: no output.weight
    return load_model(write_qwen3moe(tmp_path_factory.mktemp("pl") / "q3moe.gguf").path)


def _file_end(m) -> int:
    return max(t.offset + t.nbytes for t in m.tensors.values())


# ---- backend facts ---------------------------------------------------------------------------

def test_every_backend_file_loads_with_a_source_for_every_fact():
    assert {"cpu", "cuda", "metal", "vulkan", "rpc", "rocm", "sycl"} <= set(names())
    for n in names():
        b = load(n)
        assert set(b.sources) >= {"alignment", "max_buffer_size", "alloc_padding", "host_buffer",
                                  "buffer_from_host_ptr", "mmap_support"}
        assert all(".c" in src or ".m" in src for src in b.sources.values()), n
    assert load("cuda").alignment == 128 and load("cuda").row_padding == 512
    assert load("cpu").alignment == 32 and load("vulkan").alignment is None


def test_unknown_device_kind_is_one_line():
    with pytest.raises(GraphcostError, match="unknown device kind 'tpu'"):
        load("tpu")


def test_cuda_pads_quantized_rows_to_512():
    cuda, cpu = load("cuda"), load("cpu")
    # Q4_0 [256, 256]: 256 rows x 8 blocks x 18 bytes = 36864; CUDA adds the row size of
    # 512 - 256 % 512 = 256 elements = 8 blocks x 18 = 144 bytes
    assert alloc_size(cuda, gt.GGMLType.Q4_0, (256, 256), 36864) == 36864 + 144
    assert alloc_size(cuda, gt.GGMLType.Q4_0, (1024, 4), 4 * 32 * 18) == 4 * 32 * 18
    assert alloc_size(cuda, gt.GGMLType.F16, (256, 64), 32768) == 32768  # not quantized
    assert alloc_size(cpu, gt.GGMLType.Q4_0, (256, 256), 36864) == 36864


def test_host_cpu_features_reads_cpuinfo(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text("processor : 0\nflags : fpu sse avx2 avx512f avx512_vnni\n")
    assert host_cpu_features(str(p)) == {"avx2", "avx512", "avx512_vnni"}
    assert host_cpu_features(str(tmp_path / "none")) == frozenset()


# ---- layers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("ngl, ts, layers, output", [
    # i_gpu_start = 6 - 3 = 3; layers 3, 4 at x = 0, 1/3 < 0.5 -> RPC0; output 2/3 -> RPC1
    (3, (1, 1), ["CPU"] * 3 + ["RPC0"] * 2, "RPC1"),
    # all 6: x = il/6; splits [0.75, 1]: 0 .. 4/6 -> RPC0, output 5/6 -> RPC1
    (-1, (3, 1), ["RPC0"] * 5, "RPC1"),
    (0, (1, 1), ["CPU"] * 5, "CPU"),
    # ngl 1: only the output layer
    (1, (1, 1), ["CPU"] * 5, "RPC0"),
    # ts 0,1: everything on RPC1 (upper_bound skips the empty first split)
    (-1, (0, 1), ["RPC1"] * 5, "RPC1"),
], ids=["ngl3", "all-3to1", "ngl0", "ngl1-output", "ts0,1"])
def test_layer_split(llama5, ngl, ts, layers, output):
    devs = resolve_devices(RPC2, PlacementFlags())
    assert layer_devices(llama5, devs, PlacementFlags(n_gpu_layers=ngl, tensor_split=ts)) == (layers, output)


def test_layer_split_is_float32_upper_bound(tmp_path):
    # 2 layers + output on ts 1,2: splits [f32(1/3), 1]; layer 1 sits at x = f32(1/3),
    # equal to the first split point, and upper_bound puts it on the second device
    m = load_model(write_llama(tmp_path / "l2.gguf", n_layer=2).path)
    devs = resolve_devices(RPC2, PlacementFlags())
    assert layer_devices(m, devs, PlacementFlags(tensor_split=(1, 2))) == (["RPC0", "RPC1"], "RPC1")


def test_split_by_free_memory_needs_the_memory(llama5):
    devs = resolve_devices([DeviceArg("cuda", 3 << 30), DeviceArg("cuda", 1 << 30)], PlacementFlags())
    assert layer_devices(llama5, devs, PlacementFlags()) == (["CUDA0"] * 5, "CUDA1")
    with pytest.raises(GraphcostError, match="give its free memory"):
        layer_devices(llama5, resolve_devices(RPC2, PlacementFlags()), PlacementFlags())


def test_device_order_and_names():
    devs = resolve_devices([DeviceArg("cuda"), DeviceArg("rpc"), DeviceArg("cuda"), DeviceArg("rpc")],
                           PlacementFlags())
    assert [d.name for d in devs] == ["RPC0", "RPC1", "CUDA0", "CUDA1"]  # RPC at the front
    assert [d.name for d in resolve_devices(RPC2, PlacementFlags(split_mode="none", main_gpu=1))] == ["RPC1"]
    with pytest.raises(GraphcostError, match="-sm row"):
        resolve_devices(RPC2, PlacementFlags(split_mode="row"))
    with pytest.raises(GraphcostError, match="-mg 2"):
        resolve_devices(RPC2, PlacementFlags(split_mode="none", main_gpu=2))


# ---- buffers ---------------------------------------------------------------------------------

def test_cpu_only_mapped_buffer_spans_the_file(llama5):
    p = place(llama5, [], PlacementFlags(repack=False))
    assert [(b.name, b.bytes) for b in p.model_buffers] == [("CPU_Mapped", _file_end(llama5))]
    # without mmap: every tensor padded to 32; all sizes are multiples of 32 but
    # output.weight Q6_K [256, 300]: 300 x 210 = 63000 -> 63008
    p = place(llama5, [], PlacementFlags(repack=False, load_mode="none"))
    assert [(b.name, b.bytes) for b in p.model_buffers] == [
        ("CPU", sum(t.nbytes for t in llama5.tensors.values()) + 8)]


def test_repack_takes_q4_0_and_q4_k_matmul_weights_with_avx2(llama5):
    p = place(llama5, [], PlacementFlags(cpu_features=AVX2))
    got = {b.name: b.bytes for b in p.model_buffers}
    # per layer: attn_q Q4_0 [256,256] 36864 + attn_output Q4_K [256,256] 36864
    #          + ffn_gate Q4_0 [256,768] 110592 + ffn_down Q4_K [768,256] 110592 = 294912
    assert got["CPU_REPACK"] == 5 * 294912
    # the mapped range starts at token_embd (offset 0) and, the last tensor
    # blk.4.ffn_down being repacked, ends at blk.4.ffn_up's end (gaps included)
    up = llama5.tensors["blk.4.ffn_up.weight"]
    assert got["CPU_Mapped"] == up.offset + up.nbytes
    assert len(p.repacked) == 20
    # output.weight Q6_K: no x86 layout; token_embd: GET_ROWS, never repacked
    assert "output.weight" not in p.repacked and "token_embd.weight" not in p.repacked


AMX = frozenset({"avx2", "avx512", "avx512_vnni", "amx_int8"})


def test_amx_comes_before_repack_and_packs_its_rows(llama5):
    """AMX (ggml_backend_cpu_get_extra_buffer_types' first) takes every MUL_MAT weight whose
    rows are a multiple of 32 and whose type it knows; it packs Q8_0 with an int32 a block
    and Q4_K with 4 bytes a block (amx/mmq.cpp get_row_size); F16 as it is."""
    p = place(llama5, [], PlacementFlags(cpu_features=AMX))
    got = {b.name: b.bytes for b in p.model_buffers}
    # per layer, [ne0, ne1]: attn_q Q4_0 [256,256]: 256 x 8 x 18 = 36864
    #   attn_k F16 [256,64]: 32768 (not packed)   attn_v Q8_0 [256,64]: 64 x 8 x (34+4) = 19456
    #   attn_output Q4_K [256,256]: 256 x 1 x (144+4) = 37888
    #   ffn_gate Q4_0 [256,768]: 110592   ffn_down Q4_K [768,256]: 256 x 3 x 148 = 113664
    #   ffn_up Q8_0 [256,768]: 768 x 8 x 38 = 233472          sum 584704
    assert got["AMX"] == 5 * (36864 + 32768 + 19456 + 37888 + 110592 + 113664 + 233472)
    assert 36864 + 32768 + 19456 + 37888 + 110592 + 113664 + 233472 == 584704
    # output.weight Q6_K [256, 300]: 300 % 32 != 0, and no x86 repack layout: mapped
    assert "CPU_REPACK" not in got and "output.weight" not in p.repacked
    assert len(p.repacked) == 35
    # without amx_int8 the type is not compiled in: CPU_REPACK as before
    p = place(llama5, [], PlacementFlags(cpu_features=AMX - {"amx_int8"}))
    assert "AMX" not in {b.name for b in p.model_buffers}
    assert {b.name: b.bytes for b in p.model_buffers}["CPU_REPACK"] == 5 * 294912


def test_amx_alignment_rules():
    from graphcost.memory.backends import load
    from graphcost.memory.placement import amx_layout, extra_alloc_size
    amx = next(e for e in load("cpu").extra_buffer_types if e.name == "AMX")
    assert amx_layout(amx, "Q4_K", (512, 96), "MUL_MAT")
    assert not amx_layout(amx, "Q4_K", (512, 80), "MUL_MAT")      # 80 rows: not a multiple of 32
    assert not amx_layout(amx, "Q4_K", (384, 96), "MUL_MAT")      # 384 % 256 != 0
    assert amx_layout(amx, "Q4_0", (96, 32), "MUL_MAT")           # Q4_0: ne0 % 32
    assert not amx_layout(amx, "Q5_0", (256, 32), "MUL_MAT")      # no AMX kernel for Q5_0
    assert not amx_layout(amx, "Q4_0", (256, 32), "GET_ROWS")     # MUL_MAT only
    assert not amx_layout(amx, "Q4_0", (256, 32, 8), "MUL_MAT_ID")
    # IQ4_XS [512, 64]: 64 rows x 2 blocks x (136 + 2) = 17664; Q6_K: 64 x 2 x 210 = 26880
    assert extra_alloc_size(amx, gt.GGMLType.IQ4_XS, (512, 64), 0) == 17664
    assert extra_alloc_size(amx, gt.GGMLType.Q6_K, (512, 64), 0) == 26880
    assert extra_alloc_size(amx, gt.GGMLType.F16, (512, 64), 65536) == 65536


def test_repack_on_arm_dotprod_takes_q8_0_too(llama5):
    p = place(llama5, [], PlacementFlags(cpu_features=frozenset({"neon", "dotprod"})))
    # + attn_v Q8_0 [256,64] 17408 + ffn_up Q8_0 [256,768] 208896 per layer; output Q6_K
    # [256,300]: 300 % 8 != 0, stays
    assert {b.name: b.bytes for b in p.model_buffers}["CPU_REPACK"] == 5 * (294912 + 17408 + 208896)


def test_no_cpu_features_no_repack(llama5):
    p = place(llama5, [], PlacementFlags(cpu_features=frozenset()))
    assert [b.name for b in p.model_buffers] == ["CPU_Mapped"] and p.repacked == []


def test_rpc_buffers_are_allocated_tensor_sums(llama5):
    p = place(llama5, RPC2, PlacementFlags(n_gpu_layers=3, tensor_split=(1, 1), cpu_features=AVX2))
    got = {b.name: b.bytes for b in p.model_buffers}
    layer = sum(t.nbytes for n, t in llama5.tensors.items() if n.startswith("blk.3."))
    # layer: 2 norms 1024 + q 36864 + k 32768 + v 17408 + o 36864 + gate 110592 + up 208896
    #        + down 110592 = 556032 (all multiples of 32)
    assert layer == 556032
    assert got["RPC0"] == 2 * layer
    # output layer: output_norm 1024 + output Q6_K 63000 -> padded to 63008
    assert got["RPC1"] == 1024 + 63008
    assert got["CPU_REPACK"] == 3 * 294912


def test_kv_follows_its_layer_unless_nkvo(llama5):
    s = RunSettings(ctx_size=512)
    # K and V per layer: 2 KV heads x 32 x 512 cells x 2 bytes = 65536 each
    dp = plan_devices(llama5, s, RPC2, PlacementFlags(n_gpu_layers=3, tensor_split=(1, 1)))
    kv = {r.device: r.kv_bytes for r in dp.rows}
    assert kv == {"RPC0": 2 * 131072, "RPC1": 0, "CPU": 3 * 131072}
    dp = plan_devices(llama5, s, RPC2, PlacementFlags(n_gpu_layers=3, tensor_split=(1, 1),
                                                      no_kv_offload=True))
    assert {r.device: r.kv_bytes for r in dp.rows} == {"RPC0": 0, "RPC1": 0, "CPU": 5 * 131072}
    assert sum(kv.values()) == dp.plan.kv_cache_bytes


def test_compute_is_the_plan_without_devices_and_not_modelled_without_an_alignment(llama5):
    s = RunSettings(ctx_size=512)
    alone = plan_devices(llama5, s, [], PlacementFlags(cpu_features=frozenset()))
    assert [r.compute_bytes for r in alone.rows] == [alone.plan.compute_buffer_bytes]
    assert alone.rows[0].output_bytes == 300 * 4  # n_vocab floats
    embd = plan_devices(llama5, replace(s, embeddings=True), [], PlacementFlags())
    assert embd.rows[0].output_bytes == embd.plan.output_buffer_bytes == (300 + 256) * 4
    # a Vulkan device's buffer alignment (minStorageBufferOffsetAlignment) is its own: not
    # given (no align=N), no compute buffer is modelled, the CPU's included
    dp = plan_devices(llama5, s, [parse_device("vulkan")], PlacementFlags())
    assert dp.compute is None
    assert all(r.compute_bytes is None for r in dp.rows if r.device != "CPU_REPACK")
    assert ("compute buffers not modelled: Vulkan0: its buffer alignment is device-dependent "
            "(give --device vulkan,align=N)") in dp.placement.notes


# ---- overrides -------------------------------------------------------------------------------

def test_cpu_moe_and_n_cpu_moe_patterns_are_llama_cpps():
    assert cpu_moe_override().pattern == r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    pats = [o.pattern for o in n_cpu_moe_overrides(2)]
    assert pats == [r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
                    r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
    assert parse_overrides(["exps=CPU,attn_q=RPC0"])[1].target == "RPC0"
    with pytest.raises(GraphcostError, match="PATTERN=BUFFER_TYPE"):
        parse_overrides(["exps"])


def _exps_bytes(m, layers) -> int:
    return sum(t.nbytes for n, t in m.tensors.items()
               if "_exps" in n and int(n.split(".")[1]) in layers)


def test_cpu_moe_moves_every_expert_to_the_cpu(mixtral):
    flags = PlacementFlags(tensor_split=(1, 1), cpu_features=frozenset(), load_mode="none",
                           overrides=(cpu_moe_override(),))
    p = place(mixtral, RPC2, flags)
    base = place(mixtral, RPC2, PlacementFlags(tensor_split=(1, 1), cpu_features=frozenset(),
                                               load_mode="none"))
    got = {b.name: b.bytes for b in p.model_buffers}
    was = {b.name: b.bytes for b in base.model_buffers}
    assert got["CPU"] - was["CPU"] == _exps_bytes(mixtral, range(4))
    assert was["RPC0"] + was["RPC1"] - got["RPC0"] - got["RPC1"] == _exps_bytes(mixtral, range(4))


def test_n_cpu_moe_moves_the_first_layers_experts(mixtral):
    kw = dict(tensor_split=(1, 1), cpu_features=frozenset(), load_mode="none")
    p = place(mixtral, RPC2, PlacementFlags(overrides=tuple(n_cpu_moe_overrides(1)), **kw))
    base = place(mixtral, RPC2, PlacementFlags(**kw))
    d = {b.name: b.bytes for b in p.model_buffers}
    b0 = {b.name: b.bytes for b in base.model_buffers}
    # layers 0-1 on RPC0 (x = 0, 1/5 < 0.5); layer 0's experts go to the CPU
    assert b0["RPC0"] - d["RPC0"] == _exps_bytes(mixtral, [0]) == d["CPU"] - b0["CPU"]


def test_tied_output_is_duplicated_on_its_device(qwen3moe):
    p = place(qwen3moe, RPC2, PlacementFlags(tensor_split=(1, 1), cpu_features=frozenset()))
    names_on = {(w.name, w.buft.name) for w in p.weights}
    # input copy on the CPU (mapped), output copy on the output device
    assert ("token_embd.weight", "CPU") in names_on and ("token_embd.weight", "RPC1") in names_on
    p0 = place(qwen3moe, RPC2, PlacementFlags(n_gpu_layers=0, cpu_features=frozenset()))
    # both on the CPU: the duplicate is the same tensor (one copy)
    assert sum(1 for w in p0.weights if w.name == "token_embd.weight") == 1


@pytest.mark.parametrize("writer", [write_gemma2, write_cohere2], ids=["gemma2", "cohere2"])
def test_tied_output_of_a_family_gguf_lists_no_output_for(tmp_path, writer):
    # gguf's MODEL_TENSORS lists no OUTPUT for gemma2 or cohere2, yet their loaders create
    # token_embd again as the output (src/models/gemma2.cpp, cohere2.cpp:
    # TENSOR_DUPLICATED); the spec's lm_head says so. Before: "scheduler: no placement
    # for weight token_embd.weight" on any device.
    m = load_model(writer(tmp_path / "m.gguf").path)
    p = place(m, RPC2, PlacementFlags(tensor_split=(1, 1), cpu_features=frozenset()))
    names_on = {(w.name, w.buft.name) for w in p.weights}
    assert ("token_embd.weight", "CPU") in names_on and ("token_embd.weight", "RPC1") in names_on
    r = cli("memory", m.header.path, "--device", "rpc", "--device", "rpc", "-ngl", "all",
            "-ts", "1,1", "-c", "512", "--cpu-features", "none", "--format", "json")
    assert r.returncode == 0, r.stderr


def test_encoder_has_no_tied_output(tmp_path):
    from fixtures_encoder import write_bert
    m = load_model(write_bert(tmp_path / "b.gguf").path)
    p = place(m, RPC2, PlacementFlags(tensor_split=(1, 1), cpu_features=frozenset()))
    # token_embd only once, as the input layer's (no lm_head in specs/arch/bert.yaml)
    assert [w.buft.name for w in p.weights if w.name == "token_embd.weight"] == ["CPU"]


def test_recurrent_state_per_device(tmp_path):
    # lfm2: each short-conv layer keeps cache_r = (l_cache - 1) * n_embd F32 values of one
    # cell (-np 1) = 2 * 160 * 4 = 1280 B and an empty cache_s (n_embd_s = 0), on its
    # layer's device (llama_memory_recurrent: dev_layer(il) when offload_kqv), the CPU's
    # with -nkvo; RPC alignment 32 divides 1280. Before: 0 in every row.
    from fixtures_hybrid import LFM2_PATTERN, write_lfm2
    from graphcost.memory.placement import plan_devices
    m = load_model(write_lfm2(tmp_path / "l.gguf").path)
    conv = [il for il, c in enumerate(LFM2_PATTERN) if c]
    for nkvo in (False, True):
        dp = plan_devices(m, RunSettings(ctx_size=512), RPC2,
                          PlacementFlags(tensor_split=(1, 1), no_kv_offload=nkvo,
                                         cpu_features=frozenset()))
        rows = {r.device: r.recurrent_state_bytes for r in dp.rows}
        want = {}
        for il in conv:
            row = "CPU" if nkvo else dp.placement.dev_layer[il]
            want[row] = want.get(row, 0) + 1280
        assert {k: v for k, v in rows.items() if v} == want
        assert sum(rows.values()) == 1280 * len(conv) == dp.plan.recurrent_state_bytes


# ---- the command -----------------------------------------------------------------------------

def test_parse_bytes():
    assert parse_bytes("24GiB", "x") == 24 << 30 and parse_bytes("24105MiB", "x") == 24105 << 20
    with pytest.raises(GraphcostError):
        parse_bytes("lots", "--device cuda:")


def test_memory_json_devices(tmp_path):
    f = write_llama(tmp_path / "m.gguf", n_layer=5)
    r = cli("memory", f.path, "--device", "rpc", "--device", "rpc", "-ngl", "3", "-ts", "1,1",
            "-c", "512", "--cpu-features", "avx2", "--format", "json")
    assert r.returncode == 0, r.stderr
    devs = json.loads(r.stdout)["memory"]["devices"]
    assert [d["device"] for d in devs] == ["RPC0", "RPC1", "CPU", "CPU_REPACK"]
    assert set(devs[0]) >= {"device", "model_bytes", "kv_bytes", "recurrent_state_bytes",
                            "compute_bytes", "output_bytes"}
    # RPC0's compute buffer: llama.cpp logs 6.0117 MiB for this model and these flags
    # (tests/test_devices_rpc.py, case ngl3, checks it to the byte on the RPC server)
    assert devs[0]["compute_bytes"] == 6303744 and devs[0]["kv_bytes"] == 2 * 131072
    sched = json.loads(r.stdout)["memory"]["scheduler"]
    assert [g["n_splits"] for g in sched["graphs"]] == [3, 3] and sched["n_copies"] == 1
    assert devs[3]["model_bytes"] == 3 * 294912
    # --embeddings is not dropped with devices: n_vocab + n_embd floats per output
    r = cli("memory", f.path, "--embeddings", "-c", "512", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = {d["device"]: d["output_bytes"] for d in json.loads(r.stdout)["memory"]["devices"]}
    assert out["CPU"] == (300 + 256) * 4 and sum(out.values()) == out["CPU"]


def test_memory_text_shows_not_modelled(tmp_path):
    f = write_llama(tmp_path / "m.gguf", n_layer=5)
    r = cli("memory", f.path, "--device", "vulkan:8GiB", "-ngl", "all", "-c", "512",
            "--no-repack")
    assert r.returncode == 0, r.stderr
    assert "Vulkan0" in r.stdout and "n/m" in r.stdout and "layers: 0-4 Vulkan0" in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["--device", "tpu"], "unknown device kind 'tpu'"),
    (["--device", "cuda:lots"], "use a size like"),
    (["--device", "rpc", "-ts", "a,b"], "-ts 'a,b'"),
    (["--device", "rpc", "-sm", "row", "-ts", "1"], "-sm row"),
    (["--device", "rpc", "-ngl", "many", "-ts", "1"], "-ngl 'many'"),
    (["--device", "rpc", "-ts", "1", "-ot", "exps"], "PATTERN=BUFFER_TYPE"),
    (["--device", "rpc", "-ts", "1", "-ot", "exps=CUDA3"], "unknown buffer type"),
    (["--device", "rpc", "-ts", "1", "-ot", "exps=RPC0[127.0.0.1:50052]"], "name the device"),
    (["--device", "rpc", "--device", "cuda:8GiB"], "give its free memory"),
], ids=["kind", "mem", "ts", "row", "ngl", "ot", "ot-target", "ot-endpoint", "no-mem"])
def test_bad_flags_are_one_line(tmp_path, args, msg):
    f = write_llama(tmp_path / "m.gguf")
    r = cli("memory", f.path, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- golden text -----------------------------------------------------------------------------

GOLDEN = Path(__file__).parent / "golden" / "memory_devices_llama5.txt"


def test_golden_device_table(llama5):
    # GRAPHCOST_UPDATE_GOLDEN=1 rewrites the file; the CPU features are fixed (avx2) so the
    # text does not depend on the machine
    import os

    from graphcost.report.memory import render_devices
    dp = plan_devices(llama5, RunSettings(ctx_size=512),
                      [DeviceArg("cuda", 2 << 30), DeviceArg("rpc"), DeviceArg("cuda", 1 << 30)],
                      PlacementFlags(n_gpu_layers=4, tensor_split=(1, 2, 1),
                                     overrides=tuple(parse_overrides(["ffn_up=CPU"])),
                                     cpu_features=AVX2))
    text = render_devices(dp)
    if os.environ.get("GRAPHCOST_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
