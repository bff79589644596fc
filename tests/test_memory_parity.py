"""graphcost's memory plan equals what llama.cpp allocates, read from llama.cpp's own log.

For each case the JSON document (``graphcost analyze --format json``, built in-process)
and its memory plan are compared with the log of a real llama.cpp context
(graphcost/judge/oracle.py ``capture_log``) at the precision llama.cpp prints:

* ``memory.compute_buffer_bytes``: the ``CPU compute buffer size = %8.2f MiB`` line of
  sched_reserve and the ``%8.4f MiB`` DEBUG line ``~llama_context`` prints on free;
* every KV cache (``memory.kv_caches``, in creation order: base then sliding-window):
  ``KV buffer size`` and its K and V parts (``K (q8_0): x MiB, V (f16): y MiB``), the cells
  and the layers; encoders (bert) have none;
* every recurrent state (hybrid models): ``RS buffer size`` and its F32 R and S parts;
* ``memory.output_buffer_bytes``: ``output buffer size``.

The cases span -c 300..32768 (and a context that is padded), -ub 1..512, flash attention
on/off, F16, Q8_0 and Q4_0 caches (Q8_0 with head_dim 64/256 adds llama.cpp's Hadamard
rotation inputs), --swa-full on/off, embeddings on/off, on the real gemma3 270M and the
tiny models of tests/parity_models.py. The logs of the cases a run selects are captured in
parallel, once (each capture loads the model in a subprocess).
"""
from __future__ import annotations

import pytest

from graphcost.cost.analysis import analyze_graph
from graphcost.document import document
from graphcost.graph.build import build_graph, load_model
from graphcost.graph.settings import RunSettings
from graphcost.memory.plan import plan_memory
from parity import MiB, MemCase, capture_logs, memory_case_id, mib2, needs_llama_cpp, settings

pytestmark = needs_llama_cpp


