"""The Block contract every token mixer follows, and the config validation they share.

A block maps ``x: [B, T, d_model]`` to ``y: [B, T, d_model]`` and carries a decode state:

    y, state = block(x)                  # one pass, fresh state
    y2, state = block(x2, state)         # continue: same result as block(cat(x, x2))

``state`` is a ``dict[str, torch.Tensor]`` (recurrent state ``[B, H, K, V]`` in float32, conv
caches, KV caches, position counters). ``state_bytes(batch, context, dtype)`` returns exactly the
bytes of those tensors after ``context`` tokens were processed with activations in ``dtype``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

State = dict[str, torch.Tensor]


class ConfigError(ValueError):
    """A block (or spec) config field has a bad value; the message names the field and value."""


def check(cond: bool, field: str, value: Any, must: str) -> None:
    """Raise ``ConfigError('<field>: must <must>, got <value>')`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{field}: must {must}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """Base for per-family config dataclasses. Subclasses add fields and override ``validate``.

    ``from_kwargs`` rejects unknown fields by name so a typo in a search space is caught.
    """

    def validate(self, d_model: int) -> None:  # pragma: no cover - overridden
        pass

    @classmethod
    def from_kwargs(cls, prefix: str = "", **kwargs) -> "BlockConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        for key in kwargs:
            if key not in known:
                raise ConfigError(
                    f"{prefix}{key}: unknown field for {cls.__name__}; known fields: {', '.join(sorted(known))}"
                )
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved(self, d_model: int) -> dict[str, Any]:
        """``to_dict()`` with every field that is derived when unset (``None`` = from ``d_model``)
        replaced by the value the block built at ``d_model`` uses, so two configs that build the
        same network resolve to the same dict (the spec hash is taken of this). Building from the
        result gives the same parameters, state and outputs; resolving it again changes nothing.
        Meant for a config that validates at ``d_model``. No derived fields here; configs that
        have some override this."""
        return self.to_dict()


class Block(nn.Module):
    """Base class of every registered token mixer.

    Subclasses set ``Config`` (a ``BlockConfig`` dataclass) and ``letter`` (one character used in
    compact stack strings such as ``LLGS``), and implement ``forward`` and ``state_bytes``.
    """

    name: ClassVar[str] = ""
    letter: ClassVar[str] = "?"
    Config: ClassVar[type[BlockConfig]] = BlockConfig

    def __init__(self, d_model: int, **config) -> None:
        super().__init__()
        check(isinstance(d_model, int) and d_model >= 1, "d_model", d_model, "be a positive integer")
        self.d_model = d_model
        self.config = self.Config.from_kwargs(**config)
        self.config.validate(d_model)

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """``x: [B, T, d_model]`` -> ``(y: [B, T, d_model], state)``; any T >= 1."""
        raise NotImplementedError

    def state_bytes(self, batch: int, context: int, dtype: torch.dtype = torch.float32) -> int:
        """Exact bytes of the decode state after ``context`` tokens at ``batch`` (activations in ``dtype``)."""
        raise NotImplementedError

    def num_params(self) -> int:
        """Number of trainable parameters (full sizes also under DeepSpeed ZeRO-3, which leaves
        each rank's ``p.numel()`` at 0 and keeps the real count in ``p.ds_numel``)."""
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.parameters() if p.requires_grad)

    @staticmethod
    def held_state_bytes(state: Mapping[str, torch.Tensor]) -> int:
        """Bytes of the tensors actually held in ``state`` (what ``state_bytes`` must equal)."""
        return sum(t.numel() * t.element_size() for t in state.values())

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, " + ", ".join(f"{k}={v}" for k, v in self.config.to_dict().items())
