"""``-np N`` (``--parallel``, cparams.n_seq_max) and ``-kvu`` (``--kv-unified``) without
llama.cpp: the sizes llama_context derives, the KV streams, the reserve ubatch of N
sequences, the per-stream views and mask, and the one-line refusals. Agreement with
llama.cpp's logged buffers is in tests/test_memory_parity.py (its ``n_seq_max`` cases) and,
node for node, in :func:`test_one_sequence_step_equals_llama_cpp_graph` here.

The fixture is tests/fixtures.py's llama: n_embd 256, 8 heads of 32, 2 KV heads (n_embd_k_gqa
= n_embd_v_gqa = 64), 3 layers, vocab 300, training context 2048.
"""
from __future__ import annotations

import json

import pytest

from fixtures import write_gemma3, write_llama
from fixtures_encoder import write_bert
from fixtures_hybrid import write_lfm2
from graphcost.errors import SettingsError
from graphcost.graph.build import build_graph, load_model, resolve_for
from graphcost.graph.settings import RunSettings
from graphcost.memory.plan import plan_memory
from parity import assert_same_graph, graph_cases, needs_llama_cpp

@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("np")
    return {"llama": write_llama(d / "llama.gguf").path,
            "gemma3": write_gemma3(d / "gemma3.gguf").path,
            "bert": write_bert(d / "bert.gguf").path,
            "lfm2": write_lfm2(d / "lfm2.gguf").path}


@pytest.fixture(scope="module")
def llama(paths):
    return load_model(paths["llama"])


def _tensor(graph, name):
    return next(t for t in graph.leafs + graph.nodes if t.name == name)


# ---- sizes (llama_context constructor) ------------------------------------------------

@pytest.mark.parametrize("ctx,np_,kvu,n_ctx,kv_size,n_stream", [
    # -c 4096 -np 2: 4096 / 2 = 2048 cells per stream (a multiple of 256 already)
    (4096, 2, False, 4096, 2048, 2),
    # -c 4096 -np 3: GGML_PAD(4096 / 3 = 1365, 256) = 1536 per stream; n_ctx = 3 * 1536
    (4096, 3, False, 4608, 1536, 3),
    # -c 1000 -np 3: n_ctx padded to 1024; GGML_PAD(1024 / 3 = 341, 256) = 512; 3 * 512
    (1000, 3, False, 1536, 512, 3),
    # -kvu: one stream of the whole (padded) context, whatever -np is
    (1000, 3, True, 1024, 1024, 1),
    # -np 0 is n_seq_max = max(1, 0) = 1
    (700, 0, False, 768, 768, 1),
], ids=["c4096-np2", "c4096-np3", "c1000-np3", "c1000-np3-kvu", "c700-np0"])
def test_streams_and_cells(llama, ctx, np_, kvu, n_ctx, kv_size, n_stream):
    run = resolve_for(llama, RunSettings(ctx_size=ctx, n_seq_max=np_, kv_unified=kvu))
    assert (run.n_ctx, run.kv_size, run.n_stream, run.n_seq_max) == (n_ctx, kv_size, n_stream,
                                                                      max(1, np_))


def test_batch_is_clamped_to_the_context_before_padding(llama, paths):
    # -c 300 -b 2048 -ub 512: n_batch = min(300, 2048) = 300, n_ubatch = min(300, 512) =
    # 300, then n_ctx = GGML_PAD(300, 256) = 512; the prompt reserve has 300 tokens
    run = resolve_for(llama, RunSettings(ctx_size=300))
    assert (run.n_ctx, run.n_batch, run.n_ubatch) == (512, 300, 300)
    assert plan_memory(llama, run).reserve("prompt").n_tokens == 300
    # an encoder (non-causal attention) keeps -b: n_batch 2048, n_ubatch 512, and the
    # prompt reserve has min(n_ctx 512, n_ubatch 512) = 512 tokens
    bert = load_model(paths["bert"])
    run = resolve_for(bert, RunSettings(ctx_size=300))
    assert (run.n_ctx, run.n_batch, run.n_ubatch) == (512, 2048, 512)
    assert plan_memory(bert, run).reserve("prompt").n_tokens == 512


def test_sliding_window_cache_with_streams(paths):
    # gemma3: window 64; -ub 256. Not unified: GGML_PAD(min(kv_size, 64 + 256), 256) = 512
    # cells per stream; -kvu -np 8: GGML_PAD(64 * 8 + 256 = 768, 256) = 768 cells
    m = load_model(paths["gemma3"])
    run = resolve_for(m, RunSettings(ctx_size=8192, ubatch_size=256, n_seq_max=8))
    assert (run.kv_size, run.kv_size_swa, run.n_stream) == (1024, 512, 8)
    run = resolve_for(m, RunSettings(ctx_size=8192, ubatch_size=256, n_seq_max=8,
                                     kv_unified=True))
    assert (run.kv_size, run.kv_size_swa, run.n_stream) == (8192, 768, 1)


