"""The decode layer's GEMMs reading row-major weights against tile-major copies (``skinny.pack``).

A row-major ``[N, K]`` weight gives each ``[BN, BK]`` tile of a skinny GEMM as BN strided pieces
of ``BK`` elements (256 B at BK 128 in bf16); ``skinny.pack`` stores every tile as one contiguous
block. Each GEMM of a decode layer at its ``skinny.CONFIGS`` entry, batch 16, the benchmark
model's shapes (as ``skinny_configs.py`` calls them: in_proj and w1|w3 on a norm's rows, o_proj and
w2 with their residual epilogue), both layouts checked against float32 PyTorch, then timed on 24
distinct weights in one CUDA graph (``decode_gemm.time_layers``), the two layouts alternating over
``--rounds`` passes.

    python benchmarks/skinny_packed.py [--out DIR] [--roles swiglu,w2,in_proj,o_proj] [--rounds 3] [--set ...]

Prints a table and writes ``skinny_packed.{json,md}``. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root

from decode_gemm import LAYERS, decode_shapes, time_layers  # noqa: E402 - benchmarks/ is this script's folder
from gpu_common import apply_sets  # noqa: E402
from skinny_configs import ROLES, SPLIT_ROLES, role_inputs  # noqa: E402


def bench_role(role: str, rounds: int, batch: int = 16) -> dict:
    """``{"shape", "config", "row_major": {"us": [...]}, "packed": {...}}`` (an ``error`` instead of
    ``us`` where a layout's result is off float32 by more than 2e-2 or the launch fails)."""
    from blocks.kernels import skinny

    sets, call, ref = role_inputs(role, batch)
    key = role if role not in SPLIT_ROLES or skinny.RESIDUAL_EPILOGUE else f"{role}_partials"
    halves = 2 if role == "swiglu" else 1
    packed_sets = [dict(s, w=skinny.pack(s["w"], key, halves)) for s in sets]
    layouts = {"row_major": sets, "packed": packed_sets}
    out = {"shape": decode_shapes()[ROLES[role]], "config": list(skinny.CONFIGS[key]), "config_key": key}
    want = ref(sets[0])
    for name, s in layouts.items():
        try:
            got = call(s[0]).float()
            err = ((got - want).norm() / want.norm()).item()
            out[name] = {"us": []} if err <= 2e-2 else {"error": f"relative error {err:.2e} against float32"}
        except Exception as exc:  # noqa: BLE001 - report the layout, time the other
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    for _ in range(rounds):
        for name, s in layouts.items():
            if "us" in out[name]:
                out[name]["us"].append(time_layers(call, s) * 1e6)
    for name in layouts:
        if out[name].get("us"):
            out[name]["median_us"] = statistics.median(out[name]["us"])
    return out


def markdown(res: dict) -> str:
    lines = [f"# Decode GEMMs: row-major against tile-major (packed) weights (batch {res['batch']})", "",
             f"{res['device']}, {res['when']}; us per call over {LAYERS} distinct weights in one CUDA graph, median of "
             f"{res['rounds']} alternating passes (each pass's figures in the JSON). `python benchmarks/skinny_packed.py"
             + "".join(f" --set {k}={v}" for k, v in res.get("set", {}).items()) + "`", "",
             "| role (N x K) | config (BN, BK, split, warps, stages) | row-major us | packed us | packed / row-major |",
             "|---|---|---|---|---|"]
    for role, r in res["roles"].items():
        a, b = (r[n].get("median_us") for n in ("row_major", "packed"))
        cells = [f"{v:.2f}" if v else r[n].get("error", "-") for v, n in ((a, "row_major"), (b, "packed"))]
        lines.append(f"| {role} ({r['shape'][0]} x {r['shape'][1]}) | {tuple(r['config'])} | {cells[0]} | {cells[1]} | "
                     f"{f'{b / a:.3f}' if a and b else '-'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for skinny_packed.{json,md}")
    ap.add_argument("--roles", default=",".join(ROLES), help=f"comma list of {', '.join(ROLES)}")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing passes per role")
    ap.add_argument("--set", default="", help="kernel module switches, as gpu_kernels.py --set (e.g. PDL=False)")
    opts = ap.parse_args(argv)
    roles = [r for r in opts.roles.split(",") if r]
    if not roles or set(roles) - set(ROLES):
        ap.error(f"--roles: a comma list of {', '.join(ROLES)}, got {opts.roles!r}")
    if opts.rounds < 1:
        ap.error(f"--rounds: must be >= 1, got {opts.rounds}")
    try:
        sets = apply_sets(opts.set)
    except ValueError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("skinny_packed: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    res = {"device": torch.cuda.get_device_name(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "batch": 16, "rounds": opts.rounds, "set": sets, "roles": {}}
    for role in roles:
        res["roles"][role] = bench_role(role, opts.rounds)
        if opts.out is not None:
            opts.out.mkdir(parents=True, exist_ok=True)
            (opts.out / "skinny_packed.json").write_text(json.dumps(res, indent=1))
            (opts.out / "skinny_packed.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
