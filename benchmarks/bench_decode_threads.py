"""The executor's decode against llama-bench at several thread counts, and where a decode
step goes (node times summed by kind): ``python benchmarks/bench_decode_threads.py MODEL
16,8,2`` with ``llama-bench`` on PATH. Five rounds a thread count, each the executor's
median step over 24 decode steps after the 21-token prompt (``bench_profile.PROMPT``,
``--numerics fast``, flash attention on, ``-c 1024``) then ``llama-bench -p 0 -n 32 -fa 1
-t N -r 2`` in its own process with the user's environment. Session 22 ran it on a lent
machine's 16-core Xeon (benchmarks/threads-2026-11-27-xeon16.txt)."""
import sys, os, time, statistics, subprocess, json
import numpy as np, numba
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from bench_profile import PROMPT, USER_ENV
from graphcost.execute.executor import Executor
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.settings import RunSettings
from graphcost.format import ggml_types as gt

MODEL, THREADS = sys.argv[1], [int(t) for t in sys.argv[2].split(",")]
clock = time.perf_counter_ns
print("numba", numba.__version__, "layer after first use below; NUMBA_NUM_THREADS", numba.config.NUMBA_NUM_THREADS, flush=True)


def llama_tg_r(nt, r):
    cmd = ["llama-bench", "-m", MODEL, "-p", "0", "-n", "32", "-t", str(nt), "-r", str(r), "-fa", "1", "-o", "json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV)
        return json.loads(p.stdout)[0]["avg_ts"]
    except (OSError, ValueError, KeyError, IndexError):
        return float("nan")


for nt in THREADS:
    t0 = time.time()
    ex = Executor(MODEL, RunSettings(ctx_size=1024, flash_attn="on"), numerics="fast", threads=nt)
    ex.step(PROMPT)
    for i in range(8):
        ex.step([PROMPT[i]])                       # compile/warm
    if nt == THREADS[0]:
        print("threading layer", numba.threading_layer(), "warm-up", round(time.time() - t0, 1), "s", flush=True)
    rows = []
    for rnd in range(5):
        ex.reset(); ex.step(PROMPT)
        ts = []
        for i in range(24):
            a = clock(); ex.step([PROMPT[i % len(PROMPT)]]); ts.append(clock() - a)
        e = 1e9 / statistics.median(ts)
        l = llama_tg_r(nt, 2)
        rows.append((e, l, e / l))
        print(f"  {nt} threads round {rnd + 1}: executor {e:.1f} tok/s, llama-bench tg32 (-r 2, its own process) {l:.1f}: ratio {e / l:.2f}", flush=True)
    print(f"  {nt} threads: median ratio {statistics.median(r[2] for r in rows):.2f} (executor {statistics.median(r[0] for r in rows):.1f}, llama.cpp {statistics.median(r[1] for r in rows):.1f})", flush=True)
    res = ex.step([5], repeat=9, time_nodes=True)
    an = analyze_graph(res.graph)
    ns = np.median(np.array([[t or 0 for t in tm.ns] for tm in res.timings], float), axis=0) / 1e3
    by = {}
    for nc, t, t0_ in zip(an.nodes, ns, res.timings[0].ns):
        if t0_ is None:
            continue
        n = nc.node
        k = n.op
        if n.op == "MUL_MAT":
            wb = n.src[0].data_bytes
            k = "MUL_MAT output" if wb > 50e6 else f"MUL_MAT {gt.type_name(n.src[0].type)} {n.src[0].ne[0]}x{n.src[0].ne[1]}"
        c, s_ = by.get(k, (0, 0.0))
        by[k] = (c + 1, s_ + t)
    wall = statistics.median(tm.wall_ns for tm in res.timings) / 1e3
    print(f"  node-timed step {wall:.0f} us, nodes {ns.sum():.0f} us", flush=True)
    for k, (c, s_) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:34s} {c:4d} nodes {s_:8.1f} us  {s_ / c:7.2f} us a node")
