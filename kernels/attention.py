"""flash_attn_ext: fused attention with online softmax, as ggml-cpu/ops.cpp
``ggml_compute_forward_flash_attn_ext_f16_one_chunk``.

Layouts (numpy order; llama.cpp's views after its permutes)::

    q    [H,   T,    DK]  float32            (ggml ne [DK, T, H])
    k    [Hkv, n_kv, DK]  float16 or float32 (ne [DK, n_kv, Hkv])
    v    [Hkv, n_kv, DV]  float16 or float32 (ne [DV, n_kv, Hkv], not transposed)
    mask [Hm,  T',   n_kv] float16, T' >= T, Hm divides H (or None)
    out  [T,   H,    DV]  float32            (ne [DV, H, T]: heads interleaved)

GQA: query head ``h`` reads kv head ``h // (H // Hkv)``.

Per (token, head), following the one_chunk loop:

* q is converted to K's vec_dot_type first (F16 K: q rounded to F16), and
  ``s = dot(k_j, q)`` is ggml_vec_dot_f16/f32 (float32 products, float64 sum);
* ``s = s*scale`` (``scale/softcap`` then ``softcap*tanhf(s)`` with softcap); then
  ``s += slope*mask`` (ALiBi slope as :mod:`.softmax`); masked (-inf) keys are skipped;
* online softmax: on a new maximum the accumulator is scaled by ``expf(M_old - M)``,
  otherwise the value weight is ``expf(s - M)``;
* with F16 V the accumulator itself is F16 (``VKQ16``: every scale and
  multiply-add is rounded to F16, FMA as ggml's SIMD); with F32 V it is float32;
* optional sinks, then ``out = VKQ / S``.

For a single-token decode over >= 512 keys llama.cpp splits the keys into one chunk per
thread and merges the chunks' partial results (``use_split_kv_path``); so does
:func:`kernel` (``_flash_attn_split``, chunks from ``numba.get_num_threads()``). llama.cpp's
tiled kernel for >= ``Q_TILE`` queries accumulates in float32 and rounds differently;
that one is not mirrored (query tiles here run the one_chunk steps). The reference is a
numpy loop over keys doing the same steps, split into chunks when asked.
"""
from __future__ import annotations

import warnings

import numpy as np
import numba
from numba import njit, prange
from numba.core.errors import NumbaPerformanceWarning

from . import simd as S
from .bits import f16_round, f16_to_f32, fma_f32, out_of_line, read_only_view
from .softmax import alibi_slopes

F = np.float32


@njit(inline="always", cache=True)
def _score(s, sc, softcap, mv):
    """One key's score from its float64 dot ``s``: scale, softcap, mask/ALiBi term."""
    s32 = F(s) * sc
    if softcap != F(0):
        s32 = softcap * np.tanh(s32)
    return s32 + mv


@njit(inline="always", cache=True)
def _online_step(acc, s32, m, s_sum, v16, v32, hv, j, v_is_f16):
    """One live key's online-softmax update of one query's accumulator ``acc`` (VKQ16
    rounded to F16 after every operation for F16 V): returns the new (max, sum)."""
    ms = F(1)
    vs = F(1)
    if s32 > m:
        ms = np.exp(m - s32)
        m = s32
        for d in range(acc.shape[0]):
            acc[d] = f16_round(acc[d] * ms) if v_is_f16 else acc[d] * ms
    else:
        vs = np.exp(s32 - m)
    for d in range(acc.shape[0]):
        if v_is_f16:
            acc[d] = f16_round(fma_f32(f16_to_f32(v16[hv, j, d]), vs, acc[d]))
        else:
            acc[d] = fma_f32(v32[hv, j, d], vs, acc[d])
    return m, s_sum * ms + vs


@njit(inline="always", cache=True)
def _sink(acc, m, s_sum, sink):
    """The sink ``sink`` into the softmax sum and the accumulator: returns the new
    (max, sum), as one_chunk's ``sinks`` step."""
    ms = F(1)
    vs = F(1)
    if sink > m:
        ms = np.exp(m - sink)
        m = sink
        for d in range(acc.shape[0]):
            acc[d] *= ms
    else:
        vs = np.exp(sink - m)
    return m, s_sum * ms + vs


