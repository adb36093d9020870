"""Where a kernel's time goes, by taking parts out: gla's training step per kernel (device ms
summed by ``torch.profiler``, ``gpu_kernels.kernel_breakdown``) with edited copies of
``blocks/kernels/gla.py``'s whole-chunk kernels swapped in, one variant after another in one
process; or an older commit's ``gla.py`` registered in its place (``old``).

    python benchmarks/kernel_parts.py --variants base,no_dv,dv_only,no_epilogue,no_cumsum,fwd_no_scores \\
        [--old e19e623] [--set "LAUNCH.bwd_chunk.num_warps=8,BWD_CHUNK_BK=128"] [--lengths 2048] [--out DIR]
    python benchmarks/kernel_parts.py --check     # every edit still applies to gla.py (no GPU)

An edited kernel computes wrong results, on purpose: its time says what the part it lost cost in
that kernel, not what a correct kernel could save. Each edit names the source lines it replaces;
one whose lines are gone from ``gla.py`` is an error (``--check``, also a CPU test), so the edits
follow the kernels or say that they no longer apply. ``--set`` takes ``train_ab.py``'s items
(switches and ``LAUNCH.entry.field=N``), applied to every variant; an edit may carry items of its
own, applied on top for that variant only: ``no_dv`` and ``dv_only`` act on the layout with dv
inside ``_bwd_chunk_kernel``, so they turn ``BWD_DV_SEPARATE`` and ``KEEP_A`` off themselves, as
``base_old_dv`` (nothing taken out) does for their reference (the report names each variant's own
items; a ``--set`` item naming the same setting is an error). Made for the 2026-12-01 whole-chunk work
(``docs/benchmarks/gla_whole_chunk.md``), whose figures came from an earlier, uncommitted form.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))  # the project root, for blocks

GLA = ROOT / "blocks" / "kernels" / "gla.py"


def _replace(src: str, old: str, new: str) -> str:
    if old not in src:
        raise ValueError(f"no longer applies: {old.strip().splitlines()[0]!r} is not in gla.py")
    return src.replace(old, new, 1)


def _cut(src: str, start: str, end: str, new: str) -> str:
    """``src`` with the lines from ``start`` up to (not including) ``end`` replaced by ``new``."""
    if start not in src or end not in src[src.index(start):]:
        raise ValueError(f"no longer applies: {start.strip().splitlines()[0]!r} .. {end.strip()!r} not in gla.py")
    a = src.index(start)
    return src[:a] + new + src[src.index(end, a):]


# name -> (what it takes out, edit of gla.py's source[, train_ab.py items the variant runs with]).
# The replacements keep each kernel's other results live (stores of sums), so that the compiler does
# not drop more than the named part.
OLD_DV_LAYOUT = "BWD_DV_SEPARATE=False,KEEP_A=False"  # dv inside _bwd_chunk_kernel, from A formed again
EDITS = {
    "base": ("nothing (the kernels as they are, built the same way as the edits)", lambda s: s),
    "base_old_dv": ("nothing, on the layout the dv edits need (their reference)", lambda s: s, OLD_DV_LAYOUT),
    "no_dv": ("_bwd_chunk_kernel's dv (its factored A^T and the state write's term)",
              lambda s: _replace(s, "    if WITH_DV:\n        _dv_blocks(", "    if False:\n        _dv_blocks("),
              OLD_DV_LAYOUT),
    "dv_only": ("_bwd_chunk_kernel's dq, dk and gate part (value loop and epilogue)",
                lambda s: _replace(s, "    if not steep:\n        c0 = i_k * BK", "    if False:\n        c0 = i_k * BK"),
                OLD_DV_LAYOUT),
    "no_epilogue": ("_bwd_chunk_kernel's epilogue: dq, dk and the gate from the accumulators",
                    lambda s: _cut(s, "        b_dA = b_dA * scale\n        b_diag", "        _store(dg, b_dg",
                                   "        b_dg = b_dq + b_dk + b_hdh[None, :]\n"
                                   "        tl.store(dq + i_bh, tl.sum(tl.sum(b_dA, axis=1), axis=0))\n")),
    "no_cumsum": ("_bwd_chunk_kernel's reverse cumsum of the gate's row terms",
                  lambda s: _replace(s, "b_dg = tl.sum(b_dG, axis=0)[None, :] - tl.cumsum(b_dG, axis=0) + b_dG + b_P[None, :]",
                                     "b_dg = b_dG + b_P[None, :]")),
    "fwd_no_scores": ("_fwd_o_kernel's factored scores (A stays zero)",
                      lambda s: _replace(s, "            b_A += tl.dot(_op(b_qe, q, LOWP), tl.trans(b_kf)",
                                         "            b_kf = tl.dot(_op(b_qe, q, LOWP), tl.trans(b_kf)")),  # unused: dropped
}
SWAPPED = ("_bwd_chunk_kernel", "_fwd_o_kernel")


def own_items(name: str) -> str:
    """The ``train_ab.py`` items variant ``name`` runs with on top of ``--set`` ("" for none)."""
    return EDITS[name][2] if name in EDITS and len(EDITS[name]) > 2 else ""


def edited_source(name: str, src: str | None = None) -> str:
    """gla.py's source with edit ``name`` applied and its kernel registration left out."""
    src = GLA.read_text() if src is None else src
    return EDITS[name][1](src).replace('@register_kernel("gla", "chunk")\n', "", 1)


