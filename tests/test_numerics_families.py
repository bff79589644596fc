"""The executor on the families added for issue 11 beyond the hybrids, gpt-oss and
deepseek2: the multi-section rope kernel (MROPE, IMROPE) against its numpy reference and
by hand, then every family's tiny model against llama.cpp (graphcost/judge/oracle.py,
cb_eval): one llama.cpp run per model, a 7-token prompt and 3 decode steps, the logits
of every step and a few layer nodes at the prompt step.

Measured on this machine (2026-11-23; relative max |logit difference| over the 4 steps,
then the captured nodes' worst relative L2), also in docs/executor.md:
qwen35 1.6e-7 (Qcur-3/Kcur-3 after IMROPE 9.7e-8), qwen35moe 1.1e-7 (Kcur-3 2.1e-5,
after three MoE layers), glm4 1.2e-7, glm4 MROPE 0.55% (Qcur-0 6.1e-8), glm4moe 1.1%
(l_out-0 2.3e-4), qwen2moe 0.89%, olmoe 1.2%, smollm3 0.31%, seed_oss 1.4e-7, cohere2
0.64%, exaone4 1.3%, ernie4_5-moe 1.6e-7, minimax-m2 0.87% (ffn_moe_out-0 3.6e-3),
lfm2moe 0.28%, qwen3vl 1.3e-7, qwen3vlmoe 0.8%, mistral3 0.78%, llama4 0.98%, gemma3n
1.2e-7, gemma4 2.4%, nemotron_h_moe 8.2e-8; every rope output <= 1.3e-7 in layer 0.
The whole file (40 tests): 131 s wall, 50 s user CPU (llama.cpp workers included) at
nice 19 on the shared 2-core machine (11.5 min wall under a load of 15).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from graphcost.execute.executor import Executor
from graphcost.execute.kernels_loader import load_kernels
from graphcost.graph.settings import RunSettings
from graphcost.judge.oracle import llama_cpp_available, llama_cpp_unavailable_reason
from numerics import compare_steps, profile_steps

ROPE = load_kernels().rope
F32 = np.float32


def rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(F32)


# ---------------------------------------------------------------------------- kernel

#: 4 tokens with different positions on each track (time, height, width, extra)
POS4 = np.array([[0, 5, 37, 4095], [0, 2, 11, 70001], [1, 9, 3, 8], [0, 0, 6, 2]],
                dtype=np.int32)
MULTI_ROPES = {
    "plain": {},
    "freq_factors": {"freq_base": 500000.0,
                     "freq_factors": np.linspace(1, 8, 7).astype(F32)},
    "yarn": {"freq_base": 1e6, "freq_scale": 0.25, "n_ctx_orig": 8192, "ext_factor": 1.0},
}


@pytest.mark.parametrize("sections", [(2, 1, 1, 0), (3, 2, 1, 1)], ids=["s2110", "s3211"])
@pytest.mark.parametrize("mode", [ROPE.MROPE, ROPE.IMROPE], ids=["mrope", "imrope"])
@pytest.mark.parametrize("name", list(MULTI_ROPES))
def test_multi_section_rope_matches_reference(name, mode, sections):
    x = rand((4, 3, 16), 10)                                      # D=16, rotate n_dims=14
    got = ROPE.rope(x, POS4.reshape(-1), 14, mode, sections=sections, **MULTI_ROPES[name])
    want = ROPE.rope_ref(x, POS4, 14, mode, sections=sections, **MULTI_ROPES[name])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(x).max())
    assert np.array_equal(got[..., 14:], x[..., 14:])             # the rest is copied


def test_multi_section_tracks_by_hand():
    # 6 pairs (n_dims 12), sections [2, 1, 1, 0]: sector = pair % 4
    #   IMROPE (ops.cpp: sector%3==1 and < 3*s1 -> h, %3==2 and < 3*s2 -> w,
    #           %3==0 and < 3*s0 -> t, else extra):  t h w t | t h
    #   MROPE  (t for sector < 2, h for 2, w for 3):   t t h w | t t
    assert list(ROPE.sections_select(12, ROPE.IMROPE, (2, 1, 1, 0))) == [0, 1, 2, 0, 0, 1]
    assert list(ROPE.sections_select(12, ROPE.MROPE, (2, 1, 1, 0))) == [0, 0, 1, 2, 0, 0]
    # sections [1, 1, 1, 1] under IMROPE: sector 3 is %3==0 but not < 3*1 -> extra
    assert list(ROPE.sections_select(8, ROPE.IMROPE, (1, 1, 1, 1))) == [0, 1, 2, 3]
    # pair 2 of token 1 under IMROPE rotates by width position 3 * theta_scale^2
    x = rand((4, 1, 12), 3)
    y = ROPE.rope(x, POS4.reshape(-1), 12, ROPE.IMROPE, sections=(2, 1, 1, 0))
    ts = F32(10000.0) ** (F32(-2.0) / F32(12))
    a = F32(F32(F32(POS4[2, 1]) * ts) * ts)
    x0, x1 = x[1, 0, 2], x[1, 0, 2 + 6]
    assert y[1, 0, 2] == pytest.approx(x0 * np.cos(a) - x1 * np.sin(a), rel=1e-6)
    assert y[1, 0, 8] == pytest.approx(x0 * np.sin(a) + x1 * np.cos(a), rel=1e-6)


def test_text_positions_make_imrope_neox_but_for_the_extra_track():
    # llm_graph_input_pos::set_input gives text tokens (p, p, p, 0): pairs on the t/h/w
    # tracks rotate as NEOX, pairs on the extra track (angle 0) are left as they are
    x, p = rand((5, 2, 16), 4), np.array([0, 1, 7, 300, 9000], dtype=np.int32)
    pos4 = np.concatenate([p, p, p, np.zeros_like(p)])
    sel = ROPE.sections_select(16, ROPE.IMROPE, (1, 1, 1, 1))    # [0 1 2 3 0 1 2 3]
    y = ROPE.rope(x, pos4, 16, ROPE.IMROPE, sections=(1, 1, 1, 1))
    neox = ROPE.rope(x, p, 16, ROPE.NEOX)
    for i in range(8):
        cols = [i, i + 8]
        want = x[..., cols] if sel[i] == 3 else neox[..., cols]
        np.testing.assert_array_equal(y[..., cols], want)


def test_other_rope_modes_are_refused():
    with pytest.raises(NotImplementedError, match="rope mode 24"):
        ROPE.rope(rand((2, 1, 8), 1), np.zeros(8, np.int32), 8, 24, sections=(1, 1, 1, 1))


# ---------------------------------------------------------------------------- models

needs_llama = pytest.mark.skipif(not llama_cpp_available(),
                                 reason="llama-cpp-python: " + llama_cpp_unavailable_reason())

#: case -> (fixture module, writer, writer kwargs, flash attention, nodes captured at the
#: prompt step). One llama.cpp run each.
CASES = {
    "qwen35": ("fixtures_hybrid", "write_qwen3next", dict(arch="qwen35"), False,
               ["Qcur-3", "Kcur-3", "l_out-3"]),
    "qwen35moe": ("fixtures_hybrid", "write_qwen3next", dict(arch="qwen35moe"), True,
                  ["Qcur-3", "Kcur-3", "l_out-3"]),
    "glm4": ("fixtures_simple", "write_glm4", {}, False, ["Qcur-0", "kqv_out-0", "l_out-0"]),
    "glm4_mrope": ("fixtures_simple", "write_glm4",
                   dict(rope_sections=[4, 6, 6, 0], n_layer=2, tie_embeddings=True,
                        qkv_biases=False), True, ["Qcur-0", "kqv_out-0", "l_out-0"]),
    "glm4moe": ("fixtures_deepseek", "write_glm4moe", {}, True,
                ["Qcur-0", "kqv_out-0", "l_out-0"]),
    "qwen2moe": ("fixtures_simple", "write_qwen2moe", {}, False,
                 ["Qcur-0", "ffn_moe_out-0", "l_out-0"]),
    "olmoe": ("fixtures_simple", "write_olmoe", {}, True,
              ["Qcur_normed-0", "ffn_moe_out-0", "l_out-0"]),
    "smollm3": ("fixtures_simple", "write_smollm3", {}, False, ["Qcur-0", "l_out-0"]),
    "seed_oss": ("fixtures_simple", "write_seed_oss", {}, True, ["Qcur-0", "l_out-0"]),
    "cohere2": ("fixtures_simple", "write_cohere2", {}, False, ["Qcur-0", "l_out-0"]),
    "exaone4": ("fixtures_simple", "write_exaone4", dict(rope_freqs=True), True,
                ["Qcur_normed-0", "l_out-0"]),
    "ernie4_5-moe": ("fixtures_deepseek", "write_ernie4_5_moe", {}, False,
                     ["Qcur-0", "l_out-0"]),
    "minimax-m2": ("fixtures_deepseek", "write_minimax_m2", {}, True,
                   ["Qcur_normed-0", "ffn_moe_out-0", "l_out-0"]),
    "lfm2moe": ("fixtures_hybrid", "write_lfm2", dict(n_expert=5), False,
                ["model.layers.{}.conv.conv-0", "l_out-1"]),
    # IMROPE sections [12, 10, 10, 0], 2 deepstack layers (PAD of the input embedding)
    "qwen3vl": ("fixtures_simple", "write_qwen3vl", {}, False,
                ["Qcur-0", "deepstack_out-0", "l_out-1"]),
    "qwen3vlmoe": ("fixtures_simple", "write_qwen3vlmoe", {}, True,
                   ["Qcur-0", "ffn_moe_out-0", "deepstack_out-0"]),
    # query temperature with a floor scale of 4 positions (n_ctx_orig_yarn): the 10
    # positions see three temperatures (llama4's floor is 8192: only the path is run)
    "mistral3": ("fixtures_simple", "write_mistral3", dict(original_context=4), False,
                 ["Qcur_attn_temp_scaled-0", "l_out-0"]),
    "llama4": ("fixtures_simple", "write_llama4", {}, True, ["Qcur_normed-0", "l_out-1"]),
    # Mamba-2, MoE (E), attention (*) layers: "MEM*EM"
    "nemotron_h_moe": ("fixtures_hybrid", "write_nemotron_h",
                       dict(pattern="MEM*EM", arch="nemotron_h_moe"), True,
                       ["mamba_out-0", "l_out-1"]),
    # altup (MEAN, SQRT of the magnitudes), laurel, per-layer inputs from the second,
    # unnamed token input
    "gemma3n": ("fixtures_gemma3n", "write_gemma3n", {}, False,
                ["Qcur_pos-0", "corrected-0", "l_out-0"]),
    "gemma4": ("fixtures_gemma4", "write_gemma4", {}, True,
               ["Kcur_pos-0", "per_layer_embd_out-0", "l_out-0"]),
}


@pytest.fixture(scope="module")
def family_models(tmp_path_factory):
    """Every case's tiny model, written once for the module."""
    d = tmp_path_factory.mktemp("families")
    out = {}
    for case, (module, fn, kw, _, _) in CASES.items():
        out[case] = getattr(importlib.import_module(module), fn)(d / f"{case}.gguf", **kw)
    return out


