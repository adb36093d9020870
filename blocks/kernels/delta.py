"""Triton chunk kernels, forward and backward, for the delta rules: ``delta_rule`` and
``gated_delta_rule`` (a scalar log decay ``g`` per head and step).

    S_t = exp(g_t) S_{t-1};  S_t += beta_t k_t (v_t - S_t^T k_t)^T;  o_t = scale * S_t^T q_t

Chunked (the WY form of DeltaNet, as fla computes it): inside a chunk with inclusive log-decay
prefix sums ``G`` (``Gam = exp(G)``) and start state ``S0``,

    A    = strict_lower(diag(beta) K K^T * exp(G_i - G_j));   T = (I + A)^-1
    W    = T diag(beta Gam) K          U = T diag(beta) V          U~ = U - W S0   (new values)
    o    = scale * ((Q * Gam) S0 + (lower(Q K^T) * exp(G_i - G_j)) U~)
    S_C  = Gam_C S0 + (K * Gam_C / Gam)^T U~

``T`` comes from forward substitution, row by row (stable, unlike a power series). Kernels: a
parallel prep (``A``, ``T``, ``W``, ``U`` per chunk), a sequential walk over chunks inside one kernel
(``U~`` and the chunk states), and the scalar-decay output kernel on ``U~``. The backward mirrors
it: a parallel ``dU~`` from the outputs, a reverse walk for the state gradients and ``dU~``, and
one parallel kernel for ``dq, dk, dv, dbeta, dg`` through ``T`` (``dA = -T^T dT T^T``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from blocks.ops.utils import check_gate, check_qkv

from . import register_kernel
from .scalar_decay import BT, _fwd_o_kernel, _pow2, _prec, _stages, _state_dtype

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_K = 128  # full key rows live in registers (the walk needs all of K for W S)


def _warps(n: int) -> int:
    return 1 if _INTERPRET else n


@triton.jit
def _chunk_system(k, beta, g, i_b, i_h, o_t, m_t, T, H: tl.constexpr, K: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """One chunk's ``(k [BT, BK], beta [BT], G [BT], KK = k k^T, A, Tm = (I + A)^-1)`` (float32)."""
    o_k = tl.arange(0, BK)
    b_k = tl.load(k + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :],
                  mask=m_t[:, None] & (o_k[None, :] < K), other=0.)
    b_beta = tl.load(beta + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
    if USE_G:
        b_G = tl.cumsum(tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32), axis=0)
    else:
        b_G = tl.zeros([BT], dtype=tl.float32)
    b_KK = tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PREC)
    o_i = tl.arange(0, BT)
    m_strict = o_i[:, None] > o_i[None, :]
    b_A = tl.where(m_strict, b_beta[:, None] * b_KK * tl.exp(tl.where(m_strict, b_G[:, None] - b_G[None, :], 0.)), 0.)
    # forward substitution: row i of T is e_i - sum_{j<i} A_ij T_j
    b_T = tl.zeros([BT, BT], dtype=tl.float32)
    for i in range(BT):
        a_i = tl.sum(tl.where(o_i[:, None] == i, b_A, 0.), axis=0)  # [BT] over j
        t_i = tl.where(o_i == i, 1., 0.) - tl.sum(a_i[:, None] * b_T, axis=0)
        b_T = tl.where(o_i[:, None] == i, t_i[None, :], b_T)
    return b_k, b_beta, b_G, b_KK, b_A, b_T


@triton.jit(do_not_specialize=["T", "NT"])
def _delta_prep_kernel(k, v, beta, g, w, u, T, NT,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (NT, B*H): W = T diag(beta exp(G)) K, U = T diag(beta) V for one chunk."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    b_k, b_beta, b_G, b_KK, b_A, b_T = _chunk_system(k, beta, g, i_b, i_h, o_t, m_t, T, H, K, BT, BK,
                                                     USE_G, DOT_PREC)
    o_k = tl.arange(0, BK)
    b_kb = b_k.to(tl.float32) * (b_beta * tl.exp(b_G))[:, None]
    tl.store(w + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :],
             tl.dot(b_T, b_kb, input_precision=DOT_PREC).to(w.dtype.element_ty),
             mask=m_t[:, None] & (o_k[None, :] < K))
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v[None, :] < V)
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.).to(tl.float32) * b_beta[:, None]
        tl.store(u + p_v, tl.dot(b_T, b_v, input_precision=DOT_PREC).to(u.dtype.element_ty), mask=m_tv)


