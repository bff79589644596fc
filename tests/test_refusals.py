"""Settings llama.cpp refuses when it creates a context are refused here too, in one line
(issue 9, item 3), each case checked against llama.cpp itself.

``llama_init_from_model`` (src/llama-context.cpp) returns no context when flash attention
is not disabled and a quantized cache type's block size does not divide the head size.
With flash attention off it makes the context, but the run cannot work: it aborts in the
first decode, or every logit is NaN. Both are refused by
:func:`graphcost.graph.settings.refuse_cache_types`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fixtures as F
from graphcost.judge.oracle import (OracleError, capture_log, llama_cpp_available, llama_cpp_unavailable_reason, run_model)

from graphcost.graph.build import build_graph, load_model
from graphcost.errors import SettingsError
from graphcost.graph.settings import RunSettings

ROOT = Path(__file__).resolve().parents[1]

# (head_dim, flash attention, type_k, type_v, refused?)
CASES = [
    (40, True, "q8_0", "f16", True),     # 40 % 32: K refused
    (40, True, "f16", "q8_0", True),     # V refused
    (16, True, "q4_0", "q4_0", True),    # 16 % 32
    (48, False, "q8_0", "f16", True),    # fa off: ggml aborts viewing K per head
    (40, False, "q4_0", "f16", True),    # fa off, n_embd_k_gqa 80 % 32: the cache itself
    (64, True, "q8_0", "q8_0", False),   # 64 % 32 == 0
    (48, True, "f16", "f16", False),     # float caches: any head size
    (40, True, "bf16", "f32", False),
]
IDS = [f"hd{h}-{'fa' if fa else 'nofa'}-{k}-{v}" for h, fa, k, v, _ in CASES]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("refusals")
    # n_embd 192, 6 heads, 2 KV heads; head sizes set apart from n_embd / n_head
    return {h: F.write_llama(d / f"hd{h}.gguf", n_embd=192, n_head=6, n_head_kv=2,
                             head_dim=h, n_layer=2) for h in {c[0] for c in CASES}}


@pytest.mark.parametrize("head_dim,fa,type_k,type_v,refused", CASES, ids=IDS)
def test_we_refuse_what_llama_cpp_refuses(models, head_dim, fa, type_k, type_v, refused):
    s = RunSettings(ctx_size=256, flash_attn="on" if fa else "off", cache_type_k=type_k,
                    cache_type_v=type_v)
    model = load_model(models[head_dim])
    if refused:
        with pytest.raises(SettingsError, match="block size 32 does not divide"):
            build_graph(model, s)
    else:
        assert build_graph(model, s).nodes


@pytest.mark.skipif(not llama_cpp_available(),
                    reason="llama-cpp-python: " + llama_cpp_unavailable_reason())
@pytest.mark.parametrize("head_dim,fa,type_k,type_v,refused", CASES, ids=IDS)
def test_llama_cpp_refuses_the_same(models, head_dim, fa, type_k, type_v, refused):
    def run():
        return capture_log(models[head_dim], n_ctx=256, flash_attn=fa, type_k=type_k,
                           type_v=type_v)
    if refused and fa:
        with pytest.raises(OracleError, match="does not divide"):
            run()
        return
    try:       # with flash attention off: an abort (GGML_ASSERT) making the context or
        # in the first decode, or NaN logits
        assert run()["kv_caches"]
        r = run_model(models[head_dim], prompt=[1, 2, 3], greedy=1, n_ctx=256,
                      flash_attn=fa, type_k=type_k, type_v=type_v)
        works = all(np.isfinite(lg).all() for lg in r["logits"])
    except OracleError as e:
        assert "rc=-6" in str(e)              # SIGABRT in the worker, not another failure
        works = False
    assert works == (not refused)


def test_cli_refusal_is_one_line_exit_2(models):
    r = subprocess.run([sys.executable, "-m", "graphcost", "memory", os.fspath(models[40]),
                        "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert "--cache-type-k q8_0" in line and "n_embd_head_k=40" in line and "hd40.gguf" in line
