"""Smoke tests for the llama.cpp oracle (graphcost/judge/oracle.py) and the tiny GGUF
fixtures (tests/fixtures.py).  They prove the oracle itself works; they do not test
graphcost."""

from __future__ import annotations

import numpy as np
import pytest

import fixtures as F
from graphcost.judge.oracle import (OracleError, capture_graph, capture_log, llama_cpp_available, llama_cpp_unavailable_reason)

import gguf

pytestmark = pytest.mark.skipif(
    not llama_cpp_available(),
    reason="llama-cpp-python is not importable: " + llama_cpp_unavailable_reason())

MiB = 1024 * 1024


def mib2(nbytes: int) -> float:
    """What llama.cpp prints for nbytes with "%8.2f MiB" (glibc and Python both round
    the exact binary value half-to-even, so the strings agree)."""
    return float(f"{nbytes / MiB:.2f}")


@pytest.fixture(scope="module")
def llama_fx(tmp_path_factory):
    # n_embd 256, 8 heads, 2 kv heads, head_dim 32, n_ff 768, 3 layers, vocab 300
    return F.write_llama(tmp_path_factory.mktemp("fx") / "llama.gguf")


@pytest.fixture(scope="module")
def gemma3_fx(tmp_path_factory):
    # n_embd 320, 4 heads, 2 kv heads, head_dim 64, 7 layers, window 64, pattern 6
    return F.write_gemma3(tmp_path_factory.mktemp("fx") / "gemma3.gguf")


def test_fixture_weights_are_finite(llama_fx, gemma3_fx):
    for fx in (llama_fx, gemma3_fx):
        r = gguf.GGUFReader(fx.path)
        kinds = set()
        for t in r.tensors:
            kinds.add(t.tensor_type.name)
            d = gguf.quants.dequantize(t.data, t.tensor_type)
            assert np.isfinite(d).all(), t.name
            assert np.abs(d).max() < 4.0, t.name
        assert {"F32", "F16", "Q8_0", "Q4_0", "Q4_K"} <= kinds


def test_llama_t1_first_and_last_node(llama_fx):
    nodes = capture_graph(llama_fx, flash_attn=False, past=3, tokens=1)
    assert [n["index"] for n in nodes] == list(range(len(nodes)))
    assert set(nodes[0]) == {"index", "name", "op", "type", "ne", "src"}
    first, last = nodes[0], nodes[-1]
    assert (first["name"], first["op"]) == ("embd", "GET_ROWS")
    assert first["src"] == ["token_embd.weight", "inp_tokens"]
    assert (last["name"], last["op"]) == ("result_output", "MUL_MAT")
    assert last["ne"] == [llama_fx.n_vocab, 1, 1, 1]
    assert last["type"] == "f32"
    # UNARY/GLU nodes report their sub-op
    assert sum(n["op"] == "SWIGLU" for n in nodes) == llama_fx.n_layer
    # FA off: explicit softmax attention, one per layer
    ops = [n["op"] for n in nodes]
    assert ops.count("SOFT_MAX") == llama_fx.n_layer
    assert "FLASH_ATTN_EXT" not in ops


def test_llama_flash_attn_on(llama_fx):
    nodes = capture_graph(llama_fx, flash_attn=True, past=3, tokens=2, n_outputs=2)
    ops = [n["op"] for n in nodes]
    assert ops.count("FLASH_ATTN_EXT") == llama_fx.n_layer
    assert "SOFT_MAX" not in ops
    assert nodes[-1]["ne"] == [llama_fx.n_vocab, 2, 1, 1]
    fa = next(n for n in nodes if n["op"] == "FLASH_ATTN_EXT")
    # FA result is [head_dim, n_head, n_tokens]; the kv view spans n_kv = 256 (padded) cells
    assert fa["ne"] == [llama_fx.head_dim, llama_fx.n_head, 2, 1]


def test_llama_kv_size_from_log(llama_fx):
    # n_ctx 1000 is padded up to a multiple of 256 -> 1024 cells.
    # K = n_layer * cells * (n_head_kv*head_dim) * 2 B (f16) = 3 * 1024 * 64 * 2 = 393216 B = 0.375 MiB
    # V = the same (f16)                                                     -> 0.375 MiB
    # total 786432 B = 0.75 MiB
    log = capture_log(llama_fx, n_ctx=1000, n_ubatch=512, flash_attn=False)
    assert log["n_ctx"] == 1024
    assert log["n_ctx_seq"] == 1024
    assert log["flash_attn"] == "disabled"
    (kv,) = log["kv_caches"]
    cells = 1024
    row = llama_fx.n_head_kv * llama_fx.head_dim
    k_bytes = llama_fx.n_layer * cells * row * 2
    v_bytes = llama_fx.n_layer * cells * row * 2
    assert kv["cells"] == cells and kv["layers"] == llama_fx.n_layer
    assert kv["layer_ids"] == list(range(llama_fx.n_layer))
    assert (kv["type_k"], kv["type_v"]) == ("f16", "f16")
    # the log prints MiB with 2 decimals
    assert kv["k_mib"] == mib2(k_bytes)
    assert kv["v_mib"] == mib2(v_bytes)
    assert kv["buffer_mib"] == mib2((k_bytes + v_bytes))
    assert log["kv_buffer_mib"] == [kv["buffer_mib"]]
    # compute buffer: rounded line and the exact (4 decimals) DEBUG line from ~llama_context
    assert log["compute_buffer_mib"] > 0
    (exact,) = log["compute_buffer_exact"]
    assert exact["matches"] and abs(exact["mib"] - log["compute_buffer_mib"]) <= 0.0051
    # output buffer: n_vocab floats for n_seq_max = 1 outputs (tiny: prints 0.00)
    assert log["output_buffer_mib"] is not None
    assert log["decode_rc"] == 0


