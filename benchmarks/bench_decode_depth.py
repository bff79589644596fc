"""The executor's decode at depth against llama-bench's ``tg`` at the same ``-d``:
``python benchmarks/bench_decode_depth.py [--model GGUF] [--depths 0,1000,4000]
[--threads 2] [--rounds 3]`` with ``llama-bench`` on PATH.

Per depth D: the executor (``--numerics fast``, flash attention on, ``-c D + 256``,
ubatches of 512) is filled with D random tokens, then each round times 16 single-token
decode steps (the median step), and ``llama-bench -p 0 -n 16 -d D -fa 1 -t N -r 2``
runs in its own process with the user's environment (``bench_profile.USER_ENV``),
alternating round by round. Printed: both rates, their ratio a round and the median,
and where the executor's step goes at that depth (flash attention's share, from one
timed step repeated 9 times).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from bench_profile import USER_ENV, _model  # noqa: E402
from graphcost.execute.executor import Executor  # noqa: E402
from graphcost.graph.settings import RunSettings  # noqa: E402


def llama_tg(model: str, depth: int, threads: int) -> float:
    cmd = ["llama-bench", "-m", model, "-p", "0", "-n", "16", "-d", str(depth), "-t",
           str(threads), "-r", "2", "-fa", "1", "-o", "json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV)
        return float(json.loads(p.stdout)[0]["avg_ts"])
    except (OSError, ValueError, KeyError, IndexError):
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="GGUF (default: the gemma3 270M package)")
    ap.add_argument("--depths", default="0,1000,4000")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = _model(a.model)
    rng = np.random.default_rng(0)
    for depth in (int(d) for d in a.depths.split(",")):
        ex = Executor(model, RunSettings(ctx_size=depth + 256, flash_attn="on", ubatch_size=512),
                      numerics="fast", threads=a.threads)
        toks = [int(t) for t in rng.integers(100, 20000, max(depth, 1))]
        t0 = time.time()
        for i in range(0, depth, 512):
            ex.step(toks[i:i + 512])
        for i in range(4):
            ex.step([7 + i])                           # compile / warm at this depth
        print(f"depth {depth}: filled and warm in {time.time() - t0:.1f} s", flush=True)
        ratios = []
        for rnd in range(a.rounds):
            ts = []
            for i in range(16):
                t = time.perf_counter_ns()
                ex.step([11 + i])
                ts.append(time.perf_counter_ns() - t)
            ours = 1e9 / statistics.median(ts)
            theirs = llama_tg(model, depth, a.threads)
            ratios.append(ours / theirs)
            print(f"  round {rnd + 1}: executor {ours:.1f} tok/s, llama-bench tg16 @ d{depth} "
                  f"(-r 2, its own process) {theirs:.1f}: ratio {ours / theirs:.2f}", flush=True)
        res = ex.step([5], repeat=9, time_nodes=True)
        ns = np.median(np.array([[t or 0 for t in tm.ns] for tm in res.timings], float), axis=0)
        fa = sum(t for n, t in zip(res.graph.nodes, ns) if n.op == "FLASH_ATTN_EXT")
        print(f"  depth {depth}, {a.threads} threads: median ratio {statistics.median(ratios):.2f}; "
              f"timed step {ns.sum() / 1e6:.2f} ms, flash attention {fa / 1e6:.2f} ms",
              flush=True)


if __name__ == "__main__":
    main()
