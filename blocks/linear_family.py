"""What every linear-state family shares: the config fields, the projections, short convs, output
norm and gate, the choice of op form, and the decode-state layout.

A family subclass says which ``blocks.ops`` module runs the recurrence and turns the projected
``q, k, v`` into that op's inputs (feature maps, L2 norm, decays, beta) in ``mix_inputs``.

Data flow for ``x: [B, T, d_model]``::

    q|k|v: [B, T, H*(2*Kin + V)], gate: [B, T, H*V], side projections (a family's decay and beta
        inputs) = one matmul of x (``InputProjection``)
    (conv_size > 0) through a causal depthwise conv + SiLU, its cache in the state
    split into q, k: [B, T, H*Kin] and v: [B, T, H*V]
    q, k: [B, T, H, Kin], v: [B, T, H, V]   -> mix_inputs -> op(q, k, v, *gates) -> o: [B, T, H, Vs]
    mix_outputs(o) -> [B, T, H, V] -> (output_norm) RMSNorm per head -> [B, T, H*V]
    (output_gate) * silu(gate) -> W_o -> y: [B, T, d_model]

State (dict): ``S: [B, H, Ks, Vs]`` float32 (Ks, Vs: the state dims after the feature map and
any denominator column), and with ``conv_size = W > 0``: ``conv: [B, W-1, H*(2*Kin + V)]`` (the
last W-1 projected q|k|v rows) in the activation dtype. Its bytes do not depend on the context.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any, ClassVar

import torch
from torch import nn

from .base import Block, BlockConfig, State, check
from .common import HeadNorm, InputProjection, OutputGate, ShortConv, dtype_bytes
from .ops.utils import cuda_kernel


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_positive_int(value: Any, field: str, optional: bool = False) -> None:
    if optional and value is None:
        return
    check(is_int(value) and value >= 1, field, value, "be a positive integer" + (" or null" if optional else ""))


def check_bool(value: Any, field: str) -> None:
    check(isinstance(value, bool), field, value, "be true or false")


def check_choice(value: Any, field: str, choices: tuple[str, ...]) -> None:
    check(value in choices, field, value, "be one of " + "|".join(choices))


def default_heads(num_heads: int | None, d_model: int) -> int:
    """``num_heads``, or ``max(1, d_model // 64)`` when unset (every family's default)."""
    return num_heads if num_heads is not None else max(1, d_model // 64)


def check_num_heads(num_heads: Any, d_model: int, head_dims_set: bool, unless: str) -> int:
    """Validate ``num_heads`` (positive or null); unless the head dims are set explicitly, the
    heads (given or derived) must divide ``d_model``. Returns H."""
    check_positive_int(num_heads, "num_heads", optional=True)
    H = default_heads(num_heads, d_model)
    if not head_dims_set:
        derived = "" if num_heads is not None else f" (derived: max(1, d_model // 64) = {H})"
        check(d_model % H == 0, "num_heads", num_heads, f"divide d_model={d_model}{derived} unless {unless}")
    return H


@dataclasses.dataclass(frozen=True)
class LinearConfig(BlockConfig):
    """Fields shared by every linear family (``None`` = derived from ``d_model``).

    num_heads   H (default ``max(1, d_model // 64)``)
    head_dim_k  query/key dim per head before any feature map (default ``d_model // H``)
    head_dim_v  value dim per head before ``expand_v`` (default ``d_model // H``)
    expand_v    state expansion: the value dim per head is ``head_dim_v * expand_v`` (an integer)
    conv_size   short causal depthwise conv on q, k, v: 0 = off, else 2..4
    output_gate multiply by ``silu(W_g x)`` before the output projection
    output_norm RMSNorm per head on the op's output
    chunk_size  chunk length of the op's chunked form
    mode        "chunk" (chunk for T > 1, step for a T == 1 continuation) or "recurrent"
                (the op's reference loop everywhere; for tests)
    """

    num_heads: int | None = None
    head_dim_k: int | None = None
    head_dim_v: int | None = None
    expand_v: float = 1
    conv_size: int = 0
    output_gate: bool = True
    output_norm: bool = True
    chunk_size: int = 64
    mode: str = "chunk"

    def validate(self, d_model: int) -> None:
        H = check_num_heads(self.num_heads, d_model, self.head_dim_k is not None and self.head_dim_v is not None,
                            "head_dim_k and head_dim_v are both set")
        check_positive_int(self.head_dim_k, "head_dim_k", optional=True)
        check_positive_int(self.head_dim_v, "head_dim_v", optional=True)
        check(is_number(self.expand_v) and self.expand_v > 0, "expand_v", self.expand_v, "be a positive number")
        vdim = (self.head_dim_v or d_model // H) * self.expand_v
        check(float(vdim).is_integer(), "expand_v", self.expand_v,
              f"make head_dim_v * expand_v an integer (head_dim_v={self.head_dim_v or d_model // H})")
        check(is_int(self.conv_size) and (self.conv_size == 0 or 2 <= self.conv_size <= 4),
              "conv_size", self.conv_size, "be 0 (off) or 2..4")
        check_bool(self.output_gate, "output_gate")
        self.validate_output_norm()
        check_positive_int(self.chunk_size, "chunk_size")
        check_choice(self.mode, "mode", ("chunk", "recurrent"))

    def validate_output_norm(self) -> None:
        check_bool(self.output_norm, "output_norm")

    def heads(self, d_model: int) -> int:
        return default_heads(self.num_heads, d_model)

    def dims(self, d_model: int) -> tuple[int, int, int]:
        """``(H, Kin, V)``: heads, query/key dim per head, value dim per head (after expand_v)."""
        H = self.heads(d_model)
        K = self.head_dim_k if self.head_dim_k is not None else d_model // H
        V = int((self.head_dim_v if self.head_dim_v is not None else d_model // H) * self.expand_v)
        return H, K, V

    def resolved(self, d_model: int) -> dict[str, Any]:
        """``num_heads``, ``head_dim_k``, ``head_dim_v`` as ``dims`` derives them; ``expand_v``
        is folded into ``head_dim_v`` (the block only uses ``head_dim_v * expand_v``, as V) and
        resolves to 1, so ``{head_dim_v: 8, expand_v: 2}`` and ``{head_dim_v: 16}`` agree."""
        H, K, V = self.dims(d_model)
        return {**super().resolved(d_model), "num_heads": H, "head_dim_k": K, "head_dim_v": V, "expand_v": 1}


class LinearBlock(Block):
    """Base of the linear-state families (see the module docstring for the data flow and state).

    Subclasses set ``Config``, ``letter`` and ``op`` (the ``blocks.ops`` module), and override
    ``mix_inputs`` (and ``mix_outputs``/``state_dims`` when the state is not ``[H, Kin, V]``).
    """

    op: ClassVar[ModuleType]  # the blocks.ops module (a module, not a name: no import in forward,
                              # which torch.compile would have to break its graph for)
    gate_act: ClassVar[str] = "silu"

    def __init__(self, d_model: int, **config) -> None:
        super().__init__(d_model, **config)
        c = self.config
        H, Kin, V = c.dims(d_model)
        self.num_heads, self.head_dim_k, self.head_dim_v = H, Kin, V
        # q, k, v, the output gate and the family's side inputs from one matmul, q|k|v through one
        # conv: fewer kernels and weight reads per (decode) step than one each.
        self.qkv_sizes = (H * Kin, H * Kin, H * V)
        widths = {"qkv": sum(self.qkv_sizes)}
        if c.output_gate:
            widths["gate"] = H * V
        self.in_proj = InputProjection(d_model, {**widths, **self.side_projections()})
        self.conv = ShortConv(sum(self.qkv_sizes), c.conv_size) if c.conv_size else None
        self.norm = HeadNorm(V) if self.use_output_norm else None
        self.gate = OutputGate(self.gate_act) if c.output_gate else None
        self.o_proj = nn.Linear(H * V, d_model, bias=False)

    # ----- what a family customises -------------------------------------------------------
    @property
    def use_output_norm(self) -> bool:
        return bool(self.config.output_norm)

    def state_dims(self) -> tuple[int, int]:
        """``(Ks, Vs)`` of the recurrent state ``[B, H, Ks, Vs]``."""
        return self.head_dim_k, self.head_dim_v

    def side_projections(self) -> dict[str, int]:
        """Extra projections of ``x`` the family needs (name -> width), computed in the same matmul
        as q|k|v and handed to ``mix_inputs`` as ``side[name]: [B, T, width]``. Called in
        ``__init__`` after ``num_heads``/``head_dim_k``/``head_dim_v`` are set."""
        return {}

    def mix_inputs(self, x, side, q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple, float | None]:
        """``(q, k, v, gates, scale)`` for the op from ``x: [B, T, d_model]``, the side projections
        ``side: {name: [B, T, width]}`` and the projected ``q, k: [B, T, H, Kin]``,
        ``v: [B, T, H, V]``; ``gates`` are the op's extra per-step arguments (``g``, ``gk``,
        ``beta``), each with the T dim at position 1."""
        raise NotImplementedError

    def mix_outputs(self, o: torch.Tensor) -> torch.Tensor:
        """The op's ``o: [B, T, H, Vs]`` -> ``[B, T, H, V]``."""
        return o

    def fused_decode(self, x: torch.Tensor, proj: dict[str, torch.Tensor], state: State):
        """One decode step (``x: [B, 1, d_model]`` continuing ``state``) between the projections as
        one kernel on CUDA (``blocks.kernels.decode_mixer``, for the families it says it serves and
        while it is switched on): ``(o: [B, 1, H*V]`` for ``o_proj``, ``new_state)``, or None to
        take the block's own path."""
        # its inputs: the projection and the block's own parameters (conv, gates, norm)
        step = cuda_kernel("mixer", "decode", proj["qkv"], *self.parameters())
        if step is None or not step.applies(self, x):
            return None
        return step(self, proj, state)

    # ----- the shared machinery -----------------------------------------------------------
    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The raw projections ``W_q x, W_k x: [B, T, H*Kin]``, ``W_v x: [B, T, H*V]`` (no conv), for
        tests and inspection: it runs the whole input matmul and keeps its q|k|v columns."""
        return self.in_proj(x)["qkv"].split(self.qkv_sizes, dim=-1)


    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """``x: [B, T, d_model]`` (any T >= 1), ``state`` from a previous call or None
        -> ``(y: [B, T, d_model], new_state)``. The input state is not modified."""
        B, T, _ = x.shape
        H = self.num_heads
        new_state: State = {}
        proj = self.in_proj(x)
        if T == 1 and state is not None:
            fused = self.fused_decode(x, proj, state)
            if fused is not None:
                o, new_state = fused
                return self.o_proj(o), new_state
        qkv = proj["qkv"]  # [B, T, H*(2*Kin + V)]
        if self.conv is not None:
            qkv, new_state["conv"] = self.conv(qkv, None if state is None else state["conv"])
        q, k, v = qkv.split(self.qkv_sizes, dim=-1)  # [B, T, H*Kin], [B, T, H*Kin], [B, T, H*V]
        q, k = q.view(B, T, H, self.head_dim_k), k.view(B, T, H, self.head_dim_k)
        v = v.view(B, T, H, self.head_dim_v)
        q, k, v, gates, scale = self.mix_inputs(x, proj, q, k, v)
        o, new_state["S"] = self.run_op(q, k, v, gates, scale, None if state is None else state["S"])
        o = self.mix_outputs(o)  # [B, T, H, V]
        if self.norm is not None:
            o = self.norm(o)
        o = o.reshape(B, T, H * self.head_dim_v)
        if self.gate is not None:
            o = self.gate(o, proj["gate"])
        return self.o_proj(o), new_state

    def run_op(self, q, k, v, gates, scale, S0):
        """Reference loop (mode "recurrent"), one decode step (T == 1 continuing a state) or the
        chunked form -> ``(o: [B, T, H, Vs], S: [B, H, Ks, Vs] float32)``."""
        ops = self.op
        if self.config.mode == "recurrent":
            return ops.recurrent(q, k, v, *gates, scale=scale, initial_state=S0, output_final_state=True)
        if q.shape[1] == 1 and S0 is not None:
            o, S = ops.step(q[:, 0], k[:, 0], v[:, 0], *(g[:, 0] for g in gates), state=S0, scale=scale)
            return o[:, None], S
        return ops.chunk(q, k, v, *gates, scale=scale, initial_state=S0, output_final_state=True,
                         chunk_size=self.config.chunk_size)

    def state_bytes(self, batch: int, context: int, dtype: torch.dtype = torch.float32) -> int:
        """``B*H*Ks*Vs*4`` (float32 state) ``+ B*(W-1)*H*(2*Kin + V)*bytes(dtype)`` with a conv
        of size W; independent of ``context``."""
        Ks, Vs = self.state_dims()
        n = batch * self.num_heads * Ks * Vs * 4
        if self.conv is not None:
            n += self.conv.cache_bytes(batch, dtype)
        return n

    # ----- contract-suite declarations -----------------------------------------------------
    @classmethod
    def example_configs(cls) -> dict[str, dict[str, Any]]:
        """Representative configs the contract suite runs (at d_model=32)."""
        return {
            "default": {},
            "conv_gate_norm": {"num_heads": 2, "conv_size": 4, "output_gate": True, "output_norm": True},
            "plain_kv": {"num_heads": 2, "head_dim_k": 8, "head_dim_v": 12, "expand_v": 2, "conv_size": 0,
                         "output_gate": False, "output_norm": False},
        }

    @classmethod
    def bad_configs(cls) -> list[tuple[dict[str, Any], str]]:
        """``(config, field the ConfigError must name)`` pairs, at d_model=32."""
        return [
            ({"num_heads": 0}, "num_heads"),
            ({"num_heads": 3}, "num_heads"),
            ({"conv_size": 5}, "conv_size"),
            ({"conv_size": 1}, "conv_size"),
            ({"head_dim_k": -1}, "head_dim_k"),
            ({"expand_v": 0.3}, "expand_v"),
            ({"mode": "fast"}, "mode"),
            ({"output_gate": "yes"}, "output_gate"),
            ({"chunk_size": 0}, "chunk_size"),
        ]
