"""Fixed-width SIMD vectors in numba: a ``Vec`` type and the few operations the integer
dot products (:mod:`.vec_dot_simd`) are written with.

Numba compiles scalar Python; LLVM's auto-vectorizer then decides which instructions to
use, and for ggml's integer block dots it does not find ``vpmaddubsw``/``vpdpbusd``
(the byte dot products every fast quantized kernel is built on). This module lets a
kernel say which vector operations it wants while staying plain numba code:

* ``Vec(dtype, n)`` is a numba type whose value is an LLVM vector ``<n x dtype>``: a
  local variable of that type lives in a register, like a float does;
* operators ``+ - * & | ^ >> <<`` work lane-wise on two vectors or a vector and a
  scalar (broadcast); ``>>`` is arithmetic on signed lanes and logical on unsigned;
* the rest are functions: :func:`load`, :func:`splat`, :func:`convert`,
  :func:`bitcast`, :func:`select_neg`, :func:`absolute`, :func:`concat`,
  :func:`lanes`, :func:`permutation`/:func:`permutation2` (constant shuffles),
  :func:`maddubs`, :func:`madd`, :func:`dpbusd`, :func:`dpwssd`, :func:`hsum`,
  :func:`bit_field`/:func:`bit_picker` (bit fields, one ``vgf2p8affineqb`` with GFNI),
  :func:`multishift` (unaligned bytes of each 64-bit lane, one ``vpmultishiftqb`` with
  AVX512_VBMI), :func:`clobber` (values stored to a buffer are read back from memory),
  :func:`vmax`/:func:`vmin`, :func:`reduce_max`, :func:`rint` (the activation
  quantizers of :mod:`.quants`).

Everything is plain LLVM IR (``shufflevector``, ``mul``, ``sext``...) except the byte
dot products, which are emitted as x86 intrinsics when the target has them and as
plain IR otherwise, with the same result:

=================  ===========================  ================  =====================
operation          AVX512-VNNI                  AVX512BW / AVX2   any other target
=================  ===========================  ================  =====================
``maddubs``        ``vpmaddubsw`` zmm           ``vpmaddubsw``    widen, multiply, add
``dpbusd``         ``vpdpbusd`` zmm             maddubs + madd    widen, multiply, add
``madd``/dpwssd    LLVM matches ``vpmaddwd``/``vpdpwssd`` from the plain IR
=================  ===========================  ================  =====================

The target is numba's (``NUMBA_CPU_NAME``/``NUMBA_CPU_FEATURES``, else the host), read
when each function is compiled; numba's cache is keyed on it, so a cached kernel never
runs on a CPU it was not compiled for.

Exactness: ``maddubs`` (and ``dpbusd`` outside VNNI) add two ``u8 * i8`` products in
16 bits, which ``vpmaddubsw`` saturates: callers keep each pair sum within int16 (the
kernels use bytes <= 128 against activations in [-127, 127]: at most 32512). All other
integer operations wrap like C; the kernels stay far from the limits.
"""
from __future__ import annotations

import operator

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, overload, register_model

# ---------------------------------------------------------------------------- the type


class Vec(types.Type):
    """``n`` lanes of the numba scalar type ``dtype`` (an LLVM ``<n x T>``)."""

    def __init__(self, dtype: types.Type, n: int):
        self.dtype, self.n = dtype, int(n)
        super().__init__(name=f"Vec({dtype}, {n})")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        lane = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(lane, fe_type.n))


_DTYPES = {"u8": types.uint8, "i8": types.int8, "u16": types.uint16, "i16": types.int16,
           "u32": types.uint32, "i32": types.int32, "f32": types.float32, "f64": types.float64,
           "i64": types.int64, "u64": types.uint64}


def _dtype(lit) -> types.Type:
    if not isinstance(lit, types.StringLiteral) or lit.literal_value not in _DTYPES:
        raise TypeError(f"lane type must be one of {sorted(_DTYPES)}, got {lit}")
    return _DTYPES[lit.literal_value]


def _is_float(t) -> bool:
    return isinstance(t, types.Float)


def _signed(t) -> bool:
    return isinstance(t, types.Integer) and t.signed


def _lane_ir(t: types.Type) -> ir.Type:
    if _is_float(t):
        return ir.DoubleType() if t.bitwidth == 64 else ir.FloatType()
    return ir.IntType(t.bitwidth)


def _vty(t: types.Type, n: int) -> ir.VectorType:
    return ir.VectorType(_lane_ir(t), n)


def _const_vec(t: types.Type, values) -> ir.Constant:
    return ir.Constant(_vty(t, len(values)), [ir.Constant(_lane_ir(t), v) for v in values])


def _shuffle(builder, a, b, mask) -> ir.Value:
    idx = ir.Constant(ir.VectorType(ir.IntType(32), len(mask)),
                      [ir.Constant(ir.IntType(32), int(i)) for i in mask])
    return builder.shuffle_vector(a, b, idx)


def _target_features(context) -> frozenset[str]:
    """The enabled features (``avx2``, ``avx512vnni``...) of the code being compiled."""
    codegen = context.codegen()
    feats = getattr(codegen, "_tm_features", None)
    if feats is None:
        from llvmlite import binding
        feats = binding.get_host_cpu_features().flatten()
    return frozenset(f[1:] for f in feats.split(",") if f.startswith("+"))


# ---------------------------------------------------------------------------- making vectors


def _byte_ptr(context, builder, arrty, arr, p, vt: ir.Type):
    a = cgutils.create_struct_proxy(arrty)(context, builder, value=arr)
    base = builder.bitcast(a.data, ir.IntType(8).as_pointer())
    return builder.bitcast(builder.gep(base, [p]), vt.as_pointer())


@intrinsic(prefer_literal=True)
def load(typingctx, buf, p, n, dtype):
    """``n`` lanes of ``dtype`` read from byte offset ``p`` of the 1-D C-contiguous array
    ``buf`` (any element type; unaligned; not bounds-checked)."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1 and isinstance(n, types.IntegerLiteral)):
        return None
    vt = Vec(_dtype(dtype), n.literal_value)

    def codegen(context, builder, sig, args):
        return builder.load(_byte_ptr(context, builder, buf, args[0], args[1],
                                      _vty(vt.dtype, vt.n)), align=1)

    return vt(buf, p, n, dtype), codegen


@intrinsic(prefer_literal=True)
def store(typingctx, buf, p, v):
    """Write the lanes of ``v`` at byte offset ``p`` of ``buf`` (unaligned, unchecked)."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1 and isinstance(v, Vec)):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _byte_ptr(context, builder, buf, args[0], args[1], args[2].type),
                      align=1)
        return context.get_dummy_value()

    return types.none(buf, p, v), codegen


