"""pytest plugin: CPU seconds per test and per file, load-proof where wall time is not.

On the shared 2-core VM a niced test run gets a few percent of a core, so wall times
say more about the neighbours than about the tests. CPU seconds do not: this process
(all threads) + its reaped children + the oracle's live llama.cpp workers
(graphcost/judge/oracle.py keeps them up between calls; read from /proc, Linux only).

    PYTHONPATH=$PWD:$PWD/tools CPU_OUT=/tmp/cpu.json \\
        nice -n 19 python -m pytest -q -p pytest_cpu tests/test_parity_moe.py

writes one JSON line per test to ``$CPU_OUT.lines`` as it goes ([nodeid, cpu_s, wall_s])
and ``$CPU_OUT`` at the end: {"files": {file: [tests, cpu_s, wall_s]}, "tests": {...}}.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

import pytest

_TCK = os.sysconf("SC_CLK_TCK")
_per_test: dict[str, tuple[float, float]] = {}


def _workers_cpu() -> float:
    """utime + stime + cutime + cstime of the oracle's live workers, seconds."""
    oracle = sys.modules.get("graphcost.judge.oracle")
    tot = 0.0
    for w in [w for ws in list(getattr(oracle, "_WORKERS", {}).values()) for w in ws]:
        try:
            with open(f"/proc/{w.proc.pid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()   # fields 14..17 of proc(5) = [11:15]
        tot += sum(int(x) for x in fields[11:15]) / _TCK
    return tot


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _workers_cpu()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    c0, w0 = _cpu(), time.perf_counter()
    yield
    _per_test[item.nodeid] = (_cpu() - c0, time.perf_counter() - w0)
    out = os.environ.get("CPU_OUT")
    if out:
        with open(out + ".lines", "a") as fh:
            fh.write(json.dumps([item.nodeid, *_per_test[item.nodeid]]) + "\n")


def pytest_sessionfinish(session):
    out = os.environ.get("CPU_OUT")
    if not out:
        return
    files: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for nid, (c, w) in _per_test.items():
        f = files[nid.split("::")[0]]
        f[0] += 1
        f[1] += c
        f[2] += w
    with open(out, "w") as fh:
        json.dump({"files": files, "tests": _per_test}, fh, indent=1)
