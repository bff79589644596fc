"""graphcost speed's closed-form sum of counts over a test's ubatches (graphcost.speed.Predictor):
a test's summed counts equal the ubatch-by-ubatch sum of real builds, key for key and in key
order (exact integers), for dense, SWA (gemma3, gpt-oss), chunked (llama4) and hybrid (lfm2)
fixtures, flash attention on and off, through the FA split switch (512 cells) and the SWA
cache's cap, on fixed and random llama-bench settings; the predicted seconds are then the
same float; a hand-computed case (tg 1000 and tg 10^8); the closed-form cell sums against
brute force; and the work does not grow with -n."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from graphcost.cost.speed_model import (SpeedModel, fa_pairs, fa_pairs_sum,
                                        roofline_coefficients)
from graphcost.graph.build import load_model
from graphcost.graph.settings import Rows, floor_sum, n_kv_for, n_kv_sum
from graphcost.speed import BenchTest, Predictor, step_runs, steps

from fixtures import write_gemma3, write_llama
from fixtures_gptoss import write_gptoss
from fixtures_hybrid import write_lfm2
from fixtures_simple import write_llama4

NO_COEF = SpeedModel({}, None, "", False)
WRITERS = {
    "llama": lambda p: write_llama(p, n_layer=2, context_length=8192),
    # window 600: the SWA cache (pad(600 + ub, 256) cells) caps inside the run
    "gemma3": lambda p: write_gemma3(p, n_layer=3, swa_pattern=2, sliding_window=600,
                                     context_length=8192),
    "gptoss": lambda p: write_gptoss(p, n_layer=2, context_length=8192),
    "llama4": lambda p: write_llama4(p, n_layer=4),
    "lfm2": lambda p: write_lfm2(p, context_length=8192),
}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def model(request, tmp_path_factory):
    path = WRITERS[request.param](tmp_path_factory.mktemp("interp") / f"{request.param}.gguf")
    return load_model(path)


def _step_by_step(model, t: BenchTest) -> tuple[Counter, Predictor]:
    """The reference: every ubatch of ``t`` built (cached per graph, no interpolation) and
    its counts added in order, as ``graphcost speed`` summed them before the closed form."""
    ref, total = Predictor(model, NO_COEF, features=()), Counter()
    for tokens, past, output in steps(t):
        total.update(ref.step_counts(t, tokens, past, output))
    return total, ref


@pytest.mark.parametrize("fa", ["off", "on"])
@pytest.mark.parametrize("test", [
    # tg 2600 after 100: n_kv 256, 512, ..., 2816 (11 points), one ubatch shape
    BenchTest(0, 2600, 100, 2048, 512, "", "f16", "f16", 2),
    # pp 2600, -b 1000 -ub 64: shapes 64 (no output), 40 (output), 24 (output, last batch)
    BenchTest(2600, 0, 0, 1000, 64, "", "f16", "f16", 2),
    # pp 3000 after 7, -b 10 -ub 3: 300 full batches (rows of 3 ubatches without output,
    # more rows than the 256-cell padding) + their 1-token last ubatches
    BenchTest(3000, 0, 7, 10, 3, "", "f16", "f16", 2),
], ids=["tg", "pp", "pp-rows"])
def test_closed_form_equals_step_by_step(model, fa, test):
    t = BenchTest(test.n_prompt, test.n_gen, test.n_depth, test.n_batch, test.n_ubatch, fa,
                  "f16", "f16", 2)
    pr = Predictor(model, NO_COEF, features=())
    total = pr.counts(t)
    want, ref = _step_by_step(model, t)
    assert list(total.items()) == list(want.items())
    # fewer graphs built than the step-by-step sum met: the rest is summed in closed form
    assert pr.built < ref.built, (pr.built, ref.built)


#: positive coefficients for every count the fixtures produce (bytes at 10 GB/s, MACs at
#: 100 GFLOP/s, 10 us a step, 1 us a barrier)
PRICED = SpeedModel({**roofline_coefficients(1e10, 1e11), "steps": 1e-5, "barriers": 1e-6,
                     "convert": 1e-10}, 2, "test", True)


def _random_tests(seed: int, n: int) -> list[BenchTest]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, g = rng.choice([(rng.randint(1, 3000), 0), (0, rng.randint(1, 3000))])
        b = rng.choice([rng.randint(1, 3000), 2048])
        ub = rng.choice([rng.randint(1, 600), 512, 32])
        fa = rng.choice(["on", "off", "auto"])
        ctk = rng.choice(["f16", "q8_0"])
        out.append(BenchTest(p, g, rng.randint(0, 1500), b, ub, fa, ctk,
                             "q8_0" if fa != "off" and rng.random() < 0.5 else "f16", 2))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_closed_form_equals_step_by_step_on_random_settings(model, seed):
    """Random (p or n, d, b, ub, fa, cache types): equal counts in equal key order, so the
    same seconds float; the step-by-step sum of per-step seconds agrees to float rounding:
    ``seconds`` adds K positive products (K keys, ~15 here), each sum within 2 K u of the exact
    value (u = 2^-53), and ``math.fsum`` of per-step values (each within 2 K u) adds u: so
    the two differ by at most (4 K + 1) u relative."""
    for t in _random_tests(seed * 1000 + len(model.arch), 8):
        pr = Predictor(model, PRICED, features=())
        got = pr.predict(t)
        want, ref = _step_by_step(model, t)
        assert list(got.counts.items()) == list(want.items()), t
        assert got.seconds == PRICED.seconds(want, t.threads), t
        per_step = math.fsum(PRICED.seconds(ref.step_counts(t, *s), t.threads) for s in steps(t))
        k = len(want)
        assert got.seconds == pytest.approx(per_step, rel=(4 * k + 1) * 2.0 ** -53, abs=0), t


def test_hand_computed_generation(tmp_path):
    """llama, 1 layer, 8 heads of 32 (K and V), FA on, tg N at depth 0: ubatch j attends
    n_kv = 256 ceil((j + 1) / 256) cells, j + 1 of them live; one query row x 8 heads x
    (32 + 32) MACs a pair: by the one-row kernel below 512 cells (fa_mac), the j + 1 live
    cells (it skips masked ones), and from 512 by the split kernel (fa_mac:split), whose
    fullest chunk (n_kv / 2 cells, all live here) times the 2 threads is n_kv."""
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=1, context_length=8192))
    sm = SpeedModel({"fa_mac": 1e-9, "fa_mac:split": 2e-9}, 2, "test", True)
    pr = Predictor(m, sm, features=())
    per_step = pr.step_counts(BenchTest(0, 1, 0, 2048, 512, "on", "f16", "f16", 2), 1, 0, True)
    # tg 1000: 256 ubatches at 256 cells, then 256 at 512, 256 at 768, 232 at 1024
    got = pr.predict(BenchTest(0, 1000, 0, 2048, 512, "on", "f16", "f16", 2))
    assert got.counts["steps"] == 1000
    assert got.counts["barriers"] == 1000 * per_step["barriers"]
    assert got.counts["weight_bytes"] == 1000 * per_step["weight_bytes"]
    # 8 x 64 x (1 + 2 + ... + 256) = 512 x 32896
    assert got.counts["fa_mac"] == 512 * 256 * 257 // 2 == 16_842_752
    # 8 x 64 x (512 x 256 + 768 x 256 + 1024 x 232) = 512 x 565248
    assert got.counts["fa_mac:split"] == 512 * 565_248 == 289_406_976
    # 1e-9 x 16842752 + 2e-9 x 289406976 = 0.016842752 + 0.578813952
    assert got.seconds == pytest.approx(0.595656704, rel=1e-15)
    # tg 10^8 = 256 x 390625: 256 ubatches at each of 256 k cells, k = 1..390625;
    # sum of cells 256 x 256 x 390625 x 390626 / 2; the first 256 by the one-row kernel
    big = pr.counts(BenchTest(0, 10**8, 0, 2048, 512, "on", "f16", "f16", 2))
    cells = 256 * 256 * 390625 * 390626 // 2        # 5_000_012_800_000_000
    assert big["steps"] == 10**8 and big["barriers"] == 10**8 * per_step["barriers"]
    assert big["fa_mac"] == 512 * 256 * 257 // 2
    assert big["fa_mac:split"] == 512 * (cells - 256 * 256) == 2_560_006_553_566_445_568
    # built: the tg1 step, then per test (n_ctx is part of a graph) 256 cells alone and
    # the line from 512 cells on at its two ends and its middle: 1 + 4 + 4
    assert pr.built == 9


def test_quantized_cache_builds_the_line_ends_and_middle(tmp_path):
    """q8_0 cache, tg 6000: 24 n_kv points; built: 256 alone (below the 512-cell FA split),
    then the line 512..6144 at its two ends and its middle."""
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=2, context_length=8192))
    t = BenchTest(0, 6000, 0, 2048, 512, "on", "q8_0", "q8_0", 2)
    pr = Predictor(m, NO_COEF, features=())
    total = pr.counts(t)
    assert pr.built == 1 + 3
    assert list(total.items()) == list(_step_by_step(m, t)[0].items())


@pytest.mark.parametrize("t", [BenchTest(0, 3000, 100, 2048, 512, "on", "f16", "f16", 2),
                               BenchTest(3000, 0, 0, 700, 3, "off", "f16", "f16", 2)],
                         ids=["tg", "pp-per-batch"])
def test_counts_off_the_line_are_cut_down_to_exact_builds(tmp_path, monkeypatch, t):
    """A count that is not affine in the cells ((n_kv / 256)^2, added to every graph) fails
    the middle check: the pieces are cut and halved until every sum is exact, still equal to
    the step-by-step sum (the path real graphs never took in these tests)."""
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=1, context_length=8192))
    build = Predictor._build

    def curved(self, key, where):
        return Counter({**build(self, key, where), "curve": (key[2] // 256) ** 2})

    monkeypatch.setattr(Predictor, "_build", curved)
    pr = Predictor(m, NO_COEF, features=())
    total = pr.counts(t)
    want, ref = _step_by_step(m, t)
    assert list(total.items()) == list(want.items())
    # more graphs built than the 4-6 of a line (ends, middle) per shape
    assert pr.built > 6


def test_fa_pairs_hand_computed():
    """The pairs ggml's row and tiled flash-attention kernels compute (masked cells
    skipped): a query at position p sees p + 1 cells, min(p + 1, window) with one."""
    assert fa_pairs("row", 1, 0) == 1                      # a decode at depth 0
    assert fa_pairs("row", 4, 8) == 9 + 10 + 11 + 12
    assert fa_pairs("row", 4, 8, window=10) == 9 + 10 + 10 + 10
    assert fa_pairs("row", 4, 100, window=10) == 4 * 10
    # 130 queries at 0: tiles of 64, 64, 2 rows over 1, 2, 3 KV tiles of 64 cells
    assert fa_pairs("tiled", 130, 0) == 64 * 64 + 64 * 128 + 2 * 192
    # past 1000, window 600: each tile's union is rows - 1 + 600 cells: 663 -> 11 tiles
    # of 64 for the full ones, 601 -> 10 for the last (2 rows)
    assert fa_pairs("tiled", 130, 1000, window=600) == 2 * 64 * 704 + 2 * 640
    with pytest.raises(ValueError, match="'split'"):
        fa_pairs("split", 1, 0)


def test_fa_pairs_closed_form_against_its_definition():
    """fa_pairs in closed form against the pairs counted query by query (row) and tile by
    tile (tiled: rows x 64 x ceil(union / 64), the union capped by rows - 1 + window)."""
    rng = random.Random(11)
    for _ in range(2000):
        tokens, past = rng.randint(1, 700), rng.randint(0, 3000)
        window = rng.choice([0, 1, 10, 64, 600, 1500])
        row = sum(min(p + 1, window or p + 1) for p in range(past, past + tokens))
        assert fa_pairs("row", tokens, past, window) == row, (tokens, past, window)
        tiled = 0
        for i in range(0, tokens, 64):
            rows = min(64, tokens - i)
            union = past + i + rows
            union = min(union, rows - 1 + window) if window else union
            tiled += rows * 64 * -(-union // 64)
        assert fa_pairs("tiled", tokens, past, window) == tiled, (tokens, past, window)
    # a ubatch of 2 x 10^9 queries is counted at once (no loop over its queries or tiles)
    assert fa_pairs("row", 2 * 10**9, 10**9, window=4096) == 2 * 10**9 * 4096


@pytest.mark.parametrize("path", ["row", "tiled"])
def test_fa_pairs_sum_against_brute_force(path):
    """The closed-form sum over a run's ubatches (Rows) against the ubatch-by-ubatch sum,
    with and without a window, on random layouts: runs crossing the window's end, rows of
    batches, single ubatches, empty ranges."""
    rng = random.Random(7)
    for _ in range(300):
        tokens = rng.choice([1, 3, 64, 100, 129]) if path == "row" else rng.choice(
            [64, 100, 129, 512])
        step = rng.choice([tokens, tokens, 2 * tokens, 1, 0])
        row = rng.randint(1, 9)
        rows = rng.randint(0, 6)
        used = rng.randint(tokens, 3000)
        r = Rows(used, step, row, rng.randint((row - 1) * step, (row - 1) * step + 700), rows)
        n = r.length
        lo = rng.randint(0, n)
        hi = rng.randint(lo, n)
        window = rng.choice([0, 0, 64, 600, 1500, 4096])
        want = sum(fa_pairs(path, tokens, r.at(m) - tokens, window) for m in range(lo, hi))
        assert fa_pairs_sum(path, tokens, r, lo, hi, window) == want, (r, lo, hi, window)


@pytest.mark.parametrize("p,n,d,b,ub", [
    (512, 128, 100, 2048, 32), (256, 0, 0, 100, 64), (0, 3, 7, 2048, 512), (4096, 5, 0, 2048, 512),
    (5000, 0, 3, 1000, 64), (7, 0, 0, 2, 8), (2048, 1, 1, 2048, 300), (999, 0, 0, 1000, 1000),
    (3000, 0, 5, 700, 3), (100, 0, 0, 10**6, 1), (64, 0, 0, 64, 64), (130, 0, 0, 64, 64)],
    ids=["pp-tg", "pp-b100", "tg", "pp4096", "per-batch", "ub>b", "ub300", "one-batch",
         "per-batch-rest", "one-huge-batch", "ub=b", "ub=b-rest"])
def test_step_runs_expand_to_steps(p, n, d, b, ub):
    t = BenchTest(p, n, d, b, ub, "on", "f16", "f16", 2)
    expanded = {}
    runs = step_runs(t)
    for run in runs:
        for m in range(run.cells.length):
            i = run.position(m)
            assert i not in expanded
            expanded[i] = (run.tokens, run.past(m), run.output)
        # along a run the index and the filled cells only grow
        pos = [run.position(m) for m in range(run.cells.length)]
        assert pos == sorted(pos)
    assert [expanded[i] for i in range(len(expanded))] == steps(t)
    assert len(runs) <= 5


@pytest.mark.parametrize("small,big", [
    ((0, 10**4, 2048, 512), (0, 2 * 10**9, 2048, 512)),
    ((10**4, 0, 2048, 512), (2 * 10**9, 0, 2048, 512)),
    ((10**4, 0, 100, 7), (2 * 10**9, 0, 100000, 7)),
], ids=["tg", "pp", "pp-rows"])
@pytest.mark.parametrize("fa", ["off", "on"])
def test_work_does_not_grow_with_the_run(tmp_path, monkeypatch, small, big, fa):
    """(p, n, b, ub) small and 2 x 10^9 tokens (7812500 KV lengths): the graphs looked at
    (keys) grow with the log of the run, not with the run; with flash attention on, its
    pairs too (summed in closed form, :func:`fa_pairs_sum`)."""
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=1, context_length=8192))
    looked = []
    key = Predictor._key
    monkeypatch.setattr(Predictor, "_key", staticmethod(
        lambda *a: looked.append(1) or key(*a)))
    for p, n, b, ub in (small, big):
        looked.clear()
        Predictor(m, NO_COEF, features=()).counts(BenchTest(p, n, 0, b, ub, fa, "f16",
                                                           "f16", 2))
        # measured: 80 and 133 (tg), 67 and 167 (pp), 111 and 173 (pp-rows)
        assert len(looked) < 300, (p, n, b, ub, len(looked))


def test_progress_line_every_few_builds(tmp_path, monkeypatch):
    """Every PROGRESS_EVERY builds: one line."""
    import graphcost.speed as speed

    monkeypatch.setattr(speed, "PROGRESS_EVERY", 2)
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=1, context_length=8192))
    lines = []
    pr = Predictor(m, NO_COEF, features=(), progress=lines.append)
    # tg 2560, FA on: 256 alone, then 512..2560 on one line: ends + middle -> 4 builds
    pr.counts(BenchTest(0, 2560, 0, 2048, 512, "on", "f16", "f16", 2))
    assert pr.built == 4
    assert [ln.split(" so far")[0] for ln in lines] == ["2 graphs built", "4 graphs built"]


def test_cell_sums_equal_brute_force():
    """floor_sum and n_kv_sum (runs and rows of runs, across the cache's cap, rows more
    than the padding so that they are grouped by row number modulo it) against the sums."""
    rng = random.Random(7)
    for _ in range(3000):
        n, mod, a, b = rng.randint(0, 60), rng.randint(1, 50), rng.randint(0, 120), rng.randint(0, 120)
        assert floor_sum(n, mod, a, b) == sum((a * i + b) // mod for i in range(n))
    for _ in range(3000):
        pad, size = rng.choice([32, 256]), rng.randint(1, 6000)
        row, step = rng.randint(1, 12), rng.randint(0, 300)
        r = Rows(rng.randint(1, 3000), step, row, rng.randint((row - 1) * step, row * step + 900),
                 rng.randint(0, 700) if rng.random() < 0.3 else rng.randint(0, 12))
        lo = rng.randint(0, r.length)
        hi = rng.randint(lo, r.length)
        want = sum(n_kv_for(r.at(m), size, pad) for m in range(lo, hi))
        assert n_kv_sum(r, lo, hi, size, pad) == want, (r, lo, hi, size, pad)
        # the SWA form: n_kv_for(min(used, size), size) sums the same
        assert want == sum(n_kv_for(min(r.at(m), size), size, pad) for m in range(lo, hi))
    with pytest.raises(ValueError):
        Rows(0, 1, 1)
    with pytest.raises(ValueError):
        Rows(1, 5, 3, 9, 2)           # rows overlapping: 9 < (3 - 1) x 5
