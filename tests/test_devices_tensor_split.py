"""``-sm tensor`` (llama.cpp's tensor parallelism through its Meta device): each device's
model, KV and compute buffers (graphcost/memory/tensor_split.py).

The unit tests need no tools: the split of each tensor with its arithmetic, the
per-device sums, the refusals. The rest compares with real runs: two or three
``ggml-rpc-server`` devices and ``llama-completion -sm tensor`` (tests/llama_runs.py), whose
log prints one ``Meta()`` line per buffer (the largest device's) while each server logs
every allocation to the byte (GGML_RPC_DEBUG): model, KV, compute, then at the first
compute the all-reduce scratch (``ceil(log2(n_devices))`` buffers when the graph has a
partial sum, not modelled).
"""
from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as QT
from typer.testing import CliRunner

from fixtures import write_gemma3, write_llama
from fixtures_classic import write_phi3
from fixtures_dense import write_qwen2, write_qwen3
from fixtures_gemma3n import write_gemma3n
from fixtures_gptoss import write_gptoss
from fixtures_hybrid import write_lfm2
from fixtures_moe import write_mixtral, write_qwen3moe
from fixtures_simple import write_qwen2moe
from graphcost.cli import app
from graphcost.errors import GraphcostError
from graphcost.graph.build import load_model as load_model_info
from graphcost.memory.backends import host_cpu_features
from graphcost.memory.tensor_split import AXIS_0, AXIS_1, MIRRORED, _shares, device_bytes, split_state
from llama_runs import amx_skip_reason, rpc_servers, run_completion, skip_reason

MiB = 1024 * 1024
KINDS = ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
         "ffn_up", "ffn_down")

WRITERS = {
    # n_embd 256, 8 heads of 32, 2 KV heads (n_gqa 4), n_ff 768, 300 tokens, 3 layers
    "f16": lambda p: write_llama(p, weight_types={k: QT.F16 for k in KINDS}),
    "q8": lambda p: write_llama(p, n_layer=4, weight_types={k: QT.Q8_0 for k in KINDS}),
    # Q4_0 Q, F16 K, Q8_0 V and FFN up, Q4_0 gate, Q6_K output: the block size that rounds
    # the shares is attn_output's / ffn_down's (Q8_0: 32), not the tensor's own
    "mixed": lambda p: write_llama(p, n_layer=4, weight_types={"attn_output": QT.Q8_0,
                                                               "ffn_down": QT.Q8_0}),
    # tied output (token_embd again, mirrored) and per-layer rope factors (mirrored)
    "tied-rope": lambda p: write_llama(p, tie_embeddings=True, rope_freqs=True,
                                       weight_types={k: QT.Q8_0 for k in KINDS if k != "output"}),
    # sliding-window and global layers (each kind rotates on its own), two KV caches
    "gemma3": lambda p: write_gemma3(p, weight_types={k: QT.Q8_0 for k in KINDS if k != "output"}),
    # experts split by rows (up/gate) and columns (down), tied output
    "qwen3moe": lambda p: write_qwen3moe(p),
    # fused attn_qkv (segments Q, then K and V x 2) and fused up+gate ffn_up (n_ff x 2)
    "phi3": lambda p: write_phi3(p),
    # attention sinks (one value a head), biases, expert biases (ffn_down_exps.bias:
    # PARTIAL, whole on every device), sliding-window layers
    "gptoss": lambda p: write_gptoss(p),
    # Q/K/V biases split by columns with their heads, output.bias with the output rows
    "qwen2": lambda p: write_qwen2(p),
    # per-head Q/K norms ([head_dim]: mirrored)
    "qwen3": lambda p: write_qwen3(p),
    # a shared expert (mirrored: its patterns split only DeepSeek V4's)
    "qwen2moe": lambda p: write_qwen2moe(p),
    # the default fixture: Q4_K attn_output of 256 columns, one block per row
    "llama-q4k": lambda p: write_llama(p),
    "mixtral": lambda p: write_mixtral(p, n_layer=3),
    "gemma3n": lambda p: write_gemma3n(p),
    "lfm2": lambda p: write_lfm2(p),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tensor-split-models")
    return {k: Path(w(d / f"{k}.gguf").path) for k, w in WRITERS.items()}


def _memory(model: Path, n_rpc: int, args: list[str]):
    feats = ",".join(sorted(host_cpu_features())) or "none"
    cmd = ["memory", str(model), "-c", "512", "--format", "json", "--cpu-features", feats]
    cmd += ["--device", "rpc"] * n_rpc
    return CliRunner().invoke(app, cmd + ["-sm", "tensor"] + args)


def _ours(model: Path, n_rpc: int, args: list[str]) -> dict:
    r = _memory(model, n_rpc, args)
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)["memory"]


