"""How accurate is the delta rules' chunk inverse ``(I + A)^-1`` at each dot precision? A CPU
emulation of ``blocks.kernels.delta._solve_tril_kernel``'s arithmetic (diagonal 16x16 blocks by
repeated squaring, then block merges), with TF32 modelled as float32 inputs rounded to a 10-bit
mantissa, on keys of a chosen pairwise cosine (correlated keys: repeated tokens, padding).

    python benchmarks/solve_tril_precision.py [--out DIR]

Prints a markdown table (relative Frobenius error of the inverse against float64, worst of three
draws) and writes ``solve_tril_precision.json`` to ``--out``. Why it exists: TF32 in every dot
measured 3-6% faster on the H200 but its error reaches O(1) for strongly correlated keys; exact
diagonal blocks with TF32 merges stay at the bf16 storage error; so do diagonal blocks by forward
substitution in float32 (``delta.SOLVE_TRIL_DIAG_SUBST``). No GPU needed: Triton's
interpreter ignores ``input_precision``, so the kernels' own tests on a CPU cannot show this.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

BC, BT = 16, 64
VARIANTS = {"exact": ("ieee", "ieee"), "tf32 everywhere": ("tf32", "tf32"), "exact diagonal, tf32 merges": ("ieee", "tf32"),
            "tf32x3 diagonal, tf32 merges": ("tf32x3", "tf32"),
            "substitution diagonal, exact merges": ("subst", "ieee"), "substitution diagonal, tf32 merges": ("subst", "tf32")}


def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to nearest (ties to even) at TF32's 10-bit mantissa."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x0FFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def dot(a: torch.Tensor, b: torch.Tensor, prec: str) -> torch.Tensor:
    """``a @ b`` as a tensor-core dot: inputs rounded at ``prec``, accumulated exactly, float32 out.
    "tf32x3" is Triton's split TF32: each input as a TF32 high part plus a TF32 remainder, and the
    three products but the remainders' own (as accurate as exact here, but timed no faster on the
    H200 for the diagonal blocks, 2026-12-01 05:40; the kernel keeps them exact)."""
    if prec == "tf32x3":
        a_hi, b_hi = tf32(a), tf32(b)
        a_lo, b_lo = tf32(a - a_hi), tf32(b - b_hi)
        a_hi, b_hi, a_lo, b_lo = (t.double() for t in (a_hi, b_hi, a_lo, b_lo))
        return (a_hi @ b_hi + a_hi @ b_lo + a_lo @ b_hi).float()
    if prec == "tf32":
        a, b = tf32(a), tf32(b)
    return (a.double() @ b.double()).float()


def inv_unit_lower(A: torch.Tensor, prec: str) -> torch.Tensor:
    """``(I + A)^-1`` of a strictly lower [16, 16] block, as ``_inv_unit_lower``."""
    eye = torch.eye(BC)
    n1 = -A
    n2 = dot(n1, n1, prec)
    n4 = dot(n2, n2, prec)
    n8 = dot(n4, n4, prec)
    p = dot(dot(eye + n1, eye + n2, prec), eye + n4, prec)
    return dot(p, eye + n8, prec)


def inv_unit_lower_subst(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)^-1`` of a strictly lower [16, 16] block by forward substitution in float32, as
    ``_inv_diag_blocks`` (``delta.SOLVE_TRIL_DIAG_SUBST``): row i is ``e_i - sum_{j<i} A_ij X_j``,
    each product rounded to float32 and summed in float32 in order of j (one fused multiply-add per
    term on the GPU; here a multiply and an add, each rounded: no more accurate)."""
    X = torch.eye(BC)
    for i in range(1, BC):
        s = torch.zeros(BC)
        for j in range(i):
            s = s + A[i, j] * X[j]
        X[i] = X[i] - s
    return X


def solve_tril(A: torch.Tensor, diag_prec: str, merge_prec: str) -> torch.Tensor:
    """``(I + A)^-1`` of a strictly lower [64, 64] ``A``, as ``_solve_tril_kernel``."""
    def blk(i, j):
        return A[i * BC:(i + 1) * BC, j * BC:(j + 1) * BC]

    T = {(i, i): inv_unit_lower_subst(blk(i, i)) if diag_prec == "subst" else inv_unit_lower(blk(i, i), diag_prec)
         for i in range(BT // BC)}
    for i in range(1, BT // BC):  # block row i, columns j < i, nearest the diagonal first
        for j in range(i - 1, -1, -1):
            acc = sum(dot(blk(i, m), T[m, j], merge_prec) for m in range(j, i))
            T[i, j] = -dot(T[i, i], acc, merge_prec)
    out = torch.zeros(BT, BT)
    for (i, j), t in T.items():
        out[i * BC:(i + 1) * BC, j * BC:(j + 1) * BC] = t
    return out


def chunk_A(cosine: float, beta: float, K: int = 128, seed: int = 0) -> torch.Tensor:
    """``A = tril(beta k k^T, -1)`` for 64 unit keys whose pairwise cosine is about ``cosine``."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.nn.functional.normalize(torch.randn(K, generator=g), dim=0)
    own = torch.nn.functional.normalize(torch.randn(BT, K, generator=g), dim=-1)
    k = torch.nn.functional.normalize(cosine ** 0.5 * shared + (1 - cosine) ** 0.5 * own, dim=-1)
    return torch.tril(beta * (k @ k.T), -1)


def errors(cosine: float, beta: float, draws: int = 3) -> dict[str, float]:
    """Worst relative error of each variant, and of storing the exact inverse in bf16."""
    worst: dict[str, float] = {}
    for seed in range(draws):
        A = chunk_A(cosine, beta, seed=seed)
        exact = torch.linalg.inv(torch.eye(BT, dtype=torch.float64) + A.double())
        found = {name: solve_tril(A, *precs).double() for name, precs in VARIANTS.items()}
        found["bf16 storage of the exact inverse"] = exact.to(torch.bfloat16).double()
        for name, inv in found.items():
            err = ((inv - exact).norm() / exact.norm()).item()
            worst[name] = max(worst.get(name, 0.0), err)
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for solve_tril_precision.json")
    opts = ap.parse_args()
    rows = [dict(cosine=c, beta=b, errors=errors(c, b)) for c in (0.0, 0.5, 0.7, 0.9, 0.97) for b in (0.5, 1.0)]
    names = list(rows[0]["errors"])
    print("| key cosine | beta | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
    for r in rows:
        print(f"| {r['cosine']} | {r['beta']} | " + " | ".join(f"{r['errors'][n]:.1e}" for n in names) + " |")
    if opts.out:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "solve_tril_precision.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
