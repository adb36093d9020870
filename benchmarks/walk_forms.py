"""Screen a shorter dependency chain for the delta rule's forward state walk at long sequences.

Today's walk (``delta._fwd_h_kernel``) makes two dependent dots per chunk:
``vn = u - w h`` then ``h += k^T vn``. Written with the chunk's transition ``N = k^T w``
(``[K, K]``, computed for every chunk in parallel beforehand) the same recurrence is
``h <- h - N h + k^T u``: one dot on the chain (``N h``), the other (``k^T u``) independent of
``h``. The price: ``N`` ([B, T/64, H, K, K] in the activations' dtype, as large as the chunk
states) is written once and read by the walk, and ``vn`` would have to come from the output
kernel instead. This script times the two walks alone, side by side on the same inputs (the
benchmark's 64k tokens of 16 heads of 128, bf16, real WY factors), and the ``N`` kernel, to decide
whether the chain is what limits the walk before anything is built around it.

    python benchmarks/walk_forms.py [--lengths 8192,32768] [--reps 20] [--out DIR]

Also runs under ``TRITON_INTERPRET=1`` on CPU at a small shape (``--check``): the two walks'
states must agree.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

from triton_check import require_triton  # noqa: E402

require_triton("walk_forms")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from blocks.kernels import delta  # noqa: E402
from blocks.kernels.tiles import load_rows as _load_rows  # noqa: E402
from gpu_common import HEAD_DIM, HEADS, TOKENS, checked_lengths, keep_gpu_busy, write_report  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit(do_not_specialize=["T"])
def _transition_kernel(k, w, N, T, NT, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """Grid (K/BK * K/BK, NT, B*H): block (i, j) of chunk t's ``N = k^T w`` ([K, K], in ``N``'s dtype)."""
    i_blk = tl.program_id(0)
    i_t = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    NB: tl.constexpr = (K + BK - 1) // BK
    i_r = i_blk // NB
    i_c = i_blk % NB
    b_kT = delta._load_cols(k, i_b, i_h, i_t * BT, T, H, K, i_r * BK, BK, BT)  # [BK, BT]
    b_w = _load_rows(w, i_b, i_h, i_t * BT, T, H, K, i_c * BK, BT, BK)  # [BT, BK]
    b_N = tl.dot(b_kT, b_w)
    o_r = i_r * BK + tl.arange(0, BK)
    o_c = i_c * BK + tl.arange(0, BK)
    tl.store(N + ((i_b * NT + i_t) * H + i_h) * K * K + o_r[:, None] * K + o_c[None, :],
             b_N.to(N.dtype.element_ty), mask=(o_r < K)[:, None] & (o_c < K)[None, :])


@triton.jit(do_not_specialize=["T", "NT"])
def _fwd_h_transition_kernel(k, u, N, h, T, NT, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                             BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Grid (V/BV, B*H), BK >= K: ``h[t]`` = the state before chunk t; ``h <- h - N_t h + k_t^T u_t``."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    m_kk = (o_k < K)[:, None] & (o_k < K)[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for i_t in range(NT):
        b_hc = b_h.to(h.dtype.element_ty)
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_hc, mask=m_kv)
        b_N = tl.load(N + ((i_b * NT + i_t) * H + i_h) * K * K + o_k[:, None] * K + o_k[None, :], mask=m_kk, other=0.)
        b_kT = delta._load_cols(k, i_b, i_h, i_t * BT, T, H, K, 0, BK, BT)  # [BK, BT]
        b_u = _load_rows(u, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_h += tl.dot(b_kT, b_u) - tl.dot(b_N, b_hc)


def transition(k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``N: [B, NT, H, K, K]`` in ``k``'s dtype."""
    B, T, H, K = k.shape
    NT = triton.cdiv(T, delta.BT)
    BK = 64 if K > 64 else triton.next_power_of_2(K)
    N = k.new_empty(B, NT, H, K, K)
    nb = triton.cdiv(K, BK)
    _transition_kernel[(nb * nb, NT, B * H)](k, w, N, T, NT, H=H, K=K, BT=delta.BT, BK=BK,
                                             **({} if INTERPRET else dict(num_warps=4, num_stages=2)))
    return N