@needs_llama
@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_llama_cpp(family_models, case):
    _, _, _, fa, nodes = CASES[case]
    info = family_models[case]
    ids = [int(x) for x in np.random.default_rng(1).integers(3, info.n_vocab, 10)]
    run = compare_steps(info.path, ids, 7, nodes, fa=fa, n_ctx=256)   # 4 steps
    errs, node_errs = run.errs, run.nodes
    print(f"\n{case}: logits {' '.join(f'{e:.2g}' for e in errs)}; "
          + " ".join(f"{k} {v:.2g}" for k, v in node_errs.items()))
    # the bounds of the first families' fixtures (tests/test_numerics.py): max 5%, median
    # 2%; measured <= 1.3% but gemma4 (2.4% at its last step, FA on)
    assert max(errs) <= 0.05, [f"{e:.2g}" for e in errs]
    assert float(np.median(errs)) <= 0.02, [f"{e:.2g}" for e in errs]
    assert set(node_errs) == set(nodes)
    for name, e in node_errs.items():
        assert e <= node_tolerance(name), (name, e)


def _host_has_avx512f() -> bool:
    from llvmlite import binding
    return bool(binding.get_host_cpu_features().get("avx512f"))


#: the kernels' F32/F16/BF16 dots sum in the order llama.cpp's AVX-512F build does
#: (kernels/vec_dot_ggml.py); on a CPU without AVX-512F llama.cpp sums 8-lane (AVX2)
FLOAT_DOTS_IN_LLAMA_ORDER = _host_has_avx512f()


