"""HybridLM: a decoder-only language model whose token mixers come from the blocks registry.

Layout (pre-norm residual, Llama-style)::

    x = embed(input_ids)                                   # [B, T, d_model]
    for each layer:  x = x + mixer(norm1(x), state)        # mixer: blocks.build(layer.block, ...)
                     x = x + swiglu(norm2(x))              # absent when mlp_expansion == 0
    logits = head(final_norm(x))                           # [B, T, vocab]; head tied to embed

Inference carries one state dict per layer (KV caches for softmax layers, ``[B, H, K, V]`` float32
recurrent states and conv caches for linear ones)::

    logits, states = model.prefill(prompt)                 # prompt [B, T] -> logits [B, V]
    logits, states = model.decode_step(token, states)      # token [B] -> logits [B, V]
    out = model.generate(prompt, 32, temperature=0.8, top_k=50, generator=g)
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import blocks
from blocks.base import Block, State

from archsearch.spec import ArchSpec

States = list[State | None]


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``; ``x: [..., d_model]`` -> ``[..., d_model]``, hidden width ``hidden``.

    ``w1`` and ``w3`` are one matmul, ``w13: d_model -> 2 * hidden`` (rows ``[:hidden]`` are w1):
    one kernel and one weight read instead of two, which matters at decode (batch x 1 token)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.w13 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w13(x).chunk(2, dim=-1)  # [..., hidden] each
        return self.w2(F.silu(a) * b)


def _norm(kind: str, d_model: int) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=1e-6)
    return nn.LayerNorm(d_model, eps=1e-5)


MLP_MULTIPLE = 64


def mlp_hidden(spec: ArchSpec) -> int:
    """SwiGLU hidden width: ``mlp_expansion * d_model`` rounded up to a multiple of 64 (8 below 64),
    as Llama's ``multiple_of`` does; 0 when the MLP is off.

    Why: an odd width (8/3 * 2048 = 5461) puts the MLP matmuls on cuBLAS's unaligned path, which
    cost 2 ms of a 5.3 ms 24-layer decode step on an H200 (docs/benchmarks/history.md).
    """
    if spec.mlp_expansion <= 0:
        return 0
    width = spec.mlp_expansion * spec.d_model
    multiple = MLP_MULTIPLE if width >= MLP_MULTIPLE else 8
    return int(-(-round(width, 6) // multiple) * multiple)


class HybridLayer(nn.Module):
    """One residual layer: ``x + mixer(norm1(x))`` then ``+ mlp(norm2(x))``; ``x: [B, T, d_model]``."""

    def __init__(self, spec: ArchSpec, index: int) -> None:
        super().__init__()
        layer = spec.layers[index]
        self.norm1 = _norm(spec.norm, spec.d_model)
        self.mixer: Block = blocks.build(layer.block, d_model=spec.d_model, **dict(layer.config))
        hidden = mlp_hidden(spec)
        self.norm2 = _norm(spec.norm, spec.d_model) if hidden else None
        self.mlp = SwiGLU(spec.d_model, hidden) if hidden else None

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        y, state = self.mixer(self.norm1(x), state)
        x = x + y
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x, state


class HybridLM(nn.Module):
    """Language model built from an :class:`ArchSpec` (validated on construction)."""

    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        spec.validate()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
        self.layers = nn.ModuleList(HybridLayer(spec, i) for i in range(len(spec.layers)))
        self.final_norm = _norm(spec.norm, spec.d_model)
        self.head = nn.Linear(spec.d_model, spec.vocab_size, bias=False)
        self._init_weights()
        if spec.tied_embeddings:
            self.head.weight = self.embed.weight

    def _init_weights(self) -> None:
        # GPT-2 / Llama style: N(0, 0.02) embeddings and MLP inputs; the MLP output projection, which
        # writes into the residual stream, scaled by 1/sqrt(2 * layers) so the stream's variance
        # stays O(1) with depth. Mixers keep the initialisation their block chose.
        std = 0.02
        nn.init.normal_(self.embed.weight, std=std)
        nn.init.normal_(self.head.weight, std=std)
        for layer in self.layers:
            if layer.mlp is not None:
                nn.init.normal_(layer.mlp.w13.weight, std=std)
                nn.init.normal_(layer.mlp.w2.weight, std=std / math.sqrt(2 * len(self.layers)))

    # --- forward and inference --------------------------------------------------------------------
    def forward(
        self, input_ids: torch.Tensor, states: Sequence[State | None] | None = None
    ) -> tuple[torch.Tensor, States]:
        """``input_ids: [B, T]`` long -> ``(logits [B, T, V], states)``; ``states`` (one per layer)
        continues an earlier call, so ``forward(cat(a, b)) == forward(b, forward(a)[1])``."""
        if states is None:
            states = [None] * len(self.layers)
        elif len(states) != len(self.layers):
            raise ValueError(f"states: expected {len(self.layers)} layer states, got {len(states)}")
        x = self.embed(input_ids)
        new_states: States = []
        for layer, state in zip(self.layers, states):
            x, state = layer(x, state)
            new_states.append(state)
        return self.head(self.final_norm(x)), new_states

    def prefill(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, States]:
        """Run the prompt ``[B, T]``; returns the last position's logits ``[B, V]`` and the states."""
        logits, states = self(input_ids)
        return logits[:, -1], states

    def decode_step(self, token: torch.Tensor, states: Sequence[State | None]) -> tuple[torch.Tensor, States]:
        """One token per sequence ``[B]`` -> ``(logits [B, V], states)`` advanced by one position."""
        logits, states = self(token[:, None], states)
        return logits[:, 0], states

    @torch.no_grad()
    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue ``prompt [B, T]`` by ``max_new_tokens`` -> ``[B, T + max_new_tokens]``.

        ``temperature == 0`` is greedy (argmax); otherwise tokens are sampled from
        ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely (all when None),
        drawing from ``generator`` so a seeded generator reproduces the output.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens: must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k: must be >= 1, got {top_k}")
        if max_new_tokens == 0:
            return prompt
        out = [prompt]
        logits, states = self.prefill(prompt)
        for step in range(max_new_tokens):
            token = _pick(logits, temperature, top_k, generator)  # [B]
            out.append(token[:, None])
            if step + 1 < max_new_tokens:
                logits, states = self.decode_step(token, states)
        return torch.cat(out, dim=1)

    # --- accounting -------------------------------------------------------------------------------
    def state_bytes(self, batch: int, context: int, dtype: torch.dtype = torch.float32) -> int:
        """Decode-state bytes (KV caches + recurrent states) after ``context`` tokens, all layers."""
        return sum(layer.mixer.state_bytes(batch, context, dtype) for layer in self.layers)

    def num_params(self) -> int:
        """Trainable parameters, a tied embedding/head matrix counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def flops_per_token(self, context: int) -> int:
        """Analytic forward FLOPs for one token at position ``context`` (the decode-step cost).

        ``2 * N_matmul + sum over layers of the mixer's sequence math``, where ``N_matmul`` counts
        the weights that multiply activations once per token: every ``nn.Linear`` weight and short
        (depthwise) conv weight in the mixers and MLPs plus the LM head (``d_model * vocab``, also when tied);
        embedding lookups, norms and biases are not counted. Sequence math per layer (see
        :func:`mixer_sequence_flops`): softmax ``4 * min(context, window) * H * D`` (``q k^T`` and
        ``p v``); linear families ``4 * H * K * V`` (state update ``k v^T`` and read-out ``S^T q``),
        ``6 * H * K * V`` for the delta rule (plus ``S^T k``), with ``K, V`` the state dims after any
        feature map. A causal training pass over ``context`` tokens averages about half the softmax
        term per token.
        """
        if context < 1:
            raise ValueError(f"context: must be >= 1, got {context}")
        n_matmul = self.spec.d_model * self.spec.vocab_size
        seq = 0
        for layer in self.layers:
            n_matmul += _matmul_params(layer.mixer)
            if layer.mlp is not None:
                n_matmul += _matmul_params(layer.mlp)
            seq += mixer_sequence_flops(layer.mixer, context)
        return 2 * n_matmul + seq


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> torch.Tensor:
    """``logits [B, V]`` -> next tokens ``[B]`` (greedy at temperature 0, else sampled)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def _matmul_params(module: nn.Module) -> int:
    """Weights that multiply activations once per token: linear layers and (depthwise) short convs."""
    from blocks.common import ShortConv

    return sum(m.weight.numel() for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv1d, ShortConv)))


def mixer_sequence_flops(block: Block, context: int) -> int:
    """The mixer's per-token FLOPs beyond its projections at ``context`` (see ``flops_per_token``).

    Softmax blocks: ``4 * S * H * D`` with ``S = min(context, window)`` (``cache_len``); linear
    blocks: ``4 * H * Ks * Vs`` over the recurrent state ``[H, Ks, Vs]`` (``state_dims()``, after any
    feature map), ``6 * H * Ks * Vs`` for the delta rule families. A block may instead define
    ``sequence_flops(context) -> int`` itself. Feature-map arithmetic (Taylor, Hedgehog,
    Performer) and gates are elementwise or small and not counted.
    """
    own = getattr(block, "sequence_flops", None)
    if callable(own):
        return int(own(context))
    if hasattr(block, "cache_len"):  # KV-cache attention
        return 4 * block.cache_len(context) * block.num_heads * block.head_dim
    if hasattr(block, "state_dims"):  # recurrent state [B, H, Ks, Vs]
        ks, vs = block.state_dims()
        factor = 6 if "delta" in block.name else 4
        return factor * block.num_heads * ks * vs
    raise TypeError(f"block {block.name!r}: cannot count its sequence FLOPs (no cache_len, state_dims or sequence_flops)")
