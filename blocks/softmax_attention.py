"""``softmax``: causal softmax attention with rotary positions, grouped-query heads and an optional
sliding window; training and prefill through SDPA (``blocks.ops.softmax``), decode over a KV cache.

State: ``k_cache: [B, S, Hkv, D]`` and ``v_cache: [B, S, Hkv, D]`` in the activation dtype, holding
the rotated keys and the values of the last ``S = context`` tokens (``S = min(context, window)``
with a window), and ``pos``: a 0-d int64 tensor, the absolute position of the next token (rotary
needs it once the window has dropped old tokens). Bytes: ``2*B*S*Hkv*D*bytes(dtype) + 8``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from .base import Block, BlockConfig, State, check
from .common import InputProjection, OutputGate, dtype_bytes, rotary
from .linear_family import (check_bool, check_choice, check_num_heads, check_positive_int, default_heads,
                            is_int, is_number)
from .ops import softmax as softmax_op
from .registry import register


@dataclasses.dataclass(frozen=True)
class SoftmaxConfig(BlockConfig):
    """num_heads     query heads H (default ``max(1, d_model // 64)``)
    num_kv_heads  key/value heads Hkv, dividing H (default H; 1 = multi-query)
    head_dim      D, even (default ``d_model // H``)
    window        sliding window in tokens, each query reads itself and the previous window-1
                  tokens (0 = full causal attention)
    rope_theta    rotary base
    output_gate   multiply by ``sigmoid(W_g x)`` before the output projection (gated attention)
    mode          "chunk" (SDPA; the KV-cache step for a T == 1 continuation) or "recurrent"
                  (the op's reference loop; for tests)
    """

    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    window: int = 0
    rope_theta: float = 10000.0
    output_gate: bool = False
    mode: str = "chunk"

    def validate(self, d_model: int) -> None:
        H = check_num_heads(self.num_heads, d_model, self.head_dim is not None, "head_dim is set")
        check_positive_int(self.num_kv_heads, "num_kv_heads", optional=True)
        check(self.num_kv_heads is None or H % self.num_kv_heads == 0, "num_kv_heads", self.num_kv_heads,
              f"divide num_heads={H}")
        check_positive_int(self.head_dim, "head_dim", optional=True)
        D = self.head_dim if self.head_dim is not None else d_model // H
        check(D % 2 == 0, "head_dim", self.head_dim if self.head_dim is not None else D,
              "be even (rotary embeddings rotate pairs)")
        check(is_int(self.window) and self.window >= 0, "window", self.window, "be an integer >= 0 (0 = full)")
        check(is_number(self.rope_theta) and self.rope_theta > 1, "rope_theta", self.rope_theta, "be a number > 1")
        check_bool(self.output_gate, "output_gate")
        check_choice(self.mode, "mode", ("chunk", "recurrent"))

    def heads(self, d_model: int) -> int:
        return default_heads(self.num_heads, d_model)

    def dims(self, d_model: int) -> tuple[int, int, int]:
        """``(H, Hkv, D)``: query heads, key/value heads and head dim, derived where unset."""
        H = self.heads(d_model)
        return H, self.num_kv_heads or H, self.head_dim or d_model // H

    def resolved(self, d_model: int) -> dict[str, Any]:
        """``num_heads``, ``num_kv_heads`` and ``head_dim`` as the block uses them (``dims``)."""
        H, Hkv, D = self.dims(d_model)
        return {**super().resolved(d_model), "num_heads": H, "num_kv_heads": Hkv, "head_dim": D}


@register("softmax")
class SoftmaxAttention(Block):
    """Multi-head causal softmax attention with RoPE, GQA and an optional window (module docstring).

    ``last_backend`` names the attention backend of the latest forward ("cudnn", "flash_attn",
    "flash", "efficient", "math", "kernel"; "recurrent" in mode recurrent).
    """

    letter = "S"
    Config = SoftmaxConfig

    def __init__(self, d_model: int, **config) -> None:
        super().__init__(d_model, **config)
        c = self.config
        self.num_heads, self.num_kv_heads, self.head_dim = H, Hkv, D = c.dims(d_model)
        # q, k, v and the gate from one matmul (``InputProjection``: fewer kernels per decode step)
        widths = {"q": H * D, "k": Hkv * D, "v": Hkv * D}
        if c.output_gate:
            widths["gate"] = H * D
        self.in_proj = InputProjection(d_model, widths)
        self.gate = OutputGate("sigmoid") if c.output_gate else None
        self.o_proj = nn.Linear(H * D, d_model, bias=False)
        self.last_backend: str | None = None

    def project(self, x: torch.Tensor, start: torch.Tensor | int):
        """``x: [B, T, d_model]`` at positions ``start + [0, T)`` -> ``(q: [B, T, H, D],
        k, v: [B, T, Hkv, D], gate pre-activation [B, T, H*D] | None)``, rotary applied to q and k."""
        return self.heads_of(self.in_proj(x), start)

    def heads_of(self, p: dict[str, torch.Tensor], start: torch.Tensor | int):
        """``project`` from the input projection's columns ``p`` (``InputProjection``'s dict of
        ``[B, T, width]`` views; a decode step may compute them in another kernel)."""
        B, T, _ = p["q"].shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = rotary(p["q"].view(B, T, H, D), start, self.config.rope_theta)
        k = rotary(p["k"].view(B, T, Hkv, D), start, self.config.rope_theta)
        return q, k, p["v"].view(B, T, Hkv, D), p.get("gate")

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """``x: [B, T, d_model]`` -> ``(y: [B, T, d_model], state)``; the input state is not modified."""
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        c = self.config
        start = torch.zeros((), dtype=torch.long, device=x.device) if state is None else state["pos"]
        q, k, v, g = self.project(x, start)
        cache = None if state is None else (state["k_cache"], state["v_cache"])
        if c.mode == "recurrent":
            o, cache = softmax_op.recurrent(q, k, v, window=c.window, initial_state=cache, output_final_state=True)
            self.last_backend = "recurrent"
        elif T == 1 and cache is not None:
            o, cache = softmax_op.step(q[:, 0], k[:, 0], v[:, 0], state=cache, window=c.window)
            o = o[:, None]
            self.last_backend = softmax_op.last_backend
        else:
            o, cache = softmax_op.chunk(q, k, v, window=c.window, initial_state=cache, output_final_state=True)
            self.last_backend = softmax_op.last_backend
        o = o.reshape(B, T, H * D)
        if self.gate is not None:
            o = self.gate(o, g)
        new_state = {"k_cache": _own(cache[0]), "v_cache": _own(cache[1]), "pos": start + T}
        return self.o_proj(o), new_state

    def cache_len(self, context: int) -> int:
        w = self.config.window
        return min(context, w) if w else context

    def state_bytes(self, batch: int, context: int, dtype: torch.dtype = torch.float32) -> int:
        """``2 * B * S * Hkv * D * bytes(dtype) + 8`` with ``S = min(context, window or context)``."""
        S = self.cache_len(context)
        return 2 * batch * S * self.num_kv_heads * self.head_dim * dtype_bytes(dtype) + 8

    @classmethod
    def example_configs(cls) -> dict[str, dict[str, Any]]:
        return {
            "default": {},
            "gqa": {"num_heads": 4, "num_kv_heads": 2},
            "mqa_window_gate": {"num_heads": 4, "num_kv_heads": 1, "window": 5, "output_gate": True},
            "window1": {"num_heads": 2, "window": 1, "head_dim": 6},
        }

    @classmethod
    def bad_configs(cls) -> list[tuple[dict[str, Any], str]]:
        return [
            ({"num_heads": 3}, "num_heads"),
            ({"num_heads": 4, "num_kv_heads": 3}, "num_kv_heads"),
            ({"head_dim": 7}, "head_dim"),
            ({"window": -1}, "window"),
            ({"rope_theta": 0}, "rope_theta"),
            ({"mode": "flash"}, "mode"),
            ({"output_gate": 1}, "output_gate"),
        ]


def _own(t: torch.Tensor) -> torch.Tensor:
    """``t`` without a larger buffer behind it (a trimmed cache is a view of the untrimmed one)."""
    return t.clone() if t.untyped_storage().nbytes() > t.numel() * t.element_size() else t
