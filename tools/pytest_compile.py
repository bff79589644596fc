"""pytest plugin: Numba compile seconds per jitted function, exclusive of nested compiles.

Where a cold test run's compile time goes (session 28 found flash attention's six kernels
at 145 of 550 s this way, docs/executor.md). Numba announces each compile as a
``numba:compile`` event; this listener times every one and charges a compile that starts
inside another (an inlined or called njit function compiled on first use) to the inner
function only, so the exclusive column sums to the compile time of the run. Start from an
empty cache, or the run loads instead of compiling:

    NUMBA_CACHE_DIR=$(mktemp -d) NUMBA_NUM_THREADS=1 PYTHONPATH=$PWD:$PWD/tools \\
        COMPILE_OUT=/tmp/compile.json python -m pytest -q -p pytest_compile -m warm_up \\
        tests/test_kernels.py tests/test_executor.py

prints the 25 costliest functions at the end (``COMPILE_TOP`` changes the count) and, with
``COMPILE_OUT``, writes {"function | argument types": [compiles, exclusive s, inclusive s]}
as JSON. Seconds are wall seconds of the compiling thread: run it on a quiet machine.
"""
from __future__ import annotations

import json
import os
import time
from collections import defaultdict

from numba.core import event

#: open compiles, innermost last: [start (perf_counter s), seconds of nested compiles]
_stack: list[list[float]] = []
#: "module.function | argument types" -> [compiles, exclusive s, inclusive s]
_rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])


def _name(data: dict) -> str:
    fn = getattr(data.get("dispatcher"), "py_func", None)
    if fn is None:
        return str(data.get("dispatcher"))
    return f"{fn.__module__}.{fn.__qualname__}"


class _Listener(event.Listener):
    def on_start(self, ev):
        _stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        start, nested = _stack.pop()
        seconds = time.perf_counter() - start
        data = ev.data or {}
        row = _rows[f"{_name(data)} | {data.get('args')}"]
        row[0] += 1
        row[1] += seconds - nested
        row[2] += seconds
        if _stack:
            _stack[-1][1] += seconds


_LISTENER = _Listener()


def pytest_configure(config):
    event.register("numba:compile", _LISTENER)


def by_function(rows: dict[str, list[float]]) -> list[tuple[str, int, float]]:
    """[(function, compiles, exclusive s)] summed over argument types, costliest first."""
    tot: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for key, (n, excl, _incl) in rows.items():
        t = tot[key.split(" | ")[0]]
        t[0] += n
        t[1] += excl
    return sorted(((f, int(n), s) for f, (n, s) in tot.items()), key=lambda r: -r[2])


def pytest_terminal_summary(terminalreporter):
    event.unregister("numba:compile", _LISTENER)
    rows = by_function(_rows)
    total = sum(s for _f, _n, s in rows)
    tr = terminalreporter
    tr.section("Numba compile seconds (exclusive of nested compiles)")
    tr.write_line(f"{total:8.1f} s in {sum(n for _f, n, _s in rows)} compiles of "
                  f"{len(rows)} functions")
    for f, n, s in rows[:int(os.environ.get("COMPILE_TOP", "25"))]:
        tr.write_line(f"{s:8.1f} s {n:4d} x  {f}")
    out = os.environ.get("COMPILE_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump(dict(_rows), fh, indent=0)
