"""One fused Triton kernel for the decode step of every linear family (``<family>.step``).

    S = decay * S                                   decay: 1, exp(g) [scalar] or exp(gk) [per key]
    S = S + k (beta * (v - S^T k))^T  (delta rules) or  S + k v^T
    o = scale * S^T q

``q, k: [B, H, K]``, ``v: [B, H, V]``, ``g: [B, H]``, ``gk: [B, H, K]``, ``beta: [B, H]``, state
``[B, H, K, V]`` float32. A step reads and writes the whole state once: at batch 16, 16 heads and
128x128 states that is 2 x 16.8 MB, so the kernel is bound by memory bandwidth. One program per
(batch, head, V slice) loads its ``[K, BV]`` slice once, updates it in registers and stores it;
eager PyTorch needs 5-6 kernels and several passes over the state for the same step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blocks.ops.utils import check_gate, check_qkv

from . import inplace_enabled, register_kernel
from .tiles import INTERPRET as _INTERPRET, cdiv, pow2

NO_GATE, SCALAR_GATE, KEY_GATE = 0, 1, 2


@triton.jit
def _step_kernel(q, k, v, g, beta, s_in, s_out, o, scale, H,
                 sq_b, sq_h, sk_b, sk_h, sv_b, sv_h, sg_b, sg_h, sbeta_b, sbeta_h,
                 K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 GATE: tl.constexpr, DELTA: tl.constexpr, HAS_STATE: tl.constexpr):
    """Grid (V/BV, B*H); BK >= K. ``q, k, v, g, beta`` are read through their (batch, head)
    strides (``s<name>_b``, ``s<name>_h``; the last dim contiguous), so column slices of one
    projection need no copy; the states and ``o`` are contiguous."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_s = i_bh * K * V + o_k[:, None] * V + o_v[None, :]
    b_k = tl.load(k + i_b * sk_b + i_h * sk_h + o_k, mask=m_k, other=0.).to(tl.float32)
    b_q = tl.load(q + i_b * sq_b + i_h * sq_h + o_k, mask=m_k, other=0.).to(tl.float32) * scale
    b_v = tl.load(v + i_b * sv_b + i_h * sv_h + o_v, mask=m_v, other=0.).to(tl.float32)
    if HAS_STATE:
        b_s = tl.load(s_in + p_s, mask=m_kv, other=0.)
        if GATE == 1:
            b_s = b_s * tl.exp(tl.load(g + i_b * sg_b + i_h * sg_h).to(tl.float32))
        if GATE == 2:
            b_s = b_s * tl.exp(tl.load(g + i_b * sg_b + i_h * sg_h + o_k, mask=m_k, other=0.).to(tl.float32))[:, None]
        if DELTA:
            b_v = b_v - tl.sum(b_s * b_k[:, None], axis=0)
    else:
        b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if DELTA:
        b_v = b_v * tl.load(beta + i_b * sbeta_b + i_h * sbeta_h).to(tl.float32)
    b_s = b_s + b_k[:, None] * b_v[None, :]
    tl.store(s_out + p_s, b_s, mask=m_kv)
    tl.store(o + i_bh * V + o_v, tl.sum(b_s * b_q[:, None], axis=0).to(o.dtype.element_ty), mask=m_v)


def state_buffers(state: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s_in, s_out)`` contiguous ``dtype`` buffers a decode kernel reads and writes a piece of
    decode state through (the recurrent state in float32, a conv cache in the activations' dtype):
    ``s_out`` is ``state`` itself inside ``inplace_decode_state()`` when ``state`` already is such a
    buffer (each program reads what it overwrites first), else a new tensor."""
    s_in = state if state.dtype == dtype and state.is_contiguous() else state.to(dtype).contiguous()
    return s_in, (state if s_in is state and inplace_enabled() else torch.empty_like(s_in))


def _rows(x: torch.Tensor | None) -> tuple[torch.Tensor | None, int, int]:
    """``(x, batch stride, head stride)`` of a ``[B, H]`` or ``[B, H, D]`` input, copied only when
    its last dim is not contiguous. In a decode step ``q, k, v`` are usually column slices of one
    projection (``[B, H, D]`` with a batch stride of the projection's width): read in place they
    save one copy kernel each per layer and step."""
    if x is None:
        return None, 0, 0
    if x.dim() == 3 and x.shape[-1] > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    return x, x.stride(0), x.stride(1)


@torch.compiler.disable  # compiled callers (decode_graph's compiled layers) break here: the
# in-place decision must run eagerly, and the kernel needs no tracing
def fused_step(q, k, v, g=None, beta=None, state=None, scale=None, gate=NO_GATE):
    """The fused step for any family; see the module docstring. Returns ``(o [B,H,V], new_state)``.

    Inside ``blocks.kernels.inplace_decode_state()`` a given float32 contiguous ``state`` is updated
    in place (each program reads its slice before writing it, so aliasing is safe).
    """
    check_qkv(q, k, v, ndim=3)
    B, H, K = q.shape
    V = v.shape[-1]
    if state is not None and tuple(state.shape) != (B, H, K, V):
        raise ValueError(f"state: must have shape {(B, H, K, V)}, got {tuple(state.shape)}")
    scale = K ** -0.5 if scale is None else float(scale)
    (q, *sq), (k, *sk), (v, *sv) = _rows(q), _rows(k), _rows(v)
    (g, *sg), (beta, *sbeta) = _rows(g), _rows(beta)
    if state is not None:
        s_in, s_out = state_buffers(state)
    else:
        s_in, s_out = None, q.new_empty(B, H, K, V, dtype=torch.float32)
    o = q.new_empty(B, H, V)
    BK = pow2(K)
    # ~4K float32 state elements per program keeps registers low and gives B*H*V/BV programs
    # (1024 at batch 16, 16 heads, V=128) to cover the multiprocessors.
    BV = max(1, min(pow2(V, 1), 4096 // BK))
    grid = (cdiv(V, BV), B * H)
    _step_kernel[grid](q, k, v, g, beta, s_in, s_out, o, scale, H, *sq, *sk, *sv, *sg, *sbeta,
                       K=K, V=V, BK=BK, BV=BV, GATE=gate, DELTA=beta is not None, HAS_STATE=s_in is not None,
                       num_warps=1 if _INTERPRET else 4)
    return o, s_out


@register_kernel("linear_attn", "step")
def linear_attn_step(q, k, v, state=None, scale=None):
    return fused_step(q, k, v, state=state, scale=scale)


@register_kernel("simple_gla", "step")
def simple_gla_step(q, k, v, g, state=None, scale=None):
    check_gate("g", g, q.shape[:2])
    return fused_step(q, k, v, g=g, state=state, scale=scale, gate=SCALAR_GATE)


@register_kernel("gla", "step")
def gla_step(q, k, v, gk, state=None, scale=None):
    check_gate("gk", gk, q.shape)
    return fused_step(q, k, v, g=gk, state=state, scale=scale, gate=KEY_GATE)


@register_kernel("delta_rule", "step")
def delta_rule_step(q, k, v, beta, state=None, scale=None):
    check_gate("beta", beta, q.shape[:2])
    return fused_step(q, k, v, beta=beta, state=state, scale=scale)


@register_kernel("gated_delta_rule", "step")
def gated_delta_rule_step(q, k, v, g, beta, state=None, scale=None):
    check_gate("g", g, q.shape[:2])
    check_gate("beta", beta, q.shape[:2])
    return fused_step(q, k, v, g=g, beta=beta, state=state, scale=scale, gate=SCALAR_GATE)
