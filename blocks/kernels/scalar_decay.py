"""Triton chunk kernels, forward and backward, for linear attention with a scalar decay per head
and step: ``simple_gla`` (``g: [B, T, H]`` log decay), ``linear_attn`` (no decay) and, through
``simple_gla``, ``retnet``.

    S_t = exp(g_t) S_{t-1} + k_t v_t^T          S: [K, V] per (batch, head), float32 carry
    o_t = scale * S_t^T q_t

flash-linear-attention's design, written for this project: the sequence is cut into chunks of
``BT`` positions; one kernel walks the chunks of a (batch, head) in order *inside the kernel* and
stores the state at every chunk start (``h: [B, NT, H, K, V]``); a second, fully parallel kernel
computes every chunk's output from its start state plus the masked intra-chunk scores. The
backward is the mirror: a reverse walk stores the state gradient at every chunk end, then a
parallel kernel computes ``dq, dk, dv`` and ``dA_t = q_t.dq_t - k_t.dk_t``, the gradient of the
cumulative log decay, whose reverse cumsum (plus ``<dS_T, S_T>``) is ``dg``. The backward reuses
the forward's chunk states (``KEEP_H``; recomputed instead under ``ARCHSEARCH_LOW_MEMORY_KERNELS=1``,
so training memory stays that of the activations).

Inside a chunk ``G_i`` is the inclusive prefix sum of ``g``; every exponent used is <= 0 (the
``j > i`` pairs are masked to -inf before ``exp``), so strong decay underflows instead of
overflowing. Padding past ``T`` loads ``k = v = g = 0``, which leaves the state unchanged.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blocks.ops.utils import check_qkv

from . import low_memory_from_env, register_kernel
from .fallback import falls_back_to, reference_gradients
from .fitted import KernelDoesNotFit, jit as _jit
from .tiles import dot_prec as _prec, launch as _launch, pow2 as _pow2, state_dtype as _state_dtype
from .tiles import cdiv as _cdiv, walk_bv

BT = 64  # chunk length inside the kernels; the math does not depend on it (the ops' chunk_size
         # is an argument of the PyTorch form, the kernels pick the size that suits the hardware)
MAX_K = 128  # the backward keeps full-K rows of dq/dk in registers; larger K is split (see below)
# Warps and pipelining stages per kernel ("walk": the forward state walk and the reverse gradient
# walk; ``num_stages: None`` = ``tiles.stages``): the fastest of benchmarks/kernel_launch_sweep.py's
# one-at-a-time variants on the H200 (docs/benchmarks/kernel_launch_sweep.md; 3-stage walks: 13%
# less time per step at 32k tokens per sequence).
LAUNCH = {
    "walk": dict(num_warps=4, num_stages=3),
    "fwd_o": dict(num_warps=8, num_stages=None),
    "bwd_dqkv": dict(num_warps=8, num_stages=3),
}
# ARCHSEARCH_LOW_MEMORY_KERNELS=1 in the environment: the backward recomputes what the switches
# below keep from the forward.
LOW_MEMORY = low_memory_from_env()
# Keep the forward's chunk states h ([B, T/64, H, K, V], 8 KB per token at 16 heads of 128 in
# bf16) for the backward instead of rerunning the state walk (``fwd_h``: 0.60 ms for both calls of a 2.4 ms step at
# 64k tokens). Sweep 2026-11-30 16:49 (H200): fwd+bwd -12.5 / -10.7% (linear_attn, 2k / 32k),
# -12.1 / -14.6% (simple_gla). Off under ARCHSEARCH_LOW_MEMORY_KERNELS=1.
KEEP_H = not LOW_MEMORY
SWITCHES = {"KEEP_H": (False, True)}
@_jit(do_not_specialize=["T", "NT"])  # one compile for every length
def _fwd_h_kernel(k, v, g, h, h0, ht, T, NT,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    """Grid (K/BK, V/BV, B*H): walk the chunks in order; h[b, t, h] = state before chunk t."""
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
        b_k = tl.load(k + ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None],
                      mask=m_k[:, None] & m_t[None, :], other=0.)  # [BK, BT]
        b_v = tl.load(v + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.)  # [BT, BV]
        if USE_G:
            b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
            b_gc = tl.cumsum(b_g, axis=0)
            g_last = tl.sum(b_g, axis=0)
            b_h *= tl.exp(g_last)
            b_v = (b_v * tl.exp(g_last - b_gc)[:, None]).to(b_k.dtype)
        b_h += tl.dot(b_k, b_v, input_precision=DOT_PREC)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@_jit(do_not_specialize=["T", "NT"])  # one compile for every length
def _fwd_o_kernel(q, k, v, g, h, o, scale, T, NT,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (V/BV, NT, B*H): o = scale * (exp(G) * (q @ h_t) + (mask(q k^T) * exp(G_i - G_j)) @ v)."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + ((i_b * T + o_t[:, None]) * H + i_h) * K + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.)  # [BT, BK]
        b_k = tl.load(k + ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None],
                      mask=m_k[:, None] & m_t[None, :], other=0.)  # [BK, BT]
        b_h = tl.load(h + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.)  # [BK, BV]
        b_o += tl.dot(b_q, b_h, input_precision=DOT_PREC)
        b_A += tl.dot(b_q, b_k, input_precision=DOT_PREC)
    o_i = tl.arange(0, BT)
    m_A = o_i[:, None] >= o_i[None, :]
    if USE_G:
        b_gc = tl.cumsum(tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32), axis=0)
        b_o = b_o * tl.exp(b_gc)[:, None]
        b_A = b_A * tl.exp(tl.where(m_A, b_gc[:, None] - b_gc[None, :], float("-inf")))
    b_A = tl.where(m_A, b_A, 0.)
    b_v = tl.load(v + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                  mask=m_t[:, None] & m_v[None, :], other=0.)
    b_o = (b_o + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=DOT_PREC)) * scale
    tl.store(o + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :], b_o.to(o.dtype.element_ty),
             mask=m_t[:, None] & m_v[None, :])


@_jit(do_not_specialize=["T", "NT"])  # one compile for every length
def _bwd_dh_kernel(q, do, g, dh, dht, dh0, scale, T, NT,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE_G: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                   DOT_PREC: tl.constexpr):
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
        b_q = tl.load(q + ((i_b * T + o_t[None, :]) * H + i_h) * K + o_k[:, None],
                      mask=m_k[:, None] & m_t[None, :], other=0.)  # [BK, BT]
        b_do = tl.load(do + ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :],
                       mask=m_t[:, None] & m_v[None, :], other=0.)  # [BT, BV]
        if USE_G:
            b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
            b_gc = tl.cumsum(b_g, axis=0)
            b_dh *= tl.exp(tl.sum(b_g, axis=0))
            b_q = (b_q * (scale * tl.exp(b_gc))[None, :]).to(b_do.dtype)
        else:
            b_q = (b_q * scale).to(b_do.dtype)
        b_dh += tl.dot(b_q, b_do, input_precision=DOT_PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


# BV blocks the loop over V: on a GPU short of shared memory (float32 needs 180 KB at BV 64) fitted halves it
@_jit(do_not_specialize=["T", "NT"], loop_blocks=("BV",))  # one compile for every length
def _bwd_dqkv_kernel(q, k, v, g, h, do, dh, dq, dk, dv, dA, scale, T, NT,
                     H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     USE_G: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (NT, B*H), BK >= K: one chunk's dq, dk, dv (looping over V) and dA = q.dq - k.dk."""
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
    b_q = tl.load(q + p_qk, mask=m_tk, other=0.)  # [BT, BK]
    b_k = tl.load(k + p_qk, mask=m_tk, other=0.)
    o_i = tl.arange(0, BT)
    m_ji = o_i[None, :] >= o_i[:, None]  # [j, i]: key j is seen by query i
    m_ij = o_i[:, None] >= o_i[None, :]
    # A^T[j, i] = scale * (k_j . q_i) * exp(G_i - G_j) for i >= j
    b_At = tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC)
    if USE_G:
        b_g = tl.load(g + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.).to(tl.float32)
        b_gc = tl.cumsum(b_g, axis=0)
        g_last = tl.sum(b_g, axis=0)
        b_At = b_At * tl.exp(tl.where(m_ji, b_gc[None, :] - b_gc[:, None], float("-inf")))
    b_At = tl.where(m_ji, b_At * scale, 0.).to(b_k.dtype)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        p_v = ((i_b * T + o_t[:, None]) * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.)  # [BT, BV]
        b_do = tl.load(do + p_v, mask=m_tv, other=0.)
        m_vk = m_v[:, None] & m_k[None, :]
        b_hT = tl.load(h + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)  # [BV, BK]
        b_dhT = tl.load(dh + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)
        b_dq += tl.dot(b_do, b_hT.to(b_do.dtype), input_precision=DOT_PREC)
        b_dk += tl.dot(b_v, b_dhT.to(b_v.dtype), input_precision=DOT_PREC)
        b_ds += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
        b_kdh = tl.dot(b_k, tl.trans(b_dhT).to(b_k.dtype), input_precision=DOT_PREC)  # [BT, BV]
        if USE_G:
            b_kdh = b_kdh * tl.exp(g_last - b_gc)[:, None]
        b_dv = tl.dot(b_At, b_do, input_precision=DOT_PREC) + b_kdh
        tl.store(dv + p_v, b_dv.to(dv.dtype.element_ty), mask=m_tv)
    if USE_G:
        b_ds = b_ds * tl.exp(tl.where(m_ij, b_gc[:, None] - b_gc[None, :], float("-inf")))
        b_dq = b_dq * tl.exp(b_gc)[:, None]
        b_dk = b_dk * tl.exp(g_last - b_gc)[:, None]
    b_ds = tl.where(m_ij, b_ds * scale, 0.).to(b_q.dtype)
    b_dq = b_dq * scale + tl.dot(b_ds, b_k, input_precision=DOT_PREC)
    b_dk = b_dk + tl.dot(tl.trans(b_ds), b_q, input_precision=DOT_PREC)
    tl.store(dq + p_qk, b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + p_qk, b_dk.to(dk.dtype.element_ty), mask=m_tk)
    if USE_G:
        b_dA = tl.sum(b_dq * b_q.to(tl.float32), axis=1) - tl.sum(b_dk * b_k.to(tl.float32), axis=1)
        tl.store(dA + i_bh * T + o_t, b_dA, mask=m_t)  # [B, H, T]: the reverse cumsum runs along the last dim


