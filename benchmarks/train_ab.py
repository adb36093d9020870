"""Time a family's training step (fwd + bwd, bf16 or float32, 16 heads of 128, 64k tokens per batch) under
several kernel settings side by side: one process, one set of inputs per length, the variants
timed round robin (``--rounds`` passes, median per variant), so that they share the GPU's state
and drift; each pass starts one variant later than the pass before (``round_order``), so that no
variant always runs first in a pass. The launch sweep (``kernel_launch_sweep.py``) times one change
at a time in child processes; this compares a few chosen combinations within one call.

    python benchmarks/train_ab.py --families delta_rule,gated_delta_rule --lengths 2048,32768 \\
        --variants="-;WALK_SEGMENTS=1;WALK_SEGMENTS=8,WALK_OVERLAP_BELOW_PER_SM=1000.0" --out DIR

(``--variants=`` with the ``=``: a value that starts with ``-`` is otherwise taken for an option.)

A variant is ``-`` (the modules as they are), ``torch`` (the op's PyTorch chunk form, the kernels off: what
the kernels are measured against) or a comma list of ``NAME=VALUE`` items on the family's
kernel module: an upper-case setting, switch or not (a Python literal, e.g. ``WALK_SEGMENTS=1`` or
``WALK_OVERLAP_BELOW_PER_SM=1000.0``), ``walk_bv=N`` (the family module's walks at V block N) or
``LAUNCH.entry.num_warps=N`` / ``LAUNCH.entry.num_stages=N`` / ``LAUNCH.entry.maxnreg=N`` (a cap on registers
per thread, ptxas ``.maxnreg``; ``None`` removes an entry's cap or takes the stages from the dtype) /
``LAUNCH.entry.num_warps_fp32=N`` (the entry's warps for float32 inputs); ``LAUNCH.*.key=N`` sets it on every
entry of the family's ``LAUNCH``. ``--dtype fp32`` times float32 steps
(every kernel at one stage, full-precision dots: ``docs/benchmarks/fp32_compiles_1205.md``). ``--host-profile`` also writes a
cProfile of the first variant's step launches per family and length; ``--graph`` also times each
variant's step replayed from a CUDA graph (what the queued steps would take without the host). Prints a markdown table (ms per step
synced and queued, Mtok/s, the host's time to launch one step, the SM clock after the queued steps, ratios to the first
variant synced and queued) and writes ``train_ab.{json,md}``.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

import torch  # noqa: E402

from gpu_common import (  # noqa: E402
    TOKENS, checked_families, checked_lengths, cuda_time, gpu_state, graph_time, host_seconds, keep_gpu_busy,
    write_report,
)


TORCH = "torch"  # the variant that runs the op's PyTorch chunk form
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
LAUNCH_KEYS = ("num_warps", "num_stages", "maxnreg", "num_warps_fp32")


def items(variant: str) -> list[str]:
    """The ``NAME=VALUE`` items of a variant (none for ``-`` and ``torch``)."""
    return [] if variant in ("-", TORCH) else variant.split(",")


def expanded(family: str, item: str) -> list[str]:
    """``LAUNCH.*.key=N`` as one ``LAUNCH.entry.key=N`` item per entry of the family's ``LAUNCH`` (e.g. every
    kernel's float32 warps in one variant); any other item as it is."""
    from blocks.kernels import kernel_module

    if not item.startswith("LAUNCH.*."):
        return [item]
    return [item.replace("LAUNCH.*.", f"LAUNCH.{entry}.", 1) for entry in kernel_module(family).LAUNCH]


