"""Would the speed model fit better if flash attention were counted by the (query, cell)
pairs ggml computes? A refit of saved llama-bench runs, both ways, side by side.

ggml's three CPU flash-attention kernels skip masked cells (ops.cpp, llama-cpp-python
0.3.36's vendor/llama.cpp): ``one_chunk`` cell by cell (``if (mv == -INFINITY)
continue``), the tiled kernel a 64-cell KV tile whose mask is -inf for every query of its
64-query tile (``can_skip``), the split-KV decode each thread's chunk cell by cell.
``graphcost.cost.speed_model.counts`` counts every one of a node's ``n_kv`` cells
(``_fa_macs``), so a decode at depth 0 (32 live cells of 256) counts 8x the work of one
at depth 4000 per live cell. This script recounts each flash-attention case's MACs as
heads x (Dk + Dv) x the pairs computed, ubatch by ubatch (:func:`pairs`), and refits
with ``graphcost.calibrate.evaluate`` (same fit, same case split), printing both bands
per saved set. Not in the package yet: ``graphcost.speed.Predictor`` sums counts in closed
form along lines in the cells (``tg 10^8`` in tests), and live pairs are affine in the
position, not in the cells, so the closed form has to learn a second axis first.

    PYTHONPATH=. python benchmarks/fa_live_refit.py

Session 29 (2026-11-28): held out better on 6 of 8 sets, the pooled AVX2 set within the
target (docs/speed.md).
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from graphcost import calibrate as C  # noqa: E402
from graphcost.cost import speed_model as S  # noqa: E402
from graphcost.format import ggml_types as gt  # noqa: E402
from graphcost.graph.build import build_graph, load_model  # noqa: E402
from graphcost.memory.backends import parse_cpu_features  # noqa: E402
from graphcost.speed import BenchTest, Predictor  # noqa: E402

AVX2 = ("avx2", ["speed-runs-2026-11-28-avx2.json", "speed-runs-2026-11-28-avx2-s29a.json",
                 "speed-runs-2026-11-28-avx2-s29b.json"])
#: name -> (the ggml CPU features the runs' llama.cpp placed weights for, saved runs)
SETS = {
    "AVX2 VM, session 25": (AVX2[0], AVX2[1][:1]),
    "AVX2 VM, session 29 a": (AVX2[0], AVX2[1][1:2]),
    "AVX2 VM, session 29 b": (AVX2[0], AVX2[1][2:]),
    "AVX2 VM, the three pooled": AVX2,
    "AVX-512 VM, 2026-11-27 b": ("avx2,avx512,avx512_vnni", ["speed-runs-2026-11-27-b.json"]),
    "Xeon 16 threads, session 26": ("amx_int8,avx2,avx512,avx512_vnni",
                                    ["speed-runs-2026-11-28-xeon16.json"]),
    "Xeon 16 threads, session 18": ("amx_int8,avx2,avx512,avx512_vnni",
                                    ["speed-runs-2026-11-27-xeon16.json"]),
    "Xeon 16 threads, session 21": ("avx2,avx512,avx512_vnni",
                                    ["speed-runs-2026-11-27-xeon16-s21.json"]),
}


def pairs(lives: list[int], n_kv: int, threads: int, kv_float: bool) -> tuple[str, int]:
    """(count key, (query, cell) pairs computed per head) for one flash-attention node of
    a ubatch whose queries attend ``lives`` cells each: the split-KV decode (one query,
    >= 512 cells, float K/V) ``threads`` chunks of ceil(n_kv / threads) cells side by side,
    the live cells filling the first chunks (cells in position order); the tiled kernel
    (>= 64 queries, float K/V) each 64-query tile over whole 64-cell KV tiles up to its
    fullest query's cells; one row at a time, the live cells.

    >>> pairs([1001], 1024, 2, True)             # 2 chunks of 512: the fuller has 512
    ('fa_mac:split', 1024)
    >>> pairs([1, 2, 3], 256, 2, True)
    ('fa_mac', 6)
    >>> pairs(list(range(1, 65)), 256, 2, True)  # 64 queries x one KV tile of 64 cells
    ('fa_mac:tiled', 4096)
    """
    if kv_float and len(lives) == 1 and n_kv >= S.FA_SPLIT_KV:
        return "fa_mac:split", threads * min(-(-n_kv // threads), lives[0])
    if kv_float and len(lives) >= S.FA_TILE_Q:
        tiles = [lives[i:i + S.FA_TILE_Q] for i in range(0, len(lives), S.FA_TILE_Q)]
        return "fa_mac:tiled", sum(len(t) * min(n_kv, -(-max(t) // 64) * 64) for t in tiles)
    return "fa_mac", sum(lives)


def ubatches(t: BenchTest) -> list[tuple[int, int]]:
    """(past, tokens) of each timed ubatch of llama-bench's test ``t``."""
    out, pos = [], t.n_depth
    for b0 in range(0, t.n_prompt, t.n_batch):
        nb = min(t.n_batch, t.n_prompt - b0)
        for u0 in range(0, nb, t.n_ubatch):
            out.append((pos, min(t.n_ubatch, nb - u0)))
            pos += out[-1][1]
    return out + [(t.n_depth + i, 1) for i in range(t.n_gen)]