def _walk_blocks(x: torch.Tensor, B: int, H: int, K: int, V: int) -> tuple[int, int]:
    """(BK, BV) of the sequential chunk walks (grid ``(K/BK, V/BV, B*H)``; ``tiles.walk_bv``)."""
    BK = min(64, _pow2(K))
    return BK, walk_bv(x, B * H * _cdiv(K, BK), V)


def fwd_h(k, v, g, h0, output_final_state):
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    BK, BV = _walk_blocks(k, B, H, K, V)
    h = k.new_empty(B, NT, H, K, V, dtype=_state_dtype(k))
    ht = k.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None
    grid = (_cdiv(K, BK), _cdiv(V, BV), B * H)
    _fwd_h_kernel[grid](k, v, g, h, h0, ht, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                        USE_G=g is not None, USE_H0=h0 is not None, STORE_HT=output_final_state,
                        DOT_PREC=_prec(k), **_launch(LAUNCH, "walk", k))
    return h, ht


def fwd_o(q, k, v, g, h, scale):
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    BK, BV = min(64, _pow2(K)), min(128, _pow2(V))
    o = torch.empty_like(v)
    grid = (_cdiv(V, BV), NT, B * H)
    _fwd_o_kernel[grid](q, k, v, g, h, o, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                        USE_G=g is not None, DOT_PREC=_prec(q), **_launch(LAUNCH, "fwd_o", q))
    return o


