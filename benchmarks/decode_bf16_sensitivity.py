"""How far a bf16 decode step's logits sit from the float32 ones, per model: the yardstick for the
"max logit diff" columns of the GPU benchmark (a compiled graph vs the eager model, both bf16).

    python benchmarks/decode_bf16_sensitivity.py [--out DIR] [--blocks simple_gla,gated_deltanet]

Builds the benchmark's decode models (24 layers, d_model 2048, batch 16; ``gpu_kernels.model_spec``)
on the CPU, fills every linear state as ``GraphDecoder.randomize`` does (``0.1 * randn``), runs one
``decode_step`` in float32 and one with the model and activations in bf16 (float32 states, as the
blocks keep them), and prints the largest |logit| and the largest bf16-vs-float32 difference.
A compiled-vs-eager difference of the same size as this one is bf16 rounding, not a bug.
Runs in ~35 s per model on a 2-core CPU (5.5 GB of float32 weights at a time).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_kernels import model_spec  # noqa: E402

from archsearch.model import HybridLM  # noqa: E402


@torch.no_grad()
def sensitivity(block: str, batch: int = 16, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = HybridLM(model_spec(block)).eval()
    token = torch.randint(0, model.spec.vocab_size, (batch,))
    _, shapes = model(token[:, None].repeat(1, 4))  # one short forward: the state layout
    gen = torch.Generator().manual_seed(seed + 1)
    states = [{k: 0.1 * torch.randn(v.shape, generator=gen) for k, v in s.items()} for s in shapes]
    ref, _ = model.decode_step(token, [{k: v.clone() for k, v in s.items()} for s in states])
    model = model.to(torch.bfloat16)
    low = [{k: v.clone() if k == "S" else v.to(torch.bfloat16) for k, v in s.items()} for s in states]
    got, _ = model.decode_step(token, low)
    return {"block": block, "max_abs_logit_fp32": ref.abs().max().item(),
            "max_abs_diff_bf16_vs_fp32": (got.float() - ref).abs().max().item()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="simple_gla,gated_deltanet")
    ap.add_argument("--out", default="", help="folder for decode_bf16_sensitivity.json (default: print only)")
    a = ap.parse_args(argv)
    import blocks

    unknown = sorted(set(filter(None, a.blocks.split(","))) - set(blocks.names()))
    if unknown:
        ap.error(f"--blocks: unknown {unknown}; registered: {', '.join(blocks.names())}")
    rows = []
    for block in filter(None, a.blocks.split(",")):
        t0 = time.time()
        rows.append(sensitivity(block))
        rows[-1]["seconds"] = round(time.time() - t0, 1)
    print("| model (24 layers, d 2048, batch 16) | max abs logit (fp32) | max abs diff, bf16 vs fp32 |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['block']} x24 | {r['max_abs_logit_fp32']:.2f} | {r['max_abs_diff_bf16_vs_fp32']:.2f} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "decode_bf16_sensitivity.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
