"""``graphcost archs``: every modelled family names the tests that prove it, those tests
exist and are about that family, and the rest of gguf's architectures are listed as not
modelled."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from graphcost.graph.arch_spec import PROVEN_ASPECTS, load_specs
from graphcost.archs import archs_document

ROOT = Path(__file__).resolve().parents[1]
SPECS = load_specs()


def cli(*args):
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("key", sorted(SPECS), ids=sorted(SPECS))
def test_every_family_names_tests_that_exist_and_concern_it(key):
    proven = SPECS[key].proven
    assert proven.get("graph"), f"{key}: no test proves its graph"
    word = key.split("@")[1] if "@" in key else key      # a flavour: its tests name it
    for aspect, test in proven.items():
        assert aspect in PROVEN_ASPECTS
        text = (ROOT / test).read_text()
        assert word in text, f"{key}: {test} does not mention {word!r}"


def test_document_lists_families_and_the_rest_of_gguf():
    doc = archs_document()
    fams = [f["architecture"] for f in doc["families"]]
    assert fams == sorted(SPECS)
    modelled = {k.split("@")[0] for k in SPECS}
    # every gguf architecture is either modelled or listed as not modelled, never both
    assert set(doc["not_modelled"]) == set(gguf.MODEL_ARCH_NAMES.values()) - modelled
    assert not set(doc["not_modelled"]) & modelled


def test_cli_text_and_json():
    r = cli("archs")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"{len(SPECS)} families modelled")
    assert "not modelled" in r.stdout
    r = cli("archs", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout) == archs_document()
    r = cli("archs", "--format", "xml")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