def node_tolerance(name: str, float_order: bool | None = None) -> float:
    """Relative L2 bound of a captured node. Rope outputs and the short convolution are
    float32 in ggml's order: 1e-6 in layer 0 (measured <= 1.2e-7), 1e-4 deeper, where
    earlier layers' rounding arrives (measured 2.1e-5: qwen35moe's Kcur-3 after three MoE
    layers). The others follow quantized matmuls: 5e-3 (measured <= 2.4e-7 for dense
    layers; MoE layers up to 3.6e-3, a Q8 activation rounding flip changing one expert's
    input, as gpt-oss's 3.2e-3).

    Deeper than layer 0 on a CPU without AVX-512F (``float_order`` False; default: this
    host) the 5e-3 bound: llama.cpp's float dots there sum in AVX2's order, not the
    kernels' (AVX-512F's), and after MoE layers such a difference can flip a Q8 rounding
    too (2026-11-28, AVX2-only EPYC: qwen35moe's Qcur-3 7.0e-4, Kcur-3 2.9e-4)."""
    if float_order is None:
        float_order = FLOAT_DOTS_IN_LLAMA_ORDER
    if name.startswith(("Qcur", "Kcur", "model.layers.{}.conv.conv")):
        if name.endswith("-0"):
            return 1e-6
        return 1e-4 if float_order else 5e-3
    return 5e-3


