#!/usr/bin/env python3
"""Write the header-only example GGUF files used by graphcost's tests and docs.

Usage:  python examples/make_examples.py [outdir]     (default: this folder)

Each file is a genuine GGUF v3 header -- magic, version, counts, the full
metadata KV section and the full tensor-info section (names, ggml `ne` shapes,
ggml types and aligned data offsets exactly as gguf.GGUFWriter / llama-quantize
lay them out) followed by the alignment padding -- but it stops there: the
tensor data section is absent, so the files are a few KB instead of GB.

Nothing in the files marks them as header-only; they carry only keys a real
converter + llama-quantize would write.  The tokenizer arrays are left out
(only `tokenizer.ggml.model` is kept); `<arch>.vocab_size` carries the vocab size.

Where the per-tensor types come from
------------------------------------
The per-tensor ggml types are chosen by `select_types()`, a faithful port of
the parts of llama.cpp's `llama_tensor_get_type()` that the two file types used
here (LLAMA_FTYPE_MOSTLY_Q4_0 and LLAMA_FTYPE_MOSTLY_Q4_K_M) touch.  Source:
llama.cpp src/llama-quant.cpp, as vendored in llama-cpp-python 0.3.36
(vendor/llama.cpp/src/llama-quant.cpp):
  * tensor_allows_quantization()      -- only >=2-D tensors named *weight and not
                                         *_norm.weight are quantized;
  * tensor_get_category()             -- name -> category;
  * llama_tensor_get_type_impl()      -- the Q4_K_M mix (use_more_bits rule for
                                         attn_v / ffn_down, output/tied-embedding
                                         -> Q6_K);
  * tensor_type_fallback()            -- ne[0] not a multiple of the block size;
  * init_quantize_state_counters()    -- n_attention_wv, has_tied_embeddings;
  * llama_model_loader::weights_map   -- tensors are visited (and written) in
    (weight_name_comparer, llama-model-loader.h) order: non-block tensors
    first, then blk.0.*, blk.1.*, ..., each group sorted by name.
The port reproduces every tensor type of a real gemma3 Q4_K_M file
(gemma-3-270m-q4_k_m.gguf, including its shape fallbacks); see README.md.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as FT

# --------------------------------------------------------------------------------------
# llama-quant.cpp port
# --------------------------------------------------------------------------------------


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    # llama-quant.cpp, llama_tensor_get_type_impl():
    #   return i_layer < n_layers/8 || i_layer >= 7*n_layers/8 || (i_layer - n_layers/8)%3 == 2;
    # C++ integer division truncates toward zero and % keeps the dividend's sign;
    # n_layers >= 0 so `//` matches, and the `%` term is only reached when
    # i_layer >= n_layers/8 (non-negative), where Python and C agree.
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def tensor_category(name: str) -> str:
    # llama-quant.cpp, tensor_get_category()
    if name == "output.weight":
        return "OUTPUT"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "TOKEN_EMBD"
    for needle, cat in (("attn_qkv.weight", "ATTENTION_QKV"), ("attn_kv_b.weight", "ATTENTION_KV_B"),
                        ("attn_v.weight", "ATTENTION_V"), ("attn_k.weight", "ATTENTION_K"),
                        ("attn_q.weight", "ATTENTION_Q"), ("attn_output.weight", "ATTENTION_OUTPUT"),
                        ("ffn_up", "FFN_UP"), ("ffn_gate", "FFN_GATE"), ("ffn_down", "FFN_DOWN")):
        if needle in name:
            return cat
    return "OTHER"


def allows_quantization(name: str, ne: tuple[int, ...]) -> bool:
    # llama-quant.cpp, tensor_allows_quantization(): the checks relevant to llama/gemma3
    return (len(ne) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name)


def fallback(ne0: int, t: T) -> T:
    # llama-quant.cpp, tensor_type_fallback(): a row length that is not a multiple
    # of the block size demotes to a 32-block type, or F16 if even that does not fit.
    blk = gguf.GGML_QUANT_SIZES[t][0]
    if ne0 % blk == 0:
        return t
    new = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}.get(t)
    if new is None:
        if blk > 32:
            raise ValueError(f"no fallback for {t.name}")
        new = t
    if ne0 % gguf.GGML_QUANT_SIZES[new][0] != 0:
        new = T.F16
    return new


def select_types(tensors: list[tuple[str, tuple[int, ...], T]], ftype: FT, n_layer: int) -> list[T]:
    """Port of llama_tensor_get_type() for ftype in {MOSTLY_Q4_0, MOSTLY_Q4_K_M}.

    `tensors` is [(name, ne, source_type)] in weights_map order; returns the
    quantized type of each.  Dense (n_expert <= 1) models, no imatrix, no
    --tensor-type / --token-embedding-type / --output-tensor-type overrides.
    """
    default = {FT.MOSTLY_Q4_0: T.Q4_0, FT.MOSTLY_Q4_K_M: T.Q4_K}[ftype]  # llama_ftype_get_default_type()
    cats = [tensor_category(n) for n, _, _ in tensors]
    # init_quantize_state_counters()
    n_attention_wv = sum(c in ("ATTENTION_V", "ATTENTION_QKV", "ATTENTION_KV_B") for c in cats)
    has_tied_embeddings = "OUTPUT" not in cats
    n_ffn_down = n_layer                     # qs.n_ffn_down = hparams.n_layer_all
    i_attention_wv = i_ffn_down = 0

    out = []
    for (name, ne, src), cat in zip(tensors, cats):
        if not allows_quantization(name, ne):
            out.append(src)
            continue
        t = default
        if cat == "OUTPUT" or (has_tied_embeddings and cat == "TOKEN_EMBD"):
            # output (or a token_embd that doubles as output): Q8_0 if ne[0] is not a
            # multiple of the default type's block size, else Q6_K (unless already Q8_0)
            if ne[0] % gguf.GGML_QUANT_SIZES[t][0] != 0:
                t = T.Q8_0
            elif t != T.Q8_0:
                t = T.Q6_K
        elif cat == "TOKEN_EMBD":
            pass                               # Q4_0 / Q4_K_M keep the default type
        elif cat in ("ATTENTION_V", "ATTENTION_QKV", "ATTENTION_KV_B"):
            if ftype == FT.MOSTLY_Q4_K_M and use_more_bits(i_attention_wv, n_attention_wv):
                t = T.Q6_K
            # (the LLM_TYPE_70B bump to Q5_K only hits Q3_K/Q4_K on 80-layer llamas)
            i_attention_wv += 1
        elif cat == "FFN_DOWN":
            # layer_info(): with n_expert <= 1 the layer is the running counter
            if ftype == FT.MOSTLY_Q4_K_M and use_more_bits(i_ffn_down, n_ffn_down):
                t = T.Q6_K
            i_ffn_down += 1
        # ATTENTION_K / ATTENTION_Q / ATTENTION_OUTPUT / FFN_GATE / FFN_UP: no change
        # for Q4_0 or Q4_K_M on a dense model.  (The C++ has a separate ATTENTION_QKV
        # -> Q5_K branch, but category_is_attn_v() catches QKV first.)
        out.append(fallback(ne[0], t))
    return out


def weights_map_order(names: list[str]) -> list[str]:
    # llama_model_loader::weight_name_comparer: (layer index or -1, name)
    def key(n: str):
        layer = int(n.split(".")[1]) if n.startswith("blk.") else -1
        return (layer, n.encode())
    return sorted(names, key=key)


def nbytes(ne: tuple[int, ...], t: T) -> int:
    blk, size = gguf.GGML_QUANT_SIZES[t]
    assert ne[0] % blk == 0, (ne, t)
    n = ne[0] // blk * size
    for d in ne[1:]:
        n *= d
    return n


# --------------------------------------------------------------------------------------
# model descriptions
# --------------------------------------------------------------------------------------


@dataclass
class Model:
    filename: str
    arch: str
    ftype: FT
    general: list[tuple[str, str]]          # general.* string keys, in converter order
    hp: dict
    arch_kv: list[tuple[str, str, object]]  # (suffix, value kind, value), written as <arch>.<suffix>
    tokenizer_model: str
    tensors: list[tuple[str, tuple[int, ...], T]] = field(default_factory=list)  # (name, ne, source type)


def _shapes(hp: dict) -> dict[str, tuple[int, ...]]:
    """ggml ne of each tensor kind, as llama.cpp's loaders create them (src/models/llama.cpp,
    gemma3.cpp: tok_embd {n_embd, n_vocab}, wq {n_embd, n_head*hd}, wk/wv {n_embd,
    n_head_kv*hd}, wo {n_head*hd, n_embd}, ffn_gate/up {n_embd, n_ff}, ffn_down {n_ff,
    n_embd}, norms {n_embd} or per head {hd}); convert_hf_to_gguf's llama3 rope scaling is
    the F32 ``rope_freqs`` of head_dim/2 per-frequency factors."""
    E, V, F, hd = hp["n_embd"], hp["n_vocab"], hp["n_ff"], hp["head_dim"]
    q, kv = hp["n_head"] * hd, hp["n_head_kv"] * hd
    return {"token_embd": (E, V), "output": (E, V), "rope_freqs": (hd // 2,),
            "attn_q": (E, q), "attn_k": (E, kv), "attn_v": (E, kv), "attn_output": (q, E),
            "ffn_gate": (E, F), "ffn_up": (E, F), "ffn_down": (F, E),
            "attn_q_norm": (hd,), "attn_k_norm": (hd,), "output_norm": (E,), "attn_norm": (E,),
            "post_attention_norm": (E,), "ffn_norm": (E,), "post_ffw_norm": (E,)}


#: a block's tensors per family, in load_arch_tensors() order; gemma3's names checked
#: against a real gemma3 GGUF (see README)
LLAMA_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
               "ffn_gate", "ffn_up", "ffn_down")
GEMMA3_BLOCK = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                "attn_k_norm", "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
                "ffn_down", "post_ffw_norm")


def model_tensors(hp: dict, top: tuple[str, ...], block: tuple[str, ...],
                  ) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, ne, converter source type) of the non-block tensors ``top``, then
    ``n_layer`` blocks of ``block``; the converter writes 2-D weights BF16/F16, 1-D F32."""
    ne = _shapes(hp)

    def entry(name: str, kind: str) -> tuple[str, tuple[int, ...], T]:
        return f"{name}.weight", ne[kind], T.F16 if len(ne[kind]) == 2 else T.F32

    return ([entry(kind, kind) for kind in top]
            + [entry(f"blk.{i}.{kind}", kind) for i in range(hp["n_layer"]) for kind in block])