@intrinsic(prefer_literal=True)
def scalar_at(typingctx, buf, p, dtype):
    """One ``dtype`` scalar read from byte offset ``p`` of ``buf`` (unaligned, unchecked)."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1):
        return None
    t = _dtype(dtype)

    def codegen(context, builder, sig, args):
        return builder.load(_byte_ptr(context, builder, buf, args[0], args[1], _lane_ir(t)),
                            align=1)

    return t(buf, p, dtype), codegen


@intrinsic(prefer_literal=True)
def splat(typingctx, x, n, dtype):
    """``n`` copies of the scalar ``x`` converted to ``dtype`` ("u8", "i16", "f32", ...)."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    t = _dtype(dtype)
    vt = Vec(t, n.literal_value)

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], x, t)
        vec = builder.insert_element(ir.Constant(_vty(t, 1), None), v, ir.Constant(ir.IntType(32), 0))
        return _shuffle(builder, vec, vec, [0] * vt.n)

    return vt(x, n, dtype), codegen


@intrinsic(prefer_literal=True)
def zeros(typingctx, n, dtype):
    """``n`` lanes of zero."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    vt = Vec(_dtype(dtype), n.literal_value)

    def codegen(context, builder, sig, args):
        return ir.Constant(_vty(vt.dtype, vt.n), None)

    return vt(n, dtype), codegen


# ---------------------------------------------------------------------------- lane-wise


def _binop(op: str, fop: str | None):
    def impl(typingctx, a, b):
        va = a if isinstance(a, Vec) else None
        vb = b if isinstance(b, Vec) else None
        v = va or vb
        if v is None or (va and vb and (va.dtype != vb.dtype or va.n != vb.n)):
            return None
        other = b if va else a
        if not va or not vb:
            if not isinstance(other, (types.Integer, types.Float)):
                return None

        def codegen(context, builder, sig, args):
            x, y = args
            if not va:
                x = _splat_ir(context, builder, x, a, v)
            if not vb:
                y = _splat_ir(context, builder, y, b, v)
            if _is_float(v.dtype):
                return getattr(builder, fop)(x, y)
            name = op
            if op == "shr":
                name = "ashr" if _signed(v.dtype) else "lshr"
            return getattr(builder, name)(x, y)

        return v(a, b), codegen

    impl.__name__ = f"_v{op}"
    return intrinsic(impl)


def _splat_ir(context, builder, x, xt, vt: Vec):
    x = context.cast(builder, x, xt, vt.dtype)
    vec = builder.insert_element(ir.Constant(_vty(vt.dtype, 1), None), x,
                                 ir.Constant(ir.IntType(32), 0))
    return _shuffle(builder, vec, vec, [0] * vt.n)


_vadd, _vsub, _vmul = _binop("add", "fadd"), _binop("sub", "fsub"), _binop("mul", "fmul")
_vand, _vor, _vxor = _binop("and_", None), _binop("or_", None), _binop("xor", None)
_vshr, _vshl = _binop("shr", None), _binop("shl", None)

_OPERATORS = {operator.add: _vadd, operator.sub: _vsub, operator.mul: _vmul,
              operator.and_: _vand, operator.or_: _vor, operator.xor: _vxor,
              operator.rshift: _vshr, operator.lshift: _vshl}


def _register_operator(op, fn):
    @overload(op)
    def ov(a, b):
        if isinstance(a, Vec) or isinstance(b, Vec):
            return lambda a, b: fn(a, b)


for _op, _fn in _OPERATORS.items():
    _register_operator(_op, _fn)


@intrinsic
def absolute(typingctx, a):
    """|a| lane-wise for signed integer lanes (``abs(-128)`` stays ``-128``, i.e. 128 as u8)."""
    if not (isinstance(a, Vec) and _signed(a.dtype)):
        return None

    def codegen(context, builder, sig, args):
        neg = builder.sub(ir.Constant(args[0].type, None), args[0])
        return builder.select(builder.icmp_signed("<", args[0], ir.Constant(args[0].type, None)),
                              neg, args[0])

    return a(a), codegen


@intrinsic
def select_neg(typingctx, s, a):
    """``-a`` where ``s < 0`` else ``a`` (ggml's ``_mm256_sign_epi8`` without the zeroing;
    the kernels only use it where ``|s|`` is the other factor)."""
    if not (isinstance(s, Vec) and isinstance(a, Vec) and s.n == a.n and _signed(s.dtype)):
        return None

    def codegen(context, builder, sig, args):
        neg = builder.sub(ir.Constant(args[1].type, None), args[1])
        lt = builder.icmp_signed("<", args[0], ir.Constant(args[0].type, None))
        return builder.select(lt, neg, args[1])

    return a(s, a), codegen


# ---------------------------------------------------------------------------- conversions


@intrinsic(prefer_literal=True)
def convert(typingctx, a, dtype):
    """Lane-wise conversion: integers widen (sign- or zero-extend by the source's
    signedness) or truncate; integers to "f32" convert exactly below 2**24; float32
    to "f64" exactly (and back, rounding to nearest); floats to integers truncate
    toward zero (exact for the integral values :func:`rint` returns)."""
    if not isinstance(a, Vec):
        return None
    t = _dtype(dtype)
    vt = Vec(t, a.n)

    def codegen(context, builder, sig, args):
        x, dst = args[0], _vty(t, a.n)
        if _is_float(t) and _is_float(a.dtype):
            if t.bitwidth == a.dtype.bitwidth:
                return x
            return builder.fpext(x, dst) if t.bitwidth > a.dtype.bitwidth else builder.fptrunc(x, dst)
        if _is_float(t):
            return builder.sitofp(x, dst) if _signed(a.dtype) else builder.uitofp(x, dst)
        if _is_float(a.dtype):                  # float -> int: truncates toward zero
            return builder.fptosi(x, dst) if _signed(t) else builder.fptoui(x, dst)
        if t.bitwidth > a.dtype.bitwidth:
            return builder.sext(x, dst) if _signed(a.dtype) else builder.zext(x, dst)
        if t.bitwidth < a.dtype.bitwidth:
            return builder.trunc(x, dst)
        return x

    return vt(a, dtype), codegen


@intrinsic(prefer_literal=True)
def bitcast(typingctx, a, dtype):
    """The same bits read as lanes of ``dtype`` (the lane count scales accordingly)."""
    if not isinstance(a, Vec):
        return None
    t = _dtype(dtype)
    bits = a.n * a.dtype.bitwidth
    vt = Vec(t, bits // t.bitwidth)

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _vty(t, vt.n))

    return vt(a, dtype), codegen


@intrinsic
def f16_to_f32(typingctx, a):
    """uint16 lanes holding IEEE halves -> float32 lanes (exact; ``vcvtph2ps``)."""
    if not (isinstance(a, Vec) and a.dtype == types.uint16):
        return None
    vt = Vec(types.float32, a.n)

    def codegen(context, builder, sig, args):
        h = builder.bitcast(args[0], ir.VectorType(ir.HalfType(), a.n))
        return builder.fpext(h, _vty(types.float32, a.n))

    return vt(a), codegen


# ---------------------------------------------------------------------------- shuffles


@intrinsic(prefer_literal=True)
def lanes(typingctx, a, start, n):
    """Lanes ``start .. start + n - 1`` of ``a`` (both literals) as a shorter vector."""
    if not (isinstance(a, Vec) and isinstance(start, types.IntegerLiteral)
            and isinstance(n, types.IntegerLiteral)):
        return None
    s, k = start.literal_value, n.literal_value
    if s + k > a.n:
        raise ValueError(f"lanes {s}..{s + k - 1} of a {a.n}-lane vector")
    vt = Vec(a.dtype, k)

    def codegen(context, builder, sig, args):
        return _shuffle(builder, args[0], args[0], range(s, s + k))

    return vt(a, start, n), codegen


@intrinsic
def concat(typingctx, a, b):
    """``a`` then ``b``, one vector of ``a.n + b.n`` lanes."""
    if not (isinstance(a, Vec) and a == b):
        return None
    vt = Vec(a.dtype, 2 * a.n)

    def codegen(context, builder, sig, args):
        return _shuffle(builder, args[0], args[1], range(2 * a.n))

    return vt(a, b), codegen


def permutation(mask) -> object:
    """A function ``f(a)`` returning ``[a[m] for m in mask]`` (a constant shuffle; -1
    makes a zero lane), a vector of ``len(mask)`` lanes."""
    mask = tuple(int(m) for m in mask)

    @intrinsic
    def permute(typingctx, a):
        if not isinstance(a, Vec) or max(mask) >= a.n:
            return None
        vt = Vec(a.dtype, len(mask))

        def codegen(context, builder, sig, args):
            zero = ir.Constant(args[0].type, None)
            return _shuffle(builder, args[0], zero, [m if m >= 0 else a.n for m in mask])

        return vt(a), codegen

    return permute


def permutation2(mask) -> object:
    """A function ``f(a, b)`` returning ``[(a ++ b)[m] for m in mask]``."""
    mask = tuple(int(m) for m in mask)

    @intrinsic
    def permute2(typingctx, a, b):
        if not (isinstance(a, Vec) and a == b) or max(mask) >= 2 * a.n:
            return None
        vt = Vec(a.dtype, len(mask))

        def codegen(context, builder, sig, args):
            return _shuffle(builder, args[0], args[1], mask)

        return vt(a, b), codegen

    return permute2


@intrinsic(prefer_literal=True)
def lane(typingctx, a, i):
    """Lane ``i`` (a literal) of ``a`` as a scalar."""
    if not (isinstance(a, Vec) and isinstance(i, types.IntegerLiteral)):
        return None

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], ir.Constant(ir.IntType(32), i.literal_value))

    return a.dtype(a, i), codegen


# ---------------------------------------------------------------------------- dot products


def _pairs_add(builder, v, n_out):
    """v[0::2] + v[1::2] (lanes of v: 2 * n_out)."""
    even = _shuffle(builder, v, v, range(0, 2 * n_out, 2))
    odd = _shuffle(builder, v, v, range(1, 2 * n_out, 2))
    return builder.add(even, odd)


def _maddubs_ir(context, builder, a, b, n):
    """n u8 x n i8 -> n/2 i16: a[2i]*b[2i] + a[2i+1]*b[2i+1] (pair sums must fit int16)."""
    feats = _target_features(context)
    i8 = ir.IntType(8)
    if "avx512bw" in feats and n % 64 == 0:
        width, name = 64, "llvm.x86.avx512.pmaddubs.w.512"
    elif "avx2" in feats and n % 32 == 0:
        width, name = 32, "llvm.x86.avx2.pmadd.ub.sw"
    else:
        w16 = ir.VectorType(ir.IntType(16), n)
        prod = builder.mul(builder.zext(a, w16), builder.sext(b, w16))
        return _pairs_add(builder, prod, n // 2)
    fnty = ir.FunctionType(ir.VectorType(ir.IntType(16), width // 2),
                           [ir.VectorType(i8, width)] * 2)
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    parts = [builder.call(fn, [_shuffle(builder, a, a, range(k, k + width)),
                               _shuffle(builder, b, b, range(k, k + width))])
             for k in range(0, n, width)]
    while len(parts) > 1:
        parts = [_shuffle(builder, parts[i], parts[i + 1], range(2 * parts[i].type.count))
                 for i in range(0, len(parts), 2)]
    return parts[0]


def _x86_call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module,
                                        ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _chunks(builder, v, width):
    """``v`` cut into vectors of ``width`` lanes."""
    return [_shuffle(builder, v, v, range(k, k + width)) for k in range(0, v.type.count, width)]


def _join(builder, parts):
    """Concatenate equal vectors (a power-of-two count of them)."""
    while len(parts) > 1:
        parts = [_shuffle(builder, parts[i], parts[i + 1], range(2 * parts[i].type.count))
                 for i in range(0, len(parts), 2)]
    return parts[0]


#: for 64 byte lanes: where the byte's 64-bit lane starts in its 16-byte lane (a vpshufb
#: index of byte j of the lane's qword is this plus j)
_QWORD_AT = [8 * ((i // 8) % 2) for i in range(64)]


def _pshufb_ir(context, builder, table, idx):
    """``vpshufb`` over a whole vector (64 or 32 bytes): ``out[i] = table[16 * (i // 16) +
    idx[i] % 16]``, 0 where ``idx[i] >= 128``, in 64-, 32- or 16-byte instructions by
    the target (AVX512BW, AVX2, SSSE3); ``None`` without SSSE3."""
    feats = _target_features(context)
    for width, name, need in ((64, "llvm.x86.avx512.pshuf.b.512", "avx512bw"),
                              (32, "llvm.x86.avx2.pshuf.b", "avx2"),
                              (16, "llvm.x86.ssse3.pshuf.b.128", "ssse3")):
        if need in feats and table.type.count % width == 0:
            vt = ir.VectorType(ir.IntType(8), width)
            return _join(builder, [_x86_call(builder, name, vt, [t, i]) for t, i in
                                   zip(_chunks(builder, table, width),
                                       _chunks(builder, idx, width))])
    return None


def _madd_ir(context, builder, a, b, n):
    """n i16 x n i16 -> n/2 i32 pair sums (vpmaddwd). Emitted as the x86 intrinsic where
    available: from plain IR LLVM reasons about known-zero halves and widens instead."""
    feats = _target_features(context)
    i32 = ir.IntType(32)
    if "avx512bw" in feats and n % 32 == 0:
        width, name = 32, "llvm.x86.avx512.pmaddw.d.512"
    elif "avx2" in feats and n % 16 == 0:
        width, name = 16, "llvm.x86.avx2.pmadd.wd"
    else:
        w32 = ir.VectorType(i32, n)
        return _pairs_add(builder, builder.mul(builder.sext(a, w32), builder.sext(b, w32)), n // 2)
    ret = ir.VectorType(i32, width // 2)
    return _join(builder, [_x86_call(builder, name, ret, [x, y]) for x, y in
                           zip(_chunks(builder, a, width), _chunks(builder, b, width))])


@intrinsic
def maddubs(typingctx, a, b):
    """u8 x i8 lanes -> int16 pair sums ``a[2i]*b[2i] + a[2i+1]*b[2i+1]`` (vpmaddubsw;
    each pair sum must fit in int16, see the module doc)."""
    if not (isinstance(a, Vec) and isinstance(b, Vec) and a.n == b.n
            and a.dtype == types.uint8 and b.dtype == types.int8):
        return None
    vt = Vec(types.int16, a.n // 2)

    def codegen(context, builder, sig, args):
        return _maddubs_ir(context, builder, args[0], args[1], a.n)

    return vt(a, b), codegen


@intrinsic
def madd(typingctx, a, b):
    """int16 x int16 lanes -> int32 pair sums (vpmaddwd)."""
    if not (isinstance(a, Vec) and a == b and a.dtype == types.int16):
        return None
    vt = Vec(types.int32, a.n // 2)

    def codegen(context, builder, sig, args):
        return _madd_ir(context, builder, args[0], args[1], a.n)

    return vt(a, b), codegen


@intrinsic
def dpwssd(typingctx, acc, a, b):
    """acc + madd(a, b) (one ``vpdpwssd`` with AVX512-VNNI)."""
    if not (isinstance(a, Vec) and a == b and a.dtype == types.int16
            and acc == Vec(types.int32, a.n // 2)):
        return None

    def codegen(context, builder, sig, args):
        if "avx512vnni" in _target_features(context) and a.n % 32 == 0:
            i32 = ir.VectorType(ir.IntType(32), 16)
            return _join(builder, [
                _x86_call(builder, "llvm.x86.avx512.vpdpwssd.512", i32, [c, x, y])
                for c, x, y in zip(_chunks(builder, args[0], 16), _chunks(builder, args[1], 32),
                                   _chunks(builder, args[2], 32))])
        return builder.add(args[0], _madd_ir(context, builder, args[1], args[2], a.n))

    return acc(acc, a, b), codegen


@intrinsic
def dpbusd(typingctx, acc, a, b):
    """acc + sums of 4 consecutive u8 x i8 products (``vpdpbusd``; elsewhere maddubs then
    madd with ones, whose pair sums must then fit in int16)."""
    if not (isinstance(a, Vec) and isinstance(b, Vec) and a.n == b.n
            and a.dtype == types.uint8 and b.dtype == types.int8
            and acc == Vec(types.int32, a.n // 4)):
        return None

    def codegen(context, builder, sig, args):
        feats = _target_features(context)
        if "avx512vnni" in feats and a.n % 64 == 0:
            v64, v16 = ir.VectorType(ir.IntType(8), 64), ir.VectorType(ir.IntType(32), 16)
            fnty = ir.FunctionType(v16, [v16, v64, v64])
            fn = cgutils.get_or_insert_function(builder.module, fnty,
                                                "llvm.x86.avx512.vpdpbusd.512")
            out = []
            for k in range(0, a.n, 64):
                part = _shuffle(builder, args[0], args[0], range(k // 4, k // 4 + 16))
                out.append(builder.call(fn, [part,
                                             _shuffle(builder, args[1], args[1], range(k, k + 64)),
                                             _shuffle(builder, args[2], args[2], range(k, k + 64))]))
            while len(out) > 1:
                out = [_shuffle(builder, out[i], out[i + 1], range(2 * out[i].type.count))
                       for i in range(0, len(out), 2)]
            return out[0]
        pairs = _maddubs_ir(context, builder, args[1], args[2], a.n)
        ones = _const_vec(types.int16, [1] * (a.n // 2))
        return builder.add(args[0], _madd_ir(context, builder, pairs, ones, a.n // 2))

    return acc(acc, a, b), codegen


@intrinsic
def has_vnni(typingctx):
    """Whether the code being compiled has AVX512-VNNI (a constant LLVM folds): there
    ``dpbusd`` is one ``vpdpbusd``, which does not saturate, so a kernel may feed it
    unsigned bytes up to 255 where the other lowerings need pair sums within int16."""
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(1), int("avx512vnni" in _target_features(context)))

    return types.boolean(), codegen


@intrinsic
def has_avx512(typingctx):
    """Whether the code being compiled has AVX512BW (a constant LLVM folds): 32 vector
    registers of 64 bytes, where AVX2 has 16 of 32, so a 64-byte vector takes two of
    them; a kernel may keep four rows' vectors live only with the former."""
    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(1), int("avx512bw" in _target_features(context)))

    return types.boolean(), codegen


