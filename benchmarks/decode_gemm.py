"""Decode GEMMs at batch 16: cuBLAS (``F.linear``) against a Triton split-K skinny kernel.

A 24-layer, d_model 2048 decode step at batch 16 spends about 1.04 of its 2.36 ms in four GEMMs per
layer (the 2026-12-01 05:27 profile of the compiled graph, ``docs/benchmarks/gpu_results.json``):
cuBLAS reaches 58-69% of the copy bandwidth on the input projection, the MLP's w1|w3 and w2, and 35%
on the 2048 x 2048 output projection, whose 32 column tiles of 64 leave most of the 132
multiprocessors idle. This script measures whether a kernel written for that shape does better,
before anything in the model depends on it:

* ``skinny_mm``: ``y[M, N] = x[M, K] w[N, K]^T`` for ``M <= 16`` (the decode batch), one program per
  ``BN`` output columns and ``1/SPLIT_K`` of the reduction; with ``SPLIT_K > 1`` float32 partials
  ``[SPLIT_K, M, N]`` and a second kernel that sums and casts them (one launch more).
* Each GEMM is timed as the model runs it: 24 calls on 24 distinct weight tensors (one per layer)
  captured in one CUDA graph, so the weights stream from HBM (one weight would stay in the H200's
  50 MB L2 across repeats). Bytes per call = weight + x + y.

    python benchmarks/decode_gemm.py [--out DIR] [--grid small|wide] [--batch 16]

Prints a table per GEMM (cuBLAS, then every kernel configuration, fastest first) and writes
``decode_gemm.{json,md}`` to ``--out``. Needs a CUDA GPU. The kernels' results are checked against
``F.linear`` first (a wrong configuration is reported and skipped).
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root

LAYERS = 24
GRIDS = {  # (BN, BK, SPLIT_K, num_warps, num_stages)
    "small": list(itertools.product((32, 64, 128), (128, 256), (1, 4), (4,), (4,))),
    "wide": list(itertools.product((16, 32, 64, 128), (64, 128, 256), (1, 2, 4, 8), (4, 8), (3, 5))),
}


@triton.jit
def _skinny_mm_kernel(x, w, out, M, N, K, sxm, swn, so_s, so_m,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, K_PER: tl.constexpr):
    """Grid (cdiv(N, BN), SPLIT_K): ``out[s, :M, n0:n0+BN] = x[:M, ks] w[n0:n0+BN, ks]^T`` over the
    key range ``ks = [s K_PER, (s+1) K_PER)``; ``x: [M, K]`` (M <= BM), ``w: [N, K]``, both with unit
    last stride; ``out`` float32 partials (stride ``so_s`` per split) or the output itself."""
    i_n = tl.program_id(0)
    i_s = tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_n = i_n * BN + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    k_end = tl.minimum(i_s * K_PER + K_PER, K)
    for k0 in range(i_s * K_PER, k_end, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < k_end
        b_x = tl.load(x + o_m[:, None] * sxm + o_k[None, :], mask=(o_m < M)[:, None] & m_k[None, :], other=0.)
        b_w = tl.load(w + o_n[:, None] * swn + o_k[None, :], mask=(o_n < N)[:, None] & m_k[None, :], other=0.)
        acc += tl.dot(b_x, tl.trans(b_w))
    tl.store(out + i_s * so_s + o_m[:, None] * so_m + o_n[None, :], acc.to(out.dtype.element_ty),
             mask=(o_m < M)[:, None] & (o_n < N)[None, :])


@triton.jit
def _sum_splits_kernel(part, y, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """``y[i] = sum_s part[s, i]`` over the flattened ``[M, N]`` (``y`` contiguous, cast on store)."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(part + s * MN + o, mask=o < MN, other=0.)
    tl.store(y + o, acc.to(y.dtype.element_ty), mask=o < MN)