@triton.jit(do_not_specialize=["T", "NT"])
def _delta_walk_kernel(w, u, k, g, h, vn, h0, ht, T, NT,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                       DOT_PREC: tl.constexpr):
    """Grid (V/BV, B*H), BK >= K: h[b, t, h] = state before chunk t; vn = U~ = U - W S0."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0.).to(tl.float32)
    for i_t in range(NT):
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_tk = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        p_tv = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_w = tl.load(w + p_tk, mask=m_tk, other=0.)
        b_u = tl.load(u + p_tv, mask=m_tv, other=0.).to(tl.float32)
        b_k = tl.load(k + p_tk, mask=m_tk, other=0.)
        b_vn = (b_u - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=DOT_PREC)).to(b_k.dtype)
        tl.store(vn + p_tv, b_vn.to(vn.dtype.element_ty), mask=m_tv)
        if USE_G:
            b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
            b_G = tl.cumsum(b_g, axis=0)
            g_last = tl.sum(b_g, axis=0)
            b_h *= tl.exp(g_last)
            b_k = (b_k * tl.exp(g_last - b_G)[:, None]).to(b_vn.dtype)
        b_h += tl.dot(tl.trans(b_k), b_vn, input_precision=DOT_PREC)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT"])
def _delta_dvo_kernel(q, k, g, do, dvo, scale, T,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (NT, B*H), BK >= K: dU~ from the outputs, scale * (lower(Q K^T) * exp(G_i - G_j))^T dO."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = tl.arange(0, BK)
    m_tk = m_t[:, None] & (o_k[None, :] < K)
    p_tk = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_q = tl.load(q + p_tk, mask=m_tk, other=0.)
    b_k = tl.load(k + p_tk, mask=m_tk, other=0.)
    o_i = tl.arange(0, BT)
    m_ji = o_i[None, :] >= o_i[:, None]
    b_At = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC)  # [j, i]
    if USE_G:
        b_G = tl.cumsum(tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32), axis=0)
        b_At = b_At * tl.exp(tl.where(m_ji, b_G[None, :] - b_G[:, None], float("-inf")))
    b_At = tl.where(m_ji, b_At * scale, 0.).to(b_q.dtype)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v[None, :] < V)
        p_tv = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_do = tl.load(do + p_tv, mask=m_tv, other=0.)
        tl.store(dvo + p_tv, tl.dot(b_At, b_do, input_precision=DOT_PREC), mask=m_tv)


@triton.jit(do_not_specialize=["T", "NT"])
def _delta_bwd_walk_kernel(q, k, w, g, do, dvo, dh, dvn, dht, dh0, scale, T, NT,
                           H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           USE_G: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                           DOT_PREC: tl.constexpr):
    """Grid (V/BV, B*H), BK >= K, reverse walk: dh[b, t, h] = dLoss/d(state after chunk t),
    dvn = dU~ = dU~_o + (K * Gam_C/Gam) dS_C; dS0 = Gam_C dS_C + scale (Q Gam)^T dO - W^T dU~."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0.).to(tl.float32)
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        tl.store(dh + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_dh.to(dh.dtype.element_ty), mask=m_kv)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_tk = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
        p_tv = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_k = tl.load(k + p_tk, mask=m_tk, other=0.)
        b_q = tl.load(q + p_tk, mask=m_tk, other=0.)
        b_w = tl.load(w + p_tk, mask=m_tk, other=0.)
        b_do = tl.load(do + p_tv, mask=m_tv, other=0.)
        if USE_G:
            b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
            b_G = tl.cumsum(b_g, axis=0)
            g_last = tl.sum(b_g, axis=0)
            b_k = (b_k * tl.exp(g_last - b_G)[:, None]).to(b_q.dtype)
            b_q = (b_q * (scale * tl.exp(b_G))[:, None]).to(b_do.dtype)
        else:
            b_q = (b_q * scale).to(b_do.dtype)
        b_dvn = tl.load(dvo + p_tv, mask=m_tv, other=0.) + tl.dot(b_k, b_dh.to(b_k.dtype), input_precision=DOT_PREC)
        tl.store(dvn + p_tv, b_dvn, mask=m_tv)
        if USE_G:
            b_dh *= tl.exp(g_last)
        b_dh += tl.dot(tl.trans(b_q), b_do, input_precision=DOT_PREC)
        b_dh -= tl.dot(tl.trans(b_w), b_dvn.to(b_w.dtype), input_precision=DOT_PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT"])
def _delta_bwd_main_kernel(q, k, v, beta, g, h, dh, vn, dvn, do, dq, dk, dv, dbeta, dg, scale, T, NT,
                           H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                           BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (NT, B*H), BK >= K: dq, dk, dv, dbeta and (gated) dg of one chunk."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    p_tk = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_k, b_beta, b_G, b_KK, b_A, b_T = _chunk_system(k, beta, g, i_b, i_h, o_t, m_t, T, H, K, BT, BK,
                                                     USE_G, DOT_PREC)
    b_kf = b_k.to(tl.float32)
    b_q = tl.load(q + p_tk, mask=m_tk, other=0.)
    b_gam = tl.exp(b_G)
    o_i = tl.arange(0, BT)
    g_last = tl.sum(tl.where(o_i == BT - 1, b_G, 0.), axis=0)  # padded g = 0: G at BT-1 is the chunk's
    b_kd = tl.exp(g_last - b_G)  # Gam_C / Gam_j
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)   # do S0^T
    b_dkS = tl.zeros([BT, BK], dtype=tl.float32)  # U~ dS_C^T
    b_dW = tl.zeros([BT, BK], dtype=tl.float32)   # -dU~ S0^T
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)   # do_i . U~_j
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    b_dbeta = tl.zeros([BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK, BV], dtype=tl.float32)  # sum over V blocks of S0 * dS_C, reduced at the end
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        p_tv = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_do = tl.load(do + p_tv, mask=m_tv, other=0.)
        b_vn = tl.load(vn + p_tv, mask=m_tv, other=0.)
        b_dvn = tl.load(dvn + p_tv, mask=m_tv, other=0.)  # float32
        b_v = tl.load(v + p_tv, mask=m_tv, other=0.).to(tl.float32)
        m_kv = m_k[:, None] & m_v[None, :]
        b_h = tl.load(h + p_h + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.)  # [BK, BV]
        b_dh = tl.load(dh + p_h + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.)
        b_dq += tl.dot(b_do, tl.trans(b_h).to(b_do.dtype), input_precision=DOT_PREC)
        b_dkS += tl.dot(b_vn, tl.trans(b_dh).to(b_vn.dtype), input_precision=DOT_PREC)
        b_dW -= tl.dot(b_dvn, tl.trans(b_h).to(tl.float32), input_precision=DOT_PREC)
        b_ds += tl.dot(b_do, tl.trans(b_vn), input_precision=DOT_PREC)
        b_vb = b_v * b_beta[:, None]
        b_dT += tl.dot(b_dvn, tl.trans(b_vb), input_precision=DOT_PREC)
        b_Tdu = tl.dot(tl.trans(b_T), b_dvn, input_precision=DOT_PREC)  # d(beta v) = T^T dU
        tl.store(dv + p_tv, (b_Tdu * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_tv)
        b_dbeta += tl.sum(b_Tdu * b_v, axis=1)
        b_hdh += b_h.to(tl.float32) * b_dh.to(tl.float32)
    m_ij = o_i[:, None] >= o_i[None, :]
    b_e = tl.exp(tl.where(m_ij, b_G[:, None] - b_G[None, :], float("-inf")))  # 0 above the diagonal
    b_ds = b_ds * b_e * scale
    b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC)
    b_dq_inter = b_dq * (scale * b_gam)[:, None]
    b_dq = b_dq_inter + tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=DOT_PREC)
    b_dkS = b_dkS * b_kd[:, None]
    b_dk = b_dkS + tl.dot(tl.trans(b_ds).to(b_q.dtype), b_q, input_precision=DOT_PREC)
    # W = T diag(beta Gam) K
    b_kbg = b_kf * (b_beta * b_gam)[:, None]
    b_dT += tl.dot(b_dW, tl.trans(b_kbg), input_precision=DOT_PREC)
    b_TdW = tl.dot(tl.trans(b_T), b_dW, input_precision=DOT_PREC)  # d(beta Gam k)
    b_dk += b_TdW * (b_beta * b_gam)[:, None]
    b_kTdW = tl.sum(b_TdW * b_kf, axis=1)
    b_dbeta += b_kTdW * b_gam
    # T = (I + A)^-1  =>  dA = -T^T dT T^T on the strict lower triangle
    m_strict = o_i[:, None] > o_i[None, :]
    b_dA = -tl.dot(tl.trans(b_T), tl.dot(b_dT, tl.trans(b_T), input_precision=DOT_PREC), input_precision=DOT_PREC)
    b_dA = tl.where(m_strict, b_dA, 0.)
    # A_ij = beta_i (k_i . k_j) exp(G_i - G_j)
    b_dAe = b_dA * tl.where(m_strict, tl.exp(tl.where(m_strict, b_G[:, None] - b_G[None, :], 0.)), 0.)
    b_dbeta += tl.sum(b_dAe * b_KK, axis=1)
    b_dAb = b_dAe * b_beta[:, None]
    b_dk += tl.dot(b_dAb, b_kf, input_precision=DOT_PREC) + tl.dot(tl.trans(b_dAb), b_kf, input_precision=DOT_PREC)
    tl.store(dq + p_tk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + p_tk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    tl.store(dbeta + (i_b * T + o_t) * H + i_h, b_dbeta, mask=m_t)
    if USE_G:
        b_dAA = b_dA * b_A
        b_P = b_ds * b_qk  # intra-output pair terms, [i, j]
        b_dG = (tl.sum(b_dq_inter * b_q.to(tl.float32), axis=1)     # o inter: Gam_i
                + tl.sum(b_P, axis=1) - tl.sum(b_P, axis=0)          # o intra: Gam_i / Gam_j
                - tl.sum(b_dkS * b_kf, axis=1)                       # S_C: Gam_C / Gam_j
                + b_kTdW * b_beta * b_gam                            # W: Gam_i
                + tl.sum(b_dAA, axis=1) - tl.sum(b_dAA, axis=0))     # A: Gam_i / Gam_j
        # G_C (the chunk's last position, padding included) scales the whole S_C
        c_last = tl.exp(g_last) * tl.sum(tl.sum(b_hdh, axis=1), axis=0) + tl.sum(tl.sum(b_dkS * b_kf, axis=1), axis=0)
        b_dG += tl.where(o_i == BT - 1, c_last, 0.)
        b_dg = tl.cumsum(b_dG, axis=0, reverse=True)  # G_i = sum_{s<=i} g_s within the chunk
        tl.store(dg + (i_b * T + o_t) * H + i_h, b_dg, mask=m_t)


class ChunkDelta(torch.autograd.Function):
    """``(q, k, v [B,T,H,*], beta [B,T,H], g [B,T,H] | None, scale, h0, final)`` -> ``(o, final_state)``."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, scale, h0, output_final_state):
        o, ht, _, _, _ = _forward(q, k, v, beta, g, scale, h0, output_final_state)
        ctx.save_for_backward(q, k, v, beta, g, h0)
        ctx.scale = scale
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, beta, g, h0 = ctx.saved_tensors
        scale = ctx.scale
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(T, BT)
        BK = _pow2(K)
        do = do.contiguous()
        dht = dht.contiguous() if dht is not None else None
        _, _, h, vn, w = _forward(q, k, v, beta, g, scale, h0, False, need_o=False)
        prec, stages = _prec(q), _stages(q)
        BV = min(64, _pow2(V))
        dvo = torch.empty(B, T, H, V, device=q.device, dtype=torch.float32)
        _delta_dvo_kernel[(NT, B * H)](q, k, g, do, dvo, scale, T, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                                       USE_G=g is not None, DOT_PREC=prec, num_warps=_warps(4), num_stages=stages)
        BVw = min(32, _pow2(V))
        dh = q.new_empty(B, NT, H, K, V, dtype=_state_dtype(q))
        dvn = torch.empty_like(dvo)
        need_dh0 = h0 is not None and ctx.needs_input_grad[6]
        dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if need_dh0 else None
        _delta_bwd_walk_kernel[(triton.cdiv(V, BVw), B * H)](
            q, k, w, g, do, dvo, dh, dvn, dht, dh0, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BVw,
            USE_G=g is not None, USE_DHT=dht is not None, STORE_DH0=need_dh0, DOT_PREC=prec,
            num_warps=_warps(4), num_stages=stages)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dbeta = torch.empty(B, T, H, device=q.device, dtype=torch.float32)
        dg = torch.empty(B, T, H, device=q.device, dtype=torch.float32) if g is not None else None
        _delta_bwd_main_kernel[(NT, B * H)](
            q, k, v, beta, g, h, dh, vn, dvn, do, dq, dk, dv, dbeta, dg, scale, T, NT, H=H, K=K, V=V,
            BT=BT, BK=BK, BV=min(32, _pow2(V)), USE_G=g is not None, DOT_PREC=prec, num_warps=_warps(8),
            num_stages=1)
        if dg is not None:
            dg = dg.to(g.dtype)
        return dq, dk, dv, dbeta.to(beta.dtype), dg, None, dh0, None


def _forward(q, k, v, beta, g, scale, h0, output_final_state, need_o=True):
    """-> (o | None, final state | None, chunk states h, new values U~, W)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, BT)
    BK = _pow2(K)
    prec, stages = _prec(q), _stages(q)
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    BV = min(64, _pow2(V))
    _delta_prep_kernel[(NT, B * H)](k, v, beta, g, w, u, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                                    USE_G=g is not None, DOT_PREC=prec, num_warps=_warps(4), num_stages=stages)
    h = k.new_empty(B, NT, H, K, V, dtype=_state_dtype(k))
    vn = torch.empty_like(v)
    ht = k.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    BVw = min(32, _pow2(V))
    _delta_walk_kernel[(triton.cdiv(V, BVw), B * H)](
        w, u, k, g, h, vn, h0, ht, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BVw, USE_G=g is not None,
        USE_H0=h0 is not None, STORE_HT=output_final_state, DOT_PREC=prec, num_warps=_warps(4),
        num_stages=stages)
    o = None
    if need_o:
        o = torch.empty_like(v)
        BKo, BVo = min(64, BK), min(128, _pow2(V))
        _fwd_o_kernel[(triton.cdiv(V, BVo), NT, B * H)](
            q, k, vn, g, h, o, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BKo, BV=BVo, USE_G=g is not None,
            DOT_PREC=prec, num_warps=_warps(8), num_stages=stages)
    return o, ht, h, vn, w


