"""The block registry: token mixers keyed by name, filled by the ``@register`` decorator.

Every search space, every spec and the contract test suite read the list of blocks from here,
so registering a block is all it takes to make it searchable and tested.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from .base import Block

_REGISTRY: dict[str, type["Block"]] = {}
B = TypeVar("B", bound=type)


class UnknownBlockError(KeyError):
    """Raised for a block name that is not registered; the message lists the registered ones."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain.
        return str(self.args[0])


def register(name: str) -> Callable[[B], B]:
    """Class decorator: ``@register("gla")`` makes the class buildable as ``build("gla", ...)``."""

    def deco(cls: B) -> B:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"block name {name!r} is already registered by {_REGISTRY[name].__name__}")
        cls.name = name  # type: ignore[attr-defined]
        _REGISTRY[name] = cls  # type: ignore[assignment]
        return cls

    return deco


def names() -> list[str]:
    """Registered block names, sorted."""
    _load_builtin_families()
    return sorted(_REGISTRY)


def get(name: str) -> type["Block"]:
    """The block class registered under ``name``; unknown names list the registered ones."""
    _load_builtin_families()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownBlockError(
            f"unknown block {name!r}; registered blocks: {', '.join(sorted(_REGISTRY))}"
        ) from None


def build(name: str, d_model: int, **config) -> "Block":
    """Construct block ``name`` for residual width ``d_model`` with its config fields."""
    return get(name)(d_model=d_model, **config)


def _load_builtin_families() -> None:
    # Importing the family modules runs their @register decorators.
    from . import families  # noqa: F401
