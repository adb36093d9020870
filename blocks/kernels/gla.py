"""Triton chunk kernels, forward and backward, for gated linear attention with a decay per key
channel (``gla``): ``S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.

Same plan as ``scalar_decay`` (a sequential walk over chunks inside one kernel for the chunk
states, parallel kernels for everything else), with one difference inside a chunk: the pair
decay ``exp(G_ic - G_jc)`` depends on the channel, so the intra-chunk scores
``A_ij = sum_c q_ic k_jc exp(G_ic - G_jc)`` are not a matmul. They are computed exactly, as
``[BT, BT, BC]`` blocks over channel slices, with ``j > i`` masked to -inf before ``exp``: no
exponent is ever positive, so no decay strength overflows (fla factors off-diagonal sub-blocks
through a reference point instead; that is faster but needs sub-chunk bookkeeping).

Backward: ``dq, dk, dv`` from the chunk states and their gradients (a reverse walk), the intra
parts from the same ``[BT, BT, BC]`` blocks, and ``dgk`` from the per-channel identity
``dG_tc = q_tc dq_tc - k_tc dk_tc`` (reverse cumsum over t, plus ``sum_v dS_T * S_T``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from blocks.ops.utils import check_gate, check_qkv

from . import register_kernel
from .scalar_decay import BT, MAX_K, _pow2, _prec, _stages, _state_dtype, _walk_blocks

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BC = 4  # channels per exact intra-chunk block: [64, 64, 4] float32 per step keeps registers in bounds


def _warps(n: int) -> int:
    return 1 if _INTERPRET else n


@triton.jit(do_not_specialize=["T", "NT"])
def _gla_fwd_h_kernel(k, v, gk, h, h0, ht, T, NT,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (K/BK, V/BV, B*H): h[b, t, h] = state before chunk t."""
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
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
        p_kt = ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None]
        m_kt = m_k[:, None] & m_t[None, :]
        b_k = tl.load(k + p_kt, mask=m_kt, other=0.)  # [BK, BT]
        b_g = tl.load(gk + p_kt, mask=m_kt, other=0.).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=1)
        g_last = tl.sum(b_g, axis=1)  # [BK]
        b_v = tl.load(v + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.)
        b_h *= tl.exp(g_last)[:, None]
        b_k = (b_k * tl.exp(g_last[:, None] - b_gc)).to(b_v.dtype)
        b_h += tl.dot(b_k, b_v, input_precision=DOT_PREC)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@triton.jit
def _intra_block(q, k, gk, p_base, o_c, m_t, K: tl.constexpr, BT: tl.constexpr):
    """Channels ``o_c`` of one chunk: (q, k as float32 [BT, BC], E [BT(i), BT(j), BC] =
    exp(G_ic - G_jc) for j <= i, else 0)."""
    p = p_base + o_c[None, :]
    m = m_t[:, None] & (o_c[None, :] < K)
    b_q = tl.load(q + p, mask=m, other=0.).to(tl.float32)
    b_k = tl.load(k + p, mask=m, other=0.).to(tl.float32)
    b_gc = tl.cumsum(tl.load(gk + p, mask=m, other=0.).to(tl.float32), axis=0)
    o_i = tl.arange(0, BT)
    m3 = (o_i[:, None] >= o_i[None, :])[:, :, None]
    b_e = tl.exp(tl.where(m3, b_gc[:, None, :] - b_gc[None, :, :], float("-inf")))
    return b_q, b_k, b_e


