"""Shared fixtures: the real gemma3 270M GGUF (installed from PyPI), the parity tests'
tiny models by name, and a CLI runner."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def gemma3_270m():
    """Path of the real gemma-3-270m Q4_K_M GGUF, assembled from its PyPI package."""
    from parity_models import real_gemma3_270m
    return real_gemma3_270m()


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """The tiny models of tests/parity_models.py by name, each written on first use."""
    from parity import Models
    return Models(tmp_path_factory.mktemp("models"))


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run ``graphcost ARGS`` in this process (graphcost.cli.main: its exit code, stdout,
    stderr), as the installed command does."""
    from graphcost.cli import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["graphcost", *map(str, args)])
        with pytest.raises(SystemExit) as e:
            main()
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, e.value.code, out.out, out.err)
    return run


#: test modules whose background work was started (test_kernels: the other-CPU compiles)
_BACKGROUND: list = []


def pytest_collection_finish(session):
    """Start test_kernels.py's other-CPU compiles (test_simd_kernels_are_exact_on_other_cpus:
    a subprocess each, ~50 s of one core cold) as soon as the selection is known, in the
    background: the suite runs in one process and leaves a second core idle."""
    items = [item for item in session.items
             if getattr(item, "originalname", None) == "test_simd_kernels_are_exact_on_other_cpus"]
    if items:
        items[0].module.start_isa_runs([item.callspec.params["isa"] for item in items])
        _BACKGROUND.append(items[0].module)


def pytest_sessionfinish(session):
    """Stop background work whose tests did not run (a session stopped early)."""
    for module in _BACKGROUND:
        module.stop_isa_runs()
