"""Gated linear attention with a scalar decay per head and step (simple GLA; Mamba-2 style;
a fixed decay is RetNet).

    S_t = exp(g_t) S_{t-1} + k_t v_t^T          S: [K, V] per (batch, head), float32
    o_t = scale * S_t^T q_t                     (the output includes the current token)

Shapes: ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``g: [B, T, H]`` (log decay, ``g <= 0``),
state ``[B, H, K, V]`` float32. Every form returns ``(o: [B, T, H, V] in q.dtype, final_state)``
where ``final_state`` is None unless ``output_final_state``.
"""
from __future__ import annotations

import torch

from .utils import (
    check_chunk_size,
    check_gate,
    causal_decay,
    check_qkv,
    chunked,
    cuda_kernel,
    decay_to_end,
    default_scale,
    initial_state_f32,
    unchunked,
)


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference loop over positions (the ground truth the other forms are tested against)."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_gate("g", g, (B, T, H))
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qf, kf, vf, gf = q.float() * scale, k.float(), v.float(), g.float()
    outs = []
    for t in range(T):
        S = gf[:, t, :, None, None].exp() * S + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)


def chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked form for training: matmuls inside each chunk, a loop over chunks for the state.

    On CUDA inputs a ``blocks.kernels`` kernel runs instead when one is registered.
    """
    kernel = cuda_kernel("simple_gla", "chunk", q)
    if kernel is not None:
        return kernel(q, k, v, g, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, chunk_size=chunk_size)
    check_qkv(q, k, v)
    check_gate("g", g, q.shape[:3])
    return chunk_scalar_decay(q, k, v, g, scale, initial_state, output_final_state, chunk_size)


def chunk_scalar_decay(q, k, v, g, scale, initial_state, output_final_state, chunk_size):
    """PyTorch chunked form shared with ``linear_attn`` (``g=None``: no decay).

    Inside a chunk with inclusive log-decay prefix sums ``G_i`` (``G`` resets at each chunk):
        o_i = exp(G_i) q_i^T S_0 + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) v_j
        S_C = exp(G_C) S_0 + sum_j exp(G_C - G_j) k_j v_j^T
    Every exponent is <= 0 (the ``j > i`` pairs are masked to -inf before ``exp``), so strong decay
    underflows to 0 instead of overflowing; ``G_C - G_j`` is summed directly (``utils.decay_to_end``).
    """
    check_chunk_size(chunk_size)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qc, kc, vc = chunked(q, C) * scale, chunked(k, C), chunked(v, C)  # [B, H, N, C, D]
    N = qc.shape[2]

    A = qc @ kc.transpose(-1, -2)  # [B, H, N, C(i), C(j)]
    if g is None:
        A = A.tril()
        q_in, k_in, chunk_decay = qc, kc, None
    else:
        gc = chunked(g, C)  # [B, H, N, C]
        G = gc.cumsum(-1)
        A = A * causal_decay(G)
        q_in = qc * G.exp()[..., None]  # reads the chunk's starting state
        k_in = kc * decay_to_end(gc).exp()[..., None]  # writes into the chunk's final state
        chunk_decay = G[..., -1].exp()  # [B, H, N]
    o = A @ vc  # intra-chunk part, [B, H, N, C, V]
    update = k_in.transpose(-1, -2) @ vc  # [B, H, N, K, V]

    starts = []
    for n in range(N):
        starts.append(S)
        S = S + update[:, :, n] if chunk_decay is None else chunk_decay[:, :, n, None, None] * S + update[:, :, n]
    o = o + q_in @ torch.stack(starts, dim=2)  # inter-chunk part
    return unchunked(o, T, q.dtype), (S if output_final_state else None)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: ``q, k: [B, H, K]``, ``v: [B, H, V]``, ``g: [B, H]``, ``state: [B, H, K, V]``
    float32 (None = zeros) -> ``(o: [B, H, V] in q.dtype, new_state)``."""
    kernel = cuda_kernel("simple_gla", "step", q, k, v, g, state)
    if kernel is not None:
        return kernel(q, k, v, g, state=state, scale=scale)
    check_qkv(q, k, v, ndim=3)
    B, H, K = q.shape
    check_gate("g", g, (B, H))
    S = initial_state_f32(state, B, H, K, v.shape[-1], q.device)
    S = g.float().exp()[..., None, None] * S + k.float()[..., :, None] * v.float()[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q.float() * default_scale(scale, K), S)
    return o.to(q.dtype), S
