"""Kernels whose launches fit the GPU's shared memory: fewer pipelining stages where it is smaller.

The launch tables (each module's ``LAUNCH``, ``skinny.CONFIGS``) hold settings timed on an H200,
whose SMs give one program up to 227 KB of shared memory; software pipelining keeps ``num_stages``
copies of a loop's tiles there (gla's state walk at 3 stages: 115 KB, ``linear_attn``'s
``_bwd_dqkv_kernel``: 188 KB). An A100 gives 163 KB, consumer GPUs about 99 KB: there Triton refuses
the launch (``OutOfResources``). ``jit`` is ``triton.jit`` whose kernels then retry with one stage
fewer, down to one, and remember per launch configuration the count that fit, so that later calls
launch it at once. Results do not change: stages only reorder when a loop's loads are issued.

A kernel that does not fit at one stage either may name *loop blocks* (``jit(loop_blocks=("BV",))``):
constexpr block sizes of a loop inside one program, which neither the grid nor the results depend on
but the float32 summation order. Those are halved next (down to ``MIN_LOOP_BLOCK``), each time from
the launch's stage count again; ``launch_attempts`` gives the order, which
``benchmarks/kernels_aot_regs.py --fit-shared`` follows without a GPU.

Triton's own autotuner skips configurations that do not fit, but it times every candidate on first
use; the tables here are fixed, measured choices, so only the fallback is needed.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
import triton
from triton.runtime.errors import OutOfResources
from triton.runtime.jit import JITFunction


# the smallest block a loop block is halved to: Triton's dots need 16 rows / columns
MIN_LOOP_BLOCK = 16


class KernelDoesNotFit(OutOfResources):
    """A kernel that needs more shared memory than the GPU gives even at one pipelining stage and its
    smallest loop blocks (e.g. a float32 kernel on a consumer GPU): names it, the need and the remedy in
    one line."""

    def __init__(self, kernel: str, required: int, limit: int, blocks: dict[str, int] | None = None):
        super().__init__(required, limit, "shared memory")
        self.kernel = kernel
        self.blocks = dict(blocks or {})  # the loop blocks of the last try, at their smallest

    def __reduce__(self):
        return (type(self), (self.kernel, self.required, self.limit, self.blocks))

    def shortfall(self) -> str:
        """What does not fit: the kernel, its need at its smallest settings and the GPU's limit."""
        at_blocks = "".join(f", {name} {block}" for name, block in self.blocks.items())
        return (f"{self.kernel} needs {self.required} B of shared memory per program even at one pipelining "
                f"stage{at_blocks} and this GPU gives {self.limit} B")

    def __str__(self) -> str:
        # the ops never show this: their kernels fall back to the PyTorch forms (``fallback``) with a
        # warning; a caller launching a kernel directly does
        return (f"blocks.kernels: {self.shortfall()}; train in bf16 (train.precision: bf16, float32 tiles are "
                f"twice the size) or run the ops' PyTorch forms (blocks.kernels.disabled())")


def launch_attempts(num_stages: int, loop_blocks: dict[str, int]) -> Iterator[dict]:
    """The launch settings a fitted kernel tries, in order, on a GPU short of shared memory: the stage
    count from ``num_stages`` down to one; then the first of ``loop_blocks`` ({name: block}) still above
    ``MIN_LOOP_BLOCK`` halved, and the stages from ``num_stages`` down again; until every loop block is at
    its smallest. The first item is the launch as asked."""
    blocks = dict(loop_blocks)
    while True:
        for stages in range(max(num_stages, 1), 0, -1):
            yield {"num_stages": stages, **blocks}
        larger = [name for name, block in blocks.items() if block > MIN_LOOP_BLOCK]
        if not larger:
            return
        blocks[larger[0]] //= 2


class StageFittedJITFunction(JITFunction):
    """A ``JITFunction`` whose launches step ``num_stages`` down, then halve its ``loop_blocks``, while
    the GPU lacks the shared memory they need (made by ``jit``; a launch without ``num_stages`` is not
    retried). ``fitted_launches``: per launch configuration as asked, the settings that fit;
    ``unfit_launches``: the configurations that fit at none (raised again at once)."""

    loop_blocks: tuple[str, ...] = ()

    def run(self, *args, grid, warmup, **kwargs):
        fitted = self.__dict__.setdefault("fitted_launches", {})
        unfit = self.__dict__.setdefault("unfit_launches", {})  # configuration -> KernelDoesNotFit's arguments
        key = _config_key(kwargs) if fitted or unfit else None
        if key in unfit:  # did not fit at any setting before: say so without trying them again
            raise KernelDoesNotFit(*unfit[key])
        if key in fitted:  # this configuration was cut before: launch it as it fit then
            kwargs.update(fitted[key])
        try:
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)
        except OutOfResources as exc:
            if not _short_of_shared_memory(exc) or not isinstance(kwargs.get("num_stages"), int):
                raise
            short = exc
        key = key if key is not None else _config_key(kwargs)
        loop_blocks = {n: kwargs[n] for n in self.loop_blocks if n in kwargs}
        attempts = launch_attempts(kwargs["num_stages"], loop_blocks)
        settings = next(attempts)  # the launch that was just refused
        for settings in attempts:
            try:
                launched = super().run(*args, grid=grid, warmup=warmup, **{**kwargs, **settings})
            except OutOfResources as exc:
                if not _short_of_shared_memory(exc):
                    raise
                short = exc
                continue
            fitted[key] = settings
            return launched
        unfit[key] = (self.fn.__name__, short.required, short.limit, {n: settings[n] for n in loop_blocks})
        raise KernelDoesNotFit(*unfit[key]) from None


def _short_of_shared_memory(exc: OutOfResources) -> bool:
    return exc.name == "shared memory" and not isinstance(exc, KernelDoesNotFit)


def _config_key(kwargs: dict) -> tuple:
    """A launch's configuration as it was asked for: the current CUDA device and every scalar
    keyword (the constexprs and the launch options; tensors and sizes go positionally)."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else -1
    return device, tuple(sorted((k, v) for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))))


def jit(fn=None, *, loop_blocks: tuple[str, ...] = (), **kwargs):
    """``triton.jit`` (its other arguments) whose kernel is a ``StageFittedJITFunction`` that may halve
    the constexprs named in ``loop_blocks`` (see the module's docstring); under Triton's interpreter,
    the interpreter's function unchanged (no shared memory to fit)."""

    def decorator(f):
        kernel = triton.jit(f, **kwargs)
        if type(kernel) is JITFunction:
            kernel.__class__ = StageFittedJITFunction
            kernel.loop_blocks = tuple(loop_blocks)
        return kernel

    return decorator if fn is None else decorator(fn)