def bwd_dh(q, do, g, dht, h0_needs_grad, scale):
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = _cdiv(T, BT)
    BK, BV = _walk_blocks(q, B, H, K, V)
    dh = q.new_empty(B, NT, H, K, V, dtype=_state_dtype(q))
    dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if h0_needs_grad else None
    grid = (_cdiv(K, BK), _cdiv(V, BV), B * H)
    _bwd_dh_kernel[grid](q, do, g, dh, dht, dh0, scale, T, NT, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
                         USE_G=g is not None, USE_DHT=dht is not None, STORE_DH0=h0_needs_grad,
                         DOT_PREC=_prec(q), **_launch(LAUNCH, "walk", q))
    return dh, dh0


def bwd_dqkv(q, k, v, g, h, do, dh, scale):
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    BK, BV = _pow2(K), min(64, _pow2(V))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dA = q.new_empty(B, H, T, dtype=torch.float32) if g is not None else None
    _bwd_dqkv_kernel[(NT, B * H)](q, k, v, g, h, do, dh, dq, dk, dv, dA, scale, T, NT, H=H, K=K, V=V,
                                  BT=BT, BK=BK, BV=BV, USE_G=g is not None, DOT_PREC=_prec(q),
                                  **_launch(LAUNCH, "bwd_dqkv", q))
    return dq, dk, dv, dA


