"""Where the host's time goes in a training step (fwd + bwd, bf16, 16 heads of 128, 64k tokens per
batch): the host clock at each Triton launch, no profiler.

    python benchmarks/host_launch_marks.py [--families gla,delta_rule] [--lengths 2048,32768]
                                           [--steps 20] [--out DIR]

Every ``JITFunction.run`` (a Triton launch from Python) is wrapped to note ``perf_counter`` before
and after it. Per family and length, 20 steps each way: "synced" (each step after a
``torch.cuda.synchronize()``, from an idle GPU, as ``gpu_common.cuda_time`` times a synced step)
and "queued" (back to back). A table row per way: the host's time for the step, from the step's
start to its first Triton launch, the launches' own time, and the gap before each launch
(medians). Then a ``cProfile`` of five synced steps, by own time (``train_ab.host_profile``), and
the largest gaps between the Python / C calls before a synced step's first launch
(``first_launch_trace``).
``step_gaps.py`` gives the GPU side (idle time and what it waited for) from a profiler trace; this
one the host side without one. ``--out`` also writes ``host_launch_marks.{md,json}``.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import (  # noqa: E402
    TOKENS, checked_families, checked_lengths, fwd_bwd, positional, train_inputs, write_report,
)
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


def marks_of(step, synced: bool, steps: int, sync=None) -> dict:
    """Medians over ``steps`` steps (us): the host's step time, its time to the first launch, the
    launches' own time and the gap before each launch after the first, by kernel. ``sync``: the
    device synchronize (``torch.cuda.synchronize``), before each synced step and after the last."""
    sync = torch.cuda.synchronize if sync is None else sync
    totals, firsts, launches, gaps = [], [], [], []
    for _ in range(steps):
        MARKS.clear()
        if synced:
            sync()
        t0 = time.perf_counter()
        step()
        totals.append((time.perf_counter() - t0) * 1e6)
        if not MARKS:
            raise RuntimeError("no Triton launch in the step (the op ran its PyTorch form)")
        firsts.append((MARKS[0][1] - t0) * 1e6)
        launches.append(sum(b - a for _, a, b in MARKS) * 1e6)
        gaps.append([(MARKS[j + 1][1] - MARKS[j][2]) * 1e6 for j in range(len(MARKS) - 1)])
    sync()
    med = statistics.median
    return {"host_step_us": med(totals), "to_first_launch_us": med(firsts), "launches": len(MARKS),
            "launches_us": med(launches),
            "gap_before_us": [[n.strip("_"), med(g[j] for g in gaps)] for j, (n, _, _) in enumerate(MARKS[1:])]}


def first_launch_trace(step, steps: int = 5, top: int = 12, sync=None) -> str:
    """Where the host's time before a synced step's first Triton launch goes: every Python and C
    call and return up to that launch noted with ``sys.setprofile`` (which slows each call by about
    a microsecond: read the large gaps, not the sum), over ``steps`` synced steps; for the step with
    the median time to the launch, the ``top`` largest gaps between consecutive events, each named
    by the event before it (the code that ran in the gap), and the event count."""
    import triton.runtime.jit as jit

    sync = torch.cuda.synchronize if sync is None else sync
    launch = jit.JITFunction.run  # the wrapper of ``wrap_triton_launches`` when installed
    traces = []
    for _ in range(steps):
        events: list[tuple[float, str]] = []
        launched = [False]

        def note(frame, event, arg):
            if launched[0]:  # the step's first launch is the last event kept
                return
            code = frame.f_code
            name = (f"{event}:{getattr(arg, '__qualname__', getattr(arg, '__name__', arg))}" if event.startswith("c_")
                    else f"{event}:{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})")
            launched[0] = event == "call" and code is getattr(launch, "__code__", None)
            events.append((time.perf_counter(), name))

        sync()
        t0 = time.perf_counter()
        sys.setprofile(note)
        try:
            step()
        finally:
            sys.setprofile(None)
        if not launched[0]:
            raise RuntimeError("no Triton launch in the step (the op ran its PyTorch form)")
        traces.append(((events[-1][0] - t0) * 1e6, t0, events))
    sync()
    traces.sort(key=lambda x: x[0])
    to_launch, t0, events = traces[len(traces) // 2]
    marks = [(t0, "step start")] + events
    gaps = sorted(((b[0] - a[0]) * 1e6, a[1], b[1]) for a, b in zip(marks, marks[1:]))[::-1][:top]
    lines = [f"to the first launch {to_launch:.0f} us (median of {steps} synced steps, profiled; "
             f"all: {', '.join(f'{x[0]:.0f}' for x in traces)}), {len(events)} events; largest gaps:"]
    lines += [f"  {g:8.1f} us after {a}  (next: {b})" for g, a, b in gaps]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| family | T | step | host step us | to first launch us | Triton launches (us) | gap before each launch (us) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        gaps = " ".join(f"{n}>{g:.1f}" for n, g in r["gap_before_us"])
        lines.append(f"| {r['family']} | {r['T']} | {r['mode']} | {r['host_step_us']:.0f} | "
                     f"{r['to_first_launch_us']:.0f} | {r['launches']} ({r['launches_us']:.0f}) | {gaps} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from train_ab import host_profile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="gla,delta_rule,gated_delta_rule")
    ap.add_argument("--lengths", default="2048,32768")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="", help="folder for host_launch_marks.{md,json}")
    a = ap.parse_args(argv)
    families, lengths = checked_families(ap, a.families), checked_lengths(ap, a.lengths, whole_batches=True)
    if a.steps < 1:
        ap.error("--steps: must be at least 1")
    if not torch.cuda.is_available():
        print("host_launch_marks: needs a CUDA GPU", file=sys.stderr)
        return 2
    require_triton("host_launch_marks")
    wrap_triton_launches()
    rows, profiles = [], []
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
                rows.append({"family": family, "T": T, "mode": "synced" if synced else "queued", **marks})
            # five synced steps (a synchronize before each), functions by their own time
            text = host_profile(step, steps=5, top=12, busy=torch.cuda.synchronize)
            torch.cuda.synchronize()
            profiles.append(f"### cProfile, {family} T={T}, five synced steps\n\n```\n{text.strip()}\n```")
            trace = first_launch_trace(step)
            print(f"{family} T={T}: {trace}")
            profiles.append(f"### Before the first launch, {family} T={T}\n\n```\n{trace}\n```")
    write_report("host_launch_marks", "Host time of a training step, Triton launch by launch",
                 table(rows) + "\n\n" + "\n\n".join(profiles), rows, a.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
