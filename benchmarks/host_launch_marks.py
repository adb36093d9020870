"""Where the host's time goes in a training step (fwd + bwd, bf16, 16 heads of 128, 64k tokens per
batch): the host clock at each Triton launch, no profiler.

    python benchmarks/host_launch_marks.py [--families gla,delta_rule] [--lengths 2048,32768]
                                           [--steps 20] [--out DIR]

Every ``JITFunction.run`` (a Triton launch from Python) is wrapped to note ``perf_counter`` before
and after it. Per family and length, 20 steps each way: "synced" (each step after a
``torch.cuda.synchronize()``, from an idle GPU, as ``gpu_common.cuda_time`` times a synced step)
and "queued" (back to back). Printed per way: the host's time for the step, from the step's start
to its first Triton launch, the launches' own time, and the gap before each launch (medians). Then
a ``cProfile`` of five synced steps, by own time. ``step_gaps.py`` gives the GPU side (idle time
and what it waited for) from a profiler trace; this one the host side without one.
``--out`` also writes ``host_launch_marks.txt``.
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import TOKENS, checked_families, checked_lengths, fwd_bwd, positional, train_inputs  # noqa: E402
from triton_check import require_triton  # noqa: E402

MARKS: list[tuple[str, float, float]] = []  # (kernel, host clock before, after) per launch


def wrap_triton_launches() -> None:
    """Note every Triton launch's host-clock interval in ``MARKS`` (imported here: triton is a
    GPU-host dependency)."""
    import triton.runtime.jit as jit

    run = jit.JITFunction.run

    def noted(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = run(self, *args, **kwargs)
        MARKS.append((self.fn.__name__, t0, time.perf_counter()))
        return out

    jit.JITFunction.run = noted


def marks_of(step, synced: bool, steps: int) -> str:
    """One line: medians over ``steps`` steps of the host's step time, its time to the first
    launch, the launches' own time and the gap before each launch after the first (us)."""
    totals, firsts, launches, gaps = [], [], [], []
    for _ in range(steps):
        MARKS.clear()
        if synced:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        totals.append((time.perf_counter() - t0) * 1e6)
        if not MARKS:
            raise RuntimeError("no Triton launch in the step (the op ran its PyTorch form)")
        firsts.append((MARKS[0][1] - t0) * 1e6)
        launches.append(sum(b - a for _, a, b in MARKS) * 1e6)
        gaps.append([(MARKS[j + 1][1] - MARKS[j][2]) * 1e6 for j in range(len(MARKS) - 1)])
    torch.cuda.synchronize()
    med = statistics.median
    per_gap = [med(g[j] for g in gaps) for j in range(len(gaps[0]))]
    names = " ".join(f"{n.strip('_')}>{g:.1f}" for (n, _, _), g in zip(MARKS[1:], per_gap))
    return (f"host step {med(totals):.0f} us, to first launch {med(firsts):.0f} us, in {len(MARKS)} Triton "
            f"launches {med(launches):.0f} us; gap before each launch (us): {names}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="gla,delta_rule,gated_delta_rule")
    ap.add_argument("--lengths", default="2048,32768")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="", help="folder for host_launch_marks.txt")
    a = ap.parse_args(argv)
    families, lengths = checked_families(ap, a.families), checked_lengths(ap, a.lengths, whole_batches=True)
    if a.steps < 1:
        ap.error("--steps: must be at least 1")
    if not torch.cuda.is_available():
        print("host_launch_marks: needs a CUDA GPU", file=sys.stderr)
        return 2
    require_triton("host_launch_marks")
    wrap_triton_launches()
    lines = []
    for family in families:
        for T in lengths:
            args = train_inputs(family, TOKENS // T, T)
            pos = positional(family, args)
            mod = importlib.import_module(f"blocks.ops.{family}")
            step = fwd_bwd(lambda: mod.chunk(*pos)[0], pos)
            for _ in range(3):
                step()
            for synced in (True, False):
                try:
                    marks = marks_of(step, synced, a.steps)
                except RuntimeError as exc:
                    print(f"host_launch_marks: {family} T={T}: {exc}", file=sys.stderr)
                    return 2
                lines.append(f"{family} T={T} {'synced' if synced else 'queued'}: {marks}")
                print(lines[-1], flush=True)
            prof = cProfile.Profile()
            for _ in range(5):
                torch.cuda.synchronize()
                prof.enable()
                step()
                prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(12)
            lines.append(text.getvalue())
            print(lines[-1])
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "host_launch_marks.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
