"""Data flows one way: format -> graph -> memory, cost -> execute -> judge, with cli, check,
report, document, archs, pipeline, speed, calibrate and bench_models on top (docs/ and /work/shared/STYLE.md rule 1).

Every module's imports (top-level and inside functions) are read with :mod:`ast`; a module
of an earlier stage that imports one of a later stage fails the test. ``errors``,
``files``, ``schema``, ``resources`` and ``units`` are shared utilities any module may import.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import graphcost

ROOT = Path(graphcost.__file__).parent
#: stage of each top-level package or module of graphcost; a module may import its own
#: stage, earlier stages and the shared utilities
STAGES = {"format": 0, "graph": 1, "memory": 2, "cost": 2, "execute": 3, "judge": 4,
          "cli": 5, "check": 5, "report": 5, "document": 5, "archs": 5, "pipeline": 5, "speed": 5,
          "__main__": 5, "__init__": 5}
SHARED = {"errors", "files", "schema", "resources", "units"}
#: graphcost calibrate runs llama-bench (judge's tools) on models it writes: on top
STAGES.update({"calibrate": 5, "bench_models": 5})


def _top(module: str) -> str:
    """``graphcost.graph.settings`` -> ``graph``."""
    return module.split(".")[1] if module.count(".") else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported graphcost module) for every import in ``path``."""
    pkg = ".".join(("graphcost", *path.relative_to(ROOT).with_suffix("").parts[:-1]))
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("graphcost.")]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative import
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                mod = ".".join(base + ([mod] if mod else []))
            if mod == "graphcost":  # from graphcost import x
                out += [(node.lineno, f"graphcost.{a.name}") for a in node.names]
            elif mod.startswith("graphcost."):
                out.append((node.lineno, mod))
    return out


MODULES = sorted(p for p in ROOT.rglob("*.py"))


def test_every_module_has_a_stage():
    tops = {_top("graphcost." + ".".join(p.relative_to(ROOT).with_suffix("").parts))
            for p in MODULES}
    assert tops <= set(STAGES) | SHARED, sorted(tops - set(STAGES) - SHARED)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_back_up_the_pipeline(path):
    me = _top("graphcost." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
    bad = []
    for line, mod in _imports(path):
        other = _top(mod)
        if other in SHARED:
            continue
        if me in SHARED:
            bad.append(f"{path.name}:{line} imports {mod} (a shared utility imports only "
                       "shared utilities)")
        elif STAGES[other] > STAGES[me]:
            bad.append(f"{path.name}:{line} imports {mod} ({me} is before {other})")
    assert not bad, "\n".join(bad)
