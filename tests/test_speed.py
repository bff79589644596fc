"""graphcost speed: the CPU-execution counts on tiny graphs (exact numbers), the pricing
arithmetic, the fit, llama-bench's test schedule, and the command line (llama-bench's
layouts, bad flags one line exit 2). No timed assertions."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from graphcost.cost.analysis import analyze_graph
from graphcost.cost.speed_model import (SpeedModel, counts, fit, roofline_coefficients,
                                        tiled_unpacks,
                                        undetermined)
from graphcost.format import ggml_types as gt
from graphcost.graph.build import BuiltGraph
from graphcost.graph.ggml_graph import Graph
from graphcost.speed import BenchTest, instances, steps

from fixtures import write_gemma3, write_llama

ROOT = Path(__file__).resolve().parents[1]
Q8, Q4K = gt.GGMLType.Q8_0, gt.GGMLType.Q4_K


def _analysis(g: Graph):
    return analyze_graph(BuiltGraph(None, None, g.nodes, g.leafs, [], []))


def _mlp(n_tokens: int, wtype=Q8, k: int = 256, m: int = 16):
    """x:[k, n] -> rms_norm -> mul(norm weight) -> mul_mat(W:[k, m]) -> add(bias)."""
    g = Graph()
    x = g.new_tensor(gt.F32, [k, n_tokens])
    nw = g.new_tensor(gt.F32, [k], role="weight")
    w = g.new_tensor(wtype, [k, m], role="weight", name="blk.0.ffn_up.weight")
    b = g.new_tensor(gt.F32, [m, n_tokens])
    h = g.mul(g.rms_norm(x, 1e-6), nw)
    g.expand(g.add(g.mul_mat(w, h), b))
    return g


def test_counts_exact_on_a_tiny_graph():
    a = _analysis(_mlp(3))
    c = counts(a)
    # RMS_NORM + MUL fuse (ggml_cpu_try_fuse_ops): one barrier; MUL_MAT and ADD one each
    assert c["barriers"] == 3
    assert c["steps"] == 1
    # Q8_0 [256, 16]: 16 rows x (256 / 32 blocks x 34 bytes) = 16 x 272 = 4352 bytes
    assert c["weight_bytes"] == 4352
    # 256 x 16 x 3 multiply-accumulates on the vec_dot path (not repacked)
    assert c["mac:q8_0:mat"] == 12288
    # activations 256 x 3 converted F32 -> Q8_0 (vec_dot_type of Q8_0)
    assert c["convert"] == 768
    # every other node's bytes: the cost model's (rms_norm, mul, add)
    others = [nc for nc in a.nodes if nc.node.op in ("RMS_NORM", "MUL", "ADD")]
    assert c["other_bytes"] == sum(nc.cost.bytes_read + nc.cost.bytes_written for nc in others)


def test_repacked_weights_split_gemm_and_gemv_rows():
    a = _analysis(_mlp(6, Q4K, k=256, m=8))
    c = counts(a, repacked=["blk.0.ffn_up.weight"])
    # 6 rows: 4 by gemm (repack.cpp forward_mul_mat: ne11 - ne11 % 4), 2 by gemv
    assert c["mac:q4_K:gemm"] == 256 * 8 * 4 == 8192
    assert c["mac:q4_K:gemv"] == 256 * 8 * 2 == 4096
    assert not any(k.startswith("mac:q4_K:") and k[-3:] in ("vec", "mat") for k in c)
    # Q4_K: 144 bytes per 256 values, 8 rows
    assert c["weight_bytes"] == 8 * 144


Q6K = gt.GGMLType.Q6_K


@pytest.mark.parametrize("rows,threads,key", [(8, 2, "mac:q6_K:tiled"), (7, 2, "mac:q6_K:mat"),
                                              (8, None, "mac:q6_K:mat")],
                         ids=["tiled", "too-few-rows", "no-tiled-path"])
def test_k_quant_prompt_matmuls_take_the_tiled_path(rows, threads, key):
    # tiled.cpp: a K-quant weight (not repacked) times >= 8 rows, where llama.cpp has the
    # path (x86 AVX2/AVX-512: tiled_threads given); else ggml's vec_dot loop ("mat")
    c = counts(_analysis(_mlp(rows, Q6K, k=256, m=16)), tiled_threads=threads)
    assert c[key] == 256 * 16 * rows
    assert sum(v for k, v in c.items() if k.startswith("mac:")) == 256 * 16 * rows
    if key.endswith("tiled"):
        # 16 weight rows x 8 activation rows on 2 threads: chunk edge 256 -> 128 -> 64 ->
        # 32 -> 16 (1 x 1 chunks, fewer than 2 x 4, stops at 16): each side unpacked once
        assert (c["tiled_unpack:w"], c["tiled_unpack:a"]) == (16 * 256, 8 * 256)
    else:
        assert "tiled_unpack:w" not in c


@pytest.mark.parametrize("nr0,nr1,threads,passes", [
    (4096, 512, 2, (2, 16)),     # edge 256: 16 x 2 chunks >= 8
    (4096, 512, 16, (4, 32)),    # 32 < 64 chunks: edge 128, 32 x 4
    (512, 32, 2, (1, 8)),        # edge 64: 8 x 1 chunks
    (512, 128, 2, (2, 8)),       # edge 64: 8 x 2
    (4096, 1, 2, (1, 16)),       # one row (taken only where forced): 16 x 1 at edge 256
    (300, 40, 4, (2, 10)),       # edge 32: 10 x 2 chunks of 30 x 20 rows
])
def test_tiled_unpacks_follow_the_driver_chunks(nr0, nr1, threads, passes):
    # each weight row unpacked once per chunk of activation rows, each activation row
    # once per chunk of weight rows; K = 256 values a row
    assert tiled_unpacks(nr0, nr1, 256, threads) == (nr0 * 256 * passes[0],
                                                     nr1 * 256 * passes[1])


def test_no_output_rows_do_no_work_but_keep_their_barriers():
    g = Graph()
    x = g.new_tensor(gt.F32, [64, 4])
    ids = g.new_tensor(gt.I32, [1], role="input", name="out_ids")
    w = g.new_tensor(Q8, [64, 32], role="weight")
    g.expand(g.mul_mat(w, g.get_rows(g.scale(x, 2.0), ids)))
    a = _analysis(g)
    full, none = counts(a), counts(a, outputs=False)
    assert full["barriers"] == none["barriers"] == 3
    assert full["mac:q8_0:vec"] == 64 * 32 * 1 and none["mac:q8_0:vec"] == 0
    assert none["weight_bytes"] == 0
    # the SCALE before the GET_ROWS still runs
    assert none["other_bytes"] == a.nodes[0].cost.bytes_read + a.nodes[0].cost.bytes_written


def test_seconds_is_the_priced_sum_and_threads_scale_compute_only():
    sm = SpeedModel({"steps": 1e-3, "barriers": 1e-6, "weight_bytes": 1e-10,
                     "mac:q8_0:vec": 1e-11},
                    threads=2, source="test", verified=True)
    c = {"steps": 2, "barriers": 100, "weight_bytes": 10**9, "mac:q8_0:vec": 10**9}
    # 2e-3 + 1e-4 + 0.1 + 0.01
    assert sm.seconds(c) == pytest.approx(0.1121, rel=1e-12)
    # 4 threads: only the MAC term halves: 2e-3 + 1e-4 + 0.1 + 0.005
    assert sm.seconds(c, threads=4) == pytest.approx(0.1071, rel=1e-12)
    # a type without its own coefficient takes the mean of its path's (named by missing)
    assert sm.coefficient("mac:q6_K:vec") == 1e-11
    assert sm.missing({"mac:q6_K:vec": 5}) == ["mac:q6_K:vec"]


def test_roofline_coefficients_price_bytes_at_bandwidth_and_macs_at_peak():
    co = roofline_coefficients(bandwidth=1e10, peak_flops=1e11)
    assert co["weight_bytes"] == 1e-10 and co["mac:f32:vec"] == 2e-11


def test_fit_recovers_known_coefficients():
    true = {"a": 2e-3, "b": 5e-9, "c": 0.0}
    rows = [{"a": 1, "b": 10**6, "c": 7}, {"a": 3, "b": 10**5, "c": 1},
            {"a": 2, "b": 4 * 10**6, "c": 3}, {"a": 5, "b": 10**7, "c": 2}]
    secs = [sum(true[k] * r[k] for k in true) for r in rows]
    got = fit(rows, secs, ["a", "b", "c"])
    assert got["a"] == pytest.approx(2e-3, rel=1e-6)
    assert got["b"] == pytest.approx(5e-9, rel=1e-6)
    assert got["c"] == pytest.approx(0.0, abs=1e-9)


def test_undetermined_names_the_coefficients_a_null_vector_moves():
    # a and b always in the proportion 1:2 (column b = 2 x column a): a fit can trade one
    # for the other (a + 2 b fixed) and match every case; c varies on its own, so it is
    # pinned; d no case counts (missing, not undetermined)
    rows = [{"a": 1, "b": 2, "c": 0}, {"a": 2, "b": 4, "c": 1}, {"a": 3, "b": 6, "c": 5}]
    secs = [1.0, 2.0, 4.0]
    assert undetermined(rows, secs, ["a", "b", "c", "d"]) == ["a", "b"]
    # one case that breaks the proportion pins all three: rank 3 of 3
    rows.append({"a": 1, "b": 0, "c": 0})
    assert undetermined(rows, secs + [1.0], ["a", "b", "c", "d"]) == []
    # fewer cases than counted keys: 2 equations, 3 unknowns, every key in the null space
    # (the null vector of [[1, 1, 0], [0, 1, 1]] is (1, -1, 1))
    assert undetermined([{"x": 1, "y": 1}, {"y": 1, "z": 1}], [1.0, 1.0],
                        ["x", "y", "z"]) == ["x", "y", "z"]


def test_llama_bench_schedule():
    pp = BenchTest(512, 0, 100, 2048, 32, "on", "f16", "f16", 2)
    s = steps(pp)
    # 16 ubatches of 32, past 100, 132, ...; only the batch's last token is an output
    assert len(s) == 16 and s[0] == (32, 100, False) and s[-1] == (32, 580, True)
    assert sum(1 for x in s if x[2]) == 1
    # -b 100 -ub 64: batches 100, 100, 56 -> ubatches 64+36, 64+36, 56; one output per batch
    s = steps(BenchTest(256, 0, 0, 100, 64, "on", "f16", "f16", 2))
    assert [x[0] for x in s] == [64, 36, 64, 36, 56] and [x[2] for x in s].count(True) == 3
    tg = steps(BenchTest(0, 3, 7, 2048, 512, "off", "f16", "f16", 2))
    assert tg == [(1, 7, True), (1, 8, True), (1, 9, True)]
    assert pp.name == "pp512 @ d100" and BenchTest(0, 3, 0, 1, 1, "on", "f16", "f16", 1).name == "tg3"


def test_instances_follow_llama_bench_order():
    ts = instances([64], [16], [0, 8], [2048], [32, 512], ["off", "on"], ["f16"], ["f16"], [2])
    assert [(t.n_ubatch, t.flash_attn, t.n_depth, t.name) for t in ts[:4]] == [
        (32, "off", 0, "pp64"), (32, "off", 0, "tg16"),
        (32, "off", 8, "pp64 @ d8"), (32, "off", 8, "tg16 @ d8")]
    assert len(ts) == 16


# ---------------------------------------------------------------------------- CLI

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("speed")
    m = write_llama(d / "tiny.gguf", n_embd=256, n_ff=512, n_layer=2, n_vocab=300)
    prof = d / "cal.yaml"
    prof.write_text(yaml.safe_dump({
        "name": "cal", "kind": "measured", "threads": 2,
        "memory_bandwidth": {"bytes_per_second": 2e10}, "peak_flops": {"flops_per_second": 1e11},
        "llama_cpp": {"threads": 2, "how": "test calibration",
                      "coefficients": {"steps": 1e-4, "barriers": 2e-6, "weight_bytes": 5e-11,
                                       "mac:f32:vec": 1e-11, "mac:f32:mat": 1e-11,
                                       "mac:f16:vec": 1e-11, "mac:f16:mat": 1e-11,
                                       "other_bytes": 1e-10, "fa_mac": 1e-11,
                                       "fa_mac:tiled": 1e-11, "convert": 1e-9},
                      "error_band": {"cases": 7, "median": 0.061, "worst": 0.183}}}))
    return Path(m), prof


def test_cli_markdown_layout(tiny, cli):
    model, prof = tiny
    r = cli("speed", model, "--hardware", prof, "-p", "64", "-n", "16", "-fa", "0,1", "-ub", "32")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # llama-bench's header: fixed columns, threads, then the list flags given (ub, fa)
    assert lines[0] == ("| model                          |       size |     params | backend    "
                        "| threads | n_ubatch |  fa |            test |                  t/s |")
    assert lines[1] == ("| ------------------------------ | ---------: | ---------: | ---------- "
                        "| ------: | -------: | --: | --------------: | -------------------: |")
    rows = [ln for ln in lines[2:] if ln.startswith("|")]
    assert [ln.split("|")[8].strip() for ln in rows] == ["pp64", "tg16", "pp64", "tg16"]
    assert [ln.split("|")[7].strip() for ln in rows] == ["0", "0", "1", "1"]
    assert all(ln.split("|")[9].strip().endswith("± 0.00") for ln in rows)
    assert all(len(ln) == len(lines[0]) for ln in rows)
    assert "median 6.1%, worst 18.3% over 7 cases" in r.stdout


def test_cli_json_rows(tiny, cli):
    model, prof = tiny
    r = cli("speed", model, "--hardware", prof, "-p", "32", "-n", "8", "-d", "0,40", "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["n_prompt"], x["n_gen"], x["n_depth"]) for x in rows] == [
        (32, 0, 0), (0, 8, 0), (32, 0, 40), (0, 8, 40)]
    for x in rows:
        assert {"n_ubatch", "flash_attn", "avg_ts", "avg_ns", "n_threads"} <= set(x)
        assert x["avg_ts"] > 0 and x["graphcost"]["error_band"]["median"] == 0.061
    # deeper context costs more: the same test at depth 40 is not faster
    assert rows[2]["avg_ts"] <= rows[0]["avg_ts"] and rows[3]["avg_ts"] <= rows[1]["avg_ts"]
    r2 = cli("speed", model, "--hardware", prof, "-p", "32", "-n", "8", "-d", "0,40",
             "--format", "json")
    assert [x["avg_ts"] for x in json.loads(r2.stdout)] == [x["avg_ts"] for x in rows]


def test_cli_datasheet_profile_is_labelled_unverified(tiny, cli):
    model, _ = tiny
    r = cli("speed", model, "--hardware", "apple-m2", "-p", "16", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert "UNVERIFIED: datasheet profile" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["-fa", "maybe"], "-fa 'maybe'"),
    (["-p", "x"], "-p 'x'"),
    (["-ub", "0"], "-ub '0'"),
    (["-ctk", "q9"], "-ctk 'q9'"),
    (["-o", "xml"], "-o/--format 'xml'"),
    (["--hardware", "no-such-profile"], "no such profile"),
    # QA sweep 2026-11-27: these named --ctx-size, a flag speed does not have, after
    # seconds of listing 4 million ubatches; now the flag, at once
    (["-p", "2147483648"], "-p '2147483648': 2147483648 is above 2147483647"),
    (["-p", "2147483000", "-d", "1000", "-n", "0"], "p + n + d = 2147484000 is above"),
    (["-p", "128-512*2"], "llama-bench's ranges (FIRST-LAST[+STEP|*MULT]) are not modelled"),
    # absurd values: llama-bench's parse_int_range (regex ``\d+``, std::stoi) rejects a
    # negative value and one above INT32_MAX; its n_ctx = p + n + d is a 32-bit int
    (["-n", "1000000000000000000"], "-n '1000000000000000000': 1000000000000000000 is above "
     "2147483647"),
    (["-n", "-5"], "-n '-5': -5 is out of range"),
    (["-d", "-1"], "-d '-1': -1 is out of range"),
    (["-p", "0", "-n", "2147483647", "-d", "1"], "p + n + d = 2147483648 is above 2147483647"),
], ids=["fa", "p", "ub", "ctk", "format", "profile", "p-above-int32",
        "context-above-int32", "range", "n-1e18", "n-negative", "d-negative",
        "context-int32-plus-1"])
def test_cli_bad_flags_one_line_exit_2(tiny, cli, args, needle):
    model, prof = tiny
    base = ["speed", model] + ([] if "--hardware" in args else ["--hardware", prof])
    r = cli(*base, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


@pytest.mark.parametrize("args,rows", [
    # -p 0: llama-bench skips the pp test (get_cmd_params_instances: n_prompt == 0)
    (["-p", "0", "-n", "16"], [(0, 16, 0)]),
    # the largest -n llama-bench takes alone (n_ctx = INT32_MAX): predicted, in closed form
    (["-p", "0", "-n", "2147483647"], [(0, 2147483647, 0)]),
    # past the model's context_length (2048): llama.cpp warns and runs (n_ctx_train is
    # not a limit), so it is predicted
    (["-p", "3000", "-n", "5000", "-d", "1000"], [(3000, 0, 1000), (0, 5000, 1000)]),
    # no test at all: llama-bench prints its header (JSON: an empty list) and exits 0
    (["-p", "0", "-n", "0"], []),
], ids=["p0", "n-int32-max", "past-n_ctx_train", "nothing"])
def test_cli_extreme_values_are_predicted(tiny, cli, args, rows):
    model, prof = tiny
    r = cli("speed", model, "--hardware", prof, *args, "-o", "json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [(x["n_prompt"], x["n_gen"], x["n_depth"]) for x in got] == rows
    assert all(x["avg_ts"] > 0 for x in got)


def test_cli_json_refuses_a_time_past_llama_bench_uint64(tiny, cli, tmp_path):
    """llama-bench's avg_ns is a uint64 of nanoseconds (at most 2**64 - 1 ~ 1.84e19 ns).
    With every coefficient 1e6 times the tiny profile's, -n 2147483647 takes ~5.3e20 ns
    (the tiny profile's 5.34e14 ns x 1e6): JSON is refused in one line, markdown prints."""
    model, prof = tiny
    slow = yaml.safe_load(prof.read_text())
    c = slow["llama_cpp"]["coefficients"]
    slow["llama_cpp"]["coefficients"] = {k: v * 1e6 for k, v in c.items()}
    slow_path = tmp_path / "slow.yaml"
    slow_path.write_text(yaml.safe_dump(slow))
    args = ("speed", model, "--hardware", slow_path, "-p", "0", "-n", "2147483647")
    r = cli(*args, "-o", "json")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "tg2147483647 is predicted to take" in r.stderr and "avg_ns" in r.stderr
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    # and the same test at the tiny profile's speed fits: its avg_ns is written
    r = cli("speed", model, "--hardware", prof, "-p", "0", "-n", "2147483647", "-o", "json")
    assert 0 < json.loads(r.stdout)[0]["avg_ns"] < 2 ** 64


def test_cli_no_test_prints_the_header_only(tiny, cli):
    """-p 0 -n 0: llama-bench's markdown header and its separator line, no row, exit 0."""
    model, prof = tiny
    r = cli("speed", model, "--hardware", prof, "-p", "0", "-n", "0")
    assert r.returncode == 0, r.stderr
    table = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert len(table) == 2 and [c.strip() for c in table[0].split("|")][1] == "model"
    assert "t/s" in table[0]
    assert set(table[1]) <= set("|-: ")


def test_analyze_hardware_gains_the_predicted_step(tiny, cli):
    model, prof = tiny
    r = cli("analyze", model, "--hardware", prof, "--tokens", "4", "--past", "8")
    assert r.returncode == 0, r.stderr
    assert "llama.cpp CPU, predicted:" in r.stdout and "median 6.1%, worst 18.3%" in r.stdout
    r = cli("analyze", model, "--hardware", prof, "--tokens", "4", "--past", "8", "-f", "json")
    est = json.loads(r.stdout)["llama_cpp_cpu"]
    # the same model as graphcost speed: the priced sum of the step's counts
    from graphcost.cost.hardware import load
    from graphcost.cost.speed_model import from_profile
    assert est["seconds"] == pytest.approx(from_profile(load(str(prof))).seconds(est["counts"]),
                                           rel=1e-12)
    assert est["verified"] is True and est["counts"]["steps"] == 1


@pytest.mark.parametrize("n_q,n_kv,key", [(1, 512, "fa_mac:split"), (1, 256, "fa_mac"),
                                          (32, 512, "fa_mac"), (64, 256, "fa_mac:tiled")],
                         ids=["split", "one-row", "short-chunk", "tiled"])
def test_flash_attention_kernel_and_macs(n_q, n_kv, key):
    g = Graph()
    q = g.new_tensor(gt.F32, [64, n_q, 4, 1])              # [D, n_q, H]: 4 heads
    k = g.new_tensor(gt.F16, [64, n_kv, 2, 1], role="kv")  # 2 KV heads
    v = g.new_tensor(gt.F16, [64, n_kv, 2, 1], role="kv")
    mask = g.new_tensor(gt.F16, [n_kv, n_q])
    g.expand(g.flash_attn_ext(q, k, v, mask, 0.125, 0.0, 0.0))
    c = counts(_analysis(g))
    # ops.cpp: use_split_kv_path (1 row, >= 512 cells), use_tiled (>= 64 rows), else one_chunk;
    # MACs: n_q x 4 heads x n_kv x (64 + 64); one barrier after the node + one inside it
    assert c[key] == n_q * 4 * n_kv * 128
    assert c["barriers"] == 2


@pytest.mark.parametrize("counts,note", [(None, True), (1, True), (2, False)])
def test_cli_says_a_calibration_fitted_to_older_counts(tiny, cli, tmp_path, counts, note):
    """A profile calibrated before flash attention counted its live cells (no
    ``llama_cpp.counts``, or 1) gets a note under the table and in the JSON rows."""
    model, prof = tiny
    doc = yaml.safe_load(prof.read_text())
    if counts is not None:
        doc["llama_cpp"]["counts"] = counts
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "4")
    assert r.returncode == 0, r.stderr
    assert ("note: calibrated on counts 1 (flash attention priced over every KV cell); these "
            "are counts 2 (the cells its kernels compute): run graphcost calibrate again"
            in r.stdout) == note
    r = cli("speed", model, "--hardware", p, "-p", "16", "-o", "json")
    assert (json.loads(r.stdout)[0]["graphcost"].get("counts_calibrated") == 1) == note