def parsed(family: str, item: str) -> tuple:
    """One ``NAME=VALUE`` item as a ``kernel_launch_sweep.Applied`` variant on the family's module:
    ``("walk_bv", "BV", N)``, ``(entry, "num_warps" | "num_stages" | "maxnreg", N)`` or ``("switch", NAME, value)``."""
    from blocks.kernels import kernel_module

    mod = kernel_module(family)
    name, sep, raw = item.partition("=")
    if not sep:
        raise ValueError(f"{item}: expected NAME=VALUE")
    if name == "walk_bv":
        return ("walk_bv", "BV", int(raw))
    if name.startswith("LAUNCH."):
        _, entry, key = (name.split(".") + ["", ""])[:3]
        if entry not in mod.LAUNCH or key not in LAUNCH_KEYS:
            raise ValueError(f"{item}: {family}'s LAUNCH has no {entry}.{key}")
        if key != "num_warps" and raw.lower() == "none":  # stages from the dtype / no register cap / bf16's warps
            return (entry, key, None)
        if not raw.isdigit():
            raise ValueError(f"{item}: expected an integer{'' if key == 'num_warps' else ' or None'}")
        from kernel_launch_sweep import valid_cap

        value = int(raw)
        warps = (value in (1, 2, 4, 8, 16), "1, 2, 4, 8 or 16")
        ok, allowed = {"num_warps": warps, "num_warps_fp32": warps,
                       "num_stages": (1 <= value <= 4, "1 to 4"),
                       "maxnreg": (valid_cap(value), "a multiple of 8 from 24 to 255")}[key]
        if not ok:
            raise ValueError(f"{item}: out of range ({allowed})")
        return (entry, key, value)
    if not (name.isupper() and hasattr(mod, name)):
        raise ValueError(f"{item}: {family}'s kernel module has no setting {name}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw
    return ("switch", name, value)


def parsed_variant(family: str, variant: str) -> list[tuple]:
    """Every item of ``variant`` (``LAUNCH.*`` ones expanded) ``parsed`` on the family's module."""
    return [parsed(family, one) for item in items(variant) for one in expanded(family, item)]


@contextlib.contextmanager
def applied(family: str, variant: str):
    """The variant's settings on the family's kernel module inside the block (the launch sweep's
    ``Applied``, one per item), everything as before after it."""
    from kernel_launch_sweep import Applied

    with contextlib.ExitStack() as stack:
        for one in parsed_variant(family, variant):
            stack.enter_context(Applied(family, one))
        yield


def round_order(variants: list[str], r: int) -> list[str]:
    """Pass ``r``'s order: ``variants`` rotated by ``r``. The queued timing of whichever variant ran first
    in a pass read 0.6-1.8% slow in two calls of 2026-12-04 (gone with the order reversed, the
    graph-replayed timings within 0.2%: docs/benchmarks/kernel_decisions/delta.md, the Gluon walk's
    section); rotating spreads that over the variants instead of charging it to the baseline."""
    k = r % len(variants)
    return variants[k:] + variants[:k]


def host_profile(run, steps: int = 20, top: int = 25, busy=None) -> str:
    """cProfile of ``steps`` launches of ``run`` (``busy()`` first, e.g. a sleep kernel that keeps
    the GPU ahead, so the host never waits for it): the ``top`` functions by their own time, as
    pstats prints them. Shows where a step's host time goes (Triton's launch path, allocation,
    autograd, our argument code)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    for _ in range(steps):
        if busy is not None:
            busy()
        prof.enable()
        run()
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def time_length(family: str, T: int, variants: list[str], rounds: int, profile_dir: Path | None = None,
                graph: bool = False, dtype: str = "bf16") -> list[dict]:
    """One row per variant: median ms per step over ``rounds`` round-robin passes, synced and queued;
    with ``graph`` also the step captured in a CUDA graph and replayed (``graph_time``: no host time at
    all, and a graph's kernels start closer to each other, so queued - graph is what the host's pace and
    the stream launches' own gaps cost the queued steps together)."""
    from kernel_launch_sweep import step

    # the registered kernel's fwd + bwd on the sweep's inputs; the ``torch`` variant, the op's PyTorch form
    kernel_run = step(family, T, dtype=DTYPES[dtype])
    runs = {v: kernel_run for v in variants}
    if TORCH in variants:
        runs[TORCH] = step(family, T, dtype=DTYPES[dtype], pytorch_form=True)
    if profile_dir is not None:  # the first variant's host time, function by function
        with applied(family, variants[0]):
            runs[variants[0]]()
            torch.cuda.synchronize()
            text = host_profile(runs[variants[0]], busy=keep_gpu_busy)
            torch.cuda.synchronize()
        profile_dir.mkdir(parents=True, exist_ok=True)
        (profile_dir / f"host_profile_{family}_{T}.txt").write_text(text)
    times: dict[str, dict[str, list[float]]] = {v: {"synced": [], "queued": [], "host": [], "sm_mhz": [],
                                                    "graph": []} for v in variants}
    errors: dict[str, str] = {}
    graph_errors: dict[str, str] = {}
    for r in range(rounds):
        for v in round_order(variants, r):
            if v in errors:
                continue
            run = runs[v]
            try:
                with applied(family, v):
                    times[v]["synced"].append(cuda_time(run, budget_s=0.3)[0] * 1e3)
                    times[v]["queued"].append(cuda_time(run, budget_s=0.3, queued=True)[0] * 1e3)
                    state = gpu_state()  # right after the queued steps
                    times[v]["sm_mhz"] += [state["sm_mhz"]] if state else []
                    times[v]["host"].append(host_seconds(run, reps=5) * 1e3)
                    if graph and v not in graph_errors:
                        try:
                            times[v]["graph"].append(graph_time(run, steps=2, reps=5) * 1e3)
                        except Exception as exc:  # noqa: BLE001 - the row keeps its other columns
                            graph_errors[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            except Exception as exc:  # noqa: BLE001 - reported in the variant's row, the others go on
                errors[v] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    rows = []
    for v in variants:
        if v in errors:
            rows.append({"family": family, "T": T, "dtype": dtype, "variant": v, "error": errors[v]})
            continue
        ms, qms = statistics.median(times[v]["synced"]), statistics.median(times[v]["queued"])
        rows.append({"family": family, "T": T, "dtype": dtype, "variant": v, "ms": ms, "queued_ms": qms,
                     "host_ms": statistics.median(times[v]["host"]),
                     "mtok_s": TOKENS / ms / 1e3, "queued_mtok_s": TOKENS / qms / 1e3,
                     "passes_ms": times[v]["synced"],
                     "sm_mhz": statistics.median(times[v]["sm_mhz"]) if times[v]["sm_mhz"] else None,
                     **({"graph_ms": statistics.median(times[v]["graph"])} if times[v]["graph"] else {}),
                     **({"graph_error": graph_errors[v]} if v in graph_errors else {})})
    return rows


def table(rows: list[dict]) -> str:
    """The report's table; the last two columns are each variant's ms over the first variant's at
    the same family and length, synced and queued (read queued ratios from the second), and ``SM
    MHz`` the median SM clock right after its queued steps (NVML; ``-`` without it). Rows timed with
    ``--graph`` add ``ms graph`` (the step replayed from a CUDA graph) and queued over graph."""
    graphed = any("graph_ms" in r or "graph_error" in r for r in rows)
    extra_head = " ms graph | queued / graph |" if graphed else ""
    out = ["| family | T | variant | ms synced | Mtok/s | ms queued | Mtok/s queued | host ms | SM MHz | "
           "vs first (synced) | vs first (queued) |" + extra_head,
           "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if graphed else "")]
    base: dict[tuple, tuple[float, float]] = {}
    for r in rows:
        key = (r["family"], r["T"], r.get("dtype", "bf16"))
        family = r["family"] + ("" if key[2] == "bf16" else f" ({key[2]})")
        if "error" in r:
            out.append(f"| {family} | {r['T']} | `{r['variant']}` | {r['error']} ||||||||" + ("||" if graphed else ""))
            continue
        ms0, qms0 = base.setdefault(key, (r["ms"], r["queued_ms"]))
        clock = f"{r['sm_mhz']:.0f}" if r.get("sm_mhz") else "-"
        line = (f"| {family} | {r['T']} | `{r['variant']}` | {r['ms']:.3f} | {r['mtok_s']:.2f} | "
                f"{r['queued_ms']:.3f} | {r['queued_mtok_s']:.2f} | {r['host_ms']:.3f} | {clock} | "
                f"{r['ms'] / ms0:.3f} | {r['queued_ms'] / qms0:.3f} |")
        if graphed:
            if "graph_ms" in r:
                line += f" {r['graph_ms']:.3f} | {r['queued_ms'] / r['graph_ms']:.3f} |"
            else:
                line += f" {r.get('graph_error', '-')} | - |"
        out.append(line)
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="delta_rule,gated_delta_rule")
    ap.add_argument("--lengths", default="2048,32768")
    ap.add_argument("--variants", default="-", help="';'-separated variants (see the module docstring)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="the steps' inputs (fp32: the float32 "
                    "kernels, one stage each, full-precision dots; compare with the 'torch' variant)")
    ap.add_argument("--out", default="", help="folder for train_ab.{json,md} (default: print only)")
    ap.add_argument("--host-profile", action="store_true",
                    help="also write host_profile_<family>_<T>.txt to --out: cProfile of 20 launches of the "
                         "first variant's step, the GPU kept busy")
    ap.add_argument("--graph", action="store_true",
                    help="also time each variant's step captured in a CUDA graph (no host time): the column "
                         "'ms graph' and queued / graph")
    a = ap.parse_args(argv)
    families = checked_families(ap, a.families)
    lengths = checked_lengths(ap, a.lengths)
    if a.rounds < 1:
        ap.error("--rounds: must be at least 1")
    if a.host_profile and not a.out:
        ap.error("--host-profile: needs --out for its files")
    variants = [v.strip() for v in a.variants.split(";") if v.strip()]
    # every variant understood before any GPU time is spent; also without a GPU where Triton imports (its CPU
    # build, ``PYTHONPATH=.triton-cpu``), so that a GPU session's variants can be checked beforehand
    checked = importlib.util.find_spec("triton") is not None
    if checked:
        try:
            for family in families:
                for v in variants:
                    parsed_variant(family, v)
        except ValueError as exc:
            ap.error(f"--variants: {exc}")
    if not torch.cuda.is_available():
        print(f"train_ab: {'the variants are understood; ' if checked else ''}timing them needs a CUDA GPU",
              file=sys.stderr)
        return 2
    rows: list[dict] = []
    t0 = time.time()
    for family in families:
        for T in lengths:
            rows += time_length(family, T, variants, a.rounds, Path(a.out) if a.host_profile else None, a.graph,
                                a.dtype)
            print(table([r for r in rows if r["family"] == family and r["T"] == T]).split("\n", 2)[-1], flush=True)
    write_report("train_ab", "Training-step A/B", table(rows), rows, a.out, argv, extra=f", {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
