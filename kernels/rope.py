"""ggml_rope_ext / ggml_rope_multi: modes NORMAL (0, adjacent pairs), NEOX (2, halves) and
the multi-section modes MROPE (8) and IMROPE (40, interleaved), with YaRN.

``x`` is numpy ``[T, H, D]`` float32 (ggml ne [D, H, T]); ``pos`` int32 ``[T]``, or for the
multi-section modes ``[4, T]`` (ggml's flat ``pos[i2 + k * ne2]``: time, height, width,
extra; llm_graph_input_pos::set_input gives text tokens ``(p, p, p, 0)``). The first
``n_dims`` values of each head are rotated, the rest copied.

Angles (ggml-cpu/ops.cpp ``ggml_rope_cache_init`` / ``ggml_mrope_cache_init`` /
``rope_yarn``, all float32)::

    theta_scale = powf(freq_base, -2/n_dims)
    theta_0     = pos;  theta_{i+1} = theta_i * theta_scale      (repeated multiply)
    theta_e     = theta_i / freq_factors[i]                      (if given)
    theta       = freq_scale * theta_e                           (interpolation)
    if ext_factor != 0:                                          (YaRN)
        mix   = ramp(corr_dims, 2i) * ext_factor
        theta = theta * (1 - mix) + theta_e * mix
        mscale = attn_factor * (1 + 0.1 * logf(1 / freq_scale))
    cos, sin = cosf(theta) * mscale, sinf(theta) * mscale

The multi-section modes keep one such recurrence per position track (each multiplied by
``theta_scale`` at every pair) and pair i takes the track :func:`sections_select` picks
for its sector ``i % sum(sections)``. ``corr_dims`` is ggml.c ``ggml_rope_yarn_corr_dims``
(from n_ctx_orig, beta_fast, beta_slow). Pair i is (x[2i], x[2i+1]) for NORMAL and
(x[i], x[i + n_dims/2]) for the others (ops.cpp ``rotate_pairs``), rotated as
``(x0 cos - x1 sin, x0 sin + x1 cos)``.

The reference repeats the float32 recurrence in numpy and uses float32 ``np.cos``;
llama.cpp's compiler may fuse the rotation into FMAs, so expect ~1 ulp differences.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .bits import read_only_view

F = np.float32
#: ggml.h GGML_ROPE_TYPE_NORMAL, _NEOX, _MROPE, _IMROPE (VISION, 24, is not run)
NORMAL, NEOX, MROPE, IMROPE = 0, 2, 8, 40
MODES = (NORMAL, NEOX, MROPE, IMROPE)
MULTI = (MROPE, IMROPE)


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims (ggml.c), float32."""
    def corr_dim(n_rot):
        return F(n_dims) * F(math.log(F(n_ctx_orig) / (F(n_rot) * F(2) * F(math.pi)))) \
            / (F(2) * F(math.log(F(freq_base))))
    start = F(math.floor(corr_dim(beta_fast)))
    end = F(math.ceil(corr_dim(beta_slow)))
    return float(max(F(0), start)), float(min(F(n_dims - 1), end))


def sections_select(n_dims: int, mode: int, sections=(0, 0, 0, 0)) -> np.ndarray:
    """int64 ``[n_dims/2]``: the position track (0 time, 1 height, 2 width, 3 extra) each
    pair's angle comes from; all 0 for NORMAL/NEOX. ggml-cpu/ops.cpp
    ``ggml_mrope_cache_init`` (not the vision mode's independent sections)."""
    half = n_dims // 2
    sel = np.zeros(half, dtype=np.int64)
    if mode not in MULTI:
        return sel
    s0, s1, s2, s3 = (int(s) for s in sections)
    sect_dims, sec_w = s0 + s1 + s2 + s3, s0 + s1
    if sect_dims <= 0:
        raise ValueError(f"rope mode {mode} needs sections, got {list(sections)}")
    for i in range(half):
        sector = i % sect_dims
        if mode == IMROPE:          # interleaved: t h w t h w ... then extra
            sel[i] = (1 if sector % 3 == 1 and sector < 3 * s1 else
                      2 if sector % 3 == 2 and sector < 3 * s2 else
                      0 if sector % 3 == 0 and sector < 3 * s0 else 3)
        else:                       # MROPE: consecutive sections t | h | w | extra
            sel[i] = (1 if s0 <= sector < sec_w else 2 if sec_w <= sector < sec_w + s2 else
                      3 if sector >= sec_w + s2 else 0)
    return sel