def _refused(r, msg: str) -> None:
    """A GraphcostError: graphcost.cli.main prints it as one line and exits 2."""
    assert isinstance(r.exception, GraphcostError), (r.output, r.exception)
    assert msg in str(r.exception) and "\n" not in str(r.exception)


def _rows(ours: dict) -> dict[str, dict]:
    return {r["device"]: r for r in ours["devices"]}


# ---- the split, no tools ---------------------------------------------------------------------

@pytest.mark.parametrize("ne,g,ts,rot,want", [
    # no -ts: ne * (j + 1) / n, rounded down to g: 768 / 2 = 384 = 3 x 128
    (768, 128, [0, 0], 0, [384, 384]),
    # -ts 1,3: 256 x 1/4 = 64, rounded down to 128 -> 0; the rest to device 1
    (256, 128, [1, 3], 0, [0, 256]),
    # rotated by one: device 1's 3 first (256 x 3/4 = 192 -> 128), device 0 the rest
    (256, 128, [1, 3], 1, [128, 128]),
    # float32: 300 x 0.2f / 0.3f = 199.99998 -> 199 (in double 200)
    (300, 1, [0.1, 0.2], 1, [101, 199]),
    # three devices: 4 x 64 columns: 64 x 1/3 = 21 -> 0, 64 x 2/3 = 42 -> 0
    (64, 64, [1, 1, 1], 0, [0, 0, 64]),
], ids=["even", "ts1,3", "ts1,3-rotated", "float32", "three"])
def test_shares(ne, g, ts, rot, want):
    assert _shares(ne, g, ts, rot) == want


def test_split_state_of_each_tensor(models):
    """f16 fixture, -ts 1,3. Heads stay whole: Q by n_gqa x 32 = 128 rows (one KV head's
    group: the block 1 is doubled while < 128 and x 2 devices < 128, to 64; lcm(128, 64)
    = 128), K/V by 32 rows (one KV head), attn_output by the same heads' 128 columns; FFN
    by lcm(1, 128) = 128; the output by 1 row."""
    m = load_model_info(models["f16"])
    ts = [1.0, 3.0]

    def st(name):
        s = split_state(name, m.tensors[name].ne, m, ts)
        return s.axis, s.ne
    assert st("blk.0.attn_q.weight") == (AXIS_1, ((0, 256),))
    assert st("blk.1.attn_q.weight") == (AXIS_1, ((128, 128),))  # layer 1 rotates
    assert st("blk.0.attn_k.weight") == (AXIS_1, ((0, 64),))
    assert st("blk.1.attn_v.weight") == (AXIS_1, ((32, 32),))  # 64 x 3/4 = 48 -> 32
    assert st("blk.0.attn_output.weight") == (AXIS_0, ((0, 256),))
    assert st("blk.0.ffn_up.weight") == (AXIS_1, ((128, 640),))  # 768/4 = 192 -> 128
    assert st("blk.1.ffn_down.weight") == (AXIS_0, ((256, 512),))  # 576 -> 512 to device 1
    # the output rotates by n_layer % 2 = 1: 300 x 3/4 = 225 rows to device 1
    assert st("output.weight") == (AXIS_1, ((75, 225),))
    assert st("blk.0.attn_norm.weight")[0] == MIRRORED
    s = split_state("cache_k_l1", (64, 512), m, ts)  # K cache: 32 columns (one KV head)
    assert (s.axis, s.ne) == (AXIS_0, ((32, 32),))


