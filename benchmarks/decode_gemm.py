"""Decode GEMMs at batch 16: cuBLAS against a Triton split-K kernel, alone and with the elementwise
work around them fused in.

A 24-layer, d_model 2048 decode step at batch 16 spends about 1.04 of its 1.94 ms of kernel time in
four GEMMs per layer, and most of the rest in ~15 small kernels per layer and the gaps between
them (0.42 ms; the 2026-12-01 05:27 profile of the compiled graph, ``docs/benchmarks/gpu_results.json``).
cuBLAS reaches 57-69% of the copy bandwidth on the input projection, the MLP's w1|w3 and w2, and
35% on the 2048 x 2048 output projection (its four kernels matched to the GEMMs by weight bytes). This script measures, before anything in the model
depends on it, whether a kernel written for that shape does better, and what folding the GEMMs'
neighbours into it saves. One case per GEMM of a layer, as the model runs it:

    in_proj   rmsnorm(x) W_in^T          (RMSNorm before the mixer, ``HybridLM``'s norm1)
    o_proj    r + o W_o^T                (the mixer's output projection and the residual)
    w13       rmsnorm(h) W_13^T          (norm2 and SwiGLU's w1|w3)
    w2        r + (silu(a) * b) W_2^T    (SwiGLU's gate and w2, and the residual)

Per case: cuBLAS alone (``torch.mm``: the GEMM's share), the whole case through ``torch.compile``
(Inductor: cuBLAS plus its fused elementwise kernels, what ``GraphDecoder(compile=True)`` runs), and
``skinny_mm`` with and without the case's prologue/epilogue in the kernel, over a grid of
configurations. ``skinny_mm``: ``y[M, N] = x[M, K] w[N, K]^T`` for ``M <= 16``, one program per
``BN`` output columns and ``1/SPLIT_K`` of the reduction; with ``SPLIT_K > 1`` float32 partials
``[SPLIT_K, M, N]`` and a second kernel that sums them (and adds the residual).

Every variant is timed as the model runs it: 24 calls on 24 distinct weights (one per layer) in one
CUDA graph, so the weights stream from HBM (one weight would stay in the H200's 50 MB L2 across
repeats); bytes per call = weight + inputs + output. Results are checked against the float32
reference first (a wrong configuration is reported and skipped).

    python benchmarks/decode_gemm.py [--out DIR] [--grid small|wide] [--batch 16] [--cases in_proj,w2]

Prints a table and writes ``decode_gemm.{json,md}`` to ``--out``. Needs a CUDA GPU.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from triton_check import require_triton  # noqa: E402

require_triton("decode_gemm")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project root

LAYERS = 24
EPS = 1e-6  # HybridLM's RMSNorm
NO_PROLOGUE, RMSNORM, SILU_MUL = 0, 1, 2
CASES = {  # name: (the model's module whose weight it is, prologue, residual epilogue)
    "in_proj": ("mixer.in_proj.linear", RMSNORM, False),
    "o_proj": ("mixer.o_proj", NO_PROLOGUE, True),
    "w13": ("mlp.w13", RMSNORM, False),
    "w2": ("mlp.w2", SILU_MUL, True),
}
GRIDS = {  # (BN, BK, SPLIT_K, num_warps, num_stages)
    "small": list(itertools.product((32, 64, 128), (128, 256), (1, 4), (4,), (4,))),
    "wide": list(itertools.product((16, 32, 64, 128), (64, 128, 256), (1, 2, 4, 8), (4, 8), (3, 5))),
}


@triton.jit
def _load_x(x, gamma, o_m, o_k, m_m, m_k, sxm, K, rstd, PROLOGUE: tl.constexpr, DTYPE: tl.constexpr):
    """The ``[BM, BK]`` tile of the GEMM's left operand at columns ``o_k``, in ``DTYPE``: ``x``
    itself, ``rmsnorm(x)`` (``x * rstd * gamma``), or ``silu(a) * b`` of ``x = [a | b]`` (``[M, 2K]``)."""
    mask = m_m[:, None] & m_k[None, :]
    p = x + o_m[:, None] * sxm + o_k[None, :]
    if PROLOGUE == 1:
        g = tl.load(gamma + o_k, mask=m_k, other=0.).to(tl.float32)
        return (tl.load(p, mask=mask, other=0.).to(tl.float32) * rstd[:, None] * g[None, :]).to(DTYPE)
    if PROLOGUE == 2:
        a = tl.load(p, mask=mask, other=0.).to(tl.float32)
        b = tl.load(p + K, mask=mask, other=0.).to(tl.float32)
        return (a * tl.sigmoid(a) * b).to(DTYPE)
    return tl.load(p, mask=mask, other=0.).to(DTYPE)


@triton.jit
def _skinny_mm_kernel(x, w, out, gamma, res, M, N, K, sxm, swn, so_s, so_m, srm, eps,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, K_PER: tl.constexpr,
                      PROLOGUE: tl.constexpr, RESIDUAL: tl.constexpr):
    """Grid (cdiv(N, BN), SPLIT_K): ``out[s, :M, n0:n0+BN] = X[:M, ks] w[n0:n0+BN, ks]^T`` over the
    key range ``ks = [s K_PER, (s+1) K_PER)``, ``X`` the left operand ``_load_x`` forms from ``x``
    (``[M, K]``, or ``[M, 2K]`` for silu-mul; M <= BM); ``w: [N, K]``; unit last strides; ``out``
    float32 partials (stride ``so_s`` per split) or the output, plus ``res`` (``RESIDUAL``)."""
    i_n = tl.program_id(0)
    i_s = tl.program_id(1)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    o_n = i_n * BN + tl.arange(0, BN)
    rstd = tl.zeros([BM], dtype=tl.float32)
    if PROLOGUE == 1:  # the row's RMS over all of K, whatever slice of K this program reduces
        ss = tl.zeros([BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            o_k = k0 + tl.arange(0, BK)
            b_x = tl.load(x + o_m[:, None] * sxm + o_k[None, :], mask=m_m[:, None] & (o_k < K)[None, :],
                          other=0.).to(tl.float32)
            ss += tl.sum(b_x * b_x, 1)
        rstd = tl.rsqrt(ss / K + eps)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    k_end = tl.minimum(i_s * K_PER + K_PER, K)
    for k0 in range(i_s * K_PER, k_end, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < k_end
        b_x = _load_x(x, gamma, o_m, o_k, m_m, m_k, sxm, K, rstd, PROLOGUE, w.dtype.element_ty)
        b_w = tl.load(w + o_n[:, None] * swn + o_k[None, :], mask=(o_n < N)[:, None] & m_k[None, :], other=0.)
        acc += tl.dot(b_x, tl.trans(b_w))
    m_out = m_m[:, None] & (o_n < N)[None, :]
    if RESIDUAL:
        acc += tl.load(res + o_m[:, None] * srm + o_n[None, :], mask=m_out, other=0.).to(tl.float32)
    tl.store(out + i_s * so_s + o_m[:, None] * so_m + o_n[None, :], acc.to(out.dtype.element_ty), mask=m_out)


@triton.jit
def _sum_splits_kernel(part, res, y, M, N, srm, sym, SPLIT_K: tl.constexpr, RESIDUAL: tl.constexpr,
                       BLOCK: tl.constexpr):
    """``y[m, n] = sum_s part[s, m, n] (+ res[m, n])`` (``part`` contiguous ``[SPLIT_K, M, N]``;
    ``res``, ``y`` with row strides ``srm``, ``sym``; cast on store)."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = o < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(part + s * M * N + o, mask=mask, other=0.)
    m, n = o // N, o % N
    if RESIDUAL:
        acc += tl.load(res + m * srm + n, mask=mask, other=0.).to(tl.float32)
    tl.store(y + m * sym + n, acc.to(y.dtype.element_ty), mask=mask)


