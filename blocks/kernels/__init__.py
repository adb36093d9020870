"""Fast GPU kernels behind the ops in ``blocks.ops``.

``get_kernel(family, form)`` returns a callable with the same signature and results as
``blocks.ops.<family>.<form>`` or ``None`` when no kernel applies (no CUDA, no Triton, or a family
without a kernel yet). The ops call it first on CUDA inputs and fall back to their PyTorch forms.
"""
from __future__ import annotations

from typing import Callable

_KERNELS: dict[tuple[str, str], Callable] = {}


def register_kernel(family: str, form: str):
    """Decorator: ``@register_kernel("gla", "chunk")``."""

    def deco(fn: Callable) -> Callable:
        _KERNELS[(family, form)] = fn
        return fn

    return deco


def get_kernel(family: str, form: str) -> Callable | None:
    """The kernel for ``blocks.ops.<family>.<form>`` on CUDA, or None."""
    _load()
    return _KERNELS.get((family, form))


_loaded = False


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    try:
        import torch
        import triton  # noqa: F401
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    # Importing the kernel modules registers them (added as kernels are written).
