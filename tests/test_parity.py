"""graphcost's graph equals llama.cpp's, node for node: order, name, op, type, ne, sources.

llama.cpp (through llama-cpp-python) reports every node its scheduler runs via cb_eval;
see graphcost/judge/oracle.py. Fixtures are tiny GGUFs with odd sizes and mixed weight types.
"""
from __future__ import annotations

import pytest

import fixtures as F
from graphcost.judge.oracle import capture_graph
from parity import (assert_same_graph, fa_off_on, first_difference, graph_cases, needs_llama_cpp,
                    our_records)

pytestmark = needs_llama_cpp


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("parity")
    return {
        # GQA 8/2, head_dim 32, mixed F16/Q8_0/Q4_0/Q4_K weights, untied output
        "llama": F.write_llama(d / "llama.gguf"),
        # head_dim 64 (Hadamard path for quantized KV), tied embeddings, llama3 rope_freqs, odd vocab
        "llama64": F.write_llama(d / "llama64.gguf", **F.LLAMA64),
        # 7 layers, window 64, pattern 6: sliding and global layers, two caches
        "gemma3": F.write_gemma3(d / "gemma3.gguf"),
        # the sliding-window pattern as a per-layer array (irregular on purpose)
        "gemma3_arr": F.write_gemma3(d / "gemma3_arr.gguf", n_layer=5,
                                     swa_pattern=[True, False, False, True, True]),
        # gemma3 without a sliding window: the plain-KV attention path
        "gemma3_noswa": F.write_gemma3(d / "gemma3_noswa.gguf", sliding_window=0, n_layer=3),
    }


CASES = [
    # (model, settings)
    ("llama", dict(tokens=1, past=3)),
    ("llama", dict(tokens=7, past=0)),
    ("llama", dict(tokens=5, past=300, n_outputs=2)),
    ("llama", dict(tokens=1, past=0, type_k="q8_0")),
    ("llama", dict(tokens=3, past=2, type_k="q8_0", type_v="q4_0", fa=True)),
    ("llama64", dict(tokens=1, past=5)),
    ("llama64", dict(tokens=6, past=0, type_k="q8_0", type_v="q8_0", fa=True)),
    ("llama64", dict(tokens=2, past=1, type_k="q4_0")),
    ("gemma3", dict(tokens=1, past=3)),
    ("gemma3", dict(tokens=9, past=0, n_outputs=4)),
    ("gemma3", dict(tokens=4, past=100, n_ubatch=64, n_ctx=600)),
    ("gemma3", dict(tokens=3, past=2, swa_full=True)),
    ("gemma3", dict(tokens=2, past=0, type_k="q8_0", type_v="q8_0", fa=True)),
    ("gemma3_noswa", dict(tokens=3, past=1)),
    ("gemma3_arr", dict(tokens=2, past=70)),
]


@graph_cases(CASES)
def test_fixture_graph_matches_llama_cpp(models, model, settings, fa):
    assert_same_graph(models[model], settings, fa)


@fa_off_on
@pytest.mark.parametrize("tokens,past", [(1, 0), (1, 37), (16, 0), (5, 700)],
                         ids=["decode0", "decode37", "prefill16", "prefill5_past700"])
def test_real_gemma3_graph_matches_llama_cpp(gemma3_270m, fa, tokens, past):
    kw = dict(n_ctx=1024, n_ubatch=512, flash_attn=fa, tokens=tokens, past=past)
    theirs = capture_graph(gemma3_270m, **kw)
    ours = our_records(gemma3_270m, **kw)
    diff = first_difference(ours, theirs)
    assert diff is None, diff
