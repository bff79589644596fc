"""The command line: every format, JSON schema, determinism, the check gate, exit codes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from graphcost.report.archs import RENDERERS as ARCHS_RENDERERS
from graphcost.report.archs import ArchsFormat
from graphcost.report.formats import RENDERERS, Format
from graphcost.report.profile import RENDERERS as PROFILE_RENDERERS
from graphcost.report.profile import ProfileFormat
from graphcost.report.renderer import FLAGS, Renderer
from graphcost.resources import bundled, default_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(bundled("examples").glob("*.gguf"))


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("registry,enum", [(RENDERERS, Format), (PROFILE_RENDERERS, ProfileFormat),
                                           (ARCHS_RENDERERS, ArchsFormat)],
                         ids=["analyze", "profile", "archs"])
def test_every_format_has_one_renderer(registry, enum):
    assert set(registry) == set(enum)
    assert all(isinstance(r, Renderer) and r.uses <= set(FLAGS) for r in registry.values())


def test_default_analyze_uses_a_bundled_example():
    r = cli("analyze")
    assert r.returncode == 0, r.stderr
    assert default_model().exists()
    assert "Llama 3.1 8B" in r.stdout and "Per op kind" in r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines())


@pytest.mark.parametrize("fmt", [f.value for f in Format])
def test_formats_are_deterministic(tmp_path, fmt):
    outs = []
    for i in range(2):
        o = tmp_path / f"out{i}.{fmt}"
        r = cli("analyze", EXAMPLES[0], "--format", fmt, "-o", o, "--tokens", 3, "--past", 10)
        assert r.returncode == 0, r.stderr
        outs.append(o.read_bytes())
    assert outs[0] == outs[1] and outs[0]


def test_json_document_schema(tmp_path):
    o = tmp_path / "a.json"
    r = cli("analyze", ROOT / "examples" / "gemma-3-4b-it-q4_k_m.gguf", "-f", "json", "-o", o,
            "-fa", "off", "--tokens", 4, "--past", 1000)
    assert r.returncode == 0, r.stderr
    d = json.loads(o.read_text())
    assert d["schema"] == 1
    assert {"architecture", "n_layer", "weights_bytes", "n_params"} <= set(d["model"])
    assert d["model"]["architecture"] == "gemma3" and d["model"]["n_layer"] == 34
    # 1000 + 4 cells used -> n_kv = 1024; the sliding-window cache (window 1024 + ub 512
    # padded to 256 = 1536 cells) attends min(1536, pad(1004, 256)) = 1024
    assert d["run"]["n_kv"] == 1024 and d["run"]["n_kv_swa"] == 1024
    assert d["run"]["flash_attn"] == "off"
    assert [n["index"] for n in d["nodes"]] == list(range(len(d["nodes"])))
    for n in d["nodes"]:
        assert set(n) >= {"index", "name", "op", "type", "ne", "nbytes", "src", "layer", "cost"}
        assert len(n["ne"]) == 4
    assert d["memory"]["weights_bytes"] == d["model"]["weights_bytes"]
    assert d["memory"]["kv_cache_bytes"] == sum(c["bytes"] for c in d["memory"]["kv_caches"])
    assert d["unmodelled"] == []
    ops = {n["op"] for n in d["nodes"]}
    assert {"GEGLU", "SOFT_MAX", "SET_ROWS", "MUL_MAT", "RMS_NORM"} <= ops


def test_check_passes_on_own_baseline_and_fails_on_drift(tmp_path):
    base = tmp_path / "costs.yaml"
    model = ROOT / "examples" / "llama-3.1-8b-instruct-q4_k_m.gguf"
    assert cli("analyze", model, "-f", "yaml", "-o", base, "--past", 100).returncode == 0
    ok = cli("check", model, "--baseline", base)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    doc = yaml.safe_load(base.read_text())
    doc["totals"]["flops"] = int(doc["totals"]["flops"] * 0.9)  # someone changed the model
    for row in doc["by_op"]:
        if row["key"] == "MUL_MAT":
            row["bytes_read"] += 12345
    drift = tmp_path / "drift.yaml"
    drift.write_text(yaml.safe_dump(doc, sort_keys=False))
    bad = cli("check", model, "--baseline", drift, "--rtol", "0.01")
    assert bad.returncode == 1
    assert "totals.flops" in bad.stdout and "+11.111%" in bad.stdout
    assert "by_op.MUL_MAT.bytes_read" not in bad.stdout  # 12,345 B of 4.6 GB is within 1%
    tight = cli("check", model, "--baseline", drift)
    assert tight.returncode == 1 and "by_op.MUL_MAT.bytes_read" in tight.stdout


@pytest.mark.parametrize("args,needle", [
    (["analyze", "missing.gguf"], "missing.gguf"),
    (["analyze", "-fa", "maybe"], "--flash-attn"),
    (["analyze", "-ctv", "q8_0", "-fa", "off"], "flash"),
    (["analyze", "--tokens", "600"], "ubatch"),
    (["analyze", "-c", "512", "--past", "600"], "context"),
    (["analyze", "-ctk", "q9_9"], "--cache-type-k"),
    (["analyze", "--format", "xml"], "--format"),
    (["analyze", "--layers", "a-b", "-f", "tree"], "--layers"),
    (["check", "examples/llama-3.1-8b-instruct-q4_k_m.gguf", "--baseline", "README.md"], "README.md"),
    # an option the format does not use is refused, not dropped
    (["analyze", "-f", "tree", "--hardware", "apple-m2"],
     "--format tree does not use --hardware (used by --format summary or json or yaml or html)"),
    (["analyze", "--layers", "0"], "--format summary does not use --layers (used by --format tree)"),
    (["analyze", "-f", "json", "--layers", "0"], "--format json does not use --layers"),
    (["analyze", "-f", "yaml", "--layers", "0"], "--format yaml does not use --layers"),
    (["profile", "x.gguf", "--token-ids", "1", "-f", "json", "--top", "5"],
     "--format json does not use --top (used by --format table)"),
], ids=["missing-file", "bad-fa", "quant-v-without-fa", "too-many-tokens", "past-beyond-ctx",
        "bad-cache-type", "bad-format", "bad-layers", "bad-baseline", "tree-hardware",
        "summary-layers", "json-layers", "yaml-layers", "profile-json-top"])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


@pytest.mark.parametrize("block_count", [2, None], ids=["block_count", "header_only"])
def test_unsupported_architecture_names_it_and_lists_supported(tmp_path, block_count):
    """One line naming the architecture, the supported ones and ``graphcost archs``,
    whether or not the file has the keys a family would need."""
    import gguf
    p = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(p, "mamba")
    if block_count is not None:
        w.add_block_count(block_count)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    r = cli("analyze", p)
    assert r.returncode == 2
    from graphcost.graph.arch_spec import load_specs
    supported = sorted(k for k in load_specs() if "@" not in k)
    (line,) = r.stderr.splitlines()
    assert "'mamba' is not supported" in line
    assert f"(supported: {', '.join(supported)}; see `graphcost archs`)" in line


@pytest.mark.parametrize("args", [["analyze", "--bogus"], ["analyze", "-c", "abc"],
                                  ["memory", "--sweep", "ctx="]],
                         ids=["unknown-option", "bad-int", "bad-sweep"])
def test_usage_errors_are_one_line_and_exit_2(args):
    r = cli(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("graphcost: ")
