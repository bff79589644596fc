"""graphcost's per-device model, KV, output and compute buffers against real llama.cpp
multi-device runs.

Two ``ggml-rpc-server`` processes on 127.0.0.1 are the devices RPC0 and RPC1;
``llama-completion --rpc`` (llama.cpp built from the source llama-cpp-python 0.3.36
vendors, GGML_RPC=ON; see graphcost/judge/llama_tools.py) loads tiny fixture models across them
with the same placement flags graphcost is given, and logs every buffer. Per buffer:

* llama.cpp's printed MiB (two decimals) equals graphcost's bytes printed the same way;
* the RPC servers log the exact bytes of every allocation (GGML_RPC_DEBUG): graphcost's
  model and KV bytes of each RPC device are among them, to the byte.

The CPU features that decide CPU_REPACK are this machine's (a native build compiles for
them): graphcost is given the same (``--cpu-features``). Skipped, with the reason, when the
tools are not built.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixtures import write_gemma3, write_llama
from fixtures_classic import write_gpt2
from fixtures_deepseek import write_glm4moe
from fixtures_encoder import write_bert
from fixtures_gemma3n import write_gemma3n
from fixtures_hybrid import write_lfm2
from fixtures_moe import write_gemma2, write_mixtral, write_qwen3moe
from fixtures_simple import write_cohere2
from graphcost.cli import app
from graphcost.memory.backends import host_cpu_features
from llama_runs import amx_skip_reason, rpc_servers, run_completion, skip_reason

MiB = 1024 * 1024

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

WRITERS = {
    # 5 layers: quantized Q4_0/Q4_K/Q8_0/Q6_K weights (CPU_REPACK candidates on AVX2)
    "llama5": lambda p: write_llama(p, n_layer=5),
    # rope_freqs.weight: created for every layer (TENSOR_DUPLICATED), one copy per buffer type
    "llama-rope-freqs": lambda p: write_llama(p, n_layer=4, rope_freqs=True),
    # 4 layers of 6 experts
    "mixtral": lambda p: write_mixtral(p, n_layer=4),
    # tied embeddings: the output layer gets its own copy of token_embd
    "qwen3moe": lambda p: write_qwen3moe(p),
    # n_embd 320 (quantized rows not a multiple of 512: RPC asks the server for their
    # allocation size), sliding-window + global KV caches, tied embeddings
    "gemma3": lambda p: write_gemma3(p),
    # hybrid attention + recurrent (short conv) layers: recurrent state per device
    "lfm2": lambda p: write_lfm2(p),
    # position_embd (an input-layer tensor), learned positions read on the CPU
    "gpt2": lambda p: write_gpt2(p),
    # per_layer_model_proj / per_layer_proj_norm: layer 0's buffer type, not the output's
    "gemma3n": lambda p: write_gemma3n(p),
    # a NextN block after the trunk: llama.cpp splits n_layer_all layers
    "glm4moe": lambda p: write_glm4moe(p),
    # token_embd_norm: layer 0's (llama-arch.cpp: "do the norms on the first layer")
    "bert": lambda p: write_bert(p),
    # tied output that gguf's MODEL_TENSORS does not list (no OUTPUT for gemma2, cohere2):
    # their loaders still create token_embd again as the output (TENSOR_DUPLICATED)
    "gemma2": lambda p: write_gemma2(p),
    "cohere2": lambda p: write_cohere2(p),
}

#: (model, number of RPC servers, llama.cpp arguments; "{rpc1}" = RPC1's buffer type name)
CASES = {
    "cpu-only": ("llama5", 0, []),
    "ngl0": ("llama5", 2, ["-ngl", "0", "-ts", "1,1"]),
    "ngl1-output-only": ("llama5", 2, ["-ngl", "1", "-ts", "1,1"]),
    "ngl3": ("llama5", 2, ["-ngl", "3", "-ts", "1,1"]),
    "all-ts3,1": ("llama5", 2, ["-ngl", "all", "-ts", "3,1"]),
    "all-ts1,2-nkvo": ("llama5", 2, ["--n-gpu-layers", "99", "--tensor-split", "1,2", "-nkvo"]),
    "ngl4-no-repack": ("llama5", 2, ["-ngl", "4", "-ts", "1,1", "--no-repack"]),
    "ngl2-no-mmap": ("llama5", 2, ["-ngl", "2", "-ts", "1,1", "-lm", "none"]),
    "sm-none-mg1": ("llama5", 2, ["-ngl", "all", "-sm", "none", "-mg", "1"]),
    "ot-attn_q-to-rpc1": ("llama5", 2, ["-ngl", "3", "-ts", "1,0", "-ot", r"attn_q=RPC1"]),
    "moe-ot-exps-cpu": ("mixtral", 2, ["-ngl", "all", "-ts", "1,1", "-ot", "exps=CPU"]),
    "moe-n-cpu-moe-2": ("mixtral", 2, ["-ngl", "all", "-ts", "1,1", "--n-cpu-moe", "2"]),
    "moe-cpu-moe-no-mmap": ("mixtral", 2, ["-ngl", "all", "-ts", "2,1", "-cmoe", "-lm", "none"]),
    "tied-all": ("qwen3moe", 2, ["-ngl", "all", "-ts", "1,1"]),
    "tied-ngl2": ("qwen3moe", 2, ["-ngl", "2", "-ts", "1,3"]),
    "kv-q8_0-fa-on": ("llama5", 2, ["-ngl", "all", "-ts", "1,1", "-ctk", "q8_0", "-ctv", "q8_0",
                                    "-fa", "on"]),
    "fa-off": ("llama5", 2, ["-ngl", "3", "-ts", "1,1", "-fa", "off"]),
    "three-servers": ("llama5", 3, ["-ngl", "all", "-ts", "1,1,1"]),
    "rope-freqs-ngl3": ("llama-rope-freqs", 2, ["-ngl", "3", "-ts", "1,1"]),
    "rope-freqs-no-mmap": ("llama-rope-freqs", 2, ["-ngl", "all", "-ts", "1,1", "-lm", "none"]),
    "gemma3-iswa-all": ("gemma3", 2, ["-ngl", "all", "-ts", "1,1"]),
    "gemma3-ngl4-nkvo": ("gemma3", 2, ["-ngl", "4", "-ts", "2,1", "-nkvo"]),
    # the scheduler: every layer but not the output (no pipeline parallelism, norms not
    # pinned in the prompt graph), non-FA attention with and without pipeline
    # parallelism, -nkvo without FA (the attention output pinned to the CPU), MoE partly
    # and fully offloaded, a smaller ubatch, -sm none with a partial offload
    "ngl5-not-output": ("llama5", 2, ["-ngl", "5", "-ts", "1,1"]),
    "all-fa-off": ("llama5", 2, ["-ngl", "all", "-ts", "1,1", "-fa", "off"]),
    "ngl3-nkvo-fa-off": ("llama5", 2, ["-ngl", "3", "-ts", "1,1", "-nkvo", "-fa", "off"]),
    "ub128-ngl4": ("llama5", 2, ["-ngl", "4", "-ts", "1,2", "-ub", "128", "-b", "128"]),
    "sm-none-ngl2": ("llama5", 2, ["-ngl", "2", "-sm", "none"]),
    "moe-ngl2": ("mixtral", 2, ["-ngl", "2", "-ts", "1,1"]),
    "moe-all": ("mixtral", 2, ["-ngl", "all", "-ts", "1,1"]),
    "moe-all-fa-off-nkvo": ("mixtral", 2, ["-ngl", "all", "-ts", "1,3", "-fa", "off", "-nkvo"]),
    "gemma3-ngl3-fa-off": ("gemma3", 2, ["-ngl", "3", "-ts", "1,1", "-fa", "off"]),
    # -dev: these devices in this order (RPC1 first: it gets 3/4 of the layers and is the
    # first backend); -dev none: the CPU alone; --no-op-offload (RPC never offloads)
    "dev-reversed": ("llama5", 2, ["-ngl", "all", "-ts", "3,1", "-dev", "RPC1,RPC0",
                                   "--no-op-offload"]),
    "dev-none": ("llama5", 2, ["-ngl", "all", "-dev", "none"]),
    # -fa auto turned off by llama.cpp (resolve_fused_ops): layer 2 stays on the CPU but
    # the scheduler runs its flash attention on RPC0; the cache keeps V untransposed
    "lfm2-ngl3-auto-fa-off": ("lfm2", 2, ["-ngl", "3", "-ts", "1,1"]),
    "lfm2-all": ("lfm2", 2, ["-ngl", "all", "-ts", "1,1"]),
    "gpt2-ngl3": ("gpt2", 2, ["-ngl", "3", "-ts", "1,1"]),
    "gemma3n-ngl3": ("gemma3n", 2, ["-ngl", "3", "-ts", "1,1"]),
    "glm4moe-ngl3": ("glm4moe", 2, ["-ngl", "3", "-ts", "1,1"]),
    # -nkvo with flash attention on and a partial offload; -sm none -mg 1 with a partial
    # offload, no repacking and the KV cache on the CPU, in long spellings; every flag in
    # its other llama.cpp spelling (--gpu-layers, --override-tensor, the positive
    # --kv-offload, --repack, --op-offload, --load-mode)
    "ngl3-nkvo-fa-on": ("llama5", 2, ["-ngl", "3", "-ts", "1,1", "-nkvo", "-fa", "on"]),
    "sm-none-mg1-ngl3-no-repack-nkvo": ("llama5", 2, ["--split-mode", "none", "--main-gpu", "1",
                                                      "-ngl", "3", "--no-repack",
                                                      "--no-kv-offload"]),
    "moe-long-spellings": ("mixtral", 2, ["--gpu-layers", "all", "--split-mode", "layer",
                                          "--tensor-split", "1,2", "--override-tensor",
                                          r"blk\.3\.ffn_down_exps=CPU", "--n-cpu-moe", "1",
                                          "--kv-offload", "--repack", "--op-offload",
                                          "--load-mode", "mmap"]),
    # an encoder: no KV cache, flash attention casts K and V to F16 (ggml_cast, whose
    # result is its own src[1]: RPC0 was 0.12 MiB high while the scheduler's copy of the
    # cast pointed at the original node), and without flash attention
    "bert-fa-off": ("bert", 2, ["-ngl", "all", "-ts", "1,1", "-fa", "off"]),
    "bert-fa-on": ("bert", 2, ["-ngl", "all", "-ts", "1,1", "-fa", "on"]),
    # the output layer's own copy of token_embd on RPC1 (all) or RPC0 (partial)
    "gemma2-all": ("gemma2", 2, ["-ngl", "all", "-ts", "1,1"]),
    "gemma2-ngl2": ("gemma2", 2, ["-ngl", "2", "-ts", "1,1"]),
    "cohere2-all": ("cohere2", 2, ["-ngl", "all", "-ts", "1,2"]),
    # -np N: N KV streams per device (n_ctx_seq = 512 / N padded to 256), reserve graphs of
    # N sequences split across the devices; a partial offload without flash attention;
    # sliding-window caches; a hybrid's recurrent state of N cells; CPU only
    "np2-all": ("llama5", 2, ["-ngl", "all", "-ts", "1,1", "-np", "2"]),
    "np3-ngl3-fa-off": ("llama5", 2, ["-ngl", "3", "-ts", "1,1", "-fa", "off", "-np", "3"]),
    "np2-gemma3-iswa": ("gemma3", 2, ["-ngl", "all", "-ts", "1,1", "--parallel", "2"]),
    "np2-lfm2": ("lfm2", 2, ["-ngl", "all", "-ts", "1,1", "-np", "2"]),
    "np2-cpu-only": ("llama5", 0, ["-np", "2"]),
    "np2-moe-ngl2": ("mixtral", 2, ["-ngl", "2", "-ts", "1,1", "-np", "2"]),
    "np3-nkvo-fa-on": ("llama5", 2, ["-ngl", "3", "-ts", "1,1", "-nkvo", "-fa", "on", "-np", "3"]),
    "np2-qwen3moe-tied": ("qwen3moe", 2, ["-ngl", "all", "-ts", "1,3", "-np", "2"]),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rpc-models")
    return {k: Path(w(d / f"{k}.gguf").path) for k, w in WRITERS.items()}


def _device(name: str, servers) -> str:
    """A buffer name llama.cpp logs -> graphcost's row. RPC buffer types are named
    ``RPC<device on that server>[host:port]`` (ggml-rpc.cpp: ggml_backend_rpc_buffer_type),
    so every one-device server's is ``RPC0[...]``; the device is RPC<i> for the i-th server."""
    if "[" not in name:
        return name
    endpoint = name.split("[", 1)[1].rstrip("]")
    return next(f"RPC{i}" for i, s in enumerate(servers) if s.endpoint == endpoint)