def chunk_delta(q, k, v, beta, g=None, scale=None, initial_state=None, output_final_state=False):
    """Shapes as ``blocks.ops.gated_delta_rule.chunk``; ``g=None`` is the ungated delta rule.
    Key dims above ``MAX_K`` are not split (the delta rule mixes all key channels): ValueError."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_gate("beta", beta, (B, T, H))
    if g is not None:
        check_gate("g", g, (B, T, H))
    if K > MAX_K:
        raise ValueError(f"k: the Triton delta-rule kernel handles head_dim_k <= {MAX_K}, got {K}")
    scale = K ** -0.5 if scale is None else float(scale)
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state: must have shape {(B, H, K, V)}, got {tuple(initial_state.shape)}")
        initial_state = initial_state.float().contiguous()
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    if g is not None:
        g = g.contiguous()
    return ChunkDelta.apply(q, k, v, beta, g, scale, initial_state, output_final_state)


@register_kernel("delta_rule", "chunk")
@torch.compiler.disable
def delta_rule_chunk(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``blocks.ops.delta_rule.chunk`` (head_dim_k <= 128; larger runs the PyTorch form)."""
    if q.shape[-1] > MAX_K:
        from blocks.ops.gated_delta_rule import chunk_delta as torch_chunk_delta
        return torch_chunk_delta(q, k, v, None, beta, scale, initial_state, output_final_state, chunk_size)
    return chunk_delta(q, k, v, beta, None, scale, initial_state, output_final_state)


@register_kernel("gated_delta_rule", "chunk")
@torch.compiler.disable
def gated_delta_rule_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           chunk_size=64):
    """Triton ``blocks.ops.gated_delta_rule.chunk`` (head_dim_k <= 128; larger runs the PyTorch form)."""
    if q.shape[-1] > MAX_K:
        from blocks.ops.gated_delta_rule import chunk_delta as torch_chunk_delta
        return torch_chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
    return chunk_delta(q, k, v, beta, g, scale, initial_state, output_final_state)