class ChunkScalarDecay(torch.autograd.Function):
    """Autograd wrapper: ``(q, k, v [B,T,H,*], g [B,T,H] | None, scale, h0 [B,H,K,V] | None, final)``
    -> ``(o [B,T,H,V], final_state [B,H,K,V] float32 | None)``. Requires ``K <= MAX_K``."""

    @staticmethod
    def forward(ctx, q, k, v, g, scale, h0, output_final_state):
        h, ht = fwd_h(k, v, g, h0, output_final_state)
        o = fwd_o(q, k, v, g, h, scale)
        # h is recomputed in backward unless KEEP_H (a [B, T/64, H, K, V] tensor per layer)
        ctx.keep_h = KEEP_H  # as at forward time: the switch may change before backward
        ctx.save_for_backward(q, k, v, g, h0, ht, *((h,) if KEEP_H else ()))
        del h
        ctx.scale = scale
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, h0, ht, *kept = ctx.saved_tensors
        do = do.contiguous()
        if dht is not None:
            dht = dht.contiguous()
        need_dh0 = h0 is not None and ctx.needs_input_grad[5]
        try:
            h = kept[0] if ctx.keep_h else fwd_h(k, v, g, h0, False)[0]
            dh, dh0 = bwd_dh(q, do, g, dht, need_dh0, ctx.scale)
            dq, dk, dv, dA = bwd_dqkv(q, k, v, g, h, do, dh, ctx.scale)
        except KernelDoesNotFit as exc:  # e.g. float32 on a ~99 KB GPU: bwd_dqkv needs 104 KB at least
            from blocks.ops.simple_gla import chunk_scalar_decay as torch_form

            dq, dk, dv, dg, dh0 = reference_gradients(
                exc, "linear_attn" if g is None else "simple_gla",
                lambda q, k, v, g, h0: torch_form(q, k, v, g, ctx.scale, h0, dht is not None, BT),
                (q, k, v, g, h0), (*ctx.needs_input_grad[:4], need_dh0), do, dht)
            return dq, dk, dv, dg, None, dh0, None
        dg = None
        if g is not None and ctx.needs_input_grad[3]:
            # A_t = sum_{s<=t} g_s  =>  dg_s = sum_{t>=s} dA_t ; the final state depends on A_T.
            # dA is [B, H, T]: a scan along the contiguous last dim is parallel in PyTorch, while one
            # along dim 1 of [B, T, H] runs one thread per (b, h) column (milliseconds at T = 32k).
            dg = dA.flip(-1).cumsum(-1).flip(-1)
            if dht is not None and ht is not None:
                dg = dg + (dht * ht).sum((-2, -1))[:, :, None]
            dg = dg.transpose(1, 2).to(g.dtype).contiguous()
        return dq, dk, dv, dg, None, dh0, None


def chunk_scalar_decay(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """``simple_gla`` / ``linear_attn`` chunk form on Triton; ``g=None`` means no decay.

    Shapes as ``blocks.ops.simple_gla.chunk``. Head dims above ``MAX_K`` are cut into slices of
    keys: without a denominator, linear attention is a sum over key channels, so the outputs of the
    slices add up and their states stack along K.
    """
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state: must have shape {(B, H, K, V)}, got {tuple(initial_state.shape)}")
        initial_state = initial_state.float().contiguous()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if g is not None:
        g = g.contiguous()
    if K <= MAX_K:
        return ChunkScalarDecay.apply(q, k, v, g, scale, initial_state, output_final_state)
    o, states = None, []
    for s in range(0, K, MAX_K):
        sl = slice(s, min(K, s + MAX_K))
        h0 = None if initial_state is None else initial_state[:, :, sl].contiguous()
        o_s, ht_s = ChunkScalarDecay.apply(q[..., sl].contiguous(), k[..., sl].contiguous(), v, g, scale,
                                           h0, output_final_state)
        o = o_s if o is None else o + o_s
        states.append(ht_s)
    return o, (torch.cat(states, dim=2) if output_final_state else None)


@register_kernel("simple_gla", "chunk")
@torch.compiler.disable  # torch.compile graphs break here and run the kernels as they are
@falls_back_to("simple_gla")
def simple_gla_chunk(q, k, v, g, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``blocks.ops.simple_gla.chunk`` (``chunk_size`` is the PyTorch form's; see ``BT``)."""
    if tuple(g.shape) != tuple(q.shape[:3]):
        raise ValueError(f"g: must have shape {tuple(q.shape[:3])}, got {tuple(g.shape)}")
    return chunk_scalar_decay(q, k, v, g, scale, initial_state, output_final_state)


@register_kernel("linear_attn", "chunk")
@torch.compiler.disable
@falls_back_to("linear_attn")
def linear_attn_chunk(q, k, v, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``blocks.ops.linear_attn.chunk``."""
    return chunk_scalar_decay(q, k, v, None, scale, initial_state, output_final_state)
