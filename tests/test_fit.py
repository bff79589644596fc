"""graphcost fit (llama.cpp's --fit, common/fit.cpp) and memory --max-ctx.

* The search alone, with exact numbers: synthetic measurements whose arithmetic is written
  beside each case.
* The search against llama-fit-params on ggml-rpc-server devices: graphcost's search,
  measuring each candidate with graphcost's model and KV bytes and llama.cpp's own
  compute buffers (logged by ``llama-fit-params --fit-print on``), chooses the argument
  line llama-fit-params prints, for dense and MoE models, one and two devices, budgets
  from "no change" through context reduction to partial MoE layers.
* End to end (graphcost's own compute buffers): the same cases through ``graphcost fit``;
  they skip while per-device compute buffers are not modelled (``graphcost fit`` exits 4,
  "cannot decide") and run as soon as the scheduler simulation gives them.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from graphcost.memory.fit import (MiB, Candidate, DeviceUse, FitInputs, FitResult,
                                  Undecided, fit, largest_context, parse_fit_target)
from graphcost.memory.placement import Override

ROOT = Path(__file__).resolve().parents[1]


# ---- synthetic measurements ------------------------------------------------------------------

def toy_measure(n_layer: int, nd: int, *, layer: int, kv_per_cell: int, compute: int,
                output: int = 0, n_ctx_train: int = 32768):
    """Per device: layers * (layer + kv_per_cell * n_ctx) + compute (if it holds a layer)
    + output (the device with the output layer). Layers follow -ts as layer counts
    (nd > 1) or -ngl (one device); the output layer is the last offloaded one."""
    calls: list[Candidate] = []

    def measure(c: Candidate) -> list[DeviceUse]:
        calls.append(c)
        n_ctx = c.n_ctx or n_ctx_train
        ngl = n_layer + 1 if c.n_gpu_layers < 0 else min(c.n_gpu_layers, n_layer + 1)
        if nd == 1:
            counts = [ngl]
        elif any(c.tensor_split):
            counts = [int(x) for x in c.tensor_split]
        else:
            counts = [ngl // nd + (1 if i < ngl % nd else 0) for i in range(nd)]
        last = max((i for i in range(nd) if counts[i]), default=None)
        out = []
        for i, n in enumerate(counts):
            reps = n - (1 if i == last else 0)  # the output layer is not a repeating layer
            m = reps * layer + (output if i == last else 0)
            out.append(DeviceUse(m, reps * kv_per_cell * n_ctx, compute if n else 0))
        return out
    return measure, calls


def inputs(nd=1, free=100 * MiB, margin=10 * MiB, **kw) -> FitInputs:
    base = dict(devices=tuple(f"CUDA{i}" for i in range(nd)), free=(free,) * nd,
                margins=(margin,) * nd, n_layer=8, n_ctx_train=32768, n_expert=0)
    base.update(kw)
    return FitInputs(**base)


def test_no_change_needed():
    # 8 layers * 1 MiB + output 1 MiB + KV 8 * 32768 * 64 B (16 MiB) + compute 4 MiB
    # = 29 MiB <= 100 - 10: the line keeps -c (the training context) and -ngl -1
    m, calls = toy_measure(8, 1, layer=MiB, kv_per_cell=64, compute=4 * MiB, output=MiB)
    r = fit(inputs(), m)
    assert (r.status, r.args_line(), r.projected) == ("fit", "-c 32768 -ngl -1", [29 * MiB])
    assert len(calls) == 1


def test_one_device_reduces_context_by_interpolation():
    # at 32768 cells: 8 MiB weights + 1 MiB output + 8 * 32768 * 512 B = 128 MiB KV + 4 MiB
    # compute = 141 MiB; at 4096: 9 + 16 + 4 = 29 MiB. Target 100 - 10 = 90 MiB:
    # n_ctx = 4096 + (32768 - 4096) * (90 - 29) MiB / (141 - 29) MiB = 4096 + 15616 = 19712
    # (28672 * 61 // 112 = 15616), a multiple of 256 already
    m, calls = toy_measure(8, 1, layer=MiB, kv_per_cell=512, compute=4 * MiB, output=MiB)
    r = fit(inputs(), m)
    assert r.args_line() == "-c 19712 -ngl -1"
    assert [c.n_ctx for c in calls] == [0, 4096]


def test_context_rounds_down_to_256_and_stops_at_fitc():
    # 500 B of KV per cell and layer; -fitc 1000. At 32768 cells: 9 MiB + 8 * 32768 * 500 +
    # 4 MiB = 144703488 B; at 1000: 9 MiB + 4000000 + 4 MiB = 17631488 B; target 90 MiB =
    # 94371840 B: 1000 + 31768 * 76740352 // 127072000 = 1000 + 19185 = 20185 -> 19968
    # (20185 - 20185 % 256)
    m, _ = toy_measure(8, 1, layer=MiB, kv_per_cell=500, compute=4 * MiB, output=MiB)
    assert fit(inputs(n_ctx_min=1000), m).args_line() == "-c 19968 -ngl -1"
    m, _ = toy_measure(8, 1, layer=MiB, kv_per_cell=512, compute=4 * MiB, output=MiB)
    # the minimum itself does not fit: n_ctx stays at the minimum, then layers are cut
    # (free 20 MiB, margin 2 -> target 18 MiB; at 4096 cells a layer is 1 MiB + 2 MiB KV):
    # 0 layers -> 0; 9 layers (8 + output) -> 29 MiB > 18; false position: 9 * 18 / 29 = 5
    # layers (4 repeating + output: 4 * 3 + 1 + 4 = 17 <= 18), then 6 (5*3+1+4 = 20 > 18)
    r = fit(inputs(free=20 * MiB, margin=2 * MiB), m)
    assert r.args_line() == "-c 4096 -ngl 5"
    assert r.projected == [17 * MiB]


def test_cpu_only_reduces_context_or_gives_up():
    # no devices (fit.cpp nd == 0): the host's buffers against its total memory, margin 0's.
    # The numbers of test_one_device_reduces_context_by_interpolation: 141 MiB at 32768
    # cells, 29 at 4096, target 90 -> 19712, and the line keeps -ngl -1
    m, calls = toy_measure(8, 1, layer=MiB, kv_per_cell=512, compute=4 * MiB, output=MiB)
    r = fit(replace(inputs(), devices=(), free=(100 * MiB,), margins=(10 * MiB,)), m)
    assert (r.status, r.args_line(), r.devices) == ("fit", "-c 19712 -ngl -1", ("Host",))
    assert r.log[0] == "projected to use 141 MiB of host memory vs. 100 MiB of total host memory"
    # target 20 - 2 = 18 MiB < 29 at the minimum context: a device would go on to cut
    # layers (test_context_rounds_down_to_256_and_stops_at_fitc); the host gives up
    r = fit(replace(inputs(), devices=(), free=(20 * MiB,), margins=(2 * MiB,)), m)
    assert r.status == "fail"
    assert r.reason == "was unable to fit model into system memory by reducing context, abort"


def test_parallel_sequences_measure_again_and_align_per_stream():
    # -np 2: n_ctx_max = 2 * 32768 = 65536 (measured again there), the minimum 2 * 4096 =
    # 8192. KV 8 layers * 256 B per cell: at 65536: 9 + 128 + 4 = 141 MiB; at 8192: 9 + 16 +
    # 4 = 29; target 90: 8192 + 57344 * 61 // 112 = 8192 + 31232 = 39424, a multiple of
    # 256 * 2 = 512 (77 * 512): kept
    m, calls = toy_measure(8, 1, layer=MiB, kv_per_cell=256, compute=4 * MiB, output=MiB)
    r = fit(inputs(n_seq=2), m)
    assert r.args_line() == "-c 39424 -ngl -1"
    assert [c.n_ctx for c in calls] == [0, 65536, 8192]


def test_user_context_is_kept_and_user_ngl_makes_the_fit_give_up():
    m, _ = toy_measure(8, 1, layer=MiB, kv_per_cell=512, compute=4 * MiB, output=MiB)
    # -c 32768 -ngl 99: 141 MiB > 90, the context is the user's, and -ngl may not change
    r = fit(inputs(n_ctx=32768, n_gpu_layers=99), m)
    assert r.status == "fail"
    assert r.reason == "n_gpu_layers already set by user to 99, abort"
    r = fit(inputs(n_ctx=2048, n_gpu_layers=99), m)  # 9 + 8 + 4 = 21 MiB: nothing to change
    assert (r.status, r.args_line()) == ("fit", "-c 2048 -ngl 99")


def test_two_devices_fill_back_to_front():
    # ctx 4096 given (-c): a layer is 1 MiB + 8 KiB * ... kv 512 B * 4096 = 2 MiB -> 3 MiB;
    # target per device 16 - 2 = 14 MiB. Last device first: all 9 layers = 8 * 3 + 1 + 4 = 29
    # > 14; false position 9 * 14 / 29 = 4 -> (3 * 3 + 1 + 4 = 14 <= 14) keep 4; then 5: 4*3+1+4
    # = 17 > 14: CUDA1 holds 4 layers (3 repeating + output). CUDA0: 5 unassigned, 5 * 3 + 4 =
    # 19 > 14; 5 * 14 / 19 = 3 -> 3 * 3 + 4 = 13 keep; 4 -> 16 > 14: CUDA0 holds 3.
    m, _ = toy_measure(8, 2, layer=MiB, kv_per_cell=512, compute=4 * MiB, output=MiB)
    r = fit(inputs(nd=2, free=16 * MiB, margin=2 * MiB, n_ctx=4096), m)
    assert r.args_line() == "-c 4096 -ngl 7 -ts 3,4"
    assert [(x.n_layer, x.n_part) for x in r.layers] == [(3, 0), (4, 0)]
    assert r.projected == [13 * MiB, 14 * MiB]


def test_tensor_split_trailing_zeros_are_not_printed():
    # llama-fit-params prints tensor_split up to its last non-zero entry, as uint32
    r = FitResult("fit", 4096, 3, (3.0, 0.0), ())
    assert r.args_line() == "-c 4096 -ngl 3"
    r = FitResult("fit", 4096, 3, (0.0, 3.0), (Override(r"blk\.1\.ffn_down.*", "CUDA1"),
                                             Override("x", "CPU")))
    assert r.args_line() == r'-c 4096 -ngl 3 -ts 0,3 -ot "blk\.1\.ffn_down.*=CUDA1,x=CPU"'


def test_negative_target_wraps_like_c():
    # margin above the free memory: target -1 MiB; the false-position step is
    # uint32(delta * (target - mem) / (high - mem)), negative -> wraps -> clamped to delta - 1
    m, calls = toy_measure(8, 1, layer=MiB, kv_per_cell=0, compute=0, output=MiB)
    r = fit(inputs(free=10 * MiB, margin=11 * MiB, n_ctx=4096), m)
    assert r.args_line() == "-c 4096 -ngl 0"
    # 0 layers, then all 9, then steps of delta - 1: 8, 7, ..., 1
    assert [c.n_gpu_layers for c in calls[1:]] == [0, 9, 8, 7, 6, 5, 4, 3, 2, 1]


def test_fit_target_parsing():
    assert parse_fit_target(None)[:2] == [1024 * MiB, 1024 * MiB]
    assert parse_fit_target("512")[:3] == [512 * MiB] * 3  # one value: every device
    assert parse_fit_target("100,200/300")[:4] == [100 * MiB, 200 * MiB, 300 * MiB, 1024 * MiB]


def test_largest_context_binary_search():
    # fits while n_ctx <= 5000: the largest multiple of 256 is 4864 (19 * 256)
    m = largest_context(32768, lambda n: n <= 5000)
    assert m.n_ctx == 4864 and m.limit == 32768
    assert largest_context(3000, lambda n: True).n_ctx == 3072  # the training context, padded
    assert largest_context(32768, lambda n: False).n_ctx == 0


def test_largest_context_stops_at_the_largest_ctx_llama_cpp_accepts(tmp_path, cli):
    """A 10M-token training context (Llama 4 Scout: 10,485,760) with -np 256 is searched up
    to 2,684,354,560 cells, above INT32_MAX = 2,147,483,647, the largest -c llama.cpp reads:
    the first probe failed with '--ctx-size ... is above 2147483647' (QA sweep 2026-11-27).
    The search now stops at the largest multiple of the step (256 x 256 = 65,536) below
    it: 32,767 x 65,536 = 2,147,418,112."""
    m = largest_context(10485760 * 256, lambda n: True, pad_to=256 * 256)
    assert (m.n_ctx, m.limit) == (32767 * 65536, 2147418112)
    from fixtures import write_llama
    f = write_llama(tmp_path / "long.gguf", n_layer=1, n_embd=64, n_head=2, n_head_kv=1,
                    n_ff=64, n_vocab=260, context_length=10485760)
    r = cli("memory", str(f.path), "--max-ctx", "--device", "cuda:8GiB", "-np", "256",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["max_ctx"]["searched_up_to"] == 2147418112


def _undecided(c):
    raise Undecided("cannot decide: RPC0's compute buffer is not modelled")


def test_undecided_propagates():
    with pytest.raises(Undecided):
        fit(inputs(), _undecided)


# ---- the CLI ----------------------------------------------------------------------------

class _Run:
    def __init__(self, code, out, err):
        self.returncode, self.stdout, self.stderr = code, out, err


@pytest.fixture
def cli(monkeypatch, capsys):
    """``graphcost ARGS`` in this process, through the entry point that turns errors into
    one line and an exit code (graphcost.cli.main)."""
    from graphcost.cli import main

    def run(*args: str) -> _Run:
        monkeypatch.setattr(sys, "argv", ["graphcost", *args])
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main()
        out = capsys.readouterr()
        return _Run(e.value.code, out.out, out.err)
    return run


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from fixtures import write_llama
    from fixtures_moe import write_mixtral
    d = tmp_path_factory.mktemp("fit-models")
    return {"llama": Path(write_llama(d / "llama.gguf", n_layer=5, context_length=32768).path),
            "mixtral": Path(write_mixtral(d / "mix.gguf", n_layer=4, context_length=32768).path)}


@pytest.mark.parametrize("args, message", [
    (["--device", "rpc:1GiB", "-fitt", "abc"], "-fitt 'abc': use MiB per device"),
    (["--device", "rpc"], "fit: give the free memory of RPC0"),
    (["--device", "rpc:1GiB", "--host-memory", "8GiB"], "--host-memory goes without devices"),
    # llama_context refuses n_seq_max above LLAMA_MAX_SEQ (-np 0 is max(1, 0) = 1)
    (["-np", "257"], "--parallel 257 must be between 0 and 256"),
    (["--device", "rpc:1GiB", "--format", "html"], "--format 'html': use text or json"),
    (["--device", "rpc:1GiB", "--fit-ctx", "-5"], "--fit-ctx -5: must be >= 0"),
    (["--device", "rpc:1GiB", "-lm", "bogus"], "--load-mode 'bogus': use one of"),
    (["--device", "rpc:1GiB", "-sm", "row"], "does not support split buffers"),
], ids=["fitt", "no-mem", "host-mem-with-device", "np257", "format", "fitc", "load-mode",
        "sm-row"])
def test_bad_flags_one_line(models, cli, args, message):
    r = cli("fit", str(models["llama"]), *args)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_not_modelled_is_undecided(models, cli):
    # vulkan's alignment is device-dependent: its model bytes are not modelled, so the fit
    # cannot decide (exit 4), never counting them as 0
    r = cli("fit", str(models["llama"]), "--device", "vulkan:1GiB", "--format", "json")
    assert r.returncode == 4
    doc = json.loads(r.stdout)
    assert doc["fit"]["status"] == "undecided" and "Vulkan0's model" in doc["fit"]["reason"]
    r = cli("memory", str(models["llama"]), "--device", "vulkan:1GiB", "--max-ctx")
    assert r.returncode == 4 and "cannot decide" in r.stderr


def test_host_memory_is_the_cpu_only_budget(models, cli):
    # llama5 at its training context (32768 cells) uses ~80 MiB of host memory
    # (test_cpu_only_fit_equals_llama_fit_params): 1 GiB - 0 margin holds it unchanged
    r = cli("fit", str(models["llama"]), "--host-memory", "1GiB", "-fitt", "0")
    assert (r.returncode, r.stdout.strip().splitlines()[-1]) == (0, "-c 32768 -ngl -1")
    assert "of total host memory" in r.stdout and "Host" in r.stdout
    # 1024 - 1015 = 9 MiB: less than the ~16 MiB at the minimum context (4096): gives up
    r = cli("fit", str(models["llama"]), "--host-memory", "1GiB", "-fitt", "1015")
    assert r.returncode == 1 and "unable to fit model into system memory" in r.stderr


# ---- against llama-fit-params --------------------------------------------------------------

#: (model, number of RPC servers, -fitt MiB): the free memory is this machine's RAM
#: (ggml-rpc-server reports it), so the margin sets the budget; chosen from "no change" to
#: partial MoE layers overflowing to the next device
REAL_CASES = {
    "dense-2dev-no-change": ("llama", 2, 23900),
    "dense-2dev-ctx": ("llama", 2, 24000),
    "dense-2dev-ctx-min": ("llama", 2, 24080),
    "dense-2dev-layers": ("llama", 2, 24095),
    "dense-1dev-ctx": ("llama", 1, 24060),
    "dense-1dev-layers": ("llama", 1, 24095),
    "moe-2dev-ctx-gate": ("mixtral", 2, 24000),
    "moe-2dev-attn-overflow": ("mixtral", 2, 24090),
    "moe-2dev-partial": ("mixtral", 2, 24095),
    "moe-1dev-partial": ("mixtral", 1, 24090),
}


def _real_skip():
    from fit_runs import skip_reason
    return skip_reason()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from llama_runs import rpc_servers
    if _real_skip():
        pytest.skip(_real_skip())
    with rpc_servers(2, tmp_path_factory.mktemp("fit-rpc")) as s:
        yield s


#: -np N (n_seq_max; llama-fit-params' cache is not unified: N KV streams, fit.cpp
#: n_streams): (model, RPC servers (0: CPU-only), -fitt MiB, N); the search with llama.cpp's
#: compute buffers, and end to end with graphcost's own
NP_CASES = {
    "np2-cpu-ctx": ("llama", 0, 24050, 2),
    "np2-1dev-ctx": ("llama", 1, 24060, 2),
    "np2-2dev-ctx": ("llama", 2, 24000, 2),
    "np3-2dev-layers": ("llama", 2, 24095, 3),
    "np2-moe-2dev-partial": ("mixtral", 2, 24095, 2),
}


def _search(models, servers, name, nd, margin, n_seq=1):
    """(graphcost's search with llama.cpp's compute buffers, llama-fit-params' line)."""
    from fit_runs import fit_params, host_memory, llama_compute
    from graphcost.graph.build import load_model
    from graphcost.graph.settings import RunSettings
    from graphcost.memory.backends import host_cpu_features
    from graphcost.memory.fit import fit_inputs, graphcost_measure
    from graphcost.memory.placement import DeviceArg, PlacementFlags
    used = servers[:nd]
    extra = ["-np", str(n_seq)] if n_seq > 1 else []
    expected, _ = fit_params(models[name], used, ["-fitt", str(margin)] + extra)
    info = load_model(models[name])
    args = [DeviceArg("rpc", host_memory())] * nd
    flags = PlacementFlags(cpu_features=host_cpu_features())
    inp = fit_inputs(info, args, flags, n_ctx=0, margins=[margin * MiB] * max(nd, 1),
                     n_ctx_min=4096, host_total=None if nd else host_memory(), n_seq=n_seq)
    measure = graphcost_measure(info, RunSettings(ctx_size=0, n_seq_max=n_seq), args, flags,
                                compute=llama_compute(models[name], used, extra))
    r = fit(inp, measure)
    return (r.args_line() if r.status == "fit" else "failed"), expected, r


@pytest.mark.parametrize("case", list(REAL_CASES), ids=list(REAL_CASES))
def test_search_equals_llama_fit_params(models, servers, case):
    """graphcost's search with llama.cpp's own compute buffers chooses what llama.cpp does."""
    name, nd, margin = REAL_CASES[case]
    ours, expected, r = _search(models, servers, name, nd, margin)
    assert ours == expected, "\n".join(r.log)


@pytest.mark.parametrize("case", list(NP_CASES), ids=list(NP_CASES))
def test_search_with_parallel_sequences_equals_llama_fit_params(models, servers, case):
    """-np N: the context is measured again at N times the training context, reduced in
    steps of 256 N cells; the KV cache of N streams (graphcost's, N * n_ctx_seq cells)."""
    name, nd, margin, n_seq = NP_CASES[case]
    ours, expected, r = _search(models, servers, name, nd, margin, n_seq)
    assert ours == expected, "\n".join(r.log)
    # the context is a multiple of 256 cells per stream
    assert r.n_ctx % (256 * n_seq) == 0


@pytest.mark.parametrize("case", list(NP_CASES), ids=list(NP_CASES))
def test_graphcost_fit_with_parallel_sequences_equals_llama_fit_params(models, servers, cli,
                                                                      case):
    """End to end, ``graphcost fit -np N``: graphcost's N-stream KV cache and compute
    buffers of the N-sequence reserve graphs; without devices the host's."""
    from fit_runs import fit_params, host_memory
    from graphcost.memory.backends import host_cpu_features
    name, nd, margin, n_seq = NP_CASES[case]
    feats = ",".join(sorted(host_cpu_features())) or "none"
    devices = ["--device", f"rpc:{host_memory()}"] * nd if nd else [
        "--host-memory", str(host_memory())]
    r = cli("fit", str(models[name]), *devices, "-fitt", str(margin), "-np", str(n_seq),
            "--cpu-features", feats)
    if r.returncode == 4:
        pytest.skip(f"pending per-device compute buffers: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    expected, _ = fit_params(models[name], servers[:nd], ["-fitt", str(margin), "-np", str(n_seq)])
    assert r.stdout.strip().splitlines()[-1] == expected


@pytest.mark.parametrize("case", list(REAL_CASES), ids=list(REAL_CASES))
def test_graphcost_fit_equals_llama_fit_params(models, servers, cli, case):
    """End to end, graphcost's own compute buffers. Skips while they are not modelled.
    Needs ``plan_devices(no_alloc=True)`` honoured (the first prompt graph only, without the
    graph callback's pins): with a real run's compute buffers instead, dense-2dev-ctx and
    moe-2dev-ctx-gate come out 256 cells off (21248 for 20992, 21504 for 21248)."""
    from fit_runs import fit_params, host_memory
    from graphcost.memory.backends import host_cpu_features
    name, nd, margin = REAL_CASES[case]
    feats = ",".join(sorted(host_cpu_features())) or "none"
    r = cli("fit", str(models[name]), *(["--device", f"rpc:{host_memory()}"] * nd),
            "-fitt", str(margin), "--cpu-features", feats)
    if r.returncode == 4:
        pytest.skip(f"pending per-device compute buffers: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    expected, _ = fit_params(models[name], servers[:nd], ["-fitt", str(margin)])
    assert r.stdout.strip().splitlines()[-1] == expected


#: CPU-only (llama-fit-params without --rpc: fit.cpp's nd == 0): (model, MiB the buffers may
#: use = the host's total memory - the margin, flags; MARGIN: that margin, set from this
#: machine's memory (the CPU device reports its total), so the cases run the same anywhere)
CPU_CASES = {
    "cpu-no-change": ("llama", 105, ["-fitt", "MARGIN"]),
    "cpu-ctx": ("llama", 55, ["--fit-target", "MARGIN"]),
    "cpu-ctx-small": ("llama", 25, ["-fitt", "MARGIN"]),
    "cpu-gives-up": ("llama", 16, ["-fitt", "MARGIN"]),
    "cpu-moe-fitc": ("mixtral", 35, ["-fitt", "MARGIN", "-fitc", "2048"]),
    "cpu-moe-user-ctx": ("mixtral", 55, ["--fit-target", "MARGIN", "-c", "8192"]),
    "cpu-moe-fitc-small": ("mixtral", 16, ["-fitt", "MARGIN", "--fit-ctx", "512"]),
}


@pytest.mark.parametrize("case", list(CPU_CASES), ids=list(CPU_CASES))
def test_cpu_only_fit_equals_llama_fit_params(models, cli, case):
    """``graphcost fit`` without --device: the host's CPU buffers (model without mmap, KV,
    CPU compute; not CPU_REPACK) against its total memory, as llama-fit-params does on a
    machine without devices: the same line, or both give up (exit 1)."""
    from fit_runs import fit_params, host_memory
    from graphcost.memory.backends import host_cpu_features
    if _real_skip():
        pytest.skip(_real_skip())
    name, budget, flags = CPU_CASES[case]
    args = [str(host_memory() // MiB - budget) if a == "MARGIN" else a for a in flags]
    feats = ",".join(sorted(host_cpu_features())) or "none"
    expected, _ = fit_params(models[name], [], args)
    r = cli("fit", str(models[name]), "--cpu-features", feats, *args)
    if expected == "failed":
        assert r.returncode == 1 and "unable to fit model into system memory" in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == expected


def test_dev_none_is_the_cpu_only_fit(models, servers, cli):
    """-dev none with two RPC devices: no device is used, so llama.cpp fits the host alone
    (fit.cpp nd == 0), as without --rpc; graphcost likewise (its default host memory)."""
    from fit_runs import fit_params, host_memory
    from graphcost.memory.backends import host_cpu_features
    margin = str(host_memory() // MiB - 55)
    expected, _ = fit_params(models["llama"], servers, ["-dev", "none", "-fitt", margin])
    assert expected == fit_params(models["llama"], [], ["-fitt", margin])[0]
    feats = ",".join(sorted(host_cpu_features())) or "none"
    r = cli("fit", str(models["llama"]), *(["--device", f"rpc:{host_memory()}"] * 2),
            "-dev", "none", "-fitt", margin, "--cpu-features", feats)
    assert (r.returncode, r.stdout.strip().splitlines()[-1]) == (0, expected)


# ---- a MoE model, tensor by tensor -------------------------------------------------------------

def toy_moe_measure(n_layer: int, devices: tuple[str, ...], sizes: dict[str, int], output: int,
                    compute: int):
    """Tensors ``blk.i.NAME`` of ``sizes`` bytes per layer and an output layer of ``output``
    bytes. Layers go to devices as llama.cpp places them (the last ngl of n_layer + 1, in
    -ts counts); the first -ot pattern that matches a tensor (re.search) moves it to its
    target (CPU: counted nowhere). A device holding any layer has ``compute`` bytes."""
    import re
    calls: list[Candidate] = []

    def measure(c: Candidate) -> list[DeviceUse]:
        calls.append(c)
        nd = len(devices)
        ngl = n_layer + 1 if c.n_gpu_layers < 0 else c.n_gpu_layers
        counts = [int(x) for x in c.tensor_split] if nd > 1 and any(c.tensor_split) else [ngl]
        owner = {}
        il = n_layer + 1 - ngl
        for d, n in zip(devices, counts):
            for _ in range(n):
                owner[il] = d
                il += 1
        use = {d: 0 for d in devices}
        for il, d in owner.items():
            if il == n_layer:
                use[d] += output
                continue
            for name, nbytes in sizes.items():
                full = f"blk.{il}.{name}"
                target = next((o.target for o in c.overrides if re.search(o.pattern, full)), d)
                if target != "CPU":
                    use[target] += nbytes
        return [DeviceUse(use[d], 0, compute if d in owner.values() else 0) for d in devices]
    return measure, calls


MOE_SIZES = {"attn_q.weight": 3 * MiB, "ffn_gate_inp.weight": MiB,
             "ffn_up_exps.weight": 4 * MiB, "ffn_gate_exps.weight": 4 * MiB,
             "ffn_down_exps.weight": 4 * MiB}


def test_moe_dense_first_then_full_layers_front_to_back():
    # 4 layers: dense part 3 + 1 = 4 MiB, experts 12 MiB (a full layer 16), output 2 MiB,
    # compute 1 MiB; two devices of 40 MiB, margin 10 -> target 30 MiB each.
    # Experts-on-CPU measurement (this toy puts every layer on CUDA0 without -ts):
    # 4 * 4 + 2 + 1 = 19 -> surplus (40 - 19 - 10) + (40 - 10) = 41 MiB > 0: step 4 runs.
    # Step 3, CUDA1: 5 layers, 4 partial. fit.cpp's overrides start after the device's full
    # layers, so layer 0 stays full and the partial ones are 1-4 (4 = output: no match):
    # 16 + 3 * 4 + 2 + 1 = 31 > 30; step 5 * 30 // 31 = 4: layer 1 full, 2-3 dense-only,
    # output: 16 + 8 + 2 + 1 = 27 <= 30. CUDA0: layer 0 dense-only, 4 + 1 = 5 <= 30.
    # Step 4, CUDA0: all 4 repeating layers full: 65 > 30; step 4 * 25 // 60 = 1: layer 0
    # full, 17 <= 30; step 3 * 13 // 48 -> 1: layers 0-1 full, 33 > 30: CUDA0 keeps 1.
    # One more layer on CUDA0 with attention + up, overflowing to CUDA1: CUDA1 would hold
    # 16 + 4 + 2 + 9 (gate, down, router) + 1 = 32, not < 30; attention only: 36: neither.
    # CUDA1: 4 full layers (51) too many; 1 more full (39) too; one more layer with
    # attention + up kept (overflow to the CPU, the last device): 16 + 7 + 4 + 2 + 1 = 30,
    # not < 30 (strict); attention only: 16 + 3 + 4 + 2 + 1 = 26 < 30: taken.
    devs = ("CUDA0", "CUDA1")
    m, calls = toy_moe_measure(4, devs, MOE_SIZES, output=2 * MiB, compute=MiB)
    r = fit(FitInputs(devs, (40 * MiB,) * 2, (10 * MiB,) * 2, n_layer=4, n_ctx_train=4096,
                      n_expert=8), m)
    assert r.args_line() == (r'-c 4096 -ngl 5 -ts 1,4 -ot "blk\.2\.ffn_(gate|up|gate_up|down).*=CPU,'
                             r'blk\.3\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU,'
                             r'blk\.4\.ffn_(up|down|gate_up|gate)_(ch|)exps=CPU"')
    assert r.projected == [17 * MiB, 26 * MiB]
    assert [(x.n_layer, x.n_part, x.overflow_type) for x in r.layers] == \
        [(1, 0, "MOE"), (4, 3, "ATTN")]
    # given, experts on the CPU, no layers; step 3: 2 + 1; step 4: CUDA0 2 + UP + ATTN + 1,
    # CUDA1 1 + UP + ATTN + 1 (the training context 4096 is not above -fitc: no reduction)
    assert len(calls) == 1 + 1 + 1 + 3 + 5 + 4


def test_text_ends_with_the_argument_line_and_json_has_the_same_choice():
    from graphcost.report.fit import render_fit
    m, _ = toy_measure(8, 2, layer=MiB, kv_per_cell=512, compute=4 * MiB, output=MiB)
    r = fit(inputs(nd=2, free=16 * MiB, margin=2 * MiB, n_ctx=4096), m)  # as above
    assert render_fit(r, "toy").splitlines()[-1] == "-c 4096 -ngl 7 -ts 3,4"
    d = r.as_dict()
    assert (d["status"], d["n_ctx"], d["n_gpu_layers"], d["tensor_split"], d["overrides"]) == \
        ("fit", 4096, 7, [3.0, 4.0], [])
    assert [(x["device"], x["layers"], x["projected_bytes"], x["margin_bytes"])
            for x in d["devices"]] == [("CUDA0", 3, 13 * MiB, 2 * MiB), ("CUDA1", 4, 14 * MiB, 2 * MiB)]
    assert d["args"] == "-c 4096 -ngl 7 -ts 3,4"


@pytest.mark.parametrize("budget_mib", [60, 150], ids=["60MiB", "150MiB"])
def test_max_ctx_is_the_largest_that_fits_a_real_run(models, servers, cli, budget_mib):
    """memory --max-ctx N: llama.cpp's real run at -c N holds at most the budget on every
    RPC server (its allocations, to the byte), and at N + 256 more on one. Skips while
    per-device compute buffers are not modelled."""
    from fit_runs import peak_bytes
    from graphcost.memory.backends import host_cpu_features
    from llama_runs import run_completion
    feats = ",".join(sorted(host_cpu_features())) or "none"
    r = cli("memory", str(models["llama"]), *(["--device", f"rpc:{budget_mib}MiB"] * 2),
            "--max-ctx", "--format", "json", "--cpu-features", feats)
    if r.returncode == 4:
        pytest.skip(f"pending per-device compute buffers: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout)["max_ctx"]["max_ctx"]
    assert 0 < n < 32768

    def peaks(n_ctx: int) -> list[int]:
        since = [s.log.stat().st_size for s in servers]
        run_completion(models["llama"], servers, ["-c", str(n_ctx)])
        return [peak_bytes(s, o) for s, o in zip(servers, since)]

    assert max(peaks(n)) <= budget_mib * MiB
    assert max(peaks(n + 256)) > budget_mib * MiB
