"""How closely do the forms of every op agree? The worst relative error per family, forward and backward.

For each family, over several random seeds, shapes (T not a multiple of the chunk size included),
with and without an initial state and, for the gated families, random / strong / no decay, this
runs ``recurrent`` (the reference loop), ``chunk`` and ``step`` (applied T times) in float32 through
``blocks.ops.agreement`` and reports the worst ``||a - b|| / ||b||`` against the reference:
forward over ``o`` and the final state, backward over the gradients of every input (q, k, v, the
gates, beta, the initial state).

    python benchmarks/ops_agreement.py [--seeds 5] [--out agreement.json] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from blocks.ops import agreement
from blocks.ops.agreement import FAMILIES, Case

# (B, T, H, K, V, chunk_size)
SHAPES = [
    (2, 1, 2, 8, 8, 16),
    (2, 7, 2, 16, 16, 16),
    (2, 100, 3, 16, 32, 16),
    (1, 256, 2, 32, 32, 64),
    (1, 300, 2, 64, 64, 64),
]
GATED = ("simple_gla", "gla", "gated_delta_rule")


def cases(family: str, seeds: int) -> list[Case]:
    out = []
    for seed in range(seeds):
        for B, T, H, K, V, cs in SHAPES:
            common = dict(B=B, H=H, K=K, V=V, seed=seed, initial_state=(seed + T) % 2 == 0)
            if family == "softmax":
                out.append(Case(family, T, kv_heads=H if seed % 2 else 1, window=(0, 16, 64)[seed % 3],
                                state_len=5 + seed, **common))
            else:
                for decay in ("random", "strong", "none") if family in GATED else ("random",):
                    out.append(Case(family, T, chunk_size=cs, decay=decay, **common))
    return out


def measure(family: str, seeds: int, device: str) -> dict:
    worst: dict[str, dict] = {}
    t0 = time.perf_counter()
    family_cases = cases(family, seeds)
    for case in family_cases:
        for form, errors in agreement.compare(case, ("chunk", "step"), device=device).items():
            for name, err in errors.items():
                direction = "backward" if name.startswith("grad.") else "forward"
                slot = worst.get(f"{form}_{direction}")
                if slot is None or not err <= slot["error"]:  # NaN counts as worst
                    worst[f"{form}_{direction}"] = {"error": err, "tensor": name, "case": _describe(case)}
    return {"cases": len(family_cases), "seconds": round(time.perf_counter() - t0, 2), "worst": worst}


def _describe(case: Case) -> str:
    s = f"B{case.B} T{case.T} H{case.H} K{case.K} V{case.V} seed{case.seed}"
    s += " h0" if case.initial_state else ""
    if case.family == "softmax":
        s += f" kv_heads{case.kv_heads} window{case.window}"
    else:
        s += f" C{case.chunk_size} decay={case.decay}"
    return s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="random seeds per shape (default 5)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--device", default="cpu", help="device of chunk/step (the reference runs there too)")
    parser.add_argument("--out", help="write the table and the worst cases as JSON here")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds: must be >= 1, got {args.seeds}")

    results = {fam: measure(fam, args.seeds, args.device) for fam in args.families}

    table = Table(title=f"worst ||a - b|| / ||b|| vs recurrent, float32, {args.seeds} seeds x {len(SHAPES)} shapes")
    for col in ("family", "cases", "chunk fwd", "chunk bwd", "step fwd", "step bwd"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for fam, res in results.items():
        w = res["worst"]
        table.add_row(fam, str(res["cases"]), *(f"{w[k]['error']:.1e}" for k in
                                                ("chunk_forward", "chunk_backward", "step_forward", "step_backward")))
    Console().print(table)

    if args.out:
        payload = {
            "metric": "max over cases of ||a - b|| / ||b||, b = recurrent (float32); forward: o and final "
                      "state; backward: gradients of every input",
            "seeds": args.seeds,
            "shapes": [dict(zip(("B", "T", "H", "K", "V", "chunk_size"), s)) for s in SHAPES],
            "device": args.device,
            "torch": torch.__version__,
            "platform": platform.platform(),
            "families": results,
        }
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
