"""Fast GPU kernels behind the ops in ``blocks.ops``.

``get_kernel(family, form)`` returns a callable with the same signature and results as
``blocks.ops.<family>.<form>`` or ``None`` when no kernel applies (no CUDA, no Triton, or a family
without a kernel yet). The ops call it first on CUDA inputs and fall back to their PyTorch forms.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

_KERNELS: dict[tuple[str, str], Callable] = {}
_local = threading.local()


def register_kernel(family: str, form: str):
    """Decorator: ``@register_kernel("gla", "chunk")``."""

    def deco(fn: Callable) -> Callable:
        _KERNELS[(family, form)] = fn
        return fn

    return deco


def get_kernel(family: str, form: str) -> Callable | None:
    """The kernel for ``blocks.ops.<family>.<form>`` on CUDA, or None (also inside ``disabled()``)."""
    if getattr(_local, "disabled", False):
        return None
    _load()
    return _KERNELS.get((family, form))


def has_kernel(family: str, form: str) -> bool:
    """Whether a kernel is registered for ``family``/``form`` on this machine."""
    _load()
    return (family, form) in _KERNELS


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the ops' PyTorch forms even on CUDA (benchmarks' eager baseline, A/B checks)."""
    prev = getattr(_local, "disabled", False)
    _local.disabled = True
    try:
        yield
    finally:
        _local.disabled = prev


def triton_version() -> tuple[int, int]:
    """The installed Triton's (major, minor): ``"3.6.0"`` -> ``(3, 6)``, ``"3.5.1+git..."`` -> ``(3, 5)``."""
    import triton

    parts = (triton.__version__.split("+")[0].split(".") + ["0"])[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


_loaded = False
# The oldest Triton every kernel compiles with (sm_90, both dtypes: tests/blocks/test_kernels_host_triton.py
# with .triton-min/, make test-kernels; 3.4.0, 3.5.1 and the GPU host's 3.6 too, the interpreter tests 3.9).
# Torch 2.7 ships 3.3; torch 2.5 / 2.6 ship 3.1 / 3.2, which the AOT tool cannot drive (ASTSource's arguments
# differ), so the kernels are not offered there.
MIN_TRITON = (3, 3)

# The module holding each family's chunk kernels, and through it their LAUNCH table and SWITCHES.
KERNEL_MODULES = {"linear_attn": "scalar_decay", "simple_gla": "scalar_decay", "gla": "gla",
                  "delta_rule": "delta", "gated_delta_rule": "delta"}


def kernel_module(family: str):
    """``blocks.kernels.<module>`` of ``family``'s chunk kernels (imports Triton)."""
    import importlib

    return importlib.import_module(f"{__name__}.{KERNEL_MODULES[family]}")


def other_switch_values(mod, only: str | None = None) -> dict:
    """``{NAME: the value it does not have now}`` for each of ``mod.SWITCHES`` (or ``only`` that
    one): the alternatives the launch sweep times and the tests flip."""
    return {name: next(v for v in values if v != getattr(mod, name))
            for name, values in mod.SWITCHES.items() if only is None or name == only}

LOW_MEMORY_ENV = "ARCHSEARCH_LOW_MEMORY_KERNELS"


def low_memory_from_env() -> bool:
    """``ARCHSEARCH_LOW_MEMORY_KERNELS``: ``1`` makes the kernels recompute in the backward what
    they would otherwise keep from the forward; unset, empty or ``0``: keep it (faster)."""
    import os

    from blocks.base import ConfigError

    value = os.environ.get(LOW_MEMORY_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{LOW_MEMORY_ENV}: must be 0 or 1 (or unset), got {value!r}")
    return value == "1"


@contextlib.contextmanager
def inplace_decode_state() -> Iterator[None]:
    """Inside this context the ``step`` kernels write the new recurrent state into the float32
    ``state`` tensor they were given (and return that tensor) instead of a fresh one.

    ``archsearch.decode_graph`` captures the decode step this way: the state buffers stay at fixed
    addresses, so replaying the graph needs no copy of the states (a copy would double the state
    traffic, which is a third of a decode step's bytes). Outside the context the ops stay functional.
    """
    prev = getattr(_local, "inplace", False)
    _local.inplace = True
    try:
        yield
    finally:
        _local.inplace = prev


def inplace_enabled() -> bool:
    """True inside ``inplace_decode_state()`` (on this thread)."""
    return getattr(_local, "inplace", False)


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
    # Importing the kernel modules registers them. A Triton too old or too new for them must not
    # break the ops: they keep their PyTorch forms, and the warning says why.
    import warnings

    if triton_version() < MIN_TRITON:
        warnings.warn(f"blocks.kernels: Triton {triton.__version__} is older than "
                      f"{'.'.join(map(str, MIN_TRITON))}, the oldest the kernels are compiled with (make "
                      f"test-kernels); the ops run their PyTorch forms", RuntimeWarning, stacklevel=2)
        return
    try:
        from . import decode_attention, decode_mixer, delta, gla, rope_cache, scalar_decay, skinny, step  # noqa: F401
    except (ImportError, AttributeError, TypeError) as exc:  # pragma: no cover - depends on the install
        warnings.warn(f"blocks.kernels: Triton kernels unavailable ({type(exc).__name__}: {exc}); "
                      "the ops run their PyTorch forms", RuntimeWarning, stacklevel=2)
        _KERNELS.clear()
        return
