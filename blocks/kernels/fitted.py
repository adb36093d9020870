"""Kernels whose launches fit the GPU's shared memory: fewer pipelining stages where it is smaller.

The launch tables (each module's ``LAUNCH``, ``skinny.CONFIGS``) hold settings timed on an H200,
whose SMs give one program up to 227 KB of shared memory; software pipelining keeps ``num_stages``
copies of a loop's tiles there (gla's state walk at 3 stages: 115 KB, ``linear_attn``'s
``_bwd_dqkv_kernel``: 188 KB). An A100 gives 163 KB, consumer GPUs about 99 KB: there Triton refuses
the launch (``OutOfResources``). ``jit`` is ``triton.jit`` whose kernels then retry with one stage
fewer, down to one, and remember per launch configuration the count that fit, so that later calls
launch it at once. Results do not change: stages only reorder when a loop's loads are issued.

Triton's own autotuner skips configurations that do not fit, but it times every candidate on first
use; the tables here are fixed, measured choices, so only the fallback is needed.
"""
from __future__ import annotations

import torch
import triton
from triton.runtime.errors import OutOfResources
from triton.runtime.jit import JITFunction


class KernelDoesNotFit(OutOfResources):
    """A kernel that needs more shared memory than the GPU gives even at one pipelining stage
    (e.g. ``_bwd_dqkv_kernel`` in float32, 180 KB, on an A100 or a consumer GPU): names it, the
    need and the remedy in one line."""

    def __init__(self, kernel: str, required: int, limit: int):
        super().__init__(required, limit, "shared memory")
        self.kernel = kernel

    def __reduce__(self):
        return (type(self), (self.kernel, self.required, self.limit))

    def __str__(self) -> str:
        return (f"blocks.kernels: {self.kernel} needs {self.required} B of shared memory per program even at one "
                f"pipelining stage and this GPU gives {self.limit} B; train in bf16 (train.precision: bf16, float32 "
                f"tiles are twice the size) or run the ops' PyTorch forms (blocks.kernels.disabled())")


class StageFittedJITFunction(JITFunction):
    """A ``JITFunction`` whose launches step ``num_stages`` down while the GPU lacks the shared
    memory they need (made by ``jit``; a launch without ``num_stages`` is not retried)."""

    def run(self, *args, grid, warmup, **kwargs):
        fitted = self.__dict__.setdefault("fitted_stages", {})
        key = None
        if fitted:  # some configuration was cut before: launch this one as it fit then
            key = _config_key(kwargs)
            kwargs["num_stages"] = fitted.get(key, kwargs.get("num_stages"))
        while True:
            try:
                return super().run(*args, grid=grid, warmup=warmup, **kwargs)
            except OutOfResources as exc:
                stages = kwargs.get("num_stages")
                if exc.name != "shared memory" or not isinstance(stages, int) or isinstance(exc, KernelDoesNotFit):
                    raise
                if stages <= 1:
                    raise KernelDoesNotFit(self.fn.__name__, exc.required, exc.limit) from None
                key = key if key is not None else _config_key(kwargs)
                kwargs["num_stages"] = fitted[key] = stages - 1


def _config_key(kwargs: dict) -> tuple:
    """A launch's configuration as it was asked for: the current CUDA device and every scalar
    keyword (the constexprs and the launch options; tensors and sizes go positionally)."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return device, tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))))


def jit(fn=None, **kwargs):
    """``triton.jit`` (same arguments) whose kernel is a ``StageFittedJITFunction``; under Triton's
    interpreter, the interpreter's function unchanged (no shared memory to fit)."""

    def decorator(f):
        kernel = triton.jit(f, **kwargs)
        if type(kernel) is JITFunction:
            kernel.__class__ = StageFittedJITFunction
        return kernel

    return decorator if fn is None else decorator(fn)