def skinny_mm(x: torch.Tensor, w: torch.Tensor, BN: int = 64, BK: int = 128, split_k: int = 1,
              num_warps: int = 4, num_stages: int = 4, out: torch.Tensor | None = None,
              partials: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ w[N, K]^T -> [M, N]`` in ``x``'s dtype, ``M <= 16``. ``out`` / ``partials``
    (``[split_k, M, N]`` float32) may be given so that a captured graph reuses them."""
    M, K = x.shape
    N = w.shape[0]
    if M > 16 or w.shape[1] != K or x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError(f"skinny_mm: x [M<=16, K] and w [N, K] with unit last strides, got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}")
    out = x.new_empty(M, N) if out is None else out
    k_per = triton.cdiv(triton.cdiv(K, split_k), BK) * BK
    splits = triton.cdiv(K, k_per)
    launch = dict(BM=16, BN=BN, BK=BK, K_PER=k_per, num_warps=num_warps, num_stages=num_stages)
    if splits == 1:
        _skinny_mm_kernel[(triton.cdiv(N, BN), 1)](x, w, out, M, N, K, x.stride(0), w.stride(0), 0, out.stride(0),
                                                   **launch)
        return out
    if partials is None or partials.shape[0] < splits:
        partials = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
    _skinny_mm_kernel[(triton.cdiv(N, BN), splits)](x, w, partials, M, N, K, x.stride(0), w.stride(0),
                                                    partials.stride(0), partials.stride(1), **launch)
    _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](partials, out, M * N, SPLIT_K=splits, BLOCK=1024,
                                                     num_warps=4)
    return out


def decode_shapes(block: str = "gated_deltanet") -> dict[str, tuple[int, int]]:
    """``{name: (N, K)}`` of one layer's GEMMs in the benchmark's 24-layer, d_model 2048 model."""
    from gpu_kernels import model_spec  # noqa: E402 - benchmarks/ is this script's folder

    from archsearch.model import HybridLM

    with torch.device("meta"):
        layer = HybridLM(model_spec(block)).layers[0]
    return {name: tuple(mod.weight.shape) for name, mod in layer.named_modules()
            if isinstance(mod, torch.nn.Linear)}


def time_layers(fn, xs, ws, outs) -> float:
    """Seconds per call of ``fn(x, w, out)`` over the 24 (x, w, out) triples captured in one graph
    (median of 10 replays / 24)."""
    from gpu_common import graph_time  # noqa: E402

    def all_layers():
        for x, w, o in zip(xs, ws, outs):
            fn(x, w, o)

    return graph_time(all_layers, steps=1, reps=10) / len(ws)


def bench_shape(name: str, N: int, K: int, batch: int, grid) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    ws = [(torch.randn(N, K, generator=gen, device=dev) * K ** -0.5).bfloat16() for _ in range(LAYERS)]
    xs = [torch.randn(batch, K, generator=gen, device=dev).bfloat16() for _ in range(LAYERS)]
    outs = [torch.empty(batch, N, device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    nbytes = (N * K + batch * K + batch * N) * 2
    rows = []
    sec = time_layers(lambda x, w, o: torch.mm(x, w.t(), out=o), xs, ws, outs)
    rows.append({"kernel": "cuBLAS (torch.mm)", "us": sec * 1e6, "tb_s": nbytes / sec / 1e12})
    ref = xs[0].float() @ ws[0].float().t()
    for BN, BK, split_k, warps, stages in grid:
        cfg = dict(BN=BN, BK=BK, split_k=split_k, num_warps=warps, num_stages=stages)
        label = f"skinny BN={BN} BK={BK} split={split_k} w={warps} s={stages}"
        try:
            parts = torch.empty(split_k, batch, N, dtype=torch.float32, device=dev)
            got = skinny_mm(xs[0], ws[0], partials=parts, **cfg).float()
            err = ((got - ref).norm() / ref.norm()).item()
            if err > 1e-2:
                rows.append({"kernel": label, "error": f"relative error {err:.2e} against fp32"})
                continue
            sec = time_layers(lambda x, w, o: skinny_mm(x, w, out=o, partials=parts, **cfg), xs, ws, outs)
            rows.append({"kernel": label, "config": cfg, "us": sec * 1e6, "tb_s": nbytes / sec / 1e12})
        except Exception as exc:  # noqa: BLE001 - a configuration the compiler refuses: report, go on
            rows.append({"kernel": label, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})
    base = rows[0]["us"]
    for r in rows:
        if "us" in r:
            r["vs_cublas"] = base / r["us"]
    timed = sorted((r for r in rows[1:] if "us" in r), key=lambda r: r["us"])
    return {"N": N, "K": K, "batch": batch, "bytes": nbytes, "cublas": rows[0],
            "skinny": timed + [r for r in rows[1:] if "us" not in r]}


def markdown(res: dict) -> str:
    lines = [f"# Decode GEMMs, batch {res['batch']}: cuBLAS vs a Triton split-K kernel", "",
             f"{res['device']}, {res['when']}; {LAYERS} distinct weights per GEMM in one CUDA graph "
             f"(as the {LAYERS}-layer model reads them). `python benchmarks/decode_gemm.py --grid {res['grid']}`", "",
             "| GEMM (N x K) | MB | cuBLAS us | cuBLAS TB/s | best skinny us | TB/s | x cuBLAS | its config |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in res["gemms"].items():
        best = r["skinny"][0] if r["skinny"] and "us" in r["skinny"][0] else None
        lines.append(f"| {name} ({r['N']} x {r['K']}) | {r['bytes'] / 1e6:.1f} | {r['cublas']['us']:.2f} | "
                     f"{r['cublas']['tb_s']:.2f} | " + (f"{best['us']:.2f} | {best['tb_s']:.2f} | "
                                                        f"{best['vs_cublas']:.2f} | {best['kernel'][7:]} |"
                                                        if best else "- | - | - | every configuration failed |"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for decode_gemm.{json,md}")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="small",
                    help=f"kernel configurations: small ({len(GRIDS['small'])}) or wide ({len(GRIDS['wide'])})")
    ap.add_argument("--batch", type=int, default=16, help="decode batch M (1..16)")
    opts = ap.parse_args(argv)
    if not 1 <= opts.batch <= 16:
        ap.error(f"--batch: must be 1..16, got {opts.batch}")
    if not torch.cuda.is_available():
        print("decode_gemm: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    res = {"device": torch.cuda.get_device_name(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "batch": opts.batch, "grid": opts.grid, "gemms": {}}
    for name, (N, K) in decode_shapes().items():
        t0 = time.time()
        res["gemms"][name] = r = bench_shape(name, N, K, opts.batch, GRIDS[opts.grid])
        best = r["skinny"][0] if r["skinny"] and "us" in r["skinny"][0] else {"kernel": "none", "us": float("nan")}
        print(f"{name} ({N} x {K}): cuBLAS {r['cublas']['us']:.2f} us ({r['cublas']['tb_s']:.2f} TB/s), best "
              f"{best['kernel']} {best['us']:.2f} us [{time.time() - t0:.0f} s]", flush=True)
        torch.cuda.empty_cache()
    text = markdown(res)
    print(text)
    if opts.out is not None:
        opts.out.mkdir(parents=True, exist_ok=True)
        (opts.out / "decode_gemm.json").write_text(json.dumps(res, indent=1))
        (opts.out / "decode_gemm.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