def test_profile_with_bad_counts_is_one_line(tiny, cli, tmp_path):
    model, prof = tiny
    doc = yaml.safe_load(prof.read_text())
    doc["llama_cpp"]["counts"] = "two"
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc))
    r = cli("speed", model, "--hardware", p, "-p", "16")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"graphcost: {p}: llama_cpp.counts must be an integer >= 1 or null, got 'two'"]


def test_flash_attention_over_a_cache_counts_the_live_cells(tmp_path):
    """A step's flash attention over its KV caches counts the (query, cell) pairs ggml's
    kernels compute, masked cells skipped: gemma3, 3 layers, window 10, pattern 2
    (layers 0 and 2 sliding, 1 full), 4 heads of 64; 4 tokens after 8 (positions 8-11)."""
    from graphcost.graph.build import build_graph, load_model
    from graphcost.graph.settings import RunSettings

    m = load_model(write_gemma3(tmp_path / "g.gguf", n_layer=3, swa_pattern=2,
                                sliding_window=10))
    bg = build_graph(m, RunSettings(ctx_size=512, flash_attn="on", tokens=4, past=8))
    c = counts(analyze_graph(bg))
    # per layer 4 heads x (64 + 64) = 512 MACs a pair; sliding: 9 + 10 + 10 + 10 = 39
    # pairs, full: 9 + 10 + 11 + 12 = 42 (all cells: 4 x 256 = 1024 each)
    assert c["fa_mac"] == 512 * (2 * 39 + 42) == 61_440
    # the Predictor's form: heads x (Dk + Dv) per cache, the pairs left to it
    units = counts(analyze_graph(bg), live=False)
    assert (units["fa_units:row:swa"], units["fa_units:row:base"]) == (2 * 512, 512)
    assert "fa_mac" not in units


