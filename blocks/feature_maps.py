"""Feature maps phi for linear attention: sim(q, k) = phi(q)^T phi(k) (Katharopoulos et al. 2020).

Every map takes ``x: [B, T, H, d]`` (one head's query or key features) and returns
``[B, T, H, m]`` with ``m = out_dim``; ``m`` is the key dimension K of the recurrent state.

| name        | phi(x)                                                   | m              |
|-------------|----------------------------------------------------------|----------------|
| ``elu1``    | elu(x) + 1                                               | d              |
| ``relu``    | relu(x)                                                  | d              |
| ``identity``| x                                                        | d              |
| ``performer``| FAVOR+ positive random features (Choromanski et al. 2021)| ``features``   |
| ``taylor``  | [1, x', x' (x) x' / sqrt(2)], x' = x / d^(1/4) (Based)   | 1 + d + d^2    |
| ``hedgehog``| softmax([x W_h, -x W_h]) per head h (Zhang et al. 2024)  | 2 * ``features``|
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class FeatureMap(nn.Module):
    """Base: ``forward(x: [B, T, H, d], is_query: bool) -> [B, T, H, out_dim]``."""

    out_dim: int

    def __init__(self, num_heads: int, dim: int) -> None:
        super().__init__()
        self.num_heads, self.dim = num_heads, dim
        self.out_dim = dim

    def begin_step(self) -> None:
        """Called once per block forward, before q and k are mapped (performer redraws here)."""

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class Elu1(FeatureMap):
    def forward(self, x, is_query):
        return F.elu(x) + 1.0


class Relu(FeatureMap):
    def forward(self, x, is_query):
        return F.relu(x)


class Identity(FeatureMap):
    def forward(self, x, is_query):
        return x


class Performer(FeatureMap):
    """FAVOR+ positive orthogonal random features:
    ``phi(x) = exp(W x' - |x'|^2 / 2 - c) / sqrt(m)`` with ``x' = x / d^(1/4)`` and ``W: [m, d]``
    made of blocks of orthogonal rows, each row rescaled to the norm of a Gaussian d-vector, so
    ``E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d))`` up to the constant ``exp(-c_q - c_k)``.

    Stabilisers ``c``: a query's own max over its features (detached; a positive per-query factor
    that both normalisations cancel); keys use ``c = 0`` with the exponent clamped at
    ``KEY_EXP_MAX`` so a key aligned with a long random row cannot overflow (a key-dependent
    stabiliser would change the weights between keys, and a sequence-wide max would break
    causality and chunked decoding).

    ``W`` is a buffer (saved with the model, identical at every decode step). With
    ``redraw=True`` a new ``W`` is drawn at each forward in training mode only, from a generator
    seeded with (a seed drawn at construction) + (the redraw count): data-parallel replicas built
    from the same seed draw the same features at the same step without communicating.
    """

    KEY_EXP_MAX = 30.0

    def __init__(self, num_heads: int, dim: int, features: int, redraw: bool) -> None:
        super().__init__(num_heads, dim)
        self.out_dim = features
        self.redraw = redraw
        self.register_buffer("proj", self.draw(features, dim))
        self.seed = int(torch.randint(0, 2**62, ()))
        self.draws = 0

    @staticmethod
    def draw(m: int, d: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``[m, d]`` block-orthogonal Gaussian rows with chi(d)-distributed norms (on CPU)."""
        blocks = []
        for _ in range(math.ceil(m / d)):
            g = torch.randn(d, d, generator=generator)
            q, r = torch.linalg.qr(g)  # columns orthonormal
            # sign fix: without it QR's Q is not Haar-distributed and the estimate is biased
            blocks.append((q * torch.sign(torch.diagonal(r))).T)
        w = torch.cat(blocks, dim=0)[:m]  # [m, d], unit rows
        norms = torch.randn(m, d, generator=generator).norm(dim=1)  # chi(d)
        return w * norms[:, None]

    def begin_step(self) -> None:
        if self.redraw and self.training:
            self.draws += 1
            g = torch.Generator().manual_seed(self.seed + self.draws)
            self.proj.copy_(self.draw(self.out_dim, self.dim, generator=g))  # drawn on CPU: [m, d] is small

    def forward(self, x, is_query):
        m = self.out_dim
        xs = x.float() * self.dim ** -0.25
        u = xs @ self.proj.float().T - 0.5 * xs.pow(2).sum(-1, keepdim=True)  # [B, T, H, m]
        if is_query:
            u = u - u.amax(-1, keepdim=True).detach()
        else:
            u = u.clamp(max=self.KEY_EXP_MAX)
        return (torch.exp(u) * m ** -0.5).to(x.dtype)


class Taylor(FeatureMap):
    """Second-order Taylor features of ``exp(q^T k / sqrt(d))`` (Based, Arora et al. 2024):
    ``phi(q)^T phi(k) = 1 + s + s^2 / 2`` with ``s = q^T k / sqrt(d)``, always ``>= 1/2``.
    Meant for a small feature dim (``head_dim_k`` defaults to 16 with this map)."""

    def __init__(self, num_heads: int, dim: int) -> None:
        super().__init__(num_heads, dim)
        self.out_dim = 1 + dim + dim * dim

    def forward(self, x, is_query):
        xs = x * self.dim ** -0.25
        outer = (xs.unsqueeze(-1) * xs.unsqueeze(-2)).flatten(-2) * 2 ** -0.5  # [B, T, H, d*d]
        return torch.cat([torch.ones_like(xs[..., :1]), xs, outer], dim=-1)


class Hedgehog(FeatureMap):
    """Learnable softmax-mimicking map (Zhang et al. 2024): ``phi(x) = softmax([x W_h, -x W_h])``
    over the ``2m`` features, with ``W: [H, d, m]`` initialised to the identity (as fla does)."""

    def __init__(self, num_heads: int, dim: int, features: int) -> None:
        super().__init__(num_heads, dim)
        self.out_dim = 2 * features
        self.weight = nn.Parameter(torch.eye(dim, features).expand(num_heads, dim, features).clone())

    def forward(self, x, is_query):
        u = torch.einsum("bthd,hdm->bthm", x, self.weight.to(x.dtype))  # [B, T, H, m]
        return torch.cat([u, -u], dim=-1).float().softmax(-1).to(x.dtype)


FEATURE_MAPS = ("elu1", "relu", "identity", "performer", "taylor", "hedgehog")


def build_feature_map(name: str, num_heads: int, dim: int, features: int, redraw: bool) -> FeatureMap:
    """``features`` is the random-feature count (performer) or the half width (hedgehog)."""
    if name == "elu1":
        return Elu1(num_heads, dim)
    if name == "relu":
        return Relu(num_heads, dim)
    if name == "identity":
        return Identity(num_heads, dim)
    if name == "performer":
        return Performer(num_heads, dim, features, redraw)
    if name == "taylor":
        return Taylor(num_heads, dim)
    if name == "hedgehog":
        return Hedgehog(num_heads, dim, features)
    raise ValueError(f"unknown feature map {name!r}")  # configs are validated before this


def feature_dim(name: str, dim: int, features: int) -> int:
    """State key dim K produced by map ``name`` on input dim ``dim`` (without building it)."""
    return {"performer": features, "taylor": 1 + dim + dim * dim, "hedgehog": 2 * features}.get(name, dim)