@njit(inline="always", cache=True)
def _finish(acc, m, s_sum, sink, has_sinks, out, parts, chunk):
    """The sink (if any) into the softmax sum and the accumulator, then ``out = acc / S``
    (0 for a query every key masks); for KV chunk ``chunk >= 0`` instead, the partial
    (M, S, acc) into ``parts[chunk]`` (the sink in chunk 0 only), as one_chunk's
    ``write_partials``."""
    if has_sinks and chunk <= 0:
        m, s_sum = _sink(acc, m, s_sum, sink)
    if chunk >= 0:
        parts[chunk, 0] = m
        parts[chunk, 1] = s_sum
        for d in range(acc.shape[0]):
            parts[chunk, 2 + d] = acc[d]
        return
    inv = F(0) if s_sum == F(0) else F(1) / s_sum
    for d in range(acc.shape[0]):
        out[d] = acc[d] * inv


@njit(inline="always", cache=True)
def _n_kv(k16, k32, kv_f16):
    """Keys (KV cells) of the K view."""
    return k16.shape[1] if kv_f16[0] else k32.shape[1]


@njit(inline="always", cache=True)
def _NO_PARTS():
    """The partials argument of a kernel that writes ``out`` itself (chunk -1)."""
    return np.empty((1, 1, 1), dtype=np.float32)


# The two loop bodies, the row's (_row_body) and the lanes' (_lanes_body), are compiled
# once, out of line (``out_of_line``: LLVM does not inline them back), for all the kernels
# that call them (rows, split; tiles, head groups, split): inlined, each kernel compiled
# its own copy inside its parallel loop. The six kernels' cold compile took 132 s, now
# 28 s (2-core Zen 3, kernels/README.md). Their wrappers, _flash_attn_row and
# _flash_attn_lanes, pass every integer as int64, so that a literal 0 or -1 or a
# prange's uint64 index does not compile another copy.

#: Numba's parallel pipeline with only ``prange`` on, for :func:`_lanes_body`: it has no
#: prange and no array expression is made parallel (its parallel diagnostics list no
#: parfor), so it runs serially where it is called. Compiled through this pipeline it
#: runs as fast as its old inlined copies in the parallel kernels (0.95-1.04x); through
#: the serial one, 13-21% slower there (why is not known), and the serial head-group
#: kernel, which inlined it in the serial pipeline, gains 1.2x. The row body stays
#: serial: through this pipeline the row kernel ran 10x slower (not analysed).
BODY_PIPELINE = {"comprehension": False, "reduction": False, "inplace_binop": False,
                 "setitem": False, "numpy": False, "stencil": False, "fusion": False,
                 "prange": True}
# ... and Numba's warning that such a function has no parallel loop is expected
warnings.filterwarnings("ignore", message=r"\s*The keyword argument 'parallel=True' was "
                        "specified but no transformation", category=NumbaPerformanceWarning,
                        module=r".*[\\/]attention$")


@njit(inline="always", cache=True)
def _flash_attn_row(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                    sinks, has_sinks, out, r, j0, j1, parts, chunk):
    """Row ``r`` = (head, token) over keys ``j0..j1``: into ``out``, or for KV chunk
    ``chunk >= 0`` its partial into ``parts[head]`` (:func:`_finish`)."""
    _row_body(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
              sinks, has_sinks, out, np.int64(r), np.int64(j0), np.int64(j1), parts,
              np.int64(chunk))


@njit(cache=True)
def _row_body(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
              sinks, has_sinks, out, r, j0, j1, parts, chunk):
    """:func:`_flash_attn_row`'s body (int64 integers)."""
    out_of_line()
    n_head, n_tok, dk = q.shape
    n_kv_head = k16.shape[0] if kv_f16[0] else k32.shape[0]
    dv = v16.shape[2] if kv_f16[1] else v32.shape[2]
    k_is_f16, v_is_f16 = kv_f16[0], kv_f16[1]
    rk, rv = n_head // n_kv_head, n_head // n_kv_head
    sc = scale / softcap if softcap != F(0) else scale
    h, t = r // n_tok, r % n_tok
    slope = slopes[h]
    qf = np.empty(dk, dtype=np.float32)              # q in K's vec_dot_type
    for i in range(dk):
        qf[i] = f16_round(q[h, t, i]) if k_is_f16 else q[h, t, i]
    acc = np.zeros(dv, dtype=np.float32)             # VKQ16 (F16 values) or VKQ32
    s_sum = F(0)
    m = F(-np.inf)
    hk, hv = h // rk, h // rv
    for j in range(j0, j1):
        mv = slope * f16_to_f32(mask[h % mask.shape[0], t, j]) if has_mask else F(0)
        if mv == F(-np.inf):
            continue
        s = 0.0
        for i in range(dk):
            kv = f16_to_f32(k16[hk, j, i]) if k_is_f16 else k32[hk, j, i]
            s += np.float64(kv * qf[i])
        m, s_sum = _online_step(acc, _score(s, sc, softcap, mv), m, s_sum, v16, v32, hv, j,
                                v_is_f16)
    _finish(acc, m, s_sum, sinks[h], has_sinks, out[t, h], parts[h % parts.shape[0]], chunk)


