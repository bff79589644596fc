"""Scalar helpers the kernels build on: F16/BF16 conversions, byte arithmetic, float bits.

Numba has no float16 type on the CPU, so F16 data travels as ``uint16`` and is
converted here with LLVM's ``half`` type: ``fpext`` (exact) and ``fptrunc`` (round to
nearest even, like F16C's ``vcvtps2ph`` that ggml's ``GGML_CPU_FP32_TO_FP16`` uses on
x86). In vectorised loops LLVM turns these into ``vcvtph2ps`` / ``vcvtps2ph``.

BF16 follows ``ggml_compute_fp32_to_bf16`` / ``ggml_compute_bf16_to_fp32``
(ggml-impl.h): round to nearest even, NaNs forced quiet.

The numpy references are the numpy casts themselves (``astype(np.float16)``), which
round the same way.

Byte arithmetic (``b_and``, ``b_shr``, ... , ``b_f32``): numba widens every integer
operation to 64 bits, and LLVM then converts nibbles to float with 64-bit lanes
(``vcvtqq2ps``, 8 values per instruction). These intrinsics keep quantized fields
in ``i8`` until the final ``uitofp``/``sitofp``, so a block of nibbles is split with
one 16-byte instruction and widened straight to 32-bit lanes. Measured on Q4_0
matrix-vector: 2x faster.

:func:`prefer_512bit` sets LLVM's ``prefer-vector-width=512`` on the function it is
called from. LLVM defaults to 256-bit vectors on Intel server cores; the weight
decoders are instruction-bound, and 512-bit registers halve their instruction count
(measured 1.6x on Q4_0). Harmless without AVX-512 (the widest legal vector is used).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from numba.np.arrayobj import make_array, populate_array


@intrinsic
def f16_to_f32(typingctx, h):
    """uint16 holding an IEEE half -> float32 (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def f32_to_f16(typingctx, f):
    """float32 -> uint16 bits of the nearest half (ties to even, overflow to inf)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return sig, codegen


@intrinsic
def f32_bits(typingctx, f):
    """float32 -> its uint32 bit pattern."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def bits_f32(typingctx, u):
    """uint32 bit pattern -> float32."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def _int(builder, v, width):
    """An integer LLVM value truncated or zero-extended to ``width`` bits."""
    if v.type.width > width:
        return builder.trunc(v, ir.IntType(width))
    if v.type.width < width:
        return builder.zext(v, ir.IntType(width))
    return v


def _byte_op(name: str, op: str):
    def impl(typingctx, a, b):
        sig = types.uint8(types.uint8, b)

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], _int(builder, args[1], 8))

        return sig, codegen

    impl.__name__ = name
    return intrinsic(impl)


#: uint8 a & b, a | b, a >> b (logical), a << b, a - b: in 8 bits (b is truncated)
b_and = _byte_op("b_and", "and_")
b_or = _byte_op("b_or", "or_")
b_shr = _byte_op("b_shr", "lshr")
b_shl = _byte_op("b_shl", "shl")
b_sub = _byte_op("b_sub", "sub")


@intrinsic
def b_test(typingctx, a, m):
    """uint8 0xFF where ``a & m`` is non-zero, else 0 (a byte mask, no shift needed)."""
    sig = types.uint8(types.uint8, m)

    def codegen(context, builder, signature, args):
        t = builder.and_(args[0], _int(builder, args[1], 8))
        nz = builder.icmp_unsigned("!=", t, ir.Constant(ir.IntType(8), 0))
        return builder.sext(nz, ir.IntType(8))

    return sig, codegen


@intrinsic
def b_f32(typingctx, a):
    """uint8 -> float32, read as unsigned."""
    sig = types.float32(types.uint8)

    def codegen(context, builder, signature, args):
        return builder.uitofp(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def sb_f32(typingctx, a):
    """uint8 -> float32, read as a signed int8."""
    sig = types.float32(types.uint8)

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def u32_bit(typingctx, word, i):
    """Bit ``i`` (0..31) of a uint32, as uint8 0/1 (computed in 32 bits)."""
    sig = types.uint8(types.uint32, i)

    def codegen(context, builder, signature, args):
        sh = _int(builder, args[1], 32)
        bit = builder.and_(builder.lshr(args[0], sh), ir.Constant(ir.IntType(32), 1))
        return builder.trunc(bit, ir.IntType(8))

    return sig, codegen


@intrinsic
def u32_bit_f32(typingctx, word, i):
    """Bit ``i`` (0..31) of a uint32 as float32 0.0/1.0 (computed in 32-bit lanes)."""
    sig = types.float32(types.uint32, i)

    def codegen(context, builder, signature, args):
        bit = builder.and_(builder.lshr(args[0], _int(builder, args[1], 32)),
                           ir.Constant(ir.IntType(32), 1))
        return builder.uitofp(bit, ir.FloatType())

    return sig, codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a*b + c in float32 with a single rounding (llvm.fma: what ggml's SIMD FMAs do)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@intrinsic
def out_of_line(typingctx):
    """Mark the enclosing LLVM function ``noinline``.

    Numba links a callee's IR into every caller and LLVM then inlines and re-optimizes
    it there; a kernel dispatching to 13 per-type functions paid ~15-40 s of compile
    time for that. Out-of-line, each per-type function is optimized once and called
    once per row (the call costs nothing next to a row of work).
    """
    sig = types.none()

    def codegen(context, builder, signature, args):
        builder.function.attributes.add("noinline")
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefer_512bit(typingctx):
    """Mark the enclosing LLVM function ``"prefer-vector-width"="512"`` (see module doc)."""
    sig = types.none()

    def codegen(context, builder, signature, args):
        # llvmlite only validates enum attributes; a string attribute prints verbatim
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def stack_f32(typingctx, n):
    """A float32[n] array in the calling function's stack frame (``n`` a literal int).

    For small accumulators: unlike ``np.empty`` (heap, may alias any other array as
    far as LLVM knows) a stack slot provably aliases nothing, so LLVM keeps it in
    registers across a loop instead of storing and reloading it every iteration
    (measured 1.7x on Q8_0). The array must not outlive the function: never return
    it or store it anywhere.
    """
    if not isinstance(n, types.IntegerLiteral):
        return None
    arrty = types.Array(types.float32, 1, "C")
    size = n.literal_value

    def codegen(context, builder, signature, args):
        with builder.goto_entry_block():       # one slot per call site, not per iteration
            slot = builder.alloca(ir.ArrayType(ir.FloatType(), size))
        intp = context.get_value_type(types.intp)
        ary = make_array(arrty)(context, builder)
        populate_array(ary, data=builder.bitcast(slot, ir.PointerType(ir.FloatType())),
                       shape=[ir.Constant(intp, size)], strides=[ir.Constant(intp, 4)],
                       itemsize=ir.Constant(intp, 4), meminfo=None)
        return ary._getvalue()

    return arrty(n), codegen


@njit(inline="always", cache=True)
def bf16_to_f32(h):
    """uint16 holding a bfloat16 -> float32 (exact: the top half of the float)."""
    return bits_f32(np.uint32(h) << np.uint32(16))


@njit(inline="always", cache=True)
def f32_to_bf16(f):
    """float32 -> uint16 bfloat16, as ggml_compute_fp32_to_bf16 (RNE, quiet NaN)."""
    u = f32_bits(np.float32(f))
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> np.uint32(16)) | np.uint32(64))
    return np.uint16((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))))
                     >> np.uint32(16))


@njit(inline="always", cache=True)
def f16_at(buf, p):
    """The half at byte offset ``p`` of a uint8 buffer (little endian), as float32."""
    return f16_to_f32(np.uint16(buf[p]) | (np.uint16(buf[p + 1]) << np.uint16(8)))


@njit(inline="always", cache=True)
def u32_at(buf, p):
    """The little-endian uint32 at byte offset ``p`` of a uint8 buffer."""
    return (np.uint32(buf[p]) | (np.uint32(buf[p + 1]) << np.uint32(8))
            | (np.uint32(buf[p + 2]) << np.uint32(16)) | (np.uint32(buf[p + 3]) << np.uint32(24)))


@njit(inline="always", cache=True)
def f16_round(f):
    """Round a float32 to the nearest half and back (ties to even)."""
    return f16_to_f32(f32_to_f16(np.float32(f)))


def bf16_round_ref(x: np.ndarray) -> np.ndarray:
    """numpy reference of f32 -> bf16 bits (ggml_compute_fp32_to_bf16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(nan, (u >> 16) | 64, r).astype(np.uint16)


def read_only_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (``a``'s own flags unchanged), for an input a kernel only
    reads that is sometimes a weight: numba compiles a kernel once for a read-only array
    (a mapped file's weights) and again for a writable one, so the wrappers hand every such
    input over read-only (attention sinks, rope freq_factors) and each kernel is compiled
    once."""
    v = a.view()
    v.flags.writeable = False
    return v