def test_profile_refuses_an_encoder_in_one_line(tmp_path):
    """bert (non-causal attention without a KV cache, pooling) is not executed:
    ``graphcost profile`` says so in one line naming the input, exit 2, before any step."""
    import subprocess
    import sys
    from pathlib import Path

    from fixtures_encoder import write_bert
    info = write_bert(tmp_path / "bert.gguf")
    r = subprocess.run([sys.executable, "-m", "graphcost", "profile", str(info.path),
                        "--token-ids", "3,10", "--hardware", "apple-m2", "-c", "256"],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "bert's attention without a KV cache" in lines[0], r.stderr
    assert "self_kq_mask" in lines[0]


@pytest.mark.parametrize("case,want", [("llama4", (0.1, 8192, 1.0)),
                                       ("mistral3", (0.1, 4, 0.0))], ids=["llama4", "mistral3"])
def test_temperature_input_carries_the_hparams_of_its_family(family_models, case, want):
    """inp_attn_scale is filled with the hparams the spec gives it: llama4.cpp hard-codes
    scale 0.1, floor 8192 and offset 1 (a floor the tiny runs never reach, so checked
    here), mistral3 reads the scale and floors by n_ctx_orig_yarn (4 in the fixture)."""
    from graphcost.execute.inputs import attn_temp
    from graphcost.graph.build import build_graph

    ex = Executor(family_models[case].path, RunSettings(ctx_size=256))
    leaf = next(t for t in build_graph(ex.model, ex.run.step(3, 0, 1)).leafs
                if t.name == "inp_attn_scale")
    p = leaf.params
    assert (p["temp_scale"], p["temp_floor"], p["temp_offset"]) == pytest.approx(want)
    # log(floor((pos + offset) / floor) + 1) * 0.1 + 1: llama4's offset moves position
    # 8191 into the second step, mistral3's floor of 4 makes 3 -> 1 and 4 -> 1 + 0.1 ln 2
    pos = np.array([0, 3, 4, 8190, 8191], dtype=np.int32)
    got = attn_temp(pos, p["temp_scale"], p["temp_floor"], p["temp_offset"])
    steps = np.floor((pos + want[2]) / want[1])
    np.testing.assert_allclose(got, 1 + 0.1 * np.log(steps + 1), rtol=1e-6)
    assert (got[4] > 1) and (got[3] == 1 if case == "llama4" else got[2] > 1)


def test_profile_runs_imrope_through_the_cli(family_models, tmp_path):
    """``graphcost profile`` on qwen35 (IMROPE attention, delta-net layers): every rope
    node timed and costed; its argmax is the executor's (whose logits match llama.cpp's
    above)."""
    info = family_models["qwen35"]
    steps = profile_steps(info.path, tmp_path / "p.json", greedy=1)
    assert [s["past"] for s in steps] == [0, 4]
    for s in steps:
        rope = [n for n in s["nodes"] if n["op"] == "ROPE"]
        assert len(rope) == 2          # Q and K of the one attention layer (layer 3)
        assert all(n["seconds"] > 0 and n["predicted_seconds"] > 0 for n in rope)
    ex = Executor(info.path, RunSettings(ctx_size=256), numerics="ggml")
    assert steps[0]["argmax"] == int(np.argmax(ex.step([3, 10, 17, 24]).logits[-1]))
