"""Check graphcost's CUDA figures against llama.cpp built with CUDA, in one command.

On a machine with an NVIDIA GPU (this is not a test: the test suite runs without one):

    python benchmarks/check_cuda.py --build /path/to/llama_cpp_python-0.3.36/vendor/llama.cpp
    python benchmarks/check_cuda.py --bin /path/to/build-cuda/bin          # already built

``--build`` configures and builds the vendored llama.cpp with ``-DGGML_CUDA=ON`` (the same
source llama-cpp-python 0.3.36 vendors) into ``--build-dir`` (default
``~/.cache/graphcost/llama-cuda-build``), targets ``llama-completion`` and
``llama-fit-params``. Then it writes tiny fixture models (tests/fixtures*.py), runs
``llama-completion -if -fit off -c 512 -n 1 -lv 5`` with several ``-ngl``/``-fa``/``-ctk`` settings
(and ``-ts 1,1`` when two GPUs are visible), parses every ``model``, ``KV``, ``output`` and
``compute buffer size`` line and the graph split counts, asks ``graphcost memory --device
cuda,cc=<the GPU's compute capability> --format json`` for the same flags, and prints one
row per buffer: llama.cpp's MiB, graphcost's MiB (two decimals, as llama.cpp prints), and
whether they are equal. A figure graphcost reports as not modelled prints ``n/m`` and
counts as not checked, never as equal. Exit status 0 when every modelled figure is equal,
1 otherwise, 2 when the tools or the GPU are missing.

``--examples`` adds the header-only examples (Llama 3.1 8B, Gemma 3 4B) made whole with
sparse zero data, at real contexts (``EXAMPLE_CASES``).

``--fit`` adds llama-fit-params on CUDA0 against ``graphcost fit`` given the free memory
llama.cpp measured (``FIT_CASES``; Mistral Large 2407 made whole too).

``--amx`` adds CPU-only (``-dev none``) and ``--no-host`` cases for a CPU with AMX (the
AMX buffer type; ``AMX_CASES``); ``--without amx_int8,...`` takes features from graphcost's
list where llama.cpp's build has no AMX; ``--only REGEX`` keeps the cases it matches.
A run counts once sched_reserve has logged its buffers, whatever its exit (printed).

``--dry-run`` prints graphcost's side only (no GPU needed): what the comparison would use.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fixtures import write_llama  # noqa: E402
from fixtures_moe import write_mixtral, write_qwen3moe  # noqa: E402
from llama_runs import parse_buffers, run_until_buffers  # noqa: E402

from graphcost.bench_models import make_whole  # noqa: E402
from graphcost.memory.backends import host_cpu_features  # noqa: E402

MiB = 1024 * 1024

MODELS = {
    # heads of 32: CUDA has no flash-attention kernel for them (-fa auto turns it off)
    "llama5-hd32": lambda p: write_llama(p, n_layer=5),
    # heads of 128: flash attention on CUDA; quantized rows of 768 (padded to 1024)
    "llama4-hd128": lambda p: write_llama(p, n_layer=4, head_dim=128),
    # MoE, 6 experts: graph_optimize's weighted-sum dependencies only (6 is not an
    # instantiated top-k count)
    "mixtral": lambda p: write_mixtral(p, n_layer=4),
    # MoE, 4 experts, heads of 64: both MoE fusions' dependencies (top-k routing and the
    # weighted sum), flash attention on by -fa auto
    "qwen3moe": lambda p: write_qwen3moe(p, n_layer=3),
}

#: --examples: the header-only examples made whole (sparse zeros; tokenizer "none", so
#: llama-completion aborts at the prompt, after sched_reserve has logged every buffer)
EXAMPLES = {
    "llama8b": ROOT / "examples" / "llama-3.1-8b-instruct-q4_k_m.gguf",
    "gemma4b": ROOT / "examples" / "gemma-3-4b-it-q4_k_m.gguf",
    "mistral": ROOT / "examples" / "mistral-large-2407-q4_0.gguf",
}

#: --amx: the CPU's AMX buffer type (a CPU with amx_int8 and avx512_vnni and the
#: sapphirerapids variant kept); GPUs needed 0: CPU only (-dev none). With a GPU, a weight
#: on the CPU goes to the GPU's host buffer first (mapped with mmap), so --no-host
AMX_CASES = [
    ("llama5-hd32", [], 0),
    ("llama4-hd128", ["-fa", "on"], 0),
    ("mixtral", [], 0),
    ("llama8b", ["-c", "4096"], 0),
    ("gemma4b", ["-c", "4096"], 0),
    ("llama4-hd128", ["-ngl", "2", "--no-host"], 1),
    ("llama8b", ["-ngl", "20", "-c", "4096", "--no-host"], 1),
    ("llama8b", ["-ngl", "20", "-c", "4096"], 1),
]

#: --fit: (example, llama-fit-params / graphcost fit flags) on the GPU's free memory
FIT_CASES = [
    ("llama8b", []),                          # full context, every layer: no change
    ("llama8b", ["-fitt", "76000"]),          # context down to -fitc, then layers
    ("mistral", []),                          # 69 GB of weights: context reduced
    ("mistral", ["-c", "65536"]),             # the user's context kept: layers reduced
    ("mistral", ["-c", "8192", "-ctk", "q8_0", "-ctv", "q8_0"]),
]

#: GGML_CUDA_DISABLE_FUSION=1 for llama.cpp is device option fusion=0 for graphcost
NO_FUSION = {"env": {"GGML_CUDA_DISABLE_FUSION": "1"}, "opt": "fusion=0"}

#: (model, llama.cpp/graphcost flags, GPUs needed[, NO_FUSION])
CASES = [
    ("llama5-hd32", ["-ngl", "0"], 1),
    ("llama5-hd32", ["-ngl", "3"], 1),
    ("llama5-hd32", ["-ngl", "all"], 1),
    ("llama5-hd32", ["-ngl", "all", "-fa", "off"], 1),
    ("llama4-hd128", ["-ngl", "all"], 1),
    ("llama4-hd128", ["-ngl", "2", "-fa", "on"], 1),
    ("llama4-hd128", ["-ngl", "all", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"], 1),
    ("llama4-hd128", ["-ngl", "all", "-fa", "on", "-ctk", "q4_0", "-ctv", "q4_0", "-ub", "128"], 1),
    ("llama4-hd128", ["-ngl", "all", "-nkvo"], 1),
    ("llama4-hd128", ["-ngl", "2", "--no-op-offload"], 1),
    ("llama4-hd128", ["-ngl", "all", "-fa", "on", "-ctk", "q4_1", "-ctv", "q4_1"], 1),  # no vec instance
    ("llama4-hd128", ["-ngl", "all", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-ub", "2"], 1),
    ("mixtral", ["-ngl", "all"], 1),
    ("mixtral", ["-ngl", "2"], 1),
    ("qwen3moe", ["-ngl", "all"], 1),
    ("qwen3moe", ["-ngl", "all"], 1, NO_FUSION),
    ("qwen3moe", ["-ngl", "2", "-fa", "on"], 1),
    ("qwen3moe", ["-ngl", "all", "-fa", "off"], 1),
    ("qwen3moe", ["-ngl", "all", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"], 1),
    ("qwen3moe", ["-ngl", "all", "-ts", "1,1"], 2),
    ("llama5-hd32", ["-ngl", "all", "-ts", "1,1"], 2),
    ("llama4-hd128", ["-ngl", "3", "-ts", "1,1"], 2),
    ("llama4-hd128", ["-ngl", "all", "-ts", "3,1", "-fa", "off"], 2),
]

#: real sizes (--examples): a later ``-c`` overrides the runs' ``-c 512`` on both sides
EXAMPLE_CASES = [
    ("llama8b", ["-ngl", "all", "-c", "8192"], 1),
    ("llama8b", ["-ngl", "all", "-c", "8192", "-fa", "off"], 1),
    ("llama8b", ["-ngl", "20", "-c", "4096"], 1),
    ("llama8b", ["-ngl", "all", "-c", "16384", "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0",
                 "-ub", "1024"], 1),
    ("gemma4b", ["-ngl", "all", "-c", "8192"], 1),
    ("gemma4b", ["-ngl", "all", "-c", "8192", "-fa", "off"], 1),
    ("gemma4b", ["-ngl", "17", "-c", "4096", "-ub", "256"], 1),
]


def gpus() -> list[tuple[str, int]]:
    """(compute capability like '8.9', free MiB) per visible NVIDIA GPU (nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    r = subprocess.run([exe, "--query-gpu=compute_cap,memory.free", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True)
    out = []
    for line in r.stdout.strip().splitlines():
        cc, free = (x.strip() for x in line.split(","))
        out.append((cc, int(free)))
    return out


def build(src: Path, out: Path) -> Path:
    """cmake -DGGML_CUDA=ON of the vendored source; returns the bin directory."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), "-DGGML_CUDA=ON",
                    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(out), "-j", str(os.cpu_count() or 4),
                    "--target", "llama-completion", "llama-fit-params"], check=True)
    return out / "bin"


def run_llama(bin_dir: Path, model: Path, args: list[str], env: dict | None = None):
    """(its buffers, its exit status): llama-completion interactive-first, its stdin closed
    once sched_reserve's last line has been read (llama.cpp's async log can lose a run's
    last lines at exit; tests/llama_runs.py). The buffers count once those lines are out,
    whatever the exit: a header-only example made whole has no tokenizer and aborts at the
    prompt, and on the device machine a prompt through AMX kernels died of SIGILL (-4)."""
    cmd = [str(bin_dir / "llama-completion"), "-m", str(model), "-n", "1", "-p", "hi",
           "-no-cnv", "-if", "-fit", "off", "-t", "1", "--no-warmup", "--seed", "1", "-lv", "5",
           "-c", "512"] + args
    rc, log = run_until_buffers(cmd, {**os.environ, **(env or {})}, 600)
    return parse_buffers(log), rc


def graphcost(*args: str) -> subprocess.CompletedProcess:
    """``python -m graphcost ARGS`` from this checkout (ROOT first on PYTHONPATH, then the
    caller's entries, where gguf may be installed)."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "graphcost", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": pythonpath})


def run_graphcost(model: Path, devices: list[str], args: list[str]) -> dict:
    cmd = ["memory", str(model), "-c", "512", "--format", "json"]
    for d in devices:
        cmd += ["--device", d]
    r = graphcost(*cmd, *args)
    if r.returncode != 0:
        raise RuntimeError(f"graphcost {' '.join(cmd + args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)["memory"]


FREE_RX = re.compile(r"projected to use \d+ MiB of device memory vs\. (\d+) MiB of free device memory")


def check_fit(bin_dir: Path | None, model: Path, case: str, args: list[str], cc: str,
              feats: str) -> list[tuple]:
    """llama-fit-params' argument line on CUDA0 against ``graphcost fit`` given the free
    memory llama.cpp measured (its trace line, whole MiB: graphcost gets that floor, at most
    1 MiB under the truth). Dry run: graphcost's line for 80000 MiB free."""
    free = 80000
    theirs = "-"
    if bin_dir is not None:
        cmd = [str(bin_dir / "llama-fit-params"), "-m", str(model), "-dev", "CUDA0", "-lv", "5"]
        r = subprocess.run(cmd + args, capture_output=True, text=True, timeout=600,
                           stdin=subprocess.DEVNULL)
        m = FREE_RX.search(r.stderr)
        if r.returncode not in (0, 1) or m is None:
            return [(case, "fit", f"llama-fit-params rc {r.returncode}, no free line", "", "",
                     "ERROR")]
        free = int(m.group(1))
        theirs = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "failed"
    g = graphcost("fit", str(model), "--device", f"cuda:{free}MiB,cc={cc}",
                  "--cpu-features", feats or "none", *args)
    if g.returncode not in (0, 1):
        return [(case, "fit", g.stderr.strip()[:60], theirs, "", "ERROR")]
    ours = g.stdout.strip().splitlines()[-1] if g.returncode == 0 else "failed"
    verdict = "" if bin_dir is None else ("equal" if ours == theirs else "DIFFERS")
    return [(case, "fit", f"{free} MiB free", theirs, ours, verdict)]


def ours_by_kind(mem: dict) -> dict[str, dict[str, list[int | None]]]:
    """graphcost's buffers as llama.cpp logs them: kind -> buffer name -> bytes."""
    out: dict[str, dict[str, list]] = {"model": {}, "kv": {}, "output": {}, "compute": {}}
    for b in mem["model_buffers"]:
        out["model"].setdefault(b["name"], []).append(b["bytes"])
    for b in mem["kv_buffers"]:
        out["kv"].setdefault(b["device"], []).append(b["bytes"])
    for r in mem["devices"]:
        if r["output_bytes"]:
            out["output"].setdefault(r["device"], []).append(r["output_bytes"])
        c = r["compute_bytes"]
        if c is None or c > 1:  # llama.cpp logs compute buffers larger than 1 byte
            out["compute"].setdefault(r["device"], []).append(c)
    return out


def _mib(n: int | None) -> str:
    return "n/m" if n is None else f"{n / MiB:.2f}"


def compare(case: str, mem: dict, run) -> list[tuple[str, str, str, str, str]]:
    """Rows (case, kind, buffer, llama.cpp MiB, graphcost MiB, verdict)."""
    rows = []
    ours = ours_by_kind(mem)
    for kind in ("model", "kv", "output", "compute"):
        theirs = getattr(run, kind) if run is not None else {}
        names = sorted(set(ours[kind]) | set(theirs))
        for name in names:
            mine = sorted(ours[kind].get(name, []), key=lambda x: -1 if x is None else x)
            logged = sorted(theirs.get(name, []))
            for i in range(max(len(mine), len(logged))):
                m = mine[i] if i < len(mine) else 0
                t = f"{logged[i]:.2f}" if i < len(logged) else ("-" if run is not None else "")
                if run is None:
                    verdict = ""
                elif m is None:
                    verdict = "not modelled"
                else:
                    verdict = "equal" if _mib(m) == t else "DIFFERS"
                rows.append((case, kind, name, t, _mib(m), verdict))
    if run is not None and mem.get("scheduler"):
        g = {x["graph"]: x["n_splits"] for x in mem["scheduler"]["graphs"]}
        ours_s = f"{g.get('prompt')}/{g.get('generation')}"
        theirs_s = "-" if run.splits is None else f"{run.splits[0]}/{run.splits[1]}"
        rows.append((case, "splits", "pp/tg", theirs_s, ours_s,
                     "equal" if ours_s == theirs_s else "DIFFERS"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, help="bin directory of a CUDA build of llama.cpp")
    ap.add_argument("--build", type=Path, help="vendored llama.cpp source to build with CUDA")
    ap.add_argument("--build-dir", type=Path,
                    default=Path.home() / ".cache" / "graphcost" / "llama-cuda-build")
    ap.add_argument("--dry-run", action="store_true", help="graphcost's figures only")
    ap.add_argument("--examples", action="store_true",
                    help="also the header-only examples made whole (real sizes; sparse files)")
    ap.add_argument("--fit", action="store_true",
                    help="also llama-fit-params against graphcost fit on the examples (CUDA0)")
    ap.add_argument("--without", default="",
                    help="CPU features to take from graphcost's list, e.g. amx_int8 where "
                         "llama.cpp's build has no AMX variant (ggml-cpu-sapphirerapids removed)")
    ap.add_argument("--amx", action="store_true",
                    help="also the AMX cases (a CPU with AMX; the examples are made whole)")
    ap.add_argument("--only", help="the cases whose name matches this regular expression")
    ap.add_argument("--json", type=Path, help="also write the rows and the GPU here")
    ap.add_argument("--cc", help="compute capability to give graphcost (default: nvidia-smi's)")
    a = ap.parse_args()

    found = gpus()
    if not a.dry_run and not found:
        print("check_cuda: no NVIDIA GPU visible (nvidia-smi); use --dry-run", file=sys.stderr)
        return 2
    bin_dir = a.bin
    if a.build and not a.dry_run:
        bin_dir = build(a.build, a.build_dir)
    if not a.dry_run and (bin_dir is None or not (bin_dir / "llama-completion").exists()):
        print("check_cuda: give --bin DIR (with llama-completion) or --build SRC", file=sys.stderr)
        return 2
    cc = a.cc or (found[0][0] if found else "8.9")
    n_gpu = len(found) if found else 2
    feats = ",".join(sorted(host_cpu_features() - set(a.without.split(",")))) or "none"
    rows = []
    errors: list[tuple[str, str]] = []     # (case, the failing run's log tail)
    with tempfile.TemporaryDirectory() as d:
        models = {k: Path(w(Path(d) / f"{k}.gguf").path) for k, w in MODELS.items()}
        cases = list(CASES)
        if a.examples or a.fit or a.amx:
            for k, src in EXAMPLES.items():
                models[k] = make_whole(src, Path(d) / f"{k}.gguf", data="zero")
            cases += EXAMPLE_CASES if a.examples else []
        cases += AMX_CASES if a.amx else []
        for name, args, need, *extra in cases:
            if need > n_gpu or (a.only and not re.search(a.only, f"{name} {' '.join(args)}")):
                continue
            x = extra[0] if extra else {}
            opt = f",{x['opt']}" if x.get("opt") else ""
            case = f"{name} {' '.join(args)}" + (f" {' '.join(f'{k}={v}' for k, v in x['env'].items())}"
                                                 if x.get("env") else "")
            devices = [f"cuda:{found[i][1]}MiB,cc={cc}{opt}" if found else f"cuda,cc={cc}{opt}"
                       for i in range(need)]
            try:
                mem = run_graphcost(models[name], devices, args + ["--cpu-features", feats or "none"])
            except RuntimeError as e:
                rows.append((case, "graphcost", str(e)[:60], "", "", "ERROR"))
                continue
            run = None
            if not a.dry_run:
                try:
                    dev = [] if need > 1 else ["-dev", "CUDA0" if need else "none"]
                    run, rc = run_llama(bin_dir, models[name], args + dev, x.get("env"))
                    if rc != 0 and name not in EXAMPLES:
                        rows.append((case, "note", f"llama.cpp exited {rc} after its buffer "
                                     "lines", "", "", ""))
                except RuntimeError as e:
                    rows.append((case, "llama.cpp", str(e).splitlines()[0][:60], "", "", "ERROR"))
                    errors.append((case, str(e)[-4000:]))
                    continue
            rows += compare(case, mem, run)
            for note in mem.get("notes", []):
                rows.append((case, "note", note[:90], "", "", ""))
        if a.fit:
            for name, args in FIT_CASES:
                if a.only and not re.search(a.only, f"fit {name} {' '.join(args)}"):
                    continue
                rows += check_fit(None if a.dry_run else bin_dir, models[name],
                                  f"fit {name} {' '.join(args)}".strip(), args, cc, feats)
    w = max(len(r[0]) for r in rows) if rows else 10
    print(f"{'case':<{w}}  {'kind':<8} {'buffer':<14} {'llama.cpp':>10} {'graphcost':>10}  verdict")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:<8} {r[2]:<14} {r[3]:>10} {r[4]:>10}  {r[5]}")
    bad = sum(1 for r in rows if r[5] in ("DIFFERS", "ERROR"))
    checked = sum(1 for r in rows if r[5] == "equal")
    nm = sum(1 for r in rows if r[5] == "not modelled")
    if a.json:
        a.json.write_text(json.dumps({"gpus": found, "cc": cc, "cpu_features": feats,
                                      "rows": rows, "errors": errors}, indent=1))
    for case, log in errors:
        print(f"--- {case}: llama.cpp failed; its log ends:\n{log[-1500:]}")
    print(f"\n{checked} equal, {bad} differ or failed, {nm} not modelled (GPU cc {cc}, {n_gpu} GPU(s))")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
