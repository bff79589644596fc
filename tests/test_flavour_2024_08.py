"""--llama-cpp 2024-08 reproduces shared/reference/sample-report.txt: same nodes, order,
names and shapes for Mistral-Large-2407 Q4_0 with 31 cached cells and one new token, and
the same 64.135 GiB read from memory (weights + KV cache + inputs)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.errors import UnsupportedError
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared" / "reference" / "sample-report.txt"
MISTRAL = ROOT / "examples" / "mistral-large-2407-q4_0.gguf"

# op symbols of the old report (ggml_graph_dump_dot labels, llamacpp-graph.md section 9)
SYMBOL_OP = {"get_rows(x)": "GET_ROWS", "rms_norm(x)": "RMS_NORM", "x*y (MUL)": "MUL",
             "X*Y (MAT_MUL)": "MUL_MAT", "reshape(x)": "RESHAPE", "rope(x)": "ROPE",
             "view(x)": "VIEW", "x->y (STORE)": "CPY", "transpose(x)": "TRANSPOSE",
             "permute(x)": "PERMUTE", "soft_max(x)": "SOFT_MAX", "cont(x)": "CONT",
             "x+y": "ADD", "unary(x) (SILU?)": "SILU"}
# the old parser stored these name suffixes apart and printed the bare name
STRIPPED = re.compile(r"( \(reshaped\)| \(transposed\)| \(copy of .*\))+$")


def sample_nodes() -> list[tuple[str, str, list[int]]]:
    lines = SAMPLE.read_text().splitlines()
    out = []
    for i, line in enumerate(lines[:-1]):
        m = re.match(r"^[|<>\- ]*([^\s:|<>][^:]*): (.+)$", line)
        nxt = re.match(r"^[|<>\- ]*[\d.]+, \[([\d, ]+)\]$", lines[i + 1])
        if m and nxt and m.group(2) in SYMBOL_OP:
            out.append((m.group(1), SYMBOL_OP[m.group(2)], [int(x) for x in nxt.group(1).split(",")]))
    return out


def ours_as_printed(n) -> tuple[str, str, list[int]]:
    ne = list(n.ne[:3]) if n.ne[2] != 1 else list(n.ne[:2])  # the dot dump printed 2 or 3 dims
    return STRIPPED.sub("", n.name), n.op, ne


@pytest.fixture(scope="module")
def mistral_2024_08():
    s = RunSettings(ctx_size=32768, flash_attn="off", tokens=1, past=31, llama_cpp="2024-08")
    return analyze_graph(build_graph(load_model(MISTRAL), s))


@pytest.mark.skipif(not SAMPLE.exists(), reason="shared/reference is not beside the repo")
def test_nodes_match_the_sample_report(mistral_2024_08):
    theirs = sample_nodes()
    ours = [ours_as_printed(nc.node) for nc in mistral_2024_08.nodes]
    # the excerpt shows the prologue and layer 0 (33 nodes), then layer 87 (34) and the epilogue (3)
    assert len(theirs) == 33 + 34 + 3 and len(ours) == 1 + 88 * 32 + 2 + 3 == 2822
    assert ours[:33] == theirs[:33]
    assert ours[-37:] == theirs[33:]  # layer 87: 32 nodes + 2 row selections; 3 epilogue
    assert [nc.node.name for nc in mistral_2024_08.nodes[2808:2810]] == ["node_2808", "node_2809"]


def test_read_bytes_match_the_sample_report(mistral_2024_08):
    r = mistral_2024_08.total.read
    # the report's "read" is what comes from leaves: weights + KV views + inputs
    assert f"{(r['weights'] + r['kv'] + r['inputs']) / 2**30:.3f}" == "64.135"
    # KV: 88 layers x (K + V) x 32 cells x 1024 values x 2 B = 11,534,336 B
    assert r["kv"] == 88 * 2 * 32 * 1024 * 2
    assert mistral_2024_08.graph.run.n_kv == 32  # padded to 32 without flash attention in 2024-08


def test_softmax_and_silu_exp_count_matches_the_report(mistral_2024_08):
    # fexp 2.79347e+06 = 88 * (32 * 96 + 28672): softmax over 32 cells x 96 heads + SiLU
    assert mistral_2024_08.total.ops["exp"] == 88 * (32 * 96 + 28672) == 2_793_472


def test_flash_attention_2024_08_pads_to_256_and_casts_the_mask():
    s = RunSettings(ctx_size=1000, flash_attn="on", tokens=3, past=5, llama_cpp="2024-08")
    bg = build_graph(load_model(MISTRAL), s)
    assert bg.run.kv_size == 1024 and bg.run.n_kv == 256
    names = [n.name for n in bg.nodes]
    assert names[0] == "inp_embd" and "KQ_mask (copy)" in names
    assert sum(n.op == "FLASH_ATTN_EXT" for n in bg.nodes) == 88


def test_flavour_for_an_architecture_it_does_not_cover(tmp_path):
    with pytest.raises(UnsupportedError, match="has no gemma3 graph"):
        build_graph(load_model(ROOT / "examples" / "gemma-3-4b-it-q4_k_m.gguf"),
                    RunSettings(llama_cpp="2024-08"))


def test_sample_report_settings_without_fa_flag_give_its_2822_nodes():
    # the report's own command line had no -fa: llama.cpp of 2024-08 ran without flash
    # attention unless asked, so the flavour's default is off (2471 nodes if it were on)
    s = RunSettings(ctx_size=32768, tokens=1, past=31, llama_cpp="2024-08")
    bg = build_graph(load_model(MISTRAL), s)
    assert not bg.run.flash_attn and len(bg.nodes) == 2822


def test_cli_flavour_default_is_off_and_auto_is_refused():
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    r = cli("analyze", MISTRAL, "--llama-cpp", "2024-08", "-c", "32768", "--tokens", "1",
            "--past", "31", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert '"flash_attn": "off"' in r.stdout
    r = cli("analyze", MISTRAL, "--llama-cpp", "2024-08", "-fa", "auto")
    assert r.returncode == 2 and "has no 'auto'" in r.stderr and len(r.stderr.splitlines()) == 1
