"""Memory parity for qwen2moe, olmoe, smollm3, seed_oss, glm4, exaone4, cohere2, mistral3,
qwen3vl, qwen3vlmoe and llama4: the compute buffer, every KV cache and the output buffer equal
llama.cpp's logged sizes (the checks of tests/test_memory_parity.py, on this module's
fixtures from tests/fixtures_simple.py). Logs are captured in parallel once per module.
"""
from __future__ import annotations

import pytest

import fixtures_simple as S
from parity import capture_logs, memory_case_id, needs_llama_cpp
from parity import MiB, mib2
from test_memory_parity import _document

pytestmark = needs_llama_cpp

# (model, n_ctx, n_ubatch, flash_attn, type_k, type_v, swa_full)
CASES = [
    ("qwen2moe", 512, 512, False, "f16", "f16", False),
    ("qwen2moe", 4096, 64, True, "q8_0", "q8_0", False),
    ("olmoe", 1000, 100, False, "q8_0", "f16", False),
    ("smollm3", 32768, 512, True, "q8_0", "q8_0", False),
    ("smollm3", 512, 1, False, "f16", "f16", False),
    ("seed_oss", 4096, 512, False, "f16", "f16", False),
    ("glm4", 700, 300, True, "f16", "f16", False),
    ("glm4_mrope", 4096, 512, False, "q8_0", "f16", False),
    ("exaone4", 512, 512, True, "q8_0", "q8_0", False),
    ("exaone4_swa", 4096, 512, False, "f16", "f16", False),
    ("exaone4_swa", 4096, 64, True, "f16", "f16", True),
    ("cohere2", 32768, 512, False, "f16", "f16", False),
    ("cohere2", 4096, 64, True, "q8_0", "q8_0", True),
    ("mistral3", 2048, 256, False, "f16", "f16", False),
    ("mistral3_moe", 4096, 512, True, "q8_0", "q8_0", False),
    ("qwen3vl", 512, 512, False, "f16", "f16", False),
    ("qwen3vl", 8192, 128, True, "q8_0", "q8_0", False),
    ("qwen3vlmoe", 4096, 512, False, "f16", "f16", False),
    # chunked: a 8192-cell chunk cache beside the base cache once n_ctx exceeds it
    ("llama4", 32768, 512, False, "f16", "f16", False),
    ("llama4", 16384, 256, True, "q8_0", "q8_0", False),
    ("llama4", 4096, 512, False, "f16", "f16", True),
]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("memparity_simple")
    return {
        "qwen2moe": S.write_qwen2moe(d / "qwen2moe.gguf").path,
        "olmoe": S.write_olmoe(d / "olmoe.gguf").path,
        "smollm3": S.write_smollm3(d / "smollm3.gguf").path,
        "seed_oss": S.write_seed_oss(d / "seed_oss.gguf").path,
        "glm4": S.write_glm4(d / "glm4.gguf").path,
        "glm4_mrope": S.write_glm4(d / "glm4_mrope.gguf", rope_sections=[4, 6, 6, 0]).path,
        "exaone4": S.write_exaone4(d / "exaone4.gguf").path,
        # 64 layers: a base cache of 16 layers and a sliding-window cache of 48
        "exaone4_swa": S.write_exaone4(d / "exaone4_swa.gguf", n_layer=64, n_embd=64,
                                       n_head=2, n_head_kv=1, n_ff=96, n_vocab=261,
                                       sliding_window=40).path,
        "cohere2": S.write_cohere2(d / "cohere2.gguf").path,
        "mistral3": S.write_mistral3(d / "mistral3.gguf").path,
        "mistral3_moe": S.write_mistral3(d / "mistral3_moe.gguf", temperature_scale=None,
                                         n_expert=5, n_ff=96, head_dim=32).path,
        "qwen3vl": S.write_qwen3vl(d / "qwen3vl.gguf").path,
        "qwen3vlmoe": S.write_qwen3vlmoe(d / "qwen3vlmoe.gguf").path,
        "llama4": S.write_llama4(d / "llama4.gguf").path,
    }


@pytest.fixture(scope="module")
def logs(paths):
    """llama.cpp's parsed log for every case."""
    return capture_logs(paths, CASES)


@pytest.mark.parametrize("case", CASES, ids=[memory_case_id(c) for c in CASES])
def test_memory_matches_llama_cpp_log(paths, logs, case):
    log = logs[memory_case_id(case)]
    mem = _document(paths[case[0]], case)["memory"]
    assert mib2(mem["compute_buffer_bytes"]) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{mem['compute_buffer_bytes'] / MiB:.4f}" == f"{exact['mib']:.4f}"
    assert len(mem["kv_caches"]) == len(log["kv_caches"])
    for ours, theirs in zip(mem["kv_caches"], log["kv_caches"]):
        assert ours["cells"] == theirs["cells"]
        assert ours["layers"] == theirs["layers"]
        assert mib2(ours["bytes"]) == theirs["buffer_mib"]
    assert mib2(mem["output_buffer_bytes"]) == log["output_buffer_mib"]
