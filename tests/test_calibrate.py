"""graphcost calibrate: finding llama-bench, the calibration models, the fit and its
error bands on synthetic measurements (exact numbers, no timing), the profile section it
writes, bad flags (one line, exit 2), and -- only where llama-bench is built -- the real
quick calibration end to end."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest

from graphcost import calibrate as C
from graphcost.bench_models import make_whole, write_tiny_llama
from graphcost.cost.hardware import load
from graphcost.cost.speed_model import from_profile
from graphcost.errors import UnsupportedError
from graphcost.format.gguf_reader import read_header

ROOT = Path(__file__).resolve().parents[1]


def _fake_bench(d: Path) -> Path:
    p = d / "llama-bench"
    p.write_text("#!/bin/sh\nexit 0\n")
    p.chmod(0o755)
    return p


# ------------------------------------------------------------------ finding llama-bench

def test_find_llama_bench_flag_path_cache(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    fa, fb = _fake_bench(a), _fake_bench(b)
    assert C.find_llama_bench(fa) == fa                 # the flag: the file
    assert C.find_llama_bench(a) == fa                  # or its directory
    monkeypatch.setenv("PATH", str(b))
    assert C.find_llama_bench() == fb                   # then PATH
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("GRAPHCOST_LLAMA_TOOLS", str(a))
    assert C.find_llama_bench() == fa                   # then the tools cache
    monkeypatch.setenv("GRAPHCOST_LLAMA_TOOLS", str(tmp_path / "none"))
    with pytest.raises(C.GraphcostError, match="llama-bench not found on PATH nor in"):
        C.find_llama_bench()
    with pytest.raises(C.GraphcostError, match="not an executable llama-bench"):
        C.find_llama_bench(tmp_path / "none")


# ------------------------------------------------------------------ calibration models

def test_tiny_llama_loads(tmp_path):
    from graphcost.graph.build import load_model

    p = write_tiny_llama(tmp_path / "s.gguf", **C.SMALL)
    h = read_header(p)
    # token_embd, output_norm, output + 9 tensors per layer
    assert len(h.tensors) == 3 + 9 * C.SMALL["n_layer"]
    assert h.metadata["tokenizer.ggml.model"] == "none"
    assert h.tensors["blk.0.ffn_down.weight"].ne == (1536, 512)
    # Q4_K: 144 bytes per 256 values; ffn_down 1536 x 512 -> 6 * 512 blocks
    assert h.tensors["blk.0.ffn_down.weight"].nbytes == 6 * 512 * 144
    m = load_model(p)
    assert m.arch == "llama" and m.n_layer == 8
    with pytest.raises(ValueError, match="not a multiple of Q4_K's block of 256"):
        write_tiny_llama(tmp_path / "bad.gguf", n_layer=1, weight_type="Q4_K")


def test_tiny_types(tmp_path):
    import gguf

    h = read_header(write_tiny_llama(tmp_path / "t.gguf", n_layer=1, types=C.TINY_TYPES))
    T = gguf.GGMLQuantizationType
    assert {k: T(v.type).name for k, v in h.tensors.items() if k.startswith("blk.0.attn")
            or k.startswith("blk.0.ffn_")} == {
        "blk.0.attn_norm.weight": "F32", "blk.0.attn_q.weight": "Q4_0",
        "blk.0.attn_k.weight": "F16", "blk.0.attn_v.weight": "Q8_0",
        "blk.0.attn_output.weight": "Q8_0", "blk.0.ffn_norm.weight": "F32",
        "blk.0.ffn_gate.weight": "Q4_0", "blk.0.ffn_up.weight": "Q8_0",
        "blk.0.ffn_down.weight": "Q8_0"}
    # F16 attn_k: [64, 2 heads x 16] -> 64 * 32 * 2 bytes
    assert h.tensors["blk.0.attn_k.weight"].nbytes == 64 * 32 * 2


def test_make_whole_example(tmp_path):
    src = ROOT / "examples" / "llama-3.1-8b-instruct-q4_k_m.gguf"
    dst = make_whole(src, tmp_path / "w.gguf", data="zero")      # the 4.9 GB stay sparse
    h0, h = read_header(src), read_header(dst)
    assert h.metadata["tokenizer.ggml.model"] == "none"
    assert h.tensors.keys() == h0.tensors.keys()
    size = max(t.offset + t.nbytes for t in h0.tensors.values())
    assert dst.stat().st_size == h.data_offset + size
    assert h.data_offset % h.alignment == 0



def test_make_whole_random_tiles_a_pool_per_type(tmp_path, monkeypatch):
    """data="random": every tensor holds finite values of its type; tensors of one type
    continue one pool of an odd number of blocks (here 7: POOL_BYTES 1000 // 144 | 1 for
    Q4_K, 1000 // 34 = 29 for Q8_0), so the file has no zero block and no all-zero page."""
    import gguf
    import numpy as np

    from graphcost import bench_models

    monkeypatch.setattr(bench_models, "POOL_BYTES", 1000)
    src = write_tiny_llama(tmp_path / "src.gguf", n_layer=2, n_embd=256, n_ff=512,
                           n_vocab=300, weight_type="Q4_K", types={"attn_v": "Q8_0"})
    dst = make_whole(src, tmp_path / "w.gguf", vocab_none=False)
    assert dst.read_bytes()[:read_header(src).data_offset] == \
        src.read_bytes()[:read_header(src).data_offset]                    # same header
    h = read_header(dst)
    raw = np.fromfile(dst, np.uint8)
    q4k = []
    for name, t in sorted(h.tensors.items(), key=lambda kv: kv[1].offset):
        b = raw[h.data_offset + t.offset:h.data_offset + t.offset + t.nbytes]
        v = gguf.dequantize(b, t.type)
        assert np.isfinite(v).all(), name
        if len(t.ne) == 1:                                   # norms: drawn whole, around 1
            assert 0.5 < v.mean() < 1.5, name
        else:                                                # weights: small, not zero
            assert 0 < np.abs(v).max() < 1, name
        if t.type == gguf.GGMLQuantizationType.Q4_K:
            q4k.append(b.reshape(-1, 144))
    q4k = np.concatenate(q4k)                 # 2 layers x 6 matrices + embd + output
    assert len(q4k) > 7 and (q4k[7:] == q4k[:-7]).all()      # period 7 blocks
    assert not (q4k[1:7] == q4k[0]).all(axis=1).any()         # within it, all differ
    data = raw[h.data_offset:]
    pages = data[:len(data) // 4096 * 4096].reshape(-1, 4096)
    assert pages.any(axis=1).all()                             # no all-zero page
    with pytest.raises(ValueError, match="'random' or 'zero'"):
        make_whole(src, tmp_path / "x.gguf", data="ones")
    iq = write_tiny_llama(tmp_path / "iq.gguf", n_layer=1, weight_type="IQ4_NL")
    with pytest.raises(UnsupportedError, match=r"iq-whole.gguf: token_embd.weight: .*iq4_nl"):
        make_whole(iq, tmp_path / "iq-whole.gguf")


# ------------------------------------------------------------------ fit and bands

COEF = {"steps": 1e-5, "barriers": 2e-6}


def _row(model, test, steps, barriers, factor=1.0, ub=512, fa=0, tokens=10):
    """A measured case whose true seconds are COEF . counts, measured ``factor`` times
    slower."""
    sec = factor * (COEF["steps"] * steps + COEF["barriers"] * barriers)
    r = {"model": model, "test": test, "n_prompt": 0, "n_gen": tokens, "n_ubatch": ub,
         "flash_attn": fa, "n_threads": 2, "counts": {"steps": steps, "barriers": barriers},
         "meas_ts": tokens / sec, "seconds": sec, "build": "abc (1)"}
    r["cal"] = C.is_calibration(r)
    return r


def _rows():
    return [_row("tiny-1", "tg10", 10, 100),              # 1e-4 + 2e-4 s
            _row("tiny-12", "tg10", 10, 1000),            # 1e-4 + 2e-3 s
            _row("small", "tg32", 32, 200),                # CAL: exact
            _row("small", "tg32", 32, 900, fa=1, factor=1.25),    # held out: 25% slower
            _row("small", "pp128", 4, 300, ub=32, fa=1, factor=0.8)]   # held: 20% faster


def test_calibration_split():
    rows = _rows()
    assert [r["cal"] for r in rows] == [True, True, True, False, False]


def _saved(ts: list[float], depth: int = 0, build: str = "0c1e570 (1)", **extra) -> dict:
    """A row as measure() saves it (the fields pool() reads)."""
    return {"model": "small", "test": f"tg32 @ d{depth}" if depth else "tg32", "n_prompt": 0,
            "n_gen": 32, "n_depth": depth, "n_batch": 2048, "n_ubatch": 512,
            "flash_attn": 0, "type_k": "f16", "type_v": "f16", "n_threads": 2,
            "avg_ts": sum(ts) / len(ts), "samples_ts": ts, "load": f"load {ts[0]:.0f}",
            "build": build, **extra}


def test_pool_pools_each_case_over_the_processes():
    # the AVX2 VM's small tg32 @ d512 FA off: one process 367 tok/s, the next 275
    one = [_saved([458.4, 435.9, 400.6], 256), _saved([373.6, 380.3, 346.4], 512, others_cpu=0.0)]
    two = [_saved([268.4, 271.2, 284.4], 512, others_cpu=0.05), _saved([433.8, 530.2, 490.9], 256),
           _saved([456.7, 425.8, 471.3])]       # a case only the second pass ran
    rows = C.pool([one, two])
    # the first pass's order, then the second's new case
    assert [r["n_depth"] for r in rows] == [256, 512, 0]
    d512 = rows[1]
    assert d512["by_process"] == [[373.6, 380.3, 346.4], [268.4, 271.2, 284.4]]
    assert d512["samples_ts"] == [373.6, 380.3, 346.4, 268.4, 271.2, 284.4]
    # median of the six: (284.4 + 346.4) / 2 = 315.4 (what count() takes as meas_ts);
    # mean (373.6 + 380.3 + 346.4 + 268.4 + 271.2 + 284.4) / 6 = 1924.3 / 6
    assert statistics.median(d512["samples_ts"]) == pytest.approx(315.4)
    assert d512["avg_ts"] == pytest.approx(1924.3 / 6)
    assert d512["load"] == "load 374; load 268" and d512["others_cpu"] == 0.05
    assert rows[2]["by_process"] == [[456.7, 425.8, 471.3]]
    # the inputs are not changed; one pass gains by_process, one process a case
    assert one[1]["samples_ts"] == [373.6, 380.3, 346.4] and "by_process" not in one[1]
    assert [r["by_process"] for r in C.pool([one])] == [[[458.4, 435.9, 400.6]],
                                                        [[373.6, 380.3, 346.4]]]
    # pooled rows pooled again keep their processes; one list with a case twice (the
    # passes of bench_speed.py --save, one after the other) is pooled as two passes
    again = C.pool([rows, [_saved([300.0], 512)]])
    assert again[1]["by_process"] == [[373.6, 380.3, 346.4], [268.4, 271.2, 284.4], [300.0]]
    assert C.pool([one + two])[1]["by_process"] == d512["by_process"]
    with pytest.raises(ValueError, match="different llama-bench builds: 0c1e570 \\(1\\), "
                                         "abc1234 \\(2\\)"):
        C.pool([one, [_saved([1.0], build="abc1234 (2)")]])


def test_evaluate_exact():
    c = C.evaluate(_rows(), threads=2)
    # three consistent calibration cases recover the coefficients
    assert c.coef["steps"] == pytest.approx(1e-5, rel=1e-6)
    assert c.coef["barriers"] == pytest.approx(2e-6, rel=1e-6)
    assert c.band["calibration"]["cases"] == 3
    assert c.band["calibration"]["worst"] < 1e-6
    # predicted/measured tok/s = measured/predicted seconds = the factor: 1.25 and 0.8
    assert [round(r["ratio"], 6) for r in c.rows[3:]] == [1.25, 0.8]
    # held-out |ratio - 1|: 0.25 and 0.2 -> median 0.225, worst 0.25
    assert c.band["held-out"] == {"cases": 2, "median": pytest.approx(0.225, rel=1e-6),
                                  "worst": pytest.approx(0.25, rel=1e-6)}
    h = c.band["held-out"]
    assert c.target_met == (h["median"] <= 0.10 and h["worst"] <= 0.25)
    # (steps, barriers) = (10, 100), (10, 1000), (32, 200): rank 2, both pinned
    assert c.undetermined == []


def test_evaluate_names_what_one_case_cannot_pin():
    # one calibration case, two coefficients: 1e-5 x 10 + 2e-6 x 100 s is met by any
    # non-negative trade of steps against barriers along 10 x d_steps + 100 x d_barriers = 0
    rows = [r for r in _rows() if r["model"] != "tiny-12" and r["test"] != "tg32"
            or not r["cal"]]
    assert [r["cal"] for r in rows] == [True, False, False]
    c = C.evaluate(rows, threads=2)
    assert c.undetermined == ["barriers", "steps"]
    assert C.section(c, Path("/x/llama-bench"), quick=True)["undetermined"] == ["barriers",
                                                                              "steps"]


def test_section_keeps_the_cpu_features_the_counts_used(tmp_path):
    c = C.evaluate(_rows(), threads=2, features=frozenset({"avx512", "avx2"}))
    sec = C.section(c, Path("/x/llama-bench"), quick=True)
    assert sec["cpu_features"] == ["avx2", "avx512"]
    path, _ = C.store(str(tmp_path / "f.yaml"), sec)
    assert from_profile(load(str(path))).cpu_features == {"avx2", "avx512"}
    # and the counts its coefficients were fitted to (2: flash attention's live pairs)
    assert sec["counts"] == 2 and from_profile(load(str(path))).counts == 2
    # without features (an older calibration's rows): no key, the profile does not say
    assert "cpu_features" not in C.section(C.evaluate(_rows(), threads=2),
                                           Path("/x/llama-bench"), quick=True)


def test_evaluate_without_calibration_cases():
    rows = [r for r in _rows() if not r["cal"]]
    with pytest.raises(C.GraphcostError, match="no calibration case was measured"):
        C.evaluate(rows, threads=2)


# ------------------------------------------------------------------ profile section

def test_store_new_then_existing_profile(tmp_path):
    c = C.evaluate(_rows(), threads=2)
    bench = Path("/opt/llama/llama-bench")
    sec = C.section(c, bench, quick=True)
    assert sec["how"].startswith("graphcost calibrate --quick: llama.cpp measured with "
                                 "llama-bench on this machine (5 cases")
    assert "3 calibration cases, checked on 2 held-out cases" in sec["how"]
    assert sec["source"] == "llama-bench /opt/llama/llama-bench, build abc (1)"
    prof = tmp_path / "m.yaml"
    path, _ = C.store(str(prof), sec)
    hw = load(str(path))
    assert hw.kind == "measured" and hw.threads == 2
    sm = from_profile(hw)
    assert sm.verified and sm.threads == 2 and sm.source == sec["how"]
    assert sm.band["median"] == pytest.approx(0.225, rel=1e-6)
    assert sm.coefficient("barriers") == pytest.approx(2e-6, rel=1e-6)
    # no weight_bytes / MAC coefficient fitted and nothing to measure with: the minimal
    # profile's figures say 1, and its bandwidth says it was not measured
    assert hw.bandwidth == 1 and hw.peak_flops == 1
    assert hw.extra["memory_bandwidth"]["how"].startswith("not measured")
    # with a streaming read to measure (calibrate's: hwprobe.stream_read), that figure
    other = tmp_path / "read.yaml"
    asked = []
    C.store(str(other), sec, read=lambda threads: asked.append(threads) or 2.25e10)
    hw2 = load(str(other))
    assert hw2.bandwidth == 22_500_000_000 and asked == [2]      # the calibration's threads
    assert hw2.extra["memory_bandwidth"]["how"].startswith("kernels.stream.read_rows")
    # the peak comes from the MAC coefficients the cases pin down: an undetermined one at
    # ~0 (the Xeon's mac:q4_0:gemv, 2.2e-25 s) would make 2 / 2e-25 = 1e25 FLOP/s
    sec3 = dict(sec, coefficients={"mac:q4_0:gemv": 2e-25, "mac:q4_K:gemm": 5e-13,
                                   "mac:q8_0:vec": 0.0, "weight_bytes": 1e-11},
                undetermined=["mac:q4_0:gemv"])
    C.store(str(tmp_path / "peak.yaml"), sec3)
    hw3 = load(str(tmp_path / "peak.yaml"))
    assert hw3.peak_flops == 4_000_000_000_000       # 2 FLOP / 5e-13 s
    assert hw3.bandwidth == 100_000_000_000          # 1 / 1e-11 s per byte
    # an undetermined weight_bytes is a guess as well: the streaming read stands in
    sec4 = dict(sec3, undetermined=["mac:q4_0:gemv", "weight_bytes"])
    C.store(str(tmp_path / "bw.yaml"), sec4, read=lambda threads: 3e10)
    hw4 = load(str(tmp_path / "bw.yaml"))
    assert hw4.bandwidth == 30_000_000_000 and hw4.peak_flops == 4_000_000_000_000
    assert "undetermined" in hw4.extra["memory_bandwidth"]["how"]
    # a second calibration into the existing profile keeps its other fields
    import yaml
    doc = yaml.safe_load(path.read_text())
    doc["description"] = "kept"
    path.write_text(yaml.safe_dump(doc))
    sec2 = dict(sec, coefficients={"steps": 3e-5})
    C.store(str(prof), sec2)
    doc2 = yaml.safe_load(path.read_text())
    assert doc2["description"] == "kept"
    assert doc2["llama_cpp"]["coefficients"] == {"steps": 3e-5}


def test_calibrate_passes_pool_the_processes(tmp_path, monkeypatch):
    """--passes 2: the whole quick set measured twice, each case the median of both
    processes' repetitions; the profile's how says so."""
    calls = []

    def fake_measure(bench, paths, runs, threads, log=print):
        calls.append(len(runs))
        ts = [100.0, 110.0] if len(calls) == 1 else [130.0, 140.0]
        # a case per run (depth = its index), one row each
        return [dict(_saved(ts, depth=i), model=run.model) for i, run in enumerate(runs)]
    monkeypatch.setattr(C, "measure", fake_measure)
    monkeypatch.setattr(C, "count", lambda rows, paths, features=None: [
        dict(r, counts={"steps": 1}, meas_ts=statistics.median(r["samples_ts"]),
             seconds=16 / statistics.median(r["samples_ts"]), cal=True) for r in rows])
    lines = []
    cal = C.calibrate(_fake_bench(tmp_path), 2, quick=True, log=lines.append, passes=2)
    assert calls == [len(C.QUICK_RUNS)] * 2 and "pass 2 of 2" in lines
    # a row a case, with both processes' repetitions
    assert len(cal.rows) == len(C.QUICK_RUNS)
    r = cal.rows[0]
    assert r["by_process"] == [[100.0, 110.0], [130.0, 140.0]]
    assert r["meas_ts"] == 120.0                # median of 100, 110, 130, 140
    assert "in 2 processes" in C.section(cal, Path("/x/llama-bench"), quick=True)["how"]


def test_machine_read_runs_on_at_most_the_threads_numba_started(monkeypatch):
    # llama-bench's -t may exceed the cores; the read then runs on Numba's count
    import numba

    from graphcost.execute import hwprobe
    asked = []
    monkeypatch.setattr(hwprobe, "stream_read", lambda threads: asked.append(threads) or 2e10)
    top = numba.config.NUMBA_NUM_THREADS
    assert C.machine_read(top + 14) == 2e10 and C.machine_read(1) == 2e10
    assert asked == [top, 1]


# ------------------------------------------------------------------ command line

@pytest.mark.parametrize("args, msg", [
    (("--llama-bench", "/nonexistent/llama-bench"), "not an executable llama-bench"),
    (("--threads", "0"), "--threads 0: use 1 or more"),
    (("--passes", "0"), "--passes 0: use 1 or more"),
    (("--cpu-features", "avx2,amx"), "--cpu-features 'avx2,amx': unknown feature amx"),
    (("--bogus",), "No such option"),
])
def test_cli_bad_flags(cli, args, msg):
    r = cli("calibrate", "--quick", "-o", "/nonexistent-dir/x.yaml", *args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], r.stderr


@pytest.mark.parametrize("where, msg", [("dir", "is a directory"),
                                         ("missing", "does not exist")])
def test_cli_bad_output(cli, tmp_path, where, msg):
    out = tmp_path if where == "dir" else tmp_path / "no-dir" / "x.yaml"
    r = cli("calibrate", "--quick", "--llama-bench", _fake_bench(tmp_path), "-o", out)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], r.stderr


# ------------------------------------------------------------------ end to end

def _no_bench() -> str | None:
    try:
        C.find_llama_bench()
    except C.GraphcostError as e:
        return str(e)
    return None


@pytest.mark.skipif(_no_bench() is not None, reason=_no_bench() or "")
@pytest.mark.skipif(not os.environ.get("GRAPHCOST_SLOW"),
                    reason="runs llama-bench 40-110 s (more under load): set GRAPHCOST_SLOW=1")
def test_quick_calibration_end_to_end(cli, tmp_path):
    t0 = time.perf_counter()
    prof = tmp_path / "p.yaml"
    r = cli("calibrate", "--quick", "-o", prof, "--save", tmp_path / "runs.json")
    assert r.returncode == 0, r.stderr
    hw = load(str(prof))
    sec = hw.extra["llama_cpp"]
    n_cases = 2 + 8 + 6 + 2          # tiny 1 + 1, small pp ub x fa, tg depth x fa, pp @ d512
    assert len(sec["cases"]) == n_cases
    assert sec["error_band"]["cases"] + sec["calibration_band"]["cases"] == n_cases
    assert sec["calibration_band"]["cases"] == 2 + 12
    assert "llama-bench" in sec["source"] and sec["how"].startswith("graphcost calibrate --quick")
    assert all(v >= 0 for v in sec["coefficients"].values())
    assert f"wrote {prof}" in r.stdout and "held-out: 4 cases" in r.stdout
    print(f"quick calibration: {time.perf_counter() - t0:.0f} s")