# ---- the reserve graphs (sched_reserve, graph_reserve) ------------------------------------

def test_reserve_ubatch_is_n_seq_max_sequences(llama):
    p = plan_memory(llama, RunSettings(ctx_size=4096, n_seq_max=3))
    prompt, gen = p.reserve("prompt"), p.reserve("generation")
    # 512 tokens rounded up to a multiple of 3 sequences: 513; the outputs stay 512
    assert (prompt.n_tokens, prompt.n_outputs, prompt.graph.run.n_seqs) == (513, 512, 3)
    # one token and one output per sequence
    assert (gen.n_tokens, gen.n_outputs, gen.graph.run.n_seqs) == (3, 3, 3)
    # the output buffer: logits for n_seq_max outputs, 300 x 3 floats
    assert p.output_buffer_bytes == 300 * 3 * 4


def test_kv_buffers_hold_every_stream(llama):
    # -c 4096 -np 3: 3 layers x 64 x 1536 cells x 3 streams x 2 bytes (F16), K and V alike
    p = plan_memory(llama, RunSettings(ctx_size=4096, n_seq_max=3))
    (c,) = p.caches
    assert (c.cells, c.k_bytes, c.v_bytes) == (1536, 3 * 64 * 1536 * 3 * 2, 3 * 64 * 1536 * 3 * 2)
    # -kvu: one stream of 4096 cells, 3 x 64 x 4096 x 2 bytes
    (c,) = plan_memory(llama, RunSettings(ctx_size=4096, n_seq_max=3, kv_unified=True)).caches
    assert (c.cells, c.k_bytes) == (4096, 3 * 64 * 4096 * 2)


def test_prompt_graph_views_per_stream(llama):
    """-c 4096 -np 2 -fa off, the prompt reserve (512 tokens in 2 sequences, every cell
    attended): the shapes llama_kv_cache and build_attn_mha give."""
    g = plan_memory(llama, RunSettings(ctx_size=4096, n_seq_max=2, flash_attn="off")
                    ).reserve("prompt").graph
    # the buffers [n_embd_k_gqa 64, kv_size 2048, n_stream 2]
    assert _tensor(g, "cache_k_l0").ne == (64, 2048, 2, 1)
    assert _tensor(g, "cache_v_l0").ne == (64, 2048, 2, 1)
    # the mask [n_kv 2048, 512 / 2 tokens, 1, 2 streams], F32 without flash attention
    assert _tensor(g, "attn_inp_kq_mask").ne == (2048, 256, 1, 2)
    # cpy_k merges the streams ("the idxs are global"): [64, 2048 x 2] before SET_ROWS
    assert _tensor(g, "cache_k_l0 (reshaped)").ne == (64, 4096, 1, 1)
    # get_k: [head 32, 2 KV heads, n_kv 2048, 2 streams], nb3 = one stream (64 x 2048 x 2 B)
    view = _tensor(g, "cache_k_l0 (view)")
    assert (view.ne, view.nb[3]) == ((32, 2, 2048, 2), 64 * 2048 * 2)
    # the scores: [n_kv 2048, 256 tokens per stream, 8 heads, 2 streams] F32 = 33554432
    # bytes, the peak tensor: half of one 4096-cell stream's [4096, 512, 8] F32
    kq = _tensor(g, "kq-0")
    assert kq.ne == (2048, 256, 8, 2) and kq.nbytes == 2048 * 256 * 8 * 2 * 4
    top, size = plan_memory(llama, RunSettings(ctx_size=4096, n_seq_max=2, flash_attn="off")
                            ).worst.alloc.peak_tensors[0]
    assert (top.name, size) == ("kq-0", 33554432)


def test_unified_prompt_graph_is_one_stream(llama):
    g = plan_memory(llama, RunSettings(ctx_size=4096, n_seq_max=2, kv_unified=True)
                    ).reserve("prompt").graph
    assert _tensor(g, "cache_k_l0").ne == (64, 4096, 1, 1)
    # F16 with flash attention (-fa auto: on for the CPU), [n_kv 4096, 512, 1, 1]
    assert _tensor(g, "attn_inp_kq_mask").ne == (4096, 512, 1, 1)
    assert not any(t.name == "cache_k_l0 (reshaped)" for t in g.nodes)


