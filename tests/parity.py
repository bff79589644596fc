"""Compare graphcost's graph with the nodes llama.cpp reports through cb_eval, and the
marks every parity test shares (skip without llama.cpp; cases with flash attention off
and on)."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import capture_log, llama_cpp_available, llama_cpp_unavailable_reason
from graphcost.judge.verify import first_difference, graph_records

#: skips a test (``pytestmark = needs_llama_cpp``: a module) where llama.cpp, the judge,
#: cannot run
needs_llama_cpp = pytest.mark.skipif(not llama_cpp_available(),
                                     reason="llama-cpp-python: " + llama_cpp_unavailable_reason())
#: a test run with flash attention off and on (argument ``fa``)
fa_off_on = pytest.mark.parametrize("fa", [False, True], ids=["fa_off", "fa_on"])


def our_records(model_path, **kw) -> list[dict]:
    """graphcost's graph in the oracle's record format."""
    s = RunSettings(
        ctx_size=kw.get("n_ctx", 512), ubatch_size=kw.get("n_ubatch", 512),
        batch_size=kw.get("n_batch") or kw.get("n_ubatch", 512),
        flash_attn="on" if kw.get("flash_attn") else "off",
        cache_type_k=kw.get("type_k", "f16"), cache_type_v=kw.get("type_v", "f16"),
        swa_full=kw.get("swa_full", False), tokens=kw.get("tokens", 1),
        past=kw.get("past", 0), outputs=kw.get("n_outputs", 1),
        embeddings=kw.get("embeddings", False))
    return graph_records(build_graph(load_model(model_path), s))


def case_ids(cases: list[tuple[str, dict]]) -> list[str]:
    """Readable pytest ids for ``(model, settings)`` cases."""
    return [f"{m}-" + "-".join(f"{k}{v}" for k, v in s.items()) for m, s in cases]


def graph_cases(cases: list[tuple[str, dict]]):
    """A graph-parity test's cases: each ``(model, settings)`` (arguments ``model``,
    ``settings``) with flash attention off and on (``fa``)."""
    def mark(test):
        return fa_off_on(pytest.mark.parametrize("model,settings", cases,
                                                 ids=case_ids(cases))(test))
    return mark


def assert_same_graph(model_path, settings: dict, fa: bool) -> None:
    """Capture llama.cpp's graph and build ours for ``settings`` (n_ctx/n_ubatch default
    512; ``fa=True`` in settings marks a case that needs flash attention, e.g. a quantized
    V cache, which llama.cpp refuses otherwise) and assert they are equal."""
    from graphcost.judge.oracle import capture_graph

    s = dict(settings)
    if s.pop("fa", False) and not fa:
        pytest.skip("quantized V cache needs flash attention (llama.cpp refuses it)")
    kw = {"n_ctx": 512, "n_ubatch": 512, "flash_attn": fa, **s}
    diff = first_difference(our_records(model_path, **kw), capture_graph(model_path, **kw))
    assert diff is None, diff


MiB = 1024 * 1024


def mib2(n: int) -> float:
    """llama.cpp's "%8.2f MiB" of n bytes."""
    return float(f"{n / MiB:.2f}")


def memory_case_id(case: tuple) -> str:
    """Test id of a memory case ``(model, n_ctx, n_ubatch, fa, type_k, type_v[, swa_full])``
    (without ``swa_full``: False)."""
    m, ctx, ub, fa, tk, tv, swa = (*case, False)[:7]
    return f"{m}-c{ctx}-ub{ub}-fa{'on' if fa else 'off'}-{tk}-{tv}{'-swafull' if swa else ''}"


def memory_case_settings(case: tuple) -> dict:
    """capture_log's settings of a memory case (see :func:`memory_case_id`)."""
    m, ctx, ub, fa, tk, tv, swa = (*case, False)[:7]
    return dict(n_ctx=ctx, n_ubatch=ub, flash_attn=fa, type_k=tk, type_v=tv, swa_full=swa)


def capture_logs(paths: dict, cases: list[tuple],
                 settings: Callable[[tuple], dict] = memory_case_settings,
                 case_id: Callable[[tuple], str] = memory_case_id) -> dict[str, dict]:
    """llama.cpp's parsed log (capture_log) of every case, by case id, captured in
    parallel subprocesses; a case's first item names its model in ``paths``."""
    def one(case):
        return capture_log(paths[case[0]], **settings(case))
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as ex:
        return dict(zip(map(case_id, cases), ex.map(one, cases)))