@njit(parallel=True, cache=True)
def _flash_attn(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                sinks, has_sinks, out):
    n_kv, parts = _n_kv(k16, k32, kv_f16), _NO_PARTS()
    for r in prange(q.shape[0] * q.shape[1]):
        _flash_attn_row(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                        slopes, sinks, has_sinks, out, r, 0, n_kv, parts, -1)


@njit(cache=True)
def _flash_attn_serial(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                       slopes, sinks, has_sinks, out):
    n_kv, parts = _n_kv(k16, k32, kv_f16), _NO_PARTS()
    for r in range(q.shape[0] * q.shape[1]):
        _flash_attn_row(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                        slopes, sinks, has_sinks, out, r, 0, n_kv, parts, -1)


# ---------------------------------------------------------------------------- query tiles
# A prompt's queries: QT queries of one head at a time share each key's loads, and their
# K dots run side by side (lane tt = query tt) instead of one float64 chain each. Every
# query sees the same operations in the same order as in _flash_attn_row (the dot summed
# over i in float64 from 0.0, the same online-softmax steps key after key, keys it masks
# skipped), so the results are bit for bit those of the row kernel (with the ``FAST`` flag
# the K dots sum in float32 instead, :func:`_lane_dots`).

#: the index in the kernels' ``kv_f16`` flags (K is F16, V is F16) of a third, optional
#: flag: ``fast`` numerics (graphcost.execute.exec_ops), for which the query tiles and head
#: groups sum the K dots in float32 (:func:`_lane_dots`); the row kernels ignore it
FAST = 2

@njit(inline="always", cache=True)
def _fast(kv_f16):
    """Whether the kernel's ``kv_f16`` flags ask for ``fast`` numerics (:data:`FAST`)."""
    return kv_f16.shape[0] > FAST and kv_f16[FAST]


#: queries of one head per tile (the K dots' two 8-lane float64 vectors: fixed at 16)
QT = 16
#: tokens from which :func:`kernel` takes the tiled kernel
TILE_MIN_TOKENS = 4


@njit(inline="always", cache=True)
def _lane_dots(qt, k16, k32, k_is_f16, hk, j, s, fast):
    """Key ``j``'s dots with QT query vectors side by side (``qt`` [dk, QT], lane by lane)
    into ``s`` (float64 [QT]): each lane summed over i in float64 from 0.0, as the row
    kernel's one chain; ``fast``, in float32 with four partial sums a lane over i % 4 (a
    chain a quarter as long), as ggml's SIMD dots sum in float32 lanes."""
    dk = qt.shape[0] // QT
    if fast:
        a0, a1, a2, a3 = (S.zeros(16, "f32"), S.zeros(16, "f32"), S.zeros(16, "f32"),
                          S.zeros(16, "f32"))
        i = 0
        while i + 4 <= dk:
            for u in range(4):
                kv = f16_to_f32(k16[hk, j, i + u]) if k_is_f16 else k32[hk, j, i + u]
                p = S.load(qt, 4 * QT * (i + u), 16, "f32") * kv
                if u == 0:
                    a0 = a0 + p
                elif u == 1:
                    a1 = a1 + p
                elif u == 2:
                    a2 = a2 + p
                else:
                    a3 = a3 + p
            i += 4
        while i < dk:
            kv = f16_to_f32(k16[hk, j, i]) if k_is_f16 else k32[hk, j, i]
            a0 = a0 + S.load(qt, 4 * QT * i, 16, "f32") * kv
            i += 1
        tot = (a0 + a1) + (a2 + a3)
        S.store(s, 0, S.convert(S.lanes(tot, 0, 8), "f64"))
        S.store(s, 64, S.convert(S.lanes(tot, 8, 8), "f64"))
    else:
        s0, s1 = S.zeros(8, "f64"), S.zeros(8, "f64")
        for i in range(dk):
            kv = f16_to_f32(k16[hk, j, i]) if k_is_f16 else k32[hk, j, i]
            p = S.load(qt, 4 * QT * i, 16, "f32") * kv
            s0 = s0 + S.convert(S.lanes(p, 0, 8), "f64")
            s1 = s1 + S.convert(S.lanes(p, 8, 8), "f64")
        S.store(s, 0, s0)
        S.store(s, 64, s1)