class Live:
    """Each flash-attention case's MACs by the pairs computed, per model."""

    def __init__(self, paths: dict[str, Path]):
        self.paths, self.models, self.nodes = paths, {}, {}

    def fa_nodes(self, pr: Predictor, t: BenchTest, tokens: int, past: int) -> list:
        """[(heads x (Dk + Dv), cache name, float K/V)] of the graph's FA nodes."""
        key = (id(pr), tokens)
        if key not in self.nodes:
            g = build_graph(pr.model, pr._resolve(t, tokens, past))
            cache_of = {id(gi.tensor): gi.attn.cache.name for gi in g.inputs
                        if gi.attn is not None and gi.tensor is gi.attn.kq_mask}
            self.nodes[key] = [
                (q.ne[2] * q.ne[3] * (k.ne[0] + v.ne[0]), cache_of.get(id(n.src[3]), "base"),
                 k.type in (gt.F32, gt.F16) and k.type == v.type and q.type == gt.F32)
                for n in g.nodes if n.op == "FLASH_ATTN_EXT"
                for q, k, v in [n.src[:3]]]
        return self.nodes[key]

    def counts(self, r: dict) -> Counter:
        if r["model"] not in self.models:
            self.models[r["model"]] = Predictor(load_model(self.paths[r["model"]]),
                                                S.SpeedModel({}, None, "", False))
        pr = self.models[r["model"]]
        t = BenchTest(r["n_prompt"], r["n_gen"], r["n_depth"], r["n_batch"], r["n_ubatch"],
                      "on", r["type_k"], r["type_v"], r["n_threads"])
        c: Counter = Counter()
        for past, n in ubatches(t):
            step = pr._resolve(t, n, past).ubatch(n, past, 1)
            for units, cache, kv_float in self.fa_nodes(pr, t, n, past):
                swa = cache == "swa"
                n_kv = step["n_kv_swa"] if swa else step["n_kv"]
                w = pr.model.n_swa if swa else 0
                lives = [min(p + 1, w or p + 1, n_kv) for p in range(past, past + n)]
                key, k = pairs(lives, n_kv, t.threads, kv_float)
                c[key] += units * k
        return c


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="graphcost-fa-live-"))
    paths = C.prepare(tmp, False, data="zero")
    live = Live(paths)
    print(f"{'saved runs':30s} {'counted':9s} {'calibration':>15s} {'held out':>15s}  "
          "worst held out")
    for name, (feats, files) in SETS.items():
        rows = C.pool([json.loads((HERE / f).read_text()) for f in files])
        rows = [r for r in rows if r["model"] in paths
                and not r["model"].endswith(("-synth", "-zero"))]
        C.count(rows, paths, parse_cpu_features(feats))
        fa = {id(r): live.counts(r) for r in rows if r["flash_attn"] == 1}
        for how in ("all cells", "live"):
            if how == "live":
                for r in rows:
                    if id(r) in fa:
                        r["counts"] = {**{k: v for k, v in r["counts"].items()
                                          if not k.startswith("fa_mac")}, **fa[id(r)]}
            cal = C.evaluate([dict(r) for r in rows], rows[0]["n_threads"])
            worst = max((r for r in cal.rows if not r["cal"]), key=lambda r: abs(r["ratio"] - 1))
            b = cal.band
            print(f"{name:30s} {how:9s} {100 * b['calibration']['median']:6.1f}% / "
                  f"{100 * b['calibration']['worst']:4.1f}% "
                  f"{100 * b['held-out']['median']:6.1f}% / "
                  f"{100 * b['held-out']['worst']:4.1f}%  {worst['model']} {worst['test']} "
                  f"ub {worst['n_ubatch']} fa {worst['flash_attn']}: {worst['ratio']:.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
