"""Decode-time GEMMs of at most 16 rows, and the residual add + RMSNorm between them.

A decode step multiplies ``[B <= 16, K]`` activations by every weight of the model once, so it is
bound by reading the weights; cuBLAS picks kernels tiled for larger M and reaches 2.0-3.1 TB/s on
the four GEMMs of a d_model 2048 layer on an H200 (copy: 4.2 TB/s). ``benchmarks/decode_gemm.py``
measured a plain split-K Triton kernel for that shape beside cuBLAS (2026-12-01 10:23,
``docs/benchmarks/decode_gemm.md``, us per call on 24 distinct weights in one CUDA graph): in_proj
10.94 vs 11.36, w1|w3 13.63 vs 14.70, w2 10.08 vs 11.11, o_proj 6.70 vs 6.31. The same run found
a normalisation or SiLU folded into the kernel's left operand slow (16-29 us: a transformed
operand is not pipelined like a plain load), so these kernels keep both operands plain loads and
put the extra work where it costs nothing:

* ``swiglu``: SwiGLU's ``silu(x W1^T) * (x W3^T)`` as one kernel with two accumulators, one for a
  block of W1's rows and one for the same block of W3's (``SwiGLU.w13`` holds W1 above W3), and
  the product in the epilogue: no ``[B, 2 * hidden]`` intermediate, no elementwise kernel.
* ``partials`` + ``add_norm``: a split-K GEMM writes float32 partial sums; one kernel per row then
  adds the splits and the residual (the residual stream's new value, in the activation dtype) and
  the next RMSNorm of that row (what the next GEMM reads). That replaces cuBLAS's split-K reduce,
  the residual add and the RMSNorm kernel.
* ``embed_norm``: the same row kernel gathering the embedding rows of the step's tokens, with the
  first layer's RMSNorm: the decode step's first kernel.

Every kernel here is forward-only and runs under ``torch.no_grad`` from ``archsearch.decode_layer``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import register_kernel
from .tiles import INTERPRET as _INTERPRET, cdiv, pdl_launch, pow2

MAX_ROWS = 16
# (BN, BK, SPLIT_K, num_warps, num_stages) per GEMM of a decode layer: the fastest plain
# configurations of ``benchmarks/decode_gemm.py --grid small`` (H200, 2026-12-01 10:23). ``swiglu``
# reads two weight blocks per program, so it takes the w13 case's BN per half.
CONFIGS = {"in_proj": (64, 256, 1, 4, 4), "o_proj": (32, 128, 4, 4, 4), "swiglu": (32, 128, 1, 4, 4),
           "w2": (32, 128, 4, 4, 4)}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Programmatic dependent launch (Hopper+): each kernel here is launched with ``launch_pdl``, lets the
# next kernel launch once all its programs have started (``gdc_launch_dependents`` first thing),
# and waits for the kernel before it (``gdc_wait``) only where it reads that kernel's output: a
# GEMM first pulls the first ``PDL_PREFETCH`` K tiles of its weight slice into L2 (weights do not
# depend on the kernel before). Aimed at the 44-174 us between the decode step's 172 kernels and
# each GEMM's pipeline fill; Inductor's own PDL (whole kernels launched early, no prefetch) lost
# 10% on 2026-12-01. Timed (H200, 2026-12-01 11:42-11:44, compiled fused-layer graphs at batch 16,
# ``gpu_kernels.py --compiled-sets``, docs/benchmarks/decode_pdl_sets.md): gated_deltanet x24
# 1.488 -> 1.449 and 1.524 -> 1.398 ms in two calls, simple_gla x24 1.497 -> 1.423 and 1.497 -> 1.420.
# Prefetch depth in one call: 0 / 2 / 8 / 32 tiles 1.516 / 1.446 / 1.638 / 1.635 ms (gated): deeper
# prefetches compete with the kernel before for bandwidth.
# Lost (H200, 2026-12-01 12:01-12:03): the weights read by TMA (a host-built descriptor per weight,
# configurations swept for it, docs/benchmarks/skinny_configs_tma.md): graph 1.394 / 1.445 ->
# 1.430 / 1.435 ms gated_deltanet x24, 1.383 / 1.386 -> 1.381 / 1.376 simple_gla (no gain).
PDL = True
PDL_PREFETCH = 2  # K tiles of weights prefetched; 0 or a power of two (one prefetch per cache line)
SWITCHES = {"PDL": (False, True), "PDL_PREFETCH": (0, 2, 8, 32)}


@triton.jit
def _prefetch_l2(w, o_n, m_n, swn, k0, k_end, BK: tl.constexpr, TILES: tl.constexpr, LINE: tl.constexpr):
    """Pull the weight rows ``o_n``, columns ``k0 .. k0 + TILES * BK`` (before ``k_end``) into L2:
    one ``prefetch.global.L2`` per ``LINE``-element cache line."""
    o_l = k0 + tl.arange(0, TILES * BK // LINE) * LINE
    m = m_n[:, None] & (o_l < k_end)[None, :]
    p = w + o_n[:, None] * swn + o_l[None, :]
    tl.inline_asm_elementwise("@$2 prefetch.global.L2 [$1]; mov.b32 $0, 0;", "=r,l,b", [p, m],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _skinny_kernel(x, w, out, M, N, K, HALF, sxm, swn, so_s, so_m,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, K_PER: tl.constexpr,
                   SWIGLU: tl.constexpr, DOT_PREC: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                   LINE: tl.constexpr):
    """Grid (cdiv(N, BN), SPLIT_K). ``x: [M <= BM, K]``, ``w: [*, K]`` (unit last strides).
    Plain: ``out[s, :M, n] = x[:, ks] . w[n, ks]`` over this split's keys ``ks = [s K_PER, (s+1) K_PER)``
    (``so_s`` the split stride of float32 partials; 0 with one split). ``SWIGLU``:
    ``out[:M, n] = silu(x . w[n]) * (x . w[HALF + n])`` for ``n < N`` (one split)."""
    i_n = tl.program_id(0)
    i_s = tl.program_id(1)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc3 = tl.zeros([BM, BN], dtype=tl.float32)
    k_end = tl.minimum(i_s * K_PER + K_PER, K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        if PREFETCH > 0:
            _prefetch_l2(w, o_n, m_n, swn, i_s * K_PER, k_end, BK, PREFETCH, LINE)
            if SWIGLU:
                _prefetch_l2(w, HALF + o_n, m_n, swn, i_s * K_PER, k_end, BK, PREFETCH, LINE)
        tl.extra.cuda.gdc_wait()  # x is the kernel before's output
    for k0 in range(i_s * K_PER, k_end, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < k_end
        b_x = tl.load(x + o_m[:, None] * sxm + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.)
        b_w = tl.load(w + o_n[:, None] * swn + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.)
        acc += tl.dot(b_x, tl.trans(b_w), input_precision=DOT_PREC)
        if SWIGLU:
            b_w3 = tl.load(w + (HALF + o_n)[:, None] * swn + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                           other=0.)
            acc3 += tl.dot(b_x, tl.trans(b_w3), input_precision=DOT_PREC)
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc3
    tl.store(out + i_s * so_s + o_m[:, None] * so_m + o_n[None, :], acc.to(out.dtype.element_ty),
             mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _add_norm_kernel(part, res, rows, gamma, h, hn, M, N, R, srm, shm, snm, eps,
                     S: tl.constexpr, BLOCK: tl.constexpr, NORM: tl.constexpr, GATHER: tl.constexpr,
                     PDL: tl.constexpr):
    """Grid (M,): row ``m`` of ``h = res + sum_s part[s]`` (``part``: contiguous float32
    ``[S, M, N]``; ``h`` rounded to its dtype) and, with ``NORM``, ``hn = rmsnorm(h) * gamma``
    (float32 over the rounded row, one rounding at the store). ``S`` is a constant so that the
    split loads are unrolled and issued together: with a runtime loop the 16 programs waited for
    them one after another (3.7 us per call at batch 16, 4 splits of a 2048-wide row; H200).
    ``GATHER``: the residual row is ``res[rows[m]]`` (an embedding lookup; ``rows``: int64 ``[M]``
    into ``R`` rows); a row index outside ``[0, R)`` gives a row of NaN instead of reading out of
    bounds (``nn.Embedding`` would stop the process with a device-side assert)."""
    i_m = tl.program_id(0)
    o = tl.arange(0, BLOCK)
    m = o < N
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the partials (or the rows) are the kernel before's output
    if GATHER:
        r = tl.load(rows + i_m).to(tl.int64)
        ok = (r >= 0) & (r < R)
        y = tl.load(res + tl.where(ok, r, 0) * srm + o, mask=m, other=0.).to(tl.float32)
        y = tl.where(ok, y, float("nan"))
    else:
        y = tl.load(res + i_m * srm + o, mask=m, other=0.).to(tl.float32)
    for s in tl.static_range(S):
        y += tl.load(part + (s * M + i_m) * N + o, mask=m, other=0.)
    y_h = y.to(h.dtype.element_ty)
    tl.store(h + i_m * shm + o, y_h, mask=m)
    if NORM:
        y = y_h.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(y * y, 0) / N + eps)
        g = tl.load(gamma + o, mask=m, other=0.).to(tl.float32)
        tl.store(hn + i_m * snm + o, (y * rstd * g).to(hn.dtype.element_ty), mask=m)


def _check(x: torch.Tensor, w: torch.Tensor, name: str) -> None:
    if (x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or x.shape[1] != w.shape[1] or x.stride(1) != 1
            or w.stride(1) != 1 or x.dtype != w.dtype or x.dtype not in _DTYPES):
        raise ValueError(f"skinny {name}: x [M <= {MAX_ROWS}, K] and w [N, K] of one dtype with unit last "
                         f"strides, got x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)} {w.dtype}")


def _pdl(device: torch.device) -> dict:
    """The launch's PDL arguments (``tiles.pdl_launch`` of ``PDL``), the prefetch depth checked."""
    if PDL and (PDL_PREFETCH < 0 or pow2(max(PDL_PREFETCH, 1), 1) != max(PDL_PREFETCH, 1)):
        raise ValueError(f"skinny.PDL_PREFETCH: 0 or a power of two (tiles), got {PDL_PREFETCH}")
    return pdl_launch(PDL, device)


