"""Whether reading w1|w3 as the decode GEMM reads it costs bandwidth by its geometry: GEMM-shaped
tile reads (no product) of the SwiGLU weight, from one region or from W1's and W3's halves.

The decode layer's SwiGLU GEMM (``skinny.swiglu``) read its ``[2 * 5504, 2048]`` bf16 weight at ~2.8
TB/s in the decode step whatever its grid or loop form, where a streaming read of as many bytes
reaches ~3.6 (``docs/benchmarks/read_ceiling.md``) and in_proj's GEMM, one region, ~3.5. Each
program of a SwiGLU GEMM reads the same rows of two regions 22.5 MB apart (W1's block and W3's).
Here a Triton kernel walks the weight as that GEMM does, in ``[2 BN, BK]`` tiles along K, but only
sums them (a product with a ones operand in place of the activations), each program's rows either
in two regions (W1's and W3's: rows ``[lo, hi)`` and ``HALF + [lo, hi)``) or in one (rows
``[2 lo, 2 hi)``, as many), over as many programs as the GEMM runs (blocks of 64 columns, or spread
over the SMs); beside it the streaming read of as many bytes and the GEMM itself alone. 24 distinct
weights in one CUDA graph (far beyond L2), us per call. (2026-12-03 09:48: the geometry costs
nothing, and the GEMM alone reads at the ceiling: ``docs/benchmarks/tile_reads_1203_0948.md``.)

    python benchmarks/tile_reads.py [--out DIR]

Prints a table and writes ``tile_reads.{json,md}``. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root, for blocks

from triton_check import require_triton  # noqa: E402

require_triton("tile_reads")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from decode_gemm import decode_shapes, time_layers  # noqa: E402
from gpu_common import write_report  # noqa: E402
from read_ceiling import READ_GRID, fastest, per_layer, time_skinny  # noqa: E402


@triton.jit
def _tile_read_kernel(w, out, HALF, K, swn, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                      SPLIT: tl.constexpr):
    """Program ``i`` of ``P`` sums the rows of its share of ``w: [2 HALF, K]`` (unit last stride) in
    ``[2 BN, BK]`` tiles along K into ``out[i]`` (float32; a product with ones): with ``SPLIT`` the rows ``[lo, hi)`` and
    ``HALF + [lo, hi)`` (``lo = i HALF // P``), else ``[2 lo, 2 hi)``; at most ``BN`` rows a half."""
    i = tl.program_id(0)
    P = tl.num_programs(0)
    lo = i * HALF // P
    hi = (i + 1) * HALF // P
    o_2 = tl.arange(0, 2 * BN)
    if SPLIT:
        o_c = lo + o_2 % BN
        m_r = o_c < hi
        o_r = o_c + tl.where(o_2 < BN, 0, HALF)
    else:
        o_r = 2 * lo + o_2
        m_r = o_r < 2 * hi
    # summed by a product with ones, on the tensor cores as the GEMM's own (an elementwise sum of
    # [2 BN, BK] float32 tiles would take 128-256 registers a thread)
    ones = tl.full([BK, 16], 1.0, w.dtype.element_ty)
    acc = tl.zeros([2 * BN, 16], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES):
        o_k = k0 + tl.arange(0, BK)
        tile = tl.load(w + o_r[:, None] * swn + o_k[None, :], mask=m_r[:, None] & (o_k < K)[None, :], other=0.)
        acc = tl.dot(tile, ones, acc)
    tl.store(out + i, tl.sum(tl.sum(acc, 1), 0) / 16)


def tile_read(w: torch.Tensor, out: torch.Tensor, bn: int, bk: int, stages: int, warps: int, split: bool) -> None:
    """``_tile_read_kernel`` over ``out.numel()`` programs."""
    _tile_read_kernel[(out.numel(),)](w, out, w.shape[0] // 2, w.shape[1], w.stride(0), BN=bn, BK=bk, STAGES=stages,
                                      SPLIT=split, num_warps=warps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="", help="folder for tile_reads.{json,md}")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tile_reads: needs a CUDA GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    N, K = decode_shapes()["w13"]
    half, nbytes = N // 2, N * K * 2
    ws = per_layer(lambda: torch.randn(N, K, device="cuda", dtype=torch.bfloat16), nbytes)
    rows = []
    read = fastest(nbytes, READ_GRID["quick"], sms, copy=False)
    rows.append({"kernel": f"streaming read ({read['config']})", "us": read["s"] * 1e6})
    t = time_skinny("w13")
    rows.append({"kernel": "skinny.swiglu as the layer runs it", "us": t * 1e6})
    grids = {"blocks of 64": (triton.cdiv(half, 64), 64), f"{sms} programs": (sms, 64),
             f"{2 * sms} programs": (2 * sms, 32)}
    for (label, (programs, bn)), bk, stages, split in itertools.product(grids.items(), (128, 256), (3, 4),
                                                                        (True, False)):
        out = torch.empty(programs, device="cuda", dtype=torch.float32)
        try:
            tile_read(ws[0], out, bn, bk, stages, 4, split)
        except triton.runtime.errors.OutOfResources:  # BK 256 in 4 stages: more shared memory than an SM has
            continue
        if not torch.allclose(out.sum(), ws[0].float().sum(), rtol=1e-3, atol=1.0):
            raise SystemExit(f"tile_reads: wrong sum at {label}, BK {bk}, split {split}")
        t = time_layers(lambda w: tile_read(w, out, bn, bk, stages, 4, split), ws)  # noqa: B023
        rows.append({"kernel": f"tile read, {'W1 + W3 rows' if split else 'one region'}, {label} (BN {bn}), "
                               f"BK {bk}, {stages} stages", "us": t * 1e6})
        print(rows[-1], flush=True)
    for r in rows:
        r["TBps"] = nbytes / (r["us"] * 1e-6) / 1e12
    body = [f"w1|w3: a [{N}, {K}] bf16 weight ({nbytes / 1e6:.1f} MB), 24 distinct weights in one CUDA graph, "
            "us per call (TB/s); 4 warps.", "", "| kernel | us | TB/s |", "|---|---|---|"]
    body += [f"| {r['kernel']} | {r['us']:.2f} | {r['TBps']:.2f} |" for r in rows]
    write_report("tile_reads", "GEMM-shaped reads of the SwiGLU weight", "\n".join(body), rows, args.out, argv)


if __name__ == "__main__":
    main()
