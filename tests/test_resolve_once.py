"""Run settings are resolved once per setting (issue 10, Flavours): the analysis, the
memory plan with devices, and the executor each resolve what the user asked for once and
derive every ubatch from that (``Resolved.step``); only a setting that really differs
(``-fa auto`` turned off by llama.cpp) is resolved again."""
from __future__ import annotations

import pytest

from fixtures import write_llama
from graphcost.graph import build
from graphcost.graph.build import load_model, resolve_for
from graphcost.graph.settings import RunSettings
from graphcost.memory.placement import DeviceArg, PlacementFlags, plan_devices
from graphcost.pipeline import analyze_model


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    # 3 layers, n_embd 256, 8 heads of 32, 2 KV heads, vocab 300 (tests/fixtures.py)
    return write_llama(tmp_path_factory.mktemp("once") / "llama.gguf", n_layer=3).path


@pytest.fixture
def resolved(monkeypatch):
    """Every RunSettings graphcost.graph.build.resolve is called with, in order."""
    calls = []
    real = build.resolve

    def counting(s, *args, **kw):
        calls.append(s)
        return real(s, *args, **kw)
    monkeypatch.setattr(build, "resolve", counting)
    return calls


def test_analysis_with_memory_resolves_once(llama, resolved):
    a = analyze_model(llama, RunSettings(ctx_size=512, tokens=4), memory=True)
    assert resolved == [RunSettings(ctx_size=512, tokens=4)]
    assert [r.label for r in a.memory.reserves] == ["prompt", "generation"]


def test_devices_resolve_each_setting_once(llama, resolved):
    s = RunSettings(ctx_size=512)
    dp = plan_devices(load_model(llama), s, [DeviceArg("rpc"), DeviceArg("rpc")],
                      PlacementFlags(n_gpu_layers=3, tensor_split=(1, 1)))
    # -fa auto: a probe graph is scheduled (a step of the same context, not resolved
    # again); only when llama.cpp would turn flash attention off is -fa off resolved
    assert resolved[0] == s and len(resolved) == len(set(resolved)) <= 2
    assert (len(resolved) == 2) == any("-fa auto" in n for n in dp.placement.notes)


def test_the_executor_resolves_once_or_takes_resolved_settings(llama, resolved):
    from graphcost.execute.executor import Executor
    model = load_model(llama)
    ex = Executor(model, RunSettings(ctx_size=256))
    assert resolved == [RunSettings(ctx_size=256)] and ex.run.n_ctx == 256
    run = resolve_for(model, RunSettings(ctx_size=512))
    resolved.clear()
    assert Executor(model, run).run is run and resolved == []
