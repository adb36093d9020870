"""Where does the host's time to launch one training step's Triton kernels go? For each kernel a
family's fwd + bwd launches (in step order), the host microseconds of (a) Triton's full launch path
``kernel[grid](...)`` and (b) the compiled kernel's launcher called directly with the arguments
Triton passed it (the C launcher alone), both with the GPU kept busy so the host never waits.
(a) - (b) is Triton's Python around the launch (argument binding, specialisation key, cache
lookup, launch metadata).

    python benchmarks/triton_launch_cost.py --families delta_rule,gated_delta_rule --T 2048 [--out DIR]

Prints a markdown table per family and writes ``triton_launch_cost.{json,md}`` to ``--out``.
Uses Triton's internals (``JITFunction.run``; ``CompiledKernel._run``, the launcher behind its ``run``
property in Triton 3.6-3.9): a diagnostic, not a test. Where they differ it says so and leaves the
launcher column out.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import checked_families, checked_lengths, host_seconds  # noqa: E402


def host_us(fn, reps: int = 40) -> float:
    """Median host microseconds of one ``fn()`` (a launch) among calls back to back, the GPU kept busy."""
    return host_seconds(fn, reps, first_after_sync=False) * 1e6


def record_launches(run) -> list[dict]:
    """One call of ``run`` with every ``JITFunction.run`` recorded: ``{fn, args, kwargs, grid,
    kernel, launcher_args}`` per launch, in order (``launcher_args``: what Triton passed to the
    compiled kernel's launcher, captured on a second call)."""
    from triton.runtime.jit import JITFunction

    orig = JITFunction.run
    launches: list[dict] = []

    def recording(self, *args, grid, warmup, **kwargs):
        kernel = orig(self, *args, grid=grid, warmup=warmup, **dict(kwargs))
        launches.append({"fn": self, "args": args, "kwargs": kwargs, "grid": grid, "kernel": kernel})
        return kernel

    JITFunction.run = recording
    try:
        run()
        torch.cuda.synchronize()
    finally:
        JITFunction.run = orig
    # second call: capture each compiled kernel's launcher arguments
    captured: list[tuple] = []
    patched = {}
    for rec in launches:
        ck = rec["kernel"]
        if id(ck) in patched:
            continue
        launcher = ck.run  # a property over ``_run`` (the launcher object), set on first use
        patched[id(ck)] = (ck, launcher)

        def spy(*a, _launcher=launcher):
            captured.append((_launcher, a))
            return _launcher(*a)

        ck._run = spy
    try:
        run()
        torch.cuda.synchronize()
    finally:
        for ck, launcher in patched.values():
            ck._run = launcher
    if len(captured) == len(launches):
        for rec, (launcher, a) in zip(launches, captured):
            rec["launcher"], rec["launcher_args"] = launcher, a
    else:
        print(f"triton_launch_cost: caught {len(captured)} of {len(launches)} launcher calls (this Triton's "
              "CompiledKernel differs): the launcher column is left out", file=sys.stderr)
    return launches


def measure(family: str, T: int) -> dict:
    from kernel_launch_sweep import step

    run = step(family, T)
    run()
    torch.cuda.synchronize()
    launches = record_launches(run)
    if not launches:
        raise SystemExit(f"triton_launch_cost: {family} launched no Triton kernel (no kernel registered on this GPU?)")
    rows = []
    for i, rec in enumerate(launches):
        fn, args, kwargs, grid = rec["fn"], rec["args"], rec["kwargs"], rec["grid"]
        full = host_us(lambda: fn[grid](*args, **dict(kwargs)))
        direct = host_us(lambda: rec["launcher"](*rec["launcher_args"])) if "launcher" in rec else float("nan")
        rows.append({"i": i, "kernel": fn.__name__, "grid": list(grid) if not callable(grid) else "callable",
                     "n_args": len(args) + len(kwargs), "full_us": full, "launcher_us": direct})
    # the whole step's host time, the same way (GPU kept busy), and a one-element torch op's launch
    step_us = host_us(run, reps=10)
    x = torch.zeros(1, device="cuda")
    torch_op_us = host_us(lambda: x.add_(1.0))
    sample = launches[0].get("launcher_args", ())
    return {"family": family, "T": T, "rows": rows, "step_host_us": step_us,
            "sum_full_us": sum(r["full_us"] for r in rows), "sum_launcher_us": sum(r["launcher_us"] for r in rows),
            "torch_op_us": torch_op_us, "launcher_arg_types": [type(a).__name__ for a in sample]}


def table(res: dict) -> str:
    out = [f"### {res['family']}, T = {res['T']}: step host {res['step_host_us']:.0f} us; "
           f"Triton launches {res['sum_full_us']:.0f} us, their C launchers {res['sum_launcher_us']:.0f} us; "
           f"a one-element torch op {res['torch_op_us']:.1f} us",
           "", "| # | kernel | args | full launch us | launcher alone us | Triton Python us |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['i']} | {r['kernel']} | {r['n_args']} | {r['full_us']:.1f} | {r['launcher_us']:.1f} | "
                   f"{r['full_us'] - r['launcher_us']:.1f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="delta_rule,gated_delta_rule")
    ap.add_argument("--T", default="2048", help="comma list of sequence lengths")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    families = checked_families(ap, a.families)
    lengths = checked_lengths(ap, a.T, flag="--T")
    if not torch.cuda.is_available():
        print("triton_launch_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    results = [measure(f, T) for f in families for T in lengths]
    md = (f"# Triton launch cost per kernel ({torch.cuda.get_device_name()}, Triton {triton.__version__}, "
          f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n\n"
          + "\n\n".join(table(r) for r in results) + "\n")
    print(md)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "triton_launch_cost.json").write_text(json.dumps(results, indent=1))
        (out / "triton_launch_cost.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