def test_cli_names_coefficients_the_calibration_did_not_pin(tiny, cli, tmp_path):
    model, _ = tiny
    p = tmp_path / "loose.yaml"
    doc = {"name": "loose", "kind": "measured", "memory_bandwidth": {"bytes_per_second": 1e10},
           "peak_flops": {"flops_per_second": 1e11},
           "llama_cpp": {"threads": 2, "coefficients": {"steps": 1e-5, "barriers": 2e-6,
                                                        "weight_bytes": 1e-10},
                         "error_band": {"median": 0.05, "worst": 0.1, "cases": 4}}}
    p.write_text(yaml.safe_dump(doc))
    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "0", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert "did not pin down" not in r.stdout
    # barriers: every graph counts them; "fa_mac:nowhere": no graph counts it (not named)
    doc["llama_cpp"]["undetermined"] = ["barriers", "fa_mac:nowhere"]
    p.write_text(yaml.safe_dump(doc))
    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "0", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert ("note: coefficients the calibration cases did not pin down (the band may not "
            "hold): barriers\n") in r.stdout
    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "0", "-t", "2", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["graphcost"]["not_pinned_down"] == ["barriers"]


def test_weights_placed_for_the_profile_or_the_given_cpu_features(tiny, cli, tmp_path):
    """The profile's calibration names the CPU features its counts placed weights for;
    ``--cpu-features`` overrides them (a llama.cpp built without some, e.g. no AMX)."""
    from graphcost.cost.hardware import load
    from graphcost.cost.speed_model import from_profile
    from graphcost.graph.build import load_model
    from graphcost.speed import Predictor

    model, prof = tiny
    doc = yaml.safe_load(prof.read_text())
    doc["llama_cpp"]["cpu_features"] = ["avx2"]
    p = tmp_path / "avx2.yaml"
    p.write_text(yaml.safe_dump(doc))
    sm = from_profile(load(str(p)))
    info = load_model(model)
    t = BenchTest(16, 0, 0, 2048, 512, "off", "f16", "f16", 2)
    by_profile = Predictor(info, sm)
    assert (by_profile.placement.features, by_profile.placement.features_from) == ({"avx2"},
                                                                "the profile's calibration")
    c_avx2 = by_profile.counts(t)
    none = Predictor(info, sm, features=frozenset())
    assert none.placement.features_from == "--cpu-features"
    c_none = none.counts(t)
    # AVX2 repacks Q4_0 (attn_q [256, 256], ffn_gate [256, 512]) and Q4_K (attn_output
    # [256, 256], ffn_down [512, 256]): ne[1] multiples of 8 (specs/backends/cpu.yaml).
    # 16 rows by gemm (16 - 16 % 4), but the last layer's FFN runs on its one output row
    # (gemv): Q4_K 16 x 256 x 256 x 2 + 16 x 512 x 256 = 4194304, then 512 x 256 = 131072
    assert c_avx2["mac:q4_K:gemm"] == 16 * 256 * 256 * 2 + 16 * 512 * 256 == 4194304
    assert c_avx2["mac:q4_K:gemv"] == 512 * 256 == 131072
    assert c_avx2["mac:q4_0:gemm"] == 16 * 256 * 256 * 2 + 16 * 256 * 512 == 4194304
    # no feature: no repack, the same MACs by the plain matmul paths
    assert not any(k.endswith(("gemm", "gemv")) for k in c_none)
    assert (c_none["mac:q4_K:mat"], c_none["mac:q4_K:vec"]) == (4194304, 131072)
    assert (c_none["mac:q4_0:mat"], c_none["mac:q4_0:vec"]) == (4194304, 131072)

    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "0", "-t", "2")
    assert r.returncode == 0, r.stderr
    assert ("weights placed (repacked or not) for CPU features avx2 (the profile's "
            "calibration)\n") in r.stdout and "calibrated with CPU features" not in r.stdout
    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "0", "-t", "2",
            "--cpu-features", "none", "-o", "json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)[0]["graphcost"]
    assert (g["cpu_features"], g["cpu_features_from"], g["cpu_features_calibrated"]) == \
        ([], "--cpu-features", ["avx2"])
    # the tiny profile has no gemm/mat coefficient of Q4 types: each takes its path's mean
    assert "mac:q4_K:mat" in g["no_coefficient"]
    # an older profile (no cpu_features): this machine's, said so
    r = cli("speed", model, "--hardware", prof, "-p", "16", "-n", "0", "-t", "2", "-o", "json")
    assert json.loads(r.stdout)[0]["graphcost"]["cpu_features_from"] == "this machine's"
    # analyze --hardware takes --cpu-features without --device, for the predicted step
    r = cli("analyze", model, "--hardware", p, "--cpu-features", "none", "-f", "json")
    est = json.loads(r.stdout)["llama_cpp_cpu"]
    assert (est["cpu_features"], est["cpu_features_from"]) == ([], "--cpu-features")
    r = cli("analyze", model, "--hardware", p)
    assert "weights placed for CPU features avx2 (the profile's calibration)" in r.stdout


