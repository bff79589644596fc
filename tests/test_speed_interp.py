"""graphcost speed's interpolation of counts between KV lengths (graphcost.speed.Predictor):
every interpolated point equals a real build of that point, key for key and in key order
(exact integers), and a test's summed counts equal the ubatch-by-ubatch sum of real builds,
for dense, SWA (gemma3, gpt-oss), chunked (llama4) and hybrid (lfm2) fixtures, flash
attention on and off, through the FA split switch (512 cells) and the SWA cache's cap."""
from __future__ import annotations

from collections import Counter

import pytest

from graphcost.cost.analysis import analyze_graph
from graphcost.cost.speed_model import SpeedModel, counts
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
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


def _built(pr: Predictor, key: tuple, where: tuple) -> Counter:
    """The counts of a fresh build at ``where`` = (test, tokens, past): no cache, no
    interpolation, the settings as speed built them before (RunSettings of the ubatch)."""
    t, tokens, past = where
    rs = RunSettings(ctx_size=t.n_ctx, batch_size=t.n_batch, ubatch_size=t.n_ubatch,
                     flash_attn=t.flash_attn, cache_type_k=t.type_k, cache_type_v=t.type_v,
                     tokens=tokens, past=past, outputs=1)
    return counts(analyze_graph(build_graph(pr.model, rs)), pr.repacked, outputs=key[1])


@pytest.mark.parametrize("fa", ["off", "on"])
@pytest.mark.parametrize("test", [
    # tg 2600 after 100: n_kv 256, 512, ..., 2816 (11 points), one ubatch shape
    BenchTest(0, 2600, 100, 2048, 512, "", "f16", "f16", 2),
    # pp 2600, -b 1000 -ub 64: shapes 64 (no output), 40 (output), 24 (output, last batch)
    BenchTest(2600, 0, 0, 1000, 64, "", "f16", "f16", 2),
], ids=["tg", "pp"])
def test_interpolated_counts_equal_real_builds(model, fa, test):
    t = BenchTest(test.n_prompt, test.n_gen, test.n_depth, test.n_batch, test.n_ubatch, fa,
                  "f16", "f16", 2)
    pr = Predictor(model, NO_COEF, features=())
    mult, runs = pr._points(t)
    total = pr.counts(t)
    # fewer builds than points: the rest were interpolated
    assert pr.built < len(runs), (pr.built, len(runs))
    for key, run in runs.items():
        want = _built(pr, key, run)
        assert list(pr._cache[key].items()) == list(want.items()), key
    # the sum, in the order of a ubatch-by-ubatch sum (what speed printed before)
    ref, ref_total = Predictor(model, NO_COEF, features=()), Counter()
    for tokens, past, output in steps(t):
        ref_total.update(ref.step_counts(t, tokens, past, output))
    assert list(total.items()) == list(ref_total.items())
    assert sum(mult.values()) == len(steps(t))


def test_quantized_cache_and_many_points(tmp_path):
    """q8_0 K cache, tg 6000: 24 n_kv points, of which only the piece ends and middles are
    built."""
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=2, context_length=8192))
    t = BenchTest(0, 6000, 0, 2048, 512, "on", "q8_0", "q8_0", 2)
    pr = Predictor(m, NO_COEF, features=())
    _, runs = pr._points(t)
    pr.counts(t)
    # n_kv 256 alone (below the 512-cell FA split), then 512..6144 (23 points) on one line:
    # its two ends and its middle built
    assert len(runs) == 24 and pr.built == 1 + 3
    for key, run in runs.items():
        assert list(pr._cache[key].items()) == list(_built(pr, key, run).items())


@pytest.mark.parametrize("p,n,d,b,ub", [
    (512, 128, 100, 2048, 32), (256, 0, 0, 100, 64), (0, 3, 7, 2048, 512), (4096, 5, 0, 2048, 512),
    (5000, 0, 3, 1000, 64), (7, 0, 0, 2, 8), (2048, 1, 1, 2048, 300), (999, 0, 0, 1000, 1000)])
def test_step_runs_expand_to_steps(p, n, d, b, ub):
    t = BenchTest(p, n, d, b, ub, "on", "f16", "f16", 2)
    expanded = {}
    for idx, di, tokens, past, dp, output, count in step_runs(t):
        for j in range(count):
            assert idx + j * di not in expanded
            expanded[idx + j * di] = (tokens, past + j * dp, output)
    assert [expanded[i] for i in range(len(expanded))] == steps(t)


def test_huge_generation_costs_its_graphs_not_its_ubatches(tmp_path):
    """tg 10^7: 39063 n_kv points (10^7 / 256 rounded up), found without walking 10^7
    ubatches; the counts of each point x its ubatches sum to the total."""
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=1, context_length=8192))
    t = BenchTest(0, 10**7, 0, 2048, 512, "off", "f16", "f16", 2)
    pr = Predictor(m, NO_COEF, features=())
    mult, runs = pr._points(t)
    assert len(runs) == -(-10**7 // 256) == 39063 and sum(mult.values()) == 10**7
    # first point: n_kv 256 (used 1..256: 256 ubatches); last: 10^7 - 39062 x 256 = 128
    assert list(mult.values())[0] == 256 and list(mult.values())[-1] == 128


def test_progress_lines_on_long_runs(tmp_path, monkeypatch):
    """Every PROGRESS_POINTS distinct graphs met and every PROGRESS_EVERY builds: one line."""
    import graphcost.speed as speed

    monkeypatch.setattr(speed, "PROGRESS_POINTS", 4)
    monkeypatch.setattr(speed, "PROGRESS_EVERY", 2)
    m = load_model(write_llama(tmp_path / "l.gguf", n_layer=1, context_length=8192))
    lines = []
    pr = Predictor(m, NO_COEF, features=(), progress=lines.append)
    # tg 2560: n_kv 256..2560, 10 points -> lines at the 4th and 8th; builds: 256 alone,
    # 512..2560 (9 points): ends + middle -> 4 builds -> lines at the 2nd and 4th
    pr.counts(BenchTest(0, 2560, 0, 2048, 512, "on", "f16", "f16", 2))
    assert pr.built == 4
    assert [ln.split(" so far")[0] for ln in lines] == [
        "tg2560: 4 distinct graphs (KV lengths)", "tg2560: 8 distinct graphs (KV lengths)",
        "2 graphs built", "4 graphs built"]