def fwd_h_transition(k: torch.Tensor, u: torch.Tensor, N: torch.Tensor, BV: int, warps: int = 4) -> torch.Tensor:
    B, T, H, K = k.shape
    V = u.shape[-1]
    NT = N.shape[1]
    h = k.new_empty(B, NT, H, K, V)
    _fwd_h_transition_kernel[(triton.cdiv(V, BV), B * H)](
        k, u, N, h, T, NT, H=H, K=K, V=V, BT=delta.BT, BK=triton.next_power_of_2(K), BV=BV,
        **({} if INTERPRET else dict(num_warps=warps, num_stages=3)))
    return h


def inputs(B: int, T: int, H: int, D: int, device: str, dtype: torch.dtype):
    """``k`` (l2-normalised), ``w, u`` from the delta rule's own WY kernels, ``beta`` in (0, 1)."""
    gen = torch.Generator(device=device).manual_seed(0)
    k = F.normalize(torch.randn(B, T, H, D, generator=gen, device=device), dim=-1).to(dtype)
    v = torch.randn(B, T, H, D, generator=gen, device=device).to(dtype)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen, device=device))
    _, w, u = delta.wy_fwd(k, v, beta, None)
    return k, w, u


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()


def check() -> float:
    """Interpreter check at a small shape: the transition walk's states against today's walk's."""
    k, w, u = inputs(1, 200, 2, 32, "cpu", torch.float32)
    h_ref = delta.fwd_h(k, w, u, None, None, False)[0]
    h = fwd_h_transition(k, u, transition(k, w), 16)
    return rel(h, h_ref)


def gpu_ms(fn, reps: int) -> float:
    """Median GPU milliseconds of ``fn()``: each call queued behind a sleep kernel
    (``keep_gpu_busy``), so that its host time (allocations, the launch path) is not timed."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        keep_gpu_busy()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def measure(T: int, reps: int) -> dict:
    B = max(1, TOKENS // T)
    k, w, u = inputs(B, T, HEADS, HEAD_DIM, "cuda", torch.bfloat16)
    BV = delta.walk_bv(k, B * HEADS, HEAD_DIM)
    N = transition(k, w)
    row = {"T": T, "B": B, "BV": BV}
    for _ in range(2):  # two interleaved rounds, the medians of the second kept
        row["walk_ms"] = gpu_ms(lambda: delta.fwd_h(k, w, u, None, None, False), reps)
        row["transition_walk_ms"] = gpu_ms(lambda: fwd_h_transition(k, u, N, BV), reps)
        row["transition_walk_8warps_ms"] = gpu_ms(lambda: fwd_h_transition(k, u, N, BV, 8), reps)
        row["transition_kernel_ms"] = gpu_ms(lambda: transition(k, w), reps)
    row["h_rel_diff"] = rel(fwd_h_transition(k, u, N, BV).float(), delta.fwd_h(k, w, u, None, None, False)[0].float())
    row["chunks"] = N.shape[1]
    row["us_per_chunk_walk"] = row["walk_ms"] * 1e3 / row["chunks"]
    row["us_per_chunk_transition_walk"] = row["transition_walk_ms"] * 1e3 / row["chunks"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--check", action="store_true", help="the interpreter check only (TRITON_INTERPRET=1, CPU)")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if a.check:
        if not INTERPRET:
            ap.error("--check: run with TRITON_INTERPRET=1")
        err = check()
        print(f"transition walk vs walk, relative difference of the states: {err:.2e}")
        return 0 if err < 1e-4 else 1
    lengths = checked_lengths(ap, a.lengths, whole_batches=True)
    if a.reps < 1:
        ap.error("--reps: must be at least 1")
    if not torch.cuda.is_available():
        print("walk_forms: needs a CUDA GPU (or --check under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    rows = [measure(T, a.reps) for T in lengths]
    lines = ["| T | B | V block | walk ms | transition walk ms (4 / 8 warps) | N kernel ms | us/chunk walk | us/chunk transition | h rel diff |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['B']} | {r['BV']} | {r['walk_ms']:.3f} | {r['transition_walk_ms']:.3f} / {r['transition_walk_8warps_ms']:.3f} | "
                     f"{r['transition_kernel_ms']:.3f} | {r['us_per_chunk_walk']:.2f} | "
                     f"{r['us_per_chunk_transition_walk']:.2f} | {r['h_rel_diff']:.1e} |")
    write_report("walk_forms", "Delta-rule forward walk: two dots per chunk vs the transition form", "\n".join(lines),
                 rows, a.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
