"""Flavours (graphcost/graph/flavour.py) and settings resolved once (Resolved.step)."""
from __future__ import annotations

import dataclasses

import pytest

from graphcost.cost.analysis import analyze_graph
from graphcost.errors import SettingsError, UnsupportedError
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.flavour import AUG_2024, FLAVOURS, HEAD, flavour
from graphcost.graph.settings import RunSettings, resolve
from graphcost.memory.plan import reserve_runs


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import fixtures as F
    return load_model(F.write_llama(tmp_path_factory.mktemp("flavour") / "llama.gguf", n_layer=1))


@pytest.mark.parametrize("name, fa, ctx, n_ctx", [
    ("head", "off", 1000, 1024),      # pad(1000, 256)
    ("head", "on", 1000, 1024),
    ("2024-08", "off", 1000, 1024),   # pad(1000, 32) = 1024
    ("2024-08", "off", 1001, 1024),
    ("2024-08", "off", 1025, 1056),   # pad(1025, 32) = 33 * 32
    ("2024-08", "on", 1025, 1280),    # pad(1025, 256) = 5 * 256
], ids=lambda v: str(v))
def test_n_ctx_is_padded_as_the_flavour_says(name, fa, ctx, n_ctx):
    run = resolve(RunSettings(ctx_size=ctx, flash_attn=fa, llama_cpp=name), 4096, 0)
    assert run.flavour is FLAVOURS[name] and run.n_ctx == n_ctx


def test_flavours_differ_in_what_they_own():
    assert (HEAD.flash_attn_default, AUG_2024.flash_attn_default) == ("auto", "off")
    assert HEAD.reserve_graphs == ("prompt", "generation") and AUG_2024.reserve_graphs == ("prompt",)
    assert (HEAD.spec_key("llama"), AUG_2024.spec_key("llama")) == ("llama", "llama@2024-08")
    assert HEAD.executable and not AUG_2024.executable
    with pytest.raises(SettingsError, match="known flavours are head, 2024-08"):
        flavour("2023-01")
    with pytest.raises(SettingsError, match="has no 'auto'"):
        resolve(RunSettings(flash_attn="auto", llama_cpp="2024-08"), 4096, 0)


@pytest.mark.parametrize("tokens, past, outputs", [(1, 0, 1), (7, 3, 2), (1, 299, 1),
                                                   (64, 192, 64), (5, 700, 5), (1, 1023, 1)])
def test_step_equals_resolving_again(tokens, past, outputs):
    # the context resolved once, then stepped, equals resolving the stepped settings
    s = RunSettings(ctx_size=1000, ubatch_size=64, flash_attn="off")
    again = resolve(dataclasses.replace(s, tokens=tokens, past=past, outputs=outputs), 4096, 40)
    assert resolve(s, 4096, 40).step(tokens, past, outputs) == again


def test_step_refuses_what_resolve_refuses():
    run = resolve(RunSettings(ctx_size=256, ubatch_size=64), 4096, 0)
    with pytest.raises(SettingsError, match="more than one ubatch holds"):
        run.step(65, 0, 1)
    with pytest.raises(SettingsError, match="exceed the context of 256 cells"):
        run.step(2, 255, 1)


def test_reserve_graphs_are_the_flavours(llama):
    for name, labels in (("head", ["prompt", "generation"]), ("2024-08", ["prompt"])):
        run = resolve(RunSettings(ctx_size=512, ubatch_size=64, llama_cpp=name), 4096, 0)
        got = reserve_runs(run)
        assert [label for label, _ in got] == labels
        # every cell attended (n_kv = kv_size), built against the full memory state
        assert all(r.n_kv == r.kv_size == 512 and r.settings.memory_full for _, r in got)
        assert got[0][1].n_tokens == got[0][1].n_outputs == 64


def test_memory_plan_only_when_asked(llama):
    bg = build_graph(llama, RunSettings(ctx_size=256))
    a = analyze_graph(bg)
    assert a.memory is None
    with pytest.raises(ValueError, match="no memory plan"):
        a.require_memory()
    assert analyze_graph(bg, memory=True).memory.step is not None


def test_executor_refuses_a_flavour_it_cannot_run(llama):
    from graphcost.execute.executor import Executor
    with pytest.raises(UnsupportedError, match="runs the head graph, not --llama-cpp 2024-08"):
        Executor(llama, RunSettings(ctx_size=256, llama_cpp="2024-08"))
