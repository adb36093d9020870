"""Launch configurations of the fused decode layer's GEMMs (``blocks.kernels.skinny.CONFIGS``).

Each GEMM of a decode layer as ``archsearch.decode_layer`` runs it, at batch 16 on the benchmark
model's shapes (24 layers, d_model 2048): ``in_proj`` (``skinny.linear``), ``o_proj`` and ``w2``
(``skinny.residual_linear``; with ``--set RESIDUAL_EPILOGUE=False`` ``skinny.partials`` +
``skinny.add_norm``, as the layer follows them), ``swiglu`` (w1|w3 with the SiLU-mul epilogue);
in_proj and swiglu read ``NormedRows`` as the layer hands them (a tensor with the switch off). Every configuration of the grid (BN, BK, split, warps, stages) is checked
against float32 PyTorch, then timed on 24 distinct weights in one CUDA graph (HBM-bound, as in the
model; ``decode_gemm.time_layers``). Results are written after each role, and roles starting
after ``--deadline`` seconds are skipped, so a time limit keeps what was measured.

    python benchmarks/skinny_configs.py [--out DIR] [--roles swiglu,w2,in_proj,o_proj] [--warps 4,8] [--stages 3,4,6]
                                         [--deadline S] [--set PDL=False]

Prints a table (current configuration vs the fastest) and writes ``skinny_configs.{json,md}``.
Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root

from decode_gemm import LAYERS, decode_shapes, time_layers  # noqa: E402 - benchmarks/ is this script's folder
from gpu_common import apply_sets  # noqa: E402

ROLES = {"swiglu": "w13", "w2": "w2", "in_proj": "in_proj", "o_proj": "o_proj"}  # role -> decode_gemm case
SPLIT_ROLES = ("o_proj", "w2")


def grid(role: str, warps=(4,), stages=(4,)) -> list[tuple[int, int, int, int, int]]:
    """(BN, BK, SPLIT_K, num_warps, num_stages) to try for ``role``: splits only where the layer
    sums partials (o_proj, w2: ``residual_linear``'s last split or ``add_norm`` adds them)."""
    splits = (1, 2, 4, 8) if role in SPLIT_ROLES else (1,)
    return list(itertools.product((16, 32, 64, 128), (64, 128, 256), splits, warps, stages))


def role_inputs(role: str, batch: int, layers: int = LAYERS) -> tuple[list[dict], callable, callable]:
    """``layers`` input sets (24: the model's), the call ``f(set)`` as the layer makes it, and its
    float32 reference."""
    from blocks.kernels import skinny

    N, K = decode_shapes()[ROLES[role]]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()

    sets = [{"x": rnd(batch, K), "w": rnd(N, K, scale=K ** -0.5), "r": rnd(batch, N),
             "g": 1 + rnd(N, scale=0.1).float()} for _ in range(layers)]
    epilogue = skinny.RESIDUAL_EPILOGUE
    if epilogue:  # in_proj and swiglu read the norm as the layer hands it: NormedRows from w2 / o_proj
        tiles = skinny.cdiv(K, skinny.CONFIGS["w2" if role == "in_proj" else "o_proj"][0])
        for s in sets:
            s["gb"] = s["g"].bfloat16()
            s["rows"] = skinny.NormedRows(
                s["x"], (torch.rand(tiles, batch, generator=gen, device="cuda") + 0.5) * K / tiles, 1e-6)
    left = (lambda s: s["rows"]) if epilogue else (lambda s: s["x"])
    want_left = (lambda s: s["rows"].materialize().float()) if epilogue else (lambda s: s["x"].float())
    if role == "in_proj":
        return sets, lambda s: skinny.linear(left(s), s["w"], role), lambda s: want_left(s) @ s["w"].float().T
    if role == "swiglu":
        def ref(s):
            a, b = (want_left(s) @ s["w"].float().T).chunk(2, dim=-1)
            return F.silu(a) * b
        return sets, lambda s: skinny.swiglu(left(s), s["w"], role), ref
    if epilogue:  # the residual add in the GEMM, the next norm's operands beside it
        return (sets, lambda s: skinny.residual_linear(s["x"], s["w"], s["r"], s["gb"], 1e-6, role)[0],
                lambda s: s["r"].float() + s["x"].float() @ s["w"].float().T)
    return (sets, lambda s: skinny.add_norm(skinny.partials(s["x"], s["w"], f"{role}_partials"), s["r"], s["g"], 1e-6)[1],
            lambda s: F.rms_norm(s["r"].float() + s["x"].float() @ s["w"].float().T, (N,), s["g"], 1e-6))


def bench_role(role: str, batch: int, warps=(4,), stages=(4,)) -> dict:
    from blocks.kernels import skinny

    sets, call, ref = role_inputs(role, batch)
    want = ref(sets[0])
    table = skinny.CONFIGS
    key = role if role not in SPLIT_ROLES or skinny.RESIDUAL_EPILOGUE else f"{role}_partials"  # the layer's
    current = table[key]
    rows = []
    for cfg in dict.fromkeys([current, *grid(role, warps, stages)]):
        table[key] = cfg
        row = {"config": list(cfg), "current": cfg == current}
        try:
            got = call(sets[0]).float()
            err = ((got - want).norm() / want.norm()).item()
            if err > 2e-2:
                row["error"] = f"relative error {err:.2e} against float32"
            else:
                row["us"] = time_layers(call, sets) * 1e6
        except Exception as exc:  # noqa: BLE001 - a configuration the compiler or GPU refuses: report, go on
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        rows.append(row)
    table[key] = current
    return {"shape": decode_shapes()[ROLES[role]], "config_key": key, "rows": rows}


def markdown(res: dict) -> str:
    lines = [f"# Fused decode layer GEMMs: launch configurations (batch {res['batch']})", "",
             f"{res['device']}, {res['when']}; us per call over {LAYERS} distinct weights in one CUDA graph "
             + ("(o_proj and w2 with their residual add and norm; in_proj and swiglu reading the norm as the layer "
                "hands it). " if res.get("residual_epilogue", True) else "(o_proj and w2 with their add_norm). ")
             + "`python benchmarks/skinny_configs.py"
             + "".join(f" --set {k}={v}" for k, v in res.get("set", {}).items()) + "`", "",
             "| role (N x K) | current (BN, BK, split, warps, stages) | us | fastest | us | current / fastest | failed |",
             "|---|---|---|---|---|---|---|"]
    for role, r in res["roles"].items():
        timed = [x for x in r["rows"] if "us" in x]
        cur = next((x for x in r["rows"] if x["current"]), {})
        best = min(timed, key=lambda x: x["us"]) if timed else {}
        ratio = f"{cur['us'] / best['us']:.3f}" if "us" in cur and best else "-"
        lines.append(f"| {role} ({r['shape'][0]} x {r['shape'][1]}) | {tuple(cur.get('config', ()))} | "
                     f"{cur.get('us', float('nan')):.2f} | {tuple(best.get('config', ()))} | "
                     f"{best.get('us', float('nan')):.2f} | {ratio} | {len(r['rows']) - len(timed)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for skinny_configs.{json,md}")
    ap.add_argument("--roles", default=",".join(ROLES), help=f"comma list of {', '.join(ROLES)}")
    ap.add_argument("--batch", type=int, default=16, help="decode batch (1..16)")
    ap.add_argument("--warps", default="4", help="comma list of num_warps to try")
    ap.add_argument("--stages", default="4", help="comma list of num_stages to try")
    ap.add_argument("--deadline", type=float, default=0.0, help="skip roles that would start after this many s")
    ap.add_argument("--set", default="", help="kernel module switches to sweep under, as gpu_kernels.py --set "
                    "(e.g. PDL=False; recorded in the JSON)")
    opts = ap.parse_args(argv)
    roles = [r for r in opts.roles.split(",") if r]
    if not roles or set(roles) - set(ROLES):
        ap.error(f"--roles: a comma list of {', '.join(ROLES)}, got {opts.roles!r}")
    if not 1 <= opts.batch <= 16:
        ap.error(f"--batch: must be 1..16, got {opts.batch}")
    try:
        warps, stages = (tuple(int(v) for v in x.split(",") if v) for x in (opts.warps, opts.stages))
    except ValueError:
        ap.error(f"--warps / --stages: comma lists of integers, got {opts.warps!r} / {opts.stages!r}")
    try:
        sets = apply_sets(opts.set)
    except ValueError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("skinny_configs: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    from blocks.kernels import skinny

    res = {"device": torch.cuda.get_device_name(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "batch": opts.batch, "set": sets, "residual_epilogue": skinny.RESIDUAL_EPILOGUE, "roles": {}}
    started = time.time()
    for role in roles:
        if opts.deadline and time.time() - started > opts.deadline:
            print(f"{role}: skipped, past the {opts.deadline:.0f} s deadline", flush=True)
            continue
        t0 = time.time()
        res["roles"][role] = bench_role(role, opts.batch, warps, stages)
        print(f"{role}: {len(res['roles'][role]['rows'])} configurations [{time.time() - t0:.0f} s]", flush=True)
        if opts.out is not None:
            opts.out.mkdir(parents=True, exist_ok=True)
            (opts.out / "skinny_configs.json").write_text(json.dumps(res, indent=1))
            (opts.out / "skinny_configs.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
