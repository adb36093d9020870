"""Helpers shared by the ops: ``l2norm``, argument checks, float32 state set-up, chunk padding,
and the CUDA kernel dispatch hook.

Layout conventions (flash-linear-attention's): activations ``[B, T, H, D]``; the chunk forms work
internally on ``[B, H, N, C, D]`` (``N`` chunks of ``C`` positions, zero-padded at the end).
"""
from __future__ import annotations

from typing import Callable

import torch


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` along ``dim``, computed in float32, returned in ``x.dtype``.

    The delta rules expect keys normalised this way (``k: [B, T, H, K]``), which keeps the
    per-step transition ``I - beta k k^T`` a contraction.
    """
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(dim, keepdim=True) + eps)).to(x.dtype)


def default_scale(scale: float | None, head_dim_k: int) -> float:
    """The query scale: ``K ** -0.5`` unless given."""
    return head_dim_k ** -0.5 if scale is None else float(scale)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ndim: int = 4) -> None:
    """Check ``q, k: [B, (T,) H, K]`` and ``v: [B, (T,) H, V]`` agree; ``ValueError`` naming the tensor."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != ndim:
            layout = "[B, T, H, D]" if ndim == 4 else "[B, H, D]"
            raise ValueError(f"{name}: must be {layout}, got shape {tuple(t.shape)}")
    if ndim == 4 and q.shape[1] < 1:
        raise ValueError(f"q: must have at least one position (T >= 1), got shape {tuple(q.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"k: must have the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"v: must match q in all but the last dim {tuple(q.shape[:-1])}, got {tuple(v.shape)}")


def check_gate(name: str, g: torch.Tensor, shape: tuple[int, ...]) -> None:
    """``ValueError`` unless gate/beta ``g`` has exactly ``shape``."""
    if tuple(g.shape) != tuple(shape):
        raise ValueError(f"{name}: must have shape {tuple(shape)}, got {tuple(g.shape)}")


def initial_state_f32(
    initial_state: torch.Tensor | None, B: int, H: int, K: int, V: int, device: torch.device
) -> torch.Tensor:
    """The recurrent state to start from, ``[B, H, K, V]`` float32 (zeros when ``None``)."""
    if initial_state is None:
        return torch.zeros(B, H, K, V, dtype=torch.float32, device=device)
    if tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"initial_state: must have shape {(B, H, K, V)}, got {tuple(initial_state.shape)}")
    return initial_state.float()


def chunked(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[B, T, H, ...]`` -> float32 ``[B, H, N, C, ...]`` with ``T`` zero-padded up to ``N * C``.

    Zero padding is neutral for every family: a padded step has ``k = v = 0`` (and ``g = 0``,
    ``beta = 0``), so it leaves the state unchanged; its outputs are sliced off.
    """
    B, T, H = x.shape[:3]
    rest = x.shape[3:]
    N = -(-T // chunk_size)
    x = x.float().transpose(1, 2)  # [B, H, T, ...]
    pad = N * chunk_size - T
    if pad:
        x = torch.cat([x, x.new_zeros(B, H, pad, *rest)], dim=2)
    return x.reshape(B, H, N, chunk_size, *rest)


def unchunked(o: torch.Tensor, T: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, H, N, C, V]`` -> ``[B, T, H, V]`` in ``dtype`` (drops the padding)."""
    B, H, N, C, V = o.shape
    return o.reshape(B, H, N * C, V)[:, :, :T].transpose(1, 2).to(dtype)


def decay_to_end(g: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``sum_{s > i} g_s`` along ``dim`` (the decay from position ``i`` to the end of its chunk).

    Equal to ``G_last - G_i`` for the prefix sums ``G``, but summed directly: the difference of
    prefix sums loses precision when ``|G|`` is large, and its gradient for ``i = last`` is a
    ``+x - x`` cancellation that swamps the (tiny) true gradient under strong decay.
    """
    rest = g.flip(dim).cumsum(dim).flip(dim).narrow(dim, 1, g.shape[dim] - 1)
    shape = list(g.shape)
    shape[dim] = 1
    return torch.cat([rest, g.new_zeros(shape)], dim=dim)


def causal_decay(G: torch.Tensor) -> torch.Tensor:
    """``exp(G_i - G_j)`` for ``j <= i``, 0 above the diagonal: ``G: [..., C]`` -> ``[..., C, C]``.

    The upper triangle is masked to -inf *before* ``exp`` (exponents stay <= 0, nothing
    overflows); the diagonal is the constant ``exp(0) = 1`` with no gradient path, because
    ``G_i - G_i`` would feed ``+x - x`` gradients into ``G_i`` that cancel and drown the true,
    possibly tiny, off-diagonal gradient in float32 rounding.
    """
    C = G.shape[-1]
    eye = torch.eye(C, dtype=torch.bool, device=G.device)
    strict = torch.ones(C, C, dtype=torch.bool, device=G.device).tril(-1)
    diff = G[..., :, None] - G[..., None, :]
    return diff.masked_fill(~strict, float("-inf")).masked_fill(eye, 0.0).exp()


def check_chunk_size(chunk_size: int) -> None:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")


# forms whose kernels have no backward (the decode kernels); the chunk kernels are autograd functions
NO_BACKWARD_FORMS = ("step", "decode")


def cuda_kernel(family: str, form: str, x: torch.Tensor, *inputs: torch.Tensor | None) -> Callable | None:
    """The ``blocks.kernels`` kernel for ``blocks.ops.<family>.<form>`` (or another registered
    kernel, e.g. ``("mixer", "decode")``) when ``x`` is on CUDA, else None.

    A form in ``NO_BACKWARD_FORMS`` is not offered while autograd records and ``x`` or any of
    ``inputs`` requires a gradient: the PyTorch path keeps the gradient. Imported lazily: kernel
    modules import the ops for their fallbacks.
    """
    if not x.is_cuda:
        return None
    if (form in NO_BACKWARD_FORMS and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (x, *inputs))):
        return None
    from blocks.kernels import get_kernel

    return get_kernel(family, form)