def skinny_mm(x: torch.Tensor, w: torch.Tensor, BN: int = 64, BK: int = 128, split_k: int = 1,
              num_warps: int = 4, num_stages: int = 4, prologue: int = NO_PROLOGUE,
              gamma: torch.Tensor | None = None, residual: torch.Tensor | None = None,
              out: torch.Tensor | None = None, partials: torch.Tensor | None = None) -> torch.Tensor:
    """``X w^T (+ residual) -> [M, N]`` in ``w``'s dtype, ``X`` = ``x`` (``[M <= 16, K]``),
    ``rmsnorm(x) * gamma`` (``prologue=RMSNORM``) or ``silu(a) * b`` of ``x = [a | b]``
    (``[M, 2K]``, ``prologue=SILU_MUL``). ``out`` / ``partials`` (``[split_k, M, N]`` float32) may be
    given so that a captured graph reuses them; ``residual`` and ``out`` contiguous ``[M, N]``."""
    M = x.shape[0]
    N, K = w.shape
    kx = 2 * K if prologue == SILU_MUL else K
    if M > 16 or x.shape[1] != kx or x.stride(-1) != 1 or w.stride(-1) != 1:
        raise ValueError(f"skinny_mm: x [M<=16, {kx}] and w [N, K] with unit last strides, got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}")
    if (prologue == RMSNORM) != (gamma is not None):
        raise ValueError("skinny_mm: gamma is the RMSNorm prologue's weight (and only its)")
    out = torch.empty(M, N, dtype=w.dtype, device=x.device) if out is None else out
    res = residual if residual is not None else out  # not read without the residual epilogue
    k_per = triton.cdiv(triton.cdiv(K, split_k), BK) * BK
    splits = triton.cdiv(K, k_per)
    args = (gamma if gamma is not None else w, res, M, N, K, x.stride(0), w.stride(0))
    launch = dict(BM=16, BN=BN, BK=BK, K_PER=k_per, PROLOGUE=prologue, num_warps=num_warps, num_stages=num_stages)
    if splits == 1:
        _skinny_mm_kernel[(triton.cdiv(N, BN), 1)](x, w, out, *args, 0, out.stride(0), res.stride(0), EPS,
                                                   RESIDUAL=residual is not None, **launch)
        return out
    if (partials is None or partials.shape[0] < splits or tuple(partials.shape[1:]) != (M, N)
            or not partials.is_contiguous()):
        partials = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
    _skinny_mm_kernel[(triton.cdiv(N, BN), splits)](x, w, partials, *args, partials.stride(0), partials.stride(1),
                                                    res.stride(0), EPS, RESIDUAL=False, **launch)
    _sum_splits_kernel[(triton.cdiv(M * N, 1024),)](partials, res, out, M, N, res.stride(0), out.stride(0),
                                                     SPLIT_K=splits, RESIDUAL=residual is not None, BLOCK=1024,
                                                     num_warps=4)
    return out


