"""A/B of the chunk kernels for ``gla`` and the delta rules on one GPU: the default registered
kernels (``blocks.kernels.gla`` / ``blocks.kernels.delta``) against the alternative ones
(``blocks.kernels.gla_subchunk`` / ``blocks.kernels.delta_rule``), training throughput (forward +
backward) in the problem of ``benchmarks/gpu_kernels.py`` (bf16, 16 heads of dim 128, 64k tokens per
batch, lengths 512 .. 32k), and how far the two outputs and gradients are apart.

    python benchmarks/ab_gla_delta.py [--out DIR] [--lengths 512,2048,32768] [--families gla]

Prints a markdown table (Mtok/s per implementation, speed-up of the alternative, max relative
difference of o and of the input gradients between the two); with --out also writes
``ab_gla_delta.json``. To run the whole benchmark or the GPU tests through the alternative kernels
instead, set ``ARCHSEARCH_ALT_KERNELS=1``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

from gpu_common import LENGTHS, TOKENS, cuda_time, fwd_bwd, positional, train_inputs  # noqa: E402

import blocks.kernels as kernels  # noqa: E402

FAMILIES = ("gla", "delta_rule", "gated_delta_rule")
TARGET_MTOK = 15.0


def implementations(family: str) -> dict:
    if os.environ.get("ARCHSEARCH_ALT_KERNELS") == "1":
        raise SystemExit("unset ARCHSEARCH_ALT_KERNELS: this script compares the default kernels to the alternative ones")
    default = kernels.get_kernel(family, "chunk")
    if family == "gla":
        from blocks.kernels import gla_subchunk

        alt = gla_subchunk.gla_chunk
    else:
        from blocks.kernels import delta_rule

        alt = delta_rule.delta_rule_chunk if family == "delta_rule" else delta_rule.gated_delta_rule_chunk
    return {"default": default, "alt": alt}


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(family: str, impls: dict, T: int) -> float:
    """Largest relative difference between the two implementations over o and every gradient."""
    args = train_inputs(family, max(1, min(4, TOKENS // T)), T)
    pos = positional(family, args)
    res = {}
    for name, fn in impls.items():
        o, _ = fn(*pos)
        do = torch.randn(o.shape, generator=torch.Generator(device="cuda").manual_seed(1), device="cuda",
                         dtype=o.dtype)
        res[name] = [o.detach()] + list(torch.autograd.grad(o, pos, do))
    return max(max_rel(a.float(), b.float()) for a, b in zip(res["alt"], res["default"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--families", default=",".join(FAMILIES))
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    lengths = [int(x) for x in opts.lengths.split(",")]
    results: dict = {"device": torch.cuda.get_device_name(), "tokens": TOKENS, "rows": []}
    for family in opts.families.split(","):
        impls = implementations(family)
        if impls["default"] is None:
            print(f"{family}: no default kernel registered; timing the alternative alone", flush=True)
            impls.pop("default")
        for T in lengths:
            B = TOKENS // T
            row = {"family": family, "T": T}
            for name, fn in impls.items():
                try:
                    args = train_inputs(family, B, T)
                    pos = positional(family, args)
                    sec, iters = cuda_time(fwd_bwd(lambda: fn(*pos)[0], pos))
                    row[name] = TOKENS / sec / 1e6
                except Exception as exc:  # noqa: BLE001 - record and go on: one failure must not end the run
                    row[name] = None
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                finally:
                    torch.cuda.empty_cache()
            if "default" in impls and row.get("alt") and row.get("default"):
                try:
                    row["max_rel_diff"] = compare(family, impls, T)
                except Exception as exc:  # noqa: BLE001
                    row["max_rel_diff_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            results["rows"].append(row)
            print(f"[{time.strftime('%H:%M:%S')}] {row}", flush=True)
    lines = [f"A/B on {results['device']}, bf16, H=16, D=128, {TOKENS} tokens per batch, fwd+bwd (Mtok/s; "
             f"target {TARGET_MTOK})", "",
             "| family | T | default | alt | alt/default | max rel diff |", "|---|---|---|---|---|---|"]
    for r in results["rows"]:
        d, a = r.get("default"), r.get("alt")
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        ratio = f"{a / d:.2f}" if a and d else "-"
        diff = f"{r['max_rel_diff']:.1e}" if "max_rel_diff" in r else "-"
        lines.append(f"| {r['family']} | {r['T']} | {fmt(d)} | {fmt(a)} | {ratio} | {diff} |")
    table = "\n".join(lines)
    if opts.out:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "ab_gla_delta.json").write_text(json.dumps(results, indent=2))
    print(table)


if __name__ == "__main__":
    main()
