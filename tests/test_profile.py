"""graphcost profile / hwprobe / analyze --hardware: documents, roll-ups, roofline arithmetic,
profile files, bad flags. No timing is asserted (the machine is shared)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import fixtures as F
from graphcost.cost import hardware as hwmod
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import GraphcostError
from graphcost.cost.hardware import Hardware, roofline_seconds
from graphcost.report.profile import RENDERERS, ProfileFormat
from graphcost.cost.roofline import estimate
from graphcost.graph.settings import RunSettings
from graphcost.execute import profile
from graphcost.execute.executor import Executor

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return F.write_llama(tmp_path_factory.mktemp("profile") / "llama.gguf", n_layer=2)


def test_every_profile_format_has_a_renderer():
    assert set(RENDERERS) == set(ProfileFormat)


def test_nodes_and_rollups_report_rates_the_same_way():
    from graphcost.execute.profile import NodeRow, Rollup
    # 3e6 bytes and 8e6 FLOPs in 2 ms: 1.5 GB/s, 4 GFLOP/s; roofline 1 ms: ratio 0.5
    n = NodeRow(0, "kq-0", "MUL_MAT", 0, "attention", False, 2e-3, 3_000_000, 8_000_000, 1e-3,
                "memory", None)
    r = Rollup("MUL_MAT", 1, 2e-3, 3_000_000, 8_000_000, 1e-3)
    for x in (n, r):
        assert (x.gbps, x.gflops, x.ratio) == pytest.approx((1.5, 4.0, 0.5))
    # nothing measured (a view), or a figure missing (unmodelled): no rate, not zero
    view = NodeRow(1, "v", "VIEW", 0, "attention", True, None, 0, 0, 0.0, None, None)
    unmod = NodeRow(2, "u", "CUSTOM", 0, "attention", False, 1e-3, None, None, None, None, None)
    assert (view.gbps, view.gflops, view.ratio) == (None, None, None)
    assert (unmod.gbps, unmod.gflops, unmod.ratio) == (None, None, None)
    assert (Rollup("x").gbps, Rollup("x").ratio) == (None, None)


def test_roofline_takes_the_larger_bound():
    hw = Hardware("t", bandwidth=10e9, peak_flops=100e9)
    # 1 MB at 10 GB/s = 100 us > 1 MFLOP at 100 GFLOP/s = 10 us
    assert roofline_seconds(1e6, 1e6, hw) == (1e-4, "memory")
    # 1 MB, 100 MFLOP: 1 ms of compute
    assert roofline_seconds(1e6, 1e8, hw) == (1e-3, "compute")


def test_bundled_profiles_cite_their_sources(tmp_path, monkeypatch):
    # the bundled ones only: a profile the user's own hwprobe or calibrate wrote (the
    # user's configuration directory, platformdirs reads XDG_CONFIG_HOME) is not checked here
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    names = hwmod.available()
    assert names == sorted(p.stem for p in hwmod.hardware_dir().glob("*.yaml"))
    assert len(names) >= 3
    for name in names:
        hw = hwmod.load(name)
        doc = hw.extra
        assert hw.bandwidth > 1e9 and hw.peak_flops > 1e9
        for key in ("memory_bandwidth", "peak_flops"):
            assert doc[key]["source"] and doc[key]["how"], (name, key)


def test_unknown_profile_is_a_one_line_error():
    with pytest.raises(GraphcostError, match="no such profile"):
        hwmod.load("no-such-machine")


def test_roofline_estimate_sums_its_nodes(llama):
    a = analyze_graph(build_graph(load_model(llama), RunSettings(ctx_size=256, tokens=4)))
    hw = hwmod.load("raspberry-pi-5")
    est = estimate(a, hw)
    per = [s for s in est.per_node if s is not None]
    assert est.seconds == pytest.approx(sum(per))
    assert est.seconds == pytest.approx(sum(o.seconds for o in est.by_op))
    assert est.seconds == pytest.approx(est.memory_seconds + est.compute_seconds)
    for nc, s in zip(a.nodes, est.per_node):
        if nc.node.op in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"):
            assert s == 0.0
        else:
            c = nc.cost
            assert s == max((c.bytes_read + c.bytes_written) / hw.bandwidth, c.flops / hw.peak_flops)


def test_analyze_with_hardware(llama, tmp_path):
    r = cli("analyze", llama.path, "--hardware", "apple-m2", "-c", 256)
    assert r.returncode == 0, r.stderr
    assert "Roofline on apple-m2" in r.stdout and "tokens/s" in r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines())
    out = tmp_path / "a.json"
    r = cli("analyze", llama.path, "--hardware", "apple-m2", "-c", 256, "-f", "json", "-o", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    roof = d["roofline"]
    assert roof["hardware"]["name"] == "apple-m2"
    assert roof["seconds"] == pytest.approx(sum(n["roofline_seconds"] or 0 for n in d["nodes"]))
    assert roof["tokens_per_second"] == pytest.approx(1 / roof["seconds"])
    # without --hardware the document is unchanged
    out2 = tmp_path / "b.json"
    assert cli("analyze", llama.path, "-c", 256, "-f", "json", "-o", out2).returncode == 0
    assert "roofline" not in json.loads(out2.read_text())


def test_profile_json_document(llama, tmp_path):
    out = tmp_path / "p.json"
    r = cli("profile", llama.path, "--token-ids", "3,10,17", "--greedy", 2, "--repeat", 2,
            "--hardware", "raspberry-pi-5", "-c", 256, "-f", "json", "-o", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["schema"] == 1 and d["executor"]["repeat"] == 2
    steps = d["steps"]
    assert [s["n_tokens"] for s in steps] == [3, 1, 1]
    assert [s["past"] for s in steps] == [0, 3, 4]
    for s in steps:
        assert len(s["top5"]) == 5 and s["argmax"] == s["top5"][0][0]
        logits = [v for _, v in s["top5"]]
        assert logits == sorted(logits, reverse=True)
        for n in s["nodes"]:
            assert (n["seconds"] is None) == n["view"]
            if not n["view"]:
                assert n["seconds"] > 0 and n["predicted_seconds"] > 0
                assert n["ratio"] == pytest.approx(n["predicted_seconds"] / n["seconds"])
                # a datasheet profile has no overhead, rates or curves: model = roofline,
                # but flash attention's on the cells it attends (<= all n_kv cells)
                if n["op"] == "FLASH_ATTN_EXT":
                    assert 0 < n["modelled_seconds"] <= n["predicted_seconds"]
                else:
                    assert n["modelled_seconds"] == n["predicted_seconds"]
    # greedy: each decode step feeds the previous step's argmax
    g = build_graph(load_model(llama), RunSettings(ctx_size=256, tokens=1, past=3))
    assert len(steps[1]["nodes"]) == len(g.nodes)
    # roll-ups are per decode token: the sum over both decode steps, halved
    total = sum(n["seconds"] or 0 for s in steps[1:] for n in s["nodes"]) / 2
    assert sum(r["seconds"] for r in d["by_op"]) == pytest.approx(total)
    assert sum(r["seconds"] for r in d["by_layer"]) == pytest.approx(total)
    assert d["rollup_phase"] == "decode"
    assert set(d["tokens_per_second"]) == {"prompt", "decode", "prompt_untimed",
                                           "decode_untimed"}
    # the replay: every step run again through Executor.step, timed from outside,
    # untimed and node-timed, one pair a round (--repeat rounds)
    repeat = d["executor"]["repeat"]
    assert all(len(s["untimed_runs_seconds"]) == len(s["timed_runs_seconds"]) == repeat
               and min(s["untimed_runs_seconds"] + s["timed_runs_seconds"]) > 0 for s in steps)
    untimed = [u for s in steps[1:] for u in s["untimed_runs_seconds"]]
    timed = [t for s in steps[1:] for t in s["timed_runs_seconds"]]
    assert d["tokens_per_second"]["decode_untimed"] == pytest.approx(1 / float(np.median(untimed)))
    assert d["tokens_per_second"]["decode"] == pytest.approx(1 / float(np.median(timed)))
    assert d["node_timing_overhead"] == pytest.approx(
        float(np.median(np.array(timed) / np.array(untimed))) - 1)
    assert set(d["compile"]) >= {"kernels_import_seconds", "first_run_overhead_seconds", "numba_cache"}
    acc = d["estimate_accuracy"]
    assert acc["min_seconds"] == 1e-5 and set(acc["by_op"]) <= {n["op"] for n in steps[1]["nodes"]}


def test_profile_depth_fills_cells_before_the_prompt(llama, tmp_path):
    # --depth 40 with -ub 16: 40 random ids (profile.depth_ids) in ubatches of 16, 16 and 8,
    # untimed; the prompt then starts at position 40, its decode step at 42, and the
    # replay starts from the filled cells (the same argmax: no note)
    out = tmp_path / "d.json"
    r = cli("profile", llama.path, "--token-ids", "3,10", "--greedy", 1, "--repeat", 1,
            "--depth", 40, "-ub", 16, "--hardware", "raspberry-pi-5", "-c", 256, "-f", "json",
            "-o", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["executor"]["depth"] == 40
    assert [s["past"] for s in d["steps"]] == [40, 42]
    assert not any("argmax differed" in n for n in d["notes"])
    info = load_model(llama)
    fill = profile.depth_ids(40, info.n_vocab)
    assert fill == profile.depth_ids(40, info.n_vocab) and len(set(fill)) > 30
    assert all(0 <= t < info.n_vocab for t in fill)
    ex = Executor(info, RunSettings(ctx_size=256, ubatch_size=16))
    for i in range(0, 40, 16):
        ex.step(fill[i:i + 16])
    assert int(np.argmax(ex.step([3, 10]).logits[-1])) == d["steps"][0]["argmax"]
    table = cli("profile", llama.path, "--token-ids", "3", "--repeat", 1, "-d", 5,
                "--hardware", "raspberry-pi-5", "-c", 256)
    assert table.returncode == 0 and "-d 5 (cells filled first, untimed)" in table.stdout


def test_live_fraction_counts_the_cells_the_kernel_computes(llama):
    # the fixture's flash attention (256 cells) read from the masks a step filled
    # (profile.mask_live): a 3-token prompt at position 0, query t attends t + 1 cells
    ex = Executor(load_model(llama), RunSettings(ctx_size=256, flash_attn="on"))
    ex.step([3, 10, 17])
    plan = ex.plan(3)
    live = profile.mask_live(plan.inputs)
    fa = [n for n in plan.graph.nodes if n.op == "FLASH_ATTN_EXT"]
    assert fa and all(id(n.src[3]) in live for n in fa)
    for n in fa:
        assert n.src[1].ne[1] == 256
        # rows: 1 + 2 + 3 = 6 live pairs of 3 x 256
        assert profile.live_fraction(n, live) == 6 / 768
        # a tile of 16 queries: the 3 cells any of them attends, on all 16 lanes
        assert profile.live_fraction(n, live, tile=16) == 16 * 3 / 768
        # a tile of 2: queries 0-1 attend cells 0-1 (2 lanes x 2), query 2 cells 0-2 (2 x 3)
        assert profile.live_fraction(n, live, tile=2) == (2 * 2 + 2 * 3) / 768
    # one decode token at position 3 (cells 0-3 live): split over 2 chunks of 128 from 4
    # cells: the fullest chunk holds all 4, so both threads' share counts: 2 * 4 / 256
    ex.step([5])
    plan = ex.plan(1)
    live = profile.mask_live(plan.inputs)
    for n in (n for n in plan.graph.nodes if n.op == "FLASH_ATTN_EXT"):
        assert profile.live_fraction(n, live) == 4 / 256
        assert profile.live_fraction(n, live, split=(2, 4)) == 2 * 4 / 256
        assert profile.live_fraction(n, live, split=(2, 512)) == 4 / 256   # under 512 cells
    assert profile.live_fraction(next(n for n in plan.graph.nodes if n.op == "MUL_MAT"),
                                 live) == 1.0                     # other ops: as costed


def test_executor_model_adds_overhead_and_lowers_the_matvec_roof():
    doc = {"name": "m", "kind": "measured",
           "memory_bandwidth": {"bytes_per_second": 20e9, "by_type": {"q4_K": 16e9}},
           "peak_flops": {"flops_per_second": 100e9},
           "op_overhead": {"seconds": 5e-6, "by_op": {"MUL_MAT": 3e-6}}}
    hw = hwmod.parse(doc, None)
    # 80 MB of q4_K at 16 GB/s = 5 ms (FLOPs 1e8 / 1e11 = 1 ms: memory-bound) + 3 us
    assert hwmod.executor_seconds("MUL_MAT", 80e6, 1e8, hw, "q4_K") == pytest.approx(5.003e-3)
    # a type the probe did not time streams at the bandwidth: 80 MB / 20 GB/s = 4 ms
    assert hwmod.executor_seconds("MUL_MAT", 80e6, 1e8, hw, "f16") == pytest.approx(4.003e-3)
    # other ops: the bandwidth, and the median overhead when the op has no figure of its own
    assert hwmod.executor_seconds("ADD", 2e6, 5e5, hw, "q4_K") == pytest.approx(1e-4 + 5e-6)
    # compute-bound: 1e9 FLOPs / 1e11 = 10 ms over 1 MB / 16 GB/s
    assert hwmod.executor_seconds("MUL_MAT", 1e6, 1e9, hw, "q4_K") == pytest.approx(1e-2 + 3e-6)
    assert hwmod.roofline_seconds(80e6, 1e8, hw) == (pytest.approx(4e-3), "memory")


def test_profile_decode_ids_and_table(llama):
    r = cli("profile", llama.path, "--token-ids", "5,6", "--decode-ids", "7,8,9", "--repeat", 1,
            "--hardware", "amd-ryzen9-7950x", "-c", 256, "--top", 5, "--numerics", "ggml")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for text in ("tokens/s:", "Steps", "Per op kind (decode, per token)", "Per layer",
                 "Slowest nodes", "numerics ggml", "amd-ryzen9-7950x"):
        assert text in out
    assert all(len(line) <= 100 for line in out.splitlines())


@pytest.mark.parametrize("args,message", [
    (["--token-ids", "1,2", "--greedy", "2", "--decode-ids", "3"], "not both"),
    (["--token-ids", "1,x"], "comma-separated"),
    (["--token-ids", "1", "--format", "xml"], "--format"),
    (["--token-ids", "1", "--numerics", "exact"], "--numerics"),
    (["--token-ids", "1", "--hardware", "nope"], "no such profile"),
    (["--token-ids", "99999"], "token id 99999 is not in the vocabulary"),
    (["--token-ids", "1", "--repeat", "0"], "--repeat"),
    (["--token-ids", "1", "--depth", "-1"], "--depth -1 must be >= 0"),
    # 250 + 4 + 3 = 257 cells of a 256-cell context
    (["--token-ids", "1,2,3,4", "--greedy", "3", "-d", "250"],
     "--depth, --token-ids and --greedy: 250 + 4 + 3 tokens are more than the context's 256"),
], ids=["decode_and_greedy", "bad_ids", "format", "numerics", "hardware", "id_range", "repeat",
        "depth", "depth_past_context"])
def test_profile_bad_flags_are_one_line(llama, args, message):
    r = cli("profile", llama.path, "-c", 256, *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_hwprobe_measures_and_writes_a_profile(tmp_path, monkeypatch):
    """hwprobe -o NAME writes into the user's configuration directory (platformdirs reads
    XDG_CONFIG_HOME), never into the package, and --hardware NAME finds it there."""
    from typer.testing import CliRunner

    from graphcost.cli import app
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    bundled = sorted(p.name for p in hwmod.hardware_dir().iterdir())
    r = CliRunner().invoke(app, ["hwprobe", "-o", "probe-test", "--mib", "16", "--repeat", "1"])
    assert r.exit_code == 0, r.output
    target = tmp_path / "config" / "graphcost" / "hardware" / "probe-test.yaml"
    assert sorted(p.name for p in hwmod.hardware_dir().iterdir()) == bundled
    doc = yaml.safe_load(target.read_text())
    assert doc["kind"] == "measured" and doc["name"] == "probe-test"
    bw = doc["memory_bandwidth"]
    assert bw["bytes_per_second"] > 0 and "kernels.stream.read_rows" in bw["how"]
    # one matvec rate per weight type the kernels support (13: F32, F16, BF16, Q4_0..Q6_K)
    assert set(bw["by_type"]) == {"f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0",
                                  "q2_K", "q3_K", "q4_K", "q5_K", "q6_K"}
    assert all(v > 0 for v in bw["by_type"].values())
    # the streaming read timed beside each type's matvec; the overall figure is the median
    # of all those reads, so it lies within their range
    assert set(bw["stream_by_type"]) == set(bw["by_type"])
    beside = bw["stream_by_type"].values()
    assert min(beside) * 0.999 <= bw["bytes_per_second"] <= max(beside) * 1.001
    assert "matvec, % of it:" in r.output and str(target) in r.output
    assert "% of the read timed beside it: f32 " in r.output
    assert doc["peak_flops"]["flops_per_second"] > 0 and doc["op_overhead"]["seconds"] > 0
    # a peak FLOP rate and a matvec cost curve per weight type; a cost curve per op kind
    from graphcost.execute.hwprobe import (FA_CELLS, FA_MIN_KV, FA_TILE_CELLS, LADDER,
                                           LADDER_BYTES, LADDER_K, PROMPT_SHAPES)
    assert set(doc["peak_flops"]["by_type"]) == set(bw["by_type"])
    oc = doc["op_costs"]
    assert set(oc["matvec"]) == set(bw["by_type"]) == set(oc["matmul"])
    # 16 MiB: the 4 slice sizes (the largest, 4 MiB, fits twice) and the whole matrix
    assert all(len(pts) == len(LADDER_BYTES) + 1 for pts in oc["matvec"].values())
    # prompt matmuls: one point per shape, [weight bytes, flops, seconds]; q8_0: 1024
    # columns = 32 blocks of 34 bytes a row; FLOPs as the cost model counts them, more
    # with more activation rows on the same matrix
    from graphcost.cost.costs import op_cost
    from graphcost.execute.hwprobe import _matmul_node
    from graphcost.format import ggml_types as gt
    q8 = oc["matmul"]["q8_0"]
    assert [p[0] for p in q8] == [m * 32 * 34 for m, _ in PROMPT_SHAPES]
    assert [p[1] for p in q8] == [op_cost(_matmul_node(gt.GGMLType.Q8_0, LADDER_K, m, n)).flops
                                  for m, n in PROMPT_SHAPES]
    assert oc["matvec_max_rows"] == 4 and oc["flash_attn_tile_min_tokens"] == 4
    assert oc["flash_attn_tile_queries"] == 16
    assert oc["matmul_row_tile"] == {"q4_0": 4, "q5_0": 4, "q4_1": 4, "q5_1": 4}
    # the per-type peak is the best FLOPs / seconds measured: at least every prompt point's
    assert all(doc["peak_flops"]["by_type"][t] >= max(round(f / s) for _, f, s in pts)
               for t, pts in oc["matmul"].items())
    assert set(oc["by_op"]) == {"ADD", "MUL", "SCALE", "RMS_NORM", "GELU", "SILU", "GEGLU",
                                "SWIGLU", "SOFT_MAX", "ROPE", "SET_ROWS", "GET_ROWS",
                                "GET_ROWS@activation", "CONT",
                                "FLASH_ATTN_EXT", "FLASH_ATTN_EXT@64", "FLASH_ATTN_EXT@256"}
    assert set(oc["by_op_chained"]) == set(oc["by_op"])
    # --repeat 1: 5 calls a point, one pass (hwprobe.op_cost_passes)
    assert "median over 1 pass, each over arrays of its own, of 5 calls" in oc["how"]
    # one row again after its matvecs and a small op that rewrote its activations (a
    # node after a small op): every kind with an activation input (not flash attention,
    # not the token embedding gather), with how much streamed since its kind last ran
    assert set(oc["by_op_local"]) == {op for op in oc["by_op"]
                                      if "FLASH" not in op and op != "GET_ROWS"}
    assert all(len(pts) == len(LADDER) for pts in oc["by_op_local"].values())
    assert all(oc["since_bytes"]["by_op_local"][op] > 0 for op in oc["by_op_local"])
    # every op kind but flash attention again on 16 tokens (rows), from 1024 values up
    from graphcost.execute.hwprobe import LADDER_PROMPT, LADDER_TOKENS
    assert LADDER_TOKENS == oc["by_op_tokens_rows"] == 16
    assert set(oc["by_op_tokens"]) == {op for op in oc["by_op"] if "FLASH" not in op}
    assert all(len(pts) == len(LADDER_PROMPT) for pts in oc["by_op_tokens"].values())
    assert set(oc["flash_attn_tiled"]) == {"FLASH_ATTN_EXT", "FLASH_ATTN_EXT@64",
                                           "FLASH_ATTN_EXT@256"}
    assert all(len(pts) == len(FA_TILE_CELLS) for pts in oc["flash_attn_tiled"].values())
    # every op kind of the ladders again right after a flush, its kind not run since
    # (issue 12: a step's first node of a kind, after the output matmul), and how much
    # streamed since the kind last ran at the calls of each curve: the flush (at most 4x
    # --mib: 64 MiB here) and the node's own feeding matvecs at the cold calls, more
    # than at the warm ones
    assert set(oc["by_op_cold"]) == {op for op in oc["by_op"] if "FLASH" not in op}
    assert set(oc["by_op_tokens_cold"]) == set(oc["by_op_tokens"])
    assert all(len(pts) == len(LADDER) for pts in oc["by_op_cold"].values())
    since = oc["since_bytes"]
    for warm in ("by_op", "by_op_tokens"):
        for op in oc[warm + "_cold"]:
            assert since[warm + "_cold"][op] >= 64 << 20 > since[warm][op] > 0, (warm, op)
            # one flush between two cold calls of a kind, two where the row of a
            # shared-kernel node's own (MUL beside ADD, exec_ops.code_kind) came between,
            # never three
            assert since[warm + "_cold"][op] < 3 * (64 << 20), (warm, op)
    # and again after each middle flush (hwprobe.MID_MIB, each at most a quarter of the
    # flush: 4 and 8 MiB here), the same nodes: for GEGLU between the warm and the cold
    # figures, and growing
    from graphcost.execute.hwprobe import MID_MIB
    assert MID_MIB == (4, 8)
    for warm in ("by_op", "by_op_tokens"):
        for m in MID_MIB:
            assert set(oc[f"{warm}_mid{m}"]) == set(oc[warm + "_cold"])
            for op in oc[f"{warm}_mid{m}"]:
                assert m << 20 <= since[f"{warm}_mid{m}"][op] < since[warm + "_cold"][op]
        assert since[warm]["GEGLU"] < since[warm + "_mid4"]["GEGLU"] \
            < since[warm + "_mid8"]["GEGLU"], warm
    # flash attention's points are the attended cells' share of the node's cost: 16 of a
    # 256-cell window at head size 64, 4 heads, one query: K and V 2 * 16 * 64 * 2 B =
    # 4096 B, q and the output 2 * 4 * 64 * 4 B = 2048 B, the mask 256 * 2 B, all / 16
    assert FA_CELLS[0] == 16 and FA_MIN_KV == 256
    assert oc["by_op"]["FLASH_ATTN_EXT@64"][0][0] == (2 * 256 * 64 * 2 + 2048 + 512) // 16
    for op, pts in oc["by_op"].items():
        assert len(pts) == (len(FA_CELLS) if "FLASH" in op else len(LADDER)), op
        assert [p[0] for p in pts] == sorted(p[0] for p in pts) and all(p[2] > 0 for p in pts)
        if "@" not in op:                   # head sizes 64 and 256: curves, not overheads
            assert doc["op_overhead"]["by_op"][op] == pts[0][2]
    assert "matmul peak per weight type" in r.output
    hw = hwmod.load("probe-test")
    assert hw.kind == "measured" and hw.overhead == doc["op_overhead"]["seconds"]
    assert hw.path == target
    # each one-row kind again with its code warm (a node of its op at the next ladder
    # size right before its matvecs, or right before it after the local pass's): fewer
    # bytes since its code kind ran than at the warm calls
    # (not SET_ROWS: the probe's writes the same cache rows every call, hot with its code)
    assert set(oc["by_op_again"]) == {op for op in oc["by_op"]
                                      if "FLASH" not in op and op not in ("GET_ROWS", "SET_ROWS")}
    assert set(oc["by_op_local_again"]) == set(oc["by_op_local"]) - {"SET_ROWS"}
    for op in oc["by_op_again"]:
        assert 0 < since["by_op_again"][op] < since["by_op"][op], op
    # right before it: nothing moved between (since counts from a node's end)
    assert set(since["by_op_local_again"].values()) == {0}
    # the local pass on several tokens: every kind on several tokens with an activation
    # a matvec feeds (not GET_ROWS of a weight table), its calls a family's pass after
    # their kind last ran, as the warm ones, far less than the flush ago
    assert set(oc["by_op_tokens_local"]) == set(oc["by_op_tokens"]) - {"GET_ROWS"}
    for op, b in since["by_op_tokens_local"].items():
        assert 0 < b < since["by_op_tokens_cold"][op] / 4, op
    # the model reads GEGLU's five curves, code-warm to cold (hardware.warmth_curves)
    assert [b for b, _ in hw.warmth_curves("GEGLU")] == [
        since[p]["GEGLU"] for p in ("by_op_again", "by_op", "by_op_mid4", "by_op_mid8",
                                    "by_op_cold")]


def test_op_cost_passes_merge_each_point_by_its_median(monkeypatch):
    """Passes over arrays of their own merge point by point: seconds and since_bytes are
    the median over the passes, bytes and FLOPs the ladder's; a pass count from the
    calls (at least PASS_CALLS a pass, at most PASSES)."""
    from graphcost.execute import hwprobe as hp

    def run(add_us, rope_us, since):
        return {"by_op": {"ADD": [[768, 192, add_us[0] * 1e-6], [1536, 384, add_us[1] * 1e-6]]},
                "by_op_local": {"ROPE": [[2052, 1024, rope_us * 1e-6]]},
                "since_bytes": {"by_op": {"ADD": since}, "by_op_local": {"ROPE": 2 * since}}}
    merged = hp.merge_op_costs([run((1.0, 2.0), 3.0, 100), run((1.5, 1.0), 2.0, 300),
                                run((0.5, 4.0), 9.0, 200)])
    # ADD at 768 B: median(1.0, 1.5, 0.5) = 1.0 us; at 1536 B median(2.0, 1.0, 4.0) = 2.0;
    # ROPE median(3, 2, 9) = 3; since: median(100, 300, 200) = 200, doubled 400
    assert merged["by_op"]["ADD"] == [[768, 192, pytest.approx(1.0e-6)],
                                      [1536, 384, pytest.approx(2.0e-6)]]
    assert merged["by_op_local"]["ROPE"] == [[2052, 1024, pytest.approx(3.0e-6)]]
    assert merged["since_bytes"] == {"by_op": {"ADD": 200}, "by_op_local": {"ROPE": 400}}
    # two passes: the mean of the two (numpy's median)
    two = hp.merge_op_costs([run((1.0, 2.0), 3.0, 100), run((2.0, 4.0), 5.0, 301)])
    assert two["by_op"]["ADD"][1][2] == pytest.approx(3.0e-6) and \
        two["since_bytes"]["by_op"]["ADD"] == 200
    # a different ladder is not merged
    bad = run((1.0, 2.0), 3.0, 100)
    bad["by_op"]["ADD"][0][0] = 769
    with pytest.raises(AssertionError):
        hp.merge_op_costs([run((1.0, 2.0), 3.0, 100), bad])
    # passes: 20 calls (repeat 5) -> 4 of 5; 5 calls (repeat 1) -> 1; 12 -> 2 of 6
    assert (hp.PASS_CALLS, hp.PASSES) == (5, 4)
    calls = []
    monkeypatch.setattr(hp, "op_costs",
                        lambda ctx, rng, c, mib: calls.append(c) or run((1.0, 1.0), 1.0, 1))
    assert [hp.op_cost_passes(None, None, c, 16)[1] for c in (20, 5, 12)] == [4, 1, 2]
    assert calls == [5] * 4 + [5] + [6] * 2


def test_probe_calls_run_through_the_executors_loop():
    """calls_plan: bare calls become bound steps that run_plan runs in order and times one
    reading each, as it times a graph's bound nodes (the probe's sequences run so)."""
    from graphcost.execute.plan import BOUND, calls_plan, run_plan

    ran = []
    plan = calls_plan([lambda: ran.append("feed"), lambda: ran.append("node"),
                       lambda: ran.append("next")])
    assert [st.kind for st in plan.steps] == [BOUND] * 3 and plan.resolved
    for _ in range(2):
        vals, timing, cap = run_plan(plan)
        assert len(timing.ns) == 3 and all(isinstance(t, int) and t >= 0 for t in timing.ns)
        assert timing.wall_ns >= sum(timing.ns) and vals == [] and cap == {}
    assert ran == ["feed", "node", "next"] * 2
    # untimed: the calls run, no readings
    assert run_plan(plan, timed=False)[1].ns is None and len(ran) == 9


@pytest.mark.parametrize("n", [1, 16], ids=["decode_matvec", "prompt_matmul"])
def test_hwprobe_times_the_executors_own_matmul_nodes(n):
    """The probe's matmul calls are MUL_MAT nodes as exec_ops compiles them for the
    executor (a decode matvec on a block type: the fused kernel, one numba call into
    buffers allocated once), bound and called through the overload they compiled, writing
    the node's own output: the results of kernels.matmul.mul_mat_ggml."""
    from graphcost.execute import hwprobe as H
    from graphcost.execute.exec_ops import Ctx
    from graphcost.execute.kernels_loader import load_kernels
    from graphcost.execute.weights import random_raw
    from graphcost.format import ggml_types as gt

    K = load_kernels()
    ctx = Ctx(K, "fast")
    rng = np.random.default_rng(0)
    t = gt.GGMLType.Q8_0
    w = random_raw(t, (256, 64), rng).reshape(64, gt.row_size(t, 256))
    x = rng.standard_normal((n, 256)).astype(np.float32)
    node = H._matmul_node(t, 256, 64, n)
    fn, (call,) = H._node_calls(node, ctx, [H._values(node, [w, x])])
    if n == 1:      # 64 rows of 272 bytes: below SERIAL_BELOW, the serial fused kernel
        assert fn.kern is K.matmul._matvec_ggml_fused_serial
        assert call.func is not fn.kern         # the compiled overload's entry point
    fn.out[:] = 0
    call()
    np.testing.assert_array_equal(fn.out.reshape(n, 64),
                                  K.matmul.mul_mat_ggml(w, t, 256, 64, x))