def llama_tensors(hp: dict) -> list[tuple[str, tuple[int, ...], T]]:
    """llama: untied output, ``rope_freqs`` where the model has llama3 rope scaling."""
    top = ("token_embd", "output_norm", "output") + (("rope_freqs",) if hp.get("rope_freqs") else ())
    return model_tensors(hp, top, LLAMA_BLOCK)


def gemma3_tensors(hp: dict) -> list[tuple[str, tuple[int, ...], T]]:
    """gemma3: tied embeddings (no output.weight)."""
    return model_tensors(hp, ("token_embd", "output_norm"), GEMMA3_BLOCK)


#: <arch>.<suffix> keys: (value kind, the hyperparameter written)
ARCH_KEYS: dict[str, tuple[str, str]] = {
    "block_count": ("u32", "n_layer"), "context_length": ("u32", "n_ctx_train"),
    "embedding_length": ("u32", "n_embd"), "feed_forward_length": ("u32", "n_ff"),
    "attention.head_count": ("u32", "n_head"), "attention.head_count_kv": ("u32", "n_head_kv"),
    "attention.key_length": ("u32", "head_dim"), "attention.value_length": ("u32", "head_dim"),
    "rope.dimension_count": ("u32", "head_dim"), "rope.freq_base": ("f32", "rope_theta"),
    "attention.layer_norm_rms_epsilon": ("f32", "rms_eps"), "vocab_size": ("u32", "n_vocab"),
    "attention.sliding_window": ("u32", "sliding_window"),
    "rope.scaling.type": ("str", "rope_scaling_type"),
    "rope.scaling.factor": ("f32", "rope_scaling_factor"),
}

