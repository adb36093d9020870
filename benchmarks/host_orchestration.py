"""The host's own share of a training step's launch time: one fwd + bwd of a family's registered
chunk kernel with every Triton kernel of its module replaced by a no-op, on CPU tensors. What is
left is the Python around the launches (argument checks, allocations, launch settings, autograd).

    python benchmarks/host_orchestration.py [--families delta_rule,gated_delta_rule] [--T 2048]

Also prints the time from the op's call to its first launch (``first_launch_us``): our Python's
share of the GPU's idle time at the start of a step from an idle GPU (``step_gaps.py``).

Set against ``benchmarks/train_ab.py``'s "host ms" (the same step launched for real on the GPU
host, the GPU held busy), the difference is the Triton launches' own cost. Needs triton importable
(the kernel modules), no GPU. CPU allocations are not CUDA's caching allocator: a rough figure.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import HEAD_DIM, HEADS, checked_families, fwd_bwd, positional, train_inputs  # noqa: E402


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing but append the time of the
    call to ``stamps`` (when given)."""

    def __init__(self, stamps: list | None = None):
        self.stamps = stamps

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.stamps is not None:
                self.stamps.append(time.perf_counter())
        return launch


@contextlib.contextmanager
def stubbed(family: str, T: int, segments: int = 1, stamps: list | None = None):
    """``(chunk, pos)``: the family's registered chunk kernel and its positional inputs for one
    sequence of ``T`` tokens (16 heads of 128, CPU), every Triton kernel of its module a
    ``_NoLaunch`` and the delta rules' ``WALK_SEGMENTS`` at ``segments`` inside the block; all as
    before after it. One sequence: the Python around the launches does not depend on the batch,
    while the few PyTorch ops in it (a cumsum, a zero fill) would run on CPU at a real batch's size.
    (Off the GPU the walks are cut whenever ``segments`` is above 1; on the H200 only at 16k and 32k.)"""
    from blocks.kernels import kernel_module

    mod = kernel_module(family)
    names = [n for n in vars(mod) if n.startswith("_") and n.endswith("_kernel")]
    if hasattr(mod, "WALK_SEGMENTS"):
        names.append("WALK_SEGMENTS")
    saved = {n: getattr(mod, n) for n in names}
    try:
        for n in names:
            setattr(mod, n, segments if n == "WALK_SEGMENTS" else _NoLaunch(stamps))
        args = train_inputs(family, 1, T, HEADS, HEAD_DIM, device="cpu")
        yield getattr(mod, f"{family}_chunk"), positional(family, args)  # get_kernel needs CUDA
    finally:
        for n, k in saved.items():
            setattr(mod, n, k)


def host_ms(family: str, T: int, reps: int = 20, segments: int = 1) -> float:
    """Median host milliseconds of one fwd + bwd (``stubbed``)."""
    with stubbed(family, T, segments) as (chunk, pos):
        step = fwd_bwd(lambda: chunk(*pos)[0], pos)  # its output gradient made once, in the warm-up
        for _ in range(3):
            step()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def first_launch_us(family: str, T: int, reps: int = 200, segments: int = 1) -> float:
    """Median host microseconds from calling the chunk op (``stubbed``) to its first kernel launch:
    the part of the GPU's idle time at the start of a step from an idle GPU that is our Python
    (``benchmarks/step_gaps.py`` measures the whole of it on the GPU host)."""
    stamps: list = []
    with stubbed(family, T, segments, stamps) as (chunk, pos):
        for _ in range(3):
            chunk(*pos)
        times = []
        for _ in range(reps):
            stamps.clear()
            t0 = time.perf_counter()
            chunk(*pos)
            times.append((stamps[0] - t0) * 1e6)
        return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="delta_rule,gated_delta_rule")
    ap.add_argument("--T", type=int, default=2048, help="sequence length (one sequence of 16 heads of 128)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--segments", type=int, default=1, help="the delta rules' WALK_SEGMENTS (default 1)")
    ap.add_argument("--json", default="", help="write the figures here too")
    a = ap.parse_args(argv)
    families = checked_families(ap, a.families)
    if a.T < 1 or a.reps < 1 or a.segments < 1:
        ap.error("--T, --reps and --segments: must be at least 1")
    out = {f: host_ms(f, a.T, a.reps, a.segments) for f in families}
    first = {f: first_launch_us(f, a.T, 10 * a.reps, a.segments) for f in families}
    for f, ms in out.items():
        print(f"{f:18s} T={a.T}: {ms:.3f} ms host per fwd+bwd, the first launch {first[f]:.1f} us after the call; "
              "kernels stubbed")
    if a.json:
        Path(a.json).write_text(json.dumps({"T": a.T, "segments": a.segments, "host_ms": out,
                                            "first_launch_us": first}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