def reference(case: str, x: torch.Tensor, w: torch.Tensor, gamma: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The case as the model computes it (``torch``; under ``torch.compile`` Inductor's fusion)."""
    _, prologue, residual = CASES[case]
    if prologue == RMSNORM:
        x = F.rms_norm(x, (x.shape[-1],), gamma, EPS)
    elif prologue == SILU_MUL:
        a, b = x.chunk(2, dim=-1)
        x = F.silu(a) * b
    y = F.linear(x, w)
    return r + y if residual else y


def decode_shapes(block: str = "gated_deltanet") -> dict[str, tuple[int, int]]:
    """``{case: (N, K)}``: the weight of each case's GEMM in one layer of the benchmark's 24-layer,
    d_model 2048 model (built on the meta device: no memory)."""
    from gpu_kernels import model_spec  # noqa: E402 - benchmarks/ is this script's folder

    from archsearch.model import HybridLM

    with torch.device("meta"):
        layer = HybridLM(model_spec(block)).layers[0]
    weights = {name: tuple(mod.weight.shape) for name, mod in layer.named_modules() if isinstance(mod, torch.nn.Linear)}
    return {case: weights[module] for case, (module, _, _) in CASES.items()}


def case_inputs(case: str, N: int, K: int, batch: int, dev) -> list[dict]:
    """One input set per layer: ``x`` (``[M, 2K]`` for silu-mul), ``w``, ``gamma``, ``r``, ``out``."""
    _, prologue, _ = CASES[case]
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).bfloat16()

    kx = 2 * K if prologue == SILU_MUL else K
    return [{"x": rnd(batch, kx), "w": rnd(N, K, scale=K ** -0.5), "gamma": 1 + rnd(K, scale=0.1),
             "r": rnd(batch, N), "out": torch.empty(batch, N, device=dev, dtype=torch.bfloat16)}
            for _ in range(LAYERS)]


def time_layers(call, sets: list[dict]) -> float:
    """Seconds per call of ``call(inputs)`` over the 24 input sets captured in one graph (median of
    10 replays / 24)."""
    from gpu_common import graph_time  # noqa: E402

    def all_layers():
        for s in sets:
            call(s)

    return graph_time(all_layers, steps=1, reps=10) / len(sets)


def bench_case(case: str, N: int, K: int, batch: int, grid) -> dict:
    dev = torch.device("cuda")
    _, prologue, residual = CASES[case]
    sets = case_inputs(case, N, K, batch, dev)
    s0 = sets[0]
    refs = {"case": reference(case, s0["x"].float(), s0["w"].float(), s0["gamma"].float(), s0["r"].float()),
            "gemm": s0["x"][:, :K].float() @ s0["w"].float().t()}
    x_bytes = s0["x"].numel() * 2 + (K * 2 if prologue == RMSNORM else 0) + (batch * N * 2 if residual else 0)
    nbytes = {"case": N * K * 2 + x_bytes + batch * N * 2, "gemm": (N * K + batch * K + batch * N) * 2}
    rows = []

    def add(label: str, call, ref: str, **extra) -> None:
        """Check ``call(s0)`` against ``refs[ref]``, then time it over the 24 input sets (TB/s of the
        bytes the case, or the bare GEMM, must move)."""
        try:
            got = call(s0).float()
            err = ((got - refs[ref]).norm() / refs[ref].norm()).item()
            if err > 2e-2:
                rows.append({"kernel": label, "error": f"relative error {err:.2e} against float32", **extra})
                return
            sec = time_layers(call, sets)
            rows.append({"kernel": label, "us": sec * 1e6, "tb_s": nbytes[ref] / sec / 1e12, **extra})
        except Exception as exc:  # noqa: BLE001 - a configuration the compiler or GPU refuses: report, go on
            rows.append({"kernel": label, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}", **extra})

    add("cuBLAS GEMM alone (torch.mm)", lambda s: torch.mm(s["x"][:, :K], s["w"].t(), out=s["out"]), "gemm")
    compiled = torch.compile(lambda x, w, g, r: reference(case, x, w, g, r), dynamic=False)
    add("torch.compile (cuBLAS + Inductor)", lambda s: compiled(s["x"], s["w"], s["gamma"], s["r"]), "case")
    for fused in (False, True):
        for BN, BK, split_k, warps, stages in grid:
            cfg = dict(BN=BN, BK=BK, split_k=split_k, num_warps=warps, num_stages=stages)
            parts = torch.empty(split_k, batch, N, dtype=torch.float32, device=dev)
            if fused:
                def run(s, cfg=cfg, parts=parts):
                    return skinny_mm(s["x"], s["w"], prologue=prologue, gamma=s["gamma"] if prologue == RMSNORM else None,
                                     residual=s["r"] if residual else None, out=s["out"], partials=parts, **cfg)
            else:
                def run(s, cfg=cfg, parts=parts):
                    return skinny_mm(s["x"][:, :K], s["w"], out=s["out"], partials=parts, **cfg)
            label = f"skinny{' fused' if fused else ''} BN={BN} BK={BK} split={split_k} w={warps} s={stages}"
            add(label, run, "case" if fused else "gemm", config=cfg, fused=fused)
    base = rows[0].get("us")
    for r in rows:
        if "us" in r and base:
            r["vs_cublas_gemm"] = base / r["us"]
    return {"N": N, "K": K, "batch": batch, "bytes": nbytes["case"], "rows": rows}


def best(rows: list[dict], fused: bool) -> dict | None:
    timed = [r for r in rows if r.get("fused") is fused and "us" in r]
    return min(timed, key=lambda r: r["us"]) if timed else None


def markdown(res: dict) -> str:
    lines = [f"# Decode GEMMs, batch {res['batch']}: cuBLAS vs a Triton split-K kernel", "",
             f"{res['device']}, {res['when']}; {LAYERS} distinct weights per case in one CUDA graph (as the "
             f"{LAYERS}-layer model reads them), us per call. `python benchmarks/decode_gemm.py --grid {res['grid']}`",
             "", "| case (N x K) | MB | cuBLAS GEMM | torch.compile case | skinny GEMM | skinny fused case | "
             "fused x compiled | best fused config |", "|---|---|---|---|---|---|---|---|"]

    def us(r):
        return f"{r['us']:.2f} ({r['tb_s']:.2f} TB/s)" if r and "us" in r else "-"

    for name, c in res["cases"].items():
        rows = c["rows"]
        gemm = rows[0]
        comp = next((r for r in rows if r["kernel"].startswith("torch.compile")), None)
        plain, fused = best(rows, False), best(rows, True)
        ratio = f"{comp['us'] / fused['us']:.2f}" if fused and comp and "us" in comp else "-"
        cfg = fused["kernel"].split(" ", 2)[2] if fused else "every configuration failed"
        lines.append(f"| {name} ({c['N']} x {c['K']}) | {c['bytes'] / 1e6:.1f} | {us(gemm)} | {us(comp)} | "
                     f"{us(plain)} | {us(fused)} | {ratio} | {cfg} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for decode_gemm.{json,md}")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="small",
                    help=f"kernel configurations: small ({len(GRIDS['small'])}) or wide ({len(GRIDS['wide'])})")
    ap.add_argument("--batch", type=int, default=16, help="decode batch M (1..16)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    opts = ap.parse_args(argv)
    if not 1 <= opts.batch <= 16:
        ap.error(f"--batch: must be 1..16, got {opts.batch}")
    cases = [c for c in opts.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        ap.error(f"--cases: expected a comma list of {', '.join(CASES)}, got {opts.cases!r}")
    if not torch.cuda.is_available():
        print("decode_gemm: needs a CUDA GPU (none found)", file=sys.stderr)
        return 2
    res = {"device": torch.cuda.get_device_name(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "batch": opts.batch, "grid": opts.grid, "cases": {}}
    shapes = decode_shapes()
    for case in cases:
        N, K = shapes[case]
        t0 = time.time()
        res["cases"][case] = c = bench_case(case, N, K, opts.batch, GRIDS[opts.grid])
        fused = best(c["rows"], True)
        print(f"{case} ({N} x {K}): cuBLAS GEMM {c['rows'][0].get('us', float('nan')):.2f} us, best fused "
              f"{fused['kernel'] if fused else 'none'} {fused['us'] if fused else float('nan'):.2f} us "
              f"[{time.time() - t0:.0f} s]", flush=True)
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
