"""Shared fixtures: the real gemma3 270M GGUF (installed from PyPI), the parity tests'
tiny models by name, and a CLI runner."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

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

#: Test files with the tests whose Numba kernels take most of a cold run (marked
#: ``warm_up``: the first to compile each big kernel; compiling was about 10 of the
#: suite's 21 minutes on a 2-core Zen 3, docs/executor.md, sessions 25-26). A second
#: pytest of those tests (the warm-up: :func:`_start_warm_up`) runs on the core this one
#: leaves idle and fills Numba's cache, while this process runs the other tests first;
#: the same tests here then load what it compiled (same tests, same argument types, the
#: same cache entries). Its results are not read: every test runs here as before.
WARM_UP_FILES = ("test_executor.py", "test_kernels.py", "test_kernels_gptoss.py",
                 "test_executor_gptoss.py")
#: ... and the files run after all others (the warm-up's, and the other files that run
#: the kernels), so that the warm-up has the time of the rest to get ahead
KERNELS_LAST = WARM_UP_FILES + ("test_exec_ops_deepseek.py", "test_exec_threads.py",
                                "test_executor_model.py", "test_numerics.py",
                                "test_numerics_deepseek.py", "test_numerics_gptoss.py",
                                "test_numerics_hybrid.py", "test_profile.py")
#: tests that must run before the kernel files for a warm-up to pay (a narrower selection
#: runs as it is, without one)
WARM_UP_LEAD = 300
#: set in the warm-up's environment (it starts no warm-up and no other-CPU runs itself)
WARM_UP_ENV = "GRAPHCOST_TESTS_WARM_UP"
_WARM_UP: list = []       # [(process, its basetemp)]


def pytest_collection_modifyitems(session, config, items):
    """The kernel files last (:data:`KERNELS_LAST`), each file's tests in their order."""
    if os.environ.get(WARM_UP_ENV):
        return
    items[:] = ([i for i in items if i.path.name not in KERNELS_LAST]
                + [i for i in items if i.path.name in KERNELS_LAST])


def _start_warm_up(session):
    """The warm-up (the ``warm_up`` tests of the :data:`WARM_UP_FILES` the selection
    runs) in a background pytest, output discarded, its own basetemp; None where the
    selection runs fewer than :data:`WARM_UP_LEAD` tests before the kernel files."""
    lead = next((n for n, i in enumerate(session.items) if i.path.name in KERNELS_LAST),
                len(session.items))
    files = list(dict.fromkeys(str(i.path) for i in session.items
                               if i.path.name in WARM_UP_FILES))
    if os.environ.get(WARM_UP_ENV) or lead < WARM_UP_LEAD or not files:
        return None
    files.sort(key=lambda f: WARM_UP_FILES.index(os.path.basename(f)))
    basetemp = tempfile.mkdtemp(prefix="graphcost-warm-up-")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--basetemp={basetemp}/t", "-m", "warm_up", *files], cwd=session.config.rootpath,
        # one Numba thread: beside this process a second one would spin against it (a
        # parallel kernel that shares its cores slows by orders of magnitude)
        env={**os.environ, WARM_UP_ENV: "1", "NUMBA_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _WARM_UP.append((proc, basetemp))
    return proc


def pytest_collection_finish(session):
    """Start the kernel warm-up (:func:`_start_warm_up`), then test_kernels.py's other-CPU
    compiles (test_simd_kernels_are_exact_on_other_cpus: a subprocess each, 130-150 s of
    one core cold on the 2-core Zen 3, session 27) after it, as soon as the selection is
    known, in the background: the suite runs in one process and leaves a second core
    idle."""
    warm = _start_warm_up(session)
    if os.environ.get(WARM_UP_ENV):
        return
    items = [item for item in session.items
             if getattr(item, "originalname", None) == "test_simd_kernels_are_exact_on_other_cpus"]
    if items:
        items[0].module.start_isa_runs([item.callspec.params["isa"] for item in items], warm)
        _BACKGROUND.append(items[0].module)


def pytest_sessionfinish(session):
    """Stop background work whose tests did not run (a session stopped early), and the
    warm-up if it is still going."""
    for proc, basetemp in _WARM_UP:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(basetemp, ignore_errors=True)
    for module in _BACKGROUND:
        module.stop_isa_runs()
