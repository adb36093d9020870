"""Delta rule (DeltaNet, Schlag et al. 2021; chunked training per Yang et al. 2024).

    S_t = S_{t-1} - beta_t k_t (k_t^T S_{t-1}) + beta_t k_t v_t^T     S: [K, V] per (batch, head), float32
        = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T
    o_t = scale * S_t^T q_t                                          (the output includes the current token)

Shapes: ``q, k: [B, T, H, K]`` (``k`` L2-normalised by the caller, see ``utils.l2norm``),
``v: [B, T, H, V]``, ``beta: [B, T, H]`` in (0, 1], state ``[B, H, K, V]`` float32. Every form
returns ``(o: [B, T, H, V] in q.dtype, final_state)``; ``final_state`` is None unless
``output_final_state``.
"""
from __future__ import annotations

import torch

from .gated_delta_rule import chunk_delta
from .utils import check_gate, check_qkv, cuda_kernel, default_scale, initial_state_f32


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference loop over positions (the ground truth the other forms are tested against)."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_gate("beta", beta, (B, T, H))
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qf, kf, vf, bf = q.float() * scale, k.float(), v.float(), beta.float()
    outs = []
    for t in range(T):
        k_t = kf[:, t]  # [B, H, K]
        err = vf[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S)  # v_t - S^T k_t
        S = S + bf[:, t, :, None, None] * k_t[..., :, None] * err[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)


def chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked form for training: the WY/UT representation (one triangular solve per chunk, then a
    loop over chunks); the math is written out in ``gated_delta_rule.chunk_delta``.

    On CUDA inputs a ``blocks.kernels`` kernel runs instead when one is registered.
    """
    kernel = cuda_kernel("delta_rule", "chunk", q)
    if kernel is not None:
        return kernel(q, k, v, beta, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, chunk_size=chunk_size)
    check_qkv(q, k, v)
    check_gate("beta", beta, q.shape[:3])
    return chunk_delta(q, k, v, None, beta, scale, initial_state, output_final_state, chunk_size)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: ``q, k: [B, H, K]``, ``v: [B, H, V]``, ``beta: [B, H]``,
    ``state: [B, H, K, V]`` float32 (None = zeros) -> ``(o: [B, H, V] in q.dtype, new_state)``."""
    kernel = cuda_kernel("delta_rule", "step", q, k, v, beta, state)
    if kernel is not None:
        return kernel(q, k, v, beta, state=state, scale=scale)
    check_qkv(q, k, v, ndim=3)
    B, H, K = q.shape
    check_gate("beta", beta, (B, H))
    S = initial_state_f32(state, B, H, K, v.shape[-1], q.device)
    kf = k.float()
    err = v.float() - torch.einsum("bhk,bhkv->bhv", kf, S)
    S = S + beta.float()[..., None, None] * kf[..., :, None] * err[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q.float() * default_scale(scale, K), S)
    return o.to(q.dtype), S