@pytest.mark.parametrize("index_type", ["I32", "I64"])
def test_get_rows_node_is_one_call_of_the_gather_overload(index_type):
    """A decode's GET_ROWS (one index row, contiguous table) compiles to the gather kernel
    itself, bound to the index array as it is (I32 token ids or I64, no copy into int64
    and no Python wrapper, issue 12): its bound call resolves to the compiled overload's
    entry point and gathers the rows kernels.get_rows.get_rows_ref decodes."""
    from graphcost.execute import hwprobe as H
    from graphcost.execute.exec_ops import Ctx
    from graphcost.execute.kernels_loader import load_kernels
    from graphcost.execute.weights import random_raw
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph

    K = load_kernels()
    ctx = Ctx(K, "fast")
    rng = np.random.default_rng(0)
    t = gt.GGMLType.Q8_0
    w = random_raw(t, (64, 10), rng).reshape(10, gt.row_size(t, 64))   # 10 rows of 68 bytes
    it = getattr(gt, index_type)
    g = Graph()
    node = g.get_rows(g.new_tensor(t, [64, 10], role="weight"), g.new_tensor(it, [3]))
    ids = np.array([7, 0, 7], dtype=np.int32 if index_type == "I32" else np.int64)
    fn, (call,) = H._node_calls(node, ctx, [H._values(node, [w, ids])])
    assert fn.kern is K.get_rows._get_rows_serial       # 3 * 64 values < SERIAL_BELOW
    assert call.func is not fn.kern                     # the compiled overload's entry point
    fn.out[:] = 0
    call()
    np.testing.assert_array_equal(fn.out.reshape(3, 64), K.get_rows.get_rows_ref(w, t, 64, ids))


