"""Mamba's recurrent ops as ggml-cpu/ops.cpp computes them: ``ssm_conv``
(ggml_compute_forward_ssm_conv_f32) and ``ssm_scan`` (ggml_compute_forward_ssm_scan_f32,
the Mamba-2 branch: one decay factor per head, ``K == 1`` state slot), and qwen3next's
``gated_delta_net`` (ggml_compute_forward_gated_delta_net_one_chunk, ``K == 1``).

Arrays are in numpy order (ggml ``ne`` reversed), float32 throughout:

``ssm_conv(sx, c, out)``::

    sx  [n_s, d_inner, d_conv - 1 + n_t]   conv state followed by the new columns
    c   [d_inner, d_conv]                  depthwise kernel
    out [n_s, n_t, d_inner]                out[s, t, r] = sum_i sx[s, r, t + i] * c[r, i]

the sum in float32, i from 0 up (ggml: "not using ggml_vec_dot_f32, because its sum is
in double precision").

``ssm_scan(s, x, dt, A, B, C, ids, y, s_new)``::

    s     [rows, n_head, head_dim, d_state]   the state cache (rows: cells)
    x     [n_s, n_t, n_head, head_dim]
    dt    [n_s, n_t, n_head]
    A     [n_head]
    B, C  [n_s, n_t, n_group, d_state]
    ids   [n_s]                              the cell each sequence starts from
    y     [n_s, n_t, n_head, head_dim]       output
    s_new [n_s, n_head, head_dim, d_state]   the state after the last token

per token: ``dt_sp = softplus(dt)`` (ggml_compute_softplus_f32: ``dt`` above 20 as it
is, else ``logf(1 + expf(dt))``), ``dA = expf(dt_sp * A[h])``, head h reads group
``h / (n_head / n_group)``, ``state = prev * dA + B * (x * dt_sp)``, ``y = sum_i state_i
* C_i`` in float32 from i = 0 up; the first token reads ``s[ids[s]]``, later ones the
state the previous token wrote. ggml sums d_state in SIMD lanes once d_state reaches
GGML_F32_STEP (32 floats with AVX2, 64 with AVX-512) and scalar below that; the kernel
sums in order, so for d_state >= 32 it differs from ggml by float32 summation order.
"""
from __future__ import annotations

import numpy as np
from numba import njit

F = np.float32
#: ggml_compute_softplus_f32: inputs above this are returned unchanged
SOFTPLUS_LINEAR_ABOVE = F(20.0)


@njit(cache=True)
def ssm_conv(sx, c, out):
    n_s, n_r, _ = sx.shape
    n_t, n_c = out.shape[1], c.shape[1]
    for i3 in range(n_s):
        for i2 in range(n_t):
            for i1 in range(n_r):
                acc = F(0)
                for i0 in range(n_c):
                    acc += sx[i3, i1, i2 + i0] * c[i1, i0]
                out[i3, i2, i1] = acc


@njit(cache=True)
def ssm_scan(s, x, dt, A, B, C, ids, y, s_new):
    n_s, n_t, n_h, n_r = x.shape
    n_c = s.shape[3]
    per_group = n_h // B.shape[2]
    for i3 in range(n_s):
        src = ids[i3]
        for i2 in range(n_t):
            for h in range(n_h):
                d = dt[i3, i2, h]
                sp = d if d > SOFTPLUS_LINEAR_ABOVE else np.log(F(1) + np.exp(d))
                dA = np.exp(sp * A[h])
                g = h // per_group
                for i1 in range(n_r):
                    x_dt = x[i3, i2, h, i1] * sp
                    acc = F(0)
                    for i0 in range(n_c):
                        prev = s[src, h, i1, i0] if i2 == 0 else s_new[i3, h, i1, i0]
                        st = prev * dA + B[i3, i2, g, i0] * x_dt
                        acc += st * C[i3, i2, g, i0]
                        s_new[i3, h, i1, i0] = st
                    y[i3, i2, h, i1] = acc


