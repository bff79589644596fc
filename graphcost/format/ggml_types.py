"""ggml tensor types: names, block sizes, row sizes, the CPU dot-product types and where
a block keeps its F16 scales. The one table of type facts: the executor and the kernels
(``kernels/quants.py``) read these instead of repeating them.

Block sizes and bytes per block come from the ``gguf`` package (``GGML_QUANT_SIZES``); the
one fact gguf-py gets wrong for ggml is Q8_1, which is 36 bytes in ggml (``block_q8_1`` in
``ggml/src/ggml-common.h``: two f16 + 32 int8) but 40 in gguf-py; Q8_1 only ever appears as
the CPU activation format of Q4_1/Q5_1 dot products, never in files.
"""
from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGMLType = GGMLQuantizationType

# ggml-common.h: static_assert(sizeof(block_q8_1) == 2*sizeof(ggml_half) + QK8_1, ...)
_BLOCK_OVERRIDES = {GGMLType.Q8_1: (32, 36)}

# ggml/src/ggml-cpu/ggml-cpu.c, type_traits_cpu[type].vec_dot_type: the format the CPU
# backend converts a matmul's activations (src1) into before the dot products.
_VEC_DOT_TYPE = {
    GGMLType.F32: GGMLType.F32,
    GGMLType.F16: GGMLType.F16,
    GGMLType.BF16: GGMLType.BF16,
    GGMLType.Q4_0: GGMLType.Q8_0,
    GGMLType.Q5_0: GGMLType.Q8_0,
    GGMLType.Q8_0: GGMLType.Q8_0,
    GGMLType.IQ4_NL: GGMLType.Q8_0,
    GGMLType.MXFP4: GGMLType.Q8_0,
    GGMLType.NVFP4: GGMLType.Q8_0,
    GGMLType.Q1_0: GGMLType.Q8_0,
    GGMLType.Q4_1: GGMLType.Q8_1,
    GGMLType.Q5_1: GGMLType.Q8_1,
    GGMLType.Q8_1: GGMLType.Q8_1,
    GGMLType.Q2_K: GGMLType.Q8_K,
    GGMLType.Q3_K: GGMLType.Q8_K,
    GGMLType.Q4_K: GGMLType.Q8_K,
    GGMLType.Q5_K: GGMLType.Q8_K,
    GGMLType.Q6_K: GGMLType.Q8_K,
    GGMLType.IQ2_XXS: GGMLType.Q8_K,
    GGMLType.IQ2_XS: GGMLType.Q8_K,
    GGMLType.IQ2_S: GGMLType.Q8_K,
    GGMLType.IQ3_XXS: GGMLType.Q8_K,
    GGMLType.IQ3_S: GGMLType.Q8_K,
    GGMLType.IQ1_S: GGMLType.Q8_K,
    GGMLType.IQ1_M: GGMLType.Q8_K,
    GGMLType.IQ4_XS: GGMLType.Q8_K,
    GGMLType.TQ1_0: GGMLType.Q8_K,
    GGMLType.TQ2_0: GGMLType.Q8_K,
}

# ggml-common.h block layouts: byte offsets of the F16 scale fields (d, and dmin or m)
# inside one block, e.g. block_q4_1 {ggml_half d; ggml_half m; uint8_t qs[16]} -> (0, 2),
# block_q2_K {uint8_t scales[16]; uint8_t qs[64]; ggml_half d; ggml_half dmin} -> (80, 82).
_F16_SCALES = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,),
    GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
}

F32 = GGMLType.F32
F16 = GGMLType.F16
I32 = GGMLType.I32
I64 = GGMLType.I64


def is_known(type_id: int) -> bool:
    """True if ``type_id`` is a ggml type gguf-py knows the block layout of."""
    try:
        return GGMLType(type_id) in GGML_QUANT_SIZES
    except ValueError:
        return False


def block(t: GGMLType) -> tuple[int, int]:
    """(elements per block, bytes per block)."""
    return _BLOCK_OVERRIDES.get(t) or GGML_QUANT_SIZES[t]


def type_name(t: GGMLType) -> str:
    """ggml's name for a type (``ggml_type_name``): lower case, but K-quants keep ``_K``."""
    name = GGMLType(t).name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


def type_from_name(name: str) -> GGMLType:
    """Parse a llama.cpp cache-type flag value (``f16``, ``q8_0``, ``Q4_K``...)."""
    key = name.strip().upper()
    try:
        t = GGMLType[key]
    except KeyError:
        raise ValueError(name) from None
    if t not in GGML_QUANT_SIZES:
        raise ValueError(name)
    return t


def is_quantized(t: GGMLType) -> bool:
    """ggml_is_quantized: a block type (not F32/F16/BF16/F64 or an integer type)."""
    return block(t)[0] > 1


def ggml_pad(x: int, n: int) -> int:
    """GGML_PAD (ggml.h): round ``x`` up to a multiple of ``n`` (cells, tokens or bytes:
    llama.cpp's n_ctx and n_kv padding, and every buffer's alignment)."""
    return (x + n - 1) // n * n


def row_size(t: GGMLType, n: int) -> int:
    """Bytes of ``n`` consecutive elements of type ``t`` (ggml_row_size); n must fill blocks."""
    blk, size = block(t)
    return size * n // blk


def type_size(t: GGMLType) -> int:
    """Bytes per block (ggml_type_size)."""
    return block(t)[1]


def f16_scale_offsets(t: GGMLType) -> tuple[int, ...]:
    """Byte offsets of the F16 scale fields inside one block of ``t`` (ggml-common.h);
    empty for types not tabled here (float types, and block types graphcost does not
    write)."""
    return _F16_SCALES.get(GGMLType(t), ())


def vec_dot_type(t: GGMLType) -> GGMLType | None:
    """The CPU activation format for a matmul with weights of type ``t`` (None: unknown)."""
    return _VEC_DOT_TYPE.get(GGMLType(t))
