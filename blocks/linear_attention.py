"""``linear_attn``: linear attention with a feature map (Katharopoulos et al. 2020).

    sim(q_i, k_j) = phi(q_i)^T phi(k_j)
    denominator:  o_i = sum_{j<=i} sim(q_i,k_j) v_j / g(sum_{j<=i} sim(q_i,k_j)),  g(d) = d + eps*sign(d)
    output_norm:  o_i = RMSNorm(sum_{j<=i} sim(q_i,k_j) v_j)      (no denominator)

The denominator runs through the same op as the numerator: ``v`` gets a ones column, so the
state ``[B, H, K, V+1]`` carries ``z_i = sum_j phi(k_j)`` in its last column and the op's last
output column is ``phi(q_i)^T z_i``. The guard ``d + eps*sign(d)`` with ``sign(0) = +1`` has
``|g(d)| = |d| + eps >= eps`` for every ``d``, so neither the output nor its gradient
(``|d(1/g)/dd| <= 1/eps^2``) can blow up, even for maps whose ``phi(q)^T z`` crosses zero
(``identity``) or is exactly zero (``relu``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .ops import linear_attn as linear_attn_op
from .base import check
from .feature_maps import FEATURE_MAPS, build_feature_map, feature_dim
from .linear_family import LinearBlock, LinearConfig, check_bool, check_choice, check_positive_int, is_number
from .registry import register


@dataclasses.dataclass(frozen=True)
class LinearAttnConfig(LinearConfig):
    """``LinearConfig`` plus:

    feature_map       elu1 | relu | identity | performer | taylor | hedgehog
    normalization     denominator | output_norm
    num_features      performer: random features m; hedgehog: half width m (default head_dim_k)
    performer_redraw  performer: draw new random features at every forward in training mode
    denominator_eps   eps of the denominator guard d + eps*sign(d)
    output_norm       default: true with normalization=output_norm (required there), else false
    head_dim_k        default: d_model // H, but min(16, d_model // H) with the taylor map
    output_gate       default false
    """

    feature_map: str = "elu1"
    normalization: str = "denominator"
    num_features: int | None = None
    performer_redraw: bool = False
    denominator_eps: float = 1e-5
    output_norm: bool | None = None
    output_gate: bool = False

    def validate(self, d_model: int) -> None:
        check_choice(self.feature_map, "feature_map", FEATURE_MAPS)
        check_choice(self.normalization, "normalization", ("denominator", "output_norm"))
        if self.normalization == "output_norm":
            check(self.output_norm in (None, True), "output_norm", self.output_norm,
                  "be true (or unset) when normalization is 'output_norm'")
        check_positive_int(self.num_features, "num_features", optional=True)
        check_bool(self.performer_redraw, "performer_redraw")
        check(is_number(self.denominator_eps) and self.denominator_eps > 0, "denominator_eps",
              self.denominator_eps, "be a positive number")
        super().validate(d_model)

    @property
    def norm_on(self) -> bool:
        return self.normalization == "output_norm" if self.output_norm is None else self.output_norm

    def validate_output_norm(self) -> None:  # None = derived from normalization
        check(self.output_norm is None or isinstance(self.output_norm, bool), "output_norm",
              self.output_norm, "be true, false or null")

    def dims(self, d_model: int) -> tuple[int, int, int]:
        H, K, V = super().dims(d_model)
        if self.feature_map == "taylor" and self.head_dim_k is None:
            K = min(16, K)
        return H, K, V

    def feature_count(self, head_dim_k: int) -> int:
        """Random/learned features of the performer and hedgehog maps (default: ``head_dim_k``)."""
        return self.num_features or head_dim_k

    def resolved(self, d_model: int) -> dict[str, Any]:
        """``LinearConfig.resolved`` (which takes the taylor ``head_dim_k`` from ``dims``) plus
        ``output_norm`` as ``norm_on`` derives it and ``num_features`` as the block passes it to
        its feature map (``feature_count``; unused by maps other than performer and hedgehog)."""
        out = super().resolved(d_model)
        return {**out, "output_norm": self.norm_on, "num_features": self.feature_count(out["head_dim_k"])}


@register("linear_attn")
class LinearAttention(LinearBlock):
    """Linear attention with feature map ``feature_map`` and ``normalization`` (module docstring).

    State: ``S: [B, H, K, V + 1]`` with the denominator (``[B, H, K, V]`` with output_norm), K the
    feature map's output dim (``feature_maps.feature_dim``), plus conv caches when ``conv_size > 0``.
    """

    letter = "L"
    Config = LinearAttnConfig
    op = linear_attn_op

    def __init__(self, d_model: int, **config) -> None:
        super().__init__(d_model, **config)
        c = self.config
        self.feature_map = build_feature_map(c.feature_map, self.num_heads, self.head_dim_k,
                                             c.feature_count(self.head_dim_k), c.performer_redraw)
        self.denominator = c.normalization == "denominator"

    @property
    def use_output_norm(self) -> bool:
        return self.config.norm_on

    def state_dims(self) -> tuple[int, int]:
        c = self.config
        K = feature_dim(c.feature_map, self.head_dim_k, c.feature_count(self.head_dim_k))
        return K, self.head_dim_v + (1 if self.denominator else 0)

    def mix_inputs(self, x, side, q, k, v):
        self.feature_map.begin_step()
        q, k = self.feature_map(q, is_query=True), self.feature_map(k, is_query=False)  # [B, T, H, K]
        if self.denominator:
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # [B, T, H, V+1]
        # The scale cancels in both normalisations; 1.0 keeps phi(q)^T z in its natural units.
        return q, k, v, (), 1.0

    def mix_outputs(self, o):
        if not self.denominator:
            return o
        num, den = o[..., :-1].float(), o[..., -1:].float()  # [B, T, H, V], [B, T, H, 1]
        eps = self.config.denominator_eps
        den = den + eps * torch.where(den >= 0, 1.0, -1.0)  # |den| >= eps always
        return (num / den).to(o.dtype)

    @classmethod
    def example_configs(cls) -> dict[str, dict[str, Any]]:
        cfgs: dict[str, dict[str, Any]] = {"default": {}}
        for fm in FEATURE_MAPS:
            cfgs[f"{fm}_den"] = {"num_heads": 2, "feature_map": fm, "normalization": "denominator"}
            cfgs[f"{fm}_norm"] = {"num_heads": 2, "feature_map": fm, "normalization": "output_norm"}
        cfgs["taylor_den"]["head_dim_k"] = 4  # K = 1 + 4 + 16
        cfgs["taylor_norm"]["head_dim_k"] = 4
        cfgs["performer_den"]["num_features"] = 24
        cfgs["hedgehog_den"]["num_features"] = 8
        cfgs["elu1_conv_gate"] = {"num_heads": 2, "conv_size": 3, "output_gate": True, "expand_v": 2}
        cfgs["relu_norm_conv"] = {"num_heads": 4, "feature_map": "relu", "normalization": "output_norm",
                                  "conv_size": 2, "head_dim_k": 6, "head_dim_v": 4}
        return cfgs

    @classmethod
    def contract_tolerance(cls, config: dict[str, Any], tol: float) -> float:
        """The identity map's denominator phi(q)^T z changes sign, so outputs near a zero crossing
        amplify float32 rounding by 1/|den|: compare those at 1e-2 of the largest output."""
        if config.get("feature_map") == "identity" and config.get("normalization", "denominator") == "denominator":
            return 1e-2
        return tol

    @classmethod
    def bad_configs(cls):
        return super().bad_configs() + [
            ({"feature_map": "sigmoid"}, "feature_map"),
            ({"normalization": "layer"}, "normalization"),
            ({"normalization": "output_norm", "output_norm": False}, "output_norm"),
            ({"feature_map": "performer", "num_features": 0}, "num_features"),
            ({"denominator_eps": 0.0}, "denominator_eps"),
        ]