CASES = [MemCase(model, **settings(text)) for model, text in [
    # ---- the real gemma3 270M; llama, gemma3, gpt-oss, deepseek2, glm4moe, ernie4_5-moe,
    # minimax-m2
    ("gemma3_270m", "n_ctx=512 n_ubatch=512"),
    ("gemma3_270m", "n_ctx=32768 n_ubatch=1"),
    ("gemma3_270m", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0 swa_full"),
    ("gemma3_270m", "n_ctx=32768 n_ubatch=512 flash_attn swa_full"),
    ("gemma3_270m", "n_ctx=4096 n_ubatch=512 type_k=q8_0"),
    ("gemma3", "n_ctx=512 n_ubatch=512"),
    ("gemma3", "n_ctx=32768 n_ubatch=512 swa_full"),
    ("gemma3", "n_ctx=32768 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("gemma3", "n_ctx=4096 n_ubatch=1 flash_attn swa_full"),
    ("gemma3", "n_ctx=1000 n_ubatch=100 type_k=q8_0"),
    ("llama", "n_ctx=512 n_ubatch=1"),
    ("llama", "n_ctx=32768 n_ubatch=512"),
    ("llama", "n_ctx=32768 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("llama", "n_ctx=4096 n_ubatch=64 flash_attn"),
    ("llama", "n_ctx=700 n_ubatch=300 type_k=q8_0"),
    ("llama64_untied", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("llama64_untied", "n_ctx=512 n_ubatch=64 type_k=q8_0"),
    # gpt-oss: sliding-window and full caches, MXFP4 experts
    ("gptoss", "n_ctx=512 n_ubatch=512"),
    ("gptoss", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("gptoss", "n_ctx=1000 n_ubatch=100 swa_full"),
    ("gptoss", "n_ctx=32768 n_ubatch=1 flash_attn"),
    ("gptoss_k3", "n_ctx=8192 n_ubatch=512 flash_attn type_k=q4_0 type_v=q4_0"),
    ("gptoss_k3", "n_ctx=700 n_ubatch=300 type_k=q8_0 swa_full"),
    # MLA (deepseek2): one K-only cache of kv_lora_rank + n_rot per cell, V 0 bytes
    ("deepseek2", "n_ctx=512 n_ubatch=512"),
    ("deepseek2", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("deepseek2", "n_ctx=32768 n_ubatch=512 flash_attn"),
    ("deepseek2", "n_ctx=700 n_ubatch=1"),
    ("deepseek2_lite_routed", "n_ctx=1000 n_ubatch=100"),
    # legacy non-MLA deepseek2 (attn_kv_b): a full K and V cache
    ("deepseek2_legacy", "n_ctx=4096 n_ubatch=512 type_k=q8_0"),
    ("deepseek2_legacy", "n_ctx=2048 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    # glm4moe with a NextN block: its cache has the 3 trunk layers, not the 4 blocks
    ("glm45", "n_ctx=512 n_ubatch=512"),
    ("glm45", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("glm45", "n_ctx=32768 n_ubatch=512 flash_attn"),
    ("glm45_qknorm_routed", "n_ctx=1000 n_ubatch=100 type_k=q8_0"),
    ("glm45_qknorm_routed", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    # architectures ernie4_5-moe and minimax-m2
    ("ernie4_5_moe", "n_ctx=2048 n_ubatch=256"),
    ("ernie4_5_moe", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("minimax", "n_ctx=512 n_ubatch=512 type_k=q8_0"),
    ("minimax", "n_ctx=32768 n_ubatch=64 flash_attn"),
    # ---- gpt2, starcoder2, falcon, phi3 (LongRoPE: long factors past 256), qwen2, qwen3,
    # olmo2, granite, qwen3moe, gemma2
    ("gpt2", "n_ctx=512 n_ubatch=512"),
    ("gpt2", "n_ctx=1024 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("starcoder2", "n_ctx=4096 n_ubatch=512 flash_attn"),
    ("falcon", "n_ctx=2048 n_ubatch=256 type_k=q8_0"),
    ("phi3", "n_ctx=1000 n_ubatch=100"),
    ("phi3", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen2", "n_ctx=4096 n_ubatch=512"),
    ("qwen3", "n_ctx=2048 n_ubatch=1 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen3", "n_ctx=8192 n_ubatch=512 type_k=q4_0"),
    ("olmo2", "n_ctx=512 n_ubatch=512"),
    ("olmo2_swa", "n_ctx=4096 n_ubatch=128 flash_attn"),
    ("olmo2_swa", "n_ctx=1000 n_ubatch=512 swa_full"),
    ("granite", "n_ctx=4096 n_ubatch=256"),
    ("qwen3moe_q4", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen3moe_q4", "n_ctx=700 n_ubatch=300"),
    ("gemma2", "n_ctx=4096 n_ubatch=512"),
    ("gemma2", "n_ctx=2048 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0 swa_full"),
    # ---- qwen2moe, olmoe, smollm3, seed_oss, glm4, exaone4 (64 layers: a base cache of
    # 16 layers and a sliding-window cache of 48), cohere2, mistral3, qwen3vl, qwen3vlmoe,
    # llama4 (chunked: a 8192-cell chunk cache beside the base cache once n_ctx exceeds it)
    ("qwen2moe", "n_ctx=512 n_ubatch=512"),
    ("qwen2moe", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("olmoe", "n_ctx=1000 n_ubatch=100 type_k=q8_0"),
    ("smollm3", "n_ctx=32768 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("smollm3", "n_ctx=512 n_ubatch=1"),
    ("seed_oss", "n_ctx=4096 n_ubatch=512"),
    ("glm4", "n_ctx=700 n_ubatch=300 flash_attn"),
    ("glm4_mrope_full", "n_ctx=4096 n_ubatch=512 type_k=q8_0"),
    ("exaone4_nofreqs", "n_ctx=512 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("exaone4_swa", "n_ctx=4096 n_ubatch=512"),
    ("exaone4_swa", "n_ctx=4096 n_ubatch=64 flash_attn swa_full"),
    ("cohere2", "n_ctx=32768 n_ubatch=512"),
    ("cohere2", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0 swa_full"),
    ("mistral3", "n_ctx=2048 n_ubatch=256"),
    ("mistral3_moe_nofreqs", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen3vl", "n_ctx=512 n_ubatch=512"),
    ("qwen3vl", "n_ctx=8192 n_ubatch=128 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen3vlmoe", "n_ctx=4096 n_ubatch=512"),
    ("llama4", "n_ctx=32768 n_ubatch=512"),
    ("llama4", "n_ctx=16384 n_ubatch=256 flash_attn type_k=q8_0 type_v=q8_0"),
    ("llama4", "n_ctx=4096 n_ubatch=512 swa_full"),
    # ---- gemma3n, gemma4: only the layers with KV have a buffer (KV sharing)
    ("gemma3n", "n_ctx=512 n_ubatch=512"),
    ("gemma3n", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("gemma3n", "n_ctx=8192 n_ubatch=1 swa_full"),
    ("shared", "n_ctx=512 n_ubatch=512"),
    ("shared", "n_ctx=32768 n_ubatch=256 flash_attn type_k=q8_0"),
    ("shared", "n_ctx=2000 n_ubatch=100 type_k=q8_0 swa_full"),
    ("gemma4", "n_ctx=512 n_ubatch=512"),
    ("gemma4", "n_ctx=4096 n_ubatch=128 flash_attn type_k=q8_0 type_v=q8_0"),
    ("gemma4", "n_ctx=16384 n_ubatch=512 type_k=q8_0 swa_full"),
    ("gemma4_fused_tied", "n_ctx=1024 n_ubatch=1 flash_attn"),
    ("gemma4_moe", "n_ctx=512 n_ubatch=512"),
    ("gemma4_moe", "n_ctx=2048 n_ubatch=96 flash_attn type_k=q8_0 type_v=q8_0"),
    # ---- bert, nomic-bert: no KV cache; with and without embeddings (pooling adds
    # mean/cls inputs and the pooled output); the output buffer: logits plus, with
    # embeddings, one n_embd row per sequence
    ("bert", "n_ctx=512 n_ubatch=512 embeddings"),
    ("bert", "n_ctx=512 n_ubatch=512 flash_attn embeddings"),
    ("bert", "n_ctx=512 n_ubatch=1 embeddings"),
    ("bert", "n_ctx=2048 n_ubatch=64 flash_attn embeddings=off"),
    ("bert", "n_ctx=300 n_ubatch=300 embeddings=off"),
    ("bert_cls_1024", "n_ctx=512 n_ubatch=128 embeddings"),
    ("bert_cls_1024", "n_ctx=1024 n_ubatch=512 flash_attn embeddings"),
    ("bert_rank", "n_ctx=512 n_ubatch=200 embeddings"),
    ("nomic", "n_ctx=2048 n_ubatch=512 embeddings"),
    ("nomic", "n_ctx=512 n_ubatch=64 flash_attn embeddings=off"),
    # ---- lfm2, lfm2moe, granitehybrid, qwen3next, qwen35, qwen35moe, nemotron_h: the KV
    # cache of the attention layers and the recurrent state
    ("lfm2", "n_ctx=512 n_ubatch=512"),
    ("lfm2", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("lfm2", "n_ctx=1000 n_ubatch=100 type_k=q8_0"),
    ("lfm2_hd64", "n_ctx=32768 n_ubatch=512 flash_attn"),
    ("lfm2_hd64", "n_ctx=2048 n_ubatch=1 type_k=q8_0"),
    ("lfm2moe", "n_ctx=2048 n_ubatch=128 flash_attn type_k=q8_0 type_v=q8_0"),
    ("granitehybrid", "n_ctx=512 n_ubatch=512"),
    ("granitehybrid", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("granitehybrid_plain", "n_ctx=1000 n_ubatch=100"),
    ("granitehybrid_moe", "n_ctx=2048 n_ubatch=256 flash_attn"),
    ("qwen3next", "n_ctx=512 n_ubatch=512"),
    ("qwen3next", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen3next_i3", "n_ctx=2048 n_ubatch=1 type_k=q8_0"),
    ("qwen35", "n_ctx=1000 n_ubatch=100 flash_attn"),
    ("qwen35moe", "n_ctx=4096 n_ubatch=512 type_k=q8_0"),
    ("qwen35moe_gate_up", "n_ctx=2048 n_ubatch=256 flash_attn"),
    ("nemotron_h", "n_ctx=512 n_ubatch=512"),
    ("nemotron_h_b", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    # ---- nemotron_h_moe
    ("nemotron_h_moe", "n_ctx=4096 n_ubatch=512"),
    ("nemotron_h_moe", "n_ctx=2048 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("nemotron_h_moe_latent", "n_ctx=1000 n_ubatch=100"),
    # ---- NextN / MTP blocks: the caches hold the trunk layers only (glm4, exaone4,
    # qwen3next, qwen35, qwen35moe, deepseek2, nemotron_h_moe)
    ("glm4_nextn", "n_ctx=700 n_ubatch=300"),
    ("exaone4_nextn", "n_ctx=512 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("exaone4_swa_nextn", "n_ctx=4096 n_ubatch=512"),
    ("qwen3next_nextn", "n_ctx=4096 n_ubatch=64 flash_attn type_k=q8_0 type_v=q8_0"),
    ("qwen35_nextn", "n_ctx=1000 n_ubatch=100"),
    ("qwen35moe_nextn", "n_ctx=2048 n_ubatch=512"),
    ("deepseek2_nextn", "n_ctx=4096 n_ubatch=256 flash_attn"),
    ("deepseek2_nextn", "n_ctx=1000 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0"),
    ("nemotron_h_moe_nextn", "n_ctx=2048 n_ubatch=256"),
    # ---- -np N (n_seq_max): N KV streams of GGML_PAD(n_ctx / N, 256) cells, reserve
    # graphs of N sequences (the prompt's tokens rounded up to a multiple of N: 513 for
    # -np 3 -ub 512), per-stream K/V views and mask [n_kv, T/N, 1, N]; -kvu: one stream of
    # n_ctx cells, N sequences in the reserve ubatch; MLA, sliding-window and KV-sharing
    # caches; encoders (no cache: mean/cls over N sequences); -np 0 is -np 1
    ("llama", "n_ctx=512 n_ubatch=512 n_seq_max=2"),
    ("llama", "n_ctx=4096 n_ubatch=512 n_seq_max=3"),
    ("llama", "n_ctx=1000 n_ubatch=100 flash_attn n_seq_max=3"),
    ("llama", "n_ctx=4096 n_ubatch=512 flash_attn type_k=q8_0 type_v=q8_0 n_seq_max=2"),
    ("llama", "n_ctx=4096 n_ubatch=512 n_seq_max=2 kv_unified"),
    ("llama", "n_ctx=700 n_ubatch=300 n_seq_max=0"),
    ("llama", "n_ctx=1000 n_ubatch=512 n_batch=2048 flash_attn n_seq_max=3"),
    ("gemma3", "n_ctx=4096 n_ubatch=512 flash_attn n_seq_max=2"),
    ("gemma3", "n_ctx=4096 n_ubatch=512 n_seq_max=3 kv_unified"),
    ("gptoss", "n_ctx=4096 n_ubatch=512 flash_attn n_seq_max=2"),
    ("deepseek2", "n_ctx=4096 n_ubatch=512 flash_attn n_seq_max=2"),
    ("deepseek2", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("gemma3n", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("bert", "n_ctx=512 n_ubatch=512 embeddings n_seq_max=2"),
    ("bert", "n_ctx=512 n_ubatch=510 embeddings n_seq_max=3"),
    ("bert_cls_1024", "n_ctx=512 n_ubatch=512 embeddings n_seq_max=3"),
    # hybrids: one recurrent state cell per sequence (rs_size = n_seq_max), every recurrent
    # statement over the reserve ubatch's N sequences of T / N tokens
    ("lfm2", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("lfm2", "n_ctx=4096 n_ubatch=512 flash_attn n_seq_max=3"),
    ("lfm2", "n_ctx=4096 n_ubatch=512 n_seq_max=2 kv_unified"),
    ("lfm2moe", "n_ctx=2048 n_ubatch=128 n_seq_max=3"),
    ("granitehybrid", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("granitehybrid", "n_ctx=4096 n_ubatch=512 flash_attn n_seq_max=3"),
    ("nemotron_h", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("qwen3next", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("qwen3next", "n_ctx=4096 n_ubatch=512 flash_attn n_seq_max=3"),
    ("qwen35", "n_ctx=4096 n_ubatch=512 n_seq_max=2"),
    ("qwen35moe", "n_ctx=4096 n_ubatch=512 n_seq_max=2 kv_unified"),
    # ---- -c below the ubatch: n_batch = min(n_ctx as given, -b), n_ubatch = min(n_batch,
    # -ub) before n_ctx is padded (llama_context constructor): -c 300 -b 2048 -ub 512
    # reserves a prompt of 300 tokens; an encoder's (non-causal) n_batch is not clamped
    ("llama", "n_ctx=300 n_ubatch=512 n_batch=2048"),
    ("gemma3_270m", "n_ctx=300 n_ubatch=512 n_batch=2048"),
    ("bert", "n_ctx=300 n_ubatch=512 n_batch=2048 embeddings"),
]]

#: the layers each KV cache holds (base, then sliding-window) and those of each recurrent
#: state, where a family's structure decides them: a guard against a pass in which our
#: plan and the parsed log would both miss a buffer
HOLDS = {
    # encoders: no memory module at all
    "bert": ([], []), "bert_cls_1024": ([], []), "bert_rank": ([], []), "nomic": ([], []),
    # gemma3n: 5 sliding layers and 1 global; 25 layers, of which 20 with KV: 4 global in
    # the base cache, 16 sliding (the other 5 reuse them)
    "gemma3n": ([1, 5], []), "shared": ([4, 16], []),
    # gemma4: layer 3 in the base cache, 0..2 sliding (4..6 reuse them); full layer first
    "gemma4": ([1, 3], []), "gemma4_moe": ([1, 3], []), "gemma4_fused_tied": ([1, 3], []),
    # conv, conv, attn, conv, attn / attn, conv, conv, attn
    "lfm2": ([2], [3]), "lfm2moe": ([2], [3]), "lfm2_hd64": ([2], [2]),
    # mamba2, attn, mamba2, mamba2 / attn, mamba2, attn, mamba2, mamba2
    "granitehybrid": ([1], [3]), "granitehybrid_moe": ([1], [3]),
    "granitehybrid_plain": ([2], [3]),
    # attention every 4th layer (3 of 4 delta net), every 3rd of 5, every 2nd of 4
    "qwen3next": ([1], [3]), "qwen35moe_gate_up": ([1], [3]), "qwen3next_i3": ([1], [4]),
    "qwen35": ([1], [4]), "qwen35moe": ([2], [2]),
    # the attention layers (*) in the KV cache, the Mamba-2 layers (M) in the state:
    # M-M*-M, *M-M-*, MEM*EM, *EMME
    "nemotron_h": ([1], [3]), "nemotron_h_b": ([2], [2]), "nemotron_h_moe": ([1], [3]),
    "nemotron_h_moe_latent": ([1], [2]),
}


@pytest.fixture(scope="module")
def logs(request, models):
    """llama.cpp's parsed log of every case this run selected, by case id."""
    chosen = [it.callspec.params["case"] for it in request.session.items
              if it.module is request.module
              and it.originalname == "test_memory_matches_llama_cpp_log"]
    paths = {}
    for m in {c.model for c in chosen}:
        try:
            paths[m] = models[m]
        except pytest.skip.Exception:  # the real gemma3 270M is not installed
            pass
    return capture_logs(paths, [c for c in chosen if c.model in paths])


@pytest.mark.parametrize("case", CASES, ids=map(memory_case_id, CASES))
def test_memory_matches_llama_cpp_log(models, logs, case):
    path = models[case.model]
    log = logs[memory_case_id(case)]
    a = analyze_graph(build_graph(load_model(path), case.run_settings()), memory=True)
    mem, plan = document(a)["memory"], a.memory
    # compute buffer: the INFO line (2 decimals) and the DEBUG line at free (4 decimals)
    assert mib2(mem["compute_buffer_bytes"]) == log["compute_buffer_mib"]
    (exact,) = log["compute_buffer_exact"]
    assert f"{mem['compute_buffer_bytes'] / MiB:.4f}" == f"{exact['mib']:.4f}"
    # the buffer is the larger of the prompt and generation reserve graphs; the prompt
    # graph has min(n_ctx, n_ubatch) tokens, all of them outputs
    assert mem["compute_buffer_bytes"] == max(g["buffer_bytes"] for g in mem["reserve_graphs"])
    # the prompt graph has min(n_ctx, n_ubatch) outputs, its tokens rounded up to a
    # multiple of the reserve ubatch's n_seq_max sequences
    prompt = plan.reserve("prompt")
    n = min(plan.run.n_ctx, plan.run.n_ubatch)
    assert (prompt.n_tokens, prompt.n_outputs) == (-(-n // plan.run.n_seq_max)
                                                   * plan.run.n_seq_max, n)
    # sched_reserve's last three graph_reserve lines (prompt, generation, prompt) log the
    # sequences and outputs (and the tokens before rounding)
    seqs = plan.run.n_seq_max
    assert [(g["n_tokens"], g["n_seqs"], g["n_outputs"]) for g in log["reserve_graphs"][-3:]] \
        == [(n, seqs, n), (seqs, seqs, seqs), (n, seqs, n)]
    # KV caches, one by one (base, then sliding-window): cells, layers, types, K and V
    assert len(mem["kv_caches"]) == len(plan.caches) == len(log["kv_caches"])
    for ours, part, theirs in zip(mem["kv_caches"], plan.caches, log["kv_caches"]):
        assert (ours["cells"], ours["layers"]) == (theirs["cells"], theirs["layers"])
        assert (plan.run.n_seq_max, plan.run.n_stream) == (theirs["seqs"], theirs["n_stream"])
        assert (part.type_k, part.type_v) == (theirs["type_k"], theirs["type_v"])
        assert (mib2(part.k_bytes), mib2(part.v_bytes)) == (theirs["k_mib"], theirs["v_mib"])
        assert mib2(ours["bytes"]) == theirs["buffer_mib"]
    assert mem["kv_cache_bytes"] == sum(c["bytes"] for c in mem["kv_caches"])
    # recurrent states (hybrid models): one cell per sequence, F32 R and S buffers
    assert len(mem["recurrent_states"]) == len(log["recurrent_states"])
    for ours, theirs in zip(mem["recurrent_states"], log["recurrent_states"]):
        assert ours["cells"] == theirs["cells"] == plan.run.n_seq_max == theirs["seqs"]
        assert (theirs["type_r"], theirs["type_s"]) == ("f32", "f32")
        assert (mib2(ours["r_bytes"]), mib2(ours["s_bytes"])) == (theirs["r_mib"], theirs["s_mib"])
        assert mib2(ours["r_bytes"] + ours["s_bytes"]) == theirs["buffer_mib"]
    assert mem["recurrent_state_bytes"] == sum(s["r_bytes"] + s["s_bytes"]
                                               for s in mem["recurrent_states"])
    if case.model in HOLDS:
        assert ([c["layers"] for c in mem["kv_caches"]],
                [s["layers"] for s in mem["recurrent_states"]]) == HOLDS[case.model]
    assert mib2(mem["output_buffer_bytes"]) == log["output_buffer_mib"]


def test_mla_cache_is_k_only(models):
    """deepseek2's cache holds K rows of kv_lora_rank + n_rot and no V:
    3 layers x (96 + 32) x 512 cells x 2 bytes (F16) = 393216 bytes."""
    plan = plan_memory(load_model(models["deepseek2"]),
                       RunSettings(ctx_size=512, flash_attn="off"))
    (c,) = plan.caches
    assert (c.k_bytes, c.v_bytes) == (3 * (96 + 32) * 512 * 2, 0)
