"""Gated / decaying linear attention: ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t``.

* ``retnet``     fixed per-head decay ``gamma_h = 1 - 2^(-5-h)`` (RetNet, Sun et al. 2023), op ``simple_gla``
* ``simple_gla`` data-dependent scalar decay per head and step, Mamba-2 style:
                 ``g = -exp(A_log) * softplus(W_dt x + dt_bias)``, op ``simple_gla``
* ``gla``        data-dependent decay per key channel (GLA, Yang et al. 2024):
                 ``gk = logsigmoid(W_2 W_1 x + b) / gate_normalizer``, op ``gla``

q and k enter the op as projected (plus the optional conv), with ``scale = head_dim_k ** -0.5``.
State: ``S: [B, H, Kin, V]`` float32 plus conv caches (``blocks.linear_family``).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from .ops import gla as gla_op, simple_gla as simple_gla_op
from .linear_family import LinearBlock, LinearConfig, check_positive_int, is_number
from .base import check
from .common import mamba2_decay, mamba2_decay_params
from .registry import register


@register("retnet")
class RetNet(LinearBlock):
    """Multi-scale retention without xPos: decay ``log(1 - 2^(-5-h))`` for head ``h`` (a buffer,
    not trained), so heads range from a ~32-token to a very long memory. Output: per-head RMSNorm
    (RetNet's GroupNorm per head without the mean) and a SiLU gate, both on by default."""

    letter = "R"
    Config = LinearConfig
    op = simple_gla_op

    def log_decay(self, device) -> torch.Tensor:
        """``[H]`` float32. Computed, not a buffer: ``block.to(bfloat16)`` must not round it."""
        h = torch.arange(self.num_heads, dtype=torch.float32, device=device)
        return torch.log1p(-torch.pow(2.0, -5.0 - h))

    def mix_inputs(self, x, side, q, k, v):
        B, T = x.shape[:2]
        g = self.log_decay(x.device).expand(B, T, self.num_heads)  # [B, T, H]
        return q, k, v, (g,), None


@register("simple_gla")
class SimpleGLA(LinearBlock):
    """Scalar data-dependent decay per head and step (Mamba-2's ``A * dt``):
    ``g = -exp(A_log) * softplus(W_dt x + dt_bias)`` with ``A_log, dt_bias: [H]``."""

    letter = "M"
    Config = LinearConfig
    op = simple_gla_op

    def __init__(self, d_model: int, **config) -> None:
        super().__init__(d_model, **config)
        self.A_log, self.dt_bias = mamba2_decay_params(self.num_heads)

    def side_projections(self) -> dict[str, int]:
        return {"dt": self.num_heads}

    def mix_inputs(self, x, side, q, k, v):
        g = mamba2_decay(self.A_log, self.dt_bias, side["dt"])  # [B, T, H]
        return q, k, v, (g,), None


@dataclasses.dataclass(frozen=True)
class GLAConfig(LinearConfig):
    """``LinearConfig`` plus ``gate_low_rank_dim`` (rank of the gate projection, 16) and
    ``gate_normalizer`` (the gate's log-decay is divided by it, 16 as in the GLA paper)."""

    gate_low_rank_dim: int = 16
    gate_normalizer: float = 16.0

    def validate(self, d_model: int) -> None:
        super().validate(d_model)
        check_positive_int(self.gate_low_rank_dim, "gate_low_rank_dim")
        check(is_number(self.gate_normalizer) and self.gate_normalizer > 0, "gate_normalizer",
              self.gate_normalizer, "be a positive number")


@register("gla")
class GLA(LinearBlock):
    """Vector gates over the key dim: ``gk = logsigmoid(W_2 W_1 x + b) / gate_normalizer``,
    ``gk: [B, T, H, Kin]``; ``W_1: d_model -> gate_low_rank_dim`` (a side projection: rows of the
    block's one input matmul), ``W_2 = gk_up: -> H*Kin`` with bias."""

    letter = "G"
    Config = GLAConfig
    op = gla_op

    def __init__(self, d_model: int, **config) -> None:
        super().__init__(d_model, **config)
        self.gk_up = nn.Linear(self.config.gate_low_rank_dim, self.num_heads * self.head_dim_k, bias=True)

    def side_projections(self) -> dict[str, int]:
        return {"gk_low": self.config.gate_low_rank_dim}

    def mix_inputs(self, x, side, q, k, v):
        B, T = x.shape[:2]
        gk = F.logsigmoid(self.gk_up(side["gk_low"]).float()) / self.config.gate_normalizer
        return q, k, v, (gk.view(B, T, self.num_heads, self.head_dim_k),), None

    @classmethod
    def example_configs(cls):
        return {**super().example_configs(),
                "low_rank4": {"num_heads": 2, "gate_low_rank_dim": 4, "gate_normalizer": 1.0, "conv_size": 2}}

    @classmethod
    def bad_configs(cls):
        return super().bad_configs() + [
            ({"gate_low_rank_dim": 0}, "gate_low_rank_dim"),
            ({"gate_normalizer": -16}, "gate_normalizer"),
        ]