@njit(inline="always", cache=True)
def _row_dots(qd, k16, k32, k_is_f16, hk, j, s, nl):
    """Key ``j``'s dots with lanes ``l < nl`` one at a time (``qd`` [QT, dk]: lane ``l``'s
    query in K's vec_dot_type), 16 dims a vector in float32 (two accumulators, then the
    lanes summed) into ``s``: ``fast`` numerics for a few lanes (a decode's head group),
    where :func:`_lane_dots` would spend QT lanes on each key element."""
    dk = qd.shape[1]
    kr16 = k16[hk if k_is_f16 else 0, j if k_is_f16 else 0]      # key j's row (the other
    kr32 = k32[0 if k_is_f16 else hk, 0 if k_is_f16 else j]      # type's array: a dummy)
    for l in range(nl):
        ql = qd[l]
        a0, a1 = S.zeros(16, "f32"), S.zeros(16, "f32")
        i = 0
        while i + 32 <= dk:
            if k_is_f16:
                k0 = S.f16_to_f32(S.load(kr16, 2 * i, 16, "u16"))
                k1 = S.f16_to_f32(S.load(kr16, 2 * i + 32, 16, "u16"))
            else:
                k0 = S.load(kr32, 4 * i, 16, "f32")
                k1 = S.load(kr32, 4 * i + 64, 16, "f32")
            a0 = a0 + S.load(ql, 4 * i, 16, "f32") * k0
            a1 = a1 + S.load(ql, 4 * i + 64, 16, "f32") * k1
            i += 32
        tot = S.reduce_add_ps(a0 + a1)
        while i < dk:
            tot += ql[i] * (f16_to_f32(kr16[i]) if k_is_f16 else kr32[i])
            i += 1
        s[l] = tot


@njit(inline="always", cache=True)
def _flash_attn_lanes(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                      sinks, has_sinks, out, hk, lh, lt, nl, j0, j1, parts, chunk):
    """Lanes ``l < nl`` side by side: query head ``lh[l]``'s token ``lt[l]``, all over KV
    head ``hk``'s keys ``j0..j1`` (a prompt's tile: one head's QT queries; a decode's
    group: the heads sharing ``hk``); each key read once, every lane the row kernel's
    steps (and its ``out`` or, for ``chunk >= 0``, ``parts``)."""
    _lanes_body(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                sinks, has_sinks, out, np.int64(hk), lh, lt, np.int64(nl), np.int64(j0),
                np.int64(j1), parts, np.int64(chunk))


@njit(cache=True, parallel=BODY_PIPELINE)
def _lanes_body(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                sinks, has_sinks, out, hk, lh, lt, nl, j0, j1, parts, chunk):
    """:func:`_flash_attn_lanes`'s body (int64 integers)."""
    out_of_line()
    n_head, n_tok, dk = q.shape
    dv = v16.shape[2] if kv_f16[1] else v32.shape[2]
    k_is_f16, v_is_f16 = kv_f16[0], kv_f16[1]
    fast = _fast(kv_f16)
    sc = scale / softcap if softcap != F(0) else scale
    rows = fast and nl < QT // 2                      # few lanes: _row_dots
    qt = np.zeros(dk * QT, dtype=np.float32)          # q in K's vec_dot_type, [dk, QT]
    qd = np.zeros((QT if rows else 1, dk), dtype=np.float32)    # the same, [QT, dk]
    for l in range(nl):
        for i in range(dk):
            qi = f16_round(q[lh[l], lt[l], i]) if k_is_f16 else q[lh[l], lt[l], i]
            if rows:
                qd[l, i] = qi
            else:
                qt[QT * i + l] = qi
    acc = np.zeros((QT, dv), dtype=np.float32)
    s_sum = np.zeros(QT, dtype=np.float32)
    m = np.full(QT, -np.inf, dtype=np.float32)
    mv = np.zeros(QT, dtype=np.float32)
    s = np.empty(QT, dtype=np.float64)
    for j in range(j0, j1):
        live = False
        for l in range(nl):
            mv[l] = slopes[lh[l]] * f16_to_f32(mask[lh[l] % mask.shape[0], lt[l], j]) \
                if has_mask else F(0)
            live = live or mv[l] != F(-np.inf)
        if not live:
            continue
        if rows:
            _row_dots(qd, k16, k32, k_is_f16, hk, j, s, nl)
        else:
            _lane_dots(qt, k16, k32, k_is_f16, hk, j, s, fast)
        for l in range(nl):
            if mv[l] != F(-np.inf):
                m[l], s_sum[l] = _online_step(acc[l], _score(s[l], sc, softcap, mv[l]),
                                              m[l], s_sum[l], v16, v32, hk, j, v_is_f16)
    for l in range(nl):
        _finish(acc[l], m[l], s_sum[l], sinks[lh[l]], has_sinks, out[lt[l], lh[l]],
                parts[lh[l] % parts.shape[0]], chunk)