def test_one_sequence_step_reads_stream_zero(llama):
    # --tokens 5 --past 300 with -np 2: one sequence in a 2-stream cache of 2048 cells;
    # n_kv = GGML_PAD(305, 256) = 512 of its stream, mask [512, 5, 1, 1]
    g = build_graph(llama, RunSettings(ctx_size=4096, n_seq_max=2, tokens=5, past=300))
    assert _tensor(g, "attn_inp_kq_mask").ne == (512, 5, 1, 1)
    assert _tensor(g, "cache_k_l0 (view)").ne == (32, 2, 512, 1)
    assert _tensor(g, "cache_k_l0").ne == (64, 2048, 2, 1)
    # a stream holds 2048 cells: --past 2044 + 5 tokens do not fit one sequence's stream
    with pytest.raises(SettingsError, match="exceed the KV stream of 2048 cells"):
        build_graph(llama, RunSettings(ctx_size=4096, n_seq_max=2, tokens=5, past=2044))


# ---- refusals --------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["memory", "-np", "257"], "--parallel 257 must be between 0 and 256"),
    (["fit", "-np", "-1", "--host-memory", "1GiB"], "--parallel -1 must be between 0 and 256"),
    (["analyze", "-np", "2", "--llama-cpp", "2024-08", "-fa", "off"],
     "modelled with one sequence only"),
], ids=["above-max", "negative", "2024-08"])
def test_impossible_values_are_one_line(cli, paths, args, message):
    r = cli(args[0], paths["llama"], *args[1:])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_mean_pooling_that_llama_cpp_aborts_is_refused(cli, paths):
    # bert (mean pooling) -np 3 -ub 512 --embeddings: the reserve ubatch has 513 tokens but
    # 512 outputs; llama.cpp aborts (GGML_ASSERT(ggml_can_mul_mat), seen with
    # llama-cpp-python 0.3.36); -ub 510 (3 x 170) works (test_memory_parity)
    r = cli("memory", paths["bert"], "-c", "512", "-b", "512", "-np", "3", "--embeddings")
    assert r.returncode == 2 and "GGML_ASSERT(ggml_can_mul_mat)" in r.stderr, r.stderr
    bert = load_model(paths["bert"])
    p = plan_memory(bert, RunSettings(ctx_size=512, batch_size=510, ubatch_size=510,
                                      n_seq_max=3, embeddings=True))
    # mean [510 tokens, 3 sequences]
    assert _tensor(p.reserve("prompt").graph, "mean").ne == (510, 3, 1, 1)


def test_recurrent_state_has_a_cell_per_sequence(cli, paths):
    """lfm2 (3 short-conv layers of 5, n_embd 160, kernel 3: n_embd_r = (3 - 1) x 160 =
    320 floats, no S state) with -np 3: rs_size = max(1, n_seq_max) = 3 cells, R = 3
    layers x 320 x 3 cells x 4 bytes; the reserve graph gathers all 3 states."""
    p = plan_memory(load_model(paths["lfm2"]), RunSettings(ctx_size=4096, n_seq_max=3))
    (st,) = p.states
    assert (st.cells, st.layers, st.r_bytes, st.s_bytes) == (3, 3, 3 * 320 * 3 * 4, 0)
    g = p.reserve("prompt").graph
    assert _tensor(g, "cache_r_l0").ne == (320, 3, 1, 1)
    assert _tensor(g, "rs_s_copy").ne == (3, 1, 1, 1)
    # build_shortconv_block (named "model.layers.{}..." as llama.cpp cbs it): in_proj of
    # {n_embd, 513 tokens} -> {3 x 160, 171 tokens, 3 sequences}
    assert _tensor(g, "model.layers.{}.conv.in_proj-0").ne == (480, 171, 3, 1)
    r = cli("fit", paths["lfm2"], "--host-memory", "1GiB", "-fitt", "0", "-np", "2")
    assert r.returncode == 0, r.stderr


# ---- the commands ----------------------------------------------------------------------

