"""mul_mat: y[N, M] = x[N, K] @ W[M, K].T for a raw (quantized) weight, two variants.

``W`` is ggml's ``src0`` with ne = [K, M] (M rows of K, as stored in the GGUF),
``x`` is ``src1`` with ne = [K, N] (numpy ``[N, K]``) and ``y`` is ne = [M, N]
(numpy ``[N, M]``). FLOPs: 2*N*M*K (an FMA counts 2). Bytes read: the weight once
(``M * row_bytes``) plus ``x``.

* :func:`mul_mat` -- float32 math on the weight decoded on the fly. Two paths:

  - matrix-vector (N <= ``MATVEC_MAX_N``, decode): every weight row is streamed once
    from memory and dotted with each x row while it sits in L1
    (:func:`.vec_dot.dot_row`); threads split the rows. Memory-bound by design.
  - tiled (larger N, prompt processing): a tile of ``TILE_BYTES`` of weight rows is
    decoded into a per-thread float32 buffer (never the whole matrix) and multiplied
    by all of ``x``, four rows at a time.

  Validated against ``dequantize(W) @ x`` (gguf-py's dequantizer, float64 matmul)
  to a relative 1e-5 of ``|x| @ |W|.T``.

* :func:`mul_mat_ggml` -- what llama.cpp computes: x is first quantized to the
  weight's vec_dot_type (:func:`.quants.quantize_activations`) and each output is
  ggml's block dot product (:func:`.vec_dot_ggml.dot_row_ggml`). Validated bit for
  bit against the numpy reimplementation :func:`mul_mat_ggml_ref`. More than
  ``MATVEC_MAX_N`` activation rows on Q4_0/Q5_0/Q4_1/Q5_1/Q4_K/Q6_K weights take :mod:`.gemm`
  (each weight block unpacked once per call, not once per activation row).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from numba import njit, prange

from . import gemm
from .bits import prefer_512bit
from .quants import VEC_DOT_TYPE, check_weight, dequantize_ref, dequantize_row, \
    quantize_activations, quantize_activations_ref, quantize_row, row_bytes
from .vec_dot import dot_row, x_sums16
from .vec_dot_ggml import FLOAT_CODES as GGML_FLOAT_CODES
from .vec_dot_ggml import dot_row_ggml, dot_rows_ggml_ref, matvec_ggml_float
from .vec_dot_simd import CODES as SIMD_CODES
from .vec_dot_simd import dot_groups4_simd, dot_row_simd, prep_bytes, prepare_row

#: largest batch that takes the matrix-vector path
MATVEC_MAX_N = 4
#: bytes of decoded float32 weight rows per thread in the tiled path (fits in L2)
TILE_BYTES = 512 * 1024
#: mul_mat_ggml on quantized weights uses the byte-SIMD dots of .vec_dot_simd (same
#: results as the scalar .vec_dot_ggml, which ``False`` selects)
GGML_SIMD = True
#: weight types (codes) for which mul_mat_ggml is faster than mul_mat: the block types
#: with byte-SIMD dots (benchmarks/bench_kernels.py: 2-4x the float path's bandwidth)
GGML_FASTEST = frozenset(SIMD_CODES) if GGML_SIMD else frozenset()
#: weight bytes a mul_mat_ggml task multiplies by every activation row before moving on
GGML_TASK_BYTES = 64 * 1024
#: weight bytes below which :func:`fused_matvec` runs on the calling thread (a parallel
#: region costs ~5 us to wake idle workers, more on a loaded machine; 64 KB of weights
#: take ~5 us on one core)
SERIAL_BELOW = 64 * 1024
#: the fused matvec's tasks (one dot_groups4_simd call each): at most this many 4-row
#: groups a task (a Q3_K call per four rows cost ~70 ns, ~28% of their time at K = 4096)
MATVEC_TASK_GROUPS = 16
#: ... and at least this many tasks a matvec (so that as many threads can share it)
MATVEC_MIN_TASKS = 16
#: a matvec group's members are padded to a multiple of this many (with members of no
#: rows), so that groups of 2, 3 or 4 (gate/up, Q/K/V) share one compile of the kernel
GROUP_PAD = 4


# ---------------------------------------------------------------------------- reference


def mul_mat_ref(w_raw: np.ndarray, w_type: QT, k: int, m: int, x: np.ndarray) -> np.ndarray:
    """numpy reference: ``x @ dequantize(W).T`` in float64, returned as float32."""
    w = dequantize_ref(w_raw, w_type, k)[:m]
    return (np.asarray(x, dtype=np.float64) @ w.T.astype(np.float64)).astype(np.float32)


def mul_mat_ggml_ref(w_raw: np.ndarray, w_type: QT, k: int, m: int, x: np.ndarray,
                     x86: bool = True) -> np.ndarray:
    """numpy reference of :func:`mul_mat_ggml`: quantize x (numpy), then ggml's dots."""
    w = check_weight(w_raw, w_type, k)[:m]
    yq = quantize_activations_ref(np.atleast_2d(x), VEC_DOT_TYPE[QT(w_type)], x86)
    return dot_rows_ggml_ref(w, w_type, yq)


