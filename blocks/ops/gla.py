"""Gated linear attention with a decay per key channel (GLA, Yang et al. 2023).

    S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T   S: [K, V] per (batch, head), float32
    o_t = scale * S_t^T q_t                     (the output includes the current token)

Shapes: ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, ``gk: [B, T, H, K]`` (log decay, ``gk <= 0``),
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

SUBCHUNK = 16  # largest sub-chunk for the exact pairwise-decay blocks on the chunk diagonal


def recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference loop over positions (the ground truth the other forms are tested against)."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    check_gate("gk", gk, (B, T, H, K))
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qf, kf, vf, gf = q.float() * scale, k.float(), v.float(), gk.float()
    outs = []
    for t in range(T):
        S = gf[:, t, :, :, None].exp() * S + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    return o, (S if output_final_state else None)


def chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked form for training: matmuls inside each chunk, a loop over chunks for the state.

    Inside a chunk with inclusive prefix sums ``G_i = sum_{s<=i} gk_s`` (``[K]``, reset per chunk):
        o_i = (q_i * exp(G_i))^T S_0 + sum_{j<=i} sum_c q_ic k_jc exp(G_ic - G_jc) v_j
        S_C = diag(exp(G_C)) S_0 + sum_j (k_j * exp(G_C - G_j)) v_j^T
    The intra-chunk scores are split into sub-chunks of up to ``SUBCHUNK`` positions (fla's
    secondary chunking). Off-diagonal sub-blocks (query sub-chunk a after key sub-chunk b) factor
    through the decay at the end of b, ``r_b``: ``(q_i * exp(G_i - r_b)) . (k_j * exp(r_b - G_j))``,
    both exponents <= 0. Diagonal sub-blocks use the pairwise ``exp(G_i - G_j)`` masked to -inf
    for ``j > i`` before ``exp`` (``utils.causal_decay``). So nothing overflows however strong the
    decay, and the pairwise tensors take ``c + C / c`` (20 at C=64) times the memory of ``q``
    instead of ``C`` times, with ``c`` the sub-chunk size.

    On CUDA inputs a ``blocks.kernels`` kernel runs instead when one is registered.
    """
    kernel = cuda_kernel("gla", "chunk", q)
    if kernel is not None:
        return kernel(q, k, v, gk, scale=scale, initial_state=initial_state,
                      output_final_state=output_final_state, chunk_size=chunk_size)
    check_qkv(q, k, v)
    check_gate("gk", gk, q.shape)
    check_chunk_size(chunk_size)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    c = max(d for d in range(1, min(SUBCHUNK, C) + 1) if C % d == 0)  # sub-chunk size
    M = C // c  # sub-chunks per chunk
    scale = default_scale(scale, K)
    S = initial_state_f32(initial_state, B, H, K, V, q.device)
    qc, kc, vc = chunked(q, C) * scale, chunked(k, C), chunked(v, C)  # [B, H, N, C, D]
    gc = chunked(gk, C)  # [B, H, N, C, K]
    G = gc.cumsum(-2)
    N = qc.shape[2]
    dev = q.device

    qs, ks, Gs = (x.reshape(B, H, N, M, c, K) for x in (qc, kc, G))  # [B, H, N, M, c, K]
    r = Gs[..., -1, :]  # [B, H, N, M, K] decay prefix at the end of each sub-chunk
    # Off-diagonal sub-blocks: exponent G_i - r_b for query sub-chunk a > key sub-chunk b.
    after = torch.ones(M, M, dtype=torch.bool, device=dev).tril(-1)  # [a, b]: a > b
    e_q = Gs[:, :, :, :, None] - r[:, :, :, None, :, None, :]  # [B, H, N, a, b, c, K]
    e_q = e_q.masked_fill(~after[:, :, None, None], float("-inf"))
    q_off = qs[:, :, :, :, None] * e_q.exp()
    k_off = ks * decay_to_end(gc.reshape(B, H, N, M, c, K), dim=-2).exp()  # r_b - G_j: [B, H, N, b, c, K]
    A = torch.einsum("zhnabik,zhnbjk->zhnaibj", q_off, k_off)  # [B, H, N, a, c, b, c]
    # Diagonal sub-blocks: exact pairwise decay per channel, [B, H, N, M, c(i), c(j), K].
    d_d = causal_decay(Gs.transpose(-1, -2)).permute(0, 1, 2, 3, 5, 6, 4)
    A_diag = (qs[..., :, None, :] * ks[..., None, :, :] * d_d).sum(-1)  # [B, H, N, M, c, c]
    A = A + torch.einsum("zhnaij,ab->zhnaibj", A_diag, torch.eye(M, device=dev))
    o = A.reshape(B, H, N, C, C) @ vc  # intra-chunk part, [B, H, N, C, V]

    q_in = qc * G.exp()  # reads the chunk's starting state
    k_in = kc * decay_to_end(gc, dim=-2).exp()  # writes into the chunk's final state
    update = k_in.transpose(-1, -2) @ vc  # [B, H, N, K, V]
    chunk_decay = G[..., -1, :].exp()  # [B, H, N, K]
    starts = []
    for n in range(N):
        starts.append(S)
        S = chunk_decay[:, :, n, :, None] * S + update[:, :, n]
    o = o + q_in @ torch.stack(starts, dim=2)  # inter-chunk part
    return unchunked(o, T, q.dtype), (S if output_final_state else None)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step: ``q, k, gk: [B, H, K]``, ``v: [B, H, V]``, ``state: [B, H, K, V]`` float32
    (None = zeros) -> ``(o: [B, H, V] in q.dtype, new_state)``."""
    kernel = cuda_kernel("gla", "step", q, k, v, gk, state)
    if kernel is not None:
        return kernel(q, k, v, gk, state=state, scale=scale)
    check_qkv(q, k, v, ndim=3)
    B, H, K = q.shape
    check_gate("gk", gk, (B, H, K))
    S = initial_state_f32(state, B, H, K, v.shape[-1], q.device)
    S = gk.float().exp()[..., None] * S + k.float()[..., :, None] * v.float()[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q.float() * default_scale(scale, K), S)
    return o.to(q.dtype), S
