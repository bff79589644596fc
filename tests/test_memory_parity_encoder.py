"""bert's and nomic-bert's memory plans equal what llama.cpp allocates, read from llama.cpp's own log (as
tests/test_memory_parity.py does for the causal families): no KV cache at all (llama.cpp
creates no memory module for bert and logs no KV buffer), the compute buffer to the 4 decimals
(the 4-decimal DEBUG line printed on free) for the prompt and generation reserve graphs,
with and without embeddings (pooling adds ``mean``/``cls`` inputs and the pooled output),
flash attention on and off, and the output buffer (logits plus, with embeddings, one
n_embd row per sequence)."""
from __future__ import annotations

import pytest
from gguf import PoolingType as PT

import fixtures_encoder as E
from graphcost.graph.build import load_model
from graphcost.memory.plan import plan_memory
from graphcost.graph.settings import RunSettings
from parity import MiB, mib2, capture_logs, needs_llama_cpp

pytestmark = needs_llama_cpp


# (model, n_ctx, n_ubatch, flash_attn, embeddings)
CASES = [
    ("bert", 512, 512, False, True),
    ("bert", 512, 512, True, True),
    ("bert", 512, 1, False, True),
    ("bert", 2048, 64, True, False),
    ("bert", 300, 300, False, False),
    ("bert_cls", 512, 128, False, True),
    ("bert_cls", 1024, 512, True, True),
    ("bert_rank", 512, 200, False, True),
    ("nomic", 2048, 512, False, True),
    ("nomic", 512, 64, True, False),
]


def _id(c) -> str:
    m, ctx, ub, fa, emb = c
    return f"{m}-c{ctx}-ub{ub}-fa{'on' if fa else 'off'}-emb{'on' if emb else 'off'}"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("memparity_encoder")
    return {
        "bert": E.write_bert(d / "bert.gguf").path,
        "bert_cls": E.write_bert(d / "bert_cls.gguf", n_embd=192, n_head=3, n_ff=352,
                                 n_layer=3, pooling=PT.CLS, token_types=0,
                                 fused_qkv=True, context_length=1024).path,
        "bert_rank": E.write_bert(d / "bert_rank.gguf", pooling=PT.RANK, cls=True,
                                  cls_out=3, n_layer=1).path,
        # nomic-bert: RoPE (rope inputs are the positions already there), SwiGLU FFN
        "nomic": E.write_bert(d / "nomic.gguf", arch="nomic-bert", fused_qkv=True,
                              qkv_bias=False, out_bias=False, ffn_bias=False, n_layer=3).path,
    }


@pytest.fixture(scope="module")
def logs(paths):
    """llama.cpp's parsed log for every case."""
    return capture_logs(paths, CASES, lambda c: dict(n_ctx=c[1], n_ubatch=c[2], flash_attn=c[3],
                                                     embeddings=c[4]), _id)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_encoder_memory_matches_llama_cpp_log(paths, logs, case):
    m, ctx, ub, fa, emb = case
    log = logs[_id(case)]
    plan = plan_memory(load_model(paths[m]), RunSettings(
        ctx_size=ctx, ubatch_size=ub, batch_size=ub, flash_attn="on" if fa else "off",
        embeddings=emb))
    assert log["kv_caches"] == [] and plan.caches == [] and plan.kv_cache_bytes == 0
    assert mib2(plan.compute_buffer_bytes) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{plan.compute_buffer_bytes / MiB:.4f}" == f"{exact['mib']:.4f}"
    assert mib2(plan.output_buffer_bytes) == log["output_buffer_mib"]
    # the prompt reserve graph has min(n_ctx, n_ubatch) tokens, all of them outputs
    prompt = plan.reserve("prompt")
    assert prompt.n_tokens == prompt.n_outputs == min(plan.run.n_ctx, ub)
