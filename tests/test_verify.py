"""``graphcost verify``: llama.cpp run on the model, graphcost's graph and buffers compared
node by node and buffer by buffer; exit 0 when equal, 1 when not, 2 when it cannot run."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fixtures as F
from graphcost.judge import verify as V
from graphcost.judge.oracle import llama_cpp_available, llama_cpp_unavailable_reason
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]
needs_llama = pytest.mark.skipif(not llama_cpp_available(),
                                 reason="llama-cpp-python: " + llama_cpp_unavailable_reason())


def cli(*args):
    return subprocess.run([sys.executable, "-m", "graphcost", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    return os.fspath(F.write_gemma3(tmp_path_factory.mktemp("verify") / "gemma3.gguf"))


@pytest.fixture(scope="module")
def header_only(gemma3, tmp_path_factory):
    """The same model cut where its tensor data begins (a header-only file)."""
    from graphcost.format.gguf_reader import read_header
    h = read_header(gemma3)
    p = tmp_path_factory.mktemp("verify_h") / "gemma3-header.gguf"
    p.write_bytes(Path(gemma3).read_bytes()[:h.data_offset])
    return os.fspath(p)


@needs_llama
def test_equal_model_exits_0_and_shows_every_buffer(gemma3):
    r = cli("verify", gemma3, "-c", "600", "-ub", "64", "--tokens", "3", "--past", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("graph: equal (")
    # base and sliding-window caches: cells and buffer each, plus compute and output
    assert r.stdout.count("  equal") == 1 + 2 * 2 + 1
    assert r.stdout.rstrip().endswith("verdict: equal")


@needs_llama
def test_header_only_file_is_padded_and_verified(header_only):
    before = Path(header_only).read_bytes()
    v = V.verify(header_only, RunSettings(ctx_size=512, flash_attn="off", tokens=2))
    assert v.equal and v.nodes == v.llama_nodes > 0
    assert Path(header_only).read_bytes() == before            # the input is untouched


@needs_llama
def test_made_up_vocabulary_keeps_graph_and_buffers(gemma3, header_only, tmp_path):
    # what a file whose tokenizer arrays were stripped gets: the same tensors and keys with
    # a made-up vocabulary of n_vocab tokens; llama.cpp loads it, graph and buffers equal
    from graphcost.graph.build import load_model
    padded = tmp_path / "padded.gguf"
    with V.with_tensor_data(load_model(header_only).header, 0) as p:
        padded.write_bytes(Path(p).read_bytes())
    out = tmp_path / "vocab.gguf"
    V._with_token_list(padded, out, load_model(gemma3).n_vocab)
    assert out.stat().st_size == Path(gemma3).stat().st_size - (
        load_model(gemma3).header.data_offset - load_model(os.fspath(out)).header.data_offset)
    v = V.verify(out, RunSettings(ctx_size=512, flash_attn="on", tokens=3))
    assert v.equal


@needs_llama
def test_a_difference_is_named_and_exits_1(gemma3, monkeypatch, capsys):
    real = V.graph_records

    def renamed(bg):                      # graphcost gets one node's name wrong
        recs = real(bg)
        recs[5] = {**recs[5], "name": "wrong"}
        return recs

    monkeypatch.setattr(V, "graph_records", renamed)
    v = V.verify(gemma3, RunSettings(ctx_size=512, tokens=1))
    assert not v.equal
    (line,) = v.graph_differences
    assert line.startswith("node 5: name 'wrong' (llama.cpp ")
    monkeypatch.setattr(sys, "argv", ["graphcost", "verify", gemma3, "-c", "512"])
    from graphcost.cli import main
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 1
    assert "graph: DIFFERS (1 differences" in capsys.readouterr().out


def test_graph_differences_lists_each_node_and_the_count():
    a = [{"index": i, "name": f"n{i}", "op": "ADD", "type": "f32", "ne": [1, 1, 1, 1],
          "src": []} for i in range(4)]
    b = [dict(r) for r in a[:3]]
    b[1]["op"] = "MUL"
    assert V.graph_differences(a, b) == [
        "node 1: op 'ADD' (llama.cpp 'MUL')",
        "graphcost has 4 nodes, llama.cpp 3; graphcost goes on with 'n3'"]
    assert V.graph_differences(a, a) == []


def test_without_llama_cpp_one_line_exit_2(gemma3, monkeypatch, capsys):
    import graphcost.judge.oracle as O
    monkeypatch.setattr(O, "llama_cpp_available", lambda: False)
    monkeypatch.setattr(O, "llama_cpp_unavailable_reason", lambda: "not installed")
    monkeypatch.setattr(sys, "argv", ["graphcost", "verify", gemma3])
    from graphcost.cli import main
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "needs llama-cpp-python" in err


def test_parse_log_reads_llama_cpps_buffer_and_size_lines():
    # printf formats of llama-kv-cache.cpp:291/301, llama-memory-recurrent.cpp:124/133,
    # llama-context.cpp:381/740 and llama-model.cpp:1930 (vendored llama.cpp)
    from graphcost.judge.oracle import parse_log
    log = "\n".join([
        "load_tensors:          CPU model buffer size =     1.23 MiB",
        "llama_kv_cache:        CPU KV buffer size =    12.00 MiB",
        "llama_kv_cache: size =   12.00 MiB (   512 cells,   3 layers,  1/1 seqs), "
        "K (f16):    6.00 MiB, V (q8_0):    6.00 MiB",
        "llama_memory_recurrent:        CPU RS buffer size =     0.05 MiB",
        "llama_memory_recurrent: size =    0.05 MiB (     1 cells,   3 layers,  1 seqs  2 rs_seq), "
        "R (f32):    0.01 MiB, S (f32):    0.04 MiB, P (f32):    0.00 MiB",
        "llama_context:        CPU  output buffer size =     0.00 MiB",
        "llama_context:        CPU compute buffer size =    10.50 MiB",
        "sched_reserve:        CPU compute buffer size =    11.25 MiB",
    ])
    r = parse_log(log)
    assert r["model_buffers"] == [{"buffer": "CPU", "mib": 1.23}]
    assert r["output_buffers"] == [{"buffer": "CPU", "mib": 0.0}] and r["output_buffer_mib"] == 0.0
    assert r["compute_buffers"] == [{"buffer": "CPU", "mib": 10.5}, {"buffer": "CPU", "mib": 11.25}]
    assert r["compute_buffer_mib"] == 11.25             # the last CPU one
    (kv,) = r["kv_caches"]
    assert {k: kv[k] for k in ("buffer_mib", "size_mib", "cells", "layers", "seqs", "n_stream",
                               "type_k", "k_mib", "type_v", "v_mib")} == {
        "buffer_mib": 12.0, "size_mib": 12.0, "cells": 512, "layers": 3, "seqs": 1,
        "n_stream": 1, "type_k": "f16", "k_mib": 6.0, "type_v": "q8_0", "v_mib": 6.0}
    assert r["recurrent_states"] == [{
        "buffer": "CPU", "buffer_mib": 0.05, "size_mib": 0.05, "cells": 1, "layers": 3,
        "seqs": 1, "rs_seq": 2, "type_r": "f32", "r_mib": 0.01, "type_s": "f32", "s_mib": 0.04}]
