"""Gated delta rule (Gated DeltaNet, Yang et al. 2024): the delta rule behind a scalar,
data-dependent decay ``alpha_t = exp(g_t)``.

    S'_t = exp(g_t) S_{t-1}                                  S: [K, V] per (batch, head), float32
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T            (= (I - beta_t k_t k_t^T) S'_t + beta_t k_t v_t^T)
    o_t  = scale * S_t^T q_t                                 (the output includes the current token)

Shapes: ``q, k: [B, T, H, K]`` (``k`` L2-normalised by the caller, see ``utils.l2norm``),
``v: [B, T, H, V]``, ``g: [B, T, H]`` (log decay, ``g <= 0``), ``beta: [B, T, H]`` in (0, 1],
state ``[B, H, K, V]`` float32. Every form returns ``(o: [B, T, H, V] in q.dtype, final_state)``;
``final_state`` is None unless ``output_final_state``.
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
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference loop over positions (the ground truth the other forms are tested against)."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_gate("g", g, (B, T, H))
    check_gate("beta", beta, (B, T, H))
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qf, kf, vf, gf, bf = q.float() * scale, k.float(), v.float(), g.float(), beta.float()
    outs = []
    for t in range(T):
        S = gf[:, t, :, None, None].exp() * S
        k_t = kf[:, t]  # [B, H, K]
        err = vf[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S)  # v_t - S'^T k_t
        S = S + bf[:, t, :, None, None] * k_t[..., :, None] * err[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)


def chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked form for training (WY/UT representation); see ``chunk_delta``.

    On CUDA inputs a ``blocks.kernels`` kernel runs instead when one is registered.
    """
    kernel = cuda_kernel("gated_delta_rule", "chunk", q)
    if kernel is not None:
        return kernel(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, chunk_size=chunk_size)
    check_qkv(q, k, v)
    check_gate("g", g, q.shape[:3])
    check_gate("beta", beta, q.shape[:3])
    return chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)


def chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size):
    """PyTorch chunked delta rule shared with ``delta_rule`` (``g=None``: no decay).

    Within a chunk starting from state ``S_0``, with inclusive log-decay prefix sums ``G_i`` and
    ``u_i = beta_i (v_i - S'_i^T k_i)`` (the value actually written at step i), the state is
    ``S_i = exp(G_i) S_0 + sum_{j<=i} exp(G_i - G_j) k_j u_j^T``, so the u's solve a unit lower
    triangular system (the UT transform):

        (I + A) U = diag(beta) V - diag(beta exp(G)) K S_0,   A_ij = beta_i exp(G_i - G_j) k_i . k_j  (j < i)

    One triangular solve per chunk (independent of ``S_0``) gives ``W = (I+A)^-1 diag(beta exp(G)) K``
    and ``U' = (I+A)^-1 diag(beta) V``; then, chunk by chunk,
        U   = U' - W S_0
        O   = diag(exp(G)) Q S_0 + (Q K^T * exp(G_i - G_j) [j <= i]) U
        S_C = exp(G_C) S_0 + (K * exp(G_C - G))^T U
    All exponents are <= 0 (pairs masked to -inf before ``exp``).
    """
    check_chunk_size(chunk_size)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qc, kc, vc = chunked(q, C) * scale, chunked(k, C), chunked(v, C)  # [B, H, N, C, D]
    bc = chunked(beta, C)  # [B, H, N, C]; padding has beta = 0 (no write)
    N = qc.shape[2]
    dev = q.device

    if g is None:
        G = None
        decay_causal = torch.ones(C, C, device=dev).tril()
    else:
        gc = chunked(g, C)  # [B, H, N, C]
        G = gc.cumsum(-1)
        decay_causal = causal_decay(G)  # exp(G_i - G_j) for j <= i
    decay_strict = decay_causal.tril(-1)

    A = bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * decay_strict  # [B, H, N, C, C]
    k_w = kc * bc[..., None] if G is None else kc * (bc * G.exp())[..., None]
    rhs = torch.cat([k_w, vc * bc[..., None]], dim=-1)  # [B, H, N, C, K + V]
    eye = torch.eye(C, device=dev)
    WU = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    W, U0 = WU.split([K, V], dim=-1)

    P = (qc @ kc.transpose(-1, -2)) * decay_causal  # [B, H, N, C, C]
    if G is None:
        q_in, k_in, chunk_decay = qc, kc, None
    else:
        q_in = qc * G.exp()[..., None]
        k_in = kc * decay_to_end(gc).exp()[..., None]
        chunk_decay = G[..., -1].exp()  # [B, H, N]
    outs = []
    for n in range(N):
        U = U0[:, :, n] - W[:, :, n] @ S  # [B, H, C, V]
        outs.append(q_in[:, :, n] @ S + P[:, :, n] @ U)
        S_new = k_in[:, :, n].transpose(-1, -2) @ U
        S = S + S_new if chunk_decay is None else chunk_decay[:, :, n, None, None] * S + S_new
    o = torch.stack(outs, dim=2)  # [B, H, N, C, V]
    return unchunked(o, T, q.dtype), (S if output_final_state else None)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: ``q, k: [B, H, K]``, ``v: [B, H, V]``, ``g, beta: [B, H]``,
    ``state: [B, H, K, V]`` float32 (None = zeros) -> ``(o: [B, H, V] in q.dtype, new_state)``."""
    kernel = cuda_kernel("gated_delta_rule", "step", q, k, v, g, beta, state)
    if kernel is not None:
        return kernel(q, k, v, g, beta, state=state, scale=scale)
    check_qkv(q, k, v, ndim=3)
    B, H, K = q.shape
    check_gate("g", g, (B, H))
    check_gate("beta", beta, (B, H))
    S = g.float().exp()[..., None, None] * initial_state_f32(state, B, H, K, v.shape[-1], q.device)
    kf = k.float()
    err = v.float() - torch.einsum("bhk,bhkv->bhv", kf, S)
    S = S + beta.float()[..., None, None] * kf[..., :, None] * err[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q.float() * default_scale(scale, K), S)
    return o.to(q.dtype), S
