"""Pieces shared by the block families: fused input projection, short causal conv with a decode
cache, output gate and norm, Mamba-2 decay parameters, rotary embeddings.

Shapes: ``B`` batch, ``T`` time, ``H`` heads, ``D``/``K``/``V`` head dims, ``C`` channels.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ShortConv(nn.Module):
    """Causal depthwise convolution over time followed by SiLU (as in Mamba and fla's layers).

    ``forward(x: [B, T, C], cache: [B, W-1, C] | None) -> (y: [B, T, C], cache: [B, W-1, C])``.
    The cache holds the last ``W-1`` inputs (zeros before the sequence starts), in ``x``'s dtype,
    so a sequence split anywhere gives the same output as one pass. Its size does not depend on
    the context length: ``B * (W-1) * C * dtype_bytes``.
    """

    def __init__(self, channels: int, size: int) -> None:
        super().__init__()
        self.channels, self.size = channels, size
        self.weight = nn.Parameter(torch.empty(channels, 1, size))
        # Same init as nn.Conv1d (kaiming uniform with fan_in = size for a depthwise conv).
        bound = 1.0 / math.sqrt(size)
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        if cache is None:
            cache = x.new_zeros(B, self.size - 1, C)
        xp = torch.cat([cache.to(x.dtype), x], dim=1)  # [B, W-1+T, C]
        w = self.weight.to(x.dtype)
        if T == 1:  # decode: one output row, a weighted sum of the W cached rows
            y = depthwise_conv_row(xp, w)
        else:
            y = depthwise_conv_cuda(xp, w) if x.is_cuda else depthwise_conv_shifts(xp, w)  # [B, T, C]
        # clone: a slice would keep the whole [B, W-1+T, C] buffer alive inside the decode state.
        new_cache = xp[:, xp.shape[1] - (self.size - 1):].clone()
        return F.silu(y), new_cache

    def cache_bytes(self, batch: int, dtype: torch.dtype) -> int:
        return batch * (self.size - 1) * self.channels * dtype_bytes(dtype)


def depthwise_conv_cuda(xp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Valid depthwise conv of ``xp: [B, W-1+T, C]`` with ``weight: [C, 1, W]`` -> ``[B, T, C]`` (cuDNN)."""
    return F.conv1d(xp.transpose(1, 2), weight, groups=xp.shape[-1]).transpose(1, 2)


def depthwise_conv_row(xp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The conv's single output row for ``xp: [B, W, C]`` (a decode step) -> ``[B, 1, C]``.

    One multiply and one reduction, which ``torch.compile`` fuses with the SiLU and its neighbours
    into one kernel; cuDNN's conv (``depthwise_conv_cuda``) is a separate kernel with two transposes
    around it, once per layer and decode step."""
    return (xp * weight[:, 0, :].t()).sum(1, keepdim=True)


def depthwise_conv_shifts(xp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The same conv as W shifted multiply-adds. On CPU this is ~1.5-2x faster than oneDNN's
    depthwise conv forward+backward for W <= 4 (measured at [32, 32, 64] .. [8, 512, 1024])."""
    W = weight.shape[-1]
    T = xp.shape[1] - (W - 1)
    y = xp[:, :T] * weight[:, 0, 0]
    for i in range(1, W):
        y = y + xp[:, i:i + T] * weight[:, 0, i]
    return y


class HeadNorm(nn.Module):
    """RMSNorm over the last dim of ``[B, T, H, V]`` (weight ``[V]`` shared by the heads), computed
    in float32 whatever the activation and weight dtypes, returned in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, o: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(o.float(), self.weight.shape, self.weight.float(), self.eps).to(o.dtype)


class InputProjection(nn.Module):
    """Several bias-free projections of one input as one matmul.

    ``InputProjection(d_model, {"qkv": 384, "gate": 128, "a": 4})(x: [..., d_model])`` returns
    ``{"qkv": [..., 384], "gate": [..., 128], "a": [..., 4]}`` (views into one output). The weight is
    ``[sum(widths), d_model]`` with rows in the order given, initialised as ``nn.Linear`` would each
    part (the init depends only on the input width), so merging changes no distribution.

    Why one matmul: at decode (batch 16, one token) each projection is its own kernel launch and
    weight read, and a narrow one (``d_model -> num_heads`` for a decay or beta) keeps a whole
    kernel busy for a few KB of weights; one matmul per block replaces three to five. In training
    it saves launches and re-reads of ``x`` too.
    """

    def __init__(self, d_model: int, widths: dict[str, int]) -> None:
        super().__init__()
        if any(w <= 0 for w in widths.values()):
            raise ValueError(f"InputProjection: every width must be positive, got {widths}")
        self.names, self.widths = tuple(widths), tuple(widths.values())
        self.linear = nn.Linear(d_model, sum(self.widths), bias=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def rows(self, name: str) -> slice:
        """The weight rows of projection ``name``."""
        i = self.names.index(name)
        start = sum(self.widths[:i])
        return slice(start, start + self.widths[i])

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.linear(x).split(self.widths, dim=-1)))


class OutputGate(nn.Module):
    """``y = o * act(g)`` with the gate's pre-activation ``g = W_g x`` computed by the block's
    ``InputProjection`` (part ``"gate"``): ``o, g: [B, T, H*V]``. ``act`` is SiLU (GLA, RetNet,
    Gated DeltaNet) or sigmoid (gated softmax attention, Qwen3-Next). No parameters of its own."""

    def __init__(self, act: str = "silu") -> None:
        super().__init__()
        self.act_name = act
        self.act = F.silu if act == "silu" else torch.sigmoid

    def forward(self, o: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return o * self.act(g)

    def extra_repr(self) -> str:
        return self.act_name


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """``x`` with ``softplus(x) == y`` (for ``y > 0``), used to initialise ``dt_bias``."""
    return y + torch.log(-torch.expm1(-y))


def mamba2_decay_params(num_heads: int) -> tuple[nn.Parameter, nn.Parameter]:
    """``A_log [H]`` and ``dt_bias [H]`` initialised as in Mamba-2 / Gated DeltaNet:
    ``A ~ U(1, 16)``, ``dt ~ logU(1e-3, 1e-1)`` so ``g = -A * softplus(dt_proj(x) + dt_bias)``
    starts with decays between ``exp(-16 * 0.1)`` and ``exp(-1e-3)``."""
    A = torch.empty(num_heads).uniform_(1.0, 16.0)
    dt = torch.exp(torch.empty(num_heads).uniform_(math.log(1e-3), math.log(1e-1))).clamp_min(1e-4)
    return nn.Parameter(torch.log(A)), nn.Parameter(inverse_softplus(dt))


def mamba2_decay(A_log: torch.Tensor, dt_bias: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Log decay ``g = -exp(A_log) * softplus(a + dt_bias)`` in float32, ``a: [B, T, H]`` (the
    projected input) -> ``g: [B, T, H]``, with the parameters of ``mamba2_decay_params``."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias)


def rotary_frequencies(D: int, theta: float, device: torch.device) -> torch.Tensor:
    """``rotary``'s float32 frequencies ``theta ** (-i / (D/2))``, ``[D/2]`` (the decode graph's
    fused rotary kernel takes them precomputed)."""
    half = D // 2
    return theta ** (-torch.arange(half, device=device, dtype=torch.float32) / half)


def rotary(x: torch.Tensor, start: torch.Tensor | int, theta: float) -> torch.Tensor:
    """Rotary position embedding (half-split layout, as in GPT-NeoX/Llama) of ``x: [B, T, H, D]``
    at absolute positions ``start + [0, T)``; ``start`` is an int or a 0-d tensor. D must be even.
    Computed in float32, returned in ``x``'s dtype."""
    B, T, H, D = x.shape
    half = D // 2
    inv_freq = rotary_frequencies(D, theta, x.device)  # [D/2]
    pos = torch.arange(T, device=x.device, dtype=torch.float32) + (
        start.to(device=x.device, dtype=torch.float32) if torch.is_tensor(start) else float(start)
    )
    ang = pos[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]  # [1, T, 1, D/2]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