def _printed(n: int) -> float:
    return float(f"{n / MiB:.2f}")


def _graphcost(model: Path, n_rpc: int, args: list[str]) -> dict:
    """``graphcost memory MODEL --device rpc ... ARGS --format json`` (in this process)."""
    feats = ",".join(sorted(host_cpu_features())) or "none"
    cmd = ["memory", str(model), "-c", "512", "--format", "json", "--cpu-features", feats]
    for _ in range(n_rpc):
        cmd += ["--device", "rpc"]
    r = CliRunner().invoke(app, cmd + args)
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)["memory"]


@pytest.fixture(scope="module")
def server_sets(tmp_path_factory):
    """One set of servers per count, shared by the cases (each case reads only its own
    part of the servers' logs)."""
    d = tmp_path_factory.mktemp("rpc-servers")
    with contextlib.ExitStack() as stack:
        sets = {}
        for n in sorted({c[1] for c in CASES.values()}):
            (d / f"set{n}").mkdir()
            sets[n] = stack.enter_context(rpc_servers(n, d / f"set{n}"))
        yield sets


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_per_device_buffers_equal_llama_cpp(models, server_sets, case):
    name, n_rpc, args = CASES[case]
    if amx_skip_reason() and "--no-repack" not in args:
        pytest.skip(amx_skip_reason())
    servers = server_sets[n_rpc]
    marks = [s.mark() for s in servers]
    # -ot names a buffer type: the second server's is RPC0[its endpoint]
    llama_args = [a.replace("=RPC1", f"=RPC0[{servers[1].endpoint}]") if "=RPC1" in a else a
                  for a in args]
    run = run_completion(models[name], servers, ["-c", "512"] + llama_args)
    ours = _graphcost(models[name], n_rpc, args)

    # each layer's device (load_tensors' debug lines; the last is the output layer)
    assert run.layers == dict(enumerate(ours["layers"] + [ours["output_layer"]]))

    # every model, KV and output buffer line, by device, at the printed precision
    # (graphcost names an RPC buffer by its device; llama.cpp by server and endpoint)
    def logged(d):
        out: dict[str, list[float]] = {}
        for k, v in d.items():
            out.setdefault(_device(k, servers), []).extend(v)
        return {k: sorted(v) for k, v in out.items()}

    def ours_by(items):
        out: dict[str, list[float]] = {}
        for key, n in items:
            out.setdefault(key, []).append(_printed(n))
        return {k: sorted(v) for k, v in out.items()}

    assert ours_by((b["name"], b["bytes"]) for b in ours["model_buffers"]) == \
        logged(run.model), run.log[-4000:]
    assert ours_by((b["device"], b["bytes"]) for b in ours["kv_buffers"]) == logged(run.kv)
    rows = {r["device"]: r for r in ours["devices"]}
    # recurrent states (hybrids): one RS buffer per device holding layers
    assert ours_by((k, r["recurrent_state_bytes"]) for k, r in rows.items()
                   if r["recurrent_state_bytes"]) == logged(run.rs), run.log[-4000:]
    assert ours_by((k, r["output_bytes"]) for k, r in rows.items() if r["output_bytes"]) == \
        logged(run.output)

    # to the byte: each RPC device's model and KV buffers among its server's allocations
    for i, s in enumerate(servers):
        sizes = s.alloc_sizes(marks[i])
        mine = [b["bytes"] for b in ours["model_buffers"] if b["name"] == f"RPC{i}"]
        mine += [b["bytes"] for b in ours["kv_buffers"] if b["device"] == f"RPC{i}"]
        mine += [rows[f"RPC{i}"]["recurrent_state_bytes"]] if rows.get(f"RPC{i}", {}).get(
            "recurrent_state_bytes") else []
        for n in mine:
            assert n in sizes, (case, f"RPC{i}", n, sizes)

    # compute buffers (sched_reserve), at the printed precision, at the four decimals
    # of ~llama_context's debug line, and each RPC device's to the byte among its
    # server's allocations; the number of graph splits (prompt, generation)
    assert ours_by((k, r["compute_bytes"]) for k, r in rows.items()
                   if r["compute_bytes"] > 1) == logged(run.compute), run.log[-4000:]
    # (the destructor's lines come last; llama.cpp's log thread does not always get them
    # out before the process exits, so they are checked when present)
    for k, v in run.compute4.items():
        assert [float(f"{rows[_device(k, servers)]['compute_bytes'] / MiB:.4f}")] == v, (k, v)
    for i, s in enumerate(servers):
        n = rows.get(f"RPC{i}", {}).get("compute_bytes", 0)  # -sm none keeps one
        if n > 1:
            assert n in s.alloc_sizes(marks[i]), (case, f"RPC{i}", n)
    if ours["scheduler"] is not None:
        graphs = {g["graph"]: g["n_splits"] for g in ours["scheduler"]["graphs"]}
        assert run.splits == (graphs["prompt"], graphs["generation"])


def test_sm_row_is_refused_like_llama_cpp(models, server_sets):
    """RPC has no split buffer type (llama-model.cpp make_gpu_buft_list throws "device
    RPC0 does not support split buffers"; its log thread does not always print it before
    the exit): llama.cpp fails before allocating a model buffer, graphcost says why."""
    servers = server_sets[2]
    with pytest.raises(RuntimeError) as e:
        run_completion(models["llama5"], servers, ["-c", "512", "-ngl", "all", "-sm", "row"])
    assert "model buffer size" not in str(e.value)
    r = CliRunner().invoke(app, ["memory", str(models["llama5"]), "--device", "rpc",
                                 "--device", "rpc", "-sm", "row"])
    assert "device RPC0 does not support split buffers" in str(r.exception)