def build(name: str, src: str) -> types.ModuleType:
    """``src`` as a module of the ``blocks.kernels`` package (its relative imports resolve; Triton
    reads a kernel's source from the file behind it, written under /tmp)."""
    path = Path(f"/tmp/kernel_parts_{name}.py")
    path.write_text(src)
    mod = types.ModuleType(f"blocks.kernels._kernel_parts_{name}")
    mod.__package__, mod.__file__ = "blocks.kernels", str(path)
    sys.modules[mod.__name__] = mod
    exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod


def check() -> list[str]:
    """Apply every edit to the current gla.py; the names that no longer apply, with why."""
    bad = []
    for name in EDITS:
        try:
            edited_source(name)
        except ValueError as e:
            bad.append(f"{name}: {e}")
    return bad


def breakdown(lengths: list[int]) -> dict:
    import gpu_kernels

    return gpu_kernels.kernel_breakdown(families=("gla",), lengths=tuple(lengths))["gla"]


def main(argv: list[str] | None = None) -> int:
    from gpu_common import checked_lengths, write_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="base," + ",".join(n for n in EDITS if n != "base"),
                    help=f"comma list of {', '.join(EDITS)}, and 'old' (the --old commit's gla.py)")
    ap.add_argument("--old", default="", help="a git revision whose blocks/kernels/gla.py the 'old' variant runs")
    ap.add_argument("--set", default="", help="train_ab.py items applied to every variant")
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--out", default="", help="folder for kernel_parts.{json,md} (default: print only)")
    ap.add_argument("--check", action="store_true", help="only check that every edit applies (no GPU)")
    args = ap.parse_args(argv)
    if args.check:
        bad = check()
        for line in bad:
            print(line, file=sys.stderr)
        print(f"{len(EDITS) - len(bad)} of {len(EDITS)} edits apply to {GLA.relative_to(ROOT)}")
        return 1 if bad else 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in EDITS and v != "old"]
    if not variants or unknown:
        ap.error(f"--variants: unknown {unknown or 'empty list'}; choose from {', '.join(EDITS)}, old")
    if "old" in variants and not args.old:
        ap.error("--variants: 'old' needs --old REV")
    lengths = checked_lengths(ap, args.lengths)
    bad = check()
    if bad:
        ap.error("; ".join(bad))
    import train_ab

    sets = args.set or "-"
    try:
        for item in ([] if sets == "-" else sets.split(",")):
            train_ab.parsed("gla", item)
    except ValueError as e:
        ap.error(f"--set: {e}")
    set_names = {item.partition("=")[0] for item in sets.split(",")}
    for name in variants:
        clash = sorted(set_names & {item.partition("=")[0] for item in own_items(name).split(",") if item})
        if clash:
            ap.error(f"--set: {', '.join(clash)} is set by variant {name} itself ({own_items(name)})")
    import torch

    if not torch.cuda.is_available():
        print("kernel_parts.py: needs a CUDA GPU (run --check without one)", file=sys.stderr)
        return 2
    from blocks.kernels import gla, register_kernel

    rows = []
    for name in variants:
        kept = {n: getattr(gla, n) for n in SWAPPED}
        # the --set items, then the variant's own, undone after each variant
        with train_ab.applied("gla", sets), train_ab.applied("gla", own_items(name) or "-"):
            try:
                if name == "old":
                    old_src = subprocess.run(["git", "show", f"{args.old}:blocks/kernels/gla.py"], cwd=ROOT,
                                             capture_output=True, text=True, check=True).stdout
                    build("old", old_src)  # registers its gla_chunk in place of today's
                else:
                    mod = build(name, edited_source(name))
                    for n in SWAPPED:
                        setattr(gla, n, getattr(mod, n))
                for T, r in breakdown(lengths).items():
                    rows.append({"variant": name, "T": int(T), "busy_ms": r["busy_ms"], "kernels_ms": r["kernels_ms"]})
            finally:
                for n, fn in kept.items():
                    setattr(gla, n, fn)
                register_kernel("gla", "chunk")(gla.gla_chunk)
    lines = ["| variant | takes out | T | busy ms | largest kernels (ms) |", "|---|---|---|---|---|"]
    for r in rows:
        what = EDITS[r["variant"]][0] if r["variant"] in EDITS else f"gla.py of {args.old}"
        if own_items(r["variant"]):
            what += f" (with {own_items(r['variant'])})"
        top = ", ".join(f"{k.strip('_')} {v:.3f}" for k, v in list(r["kernels_ms"].items())[:5])
        lines.append(f"| {r['variant']} | {what} | {r['T']} | {r['busy_ms']:.3f} | {top} |")
    write_report("kernel_parts", "gla's kernels with parts taken out", "\n".join(lines), rows, args.out,
                 argv if argv is not None else sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