def _launch(grid, x, w, out, N, half, so_s, so_m, BN, BK, k_per, warps, stages, swiglu):
    _skinny_kernel[grid](x, w, out, x.shape[0], N, x.shape[1], half, x.stride(0), w.stride(0), so_s, so_m,
                         BM=MAX_ROWS, BN=BN, BK=BK, K_PER=k_per, SWIGLU=swiglu,
                         DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32", PREFETCH=PDL_PREFETCH,
                         LINE=128 // x.element_size(), num_warps=1 if _INTERPRET else warps,
                         num_stages=1 if _INTERPRET else stages, **_pdl(x.device))


@register_kernel("skinny", "decode")  # registered so that callers can ask whether these kernels are available
def _config(name: str, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """``CONFIGS[name]``, with half the BK for float32 (4-byte tiles): the same shared memory per
    pipeline stage as in 16-bit (in_proj's bf16 tiles in 4 stages take 120 KB of the H200's 227)."""
    BN, BK, split, warps, stages = CONFIGS[name]
    return BN, (BK // 2 if dtype == torch.float32 else BK), split, warps, stages


def linear(x: torch.Tensor, w: torch.Tensor, config: str = "in_proj") -> torch.Tensor:
    """``x [M, K] @ w [N, K]^T -> [M, N]`` in ``x``'s dtype (float32 accumulation), one split."""
    _check(x, w, "linear")
    BN, BK, _, warps, stages = _config(config, x.dtype)
    N = w.shape[0]
    out = x.new_empty(x.shape[0], N)
    _launch((cdiv(N, BN), 1), x, w, out, N, 0, 0, out.stride(0), BN, BK, x.shape[1], warps, stages, False)
    return out


def partials(x: torch.Tensor, w: torch.Tensor, config: str = "o_proj") -> torch.Tensor:
    """``x [M, K] @ w [N, K]^T`` as float32 partial sums ``[S, M, N]`` over S slices of K (the
    config's split, fewer when K is short); ``add_norm`` adds them up."""
    _check(x, w, "partials")
    BN, BK, split, warps, stages = _config(config, x.dtype)
    M, K = x.shape
    N = w.shape[0]
    k_per = cdiv(cdiv(K, split), BK) * BK
    S = cdiv(K, k_per)
    out = torch.empty(S, M, N, dtype=torch.float32, device=x.device)
    _launch((cdiv(N, BN), S), x, w, out, N, 0, out.stride(0), out.stride(1), BN, BK, k_per, warps, stages, False)
    return out


def swiglu(x: torch.Tensor, w13: torch.Tensor, config: str = "swiglu") -> torch.Tensor:
    """``silu(x W1^T) * (x W3^T) -> [M, hidden]`` in ``x``'s dtype, ``w13 = [W1; W3]``
    (``[2 * hidden, K]``, as ``archsearch.model.SwiGLU.w13``)."""
    _check(x, w13, "swiglu")
    if w13.shape[0] % 2:
        raise ValueError(f"skinny swiglu: w13 must stack W1 over W3 ([2 * hidden, K]), got {tuple(w13.shape)}")
    BN, BK, _, warps, stages = _config(config, x.dtype)
    hidden = w13.shape[0] // 2
    out = x.new_empty(x.shape[0], hidden)
    _launch((cdiv(hidden, BN), 1), x, w13, out, hidden, hidden, 0, out.stride(0), BN, BK, x.shape[1], warps,
            stages, True)
    return out


def add_norm(part: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor | None = None,
             eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``h = residual + part.sum(0)`` (``part``: float32 ``[S, M, N]``, ``residual``: ``[M, N]``,
    unit last stride; ``h`` in the residual's dtype) and ``rmsnorm(h) * gamma`` (None without
    ``gamma``) -> ``(h, hn)``."""
    S, M, N = part.shape
    if (part.dtype != torch.float32 or not part.is_contiguous() or tuple(residual.shape) != (M, N)
            or residual.stride(1) != 1 or residual.device != part.device
            or (gamma is not None and (tuple(gamma.shape) != (N,) or gamma.stride(0) != 1))):
        raise ValueError(f"skinny add_norm: part float32 [S, M, N] contiguous, residual [M, N] on its device, "
                         f"gamma [N] contiguous; got "
                         f"{tuple(part.shape)} {part.dtype}, {tuple(residual.shape)}, "
                         f"{None if gamma is None else tuple(gamma.shape)}")
    h = residual.new_empty(M, N)
    hn = torch.empty_like(h) if gamma is not None else None
    _add_norm_kernel[(M,)](part, residual, part, gamma if gamma is not None else h, h, hn if hn is not None else h,
                           M, N, M, residual.stride(0), h.stride(0), h.stride(0), eps,
                           S=S, BLOCK=pow2(N), NORM=gamma is not None, GATHER=False,
                           num_warps=1 if _INTERPRET else 8, **_pdl(part.device))
    return h, hn


def embed_norm(weight: torch.Tensor, tokens: torch.Tensor, gamma: torch.Tensor,
               eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """An embedding lookup and the first layer's RMSNorm in one kernel: ``weight: [vocab, N]``
    (unit last stride), ``tokens: [M]`` int64 -> ``(x = weight[tokens] [M, N], rmsnorm(x) * gamma)``
    in ``weight``'s dtype; a token outside the vocabulary gives rows of NaN (no host check: that
    would synchronise every decode step). (The decode step's ``index_select`` took 13 us for 16
    rows on an H200, 2026-12-01, then a norm kernel.)"""
    M = tokens.shape[0]
    N = weight.shape[1]
    if (tokens.dim() != 1 or tokens.stride(0) != 1 or not 1 <= M <= MAX_ROWS or tokens.dtype != torch.long
            or weight.dim() != 2 or weight.stride(1) != 1 or tokens.device != weight.device
            or tuple(gamma.shape) != (N,) or gamma.stride(0) != 1):
        raise ValueError(f"skinny embed_norm: weight [vocab, N] with unit last stride, tokens contiguous int64 "
                         f"[M <= {MAX_ROWS}] on its device, gamma [N] contiguous; got {tuple(weight.shape)}, "
                         f"{tuple(tokens.shape)} {tokens.dtype}, {tuple(gamma.shape)}")
    x = weight.new_empty(M, N)
    hn = torch.empty_like(x)
    # the add_norm kernel with no partials, the residual rows gathered from the weight
    _add_norm_kernel[(M,)](weight, weight, tokens, gamma, x, hn, M, N, weight.shape[0], weight.stride(0),
                           x.stride(0), hn.stride(0), eps, S=0, BLOCK=pow2(N), NORM=True, GATHER=True,
                           num_warps=1 if _INTERPRET else 8, **_pdl(weight.device))
    return x, hn
