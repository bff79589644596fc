"""graphcost speed against llama-bench, side by side, on this machine (one command).

    PYTHONPATH=. python benchmarks/bench_speed.py [--quick] [--profile NAME] [--save FILE]
                                                  [--passes N] [--reuse FILE [FILE ...]]

The calibration itself is the package's (graphcost/calibrate.py, what ``graphcost
calibrate`` runs: the same models, runs, case split, fit and profile section); this script
adds what a benchmark report needs:

1. the value check: the real Gemma 3 270M against its copy made whole as the large
   models are (graphcost.bench_models.make_whole: same header, tiled random data; the
   speed must not depend on the values; benchmarks/value_check.py is the long form);
2. the machine, the date, the load (before and after every llama-bench process), the
   autogroup this ran in; each llama-bench run waits until no other top-priority session
   (autogroup nice < 0) is busy and is re-run if one was (``--quiet-limit``);
3. every case's predicted and measured tok/s, each repetition, their ratio, the fitted
   coefficients, the median and worst |pred/meas - 1| on both sets;
4. ``--save`` / ``--reuse``: the measurements as JSON (refit without measuring);
   ``--reuse`` of several saved runs pools them (``graphcost.calibrate.pool``): each
   case measured as the median of every repetition of every llama-bench process that ran
   it (on the AVX2 VM one case moved by 25-35% between processes while the repetitions
   within each agreed); ``--passes N`` measures the set N times and pools the same way;
   ``--profile NAME``: store the result in that profile (as ``graphcost calibrate -o``);
   ``--quick``: the package's quick set (small models only).

Depths on the large models are limited to 1000 tokens (their prefill at 2 threads takes
~40-80 s per depth); Gemma 3 270M runs depth 0, 1000 and 4000.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from graphcost import calibrate as C  # noqa: E402
from graphcost.bench_models import make_whole  # noqa: E402
from graphcost.memory.backends import parse_cpu_features  # noqa: E402

#: the value check's model key: the real Gemma 3 270M made whole again (synthetic data)
SYNTH = "gemma-3-270m-synth"


def autogroup() -> str:
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None,
                    help="llama-bench's -t [default: this machine's CPUs; with --reuse, the "
                         "saved runs' n_threads]")
    ap.add_argument("--quick", action="store_true", help="the quick set (small models only)")
    ap.add_argument("--profile", help="hardware profile to store the calibration in")
    ap.add_argument("--llama-bench", help="llama-bench executable (default: as graphcost finds it)")
    ap.add_argument("--save", type=Path, help="write the measurements (JSON) here")
    ap.add_argument("--passes", type=int, default=1,
                    help="measure the whole set this many times, each case pooled over its "
                         "llama-bench processes (graphcost calibrate --passes)")
    ap.add_argument("--reuse", type=Path, nargs="+",
                    help="fit on measurements saved by --save; several files: each case "
                         "pooled over their runs (the median of all their repetitions)")
    ap.add_argument("--cpu-features", help="ggml CPU features the measured llama.cpp has, for "
                    "its weight placement (e.g. avx2,avx512,avx512_vnni for a variant without "
                    "AMX) [default: this machine's]")
    ap.add_argument("--quiet-limit", type=float, default=0.10,
                    help="start each llama-bench run when other top-priority sessions use "
                         "less than this share of the CPU (waiting up to 5 min); re-run a "
                         "run they used more of (up to 3 tries, the least disturbed kept)")
    a = ap.parse_args()
    if a.passes < 1:
        ap.error(f"--passes {a.passes}: use 1 or more")
    a.features = parse_cpu_features(a.cpu_features)
    try:
        saved = C.pool([json.loads(f.read_text()) for f in a.reuse]) if a.reuse else None
    except ValueError as e:
        ap.error(f"--reuse: {e}")
    if a.threads is None:   # a refit predicts for the threads the saved runs used
        ran = {r["n_threads"] for r in saved} if saved else {os.cpu_count()}
        if len(ran) != 1:
            ap.error(f"--reuse: runs at threads {sorted(ran)}; name one with --threads")
        a.threads = ran.pop()

    bench = C.find_llama_bench(a.llama_bench)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"{_cpu_name()}; threads {a.threads}; weights placed for CPU features "
          f"{', '.join(sorted(a.features)) or 'none'}")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load {C.load_avg()}; "
          f"autogroup {autogroup()}; llama-bench {bench}")
    tmp = Path(tempfile.mkdtemp(prefix="graphcost-speed-"))
    t_start = time.perf_counter()
    try:
        paths = C.prepare(tmp, a.quick, data="zero" if a.reuse else "random")  # reuse: count only
        runs = list(C.QUICK_RUNS if a.quick else C.FULL_RUNS)
        if "gemma-3-270m" in paths:       # the value check's synthetic copy
            paths[SYNTH] = make_whole(paths["gemma-3-270m"], tmp / "g270-synth.gguf",
                                      vocab_none=False, data="zero" if a.reuse else "random")
            runs.append(C.Run(SYNTH, ("-p", "512", "-n", "32", "-fa", "1"), 3))
        if a.reuse:
            rows = saved
        else:
            print("llama-bench runs:")
            done: list[dict] = []
            for i in range(a.passes):
                if a.passes > 1:
                    print(f"pass {i + 1} of {a.passes}")
                done += measure_gated(bench, paths, runs, a, done)
            rows = C.pool([done])
        report(rows, paths, a, bench)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"total {time.perf_counter() - t_start:.0f} s; load now {C.load_avg()}")
    return 0


def measure_gated(bench, paths: dict, runs: list, a, before: list[dict] = ()) -> list[dict]:
    """graphcost.calibrate.measure, one run at a time, each started when no other
    top-priority session is busy (benchmarks/value_check.py's gate) and re-run when one
    was; every row gets ``others_cpu`` (their share of the CPU during its run). ``--save``
    gets ``before`` (earlier passes' rows) and these after every run."""
    from value_check import RivalMeter, wait_quiet

    rows = []
    for run in runs:
        best = None
        for _ in range(3):
            wait_quiet(a.quiet_limit, 300, lambda s: print(s, flush=True))
            m, done = RivalMeter(), threading.Event()
            t = threading.Thread(target=lambda: [m.sample() for _ in iter(
                lambda: done.wait(0.2), True)], daemon=True)
            t.start()
            try:
                got = C.measure(bench, paths, [run], a.threads,
                                log=lambda s: print(s, flush=True))
            finally:
                done.set()
                t.join()
            share = m.share()
            if best is None or share < best[1]:
                best = (got, share)
            if share < a.quiet_limit:
                break
            print(f"    other top-priority sessions used {100 * share:.0f}% of the CPU: "
                  f"again", flush=True)
        for r in best[0]:
            r["others_cpu"] = round(best[1], 3)
        rows += best[0]
        if a.save:          # after every run: a run cut short keeps what it measured
            a.save.write_text(json.dumps([*before, *rows], indent=1))
    return rows


def report(rows: list[dict], paths: dict, a, bench) -> None:
    # 1. value independence: real 270M against its synthetic copy (medians of the runs)
    synth = {(r["test"], r["n_ubatch"], r["flash_attn"]): r for r in rows
             if r["model"] in (SYNTH, "gemma-3-270m-zero")}     # (older saved runs: zero)
    if synth:
        print("\nvalue check (Gemma 3 270M real vs make_whole's synthetic tensor data):")
    for r in rows:
        z = synth.get((r["test"], r["n_ubatch"], r["flash_attn"]))
        if r["model"] == "gemma-3-270m" and z:
            real, syn = statistics.median(r["samples_ts"]), statistics.median(z["samples_ts"])
            print(f"  {r['test']:14s} ub {r['n_ubatch']:3d} fa {r['flash_attn']}: real "
                  f"{real:8.2f}  {z['model'][13:]} {syn:8.2f} tok/s  ratio {syn / real:.3f}")
    cases = [r for r in rows if r["model"] not in (SYNTH, "gemma-3-270m-zero")]

    # 2. counts, fit on the calibration cases, predict all (the package's calibration)
    t0 = time.perf_counter()
    C.count(cases, paths, a.features)
    print(f"\ngraphs built and counted in {time.perf_counter() - t0:.1f} s")
    cal = C.evaluate(cases, a.threads, a.features)
    print("\ncoefficients (seconds per unit; fitted on the calibration cases):")
    for k, v in cal.coef.items():
        print(f"  {k:16s} {v:.4g}")
    print(f"\n{'model':14s} {'test':14s} {'ub':>4s} {'fa':>3s} {'set':5s} {'pred t/s':>9s} "
          f"{'median':>9s} {'(runs)':>22s} {'pred/meas':>9s}  load")
    for r in cases:
        runs = " | ".join(",".join(f"{x:.1f}" for x in p)
                          for p in r.get("by_process", [r["samples_ts"]]))
        print(f"{r['model']:14s} {r['test']:14s} {r['n_ubatch']:4d} {r['flash_attn']:3d} "
              f"{'cal' if r['cal'] else 'held':5s} {r['pred_ts']:9.2f} {r['meas_ts']:9.2f} "
              f"{runs:>22s} {r['ratio']:9.3f}  {r['load']}"
              + (f", others {100 * r['others_cpu']:.0f}%" if "others_cpu" in r else ""))
    for name, b in cal.band.items():
        print(f"{name:12s}: {b['cases']} cases, median |pred/meas - 1| = "
              f"{100 * b['median']:.1f}%, worst {100 * b['worst']:.1f}%")
    print("coefficients the calibration cases do not pin down: "
          f"{', '.join(cal.undetermined) or 'none'}")
    print(f"target (held-out median <= 10%, worst <= 25%): "
          f"{'met' if cal.target_met else 'NOT met'}")
    if a.profile:
        path, note = C.store(a.profile, C.section(cal, bench, a.quick), read=C.machine_read)
        print(f"stored in {path}" + (f" ({note})" if note else ""))


def _cpu_name() -> str:
    from graphcost.execute.hwprobe import _cpu_name as cpu
    return cpu()


if __name__ == "__main__":
    sys.exit(main())