@intrinsic
def hsum(typingctx, a):
    """Sum of the lanes of an integer vector (``llvm.vector.reduce.add``)."""
    if not (isinstance(a, Vec) and isinstance(a.dtype, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        fnty = ir.FunctionType(ty.element, [ty])
        name = f"llvm.vector.reduce.add.v{a.n}i{a.dtype.bitwidth}"
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        return builder.call(fn, [args[0]])

    return a.dtype(a), codegen


@intrinsic
def add_in_order(typingctx, s, a):
    """``s + a[0] + a[1] + ... + a[n-1]``, added one lane at a time in that order (float
    lanes: the order of a scalar loop, e.g. ggml's final ``sumf += sums[l]``)."""
    if not (isinstance(a, Vec) and _is_float(a.dtype) and isinstance(s, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        acc = context.cast(builder, args[0], s, a.dtype)
        for i in range(a.n):
            acc = builder.fadd(acc, builder.extract_element(args[1], ir.Constant(ir.IntType(32), i)))
        return acc

    return a.dtype(s, a), codegen


@intrinsic(prefer_literal=True)
def halves_at(typingctx, buf, p, n):
    """``n`` (2 or 4) IEEE halves at byte offset ``p`` of ``buf`` as a float32 vector.

    Loaded as one integer into an otherwise zero vector: a scalar half load becomes
    ``vpinsrw`` into whatever register LLVM picks, which chained the loop's float
    accumulator to the next block's scale load (a loop-carried dependency: 4 ns per Q4_K
    block)."""
    if not (isinstance(buf, types.Array) and isinstance(n, types.IntegerLiteral)
            and n.literal_value in (2, 4)):
        return None
    k = n.literal_value
    vt = Vec(types.float32, k)

    def codegen(context, builder, sig, args):
        it = ir.IntType(16 * k)
        word = builder.load(_byte_ptr(context, builder, buf, args[0], args[1], it), align=1)
        wide = ir.VectorType(it, 128 // (16 * k))
        v = builder.insert_element(ir.Constant(wide, None), word, ir.Constant(ir.IntType(32), 0))
        h = builder.bitcast(v, ir.VectorType(ir.HalfType(), 8))
        return builder.fpext(_shuffle(builder, h, h, range(k)), _vty(types.float32, k))

    return vt(buf, p, n), codegen


@intrinsic
def opaque(typingctx, a):
    """``a`` unchanged, through an empty inline-asm statement LLVM cannot see into.

    LLVM merges chains of shuffles into one, and with AVX-512 a shuffle that mixes in
    zero lanes becomes a two-source ``vpermt2b``/``vpermt2d`` (3 uops on port 5, ~2.5
    cycles each here) instead of a zero-extension plus single-source permutes. Passing
    the intermediate vector through :func:`opaque` keeps the cheap form. Without AVX-512
    it is the identity (a 512-bit value has no register to pin it to)."""
    if not isinstance(a, Vec):
        return None

    def codegen(context, builder, sig, args):
        if "avx512f" not in _target_features(context):
            return args[0]                      # the cheap form only matters with AVX-512
        ty = args[0].type
        return builder.asm(ir.FunctionType(ty, [ty]), "", "=v,0", [args[0]], False)

    return a(a), codegen


@intrinsic
def prefetch(typingctx, buf, p):
    """Hint the CPU to fetch the cache line at byte offset ``p`` of ``buf`` into L1
    (``prefetcht0``, LLVM locality 3; never faults, so ``p`` may run past the end of
    ``buf``). Into L1 rather than L2 (``prefetcht1``, used before 2026-11-27): on the
    2-core AMD EPYC (Zen 5) the matvecs then wait for no L2 -> L1 fill on their loads;
    2 threads streaming 64 MiB, A/B in one process, read ~75 GB/s: Q4_0 78 -> 90% of the
    streaming read, Q6_K 71 -> 84%, every block type +2 to +13 points; F32 8 KB ahead
    80 -> 93% (kernels/README.md). (An earlier one-core measurement, ``prefetcht0`` 2.7
    KB ahead 6.0 GB/s against ``prefetcht1`` 8 KB ahead 14.1 GB/s, changed the distance
    as well.)"""
    if not (isinstance(buf, types.Array) and buf.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        ptr = _byte_ptr(context, builder, buf, args[0], args[1], ir.IntType(8))
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
            "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(buf, p), codegen


def constant(values, dtype: str) -> object:
    """A function ``f()`` returning the constant vector ``values`` of lane type ``dtype``."""
    values = tuple(values)
    t = _DTYPES[dtype]
    vt = Vec(t, len(values))

    @intrinsic
    def const(typingctx):
        def codegen(context, builder, sig, args):
            return _const_vec(t, [float(v) if _is_float(t) else int(v) for v in values])

        return vt(), codegen

    return const


@intrinsic(prefer_literal=True)
def or_where(typingctx, a, bits, value):
    """``a[i] | value`` where bit ``i`` of the integer ``bits`` is set, else ``a[i]``
    (``a`` of at most 64 lanes; with AVX-512 one ``kmov`` and a masked ``vpor``)."""
    if not (isinstance(a, Vec) and a.n <= 64 and isinstance(bits, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        b = context.cast(builder, args[1], bits, types.uint64)
        if a.n < 64:
            b = builder.trunc(b, ir.IntType(a.n))
        mask = builder.bitcast(b, ir.VectorType(ir.IntType(1), a.n))
        v = _splat_ir(context, builder, args[2], value, a)
        return builder.select(mask, builder.or_(args[0], v), args[0])

    return a(a, bits, value), codegen


@intrinsic(prefer_literal=True)
def or_if(typingctx, a, cond, value):
    """``a[i] | value`` where ``cond[i]`` is non-zero, else ``a[i]``; the bits of
    ``value`` must be clear in ``a`` (computed as an add, which AVX-512 masks per byte:
    ``vptestmb`` and a masked ``vpaddb``, where a masked or would need a blend)."""
    if not (isinstance(a, Vec) and isinstance(cond, Vec) and cond.n == a.n):
        return None

    def codegen(context, builder, sig, args):
        nz = builder.icmp_unsigned("!=", args[1], ir.Constant(args[1].type, None))
        v = _splat_ir(context, builder, args[2], value, a)
        x = args[0]
        if "avx512bw" in _target_features(context):     # else LLVM, seeing the clear bits,
            x = builder.asm(ir.FunctionType(x.type, [x.type]), "", "=v,0", [x], False)
        return builder.select(nz, builder.add(x, v), x)  # makes it an or and a blend

    return a(a, cond, value), codegen


@intrinsic(prefer_literal=True)
def add_if_bit(typingctx, a, src, idx, value):
    """``a[i] + value`` where bit ``idx[i] % 64`` of 64-bit lane ``i // 8`` of ``src`` is
    set, else ``a[i]`` (64 uint8 lanes; ``src`` any 64-byte vector, ``idx`` uint8 x64).
    With AVX512_BITALG one ``vpshufbitqmb`` (the bit pick, into a mask register) and a
    masked ``vpaddb``; with AVX2 (or AVX512BW without BITALG) two ``vpshufb`` (the byte
    holding the bit, then the bit), a test and a blend; elsewhere shifts of the 64-bit
    lanes (64 lanes of 64 bits: Q5_0's matvec ran at 21% of the streaming read that way
    on an AVX2-only EPYC, 2026-11-28)."""
    if not (isinstance(a, Vec) and a.n == 64 and a.dtype in (types.uint8, types.int8)
            and isinstance(src, Vec) and src.n * src.dtype.bitwidth == 512
            and isinstance(idx, Vec) and idx.n == 64 and idx.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        feats = _target_features(context)
        x, i8x64 = args[0], ir.VectorType(ir.IntType(8), 64)
        s8 = builder.bitcast(args[1], i8x64)
        u8 = types.uint8
        if "avx512bitalg" in feats and "avx512bw" in feats:
            mask = _x86_call(builder, "llvm.x86.avx512.vpshufbitqmb.512",
                             ir.VectorType(ir.IntType(1), 64), [s8, args[2]])
            x = builder.asm(ir.FunctionType(x.type, [x.type]), "", "=v,0", [x], False)
        elif "avx2" in feats or "avx512bw" in feats:
            # the byte holding each lane's bit (in its own 64-bit lane, so in its own
            # 16-byte lane: one vpshufb), then the bit itself (a vpshufb of 1 << (idx % 8))
            idx = args[2]
            at = builder.add(builder.and_(builder.lshr(idx, _const_vec(u8, [3] * 64)),
                                          _const_vec(u8, [7] * 64)),
                             _const_vec(u8, _QWORD_AT))
            byte = _pshufb_ir(context, builder, s8, at)
            bit = _pshufb_ir(context, builder, _const_vec(u8, [1 << (i % 8) for i in range(64)]),
                             builder.and_(idx, _const_vec(u8, [7] * 64)))
            mask = builder.icmp_unsigned("!=", builder.and_(byte, bit), _const_vec(u8, [0] * 64))
        else:
            i64 = ir.IntType(64)
            q = builder.bitcast(args[1], ir.VectorType(i64, 8))
            q = _shuffle(builder, q, q, [i // 8 for i in range(64)])
            sh = builder.zext(builder.and_(args[2], _const_vec(types.uint8, [63] * 64)),
                              ir.VectorType(i64, 64))
            mask = builder.trunc(builder.lshr(q, sh), ir.VectorType(ir.IntType(1), 64))
        v = _splat_ir(context, builder, args[3], value, a)
        return builder.select(mask, builder.add(x, v), x)

    return a(a, src, idx, value), codegen


@intrinsic(prefer_literal=True)
def bit_field(typingctx, a, shift, width):
    """``(a[i] >> shift) & (2**width - 1)`` for uint8 lanes (literal shift and width):
    one ``vgf2p8affineqb`` with GFNI (a bit matrix moving bits shift..shift+width-1 to
    0..width-1), where a shift then a mask would take two."""
    if not (isinstance(a, Vec) and a.dtype == types.uint8 and isinstance(shift, types.IntegerLiteral)
            and isinstance(width, types.IntegerLiteral)):
        return None
    sh, wd = shift.literal_value, width.literal_value

    def codegen(context, builder, sig, args):
        feats = _target_features(context)
        if "gfni" in feats and "avx512bw" in feats and a.n == 64:
            # output bit i = parity(matrix byte 7 - i & x): byte 7 - i selects bit sh + i
            qword = sum((1 << (sh + i)) << (8 * (7 - i)) for i in range(wd) if sh + i < 8)
            mat = _const_vec(types.uint8, [(qword >> (8 * (k % 8))) & 0xFF for k in range(64)])
            return _x86_call(builder, "llvm.x86.vgf2p8affineqb.512", args[0].type,
                             [args[0], mat, ir.Constant(ir.IntType(8), 0)])
        v = builder.lshr(args[0], _const_vec(types.uint8, [sh] * a.n))
        return builder.and_(v, _const_vec(types.uint8, [(1 << wd) - 1] * a.n))

    return a(a, shift, width), codegen


def bit_picker(picks, fill: int = 0) -> object:
    """A function ``f(a)`` for 64 uint8 lanes: output bit i of each byte is its bit
    ``picks[i]`` (``-1``, or past the end of ``picks``: 0), xor the constant byte ``fill``
    (which sets the bits no pick lands on). One ``vgf2p8affineqb`` with GFNI (the bit
    matrix of the selection, ``fill`` its immediate); elsewhere a shift, mask and or per
    bit."""
    picks = tuple(int(b) for b in picks) + (-1,) * (8 - len(picks))
    qword = sum((1 << b) << (8 * (7 - i)) for i, b in enumerate(picks) if b >= 0)
    fill = int(fill) & 0xFF

    @intrinsic
    def pick(typingctx, a):
        if not (isinstance(a, Vec) and a.dtype == types.uint8 and a.n == 64):
            return None

        def codegen(context, builder, sig, args):
            feats = _target_features(context)
            if "gfni" in feats and "avx512bw" in feats:
                mat = _const_vec(types.uint8, [(qword >> (8 * (k % 8))) & 0xFF for k in range(64)])
                return _x86_call(builder, "llvm.x86.vgf2p8affineqb.512", args[0].type,
                                 [args[0], mat, ir.Constant(ir.IntType(8), fill)])
            out = _const_vec(types.uint8, [fill] * 64)
            for i, b in enumerate(picks):
                if b < 0:
                    continue
                v = builder.lshr(args[0], _const_vec(types.uint8, [b] * 64))
                v = builder.and_(v, _const_vec(types.uint8, [1] * 64))
                out = builder.or_(out, builder.shl(v, _const_vec(types.uint8, [i] * 64)))
            return out

        return a(a), codegen

    return pick


@intrinsic
def lookup16(typingctx, table, idx):
    """``out[i] = table[16 * (i // 16) + idx[i] % 16]``, or 0 where ``idx[i] >= 128``: a
    16-byte table per 128-bit lane, indexed by bytes (``vpshufb``; 64 uint8 lanes)."""
    if not (isinstance(table, Vec) and table == idx and table.dtype == types.uint8
            and table.n == 64):
        return None

    def codegen(context, builder, sig, args):
        out = _pshufb_ir(context, builder, args[0], args[1])
        if out is not None:
            return out
        i8, i32 = ir.IntType(8), ir.IntType(32)
        out = ir.Constant(args[0].type, None)
        for k in range(64):
            x = builder.extract_element(args[1], ir.Constant(i32, k))
            j = builder.add(builder.zext(builder.and_(x, ir.Constant(i8, 15)), i32),
                            ir.Constant(i32, 16 * (k // 16)))
            v = builder.select(builder.icmp_unsigned(">=", x, ir.Constant(i8, 128)),
                               ir.Constant(i8, 0), builder.extract_element(args[0], j))
            out = builder.insert_element(out, v, ir.Constant(i32, k))
        return out

    return table(table, idx), codegen


@intrinsic
def lookup64(typingctx, table, idx):
    """``out[i] = table[idx[i] % 64]`` for 64 uint8 lanes (``vpermb`` with AVX512_VBMI;
    with AVX2 or AVX512BW four ``vpshufb`` a vector, one per 16-byte quarter of the
    table, and three blends; elsewhere lane by lane)."""
    if not (isinstance(table, Vec) and table == idx and table.dtype == types.uint8
            and table.n == 64):
        return None

    def codegen(context, builder, sig, args):
        feats = _target_features(context)
        if "avx512vbmi" in feats:
            return _x86_call(builder, "llvm.x86.avx512.permvar.qi.512", args[0].type,
                             [args[0], args[1]])
        if "avx2" in feats or "avx512bw" in feats:
            # each 16-byte quarter of the table in every 16-byte lane, looked up by the
            # index's low 4 bits (vpshufb), the quarter picked by bits 4-5
            u8 = types.uint8
            low = builder.and_(args[1], _const_vec(u8, [15] * 64))
            quarter = builder.and_(builder.lshr(args[1], _const_vec(u8, [4] * 64)),
                                   _const_vec(u8, [3] * 64))
            out = None
            for c in range(4):
                tab = _shuffle(builder, args[0], args[0], [16 * c + i % 16 for i in range(64)])
                got = _pshufb_ir(context, builder, tab, low)
                out = got if out is None else builder.select(
                    builder.icmp_unsigned("==", quarter, _const_vec(u8, [c] * 64)), got, out)
            return out
        i8, i32 = ir.IntType(8), ir.IntType(32)
        out = ir.Constant(args[0].type, None)
        for k in range(64):
            j = builder.zext(builder.and_(builder.extract_element(args[1], ir.Constant(i32, k)),
                                          ir.Constant(i8, 63)), i32)
            out = builder.insert_element(out, builder.extract_element(args[0], j),
                                         ir.Constant(i32, k))
        return out

    return table(table, idx), codegen


@intrinsic
def half_at(typingctx, buf, p):
    """The IEEE half at byte offset ``p`` of ``buf`` as float32.

    Loaded into a general register and moved to a zeroed vector register: left to
    itself LLVM loads it with ``vpinsrw`` into whatever register is free, often the
    loop's float accumulator, which chains every block's scale load to the previous
    block's sum (a loop-carried dependency, 2x slower Q3_K/Q6_K; see :func:`halves_at`)."""
    if not isinstance(buf, types.Array):
        return None

    def codegen(context, builder, sig, args):
        i16, i32 = ir.IntType(16), ir.IntType(32)
        h = builder.load(_byte_ptr(context, builder, buf, args[0], args[1], i16), align=1)
        h = builder.asm(ir.FunctionType(i32, [i32]), "", "=r,0", [builder.zext(h, i32)], False)
        v = builder.insert_element(ir.Constant(ir.VectorType(i32, 4), None), h,
                                   ir.Constant(i32, 0))
        v = builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 8)),
                          ir.VectorType(ir.FloatType(), 8))
        return builder.extract_element(v, ir.Constant(i32, 0))

    return types.float32(buf, p), codegen


@intrinsic(prefer_literal=True)
def store_at(typingctx, buf, p, x, dtype):
    """Write the scalar ``x`` converted to ``dtype`` at byte offset ``p`` of ``buf``."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1):
        return None
    t = _dtype(dtype)

    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[2], x, t)
        builder.store(v, _byte_ptr(context, builder, buf, args[0], args[1], _lane_ir(t)), align=1)
        return context.get_dummy_value()

    return types.none(buf, p, x, dtype), codegen


@intrinsic
def halves4(typingctx, b0, b1, b2, b3, p):
    """float32 vector of the IEEE halves at byte offset ``p`` of four buffers (a scale
    of four weight rows)."""
    if not all(isinstance(b, types.Array) for b in (b0, b1, b2, b3)):
        return None
    vt = Vec(types.float32, 4)

    def codegen(context, builder, sig, args):
        i16 = ir.IntType(16)
        v = ir.Constant(ir.VectorType(i16, 8), None)
        for i in range(4):
            h = builder.load(_byte_ptr(context, builder, sig.args[i], args[i], args[4], i16),
                             align=1)
            v = builder.insert_element(v, h, ir.Constant(ir.IntType(32), i))
        f = builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 8)),
                          ir.VectorType(ir.FloatType(), 8))
        return _shuffle(builder, f, f, range(4))

    return vt(b0, b1, b2, b3, p), codegen


# ---------------------------------------------------------------------------- float helpers
# (the float dot products of .vec_dot and .vec_dot_ggml)


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``: ``vfmadd`` with FMA, a libm call
    otherwise), lane-wise for three float vectors of one type, or for three float32
    scalars."""
    if isinstance(a, Vec):
        if not (a == b == c and _is_float(a.dtype)):
            return None
        rt = a
        name = f"llvm.fma.v{a.n}f32"
    elif all(t == types.float32 for t in (a, b, c)):
        rt = types.float32
        name = "llvm.fma.f32"
    else:
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
        return builder.call(fn, list(args))

    return rt(a, b, c), codegen


@intrinsic
def bf16_to_f32(typingctx, a):
    """uint16 lanes holding bfloat16s -> float32 lanes (exact: zero-extend, shift left
    16, reinterpret; ``vpmovzxwd`` + ``vpslld``)."""
    if not (isinstance(a, Vec) and a.dtype == types.uint16):
        return None
    vt = Vec(types.float32, a.n)

    def codegen(context, builder, sig, args):
        u32 = ir.VectorType(ir.IntType(32), a.n)
        w = builder.shl(builder.zext(args[0], u32), ir.Constant(u32, [ir.Constant(ir.IntType(32), 16)] * a.n))
        return builder.bitcast(w, _vty(types.float32, a.n))

    return vt(a), codegen


@intrinsic
def reduce_add_ps(typingctx, a):
    """Sum of the 16 float32 lanes of ``a`` in the order of ``_mm512_reduce_add_ps``
    (GCC and clang agree): halves ``a[i] + a[i+8]``, then ``b[i] + b[i+4]``, then
    ``(c[0] + c[2]) + (c[1] + c[3])``; each addition rounded (no reassociation)."""
    if not (isinstance(a, Vec) and a.dtype == types.float32 and a.n == 16):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        v = builder.fadd(_shuffle(builder, v, v, range(8, 16)), _shuffle(builder, v, v, range(8)))
        v = builder.fadd(_shuffle(builder, v, v, range(4, 8)), _shuffle(builder, v, v, range(4)))
        v = builder.fadd(v, _shuffle(builder, v, v, [2, 3, 0, 1]))
        i32 = ir.IntType(32)
        return builder.fadd(builder.extract_element(v, ir.Constant(i32, 0)),
                            builder.extract_element(v, ir.Constant(i32, 1)))

    return types.float32(a), codegen


# ---------------------------------------------------------------------------- float rounding, max


def _pick(builder, dtype, pred: str, x, y):
    """Lane-wise ``x if x <pred> y else y`` for lanes of ``dtype`` (floats: ordered
    compares, false with a NaN; integers by their signedness)."""
    if _is_float(dtype):
        c = builder.fcmp_ordered(pred, x, y)
    elif _signed(dtype):
        c = builder.icmp_signed(pred, x, y)
    else:
        c = builder.icmp_unsigned(pred, x, y)
    return builder.select(c, x, y)


def _minmax(pred: str):
    def impl(typingctx, a, b):
        if not (isinstance(a, Vec) and a == b):
            return None

        def codegen(context, builder, sig, args):
            return _pick(builder, a.dtype, pred, *args)

        return a(a, b), codegen

    return intrinsic(impl)


#: lane-wise ``a if a > b else b`` / ``a if a < b else b`` (floats: ordered compares,
#: so a NaN in ``a`` gives ``b``, as ``_mm256_max_ps(b, a)``)
vmax, vmin = _minmax(">"), _minmax("<")


@intrinsic
def reduce_max(typingctx, a):
    """The largest lane of ``a`` (lanes halved with :func:`vmax`: exact, no NaN rules
    beyond vmax's)."""
    if not (isinstance(a, Vec) and a.n & (a.n - 1) == 0):
        return None

    def codegen(context, builder, sig, args):
        v, n = args[0], a.n
        while n > 1:
            n //= 2
            hi, lo = _shuffle(builder, v, v, range(n, 2 * n)), _shuffle(builder, v, v, range(n))
            v = _pick(builder, a.dtype, ">", hi, lo)
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))

    return a.dtype(a), codegen


@intrinsic
def rint(typingctx, a):
    """Float lanes rounded to the nearest integer, ties to even (``llvm.rint``: the
    default rounding mode; ``np.rint``, ``_mm256_round_ps(x, _MM_ROUND_NEAREST)``)."""
    if not (isinstance(a, Vec) and _is_float(a.dtype)):
        return None

    def codegen(context, builder, sig, args):
        ty = args[0].type
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty]),
                                            f"llvm.rint.v{a.n}f{a.dtype.bitwidth}")
        return builder.call(fn, [args[0]])

    return a(a), codegen


def multishift(offsets) -> object:
    """A function ``f(a)`` for 64 uint8 lanes: output byte i is the 8 bits of 64-bit lane
    ``i // 8`` of ``a`` from bit ``offsets[i] % 64`` up, rotating (bit 63 is followed by
    bit 0): a byte-granular shift per output byte. One ``vpmultishiftqb`` with
    AVX512_VBMI; with AVX2 or AVX512BW two ``vpshufb`` (the two bytes the bits come
    from) and a shift pair and blend per distinct ``offsets[i] % 8``; elsewhere a rotate
    of each byte's 64-bit lane (``llvm.fshr``), truncated."""
    offs = tuple(int(o) % 64 for o in offsets)
    if len(offs) != 64:
        raise ValueError(f"multishift takes 64 offsets, got {len(offs)}")

    @intrinsic
    def shift(typingctx, a):
        if not (isinstance(a, Vec) and a.n == 64 and a.dtype == types.uint8):
            return None

        def codegen(context, builder, sig, args):
            feats = _target_features(context)
            if "avx512vbmi" in feats and "avx512bw" in feats:
                return _x86_call(builder, "llvm.x86.avx512.pmultishift.qb.512", args[0].type,
                                 [_const_vec(types.uint8, offs), args[0]])
            if "avx2" in feats or "avx512bw" in feats:
                # byte k = offs // 8 of the lane's qword and the next (one vpshufb each: a
                # qword never crosses a 16-byte lane), then for each distinct bit offset
                # r = offs % 8 (lo >> r) | (hi << (8 - r)), blended by the lanes that use it
                u8 = types.uint8
                s8 = builder.bitcast(args[0], ir.VectorType(ir.IntType(8), 64))
                lo = _pshufb_ir(context, builder, s8, _const_vec(
                    u8, [b + o // 8 for b, o in zip(_QWORD_AT, offs)]))
                hi = _pshufb_ir(context, builder, s8, _const_vec(
                    u8, [b + (o // 8 + 1) % 8 for b, o in zip(_QWORD_AT, offs)]))
                out = None
                for r in sorted({o % 8 for o in offs}):
                    v = lo if r == 0 else builder.or_(
                        builder.lshr(lo, _const_vec(u8, [r] * 64)),
                        builder.shl(hi, _const_vec(u8, [8 - r] * 64)))
                    if out is None:
                        out = v
                        continue
                    pick = ir.Constant(ir.VectorType(ir.IntType(1), 64),
                                       [ir.Constant(ir.IntType(1), int(o % 8 == r)) for o in offs])
                    out = builder.select(pick, v, out)
                return builder.bitcast(out, args[0].type)
            i64 = ir.IntType(64)
            q = builder.bitcast(args[0], ir.VectorType(i64, 8))
            q = _shuffle(builder, q, q, [i // 8 for i in range(64)])
            v64 = ir.VectorType(i64, 64)
            fshr = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(v64, [v64, v64, v64]), "llvm.fshr.v64i64")
            amt = ir.Constant(v64, [ir.Constant(i64, o) for o in offs])
            return builder.trunc(builder.call(fshr, [q, q, amt]), args[0].type)

        return a(a), codegen

    return shift


@intrinsic
def clobber(typingctx, buf):
    """An empty inline-asm statement that may read and write ``buf`` (and any memory):
    what was stored to ``buf`` before it is in memory, and a :func:`load` or
    :func:`scalar_at` after it reads memory. For a small stack buffer
    (:func:`.bits.stack_f32`) that a kernel reloads from: without it LLVM forwards the
    stored vector to the loads, and a ``vpbroadcastq`` from memory (a load, no vector
    pipe) becomes a shuffle of registers (one on the shuffle pipes each)."""
    if not (isinstance(buf, types.Array) and buf.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        a = cgutils.create_struct_proxy(buf)(context, builder, value=args[0])
        ptr = builder.bitcast(a.data, ir.IntType(8).as_pointer())
        builder.asm(ir.FunctionType(ir.VoidType(), [ptr.type]), "", "r,~{memory}", [ptr], True)
        return context.get_dummy_value()

    return types.none(buf), codegen
