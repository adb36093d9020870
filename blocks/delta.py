"""Delta-rule linear attention: the state is corrected toward each new value instead of summed.

* ``deltanet`` (Schlag et al. 2021; Yang et al. 2024): ``S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T``
* ``gated_deltanet`` (Yang et al. 2025): decay first, ``S_t = exp(g_t) S_{t-1}`` then the delta update,
  ``g = -exp(A_log) * softplus(W_a x + dt_bias)`` (Mamba-2's decay parameterisation)

``q`` and ``k`` are L2-normalised per head (so ``I - beta k k^T`` is a contraction);
``beta = sigmoid(W_b x): [B, T, H]`` (``W_a``, ``W_b`` are side projections: rows of the
block's one input matmul); ``scale = head_dim_k ** -0.5``. Both default to a short
conv of size 4, output norm and (gated_deltanet) output gate, as in fla.
State: ``S: [B, H, Kin, V]`` float32 plus conv caches (``blocks.linear_family``).
"""
from __future__ import annotations

import dataclasses

import torch

from .ops import delta_rule as delta_rule_op, gated_delta_rule as gated_delta_rule_op
from .common import mamba2_decay, mamba2_decay_params
from .linear_family import LinearBlock, LinearConfig
from .ops.utils import l2norm
from .registry import register


@dataclasses.dataclass(frozen=True)
class DeltaNetConfig(LinearConfig):
    """``LinearConfig`` with fla's DeltaNet defaults: conv_size 4, output norm, no output gate."""

    conv_size: int = 4
    output_gate: bool = False


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetConfig(LinearConfig):
    """``LinearConfig`` with fla's Gated DeltaNet defaults: conv_size 4, output norm and gate."""

    conv_size: int = 4


@register("deltanet")
class DeltaNet(LinearBlock):
    """Delta rule with ``beta = sigmoid(W_b x)`` per head and step."""

    letter = "D"
    Config = DeltaNetConfig
    op = delta_rule_op

    def side_projections(self) -> dict[str, int]:
        return {"beta": self.num_heads}

    def mix_inputs(self, x, side, q, k, v):
        beta = torch.sigmoid(side["beta"].float())  # [B, T, H]
        return l2norm(q), l2norm(k), v, (beta,), None


@register("gated_deltanet")
class GatedDeltaNet(LinearBlock):
    """Gated delta rule: decay ``g = -exp(A_log) * softplus(W_a x + dt_bias)`` and ``beta = sigmoid(W_b x)``."""

    letter = "N"
    Config = GatedDeltaNetConfig
    op = gated_delta_rule_op

    def __init__(self, d_model: int, **config) -> None:
        super().__init__(d_model, **config)
        self.A_log, self.dt_bias = mamba2_decay_params(self.num_heads)

    def side_projections(self) -> dict[str, int]:
        return {"a": self.num_heads, "beta": self.num_heads}

    def mix_inputs(self, x, side, q, k, v):
        g = mamba2_decay(self.A_log, self.dt_bias, side["a"])  # [B, T, H]
        beta = torch.sigmoid(side["beta"].float())  # [B, T, H]
        return l2norm(q), l2norm(k), v, (g, beta), None