def test_model_and_kv_bytes_per_device(models):
    """f16 fixture, -ts 1,3, 2 bytes an element; each device's sum of its slices (32-byte
    aligned: every slice here is a multiple of 32).

    Layers 0 and 2: device 0 holds the two norms (2 x 1024) and FFN 128 x 256 x 3
    (3 x 65536) = 198656; device 1 the norms, Q 131072, K 32768, V 32768, O 131072 and
    FFN 640 x 256 x 3 x 2 = 983040: 1312768. Layer 1 (rotated): device 0 Q 65536, K and V
    16384 each, O 65536, FFN 256 rows 393216 + norms 2048 = 559104; device 1 the same
    attention, FFN 512 rows 786432: 952320. Output: 75 and 225 rows of 512 bytes, the
    output norm 1024 on both.
    """
    m = load_model_info(models["f16"])
    ours = _ours(models["f16"], 2, ["-ts", "1,3"])
    rows = _rows(ours)
    assert rows["RPC0"]["model_bytes"] == 2 * 198656 + 559104 + 75 * 512 + 1024 == 995840
    assert rows["RPC1"]["model_bytes"] == 2 * 1312768 + 952320 + 225 * 512 + 1024 == 3694080
    # the log's line: the largest device's
    assert {b["name"]: b["bytes"] for b in ours["model_buffers"]} == {
        "CPU_Mapped": 300 * 256 * 2, "Meta()": 3694080}
    # K and V [64, 512] F16, 32 columns = 32 x 512 x 2 = 32768 each: layer 1 on device 0,
    # layers 0 and 2 whole and half of layer 1 on device 1
    assert rows["RPC0"]["kv_bytes"] == 2 * 32768 == 65536
    assert rows["RPC1"]["kv_bytes"] == 2 * (2 * 65536) + 2 * 32768 == 327680
    # mirrored and split tensors sum to the whole model plus the mirrored copy
    from graphcost.memory.backends import load
    rpc = load("rpc")
    w = [(n, t.type, tuple(t.ne)) for n, t in m.tensors.items() if n != "token_embd.weight"]
    per = device_bytes(w, m, [1.0, 3.0], [rpc, rpc])
    mirrored = sum(t.nbytes for n, t in m.tensors.items() if n.endswith("norm.weight"))
    assert sum(per) == sum(t.nbytes for _, t in [(n, m.tensors[n]) for n, *_ in w]) + mirrored


def test_compute_is_one_device_s_on_every_device(models):
    """The Meta buffer type allocates the unsplit graph's compute buffer on every device:
    each equals one RPC device's with every layer and flash attention on; the CPU's too."""
    one = CliRunner().invoke(app, ["memory", str(models["q8"]), "-c", "512", "--format", "json",
                                   "--device", "rpc", "-ngl", "all", "-fa", "on"])
    single = _rows(json.loads(one.stdout)["memory"])
    rows = _rows(_ours(models["q8"], 3, ["-ts", "1,2,3"]))
    for d in ("RPC0", "RPC1", "RPC2"):
        assert rows[d]["compute_bytes"] == single["RPC0"]["compute_bytes"]
    assert rows["CPU"]["compute_bytes"] == single["CPU"]["compute_bytes"]


def test_cuda_compute_not_modelled(models):
    """Model and KV bytes for any kind with a known alignment; compute only for RPC (the
    Meta device has no offload_op or graph_optimize, CUDA has both)."""
    r = CliRunner().invoke(app, ["memory", str(models["q8"]), "-c", "512", "--format", "json",
                                 "--device", "cuda", "--device", "cuda", "-sm", "tensor"])
    assert r.exit_code == 0, r.output
    rows = _rows(json.loads(r.stdout)["memory"])
    assert rows["CUDA0"]["compute_bytes"] is None and rows["CPU"]["compute_bytes"] is None
    assert rows["CUDA0"]["model_bytes"] > 0


