"""How accurate is the gated delta rule's gate gradient pair term for each way of forming it? A CPU
emulation of the term ``blocks.kernels.delta._bwd_dqkwg_kernel`` adds to the chunk-local ``dG``:

    M = ds * (q k^T)   (strictly lower pairs, ds = dP * exp(G_i - G_j))      [BT, BT]
    pair_i = sum_j M_ij - sum_j M_ji        then a reverse cumsum inside the chunk

* ``float32 sums`` (the kernel's): ``q k^T`` from 16-bit q, k accumulated in float32, ``ds`` float32;
* ``bf16 ds dots``: ``q . (ds k) - k . (ds^T q)`` with ``ds`` rounded once to bf16 for two
  tensor-core dots (what reusing the dq / dk dots would give);
* ``split bf16 ds dots``: the same with ``ds`` as a bf16 high part plus a bf16 remainder (four dots).

    python benchmarks/dg_pair_precision.py [--out DIR] [--draws N]

Prints a markdown table (largest error of the reverse-cumsummed term relative to its largest entry,
worst of ``--draws`` chunks per decay strength; unit-norm bf16 q and k, dP standard normal) and
writes ``dg_pair_precision.json`` to ``--out``. Why it exists: the dot forms have no ``q k^T`` tile
and no cross-warp column sum, but Triton's interpreter computes in float32, so the kernels' CPU
tests cannot show what bf16 operands cost; the GPU tests only can.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

BT, K = 64, 64
STRENGTHS = (0.0, 0.1, 1.0, 5.0)  # log decay per step drawn from -strength * U(0, 1)


def pair_term_forms(q: torch.Tensor, k: torch.Tensor, ds: torch.Tensor) -> dict[str, torch.Tensor]:
    """The pair term ``[BT]`` (float64 out) of bf16-valued ``q, k: [BT, K]`` and strictly lower
    ``ds: [BT, BT]`` (float64), each form as the kernel would round it."""
    M = ds.float() * (q.float() @ k.float().T)
    hi = ds.float().bfloat16().double()
    lo = (ds.float() - hi.float()).bfloat16().double()

    def dots(parts: list[torch.Tensor]) -> torch.Tensor:  # float32 accumulation of exact products
        dq = sum(p @ k for p in parts)
        dk = sum(p.T @ q for p in parts)
        return ((q * dq).sum(1) - (k * dk).sum(1)).float().double()

    return {"float32 sums": (M.sum(1) - M.sum(0)).double(), "bf16 ds dots": dots([hi]),
            "split bf16 ds dots": dots([hi, lo])}


def worst_errors(strength: float, draws: int, gen: torch.Generator) -> dict[str, float]:
    """Each form's worst relative error over ``draws`` random chunks at one decay strength."""
    worst: dict[str, float] = {}
    strict = torch.tril(torch.ones(BT, BT, dtype=torch.bool), -1)
    rev_cumsum = lambda x: x.flip(0).cumsum(0).flip(0)  # noqa: E731
    for _ in range(draws):
        unit = lambda: torch.nn.functional.normalize(torch.randn(BT, K, generator=gen, dtype=torch.float64), dim=-1)  # noqa: E731
        q, k = unit().bfloat16().double(), unit().bfloat16().double()
        G = torch.cumsum(-strength * torch.rand(BT, generator=gen, dtype=torch.float64), 0)
        ds = torch.where(strict, torch.randn(BT, BT, generator=gen, dtype=torch.float64)
                         * torch.exp(G[:, None] - G[None, :]), 0.)
        M = ds * (q @ k.T)
        truth = rev_cumsum(M.sum(1) - M.sum(0))
        for name, term in pair_term_forms(q, k, ds).items():
            err = ((rev_cumsum(term) - truth).abs().max() / truth.abs().max()).item()
            worst[name] = max(worst.get(name, 0.0), err)
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for dg_pair_precision.json")
    ap.add_argument("--draws", type=int, default=200, help="random chunks per decay strength")
    opts = ap.parse_args()
    if opts.draws < 1:
        ap.error(f"--draws: must be >= 1, got {opts.draws}")
    gen = torch.Generator().manual_seed(0)
    rows = {s: worst_errors(s, opts.draws, gen) for s in STRENGTHS}
    names = list(next(iter(rows.values())))
    print("| decay per step | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for s, errs in rows.items():
        print(f"| {s} | " + " | ".join(f"{errs[n]:.1e}" for n in names) + " |")
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "dg_pair_precision.json").write_text(json.dumps(
            {"draws": opts.draws, "block": [BT, K], "worst_relative_error": {str(s): e for s, e in rows.items()}},
            indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
