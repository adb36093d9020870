"""The host's own share of a training step's launch time: one fwd + bwd of a family's registered
chunk kernel with every Triton kernel of its module replaced by a no-op, on CPU tensors. What is
left is the Python around the launches (argument checks, allocations, launch settings, autograd).

    python benchmarks/host_orchestration.py [--families delta_rule,gated_delta_rule] [--T 2048]

Set against ``benchmarks/train_ab.py``'s "host ms" (the same step launched for real on the GPU
host, the GPU held busy), the difference is the Triton launches' own cost. Needs triton importable
(the kernel modules), no GPU. CPU allocations are not CUDA's caching allocator: a rough figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import HEAD_DIM, HEADS, fwd_bwd, linear_families, positional, train_inputs  # noqa: E402


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def host_ms(family: str, T: int, reps: int = 20, segments: int = 1) -> float:
    """Median host milliseconds of one fwd + bwd of one sequence of ``T`` tokens with the module's
    kernels stubbed out. One sequence: the Python around the launches does not depend on the batch,
    while the few PyTorch ops in it (a cumsum, a zero fill) would run on CPU at a real batch's size.
    ``segments``: the delta rules' ``WALK_SEGMENTS`` (off the GPU the walks are cut whenever it is
    above 1; on the H200 only at 16k and 32k)."""
    from blocks.kernels import kernel_module

    mod = kernel_module(family)
    names = [n for n in vars(mod) if n.startswith("_") and n.endswith("_kernel")]
    if hasattr(mod, "WALK_SEGMENTS"):
        names.append("WALK_SEGMENTS")
    saved = {n: getattr(mod, n) for n in names}
    try:
        for n in names:
            setattr(mod, n, segments if n == "WALK_SEGMENTS" else _NoLaunch())
        args = train_inputs(family, 1, T, HEADS, HEAD_DIM, device="cpu")
        pos = positional(family, args)
        chunk = getattr(mod, f"{family}_chunk")  # the registered kernel (get_kernel needs CUDA)
        step = fwd_bwd(lambda: chunk(*pos)[0], pos)  # its output gradient made once, in the warm-up

        for _ in range(3):
            step()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    finally:
        for n, k in saved.items():
            setattr(mod, n, k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="delta_rule,gated_delta_rule")
    ap.add_argument("--T", type=int, default=2048, help="sequence length (one sequence of 16 heads of 128)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--segments", type=int, default=1, help="the delta rules' WALK_SEGMENTS (default 1)")
    ap.add_argument("--json", default="", help="write the figures here too")
    a = ap.parse_args(argv)
    try:
        families = linear_families(a.families)
    except ValueError as exc:
        ap.error(str(exc))
    if a.T < 1 or a.reps < 1 or a.segments < 1:
        ap.error("--T, --reps and --segments: must be at least 1")
    out = {f: host_ms(f, a.T, a.reps, a.segments) for f in families}
    for f, ms in out.items():
        print(f"{f:18s} T={a.T}: {ms:.3f} ms host per fwd+bwd, kernels stubbed")
    if a.json:
        Path(a.json).write_text(json.dumps({"T": a.T, "segments": a.segments, "host_ms": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