#: key order as convert_hf_to_gguf.py writes it for LlamaForCausalLM / MistralForCausalLM:
#: TextModel.set_gguf_parameters() then LlamaModel's vocab_size and rope.dimension_count
LLAMA_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
              "attention.head_count", "attention.head_count_kv", "rope.freq_base",
              "attention.layer_norm_rms_epsilon", "vocab_size", "rope.dimension_count")
#: key set and order as in a real gemma3 GGUF (Gemma3Model.set_gguf_parameters(); compared
#: with gemma-3-270m-q4_k_m.gguf), plus the linear rope-scaling pair that the converter
#: writes when config.json has rope_scaling
GEMMA3_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
               "attention.head_count", "attention.layer_norm_rms_epsilon",
               "attention.key_length", "attention.value_length", "rope.freq_base",
               "attention.sliding_window", "attention.head_count_kv", "rope.scaling.type",
               "rope.scaling.factor", "vocab_size")


def arch_kv(hp: dict, keys: tuple[str, ...]) -> list[tuple[str, str, object]]:
    """(suffix, value kind, value) of ``keys`` from the hyperparameters."""
    return [(k, ARCH_KEYS[k][0], hp[ARCH_KEYS[k][1]]) for k in keys]


#: our hyperparameter names <- config.json's (text_config's for gemma3); head_dim, where a
#: config has none, is hidden_size / num_attention_heads
CONFIG_NAMES = {"n_layer": "num_hidden_layers", "n_embd": "hidden_size",
                "n_head": "num_attention_heads", "n_head_kv": "num_key_value_heads",
                "head_dim": "head_dim", "n_ff": "intermediate_size", "n_vocab": "vocab_size",
                "n_ctx_train": "max_position_embeddings", "rope_theta": "rope_theta",
                "rms_eps": "rms_norm_eps", "sliding_window": "sliding_window"}


