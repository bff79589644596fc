"""gpt-oss in the executor without llama.cpp: the YaRN parameters the rope op carries
(llama_context's arithmetic, llama-context.cpp), header-only files on random MXFP4
weights, and the one-line refusals that remain."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gq

from fixtures_gptoss import write_gptoss
from graphcost.format import ggml_types as gt
from graphcost.graph.build import load_model
from graphcost.errors import UnsupportedError
from graphcost.execute.executor import Executor
from graphcost.execute.weights import random_raw
from graphcost.format.gguf_reader import read_header
from graphcost.format.model import yarn_context
from graphcost.graph.settings import RunSettings


@pytest.fixture(scope="module")
def gptoss(tmp_path_factory):
    return write_gptoss(tmp_path_factory.mktemp("gptoss_exec") / "gptoss.gguf")


def test_yarn_context_is_llama_contexts_arithmetic(gptoss):
    m = load_model(gptoss.path)
    assert m.rope_scaling_type == "yarn" and m.rope_freq_scale == 1 / 32   # factor 32
    y = yarn_context(m)
    # ext_factor 1 (YaRN, not set by the context); attn_factor = get_mscale(32, 1) /
    # (1 + 0.1 ln 32) = 1.34657 / 1.34657: 1 up to float32 rounding; betas 32 and 1
    assert y["ext_factor"] == 1.0 and (y["beta_fast"], y["beta_slow"]) == (32.0, 1.0)
    assert abs(y["attn_factor"] - 1.0) <= 2 ** -23


def test_rope_nodes_carry_yarn_only_for_yarn_files(gptoss, tmp_path):
    from graphcost.graph.build import build_graph

    def ropes(path):
        bg = build_graph(load_model(path), RunSettings(ctx_size=256, tokens=3))
        return [n.params for n in bg.nodes if n.op == "ROPE"]

    yarn = ropes(gptoss.path)
    assert len(yarn) == 2 * 3                      # Q and K of 3 layers
    assert all(p["ext_factor"] == 1.0 and p["freq_scale"] == 1 / 32 and
               p["n_ctx_orig"] == 4096 for p in yarn)
    plain = ropes(write_gptoss(tmp_path / "noyarn.gguf", yarn=False).path)
    assert all(p["ext_factor"] == 0.0 and p["attn_factor"] == 1.0 and p["freq_scale"] == 1.0
               for p in plain)


def test_random_mxfp4_weights_are_small_and_finite():
    raw = random_raw(gt.GGMLType.MXFP4, (288, 160), np.random.default_rng(0))
    assert raw.nbytes == 160 * 288 // 32 * 17
    w = gq.dequantize(raw.reshape(160, -1), QT.MXFP4)
    # scale bytes 118..120: 2^-10..2^-8 times doubled E2M1 codes up to 12 -> |w| <= 0.047
    assert np.isfinite(w).all() and 0 < np.abs(w).max() <= 12 * 2.0 ** -8


@pytest.mark.warm_up
def test_header_only_gptoss_runs_on_random_weights(gptoss, tmp_path):
    header_only = tmp_path / "header_only.gguf"
    header_only.write_bytes(gptoss.path.read_bytes()[:read_header(gptoss.path).data_offset])
    ex = Executor(header_only, RunSettings(ctx_size=256), numerics="fast")
    assert any("random" in n for n in ex.notes)
    r = ex.step([1, 2, 3])
    assert np.isfinite(r.logits).all() and r.logits.shape == (1, gptoss.n_vocab)


def test_yarn_with_keys_the_context_does_not_read_is_refused_in_one_line(gptoss):
    # deepseek2's rope.scaling.yarn_log_multiplier changes llama_context's attn_factor:
    # yarn_context assumes its default, so the executor refuses rather than guess
    from dataclasses import replace

    m = load_model(gptoss.path)
    key = "gpt-oss.rope.scaling.yarn_log_multiplier"
    m2 = replace(m, header=replace(m.header, metadata={**m.header.metadata, key: 0.1}))
    with pytest.raises(UnsupportedError) as e:
        Executor(m2, RunSettings(ctx_size=256))
    assert "\n" not in str(e.value) and key in str(e.value)
