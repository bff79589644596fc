"""ggml's backend scheduler (graphcost/memory/sched.py) without llama.cpp: splits, copied
inputs, pipeline parallelism, the CPU-alone case, and ``analyze --device``. Compute buffers
against real multi-device llama.cpp runs are in tests/test_devices_rpc.py."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fixtures import write_llama
from fixtures_moe import write_mixtral
from graphcost.cli import app
from graphcost.errors import GraphcostError
from graphcost.graph.build import load_model
from graphcost.graph.settings import RunSettings
from graphcost.memory.placement import DeviceArg, PlacementFlags, parse_overrides, plan_devices
from graphcost.memory.sched import compute_buffers

AVX2 = frozenset({"avx2"})
RPC2 = [DeviceArg("rpc"), DeviceArg("rpc")]


def cli(*args) -> tuple[int, str, str]:
    """graphcost in this process: (exit code, stdout, stderr), a GraphcostError being
    the one line and exit 2 that graphcost.cli.main makes of it."""
    r = CliRunner().invoke(app, [str(a) for a in args])
    if isinstance(r.exception, GraphcostError):
        return 2, r.stdout, f"graphcost: {r.exception}\n"
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def llama5_path(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("sc") / "llama5.gguf", n_layer=5).path


@pytest.fixture(scope="module")
def llama5(llama5_path):
    # 5 layers, n_embd 256, vocab 300 (tests/fixtures.py)
    return load_model(llama5_path)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return load_model(write_mixtral(tmp_path_factory.mktemp("sc") / "mixtral.gguf", n_layer=4).path)


@pytest.mark.parametrize("which", ["llama5", "mixtral"])
def test_scheduler_with_the_cpu_alone_is_the_single_cpu_plan(which, llama5, mixtral):
    """One backend: one split, nothing copied, and the allocation is the plan's."""
    m = {"llama5": llama5, "mixtral": mixtral}[which]
    s = RunSettings(ctx_size=512)
    dp = plan_devices(m, s, [], PlacementFlags(cpu_features=AVX2))
    flags = PlacementFlags(cpu_features=AVX2)
    c = compute_buffers(dp.plan.reserves, dp.placement, flags, m.n_layer)
    assert c.bytes_by_buft == {"CPU": dp.plan.compute_buffer_bytes}
    assert [len(sc.splits) for _, sc in c.schedules] == [1, 1]
    assert [sc.copy_bytes for _, sc in c.schedules] == [0, 0]


def test_scheduler_splits_and_copies_for_three_layers_on_two_devices(llama5):
    # -ngl 3 -ts 1,1: layers 0-2 CPU, 3-4 RPC0, output RPC1 (as GGML_SCHED_DEBUG=2 shows)
    flags = PlacementFlags(n_gpu_layers=3, tensor_split=(1, 1), cpu_features=AVX2)
    dp = plan_devices(llama5, RunSettings(ctx_size=512), RPC2, flags)
    sc = dict(dp.compute.schedules)["prompt"]
    assert [sc.backends[sp.backend].name for sp in sc.splits] == ["CPU", "RPC0", "RPC1"]
    assert [t.name for t in sc.splits[1].inputs] == [
        "ffn_out-2", "ffn_inp-2", "inp_pos", "attn_inp_k_idxs", "attn_inp_v_idxs",
        "attn_inp_kq_mask", "out_ids"]
    assert [t.name for t in sc.splits[2].inputs] == ["norm"]  # the output norm, pre-weight
    # 512 tokens: ffn_out, ffn_inp, norm 256 x 512 F32 = 524288 each; inp_pos and out_ids
    # 512 x I32 = 2048; k/v idxs 512 x I64 = 4096; the FA mask 512 x 512 F16 = 524288
    assert sc.copy_bytes == 3 * 524288 + 2 * 2048 + 2 * 4096 + 524288
    assert dp.compute.n_copies == 1  # -ngl 3: not every layer on the devices


def test_pipeline_parallelism_conditions(llama5):
    """llama_context: > 1 device, every layer and the output offloaded, -sm layer, KV
    offloaded, no -ot; then 4 copies of every input."""
    s = RunSettings(ctx_size=512)

    def copies(**kw):
        return plan_devices(llama5, s, RPC2, PlacementFlags(tensor_split=(1, 1), **kw)).compute.n_copies
    assert copies() == 4
    assert copies(n_gpu_layers=5) == 1  # the output layer stays on the CPU
    assert copies(no_kv_offload=True) == 1
    assert copies(overrides=tuple(parse_overrides(["attn_q=CPU"]))) == 1
    assert plan_devices(llama5, s, RPC2[:1], PlacementFlags()).compute.n_copies == 1


def test_analyze_device_gives_each_node_its_device_and_the_copied_bytes(llama5_path):
    rc, out, err = cli("analyze", llama5_path, "-c", "512", "--tokens", "512", "--outputs", "512",
                       "--device", "rpc", "--device", "rpc", "-ngl", "3", "-ts", "1,1",
                       "--cpu-features", "avx2", "-f", "json")
    assert rc == 0, err
    doc = json.loads(out)
    devs = [n["device"] for n in doc["nodes"] if not n["view"]]
    # layers 0-2 and the input on the CPU, 3-4 on RPC0; the output projection on RPC1
    assert devs[0] == "CPU" and devs[-1] == "RPC1" and set(devs) == {"CPU", "RPC0", "RPC1"}
    assert doc["devices"]["n_splits"] == 3
    # as the -ngl 3 prompt graph above, with n_kv 512: the same 2,109,440 bytes
    assert doc["devices"]["copy_bytes"] == 3 * 524288 + 2 * 2048 + 2 * 4096 + 524288
    rc, out, err = cli("analyze", llama5_path, "-c", "512", "--device", "rpc", "--device", "rpc",
                       "-ngl", "3", "-ts", "1,1")
    assert rc == 0 and "3 splits" in out and "copied between devices" in out


@pytest.mark.parametrize("args,msg", [
    (["-ngl", "3"], "go with --device"),
    # Vulkan's buffer alignment (minStorageBufferOffsetAlignment) is the device's to give
    (["--device", "vulkan"], "scheduler is not modelled here: Vulkan0: its buffer alignment"),
    (["--device", "rpc", "--device", "rpc", "-sm", "row"], "-sm row"),
], ids=["flags-without-device", "vulkan", "sm-row"])
def test_analyze_device_refusals_are_one_line(llama5_path, args, msg):
    rc, out, err = cli("analyze", llama5_path, "-c", "512", *args)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1