def test_hwprobe_writes_to_a_path_given_with_o(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path, note = hwmod.save({"name": "x", "kind": "measured",
                             "memory_bandwidth": {"bytes_per_second": 1e9},
                             "peak_flops": {"flops_per_second": 1e9}}, str(tmp_path / "x.yaml"))
    assert path == tmp_path / "x.yaml" and path.is_file() and note is None
    assert not (tmp_path / "config").exists()
    assert np.isclose(hwmod.load(str(path)).bandwidth, 1e9)


@pytest.mark.parametrize("op", ["GEGLU", "SWIGLU", "GELU", "SILU"])
def test_fast_numerics_run_activations_on_the_rational_kernels(op):
    """``--numerics fast`` computes SiLU/GELU (and their split GLUs) with the vectorized
    rational tanh (kernels.elementwise.*_fast, no F16 GELU table, no libm call); ``ggml``
    numerics keep ggml's: the table for GELU, expf for SiLU."""
    from graphcost.execute.exec_ops import Ctx, compile_node
    from graphcost.execute.kernels_loader import load_kernels
    from graphcost.format import ggml_types as gt
    from graphcost.graph.ggml_graph import Graph

    K = load_kernels()
    E = K.elementwise
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((3, 640)).astype(np.float32) * 3 for _ in "ab")
    g = Graph()
    x, y = g.new_tensor(gt.F32, [640, 3]), g.new_tensor(gt.F32, [640, 3])
    gated = op in ("GEGLU", "SWIGLU")
    node = g.glu_split(op, x, y) if gated else g.unary(op, x)
    args = (a, b) if gated else (a,)
    fast = {"GEGLU": E.geglu_fast, "SWIGLU": E.swiglu_fast, "GELU": E.gelu_fast,
            "SILU": E.silu_fast}[op]
    ggml = {"GEGLU": E.geglu_f16_table, "SWIGLU": E.swiglu, "GELU": E.gelu_f16_table,
            "SILU": E.silu}[op]
    got = compile_node(node, Ctx(K, "fast"))(*args)
    assert compile_node(node, Ctx(K, "fast")).kern is E.kernel(
        "fast_gated" if gated else "fast_unary", 1920)
    np.testing.assert_array_equal(got.reshape(3, 640), fast(*args))
    np.testing.assert_array_equal(compile_node(node, Ctx(K, "ggml"))(*args).reshape(3, 640),
                                  ggml(*args))
    assert not np.array_equal(got.reshape(3, 640), ggml(*args))     # the two numerics differ


