"""Which ops a backend runs (``supports_op``) and the bytes its buffer type gives a compute
tensor (``get_alloc_size``), read from the ``supports_op`` and ``compute_alloc_size``
entries of ``specs/backends/*.yaml``.

A ``supports_op`` entry may give ``require``, a rule every op must pass before its own
(Metal: no BF16 tensor without bfloat support), and maps ggml op names (as
:mod:`graphcost.graph.ops` names them: the sub-op for UNARY and GLU) to a rule: ``true``, ``false`` or an expression over the node,
transcribed from the backend's ``*_device_supports_op`` switch, e.g.
``contiguous(src0) and src0.type in ('F32', 'F16')``. Ops not listed take ``default``.

The expression language (a safe evaluator over :mod:`ast`, nothing else of Python):

* names: ``dst`` (the node), ``src0`` ... ``src5`` (its sources; ``has(src3)`` tests one
  is there), type names are strings (``'F32'``, ``'Q4_K'``), ``and``/``or``/``not``,
  comparisons including ``in`` over tuples, ``+ - * // %``;
* a tensor's fields: ``type``, ``ne0`` ... ``ne3``, ``nb0`` ... ``nb3``;
* functions mirroring ggml.c: ``contiguous(t)`` (ggml_is_contiguous), ``contiguous_1``,
  ``contiguous_2``, ``contiguous_rows``, ``quantized(t)`` (ggml_is_quantized),
  ``esize(t)`` (ggml_element_size), ``nrows(t)``, ``blck(t)`` (ggml_blck_size), ``permuted(t)`` (ggml_is_permuted), ``pow2ceil(x)``,
  ``transposed(t)`` (ggml_is_transposed), ``same_shape(a, b)`` (ggml_are_same_shape),
  ``tsize(t)`` (ggml_type_size), ``param(name, default)`` (the node's op parameter),
  ``opt(name, default)`` (the device option given with ``--device KIND,name=value``),
  ``flag(name, default)`` (a yes/no device option, :func:`device_flag`),
  ``unmodelled('what')`` (a case not transcribed: raises :class:`Unmodelled`),
  ``optn(name, default)`` (a numeric device option), ``all_sources_f32(n)`` (the first
  ``n`` sources there and F32; without ``n``, every source there F32),
  ``any_source_quantized(n)`` (one of the first ``n`` sources there and quantized);
* backend functions that are too long for one expression, written here and named after
  the ggml function they mirror: ``cuda_fattn_supported(dst)``
  (ggml-cuda/fattn.cu ``ggml_cuda_flash_attn_ext_supported``: a kernel other than
  ``BEST_FATTN_KERNEL_NONE``, :func:`cuda_fattn_kernel`), ``sycl_fattn_supported(dst)``
  (ggml-sycl/fattn.cpp ``ggml_sycl_flash_attn_ext_supported``, :func:`sycl_fattn_kernel`),
  ``vulkan_tensor_size_supported()`` and ``vulkan_mul_mat_supported()``
  (ggml-vulkan/ggml-vulkan.cpp ``ggml_backend_vk_device_supports_op``).

A rule that needs a fact graphcost does not know (a device property not given as an
option, a branch not transcribed) raises :class:`Unmodelled` with the reason; the
scheduler then reports that device's compute buffer as not modelled.
"""
from __future__ import annotations

import ast
import operator
from functools import lru_cache
from typing import Any, Callable

from graphcost.errors import GraphcostError
from graphcost.units import parse_bytes
from graphcost.format import ggml_types as gt
from graphcost.graph.ggml_graph import Tensor
from graphcost.graph.ops import Op


#: ggml.h GGML_MAX_SRC: the sources a node may have (src0 ... src9 in rules)
GGML_MAX_SRC = 10


class Unmodelled(Exception):
    """A backend rule needs something graphcost does not model (the message says what)."""


def type_name(t: Tensor) -> str:
    return gt.GGMLType(t.type).name


def contiguous_rows(t: Tensor) -> bool:
    """ggml_iscontiguous_rows (ggml.c)."""
    blk, size = gt.block(t.type)
    return t.ne[0] == blk or t.nb[0] == size


def _esize(t: Tensor) -> int:
    """ggml_element_size: ggml_type_size (bytes per block)."""
    return gt.type_size(t.type)


def _nrows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


class _T:
    """A tensor as rule expressions see it."""

    def __init__(self, t: Tensor) -> None:
        self.t = t

    def field(self, name: str) -> Any:
        t = self.t
        if name == "type":
            return type_name(t)
        if len(name) == 3 and name[:2] in ("ne", "nb") and name[2] in "0123":
            return (t.ne if name[:2] == "ne" else t.nb)[int(name[2])]
        raise KeyError(name)


_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.Gt: operator.gt,
        ast.LtE: operator.le, ast.GtE: operator.ge,
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def _tensor_fn(f: Callable[[Tensor], Any]) -> Callable[..., Any]:
    def g(x: Any) -> Any:
        if not isinstance(x, _T):
            raise Unmodelled("a rule asked about a source the node does not have")
        return f(x.t)
    return g