def test_memory_reports_the_streams(cli, paths):
    # -c 4096 -np 3: one KV buffer of 3 x 64 x 1536 x 3 x 2 bytes (K and V), logits of 3
    # outputs (300 x 3 x 4 bytes)
    r = cli("memory", paths["llama"], "-c", "4096", "-np", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    mem = json.loads(r.stdout)["memory"]
    assert [b["bytes"] for b in mem["kv_buffers"]] == [2 * 3 * 64 * 1536 * 3 * 2]
    assert mem["devices"][0]["output_bytes"] == 300 * 3 * 4
    r = cli("memory", paths["llama"], "-c", "4096", "-np", "3")
    assert r.returncode == 0, r.stderr
    assert "-np 3  (n_ctx 4608, n_ubatch 512)" in r.stdout
    assert "(1536 cells x 3 streams, 3 layers" in r.stdout
    assert "(logits of 3 outputs)" in r.stdout
    assert "prompt     513 tokens, 512 outputs" in r.stdout


def test_fit_decides_with_parallel_sequences(cli, paths):
    # -np 2 without a context: measured at 2 x 2048 (the training context) = 4096 cells;
    # 1 GiB of host memory (no margin) holds it, no change
    r = cli("fit", paths["llama"], "--host-memory", "1GiB", "-fitt", "0", "-np", "2")
    assert (r.returncode, r.stdout.strip().splitlines()[-1]) == (0, "-c 4096 -ngl -1"), r.stderr
    # -kvu (llama-server's --fit): one stream, so the unset context stays the training
    # context, 2048 (fit.cpp n_streams = kv_unified ? 1 : n_seq_max)
    r = cli("fit", paths["llama"], "--host-memory", "1GiB", "-fitt", "0", "-np", "2", "-kvu")
    assert (r.returncode, r.stdout.strip().splitlines()[-1]) == (0, "-c 2048 -ngl -1"), r.stderr


# ---- node for node against llama.cpp ---------------------------------------------------

STEP_CASES = [
    ("llama", {"n_ctx": 4096, "n_seq_max": 2, "tokens": 5, "past": 300}),
    ("llama", {"n_ctx": 1000, "n_seq_max": 3, "tokens": 1, "past": 10}),
    ("llama", {"n_ctx": 4096, "n_seq_max": 2, "kv_unified": True, "tokens": 5, "past": 300}),
    ("gemma3", {"n_ctx": 4096, "n_seq_max": 2, "tokens": 7, "past": 100}),
    ("deepseek2", {"n_ctx": 2048, "n_seq_max": 2, "tokens": 3, "past": 50}),
    # hybrids: the state has a cell per sequence, the ubatch uses sequence 0's
    ("lfm2", {"n_ctx": 4096, "n_seq_max": 2, "tokens": 5, "past": 0}),
    ("lfm2", {"n_ctx": 4096, "n_seq_max": 3, "tokens": 1, "past": 40}),
    ("qwen3next", {"n_ctx": 4096, "n_seq_max": 2, "tokens": 4, "past": 20}),
    ("granitehybrid", {"n_ctx": 4096, "n_seq_max": 2, "tokens": 3, "past": 0}),
]


@needs_llama_cpp
@graph_cases(STEP_CASES)
def test_one_sequence_step_equals_llama_cpp_graph(models, model, settings, fa):
    """A ubatch of sequence 0 in a context of n_seq_max sequences (capture_graph decodes
    sequence 0): the caches have every stream, cpy_k/cpy_v merge them, the views and the
    mask cover the one stream the ubatch uses; the same nodes as llama.cpp's."""
    assert_same_graph(models[model], settings, fa)


@needs_llama_cpp
def test_verify_with_parallel_sequences(cli, paths):
    """``graphcost verify -np 3``: llama.cpp runs with n_seq_max 3 (a hybrid: 3 state
    cells, 3 KV streams) and agrees, graph and buffers."""
    r = cli("verify", paths["lfm2"], "-c", "4096", "-np", "3", "--tokens", "5", "--past", "20")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "graph: equal" in r.stdout and "verdict: equal" in r.stdout


def test_max_ctx_searches_streams(cli, tmp_path):
    """``memory --max-ctx -np 2``: up to 2 x the training context (32768) in steps of
    2 x 256 cells; the answer fits the device, 512 cells more do not."""
    from graphcost.memory.placement import DeviceArg, PlacementFlags, plan_devices
    path = write_llama(tmp_path / "l32k.gguf", n_layer=5, context_length=32768).path
    r = cli("memory", path, "--device", "rpc:40MiB", "--max-ctx", "-np", "2", "-ngl", "all",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)["max_ctx"]
    assert m["searched_up_to"] == 65536 and m["max_ctx"] % 512 == 0
    assert all(t["n_ctx"] % 512 == 0 for t in m["tried"])
    model, flags = load_model(path), PlacementFlags(n_gpu_layers=-2)

    def rpc_total(n_ctx):
        dp = plan_devices(model, RunSettings(ctx_size=n_ctx, n_seq_max=2),
                          [DeviceArg("rpc", 40 * 2**20)], flags)
        (row,) = [r for r in dp.rows if r.device == "RPC0"]
        return (row.model_bytes + row.kv_bytes + row.compute_bytes + row.output_bytes)
    assert rpc_total(m["max_ctx"]) <= 40 * 2**20 < rpc_total(m["max_ctx"] + 512)