@triton.jit(do_not_specialize=["T", "NT"])
def _gla_fwd_o_kernel(q, k, v, gk, h, o, scale, T, NT,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
                      DOT_PREC: tl.constexpr):
    """Grid (V/BV, NT, B*H): o = scale * ((q * exp(G)) @ h_t + A @ v)."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_base = ((i_b * T + o_t[:, None]) * H + i_h) * K
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + p_base + o_k[None, :], mask=m_tk, other=0.)
        b_gc = tl.cumsum(tl.load(gk + p_base + o_k[None, :], mask=m_tk, other=0.).to(tl.float32), axis=0)
        b_h = tl.load(h + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.)
        b_o += tl.dot((b_q * tl.exp(b_gc)).to(b_h.dtype), b_h, input_precision=DOT_PREC)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_c in range(tl.cdiv(K, BC)):
        b_qc, b_kc, b_e = _intra_block(q, k, gk, p_base, i_c * BC + tl.arange(0, BC), m_t, K, BT)
        b_A += tl.sum(b_qc[:, None, :] * b_kc[None, :, :] * b_e, axis=2)
    b_v = tl.load(v + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                  mask=m_t[:, None] & m_v[None, :], other=0.)
    b_o = (b_o + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=DOT_PREC)) * scale
    tl.store(o + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@triton.jit(do_not_specialize=["T", "NT"])
def _gla_bwd_dh_kernel(q, do, gk, dh, dht, dh0, scale, T, NT,
                       H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                       USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (K/BK, V/BV, B*H): reverse walk; dh[b, t, h] = dLoss/d(state after chunk t)."""
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
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
        p_kt = ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None]
        m_kt = m_k[:, None] & m_t[None, :]
        b_q = tl.load(q + p_kt, mask=m_kt, other=0.)  # [BK, BT]
        b_g = tl.load(gk + p_kt, mask=m_kt, other=0.).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=1)
        b_do = tl.load(do + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                       mask=m_t[:, None] & m_v[None, :], other=0.)
        b_dh *= tl.exp(tl.sum(b_g, axis=1))[:, None]
        b_q = (b_q * tl.exp(b_gc) * scale).to(b_do.dtype)
        b_dh += tl.dot(b_q, b_do, input_precision=DOT_PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


@triton.jit(do_not_specialize=["T", "NT"])
def _gla_bwd_intra_kernel(q, k, v, gk, do, dq_i, dk_i, dv_i, scale, T,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (NT, B*H): the intra-chunk parts of dq, dk (float32, by channel slices) and dv."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)  # ds[i, j] = do_i . v_j
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v[None, :] < V)
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.)
        b_do = tl.load(do + p_v, mask=m_tv, other=0.)
        b_ds += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
    b_ds = b_ds * scale
    p_base = ((i_b * T + o_t[:, None]) * H + i_h) * K
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_c in range(tl.cdiv(K, BC)):
        o_c = i_c * BC + tl.arange(0, BC)
        b_qc, b_kc, b_e = _intra_block(q, k, gk, p_base, o_c, m_t, K, BT)
        b_A += tl.sum(b_qc[:, None, :] * b_kc[None, :, :] * b_e, axis=2)
        b_dse = b_ds[:, :, None] * b_e
        m = m_t[:, None] & (o_c[None, :] < K)
        tl.store(dq_i + p_base + o_c[None, :], tl.sum(b_dse * b_kc[None, :, :], axis=1), mask=m)
        tl.store(dk_i + p_base + o_c[None, :], tl.sum(b_dse * b_qc[:, None, :], axis=0), mask=m)
    b_At = tl.trans(b_A * scale)  # [j, i]
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v[None, :] < V)
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_do = tl.load(do + p_v, mask=m_tv, other=0.)
        tl.store(dv_i + p_v, tl.dot(b_At.to(b_do.dtype), b_do, input_precision=DOT_PREC), mask=m_tv)


