"""Linear attention without decay (Katharopoulos et al. 2020); feature maps are applied by the caller.

    S_t = S_{t-1} + k_t v_t^T                   S: [K, V] per (batch, head), float32
    o_t = scale * S_t^T q_t                     (the output includes the current token)

Shapes: ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, state ``[B, H, K, V]`` float32. Every form
returns ``(o: [B, T, H, V] in q.dtype, final_state)``; ``final_state`` is None unless
``output_final_state``. No normalisation here: for the ``q . sum(k)`` denominator append a column
of ones to ``v`` (its output column is then the denominator, and it rides along in the state).
"""
from __future__ import annotations

import torch

from .simple_gla import chunk_scalar_decay
from .utils import check_qkv, cuda_kernel, default_scale, initial_state_f32


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference loop over positions (the ground truth the other forms are tested against)."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qf, kf, vf = q.float() * scale, k.float(), v.float()
    outs = []
    for t in range(T):
        S = S + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)


def chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked form for training (``simple_gla``'s chunk form with no decay).

    On CUDA inputs a ``blocks.kernels`` kernel runs instead when one is registered.
    """
    kernel = cuda_kernel("linear_attn", "chunk", q)
    if kernel is not None:
        return kernel(q, k, v, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, chunk_size=chunk_size)
    check_qkv(q, k, v)
    return chunk_scalar_decay(q, k, v, None, scale, initial_state, output_final_state, chunk_size)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: ``q, k: [B, H, K]``, ``v: [B, H, V]``, ``state: [B, H, K, V]`` float32
    (None = zeros) -> ``(o: [B, H, V] in q.dtype, new_state)``."""
    kernel = cuda_kernel("linear_attn", "step", q, k, v, state)
    if kernel is not None:
        return kernel(q, k, v, state=state, scale=scale)
    check_qkv(q, k, v, ndim=3)
    B, H, K = q.shape
    S = initial_state_f32(state, B, H, K, v.shape[-1], q.device)
    S = S + k.float()[..., :, None] * v.float()[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q.float() * default_scale(scale, K), S)
    return o.to(q.dtype), S
