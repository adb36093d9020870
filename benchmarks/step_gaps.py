"""Where a training step from an idle GPU loses time: the GPU timeline of synced fwd + bwd steps
(bf16, 16 heads of 128, 64k tokens per batch), from a ``torch.profiler`` trace.

    python benchmarks/step_gaps.py [--families delta_rule,gated_delta_rule] [--lengths 2048,32768]
                                   [--steps 5] [--min-gap-us 2] [--timeline] [--out DIR]
    python benchmarks/step_gaps.py --from-traces DIR [--timeline]   # no GPU: from --traces files

Each step runs between two ``torch.cuda.synchronize()`` calls, as ``gpu_common.cuda_time`` times a
"synced" step. From the trace (CUDA activity only: the runtime / driver calls and the kernels,
matched by correlation id; no CPU-op recording, which would slow the host path being measured)
each step gets: the host's time from the synchronize's return to its first launch, the GPU's idle
time before its first kernel, the idle time between kernels split into gaps where the GPU waited
for the host (the next kernel's launch call ended after the GPU went idle) and the rest (launch
latency or stream waits with the launch already queued), and the kernels that followed the
largest waits (every idle interval counts in the sums; ``--min-gap-us`` only limits the list, and
copies and memsets are not kernels, so they count as idle). The steps' wall time is also timed with CUDA events outside the profiler
(``cuda_time``, synced and queued) to show what the profiler itself adds.
``--timeline`` adds, per case, the median-wall step's kernels in start order with their stream,
start and end (what ran beside what, e.g. the walks' segments on their own stream, and how long each
took there). Prints markdown; ``--out`` also gets ``step_gaps.{json,md}``.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import checked_families, checked_lengths, cuda_time, write_report  # noqa: E402

LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def _is_launch(name: str) -> bool:
    return "LaunchKernel" in name or "LaunchCooperativeKernel" in name


def step_windows(events: list[dict]) -> list[tuple[float, float]]:
    """Host intervals ``(t0, t1)`` (us) between the end of one ``cudaDeviceSynchronize`` and the
    start of the next that hold at least one kernel launch, in trace order: one per step when the
    steps were run as ``torch.cuda.synchronize(); step; torch.cuda.synchronize(); ...`` (the
    profiler's own synchronizes add empty windows; a step's own stream or event waits do not cut it)."""
    syncs = sorted((e for e in events if e.get("cat") in LAUNCH_CATS and e.get("name") == "cudaDeviceSynchronize"),
                   key=lambda e: e["ts"])
    starts = sorted(e["ts"] for e in events if e.get("cat") in LAUNCH_CATS and _is_launch(e.get("name", "")))
    windows = [(a["ts"] + a.get("dur", 0.0), b["ts"]) for a, b in zip(syncs, syncs[1:])]
    return [(t0, t1) for t0, t1 in windows if bisect.bisect_left(starts, t0) < bisect.bisect_right(starts, t1)]


def _step_kernels(events: list[dict], window: tuple[float, float]) -> tuple[dict, list[dict]]:
    """``({correlation id: launch call}, [kernel events in start order])`` of the kernels launched inside
    the host ``window``; ValueError where there is none."""
    t0, t1 = window
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and _is_launch(e.get("name", ""))
                and t0 <= e["ts"] <= t1 and "correlation" in e.get("args", {})}
    kernels = sorted((e for e in events if e.get("cat") == "kernel"
                      and e.get("args", {}).get("correlation") in launches), key=lambda e: e["ts"])
    if not kernels:
        n_kernels = sum(e.get("cat") == "kernel" for e in events)
        raise ValueError(f"no kernel launched inside the step's window ({len(launches)} launch calls there, "
                         f"{n_kernels} kernels in the trace: was CUDA activity traced?)")
    return launches, kernels


def timeline(events: list[dict], windows: list[tuple[float, float]] | None = None,
             per_step: list[dict] | None = None) -> list[dict]:
    """The kernels of the step whose wall time is the median (as ``summarize`` picks it), in start
    order: ``{"kernel", "stream", "start_us", "end_us", "grid"}``, times from that step's first kernel's
    start. Shows what ran beside what (the walks' segments on their own stream) and for how long, which
    the per-kernel sums of ``kernel_breakdown`` cannot. ``windows`` / ``per_step``: the trace's
    ``step_windows`` and their ``step_gaps`` where the caller has them (else found here)."""
    windows = step_windows(events) if windows is None else windows
    if not windows:
        raise ValueError("no step (launches between two synchronizes) in the trace")
    per_step = [step_gaps(events, w) for w in windows] if per_step is None else per_step
    window = sorted(zip((s["wall_us"] for s in per_step), windows))[len(windows) // 2][1]
    _, kernels = _step_kernels(events, window)
    first = kernels[0]["ts"]
    return [{"kernel": k.get("name", "?")[:80], "stream": k.get("args", {}).get("stream"),
             "start_us": round(k["ts"] - first, 1), "end_us": round(k["ts"] + k.get("dur", 0.0) - first, 1),
             "grid": k.get("args", {}).get("grid")} for k in kernels]


def timeline_table(family: str, T, rows: list[dict]) -> str:
    """``timeline``'s rows as a markdown section."""
    out = [f"### {family}, T = {T}: the median-wall step's kernels (us from its first kernel's start)", "",
           "| kernel | stream | start | end | us | grid |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['kernel'].strip('_')} | {r['stream']} | {r['start_us']:.1f} | {r['end_us']:.1f} | "
                   f"{r['end_us'] - r['start_us']:.1f} | {r['grid']} |")
    return "\n".join(out)


def step_gaps(events: list[dict], window: tuple[float, float], min_gap_us: float = 2.0, top: int = 5) -> dict:
    """One step's GPU timeline from chrome-trace ``events`` (kineto's: ``ts`` / ``dur`` in us on one
    clock for host calls and kernels, ``args.correlation`` linking a kernel to its launch call).

    Returns ``{"kernels", "host_to_first_launch_us", "first_launch_call_us", "launch_spacing_us",
    "idle_before_first_us", "busy_us", "wall_us", "host_wait_us", "other_gap_us", "gaps": [[idle us,
    next kernel, "host" | "device"], ...]}``: the first launch call's own duration and the median
    time between consecutive launch calls (the host's pace),
    ``wall_us`` from the window's start (the synchronize's return) to the last kernel's end,
    ``busy_us`` the union of kernel intervals, gaps of at least ``min_gap_us`` between them
    (``top`` largest listed), "host" when the launch of the kernel after the gap returned after the
    GPU had gone idle."""
    t0, _ = window
    launches, kernels = _step_kernels(events, window)
    calls = sorted(launches.values(), key=lambda e: e["ts"])
    spacing = [b["ts"] - a["ts"] for a, b in zip(calls, calls[1:])]
    busy = 0.0
    end = kernels[0]["ts"]
    host_wait = other = 0.0
    gaps = []
    for k in kernels:
        k_end = k["ts"] + k.get("dur", 0.0)
        if k["ts"] > end:  # idle from `end` to this kernel's start
            idle = k["ts"] - end
            launch = launches[k["args"]["correlation"]]
            kind = "host" if launch["ts"] + launch.get("dur", 0.0) > end else "device"
            if idle >= min_gap_us:
                gaps.append([round(idle, 1), k.get("name", "?")[:80], kind])
            if kind == "host":
                host_wait += idle
            else:
                other += idle
            busy += k_end - k["ts"]
            end = k_end
        elif k_end > end:  # overlaps the busy stretch (another stream): extend it
            busy += k_end - end
            end = k_end
    gaps.sort(key=lambda g: -g[0])
    return {"kernels": len(kernels), "host_to_first_launch_us": calls[0]["ts"] - t0,
            "first_launch_call_us": calls[0].get("dur", 0.0),
            "launch_spacing_us": statistics.median(spacing) if spacing else 0.0,
            "idle_before_first_us": kernels[0]["ts"] - t0, "busy_us": busy, "wall_us": end - t0,
            "host_wait_us": host_wait, "other_gap_us": other, "gaps": gaps[:top]}


def summarize(steps: list[dict]) -> dict:
    """Medians of the per-step figures; the gaps of the step whose wall time is the median, with
    that step's own wall time and waits for the host (the medians of the columns need not come from
    one step)."""
    keys = ("kernels", "host_to_first_launch_us", "first_launch_call_us", "launch_spacing_us",
            "idle_before_first_us", "busy_us", "wall_us", "host_wait_us", "other_gap_us")
    out = {k: statistics.median(s[k] for s in steps) for k in keys}
    mid = sorted(steps, key=lambda s: s["wall_us"])[len(steps) // 2]
    out["gaps_of_median_step"] = mid["gaps"]
    out["median_step"] = {"wall_us": mid["wall_us"], "host_wait_us": mid["host_wait_us"]}
    return out


def profile_steps(run, steps: int, cpu_ops: bool = False) -> list[dict]:
    """Chrome-trace events of ``steps`` synced calls of ``run`` (CUDA activity; ``cpu_ops``: the
    host's operators too)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if cpu_ops else [])
    with profile(activities=activities) as prof:
        torch.cuda.synchronize()
        for _ in range(steps):
            run()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())["traceEvents"]


def measure(family: str, T: int, steps: int, min_gap_us: float, trace_dir: Path | None = None,
            with_timeline: bool = False) -> dict:
    from kernel_launch_sweep import step

    run = step(family, T)  # the registered kernel's fwd + bwd on the sweep's inputs
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    synced, queued = cuda_time(run, budget_s=0.3)[0], cuda_time(run, budget_s=0.3, queued=True)[0]
    cpu_ops = False
    events = profile_steps(run, steps)
    windows = step_windows(events)
    if len(windows) != steps:  # a torch whose CUDA activity leaves out the host's runtime calls
        cpu_ops = True
        events = profile_steps(run, steps, cpu_ops=True)
        windows = step_windows(events)
    if trace_dir is not None:
        trace_dir.mkdir(parents=True, exist_ok=True)
        with gzip.open(trace_dir / f"trace_{family}_{T}.json.gz", "wt") as f:
            json.dump({"traceEvents": events}, f)
    if len(windows) != steps:
        raise RuntimeError(f"found {len(windows)} windows with launches between synchronizes for {steps} steps")
    per_step = [step_gaps(events, w, min_gap_us) for w in windows]
    return {"family": family, "T": T, "synced_ms": synced * 1e3, "queued_ms": queued * 1e3,
            "cpu_ops_traced": cpu_ops, **summarize(per_step),
            **({"timeline": timeline(events, windows, per_step)} if with_timeline else {})}


def table(rows: list[dict]) -> str:
    out = ["| family | T | ms synced / queued (events) | wall ms (profiled) | busy ms | host to 1st launch us | "
           "1st launch call us / launch spacing us | idle before 1st kernel us | waits for host us | other gaps us | "
           "kernels | the median-wall step: wall ms, waits us; its largest gaps (us, next kernel, cause) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['family']} | {r['T']} | {r['error']} ||||||||||")
            continue
        gaps = "; ".join(f"{g[0]:.0f} {g[1].strip('_')[:28]} ({g[2]})" for g in r["gaps_of_median_step"][:3])
        step = r.get("median_step", {"wall_us": r["wall_us"], "host_wait_us": r["host_wait_us"]})
        timed = f"{r['synced_ms']:.3f} / {r['queued_ms']:.3f}" if "synced_ms" in r else "- (from a trace)"
        out.append(f"| {r['family']} | {r['T']} | {timed} | "
                   f"{r['wall_us'] / 1e3:.3f} | {r['busy_us'] / 1e3:.3f} | {r['host_to_first_launch_us']:.0f} | "
                   f"{r.get('first_launch_call_us', 0):.0f} / {r.get('launch_spacing_us', 0):.0f} | "
                   f"{r['idle_before_first_us']:.0f} | {r['host_wait_us']:.0f} | {r['other_gap_us']:.0f} | "
                   f"{r['kernels']:.0f} | {step['wall_us'] / 1e3:.3f}, {step['host_wait_us']:.0f}; {gaps} |")
    return "\n".join(out)


def report_body(rows: list[dict]) -> str:
    """The table, then each row's ``timeline`` section where it has one."""
    sections = [timeline_table(r["family"], r["T"], r["timeline"]) for r in rows if r.get("timeline")]
    return "\n\n".join([table(rows)] + sections)


def from_traces(folder: Path, min_gap_us: float, with_timeline: bool = False) -> list[dict]:
    """Rows of every ``trace_<family>_<T>.json.gz`` in ``folder`` (written by ``--traces``): the
    same figures, without the event timings, and no GPU needed; ``with_timeline``: each row's
    ``timeline`` too."""
    rows = []
    for path in sorted(folder.glob("trace_*_*.json.gz")):
        family, _, T = path.name[len("trace_"):-len(".json.gz")].rpartition("_")
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        try:
            windows = step_windows(events)
            per_step = [step_gaps(events, w, min_gap_us) for w in windows]
            rows.append({"family": family, "T": int(T), **summarize(per_step),
                         **({"timeline": timeline(events, windows, per_step)} if with_timeline else {})})
        except (ValueError, statistics.StatisticsError) as exc:
            rows.append({"family": family, "T": T, "error": f"{path.name}: {exc}"[:200]})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="delta_rule,gated_delta_rule")
    ap.add_argument("--lengths", default="2048,32768")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps per family and length")
    ap.add_argument("--min-gap-us", type=float, default=2.0, help="shortest idle interval listed as a gap")
    ap.add_argument("--out", default="", help="folder for step_gaps.{json,md} (default: print only)")
    ap.add_argument("--traces", action="store_true",
                    help="also write each case's trace to --out as trace_<family>_<T>.json.gz (chrome://tracing, Perfetto)")
    ap.add_argument("--from-traces", default="", metavar="DIR",
                    help="no GPU: the table from the trace_<family>_<T>.json.gz files in DIR (--families, --lengths ignored)")
    ap.add_argument("--timeline", action="store_true",
                    help="also print the median-wall step's kernels of each case in start order (stream, start, end)")
    a = ap.parse_args(argv)
    if a.min_gap_us < 0:
        ap.error("--min-gap-us: must not be negative")
    if a.from_traces:
        rows = from_traces(Path(a.from_traces), a.min_gap_us, a.timeline)
        if not rows:
            ap.error(f"--from-traces: no trace_<family>_<T>.json.gz in {a.from_traces}")
        print(report_body(rows))
        return 0
    families = checked_families(ap, a.families)
    lengths = checked_lengths(ap, a.lengths, whole_batches=True)
    if a.traces and not a.out:
        ap.error("--traces: needs --out for its files")
    if a.steps < 1:
        ap.error("--steps: must be at least 1")
    if not torch.cuda.is_available():
        print("step_gaps: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for family in families:
        for T in lengths:
            try:
                rows.append(measure(family, T, a.steps, a.min_gap_us, Path(a.out) if a.traces else None,
                                    a.timeline))
            except Exception as exc:  # noqa: BLE001 - reported in its row, the other rows go on
                rows.append({"family": family, "T": T, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            print(table(rows[-1:]).split("\n", 2)[-1], flush=True)
    write_report("step_gaps", "GPU idle time in synced training steps", report_body(rows), rows, a.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