def hparams(config: dict, **extra) -> dict:
    """Our hyperparameters from a config.json excerpt (names as in :data:`CONFIG_NAMES`),
    plus ``extra`` (what the converter derives from other config keys)."""
    hp = {ours: config[theirs] for ours, theirs in CONFIG_NAMES.items() if theirs in config}
    hp.setdefault("head_dim", hp["n_embd"] // hp["n_head"])
    return {**hp, **extra}


MODELS: list[Model] = []

# a. Mistral-Large-Instruct-2407, Q4_0 -------------------------------------------------
# Hyperparameters: https://huggingface.co/mistralai/Mistral-Large-Instruct-2407/blob/main/config.json
#   (MistralForCausalLM; no head_dim key: 12288 / 96 = 128; vocab_size: the Mistral v3
#   tokenizer; no rope_scaling).
_hp = hparams({"num_hidden_layers": 88, "hidden_size": 12288, "num_attention_heads": 96,
               "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32768,
               "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5})
MODELS.append(Model(
    filename="mistral-large-2407-q4_0.gguf",
    arch="llama",           # convert_hf_to_gguf maps MistralForCausalLM to LlamaModel (arch "llama")
    ftype=FT.MOSTLY_Q4_0,   # llama-quantize Q4_0: every 2-D weight Q4_0 except output.weight -> Q6_K
    general=[("type", "model"), ("name", "Mistral Large Instruct 2407"), ("version", "2407"),
             ("finetune", "Instruct"), ("basename", "Mistral-Large"), ("size_label", "123B"),
             ("license", "other")],
    hp=_hp,
    arch_kv=arch_kv(_hp, LLAMA_KEYS),
    tokenizer_model="llama",  # SentencePiece tokenizer.model -> "llama"
    tensors=llama_tensors(_hp),
))

# b. Meta-Llama-3.1-8B-Instruct, Q4_K_M ------------------------------------------------
# Hyperparameters: https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
#   (no head_dim key: 4096 / 32 = 128).  rope_scaling = {rope_type: llama3, factor: 8.0,
#   low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 8192}:
#   the converter writes no rope.scaling.* keys for "llama3"; it emits rope_freqs.weight.
_hp = hparams({"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
               "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5},
              rope_freqs=True)
MODELS.append(Model(
    filename="llama-3.1-8b-instruct-q4_k_m.gguf",
    arch="llama",
    ftype=FT.MOSTLY_Q4_K_M,  # llama-quantize Q4_K_M mix: see select_types()
    general=[("type", "model"), ("name", "Meta Llama 3.1 8B Instruct"), ("finetune", "Instruct"),
             ("basename", "Meta-Llama-3.1"), ("size_label", "8B"), ("license", "llama3.1")],
    hp=_hp,
    arch_kv=arch_kv(_hp, LLAMA_KEYS),
    tokenizer_model="gpt2",  # tiktoken BPE -> "gpt2"
    tensors=llama_tensors(_hp),
))

# c. gemma-3-4b-it, Q4_K_M (text model only; the vision tower goes to a separate mmproj) -
# Hyperparameters: https://huggingface.co/google/gemma-3-4b-it/blob/main/config.json
#   (text_config; head_dim 256: 8 * 256 = 2048 != 2560, hence the key/value_length keys;
#   rope_theta is the global layers', local layers use 10000; rope_scaling = {rope_type:
#   linear, factor: 8.0}).
_hp = hparams({"num_hidden_layers": 34, "hidden_size": 2560, "num_attention_heads": 8,
               "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 10240,
               "vocab_size": 262208, "max_position_embeddings": 131072,
               "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "sliding_window": 1024},
              rope_scaling_type="linear", rope_scaling_factor=8.0)
MODELS.append(Model(
    filename="gemma-3-4b-it-q4_k_m.gguf",
    arch="gemma3",
    ftype=FT.MOSTLY_Q4_K_M,  # tied embeddings: token_embd gets the output treatment (Q6_K)
    general=[("type", "model"), ("name", "Gemma 3 4b It"), ("finetune", "it"),
             ("basename", "gemma-3"), ("size_label", "4B"), ("license", "gemma")],
    hp=_hp,
    arch_kv=arch_kv(_hp, GEMMA3_KEYS),
    tokenizer_model="llama",
    tensors=gemma3_tensors(_hp),
))
del _hp


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------


def quantized_tensors(m: Model) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, ne, type) in the order llama-quantize writes them."""
    by_name = {n: (n, ne, src) for n, ne, src in m.tensors}
    ordered = [by_name[n] for n in weights_map_order(list(by_name))]
    types = select_types(ordered, m.ftype, m.hp["n_layer"])
    return [(n, ne, t) for (n, ne, _), t in zip(ordered, types)]


def write_model(m: Model, outdir: Path) -> Path:
    path = outdir / m.filename
    w = gguf.GGUFWriter(path, m.arch)  # adds general.architecture first
    for k, v in m.general:
        w.add_string(f"general.{k}", v)
    for suffix, kind, v in m.arch_kv:
        key = f"{m.arch}.{suffix}"
        {"u32": w.add_uint32, "f32": w.add_float32, "str": w.add_string}[kind](key, v)
    w.add_tokenizer_model(m.tokenizer_model)
    # llama-quantize (gguf_set_val_*) appends these two last, as in real quantized files
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(int(m.ftype))

    for name, ne, t in quantized_tensors(m):
        # GGUFWriter takes numpy order (slowest dim first) and reverses it on
        # write, so pass reversed(ne) to get ggml ne order in the file.  A
        # non-uint8 dtype together with raw_dtype keeps the shape as given.
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nbytes(ne, t), raw_dtype=t)

    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    # the padding GGUFWriter.write_tensors_to_file() puts before the data section;
    # the file then ends exactly where tensor data would start
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    w.close()
    return path


def main(argv: list[str]) -> int:
    outdir = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent
    outdir.mkdir(parents=True, exist_ok=True)
    for m in MODELS:
        p = write_model(m, outdir)
        qt = quantized_tensors(m)
        n_params = sum(int(np.prod(ne)) for _, ne, _ in qt)
        n_bytes = sum(nbytes(ne, t) for _, ne, t in qt)
        print(f"{p}: {os.path.getsize(p)} bytes, {len(qt)} tensors, "
              f"{n_params} params, {n_bytes} weight bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
