"""Where a kernel's time goes, by taking parts out: a family's training step per kernel (device ms
summed by ``torch.profiler``, ``gpu_kernels.kernel_breakdown``) with edited copies of a kernel
module's kernels swapped in, one variant after another in one process; or an older commit's
module registered in its place (``old`` for ``gla.py``, ``old_delta`` for ``delta.py``). Edits of
``blocks/kernels/gla.py`` time gla; edits of ``delta.py`` (named ``delta_*``, ``dqkwg_*``, ``wy_*``,
``solve_*``) time gated_delta_rule, or the families of ``--families``.

    python benchmarks/kernel_parts.py --variants base,no_dv,dv_only,no_epilogue,no_cumsum,fwd_no_scores \\
        [--old e19e623] [--set "LAUNCH.bwd_chunk.num_warps=8,BWD_CHUNK_BK=128"] [--lengths 2048] [--out DIR]
    python benchmarks/kernel_parts.py --variants delta_base,dqkwg_no_hdh,dqkwg_no_dg,solve_no_diag [--families delta_rule,gated_delta_rule]
    python benchmarks/kernel_parts.py --check     # every edit still applies to its module (no GPU)

An edited kernel computes wrong results, on purpose: its time says what the part it lost cost in
that kernel, not what a correct kernel could save. Each edit names the source lines it replaces;
one whose lines are gone from its module is an error (``--check``, also a CPU test), so the edits
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
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))  # the project root, for blocks

KERNELS = ROOT / "blocks" / "kernels"
GLA = KERNELS / "gla.py"
DELTA = KERNELS / "delta.py"


class Module(NamedTuple):
    """A kernel module the edits act on: its file, the registrations an edited copy leaves out (so
    that today's ops stay registered), and the families timed by default."""
    path: Path
    registrations: tuple[tuple[str, str], ...]  # (family, the registered function's name)
    families: tuple[str, ...]

    def decorators(self) -> list[str]:
        return [f'@register_kernel("{family}", "chunk")\n' for family, _ in self.registrations]


MODULES = {
    "gla": Module(GLA, (("gla", "gla_chunk"),), ("gla",)),
    "delta": Module(DELTA, (("delta_rule", "delta_rule_chunk"), ("gated_delta_rule", "gated_delta_rule_chunk")),
                    ("gated_delta_rule",)),
}
OLD = {"old": "gla", "old_delta": "delta"}  # the --old commit's module, by variant name


class Edit(NamedTuple):
    what: str
    apply: Callable[[str], str]
    items: str = ""  # train_ab.py items this variant runs with
    module: str = "gla"


def _replace(src: str, old: str, new: str) -> str:
    if old not in src:
        raise ValueError(f"no longer applies: {old.strip().splitlines()[0]!r} is not in the module")
    return src.replace(old, new, 1)


def _cut(src: str, start: str, end: str, new: str) -> str:
    """``src`` with the lines from ``start`` up to (not including) ``end`` replaced by ``new``."""
    if start not in src or end not in src[src.index(start):]:
        raise ValueError(f"no longer applies: {start.strip().splitlines()[0]!r} .. {end.strip()!r} not in the module")
    a = src.index(start)
    return src[:a] + new + src[src.index(end, a):]


# name -> Edit(what it takes out, edit of the module's source[, train_ab.py items][, module]).
# The replacements keep each kernel's other results live (stores of sums), so that the compiler does
# not drop more than the named part.
OLD_DV_LAYOUT = "BWD_DV_SEPARATE=False,KEEP_A=False"  # dv inside _bwd_chunk_kernel, from A formed again
EDITS = {
    "base": Edit("nothing (the kernels as they are, built the same way as the edits)", lambda s: s),
    "base_old_dv": Edit("nothing, on the layout the dv edits need (their reference)", lambda s: s, OLD_DV_LAYOUT),
    "no_dv": Edit("_bwd_chunk_kernel's dv (its factored A^T and the state write's term)",
                  lambda s: _replace(s, "    if WITH_DV:\n        _dv_blocks(", "    if False:\n        _dv_blocks("),
                  OLD_DV_LAYOUT),
    "dv_only": Edit("_bwd_chunk_kernel's dq, dk and gate part (value loop and epilogue)",
                    lambda s: _replace(s, "    if not steep:\n        c0 = i_k * BK", "    if False:\n        c0 = i_k * BK"),
                    OLD_DV_LAYOUT),
    "no_epilogue": Edit("_bwd_chunk_kernel's epilogue: dq, dk and the gate from the accumulators",
                        lambda s: _cut(s, "        b_dA = b_dA * scale\n", "        _store(dg, b_dg",
                                       "        b_dg = b_dq + b_dk + b_hdh[None, :]\n"
                                       "        tl.store(dq + i_bh, tl.sum(tl.sum(b_dA, axis=1), axis=0))\n")),
    "no_cumsum": Edit("_bwd_chunk_kernel's reverse cumsum of the gate's row terms (on both BWD_CHUNK_ONE_TOTAL paths)",
                      lambda s: _replace(_replace(s, "b_dg = b_tot[None, :] - tl.cumsum(b_dG, axis=0) + b_dG",
                                                  "b_dg = b_tot[None, :] + b_dG"),
                                         "b_dg = tl.sum(b_dG, axis=0)[None, :] - tl.cumsum(b_dG, axis=0) + b_dG + b_P[None, :]",
                                         "b_dg = b_dG + b_P[None, :]")),
    "fwd_no_scores": Edit("_fwd_o_kernel's factored scores (A stays zero)",
                          lambda s: _replace(s, "            b_A += tl.dot(_op(b_qe, q, LOWP), tl.trans(b_kf)",
                                             "            b_kf = tl.dot(_op(b_qe, q, LOWP), tl.trans(b_kf)")),  # unused: dropped
    # delta.py (the gated rule's kernels unless --families says otherwise)
    "delta_base": Edit("nothing (delta.py's kernels as they are, built the same way as the edits)", lambda s: s,
                       module="delta"),
    "dqkwg_no_hdh": Edit("_bwd_dqkwg_kernel's sum(h * dh) over the value loop (the gate's state term)",
                         lambda s: _replace(s, "            b_hdh += tl.sum(b_hT.to(tl.float32) * b_dhT.to(tl.float32), 0)",
                                            "            b_hdh += 0."), module="delta"),
    "dqkwg_no_decay": Edit("_bwd_dqkwg_kernel's pair decay of ds (ds = dP scale)",
                           lambda s: _cut(s, "        if DG_FROM_ROWS and DS_UNMASKED:",
                                          "        # Terms whose exponent is G_x - G_x",
                                          "        b_ds = tl.where(m_ij, b_dP * scale, 0.)\n"), module="delta"),
    "dqkwg_no_dg": Edit("_bwd_dqkwg_kernel's gate gradient (the row sums, the diagonal, the last row's terms); "
                        "dq, dk keep their ds dots",
                        lambda s: _cut(s, "        last = tl.minimum(i_t * BT + BT, T) - 1\n        b_kdk",
                                       "        tl.store(_seq(dG, i_k * B + i_b, i_h, T, H) + o_t * H, b_dg, mask=m_t)",
                                       "        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=DOT_PREC)\n"
                                       "        b_dk += tl.dot(tl.trans(b_ds).to(b_q.dtype), b_q, input_precision=DOT_PREC)\n"
                                       "        b_dg = tl.sum(b_hdh, 0) + g_last + tl.zeros([BT], dtype=tl.float32)\n"),
                        module="delta"),
    "wy_no_decay": Edit("_wy_bwd_kernel's pair decay of dA",
                        lambda s: _replace(s, "    if USE_G:\n        b_dA = b_dA * _pair_decay(",
                                           "    if False:\n        b_dA = b_dA * _pair_decay("), module="delta"),
    "wy_no_dg": Edit("_wy_bwd_kernel's sum of the key slices' dG and its reverse cumsum (the row terms stored)",
                     lambda s: _replace(s, "        _wy_bwd_dg(b_rdg, dG_in, dg, i_b, i_h, o_t, T, B, H, NK_G)",
                                        "        tl.store(dg + (i_b * T + o_t) * H + i_h, b_rdg, mask=o_t < T)"), module="delta"),
    "wy_no_rowsums": Edit("_wy_bwd_kernel's row sums of its second pass (k . dXw, k . P, k . Q: dbeta's and the gate's "
                          "terms through w and A; on both WY_BWD_ROWSUMS_COMBINED paths)",
                          lambda s: _replace(_replace(s, "            b_db += tl.sum(b_kf * (b_P + b_dXw * b_eg[:, None]), 1)\n"
                                                         "            if USE_G:\n                b_dG += tl.sum(b_kf * (b_upd - b_Q), 1)\n", ""),
                                             "            b_kdXw += tl.sum(b_kf * b_dXw, 1)\n            b_kP += tl.sum(b_kf * b_P, 1)\n"
                                             "            b_kQ += tl.sum(b_kf * b_Q, 1)\n", ""), module="delta"),
    "wy_no_db": Edit("_wy_bwd_kernel's row sum v . dXu of its first pass (dbeta's term through u)",
                     lambda s: _replace(s, "        b_db += tl.sum(b_vf * b_dXu, 1)\n", ""), module="delta"),
    "solve_no_diag": Edit("_solve_tril_kernel's diagonal-block inverses (their forward substitution's steps)",
                          lambda s: _replace(s, "    for i in tl.static_range(1, BC):\n        b_a = tl.load(p_a + i * (H * BT)",
                                             "    for i in tl.static_range(1, 2):\n        b_a = tl.load(p_a + i * (H * BT)"),
                          module="delta"),
    "solve_no_squaring": Edit("_solve_tril_kernel's diagonal-block inverses by repeated squaring (I - A instead of six "
                              "exact dots each; SOLVE_TRIL_DIAG_SUBST off)",
                              lambda s: _cut(s, "    o = tl.arange(0, BC)\n    eye = (o[:, None] == o[None, :]).to(tl.float32)\n    n1 = -b_A",
                                             "\n\n\n@triton.jit\ndef _inv_diag_blocks(",
                                             "    o = tl.arange(0, BC)\n    return (o[:, None] == o[None, :]).to(tl.float32) - b_A"),
                              "SOLVE_TRIL_DIAG_SUBST=False", module="delta"),
    "solve_no_merge": Edit("_solve_tril_kernel's off-diagonal blocks (their TF32 merge dots)",
                           lambda s: _cut(s, "    T10 = -tl.dot(T11, tl.dot(A10, T00", "    _store_block(Ai, T00, i_b",
                                          "    T10 = A10 + A20 + A21 + A30 + A31 + A32\n    T21 = T10\n    T32 = T10\n"
                                          "    T20 = T10\n    T31 = T10\n    T30 = T10\n"),
                           module="delta"),
}


def own_items(name: str) -> str:
    """The ``train_ab.py`` items variant ``name`` runs with on top of ``--set`` ("" for none)."""
    return EDITS[name].items if name in EDITS else ""


def module_of(name: str) -> str:
    """``"gla"`` or ``"delta"``: the kernel module variant ``name`` edits (or, for an old one, replaces)."""
    return OLD[name] if name in OLD else EDITS[name].module


def edited_source(name: str, src: str | None = None) -> str:
    """The variant's module source with edit ``name`` applied and its kernel registrations left out."""
    mod = MODULES[module_of(name)]
    src = mod.path.read_text() if src is None else src
    out = EDITS[name].apply(src)
    for decorator in mod.decorators():
        out = out.replace(decorator, "", 1)
    return out


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


def kernel_names(mod: types.ModuleType) -> list[str]:
    """The module's kernels (``*_kernel`` globals), the names the launch code looks up at each call:
    an edited module's kernels are swapped in under them."""
    from triton.runtime.jit import KernelInterface  # JITFunction, or the interpreter's InterpretedFunction

    return [n for n, v in vars(mod).items() if n.endswith("_kernel") and isinstance(v, KernelInterface)]


def check() -> list[str]:
    """Apply every edit to its current module; the names that no longer apply, with why."""
    bad = []
    for name in EDITS:
        try:
            edited_source(name)
        except ValueError as e:
            bad.append(f"{name}: {e}")
    return bad


def breakdown(families: tuple[str, ...], lengths: list[int]) -> dict:
    """``{family: {T: {"busy_ms", "kernels_ms"}}}`` of the kernels registered now."""
    import gpu_kernels

    return gpu_kernels.kernel_breakdown(families=families, lengths=tuple(lengths))


def main(argv: list[str] | None = None) -> int:
    from gpu_common import checked_families, checked_lengths, write_report

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="base," + ",".join(n for n in EDITS if n != "base" and EDITS[n].module == "gla"),
                    help=f"comma list of {', '.join(EDITS)}, and 'old' / 'old_delta' (the --old commit's gla.py / delta.py)")
    ap.add_argument("--old", default="", help="a git revision whose kernel module the 'old' / 'old_delta' variant runs")
    ap.add_argument("--set", default="", help="train_ab.py items applied to every variant")
    ap.add_argument("--families", default="", help="families timed for the delta.py variants (default gated_delta_rule)")
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--out", default="", help="folder for kernel_parts.{json,md} (default: print only)")
    ap.add_argument("--check", action="store_true", help="only check that every edit applies (no GPU)")
    args = ap.parse_args(argv)
    if args.check:
        bad = check()
        for line in bad:
            print(line, file=sys.stderr)
        print(f"{len(EDITS) - len(bad)} of {len(EDITS)} edits apply to {', '.join(m.path.name for m in MODULES.values())}")
        return 1 if bad else 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in EDITS and v not in OLD]
    if not variants or unknown:
        ap.error(f"--variants: unknown {unknown or 'empty list'}; choose from {', '.join(EDITS)}, {', '.join(OLD)}")
    if any(v in OLD for v in variants) and not args.old:
        ap.error("--variants: 'old' / 'old_delta' need --old REV")
    lengths = checked_lengths(ap, args.lengths)
    families = {"gla": MODULES["gla"].families,
                "delta": tuple(checked_families(ap, args.families)) if args.families else MODULES["delta"].families}
    if any(f not in ("delta_rule", "gated_delta_rule") for f in families["delta"]):
        ap.error("--families: delta.py's variants time delta_rule and gated_delta_rule only")
    bad = check()
    if bad:
        ap.error("; ".join(bad))
    import train_ab

    sets = args.set or "-"
    try:
        for item in ([] if sets == "-" else sets.split(",")):
            for family in {f for v in variants for f in families[module_of(v)]}:
                train_ab.parsed(family, item)
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
    import importlib

    from blocks.kernels import register_kernel

    rows = []
    for name in variants:
        spec = MODULES[module_of(name)]
        live = importlib.import_module(f"blocks.kernels.{spec.path.stem}")
        kept = {n: getattr(live, n) for n in kernel_names(live)}
        fams = families[module_of(name)]
        # the --set items, then the variant's own, undone after each variant (on the first family's
        # module: the delta rules share one)
        with train_ab.applied(fams[0], sets), train_ab.applied(fams[0], own_items(name) or "-"):
            try:
                if name in OLD:
                    old_src = subprocess.run(["git", "show", f"{args.old}:blocks/kernels/{spec.path.name}"], cwd=ROOT,
                                             capture_output=True, text=True, check=True).stdout
                    build(name, old_src)  # registers its chunk functions in place of today's
                else:
                    mod = build(name, edited_source(name))
                    for n in kernel_names(live):
                        setattr(live, n, getattr(mod, n))
                for family, by_T in breakdown(fams, lengths).items():
                    for T, r in by_T.items():
                        rows.append({"variant": name, "family": family, "T": int(T), "busy_ms": r["busy_ms"],
                                     "kernels_ms": r["kernels_ms"]})
            finally:
                for n, fn in kept.items():
                    setattr(live, n, fn)
                for family, fn_name in spec.registrations:
                    register_kernel(family, "chunk")(getattr(live, fn_name))
    lines = ["| variant | takes out | family | T | busy ms | largest kernels (ms) |", "|---|---|---|---|---|---|"]
    for r in rows:
        what = EDITS[r["variant"]].what if r["variant"] in EDITS else f"{module_of(r['variant'])}.py of {args.old}"
        if own_items(r["variant"]):
            what += f" (with {own_items(r['variant'])})"
        top = ", ".join(f"{k.strip('_')} {v:.3f}" for k, v in list(r["kernels_ms"].items())[:6])
        lines.append(f"| {r['variant']} | {what} | {r['family']} | {r['T']} | {r['busy_ms']:.3f} | {top} |")
    write_report("kernel_parts", "kernels with parts taken out", "\n".join(lines), rows, args.out,
                 argv if argv is not None else sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