@pytest.mark.parametrize("model,args,msg", [
    ("gemma3n", [], "LLAMA_SPLIT_MODE_TENSOR not implemented for architecture 'gemma3n'"),
    ("q8", ["-fa", "off"], "SPLIT_MODE_TENSOR requires flash_attn to be enabled"),
    ("lfm2", [], "the tensor split of lfm2"),
    ("q8", ["-ot", "attn_q=RPC1"], "-ot ...=RPC1"),
], ids=["arch", "fa-off", "lfm2-not-modelled", "ot-device"])
def test_refusals(models, model, args, msg):
    _refused(_memory(models[model], 2, args), msg)


def test_mixed_kinds_refused(models):
    """(In the Meta device's order: GPU backends first, RPC servers registered last.)"""
    r = CliRunner().invoke(app, ["memory", str(models["q8"]), "--device", "rpc",
                                 "--device", "cuda", "-sm", "tensor"])
    _refused(r, "devices of different kinds or options (CUDA0, RPC0) are not modelled")


def test_fit_refused(models):
    """common/fit.cpp: "llama_params_fit is not implemented for SPLIT_MODE_TENSOR, abort"."""
    r = CliRunner().invoke(app, ["fit", str(models["q8"]), "--device", "rpc:1GiB",
                                 "--device", "rpc:1GiB", "-sm", "tensor"])
    _refused(r, "llama_params_fit is not implemented for SPLIT_MODE_TENSOR")


def test_load_abort_noted(models):
    """attn_output Q4_K [256, 256]: one block a row, 256 columns for one device and none
    for the other: llama.cpp aborts loading it (seen below); graphcost says so."""
    ours = _ours(models["llama-q4k"], 2, [])
    assert any(n.startswith("llama.cpp aborts loading blk.0.attn_output.weight")
               for n in ours["notes"])
    assert not any("aborts" in n for n in _ours(models["q8"], 2, [])["notes"])


# ---- against llama.cpp -----------------------------------------------------------------------

#: (model, RPC servers, llama.cpp arguments after -sm tensor -c 512)
CASES = {
    "f16-even": ("f16", 2, []),
    "f16-ts1,3": ("f16", 2, ["-ts", "1,3"]),
    "f16-ts-float32": ("f16", 2, ["-ts", "0.1,0.2"]),
    "q8-ts3,1-fa-on": ("q8", 2, ["-ts", "3,1", "-fa", "on"]),
    "q8-ts1,0": ("q8", 2, ["-ts", "1,0"]),
    "q8-ngl2-ts1,2": ("q8", 2, ["-ngl", "2", "-ts", "1,2"]),
    "q8-three": ("q8", 3, []),
    "q8-three-ts1,2,3": ("q8", 3, ["-ts", "1,2,3"]),
    "mixed-ts2,3": ("mixed", 2, ["-ts", "2,3"]),
    "tied-rope-ts1,2": ("tied-rope", 2, ["-ts", "1,2"]),
    "gemma3-ts3,2": ("gemma3", 2, ["-ts", "3,2"]),
    "qwen3moe": ("qwen3moe", 2, []),
    "qwen3moe-ngl3-ts1,3": ("qwen3moe", 2, ["-ngl", "3", "-ts", "1,3"]),
    "q8-kv-q8_0-ts2,1": ("q8", 2, ["-ctk", "q8_0", "-ctv", "q8_0", "-ts", "2,1"]),
    "q8-np2": ("q8", 2, ["-np", "2"]),
    "q8-nkvo-ts1,2": ("q8", 2, ["-nkvo", "-ts", "1,2"]),
    "q8-ub128": ("q8", 2, ["-ub", "128", "-b", "128"]),
    "q8-no-mmap-ngl3": ("q8", 2, ["-lm", "none", "-ngl", "3"]),
    "phi3-fused-ts1,2": ("phi3", 2, ["-ts", "1,2"]),
    "gptoss": ("gptoss", 2, []),
    "gptoss-ts2,1": ("gptoss", 2, ["-ts", "2,1"]),
    "qwen2-biases-ts1,3": ("qwen2", 2, ["-ts", "1,3"]),
    "qwen3-qk-norm-ts2,1": ("qwen3", 2, ["-ts", "2,1"]),
    "qwen2moe-shexp": ("qwen2moe", 2, []),
    # one device (llama.cpp warns, no all-reduce), -dev reversing the order, no layer
    # on the Meta device (nothing on the servers), only the output layer on it
    "q8-one-device": ("q8", 1, []),
    "q8-dev-reversed-ts1,3": ("q8", 2, ["-dev", "RPC1,RPC0", "-ts", "1,3"]),
    "q8-ngl0": ("q8", 2, ["-ngl", "0"]),
    "q8-ngl1-output-only": ("q8", 2, ["-ngl", "1", "-ts", "1,2"]),
    # experts on the CPU (-ot ...=CPU, -cmoe without mmap: CPU_REPACK), the rest split;
    # three devices over sliding-window and global caches (a device without an SWA share)
    "qwen3moe-ot-exps-cpu-ts1,2": ("qwen3moe", 2, ["-ot", "exps=CPU", "-ts", "1,2"]),
    "qwen3moe-cmoe-no-mmap": ("qwen3moe", 2, ["-cmoe", "-lm", "none"]),
    "gptoss-three-ts1,2,3": ("gptoss", 3, ["-ts", "1,2,3"]),
    "gemma3-three": ("gemma3", 3, []),
}