@njit(inline="always", cache=True)
def _ramp(low, high, i0):
    y = (F(i0 // 2) - low) / max(F(0.001), high - low)
    return F(1) - min(F(1), max(F(0), y))


@njit(cache=True)
def _cache(pos, t, sel, n_dims, theta_scale, freq_scale, ff, has_ff, low, high, ext_factor,
           attn_factor, cos, sin):
    # one float32 recurrence per position track (pos rows), as ggml_mrope_cache_init
    n_track = pos.shape[0]
    theta = np.empty(n_track, dtype=np.float32)
    for k in range(n_track):
        theta[k] = F(pos[k, t])
    for i in range(n_dims // 2):
        th = theta[sel[i]]
        theta_e = th / ff[i] if has_ff else th
        theta_i = freq_scale * theta_e
        a = theta_i
        mscale = attn_factor
        if ext_factor != F(0):
            mix = _ramp(low, high, 2 * i) * ext_factor
            a = theta_i * (F(1) - mix) + theta_e * mix
            mscale *= F(1) + F(0.1) * np.log(F(1) / freq_scale)
        cos[i] = np.cos(a) * mscale
        sin[i] = np.sin(a) * mscale
        for k in range(n_track):
            theta[k] *= theta_scale


@njit(inline="always", cache=True)
def _rope_token(x, pos, sel, n_dims, mode, theta_scale, freq_scale, ff, has_ff, low, high,
                ext_factor, attn_factor, out, t):
    n_head, d = x.shape[1], x.shape[2]
    half = n_dims // 2
    cos = np.empty(half, dtype=np.float32)
    sin = np.empty(half, dtype=np.float32)
    _cache(pos, t, sel, n_dims, theta_scale, freq_scale, ff, has_ff, low, high, ext_factor,
           attn_factor, cos, sin)
    for h in range(n_head):
        src, dst = x[t, h], out[t, h]
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if mode == NORMAL else (i, i + half)
            x0, x1 = src[a], src[b]
            dst[a] = x0 * cos[i] - x1 * sin[i]
            dst[b] = x0 * sin[i] + x1 * cos[i]
        for i in range(n_dims, d):
            dst[i] = src[i]


@njit(parallel=True, cache=True)
def _rope(x, pos, sel, n_dims, mode, theta_scale, freq_scale, ff, has_ff, low, high,
          ext_factor, attn_factor, out):
    for t in prange(x.shape[0]):
        _rope_token(x, pos, sel, n_dims, mode, theta_scale, freq_scale, ff, has_ff, low,
                    high, ext_factor, attn_factor, out, t)


@njit(cache=True)
def _rope_serial(x, pos, sel, n_dims, mode, theta_scale, freq_scale, ff, has_ff, low, high,
                 ext_factor, attn_factor, out):
    for t in range(x.shape[0]):
        _rope_token(x, pos, sel, n_dims, mode, theta_scale, freq_scale, ff, has_ff, low,
                    high, ext_factor, attn_factor, out, t)


#: work (elements of x) below which :func:`kernel` picks the serial variant (a parallel
#: region costs 5-30 us to start)
SERIAL_BELOW = 16384


def kernel(work: int):
    """The rope kernel for ``work`` elements: ``(x[T, H, D], pos[P, T] int32, *params,
    out[T, H, D])`` with ``params`` from :func:`params` (P = 4 for the multi-section modes,
    else 1); serial below ``SERIAL_BELOW``."""
    return _rope_serial if work < SERIAL_BELOW else _rope


def positions(pos: np.ndarray, mode: int) -> np.ndarray:
    """``pos`` as the kernel's ``[P, T]`` int32 rows (a view when it can be): the flat
    ``[4T]`` of the multi-section modes split into its 4 tracks."""
    pos = np.asarray(pos, dtype=np.int32)
    if pos.ndim == 2:
        return pos
    return pos.reshape(4, -1) if mode in MULTI else pos.reshape(1, -1)


def _check_mode(mode: int) -> None:
    if mode not in MODES:
        raise NotImplementedError(f"rope mode {mode} (the kernel runs 0 NORMAL, 2 NEOX, "
                                  "8 MROPE, 40 IMROPE)")


def params(n_dims: int, mode: int = NORMAL, freq_base: float = 10000.0,
           freq_scale: float = 1.0, n_ctx_orig: int = 0, ext_factor: float = 0.0,
           attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
           freq_factors: np.ndarray | None = None, sections=(0, 0, 0, 0)) -> tuple:
    """The kernel's arguments between ``pos`` and ``out`` (see :func:`kernel`)."""
    _check_mode(mode)
    theta_scale, low, high, has_ff, ff = _params(n_dims, freq_base, n_ctx_orig, beta_fast,
                                                 beta_slow, freq_factors, ext_factor)
    return (sections_select(n_dims, mode, sections), np.int64(n_dims), np.int64(mode),
            theta_scale, F(freq_scale), ff, has_ff, low, high, F(ext_factor), F(attn_factor))


def _params(n_dims, freq_base, n_ctx_orig, beta_fast, beta_slow, freq_factors, ext_factor):
    theta_scale = F(F(freq_base) ** (F(-2.0) / F(n_dims)))
    low, high = (yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
                 if ext_factor != 0.0 else (0.0, 0.0))   # only YaRN reads them
    has_ff = freq_factors is not None
    ff = read_only_view(np.ascontiguousarray(freq_factors if has_ff else np.ones(1),
                                             dtype=np.float32))
    if has_ff and ff.shape[0] < n_dims // 2:
        raise ValueError(f"freq_factors needs {n_dims // 2} values, got {ff.shape[0]}")
    return theta_scale, F(low), F(high), has_ff, ff


def rope(x: np.ndarray, pos: np.ndarray, n_dims: int, mode: int = NORMAL,
         freq_base: float = 10000.0, freq_scale: float = 1.0, n_ctx_orig: int = 0,
         ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
         beta_slow: float = 1.0, freq_factors: np.ndarray | None = None,
         sections=(0, 0, 0, 0), out: np.ndarray | None = None) -> np.ndarray:
    """ggml_rope_ext / ggml_rope_multi on ``x[T, H, D]`` with positions ``pos`` (int32
    ``[T]``, or ``[4T]`` / ``[4, T]`` for MROPE/IMROPE), into ``out`` (C-contiguous
    float32 ``[T, H, D]``) when given."""
    _check_mode(mode)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 3 or n_dims % 2 or n_dims > x.shape[2]:
        raise ValueError(f"x must be [T, H, D] with even n_dims <= D, got {x.shape}, {n_dims}")
    args = params(n_dims, mode, freq_base, freq_scale, n_ctx_orig, ext_factor, attn_factor,
                  beta_fast, beta_slow, freq_factors, sections)
    p = np.ascontiguousarray(positions(pos, mode))
    if p.shape[1] != x.shape[0]:
        raise ValueError(f"{p.shape[1]} positions per track for {x.shape[0]} tokens")
    if out is None:
        out = np.empty_like(x)
    elif out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float32 {x.shape}")
    kernel(x.size)(x, p, *args, out)
    return out


def rope_ref(x: np.ndarray, pos: np.ndarray, n_dims: int, mode: int = NORMAL,
             freq_base: float = 10000.0, freq_scale: float = 1.0, n_ctx_orig: int = 0,
             ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
             beta_slow: float = 1.0, freq_factors: np.ndarray | None = None,
             sections=(0, 0, 0, 0)) -> np.ndarray:
    """numpy reference: the same float32 recurrences, vectorized over tokens; the
    multi-section modes pick each pair's track with ``ggml_mrope_cache_init``'s branches
    written out again here (not :func:`sections_select`)."""
    _check_mode(mode)
    x = np.asarray(x, dtype=np.float32)
    theta_scale, low, high, has_ff, ff = _params(n_dims, freq_base, n_ctx_orig, beta_fast,
                                                 beta_slow, freq_factors, ext_factor)
    half = n_dims // 2
    p = positions(pos, mode)
    tracks = np.empty((p.shape[0], x.shape[0], half), dtype=np.float32)
    th = p.astype(np.float32)
    for i in range(half):                                  # theta *= theta_scale, in order
        tracks[:, :, i] = th
        th = (th * theta_scale).astype(np.float32)
    if mode in MULTI:
        s = [int(v) for v in sections]
        sector = np.arange(half) % sum(s)
        if mode == IMROPE:
            track = np.full(half, 3)
            t_ = (sector % 3 == 0) & (sector < 3 * s[0])
            h_ = (sector % 3 == 1) & (sector < 3 * s[1])
            w_ = (sector % 3 == 2) & (sector < 3 * s[2])
            track[t_], track[w_], track[h_] = 0, 2, 1
        else:
            bounds = np.cumsum(s)                       # t | h | w | extra
            track = np.searchsorted(bounds[:3], sector, side="right")
        theta = tracks[track, :, np.arange(half)].T
    else:
        theta = tracks[0]
    theta_e = theta / ff[:half] if has_ff else theta
    t = (F(freq_scale) * theta_e).astype(np.float32)
    mscale = F(attn_factor)
    if ext_factor != 0.0:
        i0 = 2 * np.arange(half)
        y = ((i0 // 2).astype(np.float32) - low) / max(F(0.001), F(high - low))
        mix = (F(1) - np.minimum(F(1), np.maximum(F(0), y))).astype(np.float32) * F(ext_factor)
        t = (t * (F(1) - mix) + theta_e * mix).astype(np.float32)
        mscale = F(mscale * (F(1) + F(0.1) * F(np.log(F(1) / F(freq_scale)))))
    cos = (np.cos(t) * mscale)[:, None, :]
    sin = (np.sin(t) * mscale)[:, None, :]
    out = x.copy()
    if mode == NORMAL:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., :half], x[..., half:n_dims]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_dims] = x0 * sin + x1 * cos
    return out