_TENSOR_FUNCS: dict[str, Callable[..., Any]] = {
    "contiguous": _tensor_fn(lambda t: t.is_contiguous(0)),
    "contiguous_1": _tensor_fn(lambda t: t.is_contiguous(1)),
    "contiguous_2": _tensor_fn(lambda t: t.is_contiguous(2)),
    "contiguous_rows": _tensor_fn(contiguous_rows),
    "quantized": _tensor_fn(lambda t: gt.is_quantized(t.type)),
    "esize": _tensor_fn(_esize),
    "tsize": _tensor_fn(lambda t: gt.type_size(t.type)),
    "blck": _tensor_fn(lambda t: gt.block(t.type)[0]),
    "nrows": _tensor_fn(_nrows),
    "permuted": _tensor_fn(lambda t: t.nb[0] > t.nb[1] or t.nb[1] > t.nb[2] or t.nb[2] > t.nb[3]),
    "transposed": _tensor_fn(lambda t: t.nb[0] > t.nb[1]),
    "dim01_contiguous": _tensor_fn(lambda t: dim01_contiguous(t)),
    "pow2ceil": lambda x: 1 << max(0, int(x) - 1).bit_length(),  # smallest power of 2 >= x
}


@lru_cache(maxsize=None)
def _parse(expr: str, where: str) -> ast.Expression:
    try:
        return ast.parse(f"({expr})", mode="eval")  # a rule may span lines (YAML folding)
    except SyntaxError:
        raise GraphcostError(f"{where}: cannot parse rule {expr!r}") from None