needs_tools = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


@pytest.fixture(scope="module")
def server_sets(tmp_path_factory):
    if skip_reason() is not None:
        pytest.skip(skip_reason())
    d = tmp_path_factory.mktemp("tensor-split-servers")
    with contextlib.ExitStack() as stack:
        sets = {}
        for n in (1, 2, 3):
            (d / f"set{n}").mkdir()
            sets[n] = stack.enter_context(rpc_servers(n, d / f"set{n}"))
        yield sets


def _printed(n: int) -> float:
    return float(f"{n / MiB:.2f}")


@needs_tools
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_per_device_buffers_equal_llama_cpp(models, server_sets, case):
    name, n, args = CASES[case]
    if amx_skip_reason():
        pytest.skip(amx_skip_reason())
    servers = server_sets[n]
    marks = [s.mark() for s in servers]
    run = run_completion(models[name], servers, ["-c", "512", "-sm", "tensor"] + args)
    ours = _ours(models[name], n, args)
    rows = _rows(ours)

    def logged_name(x):
        return "Meta()" if x.startswith("Meta(") else x
    # layers: llama.cpp names the Meta device "Meta()"
    assert run.layers == dict(enumerate(logged_name(x)
                                        for x in ours["layers"] + [ours["output_layer"]]))
    # every buffer line: the Meta lines are the largest device's
    assert {b["name"]: [_printed(b["bytes"])] for b in ours["model_buffers"]} == dict(run.model)
    # KV: one buffer per cache on each device, llama.cpp logs each cache's largest
    kv: dict[tuple[str, str], int] = {}
    for b in ours["kv_buffers"]:
        key = ("Meta()" if b["device"].startswith("RPC") else b["device"], b["cache"])
        kv[key] = max(kv.get(key, 0), b["bytes"])
    logged_kv: dict[str, list[float]] = {}
    for (dev, _), v in kv.items():
        logged_kv.setdefault(dev, []).append(_printed(v))
    assert {k: sorted(v) for k, v in logged_kv.items()} == \
        {k: sorted(v) for k, v in run.kv.items()}
    meta_compute = rows["RPC0"]["compute_bytes"]
    assert dict(run.compute) == {**({"Meta()": [_printed(meta_compute)]} if meta_compute > 1 else {}),
                                 "CPU": [_printed(rows["CPU"]["compute_bytes"])]}
    graphs = {g["graph"]: g["n_splits"] for g in ours["scheduler"]["graphs"]}
    assert run.splits == (graphs["prompt"], graphs["generation"])
    # to the byte: each server allocates its model slices, its KV slices (when it has
    # any), the Meta compute buffer, then ceil(log2(n)) all-reduce scratch buffers
    for i, s in enumerate(servers):
        r = rows[f"RPC{i}"]
        want = [r["model_bytes"]] + [b["bytes"] for b in ours["kv_buffers"]
                                     if b["device"] == f"RPC{i}" and b["bytes"]]
        want.append(r["compute_bytes"])
        want = [x for x in want if x]  # an empty buffer is no allocation
        got = s.alloc_sizes(marks[i])
        assert got[:len(want)] == want, (case, f"RPC{i}", got)
        # run_completion runs llama.cpp again when its log came back cut: the last run's
        starts = [k for k in range(len(got)) if want and got[k:k + len(want)] == want]
        got = got[starts[-1]:] if starts else got
        # then the all-reduce scratch, when the graph has a partial sum (not with only
        # the output layer, split by rows): ceil(log2(n)) buffers of one size
        rest = got[len(want):]
        assert len(rest) in (0, math.ceil(math.log2(n))) and len(set(rest)) <= 1, got