@njit(inline="always", cache=True)
def _flash_attn_tile(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                     sinks, has_sinks, out, h, t0):
    n_kv_head = k16.shape[0] if kv_f16[0] else k32.shape[0]
    lh = np.full(QT, h, dtype=np.int64)
    lt = np.arange(t0, t0 + QT).astype(np.int64)
    _flash_attn_lanes(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                      sinks, has_sinks, out, h // (q.shape[0] // n_kv_head), lh, lt,
                      min(QT, q.shape[1] - t0), 0, _n_kv(k16, k32, kv_f16), _NO_PARTS(), -1)


@njit(parallel=True, cache=True)
def _flash_attn_tiled(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                      sinks, has_sinks, out):
    n_tiles = (q.shape[1] + QT - 1) // QT
    for r in prange(q.shape[0] * n_tiles):
        _flash_attn_tile(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                         slopes, sinks, has_sinks, out, r // n_tiles, r % n_tiles * QT)


# ---------------------------------------------------------------------------- head groups
# A decode's query heads that share a KV head (GQA): up to QT of them at a time read each
# key once, and their K dots run side by side (lane g = head h0 + g), as a prompt's query
# tiles do for queries (both through _flash_attn_lanes); every head sees the same
# operations in the same order as in _flash_attn_row, so the results are bit for bit
# those of the row kernel.


@njit(cache=True)
def head_groups(n_head, n_kv_head):
    """Groups of up to QT query heads a KV head (one work item each, per token)."""
    return (n_head // n_kv_head + QT - 1) // QT


@njit(inline="always", cache=True)
def _group_item(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                sinks, has_sinks, out, r, j0, j1, parts, chunk):
    """Work item ``r`` of the head-group kernels: (KV head, token, group of QT heads),
    over keys ``j0..j1`` (into ``out``, or for KV chunk ``chunk >= 0`` ``parts``)."""
    n_head, n_tok = q.shape[0], q.shape[1]
    n_kv_head = k16.shape[0] if kv_f16[0] else k32.shape[0]
    groups = head_groups(n_head, n_kv_head)
    hk, rest = r // (n_tok * groups), r % (n_tok * groups)
    h0 = hk * (n_head // n_kv_head) + rest % groups * QT
    lh = np.arange(h0, h0 + QT).astype(np.int64)
    lt = np.full(QT, rest // groups, dtype=np.int64)
    _flash_attn_lanes(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                      sinks, has_sinks, out, hk, lh, lt,
                      min(QT, n_head // n_kv_head - rest % groups * QT), j0, j1, parts, chunk)


@njit(parallel=True, cache=True)
def _flash_attn_grouped(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                        slopes, sinks, has_sinks, out):
    n_kv_head = k16.shape[0] if kv_f16[0] else k32.shape[0]
    n_kv, parts = _n_kv(k16, k32, kv_f16), _NO_PARTS()
    for r in prange(n_kv_head * q.shape[1] * head_groups(q.shape[0], n_kv_head)):
        _group_item(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                    sinks, has_sinks, out, r, 0, n_kv, parts, -1)


@njit(cache=True)
def _flash_attn_grouped_serial(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale,
                               softcap, slopes, sinks, has_sinks, out):
    n_kv_head = k16.shape[0] if kv_f16[0] else k32.shape[0]
    n_kv, parts = _n_kv(k16, k32, kv_f16), _NO_PARTS()
    for r in range(n_kv_head * q.shape[1] * head_groups(q.shape[0], n_kv_head)):
        _group_item(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                    sinks, has_sinks, out, r, 0, n_kv, parts, -1)


# ---------------------------------------------------------------------------- split KV
# A decode's query over at least SPLIT_KV_MIN keys (ops.cpp ``use_split_kv_path``: one
# query token, K and V both F16 or both F32): the keys are cut into one chunk per thread,
# ceil(n_kv / nth) each; every chunk runs all heads over its keys (head groups with GQA,
# otherwise rows) into a partial (M, S, acc converted to float32; the sink in chunk 0
# only), and the partials are then merged chunk by chunk in float32 as
# ``ggml_flash_attn_ext_reduce_partials``. With one chunk the result is the unsplit
# kernel's bit for bit. (``fast`` numerics: head groups without GQA too, a head a group,
# for their float32 row dots.)

#: keys from which a single-token decode splits its keys over the threads
SPLIT_KV_MIN = 512


@njit(inline="always", cache=True)
def _split_chunk(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                 sinks, has_sinks, out, parts, c, j0, j1):
    """Chunk ``c`` (keys ``j0..j1``) of every head into ``parts[:, c]``: the head
    groups' work items (one token: an item per KV head and group), or rows."""
    n_head = q.shape[0]
    n_kv_head = k16.shape[0] if kv_f16[0] else k32.shape[0]
    if n_head // n_kv_head >= 2 or _fast(kv_f16):
        for r in range(n_kv_head * head_groups(n_head, n_kv_head)):
            _group_item(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                        slopes, sinks, has_sinks, out, r, j0, j1, parts, c)
    else:
        for h in range(n_head):
            _flash_attn_row(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                            slopes, sinks, has_sinks, out, h, j0, j1, parts, c)


@njit(inline="always", cache=True)
def _reduce_partials(parts, chunk, n_kv, out):
    """``out[0, h] = sum_c acc_c e^(M_c - M) / sum_c S_c e^(M_c - M)``, merged chunk by
    chunk as ggml_flash_attn_ext_reduce_partials (chunks past the keys, or with S = 0,
    skipped; a head with S = 0 everywhere gives 0)."""
    n_head, n_chunks, dv = parts.shape[0], parts.shape[1], parts.shape[2] - 2
    for h in range(n_head):
        o = out[0, h]
        o[:] = F(0)
        m_fin, s_fin = F(-np.inf), F(0)
        for c in range(n_chunks):
            if c * chunk >= n_kv or parts[h, c, 1] == F(0):
                continue
            m_new = max(m_fin, parts[h, c, 0])
            s_old, s_new = np.exp(m_fin - m_new), np.exp(parts[h, c, 0] - m_new)
            for d in range(dv):
                o[d] = o[d] * s_old + parts[h, c, 2 + d] * s_new
            s_fin = s_fin * s_old + parts[h, c, 1] * s_new
            m_fin = m_new
        if s_fin != F(0):
            inv = F(1) / s_fin
            for d in range(dv):
                o[d] *= inv


@njit(parallel=True, cache=True)
def flash_attn_split(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                     sinks, has_sinks, out, n_chunks):
    """The split-KV decode over ``n_chunks`` chunks of keys (one a thread, in parallel),
    then their merge; ``q`` holds one token."""
    n_kv = _n_kv(k16, k32, kv_f16)
    dv = v16.shape[2] if kv_f16[1] else v32.shape[2]
    chunk = (n_kv + n_chunks - 1) // n_chunks
    parts = np.empty((q.shape[0], n_chunks, 2 + dv), dtype=np.float32)
    for c in prange(n_chunks):
        if c * chunk < n_kv:
            _split_chunk(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap,
                         slopes, sinks, has_sinks, out, parts, c, c * chunk,
                         min(c * chunk + chunk, n_kv))
    _reduce_partials(parts, chunk, n_kv, out)


def _flash_attn_split(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                      sinks, has_sinks, out):
    """:func:`flash_attn_split` with one chunk per thread of ``numba.get_num_threads()``
    (llama.cpp: one per thread of its ``-t``); a Python function, as Numba cannot cache
    a compiled function that reads the thread count."""
    flash_attn_split(q, k16, k32, v16, v32, kv_f16, mask, has_mask, scale, softcap, slopes,
                     sinks, has_sinks, out, numba.get_num_threads())


#: work (query rows x keys x head size) below which :func:`kernel` picks the serial
#: variant (a parallel region costs 5-30 us to start)
SERIAL_BELOW = 1 << 16


def kernel(work: int, n_tok: int = 1, n_head: int = 1, n_kv_head: int = 1, n_kv: int = 0,
           split: bool = False, fast: bool = False):
    """The flash-attention kernel for ``work`` = H*T*n_kv*(DK+DV), ``n_tok`` = T queries
    per head, ``n_head`` = H query heads over ``n_kv_head`` KV heads, ``n_kv`` keys;
    ``split``: K and V are both F16 or both F32 (the types llama.cpp splits). One token
    over ``SPLIT_KV_MIN`` keys or more, ``split``: the split-KV decode. From
    ``TILE_MIN_TOKENS`` queries: query tiles; fewer, with query heads sharing a KV head
    (GQA): head groups, one item per KV head, token and ``QT`` heads (serial when there
    is one item, or below ``SERIAL_BELOW``), also without GQA for ``fast`` numerics (the
    float32 row dots, :func:`_row_dots`); otherwise one row per (head, token) (serial
    below ``SERIAL_BELOW``)."""
    if split and n_tok == 1 and n_kv >= SPLIT_KV_MIN:
        return _flash_attn_split
    if n_tok >= TILE_MIN_TOKENS:
        return _flash_attn_serial if work < SERIAL_BELOW else _flash_attn_tiled
    if n_kv_head and (n_head // n_kv_head >= 2 or fast):
        items = n_kv_head * n_tok * head_groups(n_head, n_kv_head)
        return _flash_attn_grouped_serial if work < SERIAL_BELOW or items == 1 \
            else _flash_attn_grouped
    return _flash_attn_serial if work < SERIAL_BELOW else _flash_attn


def _kv(a):
    a = np.ascontiguousarray(a)
    if a.dtype == np.float16:
        return a.view(np.uint16), np.zeros((1, 1, 1), np.float32), True
    return np.zeros((1, 1, 1), np.uint16), a.astype(np.float32, copy=False), False


def flash_attn_ext(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None,
                   scale: float, max_bias: float = 0.0, softcap: float = 0.0,
                   sinks: np.ndarray | None = None, out: np.ndarray | None = None,
                   split: bool = True) -> np.ndarray:
    """ggml_flash_attn_ext -> ``out[T, H, DV]`` float32 (see module doc for layouts);
    into ``out`` (C-contiguous) when given. ``split=False``: never the split-KV decode
    (a quantized cache, decoded to float32 by the caller: llama.cpp splits F16/F32 only)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    n_head, n_tok, dk = q.shape
    if k.shape[0] == 0 or n_head % k.shape[0] or k.shape[2] != dk or v.shape[:2] != k.shape[:2]:
        raise ValueError(f"q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         "(GQA needs H % Hkv == 0)")
    k16, k32, k_f16 = _kv(k)
    v16, v32, v_f16 = _kv(v)
    has_mask = mask is not None
    if has_mask:
        m = np.asarray(mask, dtype=np.float16)
        m = m.reshape((1,) * (3 - m.ndim) + m.shape)
        if m.shape[1] < n_tok or m.shape[2] != k.shape[1] or n_head % m.shape[0]:
            raise ValueError(f"mask {mask.shape} does not fit T={n_tok}, n_kv={k.shape[1]}")
        m = np.ascontiguousarray(m).view(np.uint16)
    else:
        m = np.zeros((1, 1, 1), np.uint16)
    has_sinks = sinks is not None
    sk = read_only_view(np.ascontiguousarray(sinks if has_sinks else np.zeros(n_head),
                                             dtype=np.float32))
    shape = (n_tok, n_head, v.shape[2])
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {shape}")
    kern = kernel(n_head * n_tok * k.shape[1] * (dk + v.shape[2]), n_tok, n_head, k.shape[0],
                  k.shape[1], split and k.dtype == v.dtype)
    kern(q, k16, k32, v16, v32, np.array([k_f16, v_f16]), m, has_mask, F(scale), F(softcap),
         alibi_slopes(n_head, max_bias), sk, has_sinks, out)
    return out


def flash_attn_ext_ref(q, k, v, mask, scale, max_bias=0.0, softcap=0.0, sinks=None,
                       kv_chunks=0):
    """numpy reference: the same per-key online-softmax steps, vectorized over (h, t);
    ``kv_chunks > 0`` (one token): the split-KV decode, keys in that many chunks of
    ceil(n_kv / kv_chunks), each chunk's partial (sink in chunk 0), then their merge."""
    q = np.asarray(q, dtype=np.float32)
    n_head, n_tok, dk = q.shape
    k_f16, v_f16 = k.dtype == np.float16, v.dtype == np.float16
    rep = n_head // k.shape[0]
    kf = np.repeat(np.asarray(k, dtype=np.float32), rep, axis=0)         # [H, n_kv, DK]
    vf = np.repeat(np.asarray(v, dtype=np.float32), rep, axis=0)
    qf = q.astype(np.float16).astype(np.float32) if k_f16 else q
    scores = np.einsum("hkd,htd->htk", kf.astype(np.float64), qf.astype(np.float64))
    sc = F(scale) / F(softcap) if softcap else F(scale)
    s = (scores.astype(np.float32) * sc).astype(np.float32)
    if softcap:
        s = (F(softcap) * np.tanh(s)).astype(np.float32)
    slopes = alibi_slopes(n_head, max_bias)[:, None, None]
    if mask is not None:
        m = np.asarray(mask, dtype=np.float16).astype(np.float32)
        m = m.reshape((1,) * (3 - m.ndim) + m.shape)[:, :n_tok, :]
        mv = (slopes * np.tile(m, (n_head // m.shape[0], 1, 1))).astype(np.float32)
    else:
        mv = np.zeros_like(s)
    s = (s + mv).astype(np.float32)
    rnd = (lambda a: a.astype(np.float16).astype(np.float32)) if v_f16 else (lambda a: a)

    def partial(j0, j1, sink):
        acc = np.zeros((n_head, n_tok, v.shape[2]), dtype=np.float32)
        big_m = np.full((n_head, n_tok), -np.inf, dtype=np.float32)
        big_s = np.zeros((n_head, n_tok), dtype=np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            for j in range(j0, j1):
                sj, live = s[..., j], mv[..., j] != -np.inf
                new = live & (sj > big_m)
                ms = np.where(new, np.exp(big_m - sj), F(1)).astype(np.float32)
                vs = np.where(new | ~live, F(1), np.exp(sj - big_m)).astype(np.float32)
                big_m = np.where(new, sj, big_m)
                scaled = np.where(new[..., None], rnd(acc * ms[..., None]), acc)
                upd = rnd((vf[:, None, j, :].astype(np.float64) * vs[..., None]
                           + scaled.astype(np.float64)).astype(np.float32))   # one rounding: FMA
                acc = np.where(live[..., None], upd, acc).astype(np.float32)
                big_s = np.where(live, big_s * ms + vs, big_s).astype(np.float32)
            if sink is not None:
                sk = np.asarray(sink, dtype=np.float32)[:, None]
                new = sk > big_m
                ms = np.where(new, np.exp(big_m - sk), F(1)).astype(np.float32)
                vs = np.where(new, F(1), np.exp(sk - big_m)).astype(np.float32)
                acc = (acc * ms[..., None]).astype(np.float32)
                big_m = np.where(new, sk, big_m).astype(np.float32)
                big_s = (big_s * ms + vs).astype(np.float32)
        return acc, big_m, big_s

    n_kv = k.shape[1]
    if kv_chunks:
        chunk = -(-n_kv // kv_chunks)
        acc = np.zeros((n_head, n_tok, v.shape[2]), dtype=np.float32)
        big_m = np.full((n_head, n_tok), -np.inf, dtype=np.float32)
        big_s = np.zeros((n_head, n_tok), dtype=np.float32)
        for c in range(0, n_kv, chunk):
            a_c, m_c, s_c = partial(c, min(c + chunk, n_kv), sinks if c == 0 else None)
            with np.errstate(invalid="ignore"):
                m_new = np.maximum(big_m, m_c)
                s_old, s_new = np.exp(big_m - m_new), np.exp(m_c - m_new)
            use = s_c != 0
            acc = np.where(use[..., None], acc * s_old[..., None] + a_c * s_new[..., None],
                           acc).astype(np.float32)
            big_s = np.where(use, big_s * s_old + s_c * s_new, big_s).astype(np.float32)
            big_m = np.where(use, m_new, big_m).astype(np.float32)
    else:
        acc, big_m, big_s = partial(0, n_kv, sinks)
    inv = np.where(big_s == 0, F(0), F(1) / np.where(big_s == 0, F(1), big_s)).astype(np.float32)
    return (acc * inv[..., None]).transpose(1, 0, 2).astype(np.float32)