def test_llama_quantized_k_cache_size(llama_fx):
    # q8_0 K: 34 B per 32 values -> row 64 values = 68 B; 3 * 512 * 68 = 104448 B = 0.0996 MiB
    # f16 V: 3 * 512 * 64 * 2 = 196608 B = 0.1875 MiB
    log = capture_log(llama_fx, n_ctx=512, flash_attn=True, type_k="q8_0")
    (kv,) = log["kv_caches"]
    assert kv["type_k"] == "q8_0"
    assert kv["k_mib"] == mib2(3 * 512 * 68)
    assert kv["v_mib"] == mib2(3 * 512 * 64 * 2)


def test_quantized_v_without_fa_is_refused(llama_fx):
    with pytest.raises(OracleError, match="quantized V cache"):
        capture_log(llama_fx, flash_attn=False, type_v="q8_0")


def test_gemma3_fixture_two_kv_caches(gemma3_fx):
    log = capture_log(gemma3_fx, n_ctx=1024, n_ubatch=128, flash_attn=False)
    assert [c["which"] for c in log["kv_caches"]] == ["non-SWA", "SWA"]
    base, swa = log["kv_caches"]
    is_swa = gemma3_fx.swa_layers                      # [T,T,T,T,T,F,T]
    assert base["layer_ids"] == [i for i, s in enumerate(is_swa) if not s]
    assert swa["layer_ids"] == [i for i, s in enumerate(is_swa) if s]
    assert base["cells"] == 1024
    # SWA cache: pad(min(n_ctx, n_swa + n_ubatch), 256) = pad(64 + 128, 256) = 256 cells
    assert swa["cells"] == 256
    row = gemma3_fx.n_head_kv * gemma3_fx.head_dim     # 128 values, f16 -> 256 B
    assert base["buffer_mib"] == mib2(2 * len(base["layer_ids"]) * 1024 * row * 2)
    assert swa["buffer_mib"] == mib2(2 * len(swa["layer_ids"]) * 256 * row * 2)


def test_gemma3_fixture_graph(gemma3_fx):
    nodes = capture_graph(gemma3_fx, flash_attn=True, past=5, tokens=3, n_outputs=1)
    ops = [n["op"] for n in nodes]
    assert ops.count("FLASH_ATTN_EXT") == gemma3_fx.n_layer
    assert ops.count("GEGLU") == gemma3_fx.n_layer
    assert nodes[1]["name"] == "inp_scaled"
    assert nodes[-1]["name"] == "result_output"
    assert nodes[-1]["ne"] == [gemma3_fx.n_vocab, 1, 1, 1]
    assert nodes[-1]["src"][0] == "token_embd.weight"  # tied embeddings


def test_worker_starts_from_the_given_environment(llama_fx, monkeypatch):
    # benchmarks pass the environment the user started them with (base_env): a variable
    # this process set afterwards must not reach llama.cpp's process
    from graphcost.judge.oracle import run_model
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    user = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    user["OMP_PROC_BIND"] = "false"
    r = run_model(llama_fx, prompt=[1, 2, 3], greedy=1, n_ctx=256, base_env=user)
    assert "OMP_WAIT_POLICY" not in r["env"]
    assert r["env"]["OMP_PROC_BIND"] == "false"
    r = run_model(llama_fx, prompt=[1, 2, 3], greedy=1, n_ctx=256)     # default: ours
    assert r["env"]["OMP_WAIT_POLICY"] == "PASSIVE"


def test_one_worker_serves_successive_calls_and_a_failure_ends_it(llama_fx, monkeypatch):
    # the worker stays up between calls of one environment (pytest's per-test
    # PYTEST_CURRENT_TEST is not part of its key) ...
    from graphcost.judge import oracle
    capture_graph(llama_fx, tokens=2)
    key = list(oracle._WORKERS)[-1]                 # the most recently used worker
    pid = oracle._WORKERS[key][-1].proc.pid
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "as in the next test")
    capture_log(llama_fx, tokens=3, past=1)
    assert oracle._WORKERS[key][-1].proc.pid == pid
    # ... each call still loads the model: the second log has the model's buffer too
    assert capture_log(llama_fx)["model_buffers"]
    # ... a failed call ends it, and the next call gets a fresh one
    with pytest.raises(OracleError, match="quantized V cache"):
        capture_log(llama_fx, flash_attn=False, type_v="q8_0")
    assert pid not in [w.proc.pid for w in oracle._WORKERS.get(key, [])]
    assert capture_graph(llama_fx, tokens=1)[-1]["name"] == "result_output"
    assert oracle._WORKERS[key][-1].proc.pid != pid
