"""What every parity test shares: graphcost's graph compared with the nodes llama.cpp
reports through cb_eval, llama.cpp's logs of memory cases captured in one parallel batch,
the case notation, the marks (skip without llama.cpp; flash attention off and on) and the
tiny models of tests/parity_models.py by name (:class:`Models`)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest

from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import capture_log, llama_cpp_available, llama_cpp_unavailable_reason
from graphcost.judge.verify import first_difference, graph_records
from parity_models import MODELS

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
        embeddings=kw.get("embeddings", False), n_seq_max=kw.get("n_seq_max", 1),
        kv_unified=kw.get("kv_unified", False))
    return graph_records(build_graph(load_model(model_path), s))


def settings(text: str) -> dict:
    """A case's settings (capture_graph's or capture_log's keywords) written as words:
    ``key=123`` a number, ``key=q8_0`` a name, ``key=off`` False and a bare ``key`` True;
    e.g. ``"tokens=5 past=300 type_k=q8_0 fa"``."""
    out: dict = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        if not eq:
            out[key] = True
        elif value.isdigit():
            out[key] = int(value)
        else:
            out[key] = False if value == "off" else value
    return out


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


class Models(Mapping):
    """The parity tests' tiny models (tests/parity_models.py ``MODELS``) by name, each
    written into ``directory`` the first time it is asked for: a run that selects a few
    cases writes only their models."""

    def __init__(self, directory: Path):
        self._dir, self._built = Path(directory), {}

    def __getitem__(self, name: str):
        if name not in self._built:
            writer, kw = MODELS[name]
            self._built[name] = writer(self._dir / f"{name}.gguf", **kw)
        return self._built[name]

    def __iter__(self):
        return iter(MODELS)

    def __len__(self) -> int:
        return len(MODELS)


class MemCase(NamedTuple):
    """A memory-parity case: a model of tests/parity_models.py and the llama.cpp context
    settings it is planned and logged with (``embeddings`` only for encoders: True/False)."""
    model: str
    n_ctx: int
    n_ubatch: int
    flash_attn: bool = False
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = False
    embeddings: bool | None = None
    n_seq_max: int = 1  # -np
    kv_unified: bool = False  # -kvu
    n_batch: int | None = None  # None: n_ubatch

    def run_settings(self) -> RunSettings:
        """graphcost's settings of the case (n_batch = n_ubatch unless given, as
        capture_log runs it)."""
        return RunSettings(ctx_size=self.n_ctx, ubatch_size=self.n_ubatch,
                           batch_size=self.n_batch or self.n_ubatch,
                           flash_attn="on" if self.flash_attn else "off",
                           cache_type_k=self.type_k, cache_type_v=self.type_v,
                           swa_full=self.swa_full, embeddings=bool(self.embeddings),
                           n_seq_max=self.n_seq_max, kv_unified=self.kv_unified)


def memory_case_id(c: MemCase) -> str:
    """Test id of a memory case: model, context, ubatch (and batch), flash attention,
    ``-npN``/``-kvu``, then the cache types (and ``-swafull``), or for an encoder (no KV
    cache) ``-embon``/``-emboff``."""
    head = (f"{c.model}-c{c.n_ctx}-ub{c.n_ubatch}" + (f"-b{c.n_batch}" if c.n_batch else "")
            + f"-fa{'on' if c.flash_attn else 'off'}"
            + (f"-np{c.n_seq_max}" if c.n_seq_max != 1 else "") + ("-kvu" if c.kv_unified else ""))
    if c.embeddings is not None:
        return f"{head}-emb{'on' if c.embeddings else 'off'}"
    return f"{head}-{c.type_k}-{c.type_v}{'-swafull' if c.swa_full else ''}"


def capture_logs(paths: Mapping, cases: list[MemCase]) -> dict[str, dict]:
    """llama.cpp's parsed log (capture_log) of every case, by case id, captured in
    parallel subprocesses; a case's model names its file in ``paths``."""
    def one(c: MemCase):
        return capture_log(paths[c.model], n_ctx=c.n_ctx, n_ubatch=c.n_ubatch,
                           n_batch=c.n_batch, flash_attn=c.flash_attn, type_k=c.type_k,
                           type_v=c.type_v, swa_full=c.swa_full, embeddings=bool(c.embeddings),
                           n_seq_max=c.n_seq_max, kv_unified=c.kv_unified)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as ex:
        return dict(zip(map(memory_case_id, cases), ex.map(one, cases)))