def _smaps_fields(addr: int) -> dict[str, str]:
    """/proc/self/smaps' fields of the mapping that holds ``addr``."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        lo, sep, hi = line.split()[0].partition("-")
        if sep and all(c in "0123456789abcdef" for c in lo + hi) and int(lo, 16) <= addr < int(hi, 16):
            block = []
            for ln in lines[i + 1:]:
                if "-" in ln.split()[0]:
                    break
                block.append(ln)
            return {k: v.strip() for k, v in (ln.split(":", 1) for ln in block if ":" in ln)}
    raise AssertionError("the address is in no mapping of /proc/self/smaps")


def test_small_pages_copies_onto_pages_that_are_not_huge():
    """hwprobe.small_pages: the bytes unchanged, read-only, and on Linux in a mapping that
    /proc/self/smaps shows as not eligible for transparent huge pages (as a GGUF's mapped
    weights are not on huge pages); the control: the same check sees a mapping madvised
    into huge pages as eligible (numpy madvises its arrays of 4 MiB and more so)."""
    import mmap
    import sys

    from graphcost.execute.hwprobe import small_pages

    a = np.arange(2 << 20, dtype=np.uint32).view(np.uint8)
    s = small_pages(a)
    assert s.dtype == np.uint8 and s.shape == (8 << 20,) and not s.flags.writeable
    np.testing.assert_array_equal(s, a)
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        pytest.skip("MADV_NOHUGEPAGE is Linux's")
    mid = 4 << 20
    small = _smaps_fields(s.__array_interface__["data"][0] + mid)
    assert small["AnonHugePages"] == "0 kB" and small.get("THPeligible", "0") == "0"
    try:
        thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        thp = ""
    if "[never]" not in thp and "THPeligible" in small and hasattr(mmap, "MADV_HUGEPAGE"):
        m = mmap.mmap(-1, 8 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
        huge = np.frombuffer(m, dtype=np.uint8)
        huge[:] = 1
        assert _smaps_fields(huge.__array_interface__["data"][0] + mid)["THPeligible"] == "1"
        del huge
        m.close()


def test_profile_models_the_embedding_gather_on_its_distinct_token_ids(llama):
    """issue 12: a prompt whose ids repeat (5, 6, 5, 5: 2 distinct of 4) gathers its
    distinct rows from memory and reads the repeats from the caches; the profile passes
    that share to the executor model (hardware.executor_seconds's ``distinct``)."""
    from graphcost.execute.profile import run_profile

    curve = [[100, 0, 2e-6], [100_000, 0, 12e-6]]
    cold = [[100, 0, 10e-6], [100_000, 0, 40e-6]]
    doc = {"name": "m", "kind": "measured", "memory_bandwidth": {"bytes_per_second": 20e9},
           "peak_flops": {"flops_per_second": 100e9}, "op_overhead": {"seconds": 5e-6},
           "op_costs": {"by_op_tokens": {"GET_ROWS": curve},
                        "by_op_tokens_cold": {"GET_ROWS": cold},
                        # the kind last ran more than 2 B ago at the cold curve's calls:
                        # the step's only gather (since: the whole step) is cold
                        "since_bytes": {"by_op_tokens": {"GET_ROWS": 1},
                                        "by_op_tokens_cold": {"GET_ROWS": 2}}}}
    hw = hwmod.parse(doc, None)
    prof = run_profile(llama.path, RunSettings(ctx_size=64), [5, 6, 5, 5], repeat=1,
                       hardware=hw, numerics="fast")
    row = next(n for n in prof.prompt.nodes if n.op == "GET_ROWS")
    b = row.bytes
    # the 2 distinct rows cold, the 2 repeats on the warm curve (linear here: 1e-4 us/B)
    distinct = hwmod.curve_seconds(cold, b / 2)
    repeats = hwmod.curve_seconds(curve, b) - hwmod.curve_seconds(curve, b / 2)
    assert repeats == pytest.approx(10e-6 * (b / 2) / 99_900)
    assert row.modelled == pytest.approx(distinct + repeats)
    assert row.modelled < hwmod.curve_seconds(cold, b)          # all 4 rows as distinct