def test_weights_placed_for_the_profiles_cpu(tiny, cli, tmp_path):
    """A profile's top-level ``cpu_features`` (its machine's: a datasheet's CPU) place the
    weights where its calibration names none; the calibration's, which its coefficients
    were fitted with, come first; every bundled datasheet profile names its CPU's."""
    from graphcost.cost.hardware import hardware_dir, load
    from graphcost.cost.speed_model import from_profile
    from graphcost.graph.build import load_model
    from graphcost.speed import Predictor

    model, prof = tiny
    info = load_model(model)
    doc = yaml.safe_load(prof.read_text())
    doc["cpu_features"] = ["avx2"]
    p = tmp_path / "machine.yaml"
    p.write_text(yaml.safe_dump(doc))
    pr = Predictor(info, from_profile(load(str(p))))
    assert (pr.placement.features, pr.placement.features_from) == ({"avx2"}, "the profile's CPU")
    doc["llama_cpp"]["cpu_features"] = ["avx512"]
    p.write_text(yaml.safe_dump(doc))
    pr = Predictor(info, from_profile(load(str(p))))
    assert (pr.placement.features, pr.placement.features_from) == ({"avx512"}, "the profile's calibration")

    bundled = {f.stem: yaml.safe_load(f.read_text())["cpu_features"]
               for f in sorted(hardware_dir().glob("*.yaml"))}
    assert bundled["apple-m2"] == ["neon", "dotprod", "i8mm"]
    assert all(bundled.values()), bundled
    r = cli("speed", model, "--hardware", "apple-m2", "-p", "16", "-n", "0", "-o", "json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)[0]["graphcost"]
    assert (g["cpu_features"], g["cpu_features_from"]) == (["dotprod", "i8mm", "neon"],
                                                           "the profile's CPU")


@pytest.mark.parametrize("feats,needle", [
    ("avx2", "cpu_features must be a list"),
    (["avx2", 3], "cpu_features[1] must be a string"),
    (["sse9"], "cpu_features 'sse9': unknown feature sse9"),
], ids=["not-a-list", "not-a-string", "unknown"])
def test_bad_profile_cpu_features_is_one_line_exit_2(tiny, cli, tmp_path, feats, needle):
    model, _ = tiny
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"name": "bad", "memory_bandwidth": {"bytes_per_second": 1e10},
                                 "peak_flops": {"flops_per_second": 1e11},
                                 "cpu_features": feats}))
    for cmd in (("speed", model, "--hardware", p, "-p", "16", "-n", "0"),
                ("analyze", model, "--hardware", p)):
        r = cli(*cmd)
        assert r.returncode == 2 and needle in r.stderr, (cmd, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args,needle", [
    (("--cpu-features", "avx-512"), "--cpu-features 'avx-512': unknown feature avx-512 (known:"),
    (("--cpu-features", "AVX2,sse9"), "unknown feature sse9"),
], ids=["typo", "one-of-two"])
def test_cli_unknown_cpu_feature_is_one_line_exit_2(tiny, cli, args, needle):
    model, prof = tiny
    for cmd in (("speed", model, "--hardware", prof, "-p", "16", "-n", "0"),
                ("analyze", model, "--hardware", prof), ("memory", model)):
        r = cli(*cmd, *args)
        assert r.returncode == 2 and needle in r.stderr, (cmd, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("section,needle", [
    ({"threads": 2, "coefficients": {"steps": "abc"}}, "llama_cpp.coefficients.steps"),
    ({"threads": 0, "coefficients": {"steps": 1e-5}}, "llama_cpp.threads"),
    ({"coefficients": {"steps": 1e-5}, "error_band": {"median": float("nan"), "worst": 0.1,
                                                      "cases": 3}}, "llama_cpp.error_band.median"),
    ("x", "llama_cpp"),
    ({"coefficients": {"steps": 1e-5}, "undetermined": "steps"}, "llama_cpp.undetermined"),
    ({"coefficients": {"steps": 1e-5}, "cpu_features": ["avx2", 3]},
     "llama_cpp.cpu_features[1] must be a string"),
    ({"coefficients": {"steps": 1e-5}, "cpu_features": ["avx2", "amx"]},
     "llama_cpp.cpu_features 'avx2,amx': unknown feature amx"),
    ({"coefficients": {"steps": 1e-5}, "cpu_features": ["avx2,avx512"]},
     "unknown feature avx2,avx512"),         # one element, not a comma list
], ids=["coefficient", "threads", "band-nan", "not-a-mapping", "undetermined-not-a-list",
        "feature-not-a-string", "feature-unknown", "feature-comma-list"])
def test_bad_calibration_section_is_one_line_exit_2(tiny, cli, tmp_path, section, needle):
    model, _ = tiny
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"name": "bad", "kind": "measured",
                                 "memory_bandwidth": {"bytes_per_second": 1e10},
                                 "peak_flops": {"flops_per_second": 1e11}, "llama_cpp": section}))
    r = cli("speed", model, "--hardware", p, "-p", "16", "-n", "0")
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