@triton.jit(do_not_specialize=["T", "NT"])
def _gla_bwd_inter_kernel(q, k, v, gk, h, do, dh, dq_i, dk_i, dv_i, dq, dk, dv, dA, scale, T, NT,
                          H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (NT, B*H), BK >= K: add the chunk-state parts; dA[b, h, c, t] = q.dq - k.dk per channel."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    p_qk = ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :]
    b_q = tl.load(q + p_qk, mask=m_tk, other=0.)
    b_k = tl.load(k + p_qk, mask=m_tk, other=0.)
    b_g = tl.load(gk + p_qk, mask=m_tk, other=0.).to(tl.float32)
    b_gc = tl.cumsum(b_g, axis=0)
    g_last = tl.sum(b_g, axis=0)  # [BK]
    b_kd = (b_k * tl.exp(g_last[None, :] - b_gc)).to(b_k.dtype)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.)
        b_do = tl.load(do + p_v, mask=m_tv, other=0.)
        m_vk = m_v[:, None] & m_k[None, :]
        b_hT = tl.load(h + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)  # [BV, BK]
        b_dhT = tl.load(dh + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)
        b_dq += tl.dot(b_do, b_hT.to(b_do.dtype), input_precision=DOT_PREC)
        b_dk += tl.dot(b_v, b_dhT.to(b_v.dtype), input_precision=DOT_PREC)
        b_dv = tl.load(dv_i + p_v, mask=m_tv, other=0.) + tl.dot(b_kd, tl.trans(b_dhT).to(b_kd.dtype),
                                                                  input_precision=DOT_PREC)
        tl.store(dv + p_v, b_dv.to(dv.dtype.element_ty), mask=m_tv)
    b_dq = b_dq * tl.exp(b_gc) * scale + tl.load(dq_i + p_qk, mask=m_tk, other=0.)
    b_dk = b_dk * tl.exp(g_last[None, :] - b_gc) + tl.load(dk_i + p_qk, mask=m_tk, other=0.)
    tl.store(dq + p_qk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + p_qk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    b_dA = b_dq * b_q.to(tl.float32) - b_dk * b_k.to(tl.float32)  # [BT, BK]
    tl.store(dA + (i_bh * K + o_k[None, :]) * T + o_t[:, None], b_dA, mask=m_tk)  # [B, H, K, T]


def gla_fwd_h(k, v, gk, h0, output_final_state):
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = triton.cdiv(T, BT)
    BK, BV = _walk_blocks(k, B, H, K, V)
    h = k.new_empty(B, NT, H, K, V, dtype=_state_dtype(k))
    ht = k.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    _gla_fwd_h_kernel[(triton.cdiv(K, BK), triton.cdiv(V, BV), B * H)](
        k, v, gk, h, h0, ht, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, USE_H0=h0 is not None,
        STORE_HT=output_final_state, DOT_PREC=_prec(k), num_warps=_warps(4), num_stages=_stages(k))
    return h, ht


class ChunkGLA(torch.autograd.Function):
    """``(q, k, v, gk [B,T,H,K], scale, h0, final)`` -> ``(o, final_state)``; requires ``K <= MAX_K``."""

    @staticmethod
    def forward(ctx, q, k, v, gk, scale, h0, output_final_state):
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(T, BT)
        h, ht = gla_fwd_h(k, v, gk, h0, output_final_state)
        o = torch.empty_like(v)
        BK, BV = min(64, _pow2(K)), min(128, _pow2(V))
        _gla_fwd_o_kernel[(triton.cdiv(V, BV), NT, B * H)](
            q, k, v, gk, h, o, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV, BC=BC,
            DOT_PREC=_prec(q), num_warps=_warps(8), num_stages=_stages(q))
        ctx.save_for_backward(q, k, v, gk, h0, ht)
        ctx.scale = scale
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, gk, h0, ht = ctx.saved_tensors
        scale = ctx.scale
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = triton.cdiv(T, BT)
        do = do.contiguous()
        dht = dht.contiguous() if dht is not None else None
        h, _ = gla_fwd_h(k, v, gk, h0, False)
        BKw, BVw = _walk_blocks(q, B, H, K, V)
        dh = q.new_empty(B, NT, H, K, V, dtype=_state_dtype(q))
        need_dh0 = h0 is not None and ctx.needs_input_grad[5]
        dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if need_dh0 else None
        _gla_bwd_dh_kernel[(triton.cdiv(K, BKw), triton.cdiv(V, BVw), B * H)](
            q, do, gk, dh, dht, dh0, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BKw, BV=BVw,
            USE_DHT=dht is not None, STORE_DH0=need_dh0, DOT_PREC=_prec(q), num_warps=_warps(4),
            num_stages=_stages(q))
        dq_i = torch.empty(B, T, H, K, device=q.device, dtype=torch.float32)
        dk_i = torch.empty_like(dq_i)
        dv_i = torch.empty(B, T, H, V, device=q.device, dtype=torch.float32)
        BV = min(64, _pow2(V))
        _gla_bwd_intra_kernel[(NT, B * H)](
            q, k, v, gk, do, dq_i, dk_i, dv_i, scale, T, H=H, K=K, V=V, BT=BT, BV=BV, BC=BC,
            DOT_PREC=_prec(q), num_warps=_warps(8), num_stages=_stages(q))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dA = torch.empty(B, H, K, T, device=q.device, dtype=torch.float32)
        _gla_bwd_inter_kernel[(NT, B * H)](
            q, k, v, gk, h, do, dh, dq_i, dk_i, dv_i, dq, dk, dv, dA, scale, T, NT, H=H, K=K, V=V,
            BT=BT, BK=_pow2(K), BV=BV, DOT_PREC=_prec(q), num_warps=_warps(8), num_stages=_stages(q))
        dgk = None
        if ctx.needs_input_grad[3]:
            dgk = dA.flip(-1).cumsum(-1).flip(-1)  # [B, H, K, T]: G_t = sum_{s<=t} gk_s
            if dht is not None and ht is not None:
                dgk = dgk + (dht * ht).sum(-1)[..., None]  # the final state depends on G_T
            dgk = dgk.permute(0, 3, 1, 2).to(gk.dtype).contiguous()
        return dq, dk, dv, dgk, None, dh0, None


@register_kernel("gla", "chunk")
@torch.compiler.disable
def gla_chunk(q, k, v, gk, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``blocks.ops.gla.chunk``; head dims above ``MAX_K`` are cut into key slices (the
    output is a sum over key channels, the state rows are independent)."""
    check_qkv(q, k, v)
    check_gate("gk", gk, q.shape)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state: must have shape {(B, H, K, V)}, got {tuple(initial_state.shape)}")
        initial_state = initial_state.float().contiguous()
    q, k, v, gk = q.contiguous(), k.contiguous(), v.contiguous(), gk.contiguous()
    if K <= MAX_K:
        return ChunkGLA.apply(q, k, v, gk, scale, initial_state, output_final_state)
    o, states = None, []
    for s in range(0, K, MAX_K):
        sl = slice(s, min(K, s + MAX_K))
        h0 = None if initial_state is None else initial_state[:, :, sl].contiguous()
        o_s, ht_s = ChunkGLA.apply(q[..., sl].contiguous(), k[..., sl].contiguous(), v,
                                   gk[..., sl].contiguous(), scale, h0, output_final_state)
        o = o_s if o is None else o + o_s
        states.append(ht_s)
    return o, (torch.cat(states, dim=2) if output_final_state else None)
