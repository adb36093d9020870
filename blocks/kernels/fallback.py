"""When a kernel does not fit the GPU at all: the op's PyTorch form instead, with one warning.

``fitted`` steps a launch's pipelining stages and loop blocks down until it fits the GPU's shared
memory; one known case never fits (linear_attn / simple_gla's float32 backward on a GPU with ~99 KB
per program: 104 KB at its smallest), and a GPU smaller than any the launch tables were checked for
may add others. There the op runs as it runs without a GPU, its PyTorch form on the same device
(same results, slower), and says so once per kernel, rather than stopping a training run that bf16
or a larger GPU would have run.

Two places catch ``KernelDoesNotFit``: a chunk kernel's entry point (``falls_back_to``: the whole
call in the PyTorch form), and each autograd ``Function``'s backward (``reference_gradients``: the
forward ran in the kernels, the gradients come from the PyTorch form recomputed on the saved inputs).
"""
from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Sequence

import torch

from .fitted import KernelDoesNotFit


class KernelFallbackWarning(UserWarning):
    """A kernel did not fit this GPU and an op ran its PyTorch form instead."""


def warn_fallback(exc: KernelDoesNotFit, family: str, part: str) -> None:
    """One warning per kernel, family and part (Python's warning registry drops repeats of a message)."""
    warnings.warn(f"blocks.kernels: {exc.shortfall()}; {family}'s {part} runs in its PyTorch form instead "
                  f"(same results, slower; in bf16, train.precision: bf16, the kernels fit)",
                  KernelFallbackWarning, stacklevel=3)


def falls_back_to(family: str, form: str = "chunk"):
    """Decorator for the kernel registered as ``blocks.ops.<family>.<form>``: a call whose kernels do not
    fit the GPU runs that op's PyTorch form (under ``blocks.kernels.disabled()``) with the same arguments."""

    def decorator(kernel: Callable) -> Callable:
        @functools.wraps(kernel)
        def run(*args, **kwargs):
            try:
                return kernel(*args, **kwargs)
            except KernelDoesNotFit as exc:
                warn_fallback(exc, family, "forward")
            from . import disabled

            with disabled():
                return getattr(importlib.import_module(f"blocks.ops.{family}"), form)(*args, **kwargs)

        return run

    return decorator


def reference_gradients(
    exc: KernelDoesNotFit,
    family: str,
    reference: Callable[..., tuple[torch.Tensor, torch.Tensor | None]],
    inputs: Sequence[torch.Tensor | None],
    needs_grad: Sequence[bool],
    do: torch.Tensor,
    dht: torch.Tensor | None,
) -> list[torch.Tensor | None]:
    """The gradients of ``reference(*inputs) -> (o, final_state)`` (a PyTorch form, the function the
    kernels' forward computed) for the ``inputs`` flagged in ``needs_grad``, given the output's gradient
    ``do`` (``[B, T, H, V]``) and the final state's ``dht`` (``[B, H, K, V]`` or None): for a ``Function``'s
    backward whose kernels raised ``exc``. One entry per input, None where not asked or not a tensor."""
    warn_fallback(exc, family, "backward")
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) if isinstance(t, torch.Tensor) else t
                  for t, need in zip(inputs, needs_grad)]
        o, ht = reference(*leaves)
        outputs, grads = [o], [do]
        if dht is not None and ht is not None:
            outputs.append(ht)
            grads.append(dht)
        wrt = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        found = iter(torch.autograd.grad(outputs, wrt, grads, allow_unused=True))
    return [next(found) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in leaves]