def evaluate(expr: Any, node: Tensor, options: dict[str, Any], where: str) -> bool:
    """A ``supports_op`` rule for ``node`` on a device with ``options``."""
    if isinstance(expr, bool):
        return expr
    tree = _parse(str(expr), where)
    names: dict[str, Any] = {"dst": _T(node)}
    for i in range(GGML_MAX_SRC):
        names[f"src{i}"] = _T(node.src[i]) if i < len(node.src) and node.src[i] is not None else None

    def call(fn: str, args: list[Any]) -> Any:
        if fn == "has":
            return args[0] is not None
        if fn == "param":
            return node.params.get(args[0], args[1] if len(args) > 1 else None)
        if fn == "opt":
            return options.get(args[0], args[1] if len(args) > 1 else None)
        if fn == "flag":
            return device_flag(options, args[0], bool(args[1]))
        if fn == "same_shape":
            if not isinstance(args[0], _T) or not isinstance(args[1], _T):
                raise Unmodelled(f"{where}: a rule asked about a source the node does not have")
            return args[0].t.ne == args[1].t.ne
        if fn == "cuda_fattn_supported":
            return cuda_fattn_kernel(node, options, choose=False) != "none"
        if fn == "unmodelled":  # a case of the switch not transcribed
            raise Unmodelled(f"{where}: {args[0]} is not transcribed")
        if fn == "sycl_fattn_supported":
            return sycl_fattn_kernel(node, options) != "none"
        if fn == "optn":
            return option_number(options, args[0], args[1])
        if fn == "all_sources_f32":
            return all_sources_f32(node, *args)
        if fn == "any_source_quantized":
            return any(s is not None and gt.is_quantized(s.type) for s in node.src[:args[0]])
        if fn == "vulkan_tensor_size_supported":
            return vulkan_tensor_size_supported(node, options)
        if fn == "vulkan_mul_mat_supported":
            return vulkan_mul_mat_supported(node)
        f = _TENSOR_FUNCS.get(fn)
        if f is None:
            raise GraphcostError(f"{where}: unknown function {fn!r} in {expr!r}")
        return f(*args)

    def ev(n: ast.AST) -> Any:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id in ("true", "True"):
                return True
            if n.id in ("false", "False"):
                return False
            if n.id not in names:
                raise GraphcostError(f"{where}: unknown name {n.id!r} in {expr!r}")
            return names[n.id]
        if isinstance(n, ast.Attribute):
            base = ev(n.value)
            if not isinstance(base, _T):
                raise Unmodelled(f"{where}: {expr!r} reads a source the node does not have")
            try:
                return base.field(n.attr)
            except KeyError:
                raise GraphcostError(f"{where}: unknown field {n.attr!r} in {expr!r}") from None
        if isinstance(n, (ast.Tuple, ast.List)):
            return tuple(ev(e) for e in n.elts)
        if isinstance(n, ast.BinOp) and type(n.op) in _BIN:
            return _BIN[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            return not ev(n.operand)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        if isinstance(n, ast.BoolOp):
            if isinstance(n.op, ast.And):
                return all(ev(v) for v in n.values)  # short-circuits like C's &&
            return any(ev(v) for v in n.values)
        if isinstance(n, ast.IfExp):
            return ev(n.body) if ev(n.test) else ev(n.orelse)
        if isinstance(n, ast.Compare):
            left = ev(n.left)
            for op, right in zip(n.ops, n.comparators):
                if type(op) not in _CMP:
                    break
                r = ev(right)
                if not _CMP[type(op)](left, r):
                    return False
                left = r
            else:
                return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and not n.keywords:
            return call(n.func.id, [ev(a) for a in n.args])
        raise GraphcostError(f"{where}: unsupported rule {expr!r}")

    return bool(ev(tree))


# ---- CUDA flash attention (ggml-cuda/fattn.cu) -------------------------------------------------

#: ggml-cuda/fattn-common.cuh: FATTN_KQ_STRIDE
FATTN_KQ_STRIDE = 256
#: fattn.cu ggml_cuda_fattn_kv_type_supported: K/V types with a vector-kernel template
FATTN_KV_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
#: ggml/CMakeLists.txt GGML_CUDA_FA_QUANTS default ("q4_0-q4_0;q8_0-q8_0;f16-f16;bf16-bf16",
#: GGML_CUDA_FA_ALL_QUANTS OFF): the (K, V) vector kernels compiled, for head sizes 64, 128,
#: 256 (fattn.cu FATTN_VEC_CASES_ALL_D); F32 K or V uses the F16 instance
FATTN_VEC_CASES = {("Q4_0", "Q4_0"), ("Q8_0", "Q8_0"), ("F16", "F16"), ("BF16", "BF16")}
#: ggml-cuda/common.cuh
CC_VOLTA, CC_TURING, CC_ADA_LOVELACE = 700, 750, 890
#: ggml-cuda/common.cuh AMD architectures, relative to GGML_CUDA_CC_OFFSET_AMD (gfx numbers)
AMD_CDNA1, AMD_RDNA1, AMD_RDNA3, AMD_RDNA4 = 0x908, 0x1010, 0x1100, 0x1200
AMD_GCN_APUS = (0x909, 0x90C)  # GGML_CUDA_CC_GFX909, GFX90C: GCN, not CDNA


#: the head-size switch of ggml_cuda_get_best_fattn_kernel: K head size -> (V head size,
#: None or (the GQA ratio's required multiple: the GQA optimisation needed)); None: V == K
CUDA_FATTN_HEADS: dict[int, tuple[int | None, int | None]] = {
    **{d: (None, None) for d in (40, 64, 72, 80, 96, 112, 128, 256)},
    192: (128, 8), 320: (256, 32), 512: (None, 1), 576: (512, 1)}
#: the same switch in ggml_sycl_get_best_fattn_kernel (ggml-sycl/fattn.cpp)
SYCL_FATTN_HEADS: dict[int, tuple[int | None, int | None]] = {
    **{d: (None, None) for d in (40, 64, 72, 80, 96, 112, 128, 256, 512)}, 576: (512, 1)}


def _head_sizes_ok(dk: int, dv: int, gqa_opt: bool, gqa_ratio: int,
                   table: dict[int, tuple[int | None, int | None]]) -> bool:
    """A K/V head-size pair the flash-attention switch accepts (``table``: see
    :data:`CUDA_FATTN_HEADS`)."""
    if dk not in table:
        return False
    want_dv, gqa_multiple = table[dk]
    if dv != (dk if want_dv is None else want_dv):
        return False
    return gqa_multiple is None or (gqa_opt and gqa_ratio % gqa_multiple == 0)


def _strides_16(*ts: Tensor | None) -> bool:
    """The GQA optimisation's stride condition (ggml_cuda_get_best_fattn_kernel,
    ggml_sycl_get_best_fattn_kernel): every non-quantized tensor's nb[1..3] a multiple of 16."""
    return all(t is None or gt.is_quantized(t.type) or not any(t.nb[i] % 16 for i in range(1, 4))
               for t in ts)


def _v_views_k(k: Tensor, v: Tensor) -> bool:
    """V views the same data as K (an MLA cache): the F16 copy of K serves V too."""
    return v.view_src is not None and (v.view_src is k or (
        v.view_src is k.view_src and v.view_offs == k.view_offs))


def _cc(options: dict[str, Any], why: str) -> int:
    """The device's compute capability as ggml numbers it (8.9 -> 890), from ``cc=8.9``."""
    cc = options.get("cc")
    if cc is None:
        raise Unmodelled(f"{why} depends on the GPU's compute capability: give it as "
                         "--device cuda[:MEM],cc=8.9")
    return int(round(float(cc) * 100))


def amd_arch(options: dict[str, Any], why: str) -> int:
    """An AMD GPU's architecture as ggml numbers it, less GGML_CUDA_CC_OFFSET_AMD, from
    ``arch=gfx1100`` (hipDeviceProp gcnArchName, as rocminfo prints it), parsed as
    ggml-cuda.cu ``ggml_cuda_parse_id`` does: ``gfx`` and any ``:xnack-`` suffix dropped,
    the last two hex digits the minor version, the rest the major (``gfx90a`` -> 0x90a,
    ``gfx1100`` -> 0x1100); ``gfx11-generic`` -> 0x1100."""
    name = options.get("arch")
    if name is None:
        raise Unmodelled(f"{why} depends on the AMD GPU's architecture: give it as "
                         "--device rocm[:MEM],arch=gfx1100")
    s = str(name).strip().lower()
    body = s[3:].split(":")[0] if s.startswith("gfx") else ""
    try:
        if body.endswith("-generic"):
            parts = body[:-len("-generic")].split("-")
            major = int(parts[0], 16)
            minor = 0x10 * int(parts[1], 16) if len(parts) > 1 and parts[1] else 0
        elif len(body) >= 3:
            major, minor = int(body[:-2], 16), int(body[-2:], 16)
        else:
            raise ValueError
    except ValueError:
        raise GraphcostError(f"--device rocm,arch={name}: not an AMD architecture name "
                             "(gfx1100, gfx90a, gfx942, ...)") from None
    return major * 0x100 + minor


def _amd_mfma(arch: int) -> bool:
    """amd_mfma_available (common.cuh; GGML_HIP_MMQ_MFMA is on by default): CDNA."""
    return AMD_CDNA1 <= arch < AMD_RDNA1 and arch not in AMD_GCN_APUS


def _amd_wmma(arch: int) -> bool:
    """amd_wmma_available (common.cuh): RDNA3, RDNA3.5, RDNA4."""
    return arch >= AMD_RDNA3


def cuda_fattn_kernel(dst: Tensor, options: dict[str, Any], *, choose: bool = True,
                      hip: bool = False) -> str:
    """ggml_cuda_get_best_fattn_kernel (ggml-cuda/fattn.cu) for an NVIDIA GPU with the
    kernels of its own architecture compiled (``ggml_cuda_highest_compiled_arch(cc) == cc``,
    a native build) and flash attention built (no ``GGML_CUDA_NO_FA``): ``none``
    (unsupported), ``vec``, ``tile`` or ``mma``. ``choose=False``: only whether it is
    supported (``none`` or ``some``), which does not depend on the GPU; the compute
    capability (device option ``cc``) is asked for only where the choice depends on it.
    ``hip``: the same function built for ROCm (an AMD GPU: no Turing/Volta tensor cores;
    the MFMA branch on CDNA, the WMMA branch on RDNA3/4; device option ``arch``)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    mask = dst.src[3] if len(dst.src) > 3 else None
    if q.ne[2] % k.ne[2]:
        return "none"  # GGML_ASSERT in ggml
    gqa_ratio = q.ne[2] // k.ne[2]
    max_bias = dst.params.get("max_bias", 0.0)
    gqa_opt = gqa_ratio >= 2 and mask is not None and max_bias == 0.0 and k.ne[1] % FATTN_KQ_STRIDE == 0
    gqa_opt = gqa_opt and _strides_16(q, k, v, mask)
    if not _head_sizes_ok(k.ne[0], v.ne[0], gqa_opt, gqa_ratio, CUDA_FATTN_HEADS):
        return "none"
    kt, vt = type_name(k), type_name(v)
    if kt not in FATTN_KV_TYPES or vt not in FATTN_KV_TYPES:
        return "none"
    if mask is not None and mask.ne[2] != 1:
        return "none"
    if not choose:
        return "some"  # every path below returns a kernel
    d = q.ne[0]
    can_vec = d <= 256 and d % 64 == 0 and d != 192 and k.ne[1] % FATTN_KQ_STRIDE == 0
    quant_kv = gt.is_quantized(k.type) or gt.is_quantized(v.type)
    if hip:
        return _amd_fattn_kernel(q, d, gqa_ratio, gqa_opt, can_vec, quant_kv,
                                 amd_arch(options, "the ROCm flash-attention kernel choice"))
    cc = _cc(options, "the CUDA flash-attention kernel choice")
    if cc >= CC_TURING and d not in (40, 72):
        if can_vec:
            if not quant_kv:
                if (cc >= CC_ADA_LOVELACE and q.ne[1] == 1 and q.ne[3] == 1
                        and not (gqa_ratio > 4 and (d >= 256 or k.ne[1] >= 8192))):
                    if gqa_opt and gqa_ratio > 4:
                        raise Unmodelled("the CUDA flash-attention sparse-decode choice "
                                         "(ggml_cuda_flash_attn_ext_mma_f16_shall_use_sparse) "
                                         "is not transcribed")
                    return "vec"
            elif cc >= CC_ADA_LOVELACE:
                if q.ne[1] <= 2:
                    return "vec"
            elif q.ne[1] == 1:
                return "vec"
            if not gqa_opt and q.ne[1] == 1:
                return "vec"
        return "mma"
    eff = _gqa_ratio_eff(d, gqa_ratio)
    if CC_VOLTA <= cc < CC_TURING and d not in (40, 72):
        if can_vec and q.ne[1] * eff <= 2:
            return "vec"
        return "tile" if q.ne[1] * eff <= 16 else "mma"
    return _vec_or_tile(q, can_vec, quant_kv, gqa_opt)


def _gqa_ratio_eff(d: int, gqa_ratio: int) -> int:
    """ggml_cuda_get_best_fattn_kernel's gqa_ratio_eff: the largest power of 2 dividing
    the GQA ratio, up to ncols2_max (32 for D 320, 16 for 576 and 192, else 8)."""
    ncols2_max = 32 if d == 320 else (16 if d in (576, 192) else 8)
    eff = 1
    while gqa_ratio % (2 * eff) == 0 and eff < ncols2_max:
        eff *= 2
    return eff


def _vec_or_tile(q: Tensor, can_vec: bool, quant_kv: bool, gqa_opt: bool) -> str:
    """ggml_cuda_get_best_fattn_kernel's last step, without tensor cores: the vector kernel
    for 1 token without the GQA optimisation (up to 2 with a quantized cache), else tile."""
    if can_vec:
        if not quant_kv:
            if q.ne[1] == 1 and not gqa_opt:
                return "vec"
        elif q.ne[1] <= 2:
            return "vec"
    return "tile"


def _amd_fattn_kernel(q: Tensor, d: int, gqa_ratio: int, gqa_opt: bool, can_vec: bool,
                      quant_kv: bool, arch: int) -> str:
    """The part of ggml_cuda_get_best_fattn_kernel an AMD GPU reaches (turing_mma_available
    and volta_mma_available are NVIDIA only): MFMA (CDNA) above a batch that grows with the
    head size, WMMA (RDNA3/4) for wide GQA tiles, then the vector kernel for 1 token (2
    with a quantized cache), else the tile kernel."""
    n = q.ne[1] * _gqa_ratio_eff(d, gqa_ratio)
    if _amd_mfma(arch) and d not in (40, 72):
        if ((d <= 64 and n > 8) or (d <= 128 and n > 16) or (d <= 256 and n > 64)
                or (d > 256 and gqa_opt and n > 128)):
            return "mma"
    if (_amd_wmma(arch) and gqa_opt and d <= 256 and d not in (40, 72)
            and n > (8 if d <= 128 else 16)):
        return "mma"
    return _vec_or_tile(q, can_vec, quant_kv, gqa_opt)


def cuda_fattn_alloc_size(dst: Tensor, options: dict[str, Any], *, hip: bool = False) -> int:
    """ggml_cuda_flash_attn_ext_get_alloc_size (ggml-cuda/fattn.cu): the result, then (each
    at a 128-byte boundary) F16 copies of K and of V when the chosen kernel needs F16 and
    they are not F16 (ggml_cuda_flash_attn_ext_get_f16_extra_data; V shares K's copy when
    it is a view of the same data)."""
    k, v = dst.src[1], dst.src[2]
    kt, vt = type_name(k), type_name(v)
    end = dst.nbytes
    if kt == "F16" and vt == "F16":
        return end  # no F16 copies whatever the kernel
    kernel = cuda_fattn_kernel(dst, options, hip=hip)
    if kernel in ("tile", "mma"):
        need_k = need_v = True
    elif kernel == "vec":
        kk = "F16" if kt == "F32" else kt
        vv = "F16" if vt == "F32" else vt
        fallback = (kk, vv) not in FATTN_VEC_CASES or dst.src[0].ne[0] not in (64, 128, 256)
        need_k = kt == "F32" or fallback
        need_v = vt == "F32" or fallback
    else:
        need_k = need_v = False
    f16 = gt.type_size(gt.GGMLType.F16)
    k_copy = None
    if need_k and kt != "F16":
        end = gt.ggml_pad(end, 128)
        k_copy = end
        end += k.n_elements * f16
    if need_v and vt != "F16":
        if not (_v_views_k(k, v) and k_copy is not None):
            end = gt.ggml_pad(end, 128)
            end += v.n_elements * f16
    return end


# ---- SYCL flash attention (ggml-sycl/fattn.cpp, fattn-onednn.cpp) ----------------------------

#: ggml-sycl/fattn-onednn.cpp GGML_SYCL_FA_ONEDNN_MIN_Q: the oneDNN SDPA is for prefill
SYCL_ONEDNN_MIN_Q = 32
#: K/V types fattn-onednn.cpp dequantizes to F16 for the SDPA
SYCL_ONEDNN_KV_TYPES = ("F32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
#: ggml-sycl/common.hpp SYCL_BUFFER_ALIGNMENT
SYCL_BUFFER_ALIGNMENT = 128


def device_flag(options: dict[str, Any], name: str, default: bool) -> bool:
    """A yes/no device option (``integrated=1``, ``fusion=0``, ``onednn=0``): 1/true/yes/on
    is yes, 0/false/no/off is no; absent, ``default``; anything else is refused in one line
    (a typo such as ``bfloat=2`` must not silently mean the default)."""
    if name not in options:
        return default
    v = str(options[name]).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise GraphcostError(f"device option {name}={options[name]}: use 1 or 0 "
                         "(also yes/no, true/false, on/off)")


def _sycl_arch(options: dict[str, Any]) -> str:
    """The Intel GPU family (device option ``arch``: ``dg2`` Alchemist/Arc A, ``bmg``
    Battlemage; anything else, and the default, is neither)."""
    return str(options.get("arch", "")).strip().lower()


def sycl_onednn_supported(dst: Tensor, options: dict[str, Any], use_shape_limit: bool = True) -> bool:
    """ggml_sycl_flash_attn_ext_onednn_supported (ggml-sycl/fattn-onednn.cpp), for a build
    with oneDNN (GGML_SYCL_DNN, on by default; device option ``onednn=0`` for a build
    without it or GGML_SYCL_FA_ONEDNN=0) and GGML_SYCL_FA_ONEDNN_MAX_KV unset."""
    if not device_flag(options, "onednn", True):
        return False
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    mask = dst.src[3] if len(dst.src) > 3 else None
    sinks = dst.src[4] if len(dst.src) > 4 else None
    kt, vt = type_name(k), type_name(v)
    if kt != "F16" or vt != "F16":
        if kt not in SYCL_ONEDNN_KV_TYPES or vt not in SYCL_ONEDNN_KV_TYPES:
            return False
        if use_shape_limit and (q.ne[1] < SYCL_ONEDNN_MIN_Q or k.ne[1] < 1024):
            return False
        if any(type_name(t) == "F16" and t.nb[1] % (t.ne[0] * 2) for t in (k, v)):
            return False
    if _sycl_arch(options).startswith("dg2") and k.ne[0] == 64:
        return False  # the Alchemist SDPA gate
    if (mask is None or type_name(mask) != "F16" or mask.ne[2] != 1 or mask.ne[3] != 1
            or sinks is not None):
        return False
    if dst.params.get("max_bias", 0.0) != 0.0 or dst.params.get("softcap", 0.0) != 0.0:
        return False
    if v.ne[0] != k.ne[0] or q.ne[3] != 1:
        return False
    if k.ne[2] == 0 or q.ne[2] % k.ne[2]:
        return False
    if use_shape_limit and q.ne[1] < SYCL_ONEDNN_MIN_Q:
        return False
    return True


def sycl_fattn_kernel(dst: Tensor, options: dict[str, Any]) -> str:
    """ggml_sycl_get_best_fattn_kernel (ggml-sycl/fattn.cpp) with the default build and
    environment (SYCL_FLASH_ATTN defined in common.hpp, GGML_SYCL_ENABLE_FLASH_ATTN and
    GGML_SYCL_ENABLE_MKL_FA unset = 1, no GGML_SYCL_FA_ALL_QUANTS): ``none``, ``onednn``
    (prefill, from 32 tokens), ``mkl`` (GQA prefill over >= 1024 cells), ``vec`` or
    ``tile``."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    mask = dst.src[3] if len(dst.src) > 3 else None
    sinks = dst.src[4] if len(dst.src) > 4 else None
    if q.ne[2] % k.ne[2]:
        return "none"  # GGML_ASSERT in ggml
    gqa_ratio = q.ne[2] // k.ne[2]
    max_bias = dst.params.get("max_bias", 0.0)
    softcap = dst.params.get("softcap", 0.0)
    gqa_opt = gqa_ratio >= 2 and mask is not None and max_bias == 0.0 and k.ne[1] % FATTN_KQ_STRIDE == 0
    if q.ne[1] >= SYCL_ONEDNN_MIN_Q and sycl_onednn_supported(dst, options):
        return "onednn"
    if (mask is not None and sinks is None and gqa_ratio >= 2
            and 64 <= q.ne[0] <= 512 and q.ne[0] % 64 == 0 and q.ne[0] == v.ne[0]
            and q.ne[1] >= 32 and k.ne[1] >= 1024 and max_bias == 0.0 and softcap == 0.0
            and (q.ne[3] == k.ne[3] or k.ne[3] == 1)
            and not any(type_name(t) == "F16" and t.nb[1] % (t.ne[0] * 2) for t in (k, v))):
        return "mkl"
    gqa_opt = gqa_opt and _strides_16(q, k, v, mask)
    if not _head_sizes_ok(k.ne[0], v.ne[0], gqa_opt, gqa_ratio, SYCL_FATTN_HEADS):
        return "none"
    kt, vt = type_name(k), type_name(v)
    if kt != vt or kt not in ("F32", "F16", "BF16", "Q4_0", "Q8_0"):
        return "none"  # Q4_1, Q5_0, Q5_1 need GGML_SYCL_FA_ALL_QUANTS
    if mask is not None and mask.ne[2] != 1:
        return "none"
    if sycl_onednn_supported(dst, options):
        return "onednn"
    can_vec = (q.ne[0] <= 512 and q.ne[0] % 64 == 0 and k.ne[1] % FATTN_KQ_STRIDE == 0
               and "BF16" not in (kt, vt))
    if can_vec:
        if not gt.is_quantized(k.type) and not gt.is_quantized(v.type):
            if q.ne[1] == 1 and not gqa_opt:
                return "vec"
        elif q.ne[1] <= 2:
            return "tile" if _sycl_arch(options).startswith("bmg") else "vec"
    return "tile"


def sycl_fattn_alloc_size(dst: Tensor, options: dict[str, Any]) -> int:
    """ggml_sycl_flash_attn_ext_get_alloc_size = ggml_sycl_fattn_get_extra(dst).end
    (ggml-sycl/fattn.cpp): the result, then, each at a 128-byte boundary
    (SYCL_BUFFER_ALIGNMENT), the worst case over the kernels, whichever runs: with oneDNN
    possible for the shape (without its size limits) a dense F16 Q (heads x tokens x D),
    F16 K and V unless both are F16 caches bound in place, a 2-byte scale and an F16
    output; the tile kernel's F16 K and V for a non-F16 cache (V shares K's copy when it
    views the same data and oneDNN is out)."""
    q, k, v = dst.src[0], dst.src[1], dst.src[2]
    d, heads, tokens = k.ne[0], q.ne[2], q.ne[1]
    onednn = sycl_onednn_supported(dst, options, use_shape_limit=False)
    kt, vt = type_name(k), type_name(v)
    v_is_k = _v_views_k(k, v)
    need_k = need_v = need_q = need_out = need_scale = 0
    if onednn:
        need_q = need_out = heads * tokens * d
        need_scale = 1

        def bindable(t: Tensor) -> bool:
            return t.nb[0] == 2 and all(t.nb[i] % 2 == 0 for i in (1, 2, 3))
        if not (kt == "F16" and vt == "F16" and bindable(k) and bindable(v)):
            need_k, need_v = k.n_elements, v.n_elements
    if kt != "F16":
        need_k = max(need_k, k.n_elements)
    if vt != "F16":
        need_v = max(need_v, v.n_elements)
    end = dst.nbytes
    half = gt.type_size(gt.GGMLType.F16)

    def reserve(n: int) -> None:
        nonlocal end
        if n:
            end = gt.ggml_pad(end, SYCL_BUFFER_ALIGNMENT) + n * half
    reserve(need_q)
    reserve(need_k)
    if not (v_is_k and not onednn and need_v):
        reserve(need_v)
    reserve(need_scale)
    reserve(need_out)
    return end


# ---- Metal: ggml_backend_metal_buffer_type_get_alloc_size (ggml-metal/ggml-metal.cpp) ----------

#: ggml-metal/ggml-metal-impl.h: N_MM_NPART_AMAX (per-threadgroup scales of MUL_MAT_ID's stage 1)
METAL_N_MM_NPART_AMAX = 256
#: ggml-metal-impl.h: queries and KV cells per simdgroup of the flash-attention kernels
METAL_FA_NQPSG, METAL_FA_NCPSG = 8, 64
METAL_FA_VEC_NQPSG, METAL_FA_VEC_NCPSG = 1, 32
#: ggml_metal_op_flash_attn_ext_n_kv_max_sparse: (K, V) head sizes with a sparse vec kernel
METAL_FA_SPARSE_HEADS = {(32, 32), (64, 64), (96, 96), (96, 64), (128, 128), (192, 128),
                         (192, 192), (256, 256), (320, 256), (512, 512), (576, 512)}
#: ggml_metal_op_flash_attn_ext_use_kv_f16 / _n_kv_max_sparse: the quantized caches dequantized
METAL_FA_QUANT_KV = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def metal_mul_mat_id_alloc_size(t: Tensor) -> int:
    """ggml_nbytes + ggml_metal_op_mul_mat_id_extra_tpe (an I32 per expert) + _extra_ids
    (an I32 per expert and token) + _extra_amax (8 + 4 x N_MM_NPART_AMAX) (ggml-metal-ops.cpp).
    ``src0`` [K, N, n_expert], ``src2`` (ids) [n_expert_used, n_tokens]."""
    i32 = gt.type_size(gt.GGMLType.I32)
    n_expert, n_tokens = t.src[0].ne[2], t.src[2].ne[1]
    return t.nbytes + i32 * n_expert + i32 * n_expert * n_tokens + 8 + METAL_N_MM_NPART_AMAX * 4


def metal_fattn_alloc_size(t: Tensor) -> int:
    """ggml_nbytes + the flash-attention scratch ggml-metal-ops.cpp always reserves (to avoid
    graph reallocations), for Q [D, tokens, heads, seqs], K/V [D, cells, kv_heads, streams]
    and a mask [cells, tokens, ...]:

    * ``_extra_pad``: NCPSG (64) padding cells of K and V rows (as F16 rows when a quantized
      cache is dequantized, ``_use_kv_f16``: >= 32 tokens of Q4_0..Q8_0) and of F16 mask rows;
    * ``_extra_blk``: one byte per (query block, cell block) of the mask, padded to 32 (the vec
      kernel's blocks below 20 tokens with a head size divisible by 32: 1 x 32, else 8 x 64);
    * ``_extra_tmp``: F32 partial results of 32 workgroups: min(tokens, 32) x heads x seqs x
      32 x (V head size + 2);
    * ``_extra_kv_f16``: F16 copies of K and of V (none for a V viewing K), each padded to 16;
    * ``_extra_idx``: the sparse index lists, only when op_params[4] (n_kv_max) is set
      (``ggml_flash_attn_ext_set_n_kv_max``; 0 for every graph graphcost builds)."""
    q, k, v = t.src[0], t.src[1], t.src[2]
    mask = t.src[3] if len(t.src) > 3 else None
    f16 = gt.type_size(gt.GGMLType.F16)
    m_ne = mask.ne if mask is not None else (0, 0, 0, 0)
    v_is_k = _v_views_k(k, v)
    use_kv_f16 = q.ne[1] >= 32 and type_name(k) in METAL_FA_QUANT_KV
    nb11, nb21 = k.nb[1], v.nb[1]
    if use_kv_f16:
        nb11 = f16 * k.ne[0]
        nb21 = f16 * (k.ne[0] if v_is_k else v.ne[0])
    pad = METAL_FA_NCPSG * (nb11 * k.ne[2] * k.ne[3] + nb21 * v.ne[2] * v.ne[3]
                            + (f16 * m_ne[1] * m_ne[2] * m_ne[3] if mask is not None else 0))
    blk = 0
    if mask is not None:
        is_vec = q.ne[1] < 20 and q.ne[0] % 32 == 0  # ggml_metal_op_flash_attn_ext_use_vec
        nqptg = METAL_FA_VEC_NQPSG if is_vec else METAL_FA_NQPSG
        ncpsg = METAL_FA_VEC_NCPSG if is_vec else METAL_FA_NCPSG
        blocks = -(-q.ne[1] // nqptg) * -(-m_ne[0] // ncpsg)
        blk = gt.ggml_pad(blocks * m_ne[2] * m_ne[3], 32)
    tmp = 4 * (min(q.ne[1], 32) * q.ne[2] * q.ne[3] * 32 * (v.ne[0] + 2))
    kv = gt.ggml_pad(f16 * k.n_elements, 16)
    if not v_is_k:
        kv += gt.ggml_pad(f16 * v.n_elements, 16)
    idx = 0
    n_kv_max = int(t.params.get("n_kv_max", 0))
    if (0 < n_kv_max <= 4096 and mask is not None and (k.ne[0], v.ne[0]) in METAL_FA_SPARSE_HEADS
            and type_name(k) in ("F16", "BF16", "F32") + METAL_FA_QUANT_KV):
        idx = gt.ggml_pad(4 * gt.ggml_pad(n_kv_max, METAL_FA_VEC_NCPSG) * m_ne[1] * m_ne[2] * m_ne[3], 16)
    return t.nbytes + pad + blk + tmp + kv + idx


def metal_top_k_alloc_size(t: Tensor) -> int:
    """TOP_K: 2 x sizeof(int32_t) x ggml_nelements(src0), whatever the result's size."""
    return 2 * gt.type_size(gt.GGMLType.I32) * t.src[0].n_elements


# ---- Vulkan: ggml_backend_vk_device_supports_op (ggml-vulkan/ggml-vulkan.cpp) ----------------

#: maxStorageBufferRange assumed when not given (device option ``storage_range``): 2^32 - 1,
#: the most a 32-bit range says, what discrete NVIDIA and AMD (RADV) drivers report
VK_STORAGE_RANGE = (1 << 32) - 1
#: the src0 types the MUL_MAT / MUL_MAT_ID switch accepts
VK_MUL_MAT_TYPES = frozenset((
    "F32", "F16", "BF16", "Q1_0", "Q2_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
    "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
    "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ4_NL", "MXFP4", "NVFP4", "TQ1_0", "TQ2_0"))


def option_number(options: dict[str, Any], name: str, default: int) -> int:
    """A numeric device option (``shared_memory=65536``); absent: ``default``."""
    v = options.get(name)
    if v is None:
        return default
    try:
        return int(str(v), 0)
    except ValueError:
        raise GraphcostError(f"device option {name}={v}: not a whole number") from None


def option_bytes(options: dict[str, Any], name: str, default: int) -> int:
    """A size device option in bytes, with a unit or without (``max_buffer=4GiB``,
    ``storage_range=4294967295``); absent: ``default``."""
    v = options.get(name)
    return default if v is None else parse_bytes(str(v), f"device option {name}=")


def all_sources_f32(t: Tensor, n: int | None = None) -> bool:
    """Every source F32: with ``n``, the first ``n`` sources must be there (GATED_DELTA_NET's
    loop over 6); without, every source that is there (the DSV4_HC loops over GGML_MAX_SRC)."""
    if n is None:
        srcs = [s for s in t.src if s is not None]
    else:
        srcs = list(t.src[:n]) + [None] * max(0, n - len(t.src))
    return all(s is not None and type_name(s) == "F32" for s in srcs)


def dim01_contiguous(t: Tensor) -> bool:
    """ggml_vk_dim01_contiguous: dense rows, rows dense in a matrix, matrices dense in ne3."""
    blk, size = gt.block(t.type)
    return (t.nb[0] == size and t.nb[1] == t.nb[0] * t.ne[0] // blk
            and (t.ne[3] == 1 or t.nb[3] == t.nb[2] * t.ne[2]))


def vulkan_tensor_size_supported(t: Tensor, options: dict[str, Any]) -> bool:
    """supports_op's first check: every source and the result have ggml_nbytes within the
    device's max_buffer_size (device option ``max_buffer``; default no limit) and, unless
    VK_EXT_shader_64bit_indexing (``int64_indexing=1``) or an IM2COL/IM2COL_3D with
    shaderInt64 and bufferDeviceAddress (``bda``, default 1), within maxStorageBufferRange
    (``storage_range``, default :data:`VK_STORAGE_RANGE`)."""
    max_buffer = option_bytes(options, "max_buffer", 0)
    storage = option_bytes(options, "storage_range", VK_STORAGE_RANGE)
    uses_bda = t.op in (Op.IM2COL, Op.IM2COL_3D) and device_flag(options, "bda", True)
    unlimited_range = uses_bda or device_flag(options, "int64_indexing", False)
    for x in [s for s in t.src if s is not None] + [t]:
        if max_buffer and x.nbytes > max_buffer:
            return False
        if not unlimited_range and x.nbytes > storage:
            return False
    return True


def vulkan_mul_mat_supported(t: Tensor) -> bool:
    """The MUL_MAT / MUL_MAT_ID case after MUL_MAT_ID's own checks: a src0 type with shaders;
    ``a`` (src0, or MUL_MAT_ID's ids src2) and src1 agree on ne3; a source that is not a
    float type (src0: F32/F16/BF16, src1: F32/F16) must be dim01-contiguous; no BF16 x F16;
    a BF16 src1 only with a BF16 src0."""
    src0, src1 = t.src[0], t.src[1]
    t0, t1 = type_name(src0), type_name(src1)
    if t0 not in VK_MUL_MAT_TYPES:
        return False
    a = src0 if t.op == Op.MUL_MAT else t.src[2]
    if a.ne[3] != src1.ne[3]:
        return False
    if not (dim01_contiguous(src0) or t0 in ("F32", "F16", "BF16")):
        return False
    if not (dim01_contiguous(src1) or t1 in ("F32", "F16")):
        return False
    if t0 == "BF16" and t1 == "F16":
        return False  # no bf16 x f16 shader
    return not (t1 == "BF16" and t0 != "BF16")


def compute_alloc_size(rule: dict | None, t: Tensor, options: dict[str, Any]) -> int:
    """A buffer type's get_alloc_size for a compute tensor, from its spec's
    ``compute_alloc_size``: ``quantized_row_padding`` (quantized tensors whose ``ne0`` is not
    a multiple of ``row_padding`` get ``ggml_row_size(type, row_padding - ne0 % row_padding)``
    more), and per-op sizes (``FLASH_ATTN_EXT: cuda_fattn``, ``hip_fattn``, ``sycl_fattn``,
    ``metal_fattn``; ``MUL_MAT_ID: metal_mul_mat_id``; ``TOP_K: metal_top_k``; ``double``:
    twice ggml_nbytes, Metal's CUMSUM and ARGSORT)."""
    if not rule:
        return t.nbytes
    per_op = rule.get("ops") or {}
    fn = per_op.get(str(t.op))
    if fn == "cuda_fattn":
        size = cuda_fattn_alloc_size(t, options)
    elif fn == "sycl_fattn":
        size = sycl_fattn_alloc_size(t, options)
    elif fn == "hip_fattn":
        size = cuda_fattn_alloc_size(t, options, hip=True)
    elif fn == "metal_mul_mat_id":
        size = metal_mul_mat_id_alloc_size(t)
    elif fn == "metal_fattn":
        size = metal_fattn_alloc_size(t)
    elif fn == "metal_top_k":
        size = metal_top_k_alloc_size(t)
    elif fn == "double":
        size = 2 * t.nbytes
    elif fn is None:
        size = t.nbytes
    else:
        raise GraphcostError(f"compute_alloc_size: unknown rule {fn!r} for {t.op}")
    pad = rule.get("row_padding")
    if pad and gt.is_quantized(t.type) and t.ne[0] % pad:
        size += gt.row_size(t.type, pad - t.ne[0] % pad)
    return size