# ---------------------------------------------------------------------------- kernels


@njit(parallel=True, cache=True)
def _matvec(w, code, x, y):
    # W:[M, row_bytes] x:[N, K] -> y:[N, M]; each weight row is read from memory once
    n_rows, k = x.shape
    xs = np.empty((n_rows, k // 16), dtype=np.float32)
    for n in range(n_rows):
        x_sums16(x[n], xs[n])
    for r in prange(w.shape[0]):
        row = w[r]
        for n in range(n_rows):
            y[n, r] = dot_row(code, row, x[n], xs[n])


@njit(inline="always", fastmath=True, cache=True)
def _tile_times_x(tile, nt, x, y, m0):
    # tile:[nt, K] (decoded rows m0..m0+nt) x:[N, K] -> y[:, m0:m0+nt]; 4 rows share x loads
    k = x.shape[1]
    for n in range(x.shape[0]):
        xn = x[n]
        i = 0
        while i + 4 <= nt:
            s0 = s1 = s2 = s3 = np.float32(0)
            for c in range(k):
                v = xn[c]
                s0 += tile[i, c] * v
                s1 += tile[i + 1, c] * v
                s2 += tile[i + 2, c] * v
                s3 += tile[i + 3, c] * v
            y[n, m0 + i], y[n, m0 + i + 1], y[n, m0 + i + 2], y[n, m0 + i + 3] = s0, s1, s2, s3
            i += 4
        while i < nt:
            s = np.float32(0)
            for c in range(k):
                s += tile[i, c] * xn[c]
            y[n, m0 + i] = s
            i += 1


@njit(parallel=True, fastmath=True, cache=True)
def _matmul_tiled(w, code, x, y, tile_rows):
    m_rows, k = w.shape[0], x.shape[1]
    n_tiles = (m_rows + tile_rows - 1) // tile_rows
    for t in prange(n_tiles):
        prefer_512bit()
        m0 = t * tile_rows
        nt = min(tile_rows, m_rows - m0)
        tile = np.empty((tile_rows, k), dtype=np.float32)
        for i in range(nt):
            dequantize_row(code, w[m0 + i], tile[i])
        _tile_times_x(tile, nt, x, y, m0)


@njit(parallel=True, cache=True)
def _matmul_ggml(w, code, yq, y):
    for r in prange(w.shape[0]):
        row = w[r]
        for n in range(yq.shape[0]):
            y[n, r] = dot_row_ggml(code, row, yq[n])


@njit(inline="always", cache=True)
def _simd_task(w, code, yq, yp, y, r0, r1):
    # weight rows r0..r1 times every activation row: the task's rows stay in cache across
    # the N rows and go four at a time (dot_groups4_simd)
    r4 = r0 + (r1 - r0) // 4 * 4
    for n in range(yq.shape[0]):
        yqn, ypn, yn = yq[n], yp[n], y[n]
        dot_groups4_simd(code, w, r0, r4, yqn, ypn, yn)
        for r in range(r4, r1):
            yn[r] = dot_row_simd(code, w[r], yqn, ypn)


@njit(parallel=True, cache=True)
def _matmul_ggml_simd(w, code, yq, prep, y, task_rows):
    # W:[M, row_bytes] yq:[N, .] -> y:[N, M]. Each activation row is rearranged once
    # (prepare_row, prep bytes), then tasks of task_rows weight rows (a multiple of 4)
    yp = np.empty((yq.shape[0], prep), dtype=np.uint8)
    for n in range(yq.shape[0]):
        prepare_row(code, yq[n], yp[n])
    m = w.shape[0]
    for t in prange((m + task_rows - 1) // task_rows):
        _simd_task(w, code, yq, yp, y, t * task_rows, min(m, (t + 1) * task_rows))


@njit(inline="always", cache=True)
def _quantize_prepare(code, x, qcode, x86, yq, yp):
    for n in range(x.shape[0]):
        quantize_row(x[n], qcode, x86, yq[n])
        prepare_row(code, yq[n], yp[n])


@njit(parallel=True, cache=True)
def _matvec_ggml_fused(w, code, x, qcode, x86, yq, yp, y):
    # mul_mat_ggml for a few activation rows (N <= MATVEC_MAX_N) in one call: quantize x
    # into yq, rearrange into yp (both preallocated), then the weight rows four at a
    # time, one contiguous span per thread
    _quantize_prepare(code, x, qcode, x86, yq, yp)
    m = w.shape[0]
    groups = (m + 3) // 4
    tasks = min(groups, max(MATVEC_MIN_TASKS, -(-groups // MATVEC_TASK_GROUPS)))
    for t in prange(tasks):                 # numba hands each thread one even span of tasks
        g0, g1 = groups * t // tasks, groups * (t + 1) // tasks
        _simd_task(w, code, yq, yp, y, 4 * g0, min(m, 4 * g1))


@njit(cache=True)
def _matvec_ggml_fused_serial(w, code, x, qcode, x86, yq, yp, y):
    # _matvec_ggml_fused on the calling thread (small weights: no parallel region)
    _quantize_prepare(code, x, qcode, x86, yq, yp)
    # np.int64(0): a literal 0 would type r0 Literal[int] and compile every _groups4_<t> again
    _simd_task(w, code, yq, yp, y, np.int64(0), w.shape[0])


def fused_matvec(w_type: QT, k: int, m: int, n: int, x86: bool = True):
    """``(kernel, code, tail)`` running :func:`mul_mat_ggml` of ``n <= MATVEC_MAX_N``
    activation rows as one numba call ``kernel(w, code, x, *tail, y)`` (w raw ``[m,
    row_bytes]`` as :func:`.quants.check_weight` returns it, x C-contiguous float32 ``[n,
    k]``, y ``[n, m]``), with the quantized and rearranged activation buffers (in
    ``tail``) allocated here, once; serial below ``SERIAL_BELOW`` weight bytes. ``None``
    where :func:`mul_mat_ggml` does not take the byte-SIMD path or n is larger. Same
    results as :func:`mul_mat_ggml` (the same quantizer and dots)."""
    code = np.int64(QT(w_type))
    if not (GGML_SIMD and code in SIMD_CODES) or not 1 <= n <= MATVEC_MAX_N:
        return None
    qtype = VEC_DOT_TYPE[QT(w_type)]
    yq = np.empty((n, row_bytes(qtype, k)), dtype=np.uint8)
    yp = np.empty((n, prep_bytes(code, k)), dtype=np.uint8)
    small = m * row_bytes(QT(w_type), k) < SERIAL_BELOW
    kern = _matvec_ggml_fused_serial if small else _matvec_ggml_fused
    return kern, code, (np.int64(qtype), x86, yq, yp)


@njit(parallel=True, cache=True)
def _matvecs_ggml_fused(ws, codes, x, qcodes, x86, yqs, yps, ys, shares):
    # several _matvec_ggml_fused of one x in one parallel region (ws[i] ... ys[i]:
    # homogeneous tuples): each member quantized and rearranged first, then shares[0]
    # even shares of every member's 4-row groups (the thread count: one share a thread,
    # so that the threads' work is even whatever the members' types cost a byte; spans
    # of MATVEC_TASK_GROUPS groups, as the single matvec's tasks). The count comes in an
    # array: numba.get_num_threads() here would keep the kernel out of numba's cache.
    # Members with no rows pad the tuples to GROUP_PAD (group_matvecs): no work
    n = len(ws)
    for i in range(n):
        if ws[i].shape[0]:
            _quantize_prepare(codes[i], x, qcodes[i], x86, yqs[i], yps[i])
    nth = max(1, shares[0])
    for t in prange(nth):                   # one iteration a thread
        for i in range(n):
            w = ws[i]
            m = w.shape[0]
            groups = (m + 3) // 4
            g1 = groups * (t + 1) // nth
            for g0 in range(groups * t // nth, g1, MATVEC_TASK_GROUPS):
                _simd_task(w, codes[i], yqs[i], yps[i], ys[i], 4 * g0,
                           min(m, 4 * min(g1, g0 + MATVEC_TASK_GROUPS)))


def group_matvecs(members: list[tuple], shares: np.ndarray) -> tuple | None:
    """``(kernel, args)``: one numba call ``kernel(*args)`` computing several
    :func:`fused_matvec` calls that share their activations ``x`` (their argument tuples
    ``(w, code, x, qcode, x86, yq, yp, y)``, e.g. a layer's Q, K and V projections) in one
    parallel region instead of one each, with the same results (each member's own
    quantizer, buffers and dots). ``shares`` (int64 ``[1]``, read at every call): into how
    many even shares every member's rows are cut, one a thread: set it to the thread
    count before calling (any count gives the same results). ``None`` for fewer than two
    members, different ``x`` or ``x86``, or arguments numba would not type alike."""
    import numba

    if len(members) < 2:
        return None
    x, x86 = members[0][2], members[0][4]

    def same(v):             # the same activations: one array, or views alike of it
        return v is x or (v.ctypes.data == x.ctypes.data and v.shape == x.shape
                          and v.strides == x.strides and v.dtype == x.dtype)
    if any(not same(a[2]) or a[4] != x86 for a in members):
        return None
    # padded with members of no rows (the first one's arrays, its weight cut to 0 rows)
    # to a multiple of GROUP_PAD: the member count is part of the tuples' numba type, and
    # each count compiled the kernel again (24 s each on a 2-core Zen 3, cold)
    first = members[0]
    padded = list(members) + [(first[0][:0],) + tuple(first[1:])] * (-len(members) % GROUP_PAD)
    for j in (0, 5, 6, 7):              # w, yq, yp, y: one array type a tuple
        if len({numba.typeof(a[j]) for a in padded}) != 1:
            return None
    args = (tuple(a[0] for a in padded), np.array([a[1] for a in padded], dtype=np.int64),
            x, np.array([a[3] for a in padded], dtype=np.int64), x86,
            tuple(a[5] for a in padded), tuple(a[6] for a in padded),
            tuple(a[7] for a in padded), shares)
    return _matvecs_ggml_fused, args


# ---------------------------------------------------------------------------- entry points


def _prepare(w_raw, w_type, k, m, x, out):
    w = check_weight(w_raw, w_type, k)
    if w.shape[0] < m:
        raise ValueError(f"weight has {w.shape[0]} rows, {m} requested")
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"x must be [N, {k}], got {x.shape}")
    if out is None:
        return w[:m], x, np.empty((x.shape[0], m), dtype=np.float32)
    if out.shape != (x.shape[0], m) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 [{x.shape[0]}, {m}], got "
                         f"{out.dtype} {out.shape}")
    return w[:m], x, out


def mul_mat(w_raw: np.ndarray, w_type: QT, k: int, m: int, x: np.ndarray,
            out: np.ndarray | None = None) -> np.ndarray:
    """y[N, M] = x[N, K] @ W.T, W raw ``[M, row_bytes]`` uint8 of type ``w_type``; into
    ``out`` (C-contiguous float32 [N, M]) when given."""
    w, x, y = _prepare(w_raw, w_type, k, m, x, out)
    code = np.int64(QT(w_type))
    if x.shape[0] <= MATVEC_MAX_N:
        _matvec(w, code, x, y)
    else:
        tile_rows = max(4, TILE_BYTES // (4 * k) // 4 * 4)
        _matmul_tiled(w, code, x, y, np.int64(tile_rows))
    return y


def mul_mat_ggml(w_raw: np.ndarray, w_type: QT, k: int, m: int, x: np.ndarray,
                 x86: bool = True, out: np.ndarray | None = None) -> np.ndarray:
    """llama.cpp's mul_mat: quantize x to the vec_dot_type, then ggml block dots (into
    ``out`` as :func:`mul_mat`).

    ``x86`` picks how Q8_0/Q8_1 activations are rounded (see :mod:`.quants`)."""
    w, x, y = _prepare(w_raw, w_type, k, m, x, out)
    code = np.int64(QT(w_type))
    yq = quantize_activations(x, VEC_DOT_TYPE[QT(w_type)], x86)
    if x.shape[0] > MATVEC_MAX_N and code in gemm.CODES:
        gemm.mul_mat_ggml(w, code, yq, y)       # prompts: 16 rows x 4 activation rows
    elif GGML_SIMD and code in SIMD_CODES:
        task_rows = max(4, GGML_TASK_BYTES // w.shape[1] // 4 * 4)
        _matmul_ggml_simd(w, code, yq, np.int64(prep_bytes(code, k)), y, np.int64(task_rows))
    elif code in GGML_FLOAT_CODES:
        matvec_ggml_float(w, code, yq, y)
    else:
        _matmul_ggml(w, code, yq, y)
    return y
