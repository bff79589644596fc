"""The memory plan without llama.cpp: relations that must hold, the JSON fields, the
``graphcost memory`` command (breakdown, sweep table, fused-attention
what-if) and its one-line errors. Agreement with llama.cpp itself is in
tests/test_memory_parity.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import write_gemma3, write_llama
from graphcost.cost.analysis import analyze_graph
from graphcost.graph.build import build_graph, load_model
from graphcost.memory.fusion import fuse_plan
from graphcost.memory.plan import plan_memory, sweep
from graphcost.document import document
from graphcost.report.memory import render_memory, render_sweep
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    # n_embd 256, 8 heads (head_dim 32), 2 KV heads, 3 layers, vocab 300
    return load_model(write_llama(tmp_path_factory.mktemp("mem") / "llama.gguf").path)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    # 7 layers, window 64, pattern 6 (6 sliding, 1 global), 4 heads x 64, 2 KV heads
    return load_model(write_gemma3(tmp_path_factory.mktemp("mem") / "gemma3.gguf").path)


def test_without_fa_the_kq_scores_set_the_peak_and_grow_with_context(llama):
    ctxs = [512, 4096, 32768]
    plans = sweep(llama, RunSettings(flash_attn="off"), "ctx", ctxs)
    for ctx, p in zip(ctxs, plans):
        top, size = p.worst.alloc.peak_tensors[0]
        assert top.name == "kq-0" and p.worst.label == "prompt"
        # kq: [n_kv, T, n_head] f32 = ctx * 512 * 8 * 4 bytes
        assert size == ctx * 512 * 8 * 4
    # the compute buffer grows by exactly the growth of the scores and of the F32 mask
    # [n_kv, 512]: (32768 - 4096) * 512 * (8 heads + 1 mask) * 4 bytes
    assert (plans[2].compute_buffer_bytes - plans[1].compute_buffer_bytes
            == (32768 - 4096) * 512 * (8 + 1) * 4)


def test_with_fa_the_scores_never_reach_memory(llama):
    plans = sweep(llama, RunSettings(flash_attn="on"), "ctx", [512, 32768])
    for p in plans:
        names = {t.name.split("-")[0] for t, _ in p.worst.alloc.peak_tensors}
        assert "kq" not in names and "kq_soft_max" not in names
    small, big = plans
    off = plan_memory(llama, RunSettings(ctx_size=32768, flash_attn="off"))
    assert big.compute_buffer_bytes * 10 < off.compute_buffer_bytes
    # what still grows with context: the F16 mask [n_kv, 512]
    top, size = big.worst.alloc.peak_tensors[0]
    assert top.name == "attn_inp_kq_mask" and size == 32768 * 512 * 2


def test_generation_graph_is_smaller_and_ubatch_one_uses_it(llama):
    p = plan_memory(llama, RunSettings(ctx_size=4096, ubatch_size=1))
    prompt, gen = p.reserves
    assert (prompt.n_tokens, prompt.n_outputs, gen.n_tokens, gen.n_outputs) == (1, 1, 1, 1)
    assert p.compute_buffer_bytes == prompt.alloc.buffer_bytes == gen.alloc.buffer_bytes
    p = plan_memory(llama, RunSettings(ctx_size=4096, ubatch_size=64))
    assert p.reserve("generation").alloc.buffer_bytes < p.compute_buffer_bytes


def test_kv_split_per_cache_and_swa_full(gemma3):
    # base cache: 1 global layer, 4096 cells; swa cache: 6 layers, pad(64 + 512, 256) = 768
    # cells; K = V = cells * (2 heads * 64) * 2 bytes (f16) per layer
    p = plan_memory(gemma3, RunSettings(ctx_size=4096))
    assert [(c.name, c.cells, c.layers) for c in p.caches] == [("base", 4096, 1), ("swa", 768, 6)]
    assert [c.k_bytes for c in p.caches] == [4096 * 128 * 2, 6 * 768 * 128 * 2]
    assert p.kv_cache_bytes == 2 * (4096 * 128 * 2 + 6 * 768 * 128 * 2)
    full = plan_memory(gemma3, RunSettings(ctx_size=4096, swa_full=True))
    assert [c.cells for c in full.caches] == [4096, 4096]
    assert full.compute_buffer_bytes > p.compute_buffer_bytes  # the swa mask is 4096 wide now


def test_json_memory_fields_and_live_bytes(gemma3):
    bg = build_graph(gemma3, RunSettings(ctx_size=1024, tokens=7, past=20, outputs=2))
    doc = document(analyze_graph(bg, memory=True))
    mem = doc["memory"]
    plan = plan_memory(gemma3, RunSettings(ctx_size=1024))
    assert mem["compute_buffer_bytes"] == plan.compute_buffer_bytes
    assert mem["output_buffer_bytes"] == 300 * 4            # n_vocab floats, one output
    assert [g["graph"] for g in mem["reserve_graphs"]] == ["prompt", "generation"]
    live = [n["live_bytes"] for n in doc["nodes"]]
    assert len(live) == len(bg.nodes) and all(isinstance(x, int) and x > 0 for x in live)
    assert max(live) == mem["peak_live_bytes"] == live[mem["peak_node"]["index"]]
    assert doc["nodes"][mem["peak_node"]["index"]]["name"] == mem["peak_node"]["name"]
    # the analyzed step (7 tokens) needs less than the worst case it runs inside
    assert mem["peak_live_bytes"] < mem["compute_buffer_bytes"]


def test_fused_attention_what_if(llama):
    p = plan_memory(llama, RunSettings(ctx_size=4096, flash_attn="off"))
    worst, *_ = fuse_plan(p)
    assert worst.graph_label == "prompt" and not worst.unfused
    assert [f.layer for f in worst.layers] == [0, 1, 2]
    for f in worst.layers:
        # what leaves the block is the output projection: [n_embd 256, 512 tokens] f32
        assert f.after == 256 * 512 * 4
        # kq and kq_soft_max alone are n_kv 4096 x 512 x 8 heads x 4 bytes each
        assert f.before > 2 * 4096 * 512 * 8 * 4
    assert worst.saved == worst.before - worst.after
    assert worst.buffer_after < worst.buffer_before  # the scores no longer need the buffer


def test_reports_render(llama):
    p = plan_memory(llama, RunSettings(ctx_size=4096, flash_attn="off"))
    text = render_memory(p, fuse_plan(p))
    for needle in ("model weights", "KV cache base", "compute buffer (CPU)", "output buffer (CPU)",
                   "total", "peak:", "kq-0", "KQ scores", "what-if", "never stored"):
        assert needle in text, needle
    plans = sweep(llama, RunSettings(flash_attn="off"), "ub", [1, 64, 512])
    table = render_sweep("ub", [1, 64, 512], plans)
    assert "compute peak set by" in table and "kq-0" in table


def test_memory_command(tmp_path):
    model = write_llama(tmp_path / "llama.gguf").path
    r = cli("memory", model, "-c", 2048, "-fa", "off", "--fuse", "attention")
    assert r.returncode == 0, r.stderr
    assert "compute buffer (CPU)" in r.stdout and "what-if" in r.stdout
    r = cli("memory", model, "--sweep", "ctx=512,4096")
    assert r.returncode == 0, r.stderr
    assert "ctx" in r.stdout  # the plot (-o) is tests/test_plot.py's
    j = cli("analyze", model, "-c", 2048, "-f", "json")
    assert json.loads(j.stdout)["memory"]["compute_buffer_bytes"] > 0


@pytest.mark.parametrize("args,needle", [
    (["--sweep", "ctx=a,b"], "--sweep"),
    (["--sweep", "batch=1,2"], "--sweep"),
    (["--fuse", "ffn"], "--fuse"),
    (["-o", "x.svg"], "--sweep"),
    (["--sweep", "ub=1,2", "-o", "x.pdf"], ".svg or .png"),
], ids=["bad-values", "bad-key", "bad-fuse", "plot-without-sweep", "bad-plot-suffix"])
def test_memory_bad_input_is_one_line(tmp_path, args, needle):
    model = write_llama(tmp_path / "llama.gguf").path
    r = cli("memory", model, *[a if a not in ("x.svg", "x.pdf") else tmp_path / a for a in args])
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_png_needs_matplotlib(tmp_path):
    model = write_llama(tmp_path / "llama.gguf").path
    r = cli("memory", model, "--sweep", "ub=1,64", "-o", tmp_path / "p.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert r.returncode == 2 and "matplotlib" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    else:
        assert r.returncode == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
