"""graphcost changes no process-wide setting that other libraries read (issue 9, item 7):
loading the kernels and importing the executor, profiler and probe leave the environment
as it was. llama.cpp's OpenMP threads share libgomp with numba's and read OMP_* from it:
an ``OMP_WAIT_POLICY`` set by graphcost halved llama.cpp's decode rate beside it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, os
before = dict(os.environ)
from graphcost.execute.kernels_loader import load_kernels
load_kernels()
import graphcost.execute.executor, graphcost.execute.profile, graphcost.execute.hwprobe  # noqa: F401
after = dict(os.environ)
print(json.dumps({k: [before.get(k), after.get(k)] for k in set(before) | set(after)
                  if before.get(k) != after.get(k)}))
"""


def test_loading_the_kernels_changes_no_environment_variable():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "KMP_"))}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {}