@needs_tools
def test_refusals_equal_llama_cpp(models, server_sets):
    """llama.cpp refuses what graphcost refuses: an architecture without tensor
    parallelism, flash attention off."""
    servers = server_sets[2]
    for model, args, msg in [
            ("gemma3n", [], "LLAMA_SPLIT_MODE_TENSOR not implemented for architecture 'gemma3n'"),
            ("q8", ["-fa", "off"], "SPLIT_MODE_TENSOR requires flash_attn to be enabled")]:
        with pytest.raises(RuntimeError) as e:
            run_completion(models[model], servers, ["-c", "512", "-sm", "tensor"] + args)
        # llama.cpp's log thread does not always print the error before the exit (nothing
        # joins it): the message, else a failed exit (not 0) before or after the buffers
        assert msg in str(e.value) or re.search(r"(failed|exited) \(-?[1-9]\d*\)",
                                                str(e.value)), str(e.value)[-500:]
        _refused(_memory(models[model], 2, args), msg)


@needs_tools
def test_load_abort_equals_llama_cpp(models, server_sets):
    """The default fixture's Q4_K attn_output (one block a row): llama.cpp allocates what
    graphcost says, then aborts writing it."""
    servers = server_sets[2]
    marks = [s.mark() for s in servers]
    with pytest.raises(RuntimeError) as e:
        run_completion(models["llama-q4k"], servers, ["-c", "512", "-sm", "tensor"])
    assert "tensor write out of bounds" in str(e.value)
    rows = _rows(_ours(models["llama-q4k"], 2, []))
    for i, s in enumerate(servers):
        assert s.alloc_sizes(marks[i]) == [rows[f"RPC{i}"]["model_bytes"]]


def test_max_ctx_uses_each_device_s_share(models):
    """``memory --max-ctx`` under -sm tensor: the largest context at which every device's
    own share fits its budget (RPC1 holds 3/4 of the KV heads with -ts 1,3)."""
    base = ["memory", str(models["q8"]), "--device", "rpc:11MiB", "--device", "rpc:11MiB",
            "-sm", "tensor", "-ts", "1,3", "--format", "json"]
    r = CliRunner().invoke(app, base + ["--max-ctx"])
    assert r.exit_code == 0, (r.output, r.exception)
    best = json.loads(r.stdout)["max_ctx"]["max_ctx"]

    def rpc1_total(n_ctx: int) -> int:
        out = CliRunner().invoke(app, base + ["-c", str(n_ctx)])
        row = _rows(json.loads(out.stdout)["memory"])["RPC1"]
        return sum(row[k] for k in ("model_bytes", "kv_bytes", "recurrent_state_bytes",
                                    "compute_bytes", "output_bytes"))
    assert best < 2048  # the training context does not fit
    assert rpc1_total(best) <= 11 * MiB < rpc1_total(best + 256)
