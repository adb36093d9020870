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
* ``residual_linear``: a split-K GEMM whose last program per column tile adds the splits' float32
  partials and the residual (the residual stream's new value, in the activation dtype) and writes
  the next RMSNorm as ``NormedRows``: ``h * gamma`` and the sums of ``h^2`` per column tile. The
  GEMM that reads it (``linear``, ``swiglu``) multiplies its rows by ``1 / rms`` in the epilogue,
  so its left operand stays a plain load. That replaces cuBLAS's split-K reduce, the residual add
  and the RMSNorm kernel.
* ``partials`` + ``add_norm``: the same in two kernels (float32 partials, then one program per row
  adds them and normalises); the layer's path with ``RESIDUAL_EPILOGUE`` off, and for a norm
  wanted as a tensor (the final norm before the model's head).
* ``embed_norm``: the same row kernel gathering the embedding rows of the step's tokens, with the
  first layer's RMSNorm: the decode step's first kernel.

Every kernel here is forward-only and runs under ``torch.no_grad`` from ``archsearch.decode_layer``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import register_kernel
from .fitted import jit as _jit
from .tiles import gdc_launch_dependents as _gdc_launch_dependents, gdc_wait as _gdc_wait
from .tiles import INTERPRET as _INTERPRET, cdiv, pdl_launch, pow2, sm_count

MAX_ROWS = 16
# (BN, BK, SPLIT_K, num_warps, num_stages) per GEMM of a decode layer (H200). in_proj, swiglu: the
# fastest of ``benchmarks/skinny_configs.py`` (2026-12-01 10:46; ``swiglu`` reads two weight blocks
# per program, so it takes the w13 case's BN per half). o_proj, w2 (``residual_linear``) and
# ``*_partials`` (the same GEMMs as ``partials`` + ``add_norm``): the fastest in the whole decode
# graph (13:10, ``gpu_kernels.py --compiled-sets`` with ``CONFIGS.KEY=...`` entries, round-robin,
# docs/benchmarks/decode_residual_epilogue.md): there the isolated sweep's favourite (64, 256, 4),
# 5.43 against 7.53 us per o_proj call alone, made the gated_deltanet x24 step 1.488 ms against
# 1.441 with (32, 128, 4). w2 at 8 stages (its splits walk 11 K tiles; o_proj's only 4): the x24 graphs
# 1.365 -> 1.355 ms gated_deltanet, 1.312 -> 1.301 simple_gla, every pass below every pass at 4
# stages (H200 2026-12-02 18:33, docs/benchmarks/decode_sets_1202_1833.md; 6 stages +0.4%, swiglu and
# in_proj at 6 +0.9..+2.5%); Nsight Compute had the GEMMs short of bytes in flight (ncu_decode_1202.md).
# swiglu, o_proj, w2 at block 64 and 4 warps since 2026-12-03 (with ``SWAP_AB``, below). w2 at BK 256 /
# 4 stages, o_proj at BK 256 in 2 splits (each split's rows 512 B per tile, as in_proj's, which sits at
# its read ceiling): x24 graphs w2 alone gated_deltanet 1.314 -> 1.304 / simple_gla 1.277 -> 1.264 ms on a
# steady host (H200 2026-12-03 08:21, every pass below every base pass for simple_gla), 1.359 -> 1.356 /
# 1.325 -> 1.312 in a slow-mode call after it; with o_proj 1.352 / 1.309; w1|w3 at BK 256 (3 stages, 216
# KB) a tie, and with w2's worse than w2's alone (docs/benchmarks/decode_sets_1203_0821.md).
# swiglu at block 32 (with ``BALANCED_SWIGLU`` and ``SWIGLU_ONE_TILE``: 264 programs of ~21 columns, one
# [64, 128] tile per K step, 80 KB, two programs per SM) instead of 64: x24 graphs gated_deltanet 1.349 ->
# 1.343 ms, simple_gla 1.312 -> 1.302, every pass below (H200 2026-12-03 09:41, slow-mode host,
# docs/benchmarks/decode_sets_1203_0941.log); 1.285 -> 1.283 / 1.249 -> 1.242 at 09:53 (decode_1203_0953.md);
# the fastest GEMM-shaped read of the weight in benchmarks/tile_reads.py (tile_reads_1203_0948.md). At 3
# stages (three per SM) +3.3 / +3.0%, BK 64 / 6 stages +2.0 / +1.5%.
# ``head``: the model's head after a fused last layer (``decode_graph.HEAD_KERNEL``), in_proj's tiles.
CONFIGS = {"in_proj": (64, 256, 1, 4, 4), "swiglu": (32, 128, 1, 4, 4), "head": (64, 256, 1, 4, 4),
           "o_proj": (64, 256, 2, 4, 4), "w2": (64, 256, 4, 4, 4),
           "o_proj_partials": (64, 128, 4, 4, 4), "w2_partials": (64, 128, 4, 4, 4)}
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
# Lost: the weights read by TMA; the next kernel's first reads prefetched into L2 by the kernel
# before as its programs finish; the weights in a tile-major copy (each tile one contiguous block,
# 2026-12-03). history: docs/benchmarks/kernel_decisions/skinny.md#lost
PDL = True
PDL_PREFETCH = 2  # K tiles of weights prefetched; 0 or a power of two (one prefetch per cache line)
# Per GEMM (a ``CONFIGS`` key): its own prefetch depth instead of ``PDL_PREFETCH`` (``--set
# PREFETCH_TILES.swiglu=4``). The step's GEMMs overlap different kernels: w1|w3 launches under o_proj,
# whose 8.4 MB leave the memory idle for most of its ~6 us (and whose 80 KB of shared memory leave
# room for w1|w3's 144 KB beside it), o_proj under the mixer. Timed (H200 2026-12-03 07:14, x24
# graphs, 5 passes, docs/benchmarks/decode_sets_1203_0714.md): w1|w3 at 4 tiles a tie, at 8 +1.2%;
# o_proj's whole slice (4) a tie: none set.
PREFETCH_TILES: dict[str, int] = {}
# ``archsearch.decode_layer``: o_proj and w2 as ``residual_linear`` (the residual add and the next
# norm in the GEMM's last split, the norm's 1 / rms applied by the next GEMM) instead of
# ``partials`` + ``add_norm``: 5 kernels per layer instead of 7.
RESIDUAL_EPILOGUE = True
# Each weight is read once per step: its loads marked ``evict_first`` in L2 (and the PDL prefetches
# ``evict_last``), so that streaming a GEMM's weights does not push out the next GEMM's prefetched
# tiles, the activations, partials and the states around them. The GPU host's Triton 3.6 drops the
# policy from the K loop's asynchronous copies (its sm_90 PTX has no cache hint there; 3.9's has), so
# what was timed there is the prefetches' ``evict_last``. Timed (H200 2026-12-02 21:46 / 21:49,
# compiled x24 graphs, ``--compiled-sets`` round robin, docs/benchmarks/decode_sets_1202_late.md):
# gated_deltanet 1.341 -> 1.334 and 1.345 -> 1.335 ms, simple_gla 1.282 -> 1.281 and 1.286 -> 1.281,
# in the second call every pass below every pass of the base. Lost in those calls: the mixer's state
# loads and stores marked the same way (a tie / +0.9%), the GEMMs letting the next kernel launch only
# after their K loop instead of first thing (+2.1 / +2.6%), deeper prefetches with either (4 or 8
# tiles: +8..+17%). history: docs/benchmarks/kernel_decisions/skinny.md#weight_evict_first
WEIGHT_EVICT_FIRST = True
# The products with the weights as their M side (``[BN, K] x [K, 16]``, accumulators ``[BN, BM]``
# transposed after the loop) instead of the activation rows: at M = 16 Triton issues ``mma.sync`` from
# registers, at BN >= 64 with 4 warps a warpgroup MMA reading both operands from shared memory (sm_90,
# Triton 3.6: in_proj 98 registers against 128). On with swiglu, o_proj and w2 at block 64 / 4 warps
# (``CONFIGS``) and ``decode_mixer.STATE_BEFORE_WAIT``: the x24 graphs gated_deltanet 1.327 -> 1.309 ms,
# simple_gla 1.275 -> 1.273 (H200 2026-12-03 06:10, 5 round-robin passes, docs/benchmarks/
# decode_sets_1203.md); these GEMMs alone -0.2%, the switch alone at the old blocks +1.1..1.6% (04:26).
SWAP_AB = True
# One-split GEMMs (``swiglu``, ``linear``) with their output columns spread evenly over a whole number
# of waves of programs (``balanced_programs``) instead of one program per ``BN`` columns: w1|w3's 5504
# columns at block 64 are 86 programs, which leave 46 of the H200's 132 SMs idle; balanced, 132
# programs of 41-42 columns (their blocks' last rows masked: no bytes read for them). And
# ``SWIGLU_ONE_TILE``: W1's and W3's rows of a program's block as one ``[2 BN, BK]`` tile (one load,
# one product per K step) instead of two. Timed (H200 2026-12-03 09:21, x24 compiled graphs, 5
# round-robin passes on a steady host, docs/benchmarks/decode_sets_1203_0921.md): both on,
# gated_deltanet 1.335 -> 1.321 ms, simple_gla 1.294 -> 1.284, every pass below every base pass;
# ``SWIGLU_ONE_TILE`` alone -0.3 / -0.2%. w1|w3 alone now reads at the streaming read's ceiling (12.76
# against 12.66 us, docs/benchmarks/tile_reads_1203_0948.md) but keeps ~16 us of the step's path in every
# form tried (86 or 132 programs, one or two tiles, 4 or 8 warps, BK 128 or 256): in the step the gain is
# w2's, whose programs no longer wait on SMs w1|w3 left idle (its own span 24.8 -> 11.8 us, 09:16 call,
# docs/benchmarks/decode_sets_1203_0916.md). ``BALANCED_LINEAR`` (in_proj: 129 -> 132 programs) a tie.
BALANCED_SWIGLU = True
BALANCED_LINEAR = False
SWIGLU_ONE_TILE = True
SWITCHES = {"PDL": (False, True), "PDL_PREFETCH": (0, 2, 8, 32), "RESIDUAL_EPILOGUE": (False, True),
            "WEIGHT_EVICT_FIRST": (False, True), "SWAP_AB": (False, True), "BALANCED_SWIGLU": (False, True),
            "BALANCED_LINEAR": (False, True), "SWIGLU_ONE_TILE": (False, True)}


@triton.jit
def _prefetch_l2(w, o_n, m_n, swn, k0, k_end, BK: tl.constexpr, TILES: tl.constexpr, LINE: tl.constexpr,
                 KEEP: tl.constexpr):
    """Pull the weight rows ``o_n``, columns ``k0 .. k0 + TILES * BK`` (before ``k_end``) into L2:
    one ``prefetch.global.L2`` per ``LINE``-element cache line (``KEEP``: ``::evict_last``)."""
    o_l = k0 + tl.arange(0, TILES * BK // LINE) * LINE
    m = m_n[:, None] & (o_l < k_end)[None, :]
    p = w + o_n[:, None] * swn + o_l[None, :]
    if KEEP:
        tl.inline_asm_elementwise("@$2 prefetch.global.L2::evict_last [$1]; mov.b32 $0, 0;", "=r,l,b", [p, m],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("@$2 prefetch.global.L2 [$1]; mov.b32 $0, 0;", "=r,l,b", [p, m],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _acc_zeros(BM: tl.constexpr, BN: tl.constexpr, SWAP: tl.constexpr):
    """A float32 accumulator of the ``[BM, BN]`` product, ``[BN, BM]`` with ``SWAP``."""
    if SWAP:
        return tl.zeros([BN, BM], dtype=tl.float32)
    else:
        return tl.zeros([BM, BN], dtype=tl.float32)


@triton.jit
def _acc_dot(acc, b_x, b_w, SWAP: tl.constexpr, DOT_PREC: tl.constexpr):
    """``acc + x . w^T`` (``b_x: [BM, BK]``, ``b_w: [BN, BK]``), or with ``SWAP`` its transpose
    ``acc + w . x^T``: the weights as the product's M side."""
    if SWAP:
        return tl.dot(b_w, tl.trans(b_x), acc, input_precision=DOT_PREC)
    else:
        return tl.dot(b_x, tl.trans(b_w), acc, input_precision=DOT_PREC)


@_jit
def _skinny_kernel(x, w, out, M, N, K, HALF, sxm, swn, so_s, so_m,
                   ss_in, T_in, N_in, eps_in, res, srm, part, xg, sxg, gamma, ss_out, tickets,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, K_PER: tl.constexpr,
                   SWIGLU: tl.constexpr, DOT_PREC: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                   LINE: tl.constexpr, ROW_SCALE: tl.constexpr, BT: tl.constexpr, RESIDUAL: tl.constexpr,
                   SPLITS: tl.constexpr, GAMMA: tl.constexpr, W_EVICT: tl.constexpr, SWAP: tl.constexpr,
                   BALANCED: tl.constexpr, ONE_TILE: tl.constexpr):
    """Grid (cdiv(N, BN), SPLIT_K), or with ``BALANCED`` (one split, no ``RESIDUAL``) (P, 1): program
    ``i`` takes the output columns ``[i N // P, (i + 1) N // P)`` (at most ``BN``). ``x: [M <= BM, K]``,
    ``w: [*, K]`` (unit last strides). ``ONE_TILE`` (only with ``SWIGLU``; ``SWIGLU_ONE_TILE``): SwiGLU's
    W1 and W3 rows of a block loaded as one ``[2 BN, BK]`` tile, one product per K step (``[2 BN, BM]``),
    its halves split after the loop.
    Plain: ``out[s, :M, n] = x[:, ks] . w[n, ks]`` over this split's keys ``ks = [s K_PER, (s+1) K_PER)``
    (``so_s`` the split stride of float32 partials; 0 with one split). ``SWIGLU``:
    ``out[:M, n] = silu(x . w[n]) * (x . w[HALF + n])`` for ``n < N`` (one split).

    ``ROW_SCALE``: ``x`` is an RMSNorm's input times its weight (``NormedRows.scaled``) and row
    ``m`` of each product is multiplied by ``rsqrt(sum_t ss_in[t, m] / N_in + eps_in)`` (``ss_in``:
    float32 ``[T_in, M]`` sums of squares per column tile) before the SiLU: the norm's ``1 / rms``
    is a per-row factor, so it leaves the dot product and the weights stay a plain load.

    ``RESIDUAL``: ``out[:M, n] = res[:M, n] + x . w[n]`` (``out`` in the activation dtype) over
    ``SPLITS`` splits of K. With more than one, each split stores its float32 partial in ``part``
    (``[SPLITS, M, N]``) and takes a ticket (``tickets[i_n]``); the last of a column tile adds them
    up, finishes the tile and sets the ticket back to 0 for the next call (one split: no partials,
    no ticket). ``GAMMA``: it also writes ``xg = out * gamma`` (in the activation dtype) and
    ``ss_out[i_n, m]``, the tile's sum of ``out[m]^2`` (float32): the next GEMM's ``ROW_SCALE``
    operands. ``W_EVICT``: the weight loads' L2 eviction policy (``""`` or ``"evict_first"``,
    ``WEIGHT_EVICT_FIRST``); with one, the PDL prefetches are ``evict_last``. ``SWAP``
    (``SWAP_AB``): the products formed as ``w . x^T`` (``[BN, BM]``), transposed after the K loop."""
    i_n = tl.program_id(0)
    i_s = tl.program_id(1)
    o_m = tl.arange(0, BM)
    m_m = o_m < M
    if BALANCED:
        n_lo = i_n * N // tl.num_programs(0)
        n_hi = (i_n + 1) * N // tl.num_programs(0)
    else:
        n_lo = i_n * BN
        n_hi = N
    o_n = n_lo + tl.arange(0, BN)
    m_n = o_n < n_hi
    acc = _acc_zeros(BM, BN, SWAP)  # [BN, BM] with SWAP, transposed after the K loop
    acc3 = _acc_zeros(BM, BN, SWAP)
    if ONE_TILE:  # W1's rows of the tile, then W3's: one [2 BN, BK] weight tile per K step
        o_2 = tl.arange(0, 2 * BN)
        o_c = n_lo + o_2 % BN  # the output column of each weight row
        m_w = o_c < n_hi
        o_w = o_c + tl.where(o_2 < BN, 0, HALF)
        acc2 = _acc_zeros(BM, 2 * BN, SWAP)
    k_end = tl.minimum(i_s * K_PER + K_PER, K)
    if PDL:
        _gdc_launch_dependents()
        if PREFETCH > 0:
            if ONE_TILE:
                _prefetch_l2(w, o_w, m_w, swn, i_s * K_PER, k_end, BK, PREFETCH, LINE, W_EVICT != "")
            else:
                _prefetch_l2(w, o_n, m_n, swn, i_s * K_PER, k_end, BK, PREFETCH, LINE, W_EVICT != "")
                if SWIGLU:
                    _prefetch_l2(w, HALF + o_n, m_n, swn, i_s * K_PER, k_end, BK, PREFETCH, LINE, W_EVICT != "")
        _gdc_wait()  # x is the kernel before's output
    # the epilogue's operands, loaded before the K loop so that their latency hides behind it (by
    # every split: which one finishes the tile is known only at the end)
    m_mn = m_m[:, None] & m_n[None, :]
    if ROW_SCALE:
        o_t = tl.arange(0, BT)
        ss = tl.load(ss_in + o_t[:, None] * M + o_m[None, :], mask=(o_t < T_in)[:, None] & m_m[None, :], other=0.)
    if RESIDUAL:
        r = tl.load(res + o_m[:, None] * srm + o_n[None, :], mask=m_mn, other=0.).to(tl.float32)
        g = tl.load(gamma + o_n, mask=m_n & GAMMA, other=0.).to(tl.float32)
    for k0 in range(i_s * K_PER, k_end, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < k_end
        b_x = tl.load(x + o_m[:, None] * sxm + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.)
        if ONE_TILE:
            b_w = tl.load(w + o_w[:, None] * swn + o_k[None, :], mask=m_w[:, None] & m_k[None, :], other=0.,
                          eviction_policy=W_EVICT)
            acc2 = _acc_dot(acc2, b_x, b_w, SWAP, DOT_PREC)
        else:
            b_w = tl.load(w + o_n[:, None] * swn + o_k[None, :], mask=m_n[:, None] & m_k[None, :], other=0.,
                          eviction_policy=W_EVICT)
            acc = _acc_dot(acc, b_x, b_w, SWAP, DOT_PREC)
            if SWIGLU:
                b_w3 = tl.load(w + (HALF + o_n)[:, None] * swn + o_k[None, :], mask=m_n[:, None] & m_k[None, :],
                               other=0., eviction_policy=W_EVICT)
                acc3 = _acc_dot(acc3, b_x, b_w3, SWAP, DOT_PREC)
    if ONE_TILE:
        if SWAP:
            acc2 = tl.trans(acc2)  # [BM, 2 BN]: W1's products, then W3's
        acc, acc3 = tl.split(tl.permute(tl.reshape(acc2, [BM, 2, BN]), (0, 2, 1)))
    elif SWAP:
        acc = tl.trans(acc)
        acc3 = tl.trans(acc3)
    if ROW_SCALE:
        rstd = tl.rsqrt(tl.sum(ss, 0) / N_in + eps_in)
        acc = acc * rstd[:, None]
        acc3 = acc3 * rstd[:, None]
    if SWIGLU:
        acc = acc * tl.sigmoid(acc) * acc3
    if RESIDUAL:
        if SPLITS > 1:
            o_part = part + o_m[:, None] * N + o_n[None, :]
            tl.store(o_part + i_s * M * N, acc, mask=m_mn)
            tl.debug_barrier()  # every thread's partial stored before the ticket (its release covers them)
            if tl.atomic_add(tickets + i_n, 1, sem="acq_rel") == SPLITS - 1:
                # every split's partial, this one's re-read too: the sum's order is then the same
                # whichever split finishes (results repeat bit for bit); from L2
                acc = tl.zeros([BM, BN], dtype=tl.float32)
                for s in tl.static_range(SPLITS):
                    acc += tl.load(o_part + s * M * N, mask=m_mn, other=0., cache_modifier=".cg")
                tl.store(tickets + i_n, 0)
                _finish_residual(acc + r, out, so_m, xg, sxg, g, ss_out, M, i_n, o_m, o_n, m_m, m_n, GAMMA)
        else:
            _finish_residual(acc + r, out, so_m, xg, sxg, g, ss_out, M, i_n, o_m, o_n, m_m, m_n, GAMMA)
    else:
        tl.store(out + i_s * so_s + o_m[:, None] * so_m + o_n[None, :], acc.to(out.dtype.element_ty), mask=m_mn)


@triton.jit
def _finish_residual(y, out, so_m, xg, sxg, g, ss_out, M, i_n, o_m, o_n, m_m, m_n, GAMMA: tl.constexpr):
    """A column tile's ``out = y`` (``y`` = residual + product, float32 ``[BM, BN]``) and (``GAMMA``)
    its ``xg = out * g`` (``g``: the norm weight's ``[BN]`` columns) and ``ss_out[i_n] = sum(out^2,
    columns)``, from the rounded ``out`` (as ``F.rms_norm`` sees it)."""
    m_mn = m_m[:, None] & m_n[None, :]
    y_h = y.to(out.dtype.element_ty)
    tl.store(out + o_m[:, None] * so_m + o_n[None, :], y_h, mask=m_mn)
    if GAMMA:
        y = y_h.to(tl.float32)
        tl.store(ss_out + i_n * M + o_m, tl.sum(y * y, 1), mask=m_m)
        tl.store(xg + o_m[:, None] * sxg + o_n[None, :], (y * g[None, :]).to(xg.dtype.element_ty), mask=m_mn)


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
        _gdc_launch_dependents()
        _gdc_wait()  # the partials (or the rows) are the kernel before's output
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
    """The launch's PDL arguments (``tiles.pdl_launch`` of ``PDL``)."""
    return pdl_launch(PDL, device)


def prefetch_depth_ok(tiles: int) -> bool:
    """A prefetch depth the kernel takes: 0 or a power of two (K tiles; one prefetch per cache line)."""
    return tiles >= 0 and pow2(max(tiles, 1), 1) == max(tiles, 1)


def _prefetch_tiles(config: str) -> int:
    """The K tiles of weights the GEMM ``config`` (a ``CONFIGS`` key) prefetches before its PDL wait:
    ``PREFETCH_TILES[config]``, else ``PDL_PREFETCH``; checked (``prefetch_depth_ok``)."""
    tiles = PREFETCH_TILES.get(config, PDL_PREFETCH)
    if not prefetch_depth_ok(tiles):
        name = f"PREFETCH_TILES[{config!r}]" if config in PREFETCH_TILES else "PDL_PREFETCH"
        raise ValueError(f"skinny.{name}: 0 or a power of two (tiles), got {tiles}")
    return tiles


class NormedRows(NamedTuple):
    """An RMSNorm's output as one skinny kernel hands it to the next, the ``1 / rms`` not applied:
    ``scaled: [M, N]`` the norm's input times its weight (activation dtype), ``sumsq: [T, M]``
    float32 sums of the input's squares over T column tiles, ``eps`` the norm's. The GEMM reading
    it (``linear``, ``swiglu``) scales its product's rows, which keeps its left operand a plain load.
    ``scaled`` is the un-normalised row: in float16 a norm weight above 1 can take it past 65504
    where the normalised row would fit (bfloat16 and float32 have the range)."""

    scaled: torch.Tensor
    sumsq: torch.Tensor
    eps: float

    def materialize(self) -> torch.Tensor:
        """``rmsnorm(h) * gamma [M, N]`` in PyTorch (tests, and a consumer that is not a skinny GEMM)."""
        rstd = torch.rsqrt(self.sumsq.sum(0) / self.scaled.shape[1] + self.eps)
        return (self.scaled.float() * rstd[:, None]).to(self.scaled.dtype)


# Split-K tickets of ``residual_linear`` (int32, one per column tile; each call's last split sets
# its tile's back to 0). One buffer per device serves every call: a kernel touches the tickets only
# after ``gdc_wait``, so after every kernel before it in the stream has finished. Two streams
# decoding on one device at once would share them: not supported.
_TICKETS: dict[torch.device, torch.Tensor] = {}
_MAX_TILES = 1 << 16


def _tickets(device: torch.device, tiles: int) -> torch.Tensor:
    if tiles > _MAX_TILES:
        raise ValueError(f"skinny residual_linear: {tiles} column tiles, at most {_MAX_TILES}")
    t = _TICKETS.get(device)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("skinny residual_linear: call it once on this device before capturing a CUDA graph "
                               "(its split-K tickets are allocated and zeroed outside the graph)")
        t = _TICKETS[device] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)
    return t


def _launch(grid, x, w, out, N, k_per, config, so_m, *, half=0, so_s=0, swiglu=False, norm_in: NormedRows | None = None,
            res=None, part=None, norm_out: NormedRows | None = None, gamma=None, splits=1, balanced=False):
    """One ``_skinny_kernel`` launch: ``norm_in`` the ``NormedRows`` whose row scale it applies
    (``ROW_SCALE``), ``res`` / ``part`` / ``norm_out`` / ``gamma`` the residual epilogue's operands
    (``RESIDUAL``, ``GAMMA``), ``config`` the ``CONFIGS`` key it runs at; ``balanced`` (one split):
    the ``N`` columns spread over ``balanced_programs`` programs instead of ``grid[0]``. A pointer
    the launch does not use gets ``out`` (never read)."""
    def given(t):
        return out if t is None else t

    if balanced:
        grid = (balanced_programs(N, grid[0], x.device), 1)

    tiles_in = norm_in.sumsq.shape[0] if norm_in is not None else 0
    ticketed = res is not None and splits > 1
    constexprs, launch = kernel_constexprs(config, x.dtype, k_per, swiglu=swiglu, tiles_in=tiles_in,
                                           residual=res is not None, splits=splits, gamma=norm_out is not None,
                                           balanced=balanced)
    _skinny_kernel[grid](x, w, out, x.shape[0], N, x.shape[1], half, x.stride(0), w.stride(0), so_s, so_m,
                         given(norm_in and norm_in.sumsq), max(tiles_in, 1), norm_in.scaled.shape[1] if norm_in else 1,
                         norm_in.eps if norm_in else 0., given(res), res.stride(0) if res is not None else 0,
                         given(part), given(norm_out and norm_out.scaled),
                         norm_out.scaled.stride(0) if norm_out else 0, given(gamma),
                         given(norm_out and norm_out.sumsq), _tickets(x.device, grid[0]) if ticketed else out,
                         **constexprs, **(dict(num_warps=1, num_stages=1) if _INTERPRET else launch), **_pdl(x.device))


def kernel_constexprs(config: str, dtype: torch.dtype, k_per: int, *, swiglu: bool = False, tiles_in: int = 0,
                      residual: bool = False, splits: int = 1, gamma: bool = False,
                      balanced: bool = False) -> tuple[dict, dict]:
    """``_skinny_kernel``'s constexprs but ``PDL`` and its ``num_warps`` / ``num_stages`` for the GEMM
    ``config`` (a ``CONFIGS`` key) in ``dtype`` walking ``k_per`` keys per split, as the module's
    switches stand: ``tiles_in`` the column tiles of the ``NormedRows`` it scales by (0: a plain left
    operand), ``residual`` / ``splits`` / ``gamma`` the residual epilogue's, ``balanced`` the columns spread
    evenly over the programs (``BALANCED_SWIGLU`` / ``BALANCED_LINEAR``). One place for what
    ``_launch`` runs and what ``benchmarks/kernels_aot_regs.py`` and the PTX tests compile."""
    BN, BK, _, warps, stages = _config(config, dtype)
    if balanced and (residual or splits > 1):
        raise ValueError("skinny: balanced columns serve one-split GEMMs without the residual epilogue")
    constexprs = dict(BM=MAX_ROWS, BN=BN, BK=BK, K_PER=k_per, SWIGLU=swiglu,
                      DOT_PREC="ieee" if dtype == torch.float32 else "tf32", PREFETCH=_prefetch_tiles(config),
                      LINE=128 // dtype.itemsize, ROW_SCALE=tiles_in > 0, BT=pow2(max(tiles_in, 1), 1),
                      RESIDUAL=residual, SPLITS=splits, GAMMA=gamma,
                      W_EVICT="evict_first" if WEIGHT_EVICT_FIRST else "", SWAP=SWAP_AB, BALANCED=balanced,
                      ONE_TILE=swiglu and SWIGLU_ONE_TILE)
    return constexprs, dict(num_warps=warps, num_stages=stages)


# The SMs a balanced launch spreads its columns over where the device has no SM count (the interpreter)
INTERPRET_SMS = 3


def balanced_programs(N: int, tiles: int, device: torch.device) -> int:
    """Programs for ``N`` output columns that ``tiles`` programs of ``BN`` columns would cover, spread
    evenly over whole waves of the device's SMs: ``waves * SMs`` (``waves = cdiv(tiles, SMs)``), so
    that each takes ``N // P`` or ``N // P + 1 <= BN`` columns; at most ``N`` (a column each)."""
    sms = sm_count(device) if device.type == "cuda" else INTERPRET_SMS
    return min(cdiv(tiles, sms) * sms, N)


@register_kernel("skinny", "decode")  # registered so that callers can ask whether these kernels are available
def _config(name: str, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """``CONFIGS[name]``, with half the BK for float32 (4-byte tiles): the same shared memory per
    pipeline stage as in 16-bit (in_proj's bf16 tiles in 4 stages take 120 KB of the H200's 227)."""
    BN, BK, split, warps, stages = CONFIGS[name]
    return BN, (BK // 2 if dtype == torch.float32 else BK), split, warps, stages


def _operand(x: torch.Tensor | NormedRows, w: torch.Tensor, name: str) -> tuple[torch.Tensor, NormedRows | None]:
    """``(left operand, the NormedRows whose row scale the kernel applies or None)``, checked."""
    rows = x if isinstance(x, NormedRows) else None
    x = rows.scaled if rows is not None else x
    _check(x, w, name)
    if rows is not None and (rows.sumsq.dtype != torch.float32 or rows.sumsq.dim() != 2
                             or rows.sumsq.shape[1] != x.shape[0] or not rows.sumsq.is_contiguous()):
        raise ValueError(f"skinny {name}: NormedRows.sumsq float32 [T, M] contiguous, got "
                         f"{tuple(rows.sumsq.shape)} {rows.sumsq.dtype}")
    return x, rows


def linear(x: torch.Tensor | NormedRows, w: torch.Tensor, config: str = "in_proj") -> torch.Tensor:
    """``x [M, K] @ w [N, K]^T -> [M, N]`` in ``x``'s dtype (float32 accumulation), one split;
    ``x`` may be ``NormedRows`` (the product of the normed rows)."""
    x, rows = _operand(x, w, "linear")
    cfg = _config(config, x.dtype)
    N = w.shape[0]
    out = x.new_empty(x.shape[0], N)
    _launch((cdiv(N, cfg[0]), 1), x, w, out, N, x.shape[1], config, out.stride(0), norm_in=rows,
            balanced=BALANCED_LINEAR)
    return out


def partials(x: torch.Tensor, w: torch.Tensor, config: str = "o_proj_partials") -> torch.Tensor:
    """``x [M, K] @ w [N, K]^T`` as float32 partial sums ``[S, M, N]`` over S slices of K (the
    config's split, fewer when K is short); ``add_norm`` adds them up."""
    _check(x, w, "partials")
    cfg = _config(config, x.dtype)
    M, K = x.shape
    N = w.shape[0]
    k_per, S = _split(K, cfg)
    out = torch.empty(S, M, N, dtype=torch.float32, device=x.device)
    _launch((cdiv(N, cfg[0]), S), x, w, out, N, k_per, config, out.stride(1), so_s=out.stride(0))
    return out


def _split(K: int, cfg) -> tuple[int, int]:
    """``(keys per split, splits)``: the config's split of K in whole BK tiles (fewer when K is short)."""
    BK, split = cfg[1], cfg[2]
    k_per = cdiv(cdiv(K, split), BK) * BK
    return k_per, cdiv(K, k_per)


def residual_linear(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor | None = None,
                    eps: float = 1e-6, config: str = "o_proj") -> tuple[torch.Tensor, NormedRows | None]:
    """``h = residual + x [M, K] @ w [N, K]^T`` (``h`` in ``x``'s dtype) and, with ``gamma``, the
    RMSNorm of ``h`` as ``NormedRows`` for the next ``linear`` / ``swiglu``, in one kernel: the
    config's split-K partials are added up by each column tile's last split (``partials`` +
    ``add_norm`` in two kernels, which this replaces)."""
    _check(x, w, "residual_linear")
    cfg = _config(config, x.dtype)
    M, K = x.shape
    N = w.shape[0]
    if (tuple(residual.shape) != (M, N) or residual.stride(1) != 1 or residual.dtype != x.dtype
            or residual.device != x.device or (gamma is not None and (tuple(gamma.shape) != (N,) or gamma.stride(0) != 1))):
        raise ValueError(f"skinny residual_linear: residual [M, N] of x's dtype with unit last stride, gamma [N] "
                         f"contiguous; got {tuple(residual.shape)} {residual.dtype}, "
                         f"{None if gamma is None else tuple(gamma.shape)}")
    k_per, S = _split(K, cfg)
    tiles = cdiv(N, cfg[0])
    h = x.new_empty(M, N)
    part = torch.empty(S, M, N, dtype=torch.float32, device=x.device) if S > 1 else None
    normed = (NormedRows(torch.empty_like(h), torch.empty(tiles, M, dtype=torch.float32, device=x.device), eps)
              if gamma is not None else None)
    _launch((tiles, S), x, w, h, N, k_per, config, h.stride(0), res=residual, part=part, norm_out=normed, gamma=gamma,
            splits=S)
    return h, normed


def swiglu(x: torch.Tensor | NormedRows, w13: torch.Tensor, config: str = "swiglu") -> torch.Tensor:
    """``silu(x W1^T) * (x W3^T) -> [M, hidden]`` in ``x``'s dtype, ``w13 = [W1; W3]``
    (``[2 * hidden, K]``, as ``archsearch.model.SwiGLU.w13``); ``x`` may be ``NormedRows``."""
    x, rows = _operand(x, w13, "swiglu")
    if w13.shape[0] % 2:
        raise ValueError(f"skinny swiglu: w13 must stack W1 over W3 ([2 * hidden, K]), got {tuple(w13.shape)}")
    cfg = _config(config, x.dtype)
    hidden = w13.shape[0] // 2
    out = x.new_empty(x.shape[0], hidden)
    _launch((cdiv(hidden, cfg[0]), 1), x, w13, out, hidden, x.shape[1], config, out.stride(0), half=hidden, swiglu=True,
            norm_in=rows, balanced=BALANCED_SWIGLU)
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