@njit(cache=True)
def gated_delta_net(q, k, v, g, beta, state, out, s_new):
    """ggml_compute_forward_gated_delta_net_one_chunk, one state slot (K == 1).

    q, k [n_sq, n_t, H_q, S]; v [n_s, n_t, H, S]; g [n_s, n_t, H, 1 or S] (per head or,
    KDA, per row); beta [n_s, n_t, H, 1]; state [n_s, H, S, S] with state[s, h, j, i] =
    S[i][j] (ggml stores it transposed); out [n_s, n_t, H, S]; s_new like state.
    Head h reads q/k head ``h % H_q``, sequence s reads q/k sequence ``s / (n_s / n_sq)``.
    Per token: S *= exp(g); delta_j = (v_j - sum_i S[i][j] k_i) * beta;
    S[i][j] += k_i delta_j; out_j = sum_i S[i][j] q_i / sqrt(S), float32 sums."""
    n_s, n_t, n_h, n_v = v.shape
    hq, hk = q.shape[2], k.shape[2]
    rq3, rk3 = n_s // q.shape[0], n_s // k.shape[0]
    kda = g.shape[3] == n_v and n_v > 1
    scale = F(1) / np.sqrt(F(n_v))
    delta = np.empty(n_v, dtype=np.float32)
    for i3 in range(n_s):
        for h in range(n_h):
            sm = s_new[i3, h]
            for j in range(n_v):
                for i in range(n_v):
                    sm[j, i] = state[i3, h, j, i]
            for t in range(n_t):
                qd = q[i3 // rq3, t, h % hq]
                kd = k[i3 // rk3, t, h % hk]
                if kda:
                    for i in range(n_v):
                        delta[i] = np.exp(g[i3, t, h, i])
                    for j in range(n_v):
                        for i in range(n_v):
                            sm[j, i] *= delta[i]
                else:
                    e = np.exp(g[i3, t, h, 0])
                    for j in range(n_v):
                        for i in range(n_v):
                            sm[j, i] *= e
                b = beta[i3, t, h, 0]
                for j in range(n_v):
                    acc = F(0)
                    for i in range(n_v):
                        acc += sm[j, i] * kd[i]
                    delta[j] = (v[i3, t, h, j] - acc) * b
                for j in range(n_v):
                    for i in range(n_v):
                        sm[j, i] += kd[i] * delta[j]
                for j in range(n_v):
                    acc = F(0)
                    for i in range(n_v):
                        acc += sm[j, i] * qd[i]
                    out[i3, t, h, j] = acc * scale


# ---------------------------------------------------------------------------- references


def ssm_conv_ref(sx: np.ndarray, c: np.ndarray) -> np.ndarray:
    """numpy ssm_conv: the same float32 products and sums, vectorized over rows/tokens."""
    n_s, n_r, n_cs = sx.shape
    n_c = c.shape[1]
    n_t = n_cs - n_c + 1
    out = np.zeros((n_s, n_t, n_r), dtype=F)
    for i0 in range(n_c):
        # window column i0 of every token: sx[s, r, t + i0] -> [s, t, r]
        out += (sx[:, :, i0:i0 + n_t] * c[None, :, i0:i0 + 1]).transpose(0, 2, 1)
    return out


def ssm_scan_ref(s, x, dt, A, B, C, ids) -> tuple[np.ndarray, np.ndarray]:
    """numpy ssm_scan (Mamba-2): returns (y, the state after the last token)."""
    n_s, n_t, n_h, n_r = x.shape
    rep = n_h // B.shape[2]
    y = np.zeros(x.shape, dtype=F)
    state = np.stack([s[i] for i in ids]).astype(F)                 # [n_s, n_h, n_r, n_c]
    sp = np.where(dt > SOFTPLUS_LINEAR_ABOVE, dt, np.log(F(1) + np.exp(dt))).astype(F)
    dA = np.exp(sp * A[None, None, :]).astype(F)                    # [n_s, n_t, n_h]
    Bh = np.repeat(B, rep, axis=2)                                   # [n_s, n_t, n_h, n_c]
    Ch = np.repeat(C, rep, axis=2)
    for t in range(n_t):
        x_dt = x[:, t] * sp[:, t, :, None]                           # [n_s, n_h, n_r]
        state = state * dA[:, t, :, None, None] + Bh[:, t, :, None, :] * x_dt[..., None]
        acc = np.zeros((n_s, n_h, n_r), dtype=F)
        for i0 in range(state.shape[3]):
            acc += state[..., i0] * Ch[:, t, :, None, i0]
        y[:, t] = acc
    return y, state


def gated_delta_net_ref(q, k, v, g, beta, state) -> tuple[np.ndarray, np.ndarray]:
    """numpy gated_delta_net (same argument layout as the kernel): (out, new state), the
    state held as M[j, i] = S[i][j] like ggml's."""
    n_s, n_t, n_h, n_v = v.shape
    hq, hk = q.shape[2], k.shape[2]
    rq3, rk3 = n_s // q.shape[0], n_s // k.shape[0]
    out = np.zeros(v.shape, dtype=F)
    M = state.astype(F).copy()                                       # [n_s, H, j, i]
    heads_q = np.arange(n_h) % hq
    heads_k = np.arange(n_h) % hk
    for s in range(n_s):
        for t in range(n_t):
            qd = q[s // rq3, t][heads_q]                               # [H, S]
            kd = k[s // rk3, t][heads_k]
            gd = np.exp(g[s, t])                                      # [H, 1 or S]
            M[s] = M[s] * gd[:, None, :] if gd.shape[1] == n_v and n_v > 1 \
                else M[s] * gd[:, :1, None]
            kv = np.einsum("hji,hi->hj", M[s], kd).astype(F)
            delta = ((v[s, t] - kv) * beta[s, t]).astype(F)            # [H, S]
            M[s] = M[s] + delta[:, :, None] * kd[:, None, :]
            out[s, t] = np.einsum("hji,hi->hj", M[s], qd) * (F(1) / np.sqrt(F(n_v)))
    return out, M
