"""Triton chunk kernels, forward and backward, for the delta rules: ``delta_rule`` and
``gated_delta_rule`` (scalar decay ``g: [B, T, H]``, log space).

    S'_t = exp(g_t) S_{t-1}                                  S: [K, V] per (batch, head), float32 carry
    S_t  = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T
    o_t  = scale * S_t^T q_t

The WY/UT representation (flash-linear-attention's decomposition, written for this project). In a
chunk of ``BT`` positions with chunk-local inclusive log-decay prefix sums ``G`` and start state ``S``:

    A    = strict_lower(beta_i exp(G_i - G_j) k_i . k_j)     [BT, BT]
    Tm   = (I + A)^-1                                        unit lower triangular
    w    = Tm (beta exp(G) * k)    u = Tm (beta * v)         [BT, K], [BT, V]  (independent of S)
    U    = u - w S                                           the values actually written
    o    = scale (exp(G) * q) S + scale (q k^T * exp(G_i - G_j) [j <= i]) U
    S_C  = exp(G_C) S + (k * exp(G_C - G))^T U

Kernels (each per chunk and parallel unless said): ``_kkt_kernel`` builds ``A`` with one
``[BT, K] x [K, BT]`` product; ``_solve_tril_kernel`` inverts it (16x16 diagonal blocks by forward
substitution, merged with 16x16 dots), both in one program per chunk (``_kkt_solve_kernel``,
``KKT_SOLVE_FUSED``); ``_wu_kernel`` forms ``w, u``; ``_fwd_h`` walks the chunks of a
(batch, head, V slice) in order *inside the kernel*, storing every chunk-start state and ``U``;
``_fwd_o`` computes every chunk's output (and keeps its scores ``P``). The backward takes the forward's
``Ai`` and, by default, its ``w``, chunk states, ``U`` and ``P`` (``KEEP_WU``, ``KEEP_H``, ``KEEP_P``; else
recomputed); ``_bwd_dv_local`` forms the intra-chunk ``P^T do``; a reverse walk ``_bwd_dh`` carries the
state gradient and produces ``dU``; ``_bwd_dqkwg`` gives ``dq`` and the parts of ``dk, dw, dG`` through
``o`` and the state; ``_wy_bwd`` back-propagates through ``Tm`` (``dA = -Tm^T dTm Tm^T``) into
``dk, dv, dbeta`` and turns the chunk-local ``dG`` into ``dg`` by a reverse cumsum.

Every per-chunk kernel takes ``C0``, the chunk of its grid's first program, and the walks a chunk
range ``[C0, C1)`` with the carried state in and out as float32 ``[B, H, K, V]``: at long sequences
the walks run in segments beside the per-chunk kernels (``overlap.py``, ``WALK_SEGMENTS``; the reverse
walk in ``BWD_WALK_SEGMENTS``, one); the results are the same bits either way.

Every exponent is <= 0 (pairs ``j > i`` masked to -inf before ``exp``; padded rows past ``T`` take
the last valid ``G``), so strong decay underflows instead of overflowing. Padding loads
``k = v = beta = 0``, which leaves the state unchanged.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blocks.ops.utils import check_gate, check_qkv

from . import low_memory_from_env, overlap as _overlap, register_kernel
from .fallback import falls_back_to, reference_gradients
from .fitted import KernelDoesNotFit, jit as _jit
from .tiles import cdiv as _cdiv, dot_operand as _op, launch as _launch
from .tiles import dot_prec as _prec, load_rows as _load_rows, pow2 as _pow2
from .tiles import seq as _seq, state_dtype as _state_dtype, store_rows as _store_rows, warps as _warps
from .tiles import walk_bv as _tiles_walk_bv
from .tiles import block_lower as _block_lower, load_rows_where as _load_rows_where
from .tiles import store_rows_where as _store_rows_where
from .tiles import chunk_grid as _tiles_chunk_grid, chunk_ids as _chunk_ids, tile_ids as _tile_ids
from .tiles import backward_will_run

BT = 64  # chunk length inside the kernels (the ops' chunk_size belongs to the PyTorch form)
BC = 16  # diagonal block of the triangular inverse
_BC: tl.constexpr = tl.constexpr(BC)  # BC inside kernels (Triton reads only constexpr globals)
MAX_K = 128  # the per-chunk kernels keep full-K rows in registers; larger K runs the PyTorch form
# Warps and pipelining stages per kernel (``num_stages: None`` = ``tiles.stages``: 2 for bf16,
# 1 for float32): the fastest of benchmarks/kernel_launch_sweep.py's one-at-a-time variants on the
# H200 (docs/benchmarks/kernel_launch_sweep.md), which beat the fewest-spills choice of
# benchmarks/kernels_aot_regs.py for wy_bwd, wu and bwd_dqkwg (4 warps spill there, yet ran faster).
# history: docs/benchmarks/kernel_decisions/delta.md#launch
LAUNCH = {
    "kkt": dict(num_warps=4, num_stages=None),
    # KKT_SOLVE_FUSED: 2 warps (as solve_tril) -0.3..-1.3% per step queued against 4 (H200 2026-12-04 13:33,
    # train_ab_1204_kkt_solve.md)
    "kkt_solve": dict(num_warps=2, num_stages=None),
    # 2 warps: -2.0 / -2.0% (delta_rule), -1.3 / -1.6% (gated) at 2k / 32k (sweep 19:13)
    "solve_tril": dict(num_warps=2, num_stages=1),
    "wu": dict(num_warps=4, num_stages=None),
    # 4 warps for both (they had 8), per step queued at 512..32k, H200 2026-12-04: fwd_o 0.0..-0.4% on top
    # of HEADS_FASTEST and the fused kkt / solve (one call, 13:45, train_ab_1204_heads_fastest.md);
    # bwd_dv_local -0.2..-1.0% alone (13:33, train_ab_1204_kkt_solve.md) and -0.1..-1.1% on top of those
    # two (13:45)
    # fwd_o capped at 168 registers (190 since KEEP_P: 2 -> 3 programs per SM, no spills; sm_90,
    # kernels_aot_regs.py --one-more-program, register_caps_1204.md): per step graph-replayed at 2k / 16k / 32k
    # gated -1.7 / -1.3 / -0.9%, queued -1.1 / -0.6 / -1.0%; delta_rule a tie (its fwd_o fits 3 per SM uncapped)
    # (H200 2026-12-05 01:45, train_ab_1205_candidates.md)
    "fwd_o": dict(num_warps=4, num_stages=None, maxnreg=168),
    "bwd_dv_local": dict(num_warps=4, num_stages=None),
    # While dv_loc was float32, 1 stage at BV=32 faulted (illegal memory access; bf16, Triton 3.6,
    # sm_90, every length); since dv_loc is in the inputs' dtype it runs (sweep 2026-11-30 15:03).
    # 3 stages (2: +7.5..+8.0% per step queued at 32k, H200 2026-12-04 17:25, train_ab_1204_dh_bv16.md; 4 fit
    # at V block 32 only with do / dv loaded a step ahead in registers, which lost: kernel_decisions/delta.md)
    "bwd_dh": dict(num_warps=4, num_stages=3),
    # the forward state walk at V block 64 (many (batch, head) pairs) and 32 (long sequences): 4 warps
    # at block 64 -4.5 / -4.4% (delta_rule / gated, 2k), 3 stages at block 32 -6.6 / -4.6% (32k),
    # sweep 2026-12-01 03:14; the walks at 8 warps lost (H200 2026-12-02 04:09; again with two segments, block 64
    # or 32, +1..+13%, and at 2 warps +4..+19% at 32k: 2026-12-04 16:28 / 16:34, train_ab_1204_walk_warps*.md)
    # block 64 at 3 stages (it had the dtype's 2): per step queued at 2k / 4k / 8k / 16k gated 0.0 / 0.0 / -0.3 /
    # -0.6%, delta_rule -0.5 / +0.1 / -0.5 / -1.1% (H200 2026-12-04 18:22), at 8k / 16k -0.3 / -0.7% and
    # -0.5 / -1.3% (18:21; train_ab_1204_fwd_h_stages{,_2,_short}.md; 512 / 1k within -0.4..+0.3%): where a
    # program has an SM to itself the walk is bound by its loads' lead, as the reverse walk (its 2 stages: +8%);
    # 4 stages a tie with 3
    "fwd_h": dict(num_warps=4, num_stages=3),
    "fwd_h_bv32": dict(num_warps=4, num_stages=3),
    # (the ungated bwd_dqkwg at 2 stages lost +1.7 / +2.5 / +4.3 / +3.6% per step at 1k / 2k / 8k /
    # 32k: H200 2026-12-02 05:36, docs/benchmarks/train_ab_1202_epilogue.md)
    # 2 stages at DQKWG_BV = 64 (its two value steps); the "_bv32" entries: at 32
    "bwd_dqkwg": dict(num_warps=4, num_stages=2),
    "bwd_dqkwg_bv32": dict(num_warps=4, num_stages=3),
    "wy_bwd": dict(num_warps=4, num_stages=3),
    # the gated rule's own entries for its two largest kernels, whose gate terms change their
    # registers (sm_90 compiles, 4 warps: bwd_dqkwg 242 gated vs 164 ungated; swept 05:24, the
    # shared settings stay best; 8 warps capped to 128 registers lost, H200 2026-12-02 01:33; at 4 warps
    # bwd_dqkwg capped to 168 / wy_bwd to 128 lost +22..+26% / +0.8..+1.6% queued, 21:28). 4 stages
    # for both (more bytes in flight: Nsight Compute had them at 58 / 53% of DRAM bandwidth,
    # docs/benchmarks/ncu/ncu_kernels_1203.md): -0.5 / -0.7 / -1.1 / -0.4% per step queued at 512 / 2k /
    # 8k / 32k, every length in two calls (H200 2026-12-03 15:51 / 15:55, train_ab_1203_stages.md);
    # 2 stages +4..+7%. Those figures are of bwd_dqkwg at DQKWG_BV = 32; at 64 (since 20:50) its value
    # loop has two steps and takes 2 stages (3: one program per SM, +7.0..+7.9%)
    "bwd_dqkwg_gated": dict(num_warps=4, num_stages=2),
    "bwd_dqkwg_gated_bv32": dict(num_warps=4, num_stages=4),
    "wy_bwd_gated": dict(num_warps=4, num_stages=4),
}
# ARCHSEARCH_LOW_MEMORY_KERNELS=1 in the environment turns KEEP_WU, KEEP_H and KEEP_P off: the backward
# then recomputes what they keep (measured: +8%, +11% and +2% per fwd+bwd step; 18 KB less saved
# activations per token and layer at 16 heads of 128 in bf16).
LOW_MEMORY = low_memory_from_env()
# Keep the forward's w (and u, unless KEEP_H makes it unneeded) for the backward instead of
# recomputing them with ``_wu_kernel``: [B, T, H, K] bf16, 4 KB per token (u: 4 KB more). On since
# the 2026-11-30 14:47 sweep (H200): fwd+bwd -6.4% (delta_rule) and -4.4% (gated) at 2k.
KEEP_WU = not LOW_MEMORY
# Key block of ``_bwd_dqkwg_kernel``: 64 (two programs per chunk, [BT, 64] float32 accumulators,
# vn/do/dv2 read twice) or the whole K up to 128 (fla's choice on Hopper: one program, reads
# everything once, three [BT, 128] accumulators; +8% delta_rule, +12-15% gated per step, 2026-11-30).
# Also lost: 32, 128 at 8 warps, the gated ``sum(h * dh)`` reduced once, a value block of 16.
# history: docs/benchmarks/kernel_decisions/delta.md#dqkwg_bk
DQKWG_BK = 64
# Keep the forward's chunk states h ([B, T/64, H, K, V]) and U for the backward instead of
# rerunning the state walk (``fwd_h``, 0.68 ms of a 6.6 ms step at 64k tokens): +805 MB per
# layer at 64k tokens, 16 heads of 128, bf16 (h 537 MB, U 268 MB), about 12 KB per token.
# Sweep 2026-11-30 15:20 (H200): fwd+bwd -10.3 / -11.2% (delta_rule, 2k / 32k), -10.4 / -11.6%
# (gated).
KEEP_H = not LOW_MEMORY
# Keep every chunk's intra-chunk scores ``P = scale mask(q k^T) * exp(G_i - G_j)`` from the forward
# (``_fwd_o_kernel`` forms them anyway; ``[B, T, H, 64]`` in the activations' dtype, 2 KB per token and
# layer at 16 heads in bf16) for the backward's ``dU = P^T do``, as gla's ``KEEP_A``: ``_bwd_dv_local_kernel``
# reads ``P`` (8 KB per chunk and head) instead of ``q, k`` (32 KB) and forms no ``k q^T`` dot nor pair
# decay. Off: formed again. Per step graph-replayed at 2k / 16k / 32k: gated -2.0 / -1.8 / -1.8%, delta_rule
# -1.7 / -1.5 / -1.7% (H200 2026-12-04 20:44, train_ab_1204_keep_p.md); the reverse walk forming ``P^T do``
# itself (no ``_bwd_dv_local_kernel``) lost there, +2.4% at 32k (gated). Only when a backward will run
# (``tiles.backward_will_run``): under ``torch.no_grad`` the forward writes no ``P``.
# history: docs/benchmarks/kernel_decisions/delta.md#keep_p
KEEP_P = not LOW_MEMORY
# Removed after losing in H200 sweeps: ``WY_BWD_SPLIT``, ``UNGATED_WALK_BV``, ``FUSED_WY_FWD``.
# history: docs/benchmarks/kernel_decisions/delta.md#removed-wy_bwd_split-ungated_walk_bv-fused_wy_fwd
# The WY kernels (``_wu_kernel``, ``_wy_bwd_kernel``) take their dot operands in the activations'
# dtype and ``Ai`` is stored in it ([B, T, H, 64]: half the bytes in bf16), as fla 0.6 does;
# accumulation stays float32. False: float32 operands (TF32 dots) and a float32 ``Ai``. Makes no
# difference for float32 inputs. Sweep 2026-11-30 17:09 (H200): False is +19.2 / +13.7% fwd+bwd
# (delta_rule, 2k / 32k), +14.2 / +10.3% (gated).
# history: docs/benchmarks/kernel_decisions/delta.md#wy_input_dtype_dots
WY_INPUT_DTYPE_DOTS = True
# The ungated rule's ``_bwd_dh_kernel`` runs the gated code on a zero gate (same results: every
# factor is exp(0) = 1); costs a zeroed [B, T, H] float32 tensor per backward. Off: +7.2 / +9.3%
# fwd+bwd (delta_rule, 2k / 32k; H200 2026-12-01 03:04); why is not known (both loops pipeline).
# history: docs/benchmarks/kernel_decisions/delta.md#ungated_dh_zero_gate
UNGATED_DH_ZERO_GATE = True
# The delta walks keep V block 64 down to half a program per SM at that block (``tiles.walk_bv``'s
# ``min_per_sm``; the other families' walks switch to 32 below 4). With the walks in segments (H200
# 2026-12-01 19:35, docs/benchmarks/train_ab_1201_evening.md): block 32 at 8k / 16k +8.5 / +4.8%
# (delta_rule), +9.3 / +5.8% (gated). history (and the walk in transition form, screened and not
# built): docs/benchmarks/kernel_decisions/delta.md#walk_min_per_sm
WALK_MIN_PER_SM = 0.5


# The state walks in segments of chunks on a high-priority stream, the per-chunk kernels before
# and after them running on the current stream as each segment's chunks are ready (``overlap``),
# when a walk has fewer than WALK_OVERLAP_BELOW_PER_SM programs per SM (long sequences: each SM
# holds at most one walk program and runs it at ~6% occupancy). WALK_SEGMENTS = 1: one launch of
# each kernel over every chunk. 4 segments against 1 at 16k / 32k: -3.3..-4.1 / -4.2..-5.9% per
# fwd+bwd step (gated), -1.4..-3.3 / -1.4..-2.0% (delta_rule) (H200 2026-12-01 16:44-17:05,
# docs/benchmarks/walk_overlap.md). Every buffer then exists before the first walk (``overlap.run``):
# larger transient peaks. ARCHSEARCH_LOW_MEMORY_KERNELS=1 keeps one segment. 2 segments since
# 2026-12-04 (with the per-chunk kernels heads-fastest and the fused kkt / solve): against 4, per step
# queued at 16k / 32k gated -2.0 / -1.3%, delta_rule -1.6 / -1.6% (H200 15:11, train_ab_1204_segments2.md;
# gated -2.1 / -0.9% at 14:11); 3 segments between them; the host's launch time per step -19..-29%.
# history: docs/benchmarks/kernel_decisions/delta.md#walk_segments
WALK_SEGMENTS = 1 if LOW_MEMORY else 2
# The backward's reverse walk in its own number of segments (None: WALK_SEGMENTS): one. At 16k / 32k its
# 177 KB of shared memory leave no room for a ``bwd_dqkwg`` program beside it, so only ``bwd_dv_local``
# overlapped it, while the forward walk's ``fwd_o`` and WY kernels fit beside theirs. One segment against
# WALK_SEGMENTS' 2, per step queued at 16k / 32k: gated -1.1 / -0.1%, delta_rule -0.9 / +0.3% (H200
# 2026-12-04 16:40), -1.3 / 0.0%, -1.1 / +0.5% (16:41); the host's launch time per step -0.3..-0.6 ms, and
# the backward's buffers allocated as needed again (3 or 4 segments: +0.1..+1.9%; train_ab_1204_bwd_segments.md).
# history: docs/benchmarks/kernel_decisions/delta.md#bwd_walk_segments
BWD_WALK_SEGMENTS = 1
WALK_OVERLAP_BELOW_PER_SM = 1.0


def _dqkwg_launch(use_g: bool, x: torch.Tensor) -> dict:
    """``_bwd_dqkwg_kernel``'s launch settings for the gated or ungated rule at ``DQKWG_BV``."""
    if DQKWG_BV == 32:
        return _launch(LAUNCH, "bwd_dqkwg_gated_bv32", x) if use_g else _launch(LAUNCH, "bwd_dqkwg_bv32", x)
    return _launch(LAUNCH, "bwd_dqkwg_gated", x) if use_g else _launch(LAUNCH, "bwd_dqkwg", x)


def walk_bv(x: torch.Tensor, chains: int, V: int) -> int:
    """V block of the delta walks (``tiles.walk_bv`` at ``WALK_MIN_PER_SM``)."""
    return _tiles_walk_bv(x, chains, V, min_per_sm=WALK_MIN_PER_SM)


# Removed after losing (H200 sweeps 2026-12-01 03:04 and 05:40): ``FUSED_FWD_O`` and ``FUSED_DV_LOCAL``
# (work added to the walks' programs costs more than the separate kernels it replaces: the walks run
# few programs per SM, so their extra dots are not hidden), ``GATE_LOADS_EARLY`` and
# ``SOLVE_TRIL_DIAG_TF32X3`` (no gain). history:
# docs/benchmarks/kernel_decisions/delta.md#removed-fused_fwd_o-fused_dv_local and
# docs/benchmarks/kernel_decisions/delta.md#removed-gate_loads_early-solve_tril_diag_tf32x3

# The gated kernels' pair decays ``exp(G_i - G_j)`` ([BT, BT] tiles in ``_kkt_kernel``,
# ``_fwd_o_kernel``, ``_bwd_dv_local_kernel``, ``_bwd_dqkwg_kernel``, ``_wy_bwd_kernel``) as the outer
# product of two [BT] vectors of exponentials through the chunk's first row, while the chunk's decay
# spans less than ``PAIR_SPAN_MAX`` (one uniform branch per program; else one exponential per pair,
# as before), as gla's diagonal blocks do (``gla.SPAN_MAX``).
# Off costs gated_delta_rule +0.4 / +1.5% per fwd+bwd step at 2k / 32k (H200 2026-12-01 10:22,
# ``kernel_launch_sweep_1201_pair.md``).
# history: docs/benchmarks/kernel_decisions/delta.md#pair_decay_factored
PAIR_DECAY_FACTORED = True
# Both factors stay normal float32 numbers up to a span of ~85; but an exponent of size x carries
# ~x float32 ulps of rounding into its factor (the GPU's exp scales x by log2(e) before ex2), so the
# span stays at gla's SPAN_MAX: factors within exp(+-40), pairs ~5e-6 relative at worst against
# ~1e-7 exactly (reasoned, not measured; a chunk of the benchmark's decays spans ~4.8).
PAIR_SPAN_MAX = tl.constexpr(40.0)
# ``_solve_tril_kernel``'s merges in TF32 for a bf16-stored inverse (``_solve_tril_prec``); off:
# every dot exact. Sweep 2026-12-01 05:13 (H200): off costs +1.5 / +1.7% per fwd+bwd step
# (delta_rule, 2k / 32k), +1.5 / -0.1% (gated).
SOLVE_TRIL_TF32_MERGES = True
# ``_solve_tril_kernel``'s diagonal blocks by forward substitution (``_inv_diag_blocks``: 15 steps
# of a [16, 64] product and column sums over the four blocks at once, no dots) instead of repeated
# squaring (``_inv_unit_lower``: six exact float32 dots per block, which go through shared memory).
# H200 2026-12-02 06:52 (docs/benchmarks/train_ab_1202_solve_tril.md): per fwd+bwd step -5.2 / -5.2 /
# -2.7% (delta_rule, 2k / 8k / 32k synced), -4.0 / -4.4 / -4.1% (gated).
# history: docs/benchmarks/kernel_decisions/delta.md#solve_tril_diag_subst
SOLVE_TRIL_DIAG_SUBST = True
# The gated ``_bwd_dqkwg_kernel``'s gate terms of the intra-chunk pairs, ``sum_j M_ij - sum_j M_ji``
# with ``M = ds * (q k^T)`` strictly lower, as ``q_i . (ds k)_i - k_i . (ds^T q)_i`` from the dq / dk
# dots it makes anyway (``ds`` strictly lower there, its diagonal added to dq / dk apart, so that the
# ``G_x - G_x`` terms still stay out): no [BT, BT] ``q k^T`` dot, no row and column sums of ``M``.
# Off +1.8 / +0.4% per fwd+bwd step at 2k / 32k (gated; H200 2026-12-01 14:27,
# docs/benchmarks/kernel_launch_sweep_1201_dg_from_rows.md). ``ds`` enters the gate terms as a dot
# operand in the activations' dtype, as for dq / dk; the bf16 gate-gradient errors stayed put.
# history: docs/benchmarks/kernel_decisions/delta.md#dqkwg_dg_from_rows
DQKWG_DG_FROM_ROWS = True
# Not kept in the gated ``_bwd_dqkwg_kernel`` (H200 2026-12-01 / 2026-12-02: within the spread, lost or
# not timed): one row sum for the gate terms, ``sum(h * dh)`` from reloaded [BK, BV] tiles or as the
# diagonal of one more ``h^T dh`` dot, the pair decay folded into the ds dots, a reordered epilogue.
# history: docs/benchmarks/kernel_decisions/delta.md#_bwd_dqkwg_kernel-variants-not-kept
# The gated rule's chunk-local cumsum of the gate (``gc``) formed and written by ``_kkt_kernel``, the
# forward's first kernel, which reads the chunk's gate anyway, instead of by ``_cumsum_kernel``
# launched before it: one launch less per forward. H200 2026-12-01 19:41
# (docs/benchmarks/train_ab_1201_evening.md): -0.9 / -0.5 / -0.9% per step at 2k / 8k / 32k.
# history: docs/benchmarks/kernel_decisions/delta.md#kkt_cumsum
KKT_CUMSUM = True
# ``_wy_bwd_kernel``'s dbeta / dG row sums of its second pass combined before summing
# (``_wy_bwd_dk``: ``sum_c k (P + exp(G) dXw)`` instead of ``sum_c k P`` and ``sum_c k dXw`` apart; the
# gated rule's three sums become two): one row sum per key slice instead of two for delta_rule.
# delta_rule at 2k / 8k / 32k: -1.8 / -1.7 / +2.8% and -2.1 / -1.0 / -2.1% per step synced (H200
# 2026-12-02 08:25 and 08:46, ``train_ab.py``); gated within 0.6%.
# history: docs/benchmarks/kernel_decisions/delta.md#wy_bwd_rowsums_combined
WY_BWD_ROWSUMS_COMBINED = True
# The chunks' [64, 64] matrices that are lower triangular, ``A`` (``_kkt_kernel`` writes it,
# ``_solve_tril_kernel`` reads it) and its inverse ``Ai`` (read by ``_wu_kernel`` and ``_wy_bwd_kernel``),
# moved without their strictly upper [16, 16] blocks (``tiles.block_lower``): 6 of 16 blocks of each
# neither written nor read (so ``wy_fwd``'s ``Ai`` holds the inverse on and below the diagonal blocks
# only). -0.5..-0.7% per gated step queued, H200 2026-12-03 17:36 (before the Ai zeros were skipped
# too), docs/benchmarks/train_ab_1203_green_upper.md.
SKIP_UPPER_BLOCKS = True
# Value block of ``_bwd_dqkwg_kernel``'s loop over V: 64 (two steps, both in flight at the
# launch table's 2 stages: the gated kernel 255 registers, 80 KB of shared memory, 2376 SASS
# instructions against 2664 at block 32 and 4 stages; the ungated one 222 registers, 96 KB; two
# programs per SM either way, sm_90 compiles) or 32 (four steps, at the ``_bv32`` launch entries'
# 4 / 3 stages, as before).
# H200 2026-12-03 20:45 (docs/benchmarks/train_ab_1203_dqkwg_bv.md): 64 at 2 stages against 32
# queued -1.0 / -0.9 / -1.4 / -0.9% per step at 1k / 2k / 8k / 32k (gated), -0.5 / -0.3 / -0.5 /
# -0.7% (delta_rule); 64 at 3 stages (one program per SM) +7.0..+7.9% / +2.7..+4.2%. Again at 20:50
# (train_ab_1203_dqkwg_bv_confirm.md), 32 against 64: +0.9 / +1.3 / +1.4 / +1.1% (gated), +0.6 / +0.7 /
# +0.7 / +0.8% (delta_rule), every length slower in both calls.
DQKWG_BV = 64
# The gated ``_bwd_dqkwg_kernel``'s ``ds`` without the lower-triangle mask and with ``scale`` on the
# pair decay's row factor (``_pair_decay_all``): with ``DQKWG_DG_FROM_ROWS`` only its diagonal and
# strict lower part are read, so the mask and one [BT, BT] multiply were redundant. Nsight Compute's
# source counters put ~42% of the gated kernel's warp-stall samples and ~49% of its executed
# instructions between its value loop and its ``ds`` dots (docs/benchmarks/ncu/ncu_source_1203/).
# sm_90 (host Triton): 2376 -> 2272 SASS instructions, 255 registers either way, no spills. H200
# 2026-12-03 22:58 (``train_ab.py --families gated_delta_rule --rounds 5``,
# docs/benchmarks/train_ab_1203_ds_unmasked.md): -0.3 / -0.3 / -0.3 / -0.3 / -0.2% per step queued at
# 1k / 2k / 8k / 16k / 32k (synced -0.1..+1.5%): small, every queued length lower, one call.
# history: docs/benchmarks/kernel_decisions/delta.md#dqkwg_ds_unmasked
DQKWG_DS_UNMASKED = True
# ``_kkt_kernel`` and ``_solve_tril_kernel`` as one program per chunk (``_kkt_solve_kernel``): the solve
# reads the chunk's float32 ``A`` (160 B per token and head with ``SKIP_UPPER_BLOCKS``) back from L2
# right after the same program wrote it, instead of a second kernel reading it from DRAM; one launch
# less per forward. (``FUSED_WY_FWD``, which also took ``_wu_kernel`` in, lost: its ``A`` stayed in
# registers and one program serialised three kernels' work.) Off: two kernels. On at 2 warps: -0.1..-1.1%
# per step queued (both rules, 2k..32k; H200 2026-12-04 13:33, train_ab_1204_kkt_solve.md), -0.3..-1.7%
# with HEADS_FASTEST on (13:45). history: docs/benchmarks/kernel_decisions/delta.md#kkt_solve_fused
KKT_SOLVE_FUSED = True
# Lost: the fused kkt / solve as a persistent grid over per-program slots of ``A`` (``KKT_SOLVE_SCRATCH``,
# +0.2..+1.2% per step queued, H200 2026-12-04 15:11). history:
# docs/benchmarks/kernel_decisions/delta.md#lost-the-fused-kkt--solve-over-per-program-slots-of-a-kkt_solve_scratch
# The per-chunk kernels' programs in launch order over the heads first, then the chunks, then the
# batch (``tiles.chunk_ids``) instead of every chunk of one (batch, head) pair before the next: the programs
# resident at once then read whole 4 KB token rows of ``[B, T, H, 128]`` bf16 tensors rather than
# 256 B slices of many rows. Asked by the per-kernel times growing with the sequence length at a
# fixed token count (gated ``bwd_dqkwg`` 1.098 / 1.109 / 1.137 ms, ``wy_bwd`` 0.802 / 0.816 / 0.838,
# ``wu`` 0.308 / 0.318 / 0.330 at 2k / 4k / 8k; H200 2026-12-04 13:35), where the work per chunk is
# the same. On: +0.2 / -0.9 / -2.0 / -3.8 / -2.1 / -3.6% per step queued at 512 / 2k / 4k / 8k / 16k / 32k
# (gated), -1.8 / -3.4 / -4.1 / -5.6 / -4.2 / -4.9% (delta_rule); H200 2026-12-04 13:45
# (train_ab_1204_heads_fastest.md); the per-kernel times no longer grow with the length (gated bwd_dqkwg
# 1.093 / 1.094 ms, wy_bwd 0.777 / 0.774 at 2k / 8k, with the order's first form, 13:43).
# history: docs/benchmarks/kernel_decisions/delta.md#heads_fastest
HEADS_FASTEST = True
SWITCHES = {"KEEP_WU": (False, True), "DQKWG_BK": (64, 128), "KEEP_H": (False, True),
            "WY_INPUT_DTYPE_DOTS": (False, True), "UNGATED_DH_ZERO_GATE": (False, True),
            "SOLVE_TRIL_TF32_MERGES": (False, True),
            "PAIR_DECAY_FACTORED": (False, True), "DQKWG_DG_FROM_ROWS": (False, True), "KKT_CUMSUM": (False, True),
            "SOLVE_TRIL_DIAG_SUBST": (False, True), "WY_BWD_ROWSUMS_COMBINED": (False, True),
            "WALK_SEGMENTS": (1, 2, 4, 8), "BWD_WALK_SEGMENTS": (1, None, 2, 3, 4), "SKIP_UPPER_BLOCKS": (False, True),
            "DQKWG_BV": (32, 64), "DQKWG_DS_UNMASKED": (False, True), "KKT_SOLVE_FUSED": (False, True),
            "HEADS_FASTEST": (False, True), "KEEP_P": (False, True)}


@triton.jit
def _load_gc(gc, i_b, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr):
    """Chunk-local cumulative log decay of chunk ``i_t``: ``([BT] with padded rows = the last
    valid value, that last value)``."""
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    last = tl.minimum(i_t * BT + BT, T) - 1
    base = _seq(gc, i_b, i_h, T, H)
    g_last = tl.load(base + last * H).to(tl.float32)
    b_g = tl.load(base + o_t * H, mask=m_t, other=0.).to(tl.float32)
    return tl.where(m_t, b_g, g_last), g_last


@triton.jit
def _load_g_cols(gc, i_b, i_h, r0, T, H: tl.constexpr, BT: tl.constexpr):
    """``_load_gc``'s vector of the chunk starting at row ``r0`` ([BT], float32), loaded again for use
    as the columns of a pair decay (``_pair_decay``) rather than derived from the rows: deriving it
    costs a layout conversion that took ~75 more registers per thread in the gated ``wy_bwd`` (239
    vs 165 at the time, sm_90 compile: ``benchmarks/kernels_aot_regs.py --kernels wy_bwd``). It clamps to the
    chunk's last valid row (``_load_gc``'s padding) by a ``minimum``, so that the compiler cannot
    merge it with ``_load_gc``'s masked load."""
    o_t = r0 + tl.arange(0, BT)
    return tl.load(_seq(gc, i_b, i_h, T, H) + tl.minimum(o_t, T - 1) * H).to(tl.float32)


@triton.jit
def _pair_decay(b_g, b_gj, m, FLIP: tl.constexpr, gc, i_b, i_h, r0, T, H: tl.constexpr, BT: tl.constexpr,
                FACTORED: tl.constexpr):
    """``exp(G_i - G_j)`` (``FLIP``: ``exp(G_j - G_i)``) for row i, column j, where ``m`` [BT, BT]
    holds, 0 elsewhere; ``b_g`` from ``_load_gc`` (i), ``b_gj`` the same values for j (from
    ``_load_g_cols``, or ``b_g`` itself, which costs a layout conversion instead of a load), of the
    chunk starting at row ``r0`` of ``gc``.

    ``FACTORED`` (``PAIR_DECAY_FACTORED``): while the chunk's decay spans less than
    ``PAIR_SPAN_MAX``, as the outer product ``exp(G_i - G_0) exp(G_0 - G_j)`` through the chunk's
    first row (2 * BT exponentials instead of BT * BT; both factors stay normal float32 numbers);
    else exactly."""
    if FACTORED:
        # two scalars: int64 offsets as before ``_seq``; with ``_seq`` here the gated bwd_dqkwg (255
        # registers) spilled 8 B on the GPU host's compile and took 1.22 instead of 1.17 ms per step
        # (H200 2026-12-02 07:03, docs/benchmarks/train_ab_1202_solve_tril.md)
        g0 = tl.load(gc + (i_b * T + r0) * H + i_h).to(tl.float32)
        g_end = tl.load(gc + (i_b * T + tl.minimum(r0 + BT, T) - 1) * H + i_h).to(tl.float32)
        b_e = _pair_decay_through(b_g, b_gj, g0, g_end, m, FLIP)
    else:
        b_e = _pair_decay_exact(b_g, b_gj, m, FLIP)
    return b_e


@triton.jit
def _pair_decay_through(b_g, b_gj, g0, g_end, m, FLIP: tl.constexpr):
    """``_pair_decay``'s factored form through the chunk's first row, ``g0`` (``g_end``: its last
    valid row), or exactly where the chunk's decay spans ``PAIR_SPAN_MAX`` or more."""
    if g0 - g_end < PAIR_SPAN_MAX:
        if FLIP:
            b_e = tl.where(m, tl.exp(g0 - b_g)[:, None] * tl.exp(b_gj - g0)[None, :], 0.)
        else:
            b_e = tl.where(m, tl.exp(b_g - g0)[:, None] * tl.exp(g0 - b_gj)[None, :], 0.)
    else:
        b_e = _pair_decay_exact(b_g, b_gj, m, FLIP)
    return b_e


@triton.jit
def _pair_decay_all(b_g, scale, gc, i_b, i_h, r0, T, H: tl.constexpr, BT: tl.constexpr, FACTORED: tl.constexpr):
    """``scale exp(G_i - G_j)`` for every row i and column j of the chunk starting at row ``r0``
    (``b_g``: ``_load_gc``'s), without ``_pair_decay``'s mask: for callers that keep only pairs
    ``j <= i`` by a selection of their own (the pairs ``j > i`` may be large, even inf, and are
    dropped by it). ``scale`` rides on the row factor: one [BT, BT] multiply less than
    ``scale * _pair_decay(...)``."""
    if FACTORED:
        g0 = tl.load(gc + (i_b * T + r0) * H + i_h).to(tl.float32)
        g_end = tl.load(gc + (i_b * T + tl.minimum(r0 + BT, T) - 1) * H + i_h).to(tl.float32)
        if g0 - g_end < PAIR_SPAN_MAX:
            b_e = (scale * tl.exp(b_g - g0))[:, None] * tl.exp(g0 - b_g)[None, :]
        else:
            b_e = scale * tl.exp(b_g[:, None] - b_g[None, :])
    else:
        b_e = scale * tl.exp(b_g[:, None] - b_g[None, :])
    return b_e


@triton.jit
def _pair_decay_exact(b_g, b_gj, m, FLIP: tl.constexpr):
    """``_pair_decay`` with one exponential per pair."""
    if FLIP:
        return tl.exp(tl.where(m, b_gj[None, :] - b_g[:, None], float("-inf")))
    return tl.exp(tl.where(m, b_g[:, None] - b_gj[None, :], float("-inf")))


@triton.jit
def _inv_unit_lower(b_A, BC: tl.constexpr):
    """``(I + A)^-1`` of a strictly lower ``[BC, BC]`` block ``A`` (float32), BC = 16. ``A`` is
    nilpotent (``A^16 = 0``), so ``(I + A)^-1 = (I - A)(I + A^2)(I + A^4)(I + A^8)``: six
    independent-of-each-row dots instead of 15 dependent forward-substitution steps
    (``SOLVE_TRIL_DIAG_SUBST`` turns this off for ``_inv_diag_blocks``' substitution). Exact float32
    dots always: the powers of A grow and cancel, which amplifies rounding of the dot inputs (TF32
    here: relative error of the inverse up to 1.4 for keys with pairwise cosine 0.97 and beta 1,
    ``benchmarks/solve_tril_precision.py``). Split TF32 ("tf32x3") would be as accurate (emulated)
    but measured no faster. Timings: docs/benchmarks/kernel_decisions/delta.md#_inv_unit_lower"""
    o = tl.arange(0, BC)
    eye = (o[:, None] == o[None, :]).to(tl.float32)
    n1 = -b_A
    n2 = tl.dot(n1, n1, input_precision="ieee")
    n4 = tl.dot(n2, n2, input_precision="ieee")
    n8 = tl.dot(n4, n4, input_precision="ieee")
    p = tl.dot(eye + n1, eye + n2, input_precision="ieee")
    p = tl.dot(p, eye + n4, input_precision="ieee")
    return tl.dot(p, eye + n8, input_precision="ieee")


@triton.jit
def _inv_diag_blocks(A, i_b, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """``(I + A_rr)^-1`` of chunk ``i_t``'s four diagonal blocks (``A: [B, T, H, BT]`` float32, strictly
    lower), float32 ``[BC, BC]`` each, by forward substitution: row ``i`` of an inverse is
    ``e_i - sum_{j<i} A_ij X_j`` (15 steps; as accurate as exact dots, ~1000x more than repeated
    squaring in float32 for correlated keys: ``benchmarks/solve_tril_precision.py``). The four blocks
    side by side as one ``[BC, 4 BC]`` tile ``X`` (column ``16 r + c`` is column ``c`` of block ``r``):
    each column is its own triangular solve, and each thread holds 4 of a column's 16 rows (sm_90
    compile), so a step's sum over rows is 3 adds and 2 shuffles, and no dot goes through shared
    memory. The rows of ``A`` do not depend on the steps: their loads are issued ahead."""
    o_j = tl.arange(0, BC)
    o_c = tl.arange(0, 4 * BC)
    blk = o_c // BC
    b_X = (o_j[:, None] == (o_c % BC)[None, :]).to(tl.float32)
    r0 = i_t * BT + blk * BC  # [4 BC]: the first row of each column's block
    # [BC, 4 BC]: A_{r0, 16 r + j} for column 16 r + c; step i reads i rows further
    p_a = A + (i_b * T * H + i_h) * BT + (r0 * (H * BT) + blk * BC)[None, :] + o_j[:, None]
    for i in tl.static_range(1, BC):
        b_a = tl.load(p_a + i * (H * BT), mask=(o_j < i)[:, None] & (r0 + i < T)[None, :], other=0.)
        b_s = tl.sum(b_a * b_X, 0)  # [4 BC]
        b_X = tl.where((o_j == i)[:, None], b_X - b_s[None, :], b_X)
    # [BC, 4 BC] -> four [BC, BC]: column 16 r + c = 32 r1 + 16 r0 + c
    b_X = tl.permute(tl.reshape(b_X, [BC, 2, 2, BC]), [0, 3, 1, 2])  # [j, c, r1, r0]
    b_X01, b_X23 = tl.split(tl.permute(b_X, [0, 1, 3, 2]))  # split r1: [j, c, r0]
    T00, T11 = tl.split(b_X01)
    T22, T33 = tl.split(b_X23)
    return T00, T11, T22, T33


@triton.jit
def _load_block(A, i_b, i_h, i_t, T, ri: tl.constexpr, cj: tl.constexpr,
                H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Block (ri, cj) of chunk ``i_t``'s ``[BT, BT]`` matrix in ``A: [B, T, H, BT]``, ``[BC, BC]``."""
    return _load_rows(A, i_b, i_h, i_t * BT + ri * BC, T, H, BT, cj * BC, BC, BC)


@triton.jit
def _store_block(Ai, blk, i_b, i_h, i_t, T, ri: tl.constexpr, cj: tl.constexpr,
                 H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    _store_rows(Ai, blk, i_b, i_h, i_t * BT + ri * BC, T, H, BT, cj * BC, BC, BC)


@triton.jit
def _load_cols(x, i_b, i_h, row0, T, H: tl.constexpr, D: tl.constexpr, col0, BD: tl.constexpr, BR: tl.constexpr):
    """``x[b, row0:row0+BR, h, col0:col0+BD]`` transposed, ``[BD, BR]``, zero-padded."""
    o_r = row0 + tl.arange(0, BR)
    o_d = col0 + tl.arange(0, BD)
    base = x + (i_b * T * H + i_h) * D
    return tl.load(base + o_r[None, :] * (H * D) + o_d[:, None], mask=(o_r < T)[None, :] & (o_d < D)[:, None], other=0.)


# --- kernels ---------------------------------------------------------------------------------
@_jit(do_not_specialize=["T"])  # one compile for every length
def _cumsum_kernel(g, gc, T, H: tl.constexpr, BT: tl.constexpr):
    """Grid (NT, B*H): chunk-local inclusive cumsum of ``g: [B, T, H]`` into float32 ``gc``."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    b_g = tl.load(_seq(g, i_b, i_h, T, H) + o_t * H, mask=m_t, other=0.).to(tl.float32)
    tl.store(_seq(gc, i_b, i_h, T, H) + o_t * H, tl.cumsum(b_g, axis=0), mask=m_t)


@triton.jit
def _kkt_tile(k, beta, g, gc, i_b, i_h, i_t, T, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
              BK: tl.constexpr, USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr,
              CUMSUM: tl.constexpr):
    """``A = strict_lower(beta_i exp(G_i - G_j) k_i . k_j)`` of chunk ``i_t``, ``[BT, BT]`` float32, one
    ``[BT, K]`` x ``[K, BT]`` product. ``CUMSUM`` (``KKT_CUMSUM``): the chunk's ``G`` formed here from the
    gate ``g`` and written to ``gc`` for the kernels after it (else read from ``gc``)."""
    r0 = i_t * BT
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_k = _load_rows(k, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
        b_A += tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PREC)
    o_t = r0 + tl.arange(0, BT)
    b_b = tl.load(_seq(beta, i_b, i_h, T, H) + o_t * H, mask=o_t < T, other=0.).to(tl.float32)
    o_i = tl.arange(0, BT)
    m_A = o_i[:, None] > o_i[None, :]
    b_A = b_A * b_b[:, None]
    if USE_G and CUMSUM:
        # rows past T load 0, so their cumsum is the last valid row's value, as _load_gc pads
        b_graw = tl.load(_seq(g, i_b, i_h, T, H) + o_t * H, mask=o_t < T, other=0.).to(tl.float32)
        b_g = tl.cumsum(b_graw, axis=0)
        tl.store(_seq(gc, i_b, i_h, T, H) + o_t * H, b_g, mask=o_t < T)
        # G of the first row is its own gate; of the last valid row, the chunk's sum (which may round
        # differently from the stored cumsum's last row, so near a span of PAIR_SPAN_MAX this kernel
        # and the later ones may choose different forms: both are accurate to ~5e-6)
        if PAIR_FACTORED:
            g0 = tl.load(_seq(g, i_b, i_h, T, H) + r0 * H).to(tl.float32)
            b_A = b_A * _pair_decay_through(b_g, b_g, g0, tl.sum(b_graw, axis=0), m_A, False)
        else:
            b_A = b_A * _pair_decay_exact(b_g, b_g, m_A, False)
    elif USE_G:
        b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
        b_A = b_A * _pair_decay(b_g, _load_g_cols(gc, i_b, i_h, i_t * BT, T, H, BT), m_A, False,
                                gc, i_b, i_h, i_t * BT, T, H, BT, PAIR_FACTORED)
    return tl.where(m_A, b_A, 0.)


@triton.jit
def _store_a(A, b_A, i_b, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr, SKIP_UPPER: tl.constexpr):
    """``_kkt_tile``'s ``b_A`` as chunk ``i_t``'s rows of ``A: [B, T, H, BT]`` float32. The strictly upper
    [BC, BC] blocks are never read (``_solve_tril_chunk`` reads the blocks on and below the diagonal, the
    diagonal ones' upper halves as the zeros written here): not written."""
    _store_rows_where(A, b_A, _block_lower(BT, _BC, SKIP_UPPER), i_b, i_h, i_t * BT, T, H, BT, 0, BT, BT)


@_jit(do_not_specialize=["T", "C0"])  # one compile for every length
def _kkt_kernel(k, beta, g, gc, A, T, C0,
                H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr, CUMSUM: tl.constexpr,
                SKIP_UPPER: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H)``: ``_kkt_tile`` of chunk ``C0 + i`` into ``A``."""
    i_t, i_b, i_h = _chunk_ids(tl.program_id(0), tl.program_id(1), C0, H, HEADS_FASTEST)
    b_A = _kkt_tile(k, beta, g, gc, i_b, i_h, i_t, T, H, K, BT, BK, USE_G, DOT_PREC, PAIR_FACTORED, CUMSUM)
    _store_a(A, b_A, i_b, i_h, i_t, T, H, BT, SKIP_UPPER)


@triton.jit
def _solve_tril_chunk(A, Ai, i_b, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                      MERGE_PREC: tl.constexpr, DIAG_SUBST: tl.constexpr, SKIP_UPPER: tl.constexpr):
    """BT = 4 BC: ``Ai = (I + A)^-1`` of chunk ``i_t``'s strictly lower ``A`` (both ``[B, T, H, BT]``;
    ``A`` float32, ``Ai`` in its buffer's dtype, the math float32). Diagonal ``[BC, BC]`` blocks by
    ``_inv_diag_blocks`` (``DIAG_SUBST``) or ``_inv_unit_lower``, the rest by
    ``Ti_ij = -Ti_ii sum_{j <= m < i} A_im Ti_mj`` for block rows ``i > j`` (16x16 dots at
    ``MERGE_PREC``: exact "ieee" or "tf32")."""
    if DIAG_SUBST:
        T00, T11, T22, T33 = _inv_diag_blocks(A, i_b, i_h, i_t, T, H, BT, BC)
    else:
        T00 = _inv_unit_lower(_load_block(A, i_b, i_h, i_t, T, 0, 0, H, BT, BC), BC)
        T11 = _inv_unit_lower(_load_block(A, i_b, i_h, i_t, T, 1, 1, H, BT, BC), BC)
        T22 = _inv_unit_lower(_load_block(A, i_b, i_h, i_t, T, 2, 2, H, BT, BC), BC)
        T33 = _inv_unit_lower(_load_block(A, i_b, i_h, i_t, T, 3, 3, H, BT, BC), BC)
    A10 = _load_block(A, i_b, i_h, i_t, T, 1, 0, H, BT, BC)
    A20 = _load_block(A, i_b, i_h, i_t, T, 2, 0, H, BT, BC)
    A21 = _load_block(A, i_b, i_h, i_t, T, 2, 1, H, BT, BC)
    A30 = _load_block(A, i_b, i_h, i_t, T, 3, 0, H, BT, BC)
    A31 = _load_block(A, i_b, i_h, i_t, T, 3, 1, H, BT, BC)
    A32 = _load_block(A, i_b, i_h, i_t, T, 3, 2, H, BT, BC)
    T10 = -tl.dot(T11, tl.dot(A10, T00, input_precision=MERGE_PREC), input_precision=MERGE_PREC)
    T21 = -tl.dot(T22, tl.dot(A21, T11, input_precision=MERGE_PREC), input_precision=MERGE_PREC)
    T32 = -tl.dot(T33, tl.dot(A32, T22, input_precision=MERGE_PREC), input_precision=MERGE_PREC)
    T20 = -tl.dot(T22, tl.dot(A20, T00, input_precision=MERGE_PREC) + tl.dot(A21, T10, input_precision=MERGE_PREC), input_precision=MERGE_PREC)
    T31 = -tl.dot(T33, tl.dot(A31, T11, input_precision=MERGE_PREC) + tl.dot(A32, T21, input_precision=MERGE_PREC), input_precision=MERGE_PREC)
    T30 = -tl.dot(T33, tl.dot(A30, T00, input_precision=MERGE_PREC) + tl.dot(A31, T10, input_precision=MERGE_PREC)
                  + tl.dot(A32, T20, input_precision=MERGE_PREC), input_precision=MERGE_PREC)
    _store_block(Ai, T00, i_b, i_h, i_t, T, 0, 0, H, BT, BC)
    _store_block(Ai, T10, i_b, i_h, i_t, T, 1, 0, H, BT, BC)
    _store_block(Ai, T11, i_b, i_h, i_t, T, 1, 1, H, BT, BC)
    _store_block(Ai, T20, i_b, i_h, i_t, T, 2, 0, H, BT, BC)
    _store_block(Ai, T21, i_b, i_h, i_t, T, 2, 1, H, BT, BC)
    _store_block(Ai, T22, i_b, i_h, i_t, T, 2, 2, H, BT, BC)
    _store_block(Ai, T30, i_b, i_h, i_t, T, 3, 0, H, BT, BC)
    _store_block(Ai, T31, i_b, i_h, i_t, T, 3, 1, H, BT, BC)
    _store_block(Ai, T32, i_b, i_h, i_t, T, 3, 2, H, BT, BC)
    _store_block(Ai, T33, i_b, i_h, i_t, T, 3, 3, H, BT, BC)
    if not SKIP_UPPER:  # the strictly upper blocks: zeros that no kernel reads with SKIP_UPPER_BLOCKS
        Z = tl.zeros([BC, BC], dtype=tl.float32)
        for ri in tl.static_range(BT // BC - 1):
            for cj in tl.static_range(ri + 1, BT // BC):
                _store_block(Ai, Z, i_b, i_h, i_t, T, ri, cj, H, BT, BC)


@_jit(do_not_specialize=["T", "C0"])  # one compile for every length
def _solve_tril_kernel(A, Ai, T, C0, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, MERGE_PREC: tl.constexpr,
                       DIAG_SUBST: tl.constexpr, SKIP_UPPER: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H)``: ``_solve_tril_chunk`` of chunk ``C0 + i``."""
    i_t, i_b, i_h = _chunk_ids(tl.program_id(0), tl.program_id(1), C0, H, HEADS_FASTEST)
    _solve_tril_chunk(A, Ai, i_b, i_h, i_t, T, H, BT, BC, MERGE_PREC, DIAG_SUBST, SKIP_UPPER)


@_jit(do_not_specialize=["T", "C0"])  # one compile for every length
def _kkt_solve_kernel(k, beta, g, gc, A, Ai, T, C0,
                      H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
                      USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr,
                      CUMSUM: tl.constexpr, SKIP_UPPER: tl.constexpr, MERGE_PREC: tl.constexpr,
                      DIAG_SUBST: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H)`` (``KKT_SOLVE_FUSED``): ``_kkt_tile`` of chunk ``C0 + i`` stored in ``A``,
    then ``_solve_tril_chunk`` in the same program: the solve reads back the ``A`` rows this program's
    threads have just written (from L2, not DRAM) instead of a second kernel reading them."""
    i_t, i_b, i_h = _chunk_ids(tl.program_id(0), tl.program_id(1), C0, H, HEADS_FASTEST)
    b_A = _kkt_tile(k, beta, g, gc, i_b, i_h, i_t, T, H, K, BT, BK, USE_G, DOT_PREC, PAIR_FACTORED, CUMSUM)
    _store_a(A, b_A, i_b, i_h, i_t, T, H, BT, SKIP_UPPER)
    tl.debug_barrier()  # every thread's A rows stored before any thread reads them back (same CTA: visible)
    _solve_tril_chunk(A, Ai, i_b, i_h, i_t, T, H, BT, BC, MERGE_PREC, DIAG_SUBST, SKIP_UPPER)


@_jit(do_not_specialize=["T", "C0"])  # one compile for every length
def _wu_kernel(k, v, beta, gc, Ai, w, u, T, C0,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
               USE_G: tl.constexpr, LOWP: tl.constexpr, DOT_PREC: tl.constexpr, SKIP_UPPER: tl.constexpr,
               HEADS_FASTEST: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H)``: ``w = Ai (beta exp(G) k)`` and ``u = Ai (beta v)`` of chunk ``i_t``
    (``[BT, K]``, ``[BT, V]``), ``[BT, BT]`` x ``[BT, BK|BV]`` products (operands in ``k``'s dtype
    when ``LOWP``)."""
    i_t, i_b, i_h = _chunk_ids(tl.program_id(0), tl.program_id(1), C0, H, HEADS_FASTEST)
    r0 = i_t * BT
    b_T, b_b, b_be, b_g = _wy_prologue(Ai, beta, gc, k, i_b, i_h, i_t, T, H, BT, USE_G, LOWP, SKIP_UPPER)
    for i_k in range(tl.cdiv(K, BK)):
        b_x = _op(_load_rows(k, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK).to(tl.float32) * b_be[:, None], k, LOWP)
        _store_rows(w, tl.dot(b_T, b_x, input_precision=DOT_PREC), i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
    for i_v in range(tl.cdiv(V, BV)):
        b_x = _op(_load_rows(v, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV).to(tl.float32) * b_b[:, None], k, LOWP)
        _store_rows(u, tl.dot(b_T, b_x, input_precision=DOT_PREC), i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)


@_jit(do_not_specialize=["T", "NT", "C0", "C1"])  # one compile for every length
def _fwd_h_kernel(k, w, u, gc, h, vn, h0, ht, T, NT, C0, C1,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (V/BV, B*H), BK >= K: walk chunks ``C0 .. C1 - 1`` in order from ``h0`` (the state
    before chunk ``C0``); ``h[b, t, h]`` = state before chunk t, ``vn = u - w h`` (the values
    written, U); ``ht``: the state after chunk ``C1 - 1`` (it may be ``h0``'s buffer)."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0.)
    for i_t in range(C0, C1):
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        b_w = _load_rows(w, i_b, i_h, i_t * BT, T, H, K, 0, BT, BK)  # [BT, BK]
        b_u = _load_rows(u, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV).to(tl.float32)
        b_vn = b_u - tl.dot(b_w, b_h.to(b_w.dtype), input_precision=DOT_PREC)  # [BT, BV]
        _store_rows(vn, b_vn, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_kT = _load_cols(k, i_b, i_h, i_t * BT, T, H, K, 0, BK, BT)  # [BK, BT]
        if USE_G:
            b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
            b_h *= tl.exp(g_last)
            b_vn = b_vn * tl.exp(g_last - b_g)[:, None]
        b_h += tl.dot(b_kT, b_vn.to(b_kT.dtype), input_precision=DOT_PREC)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@_jit(do_not_specialize=["T", "NT", "C0"])  # one compile for every length
def _fwd_o_kernel(q, k, vn, gc, h, o, p, scale, T, NT, C0,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr,
                  HEADS_FASTEST: tl.constexpr, STORE_P: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H, V/BV)``: ``o = scale (exp(G) * (q h) + (mask(q k^T) * exp(G_i - G_j)) U)``.
    ``STORE_P``: the first value block's program also writes the chunk's ``P = scale mask(q k^T) *
    exp(G_i - G_j)`` into ``p: [B, T, H, BT]`` (row i: query, column j: key; ``KEEP_P``)."""
    i_v, i_t, i_b, i_h = _tile_ids((V + BV - 1) // BV, C0, H, HEADS_FASTEST)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = _load_rows(q, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
        b_kT = _load_cols(k, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BK, BT)
        b_h = tl.load(h + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.)
        b_o += tl.dot(b_q, b_h.to(b_q.dtype), input_precision=DOT_PREC)
        b_A += tl.dot(b_q, b_kT, input_precision=DOT_PREC)
    o_i = tl.arange(0, BT)
    m_A = o_i[:, None] >= o_i[None, :]
    if USE_G:
        b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
        b_o = b_o * tl.exp(b_g)[:, None]
        b_A = b_A * _pair_decay(b_g, _load_g_cols(gc, i_b, i_h, i_t * BT, T, H, BT), m_A, False,
                                gc, i_b, i_h, i_t * BT, T, H, BT, PAIR_FACTORED)
    b_A = tl.where(m_A, b_A, 0.)
    if STORE_P:
        if i_v == 0:
            _store_rows(p, b_A * scale, i_b, i_h, i_t * BT, T, H, BT, 0, BT, BT)
    b_vn = _load_rows(vn, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
    b_o = (b_o + tl.dot(b_A.to(b_vn.dtype), b_vn, input_precision=DOT_PREC)) * scale
    _store_rows(o, b_o, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)


@_jit(do_not_specialize=["T", "C0"])  # one compile for every length
def _bwd_dv_local_kernel(q, k, gc, p, do, dv, scale, T, C0,
                         H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                         USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr,
                         HEADS_FASTEST: tl.constexpr, FROM_P: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H, V/BV)``: ``dU`` through the intra-chunk output, ``P^T do`` with
    ``P = scale mask(q k^T) * exp(G_i - G_j)`` (stored in ``dv``'s dtype); ``FROM_P``: ``P`` read from
    the forward's ``p: [B, T, H, BT]`` (``KEEP_P``) instead of formed from ``q, k`` and the gate."""
    i_v, i_t, i_b, i_h = _tile_ids((V + BV - 1) // BV, C0, H, HEADS_FASTEST)
    if FROM_P:
        b_At = _load_cols(p, i_b, i_h, i_t * BT, T, H, BT, 0, BT, BT)  # [j, i]
    else:
        b_At = tl.zeros([BT, BT], dtype=tl.float32)  # [j, i]
        for i_k in range(tl.cdiv(K, BK)):
            b_k = _load_rows(k, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
            b_q = _load_rows(q, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
            b_At += tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC)
        o_i = tl.arange(0, BT)
        m_ji = o_i[None, :] >= o_i[:, None]
        if USE_G:
            b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
            b_At = b_At * _pair_decay(b_g, _load_g_cols(gc, i_b, i_h, i_t * BT, T, H, BT), m_ji, True,
                                      gc, i_b, i_h, i_t * BT, T, H, BT, PAIR_FACTORED)
        b_At = tl.where(m_ji, b_At * scale, 0.)
    b_do = _load_rows(do, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
    b_dv = tl.dot(b_At.to(b_do.dtype), b_do, input_precision=DOT_PREC)
    _store_rows(dv, b_dv, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)


@_jit(do_not_specialize=["T", "NT", "C0", "C1"])  # one compile for every length
def _bwd_dh_kernel(q, k, w, gc, do, dv, dv2, dh, dht, dh0, scale, T, NT, C0, C1,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE_G: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    """Grid (V/BV, B*H), BK >= K: reverse walk over chunks ``C1 - 1 .. C0`` from ``dht`` (the
    gradient of the state after chunk ``C1 - 1``) to ``dh0`` (before chunk ``C0``; it may be
    ``dht``'s buffer). ``dh[b, t, h]`` = dLoss/d(state after chunk t);
    ``dv2 = dv + (k exp(G_C - G)) dh`` is the full gradient of U; the carried gradient becomes
    ``exp(G_C) dh + scale (q exp(G))^T do - w^T dv2``."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0.)
    for i_r in range(C1 - C0):
        i_t = C1 - 1 - i_r
        tl.store(dh + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_dh.to(dh.dtype.element_ty), mask=m_kv)
        # the chunk-position factors scale the [BT, BV] operands and results, not the [BT, K]
        # tiles: fewer float32 temporaries live in registers
        b_k = _load_rows(k, i_b, i_h, i_t * BT, T, H, K, 0, BT, BK)  # [BT, BK]
        b_kdh = tl.dot(b_k, b_dh.to(b_k.dtype), input_precision=DOT_PREC)  # [BT, BV]
        # dv loaded beside do, both converted after (sm_90 at V block 64: 2328 SASS instructions against
        # 2344 for the loads where used; the form of the 2026-12-04 21:00 run, not timed apart)
        b_do = _load_rows(do, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_dvl = _load_rows(dv, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV).to(tl.float32)
        b_do = b_do.to(tl.float32)
        if USE_G:
            b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
            b_kdh = b_kdh * tl.exp(g_last - b_g)[:, None]
            b_do = b_do * (scale * tl.exp(b_g))[:, None]
            b_dh *= tl.exp(g_last)
        else:
            b_do = b_do * scale
        b_dv2 = b_dvl + b_kdh
        _store_rows(dv2, b_dv2, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_qT = _load_cols(q, i_b, i_h, i_t * BT, T, H, K, 0, BK, BT)  # [BK, BT]
        b_wT = _load_cols(w, i_b, i_h, i_t * BT, T, H, K, 0, BK, BT)
        b_dh += tl.dot(b_qT, b_do.to(b_qT.dtype), input_precision=DOT_PREC)
        b_dh -= tl.dot(b_wT, b_dv2.to(b_wT.dtype), input_precision=DOT_PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


# BV blocks _dqkwg_tile's loop over V: on a GPU short of shared memory (float32 needs 112 KB at BV 64 on sm_86)
# fitted halves it
@_jit(do_not_specialize=["T", "NT", "B", "C0"], loop_blocks=("BV",))  # one compile for every length
def _bwd_dqkwg_kernel(q, k, vn, gc, h, do, dh, dv2, dq, dk, dw, dG, scale, T, NT, B, C0,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr,
                      DG_FROM_ROWS: tl.constexpr, DS_UNMASKED: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H, K/BK)``: key columns ``i_k*BK ..`` of ``dq`` (final) and of the parts of ``dk``
    and ``dw = -dv2 h^T`` that come through the output and the state (in their buffers' dtype); this slice's share
    of the chunk-local ``dG`` goes to ``dG[i_k]`` (the slices' shares add up: every term is a sum
    over key channels). Splitting K (``DQKWG_BK`` = 64) keeps the float32 accumulators at [BT, 64] each."""
    i_k, i_t, i_b, i_h = _tile_ids((K + BK - 1) // BK, C0, H, HEADS_FASTEST)
    _dqkwg_tile(q, k, vn, gc, h, do, dh, dv2, dq, dk, dw, dG, scale, T, NT, B, i_k, i_t, i_b, i_h,
                H, K, V, BT, BK, BV, USE_G, DOT_PREC, PAIR_FACTORED, DG_FROM_ROWS, DS_UNMASKED)


@triton.jit
def _dqkwg_tile(q, k, vn, gc, h, do, dh, dv2, dq, dk, dw, dG, scale, T, NT, B, i_k, i_t, i_b, i_h,
                H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                USE_G: tl.constexpr, DOT_PREC: tl.constexpr, PAIR_FACTORED: tl.constexpr,
                DG_FROM_ROWS: tl.constexpr, DS_UNMASKED: tl.constexpr):
    """``_bwd_dqkwg_kernel``'s work for key slice ``i_k`` of chunk ``i_t`` of sequence ``i_b``, head ``i_h``."""
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    b_q = _load_rows(q, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
    b_k = _load_rows(k, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_dP = tl.zeros([BT, BT], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_vk = (o_v < V)[:, None] & m_k[None, :]
        b_vn = _load_rows(vn, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_do = _load_rows(do, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_dv2 = _load_rows(dv2, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_hT = tl.load(h + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)  # [BV, BK]
        b_dhT = tl.load(dh + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)
        b_dq += tl.dot(b_do, b_hT.to(b_do.dtype), input_precision=DOT_PREC)
        b_dk += tl.dot(b_vn, b_dhT.to(b_vn.dtype), input_precision=DOT_PREC)
        b_dw += tl.dot(b_dv2.to(b_hT.dtype), b_hT, input_precision=DOT_PREC)
        b_dP += tl.dot(b_do, tl.trans(b_vn.to(b_do.dtype)), input_precision=DOT_PREC)
        if USE_G:
            b_hdh += tl.sum(b_hT.to(tl.float32) * b_dhT.to(tl.float32), 0)
    o_i = tl.arange(0, BT)
    m_ij = o_i[:, None] >= o_i[None, :]
    if USE_G:
        b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
        b_dq = b_dq * (scale * tl.exp(b_g))[:, None]
        b_dk = b_dk * tl.exp(g_last - b_g)[:, None]
        # the columns' G derived from the rows' (one load), unlike the other kernels: with the
        # second load (``_load_g_cols``), and the dw store moved ahead of this block in the same
        # commit, bwd_dqkwg took 1.36 ms per step against 1.29 (2k, full runs 05:27 / 04:03; both
        # undone, 1.29 again at 05:50); which of the two cost it is not known
        if DG_FROM_ROWS and DS_UNMASKED:  # only its diagonal and strict lower part are read below
            b_ds = b_dP * _pair_decay_all(b_g, scale, gc, i_b, i_h, i_t * BT, T, H, BT, PAIR_FACTORED)
        else:
            b_ds = tl.where(m_ij, b_dP * scale * _pair_decay(b_g, b_g, m_ij, False, gc, i_b, i_h, i_t * BT, T, H,
                                                             BT, PAIR_FACTORED), 0.)
        # Terms whose exponent is G_x - G_x (the diagonal of the pairwise decay, the last key's
        # exp(G_C - G_C)) carry no gradient: they are left out rather than added and subtracted,
        # since that +x - x would swamp the tiny true gradient of a strong decay in rounding.
        last = tl.minimum(i_t * BT + BT, T) - 1
        b_kdk = tl.where(o_t < last, tl.sum(b_k.to(tl.float32) * b_dk, 1), 0.)
        if DG_FROM_ROWS:
            b_diag = tl.sum(tl.where(o_i[:, None] == o_i[None, :], b_ds, 0.), 1)
            b_ds = tl.where(o_i[:, None] > o_i[None, :], b_ds, 0.)
            b_dqs = tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=DOT_PREC)
            b_dks = tl.dot(tl.trans(b_ds).to(b_q.dtype), b_q, input_precision=DOT_PREC)
            b_qf = b_q.to(tl.float32)
            b_kf = b_k.to(tl.float32)
            b_dq += b_dqs
            b_dg = tl.sum(b_qf * b_dq, 1) - b_kdk - tl.sum(b_kf * b_dks, 1)
            b_dq += b_diag[:, None] * b_kf
            b_dk += b_dks + b_diag[:, None] * b_qf
        else:
            b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC)
            b_M = tl.where(o_i[:, None] > o_i[None, :], b_ds * b_qk, 0.)
            # a row sum and a column sum (across warps) of M; one row sum of M - M^T instead (fewer
            # shuffles in sm_90 compiles) lost in the sweep of 2026-12-01 10:22: +1.9 / -0.1% (2k / 32k)
            b_dg = tl.sum(b_q.to(tl.float32) * b_dq, 1) - b_kdk + tl.sum(b_M, 1) - tl.sum(b_M, 0)
        b_dg += tl.where(o_t == last, tl.sum(b_kdk, 0) + tl.sum(b_hdh, 0) * tl.exp(g_last), 0.)
        tl.store(_seq(dG, i_k * B + i_b, i_h, T, H) + o_t * H, b_dg, mask=m_t)
    else:
        b_dq = b_dq * scale
        b_ds = tl.where(m_ij, b_dP * scale, 0.)
    if not (USE_G and DG_FROM_ROWS):
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=DOT_PREC)
        b_dk += tl.dot(tl.trans(b_ds).to(b_q.dtype), b_q, input_precision=DOT_PREC)
    _store_rows(dq, b_dq, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
    _store_rows(dk, b_dk, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
    _store_rows(dw, -b_dw, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)


@triton.jit
def _wy_prologue(Ai, beta, gc, k, i_b, i_h, i_t, T, H: tl.constexpr, BT: tl.constexpr,
                 USE_G: tl.constexpr, LOWP: tl.constexpr, SKIP_UPPER: tl.constexpr):
    """Chunk ``i_t``'s ``(Ai [BT, BT] as a dot operand, beta [BT], beta exp(G) [BT], G [BT] (0
    without gates))``, the vectors float32; the loads of ``_wu_kernel`` and ``_wy_bwd_kernel``
    (without gates ``beta exp(0)`` is ``beta`` exactly, and the compiler folds the ``exp``)."""
    o_t = i_t * BT + tl.arange(0, BT)
    # Ai is lower triangular: its strictly upper [BC, BC] blocks (zeros) are not read
    b_T = _op(_load_rows_where(Ai, _block_lower(BT, _BC, SKIP_UPPER), i_b, i_h, i_t * BT, T, H, BT, 0, BT, BT).to(tl.float32),
              k, LOWP)
    b_b = tl.load(_seq(beta, i_b, i_h, T, H) + o_t * H, mask=o_t < T, other=0.).to(tl.float32)
    b_g = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        b_g, g_last = _load_gc(gc, i_b, i_h, i_t, T, H, BT)
    return b_T, b_b, b_b * tl.exp(b_g), b_g


@triton.jit
def _wy_bwd_da(gc, k, v, dw, du, dv, b_T, b_b, b_be, b_g, i_b, i_h, r0, T,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr, USE_G: tl.constexpr, LOWP: tl.constexpr, DOT_PREC: tl.constexpr,
               PAIR_FACTORED: tl.constexpr):
    """First half of the WY backward of one chunk: writes the final ``dv``; returns ``dA``
    (``-Ai^T dAi Ai^T`` on A's strictly lower support, times ``exp(G_i - G_j)``, [BT, BT]) and the
    ``dbeta`` term through ``v`` ([BT]), float32. ``dAi = dw X_w^T + du X_u^T`` is summed over key
    and value slices of ``BK`` / ``BV``."""
    b_dT = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_kf = _load_rows(k, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK).to(tl.float32)
        b_dW = _load_rows(dw, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
        b_dT += tl.dot(_op(b_dW.to(tl.float32), k, LOWP), tl.trans(_op(b_kf * b_be[:, None], k, LOWP)),
                       input_precision=DOT_PREC)
    b_db = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_vf = _load_rows(v, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV).to(tl.float32)
        b_du = _op(_load_rows(du, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV).to(tl.float32), k, LOWP)
        b_dXu = tl.dot(tl.trans(b_T), b_du, input_precision=DOT_PREC)
        b_dT += tl.dot(b_du, tl.trans(_op(b_vf * b_b[:, None], k, LOWP)), input_precision=DOT_PREC)
        b_db += tl.sum(b_vf * b_dXu, 1)
        _store_rows(dv, b_dXu * b_b[:, None], i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)
    o_i = tl.arange(0, BT)
    m_s = o_i[:, None] > o_i[None, :]
    b_dA = -tl.dot(tl.trans(b_T), _op(tl.dot(_op(b_dT, k, LOWP), tl.trans(b_T), input_precision=DOT_PREC), k, LOWP),
                   input_precision=DOT_PREC)
    if USE_G:
        b_dA = b_dA * _pair_decay(b_g, _load_g_cols(gc, i_b, i_h, r0, T, H, BT), m_s, False,
                                  gc, i_b, i_h, r0, T, H, BT, PAIR_FACTORED)
    return tl.where(m_s, b_dA, 0.), b_db


@triton.jit
def _wy_bwd_dk(k, dw, dk_in, dk, b_T, b_b, b_be, b_eg, b_dA, i_b, i_h, r0, T,
               H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               LOWP: tl.constexpr, DOT_PREC: tl.constexpr, COMBINED: tl.constexpr, USE_G: tl.constexpr):
    """Second half: writes the final ``dk`` key slice by key slice. With ``P = dA k`` and
    ``Q = (beta dA)^T k`` ([BT, BK] per slice), ``dk += beta exp(G) dXw + beta P + Q``. Returns the
    [BT] ``dbeta`` and ``dG`` terms through ``w`` and through ``A``: ``sum_c k (P + exp(G) dXw)`` and
    ``sum_c k (beta exp(G) dXw + beta P - Q)`` (``sum_j dA_ij k_i.k_j`` and its column twin, without a
    [BT, BT] ``k k^T`` tile; the second only with ``USE_G``, else 0). Summed as the three row sums of
    ``k dXw``, ``k P``, ``k Q`` per key slice and combined after the loop, or, with ``COMBINED``
    (``WY_BWD_ROWSUMS_COMBINED``), combined before the sums: one or two per key slice instead of two
    or three. ``b_eg``: ``exp(G)`` [BT]."""
    b_dAc = _op(b_dA, k, LOWP)
    b_dAbT = _op(tl.trans(b_dA * b_b[:, None]), k, LOWP)
    b_kdXw = tl.zeros([BT], dtype=tl.float32)
    b_kP = tl.zeros([BT], dtype=tl.float32)
    b_kQ = tl.zeros([BT], dtype=tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)
    b_dG = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        b_kf = _load_rows(k, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK).to(tl.float32)
        b_kc = _op(b_kf, k, LOWP)
        b_dW = _op(_load_rows(dw, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK).to(tl.float32), k, LOWP)
        b_dXw = tl.dot(tl.trans(b_T), b_dW, input_precision=DOT_PREC)
        b_P = tl.dot(b_dAc, b_kc, input_precision=DOT_PREC)
        b_Q = tl.dot(b_dAbT, b_kc, input_precision=DOT_PREC)
        b_dk = _load_rows(dk_in, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK).to(tl.float32)
        if COMBINED:
            b_upd = b_dXw * b_be[:, None] + b_P * b_b[:, None]
            b_db += tl.sum(b_kf * (b_P + b_dXw * b_eg[:, None]), 1)
            if USE_G:
                b_dG += tl.sum(b_kf * (b_upd - b_Q), 1)
            b_dk += b_upd + b_Q
        else:
            b_kdXw += tl.sum(b_kf * b_dXw, 1)
            b_kP += tl.sum(b_kf * b_P, 1)
            b_kQ += tl.sum(b_kf * b_Q, 1)
            b_dk = b_dk + b_dXw * b_be[:, None] + b_P * b_b[:, None] + b_Q
        _store_rows(dk, b_dk, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
    if not COMBINED:
        b_db = b_kP + b_kdXw * b_eg
        if USE_G:
            b_dG = b_kdXw * b_be + b_kP * b_b - b_kQ
    return b_db, b_dG


@triton.jit
def _wy_bwd_dg(b_dG, dG_in, dg, i_b, i_h, o_t, T, B, H: tl.constexpr, NK_G: tl.constexpr):
    """Add the ``NK_G`` key-slice shares of the chunk-local ``dG`` ([BT]) and write
    ``dg_s = sum_{t >= s in the chunk} dG_t``."""
    m_t = o_t < T
    for i_s in range(NK_G):
        b_dG += tl.load(_seq(dG_in, i_s * B + i_b, i_h, T, H) + o_t * H, mask=m_t, other=0.)
    b_dG = tl.where(m_t, b_dG, 0.)
    b_rev = tl.sum(b_dG, 0) - tl.cumsum(b_dG, axis=0) + b_dG
    tl.store(_seq(dg, i_b, i_h, T, H) + o_t * H, b_rev.to(dg.dtype.element_ty), mask=m_t)


@_jit(do_not_specialize=["T", "B", "C0"])  # one compile for every length
def _wy_bwd_kernel(k, v, beta, gc, Ai, dw, du, dk_in, dG_in, dk, dv, dbeta, dg, T, B, C0,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK_G: tl.constexpr,
                   USE_G: tl.constexpr, LOWP: tl.constexpr, DOT_PREC: tl.constexpr,
                   PAIR_FACTORED: tl.constexpr, ROWSUMS_COMBINED: tl.constexpr, SKIP_UPPER: tl.constexpr,
                   HEADS_FASTEST: tl.constexpr):
    """Grid ``_chunk_grid(NT, B, H)``: back through ``w = Ai X_w``, ``u = Ai X_u`` and ``Ai = (I + A)^-1``; writes
    the final ``dk, dv, dbeta`` and ``dg`` (reverse cumsum of the chunk-local ``dG``, whose
    ``NK_G`` key-slice shares are summed here). Two passes over key slices of ``BK`` keep the live
    float32 tiles at [BT, BT] / [BT, BK]: ``_wy_bwd_da``, then ``_wy_bwd_dk``."""
    i_t, i_b, i_h = _chunk_ids(tl.program_id(0), tl.program_id(1), C0, H, HEADS_FASTEST)
    _wy_bwd_chunk(k, v, beta, gc, Ai, dw, du, dk_in, dG_in, dk, dv, dbeta, dg, i_t, i_b, i_h, T, B,
                  H, K, V, BT, BK, BV, NK_G, USE_G, LOWP, DOT_PREC, PAIR_FACTORED, ROWSUMS_COMBINED, SKIP_UPPER)


@triton.jit
def _wy_bwd_chunk(k, v, beta, gc, Ai, dw, du, dk_in, dG_in, dk, dv, dbeta, dg, i_t, i_b, i_h, T, B,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK_G: tl.constexpr,
                  USE_G: tl.constexpr, LOWP: tl.constexpr, DOT_PREC: tl.constexpr,
                  PAIR_FACTORED: tl.constexpr, ROWSUMS_COMBINED: tl.constexpr, SKIP_UPPER: tl.constexpr):
    """``_wy_bwd_kernel``'s work for chunk ``i_t`` of sequence ``i_b``, head ``i_h``."""
    r0 = i_t * BT
    o_t = r0 + tl.arange(0, BT)
    b_T, b_b, b_be, b_g = _wy_prologue(Ai, beta, gc, k, i_b, i_h, i_t, T, H, BT, USE_G, LOWP, SKIP_UPPER)
    b_dA, b_db = _wy_bwd_da(gc, k, v, dw, du, dv, b_T, b_b, b_be, b_g, i_b, i_h, r0, T,
                            H, K, V, BT, BK, BV, USE_G, LOWP, DOT_PREC, PAIR_FACTORED)
    b_rdb, b_rdg = _wy_bwd_dk(k, dw, dk_in, dk, b_T, b_b, b_be, tl.exp(b_g), b_dA, i_b, i_h, r0, T,
                              H, K, BT, BK, LOWP, DOT_PREC, ROWSUMS_COMBINED, USE_G)
    b_db += b_rdb
    tl.store(_seq(dbeta, i_b, i_h, T, H) + o_t * H, b_db.to(dbeta.dtype.element_ty), mask=o_t < T)
    if USE_G:
        # row sums minus column sums of dA * beta * k k^T, plus the term through w
        _wy_bwd_dg(b_rdg, dG_in, dg, i_b, i_h, o_t, T, B, H, NK_G)


# --- host side -------------------------------------------------------------------------------
def _lowp(x: torch.Tensor) -> bool:
    """Whether the WY kernels take dot operands in ``x``'s dtype (``WY_INPUT_DTYPE_DOTS``)."""
    return WY_INPUT_DTYPE_DOTS and x.dtype != torch.float32


def chunk_cumsum(g: torch.Tensor) -> torch.Tensor:
    B, T, H = g.shape
    gc = torch.empty(B, T, H, dtype=torch.float32, device=g.device)
    _cumsum_kernel[(_cdiv(T, BT), B * H)](g, gc, T, H=H, BT=BT, num_warps=_warps(1))
    return gc


def _solve_tril_prec(dtype: torch.dtype) -> str:
    """Precision of ``_solve_tril_kernel``'s off-diagonal merge dots for inputs of ``dtype``: TF32
    (tensor cores) for bf16 (``SOLVE_TRIL_TF32_MERGES``), exact float32 otherwise; the diagonal
    blocks are always exact.
    With bf16 the inverse is stored in bf16 (``WY_INPUT_DTYPE_DOTS``), whose rounding dominates
    TF32 merges: relative error of the inverse <= 1e-3 against bf16 storage's 9e-4 even for keys
    of pairwise cosine 0.97 and beta 1 (``benchmarks/solve_tril_precision.py``, CPU emulation).
    TF32 in every dot is not accurate: the diagonal blocks' repeated squaring amplifies TF32 input
    rounding (error 4e-2 at cosine 0.7, 1.4 at 0.97, beta 1). Float16 (10-bit mantissa like TF32) and
    a float32 inverse (``WY_INPUT_DTYPE_DOTS`` off) keep exact merges. Timings:
    docs/benchmarks/kernel_decisions/delta.md#_solve_tril_prec"""
    return "tf32" if SOLVE_TRIL_TF32_MERGES and dtype == torch.bfloat16 and WY_INPUT_DTYPE_DOTS else "ieee"


def _chunk_grid(chunks: int, B: int, H: int, lead: int | None = None) -> tuple:
    """``tiles.chunk_grid`` at ``HEADS_FASTEST``."""
    return _tiles_chunk_grid(chunks, B, H, lead, HEADS_FASTEST)


def _segments(nt: int, programs: int, x: torch.Tensor, backward: bool = False) -> list[tuple[int, int]]:
    """Chunk ranges of a walk with ``programs`` programs (``WALK_SEGMENTS``, for the reverse walk
    ``BWD_WALK_SEGMENTS`` when set; ``WALK_OVERLAP_BELOW_PER_SM``; ``overlap.plan``), in chunk order."""
    segments = BWD_WALK_SEGMENTS if backward and BWD_WALK_SEGMENTS is not None else WALK_SEGMENTS
    return _overlap.plan(nt, programs, x, segments, WALK_OVERLAP_BELOW_PER_SM)


def _wy_kernels(k, v, beta, gc, A, Ai, w, u, c0, c1, g=None):
    """``A``, its inverse ``Ai`` and ``w, u`` of chunks ``c0 .. c1 - 1``, in three kernels (two with
    ``KKT_SOLVE_FUSED``); with the gate ``g``, the first also writes those chunks' ``gc`` (``KKT_CUMSUM``)."""
    B, T, H, K = k.shape
    kkt = dict(H=H, K=K, BT=BT, BK=min(64, _pow2(K)), USE_G=gc is not None, DOT_PREC=_prec(k),
               PAIR_FACTORED=PAIR_DECAY_FACTORED, CUMSUM=g is not None, SKIP_UPPER=SKIP_UPPER_BLOCKS)
    solve = dict(BC=BC, MERGE_PREC=_solve_tril_prec(k.dtype), DIAG_SUBST=SOLVE_TRIL_DIAG_SUBST)
    order, grid = dict(HEADS_FASTEST=HEADS_FASTEST), _chunk_grid(c1 - c0, B, H)
    if KKT_SOLVE_FUSED:
        _kkt_solve_kernel[grid](k, beta, g, gc, A, Ai, T, c0, **kkt, **solve, **order,
                                **_launch(LAUNCH, "kkt_solve", k))
    else:
        _kkt_kernel[grid](k, beta, g, gc, A, T, c0, **kkt, **order, **_launch(LAUNCH, "kkt", k))
        _solve_tril_kernel[grid](A, Ai, T, c0, H=H, BT=BT, SKIP_UPPER=SKIP_UPPER_BLOCKS, **solve, **order,
                                 **_launch(LAUNCH, "solve_tril", k))
    _wu_kernels(k, v, beta, gc, Ai, w, u, c0, c1)


def _wu_kernels(k, v, beta, gc, Ai, w, u, c0, c1):
    """``w = Ai (beta exp(G) k)``, ``u = Ai (beta v)`` of chunks ``c0 .. c1 - 1``."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    _wu_kernel[_chunk_grid(c1 - c0, B, H)](
        k, v, beta, gc, Ai, w, u, T, c0, H=H, K=K, V=V, BT=BT, BK=min(64, _pow2(K)), BV=min(64, _pow2(V)),
        USE_G=gc is not None, LOWP=_lowp(k), DOT_PREC=_prec(k), SKIP_UPPER=SKIP_UPPER_BLOCKS,
        HEADS_FASTEST=HEADS_FASTEST, **_launch(LAUNCH, "wu", k))


def _wy_buffers(k, v):
    """``(A, Ai [B, T, H, BT], w, u)``, empty: ``A`` float32, ``Ai`` float32 or in the activations' dtype
    (``WY_INPUT_DTYPE_DOTS``), ``w, u`` in it."""
    B, T, H, K = k.shape
    A = torch.empty(B, T, H, BT, dtype=torch.float32, device=k.device)
    Ai = torch.empty(B, T, H, BT, dtype=k.dtype if _lowp(k) else torch.float32, device=k.device)
    return A, Ai, torch.empty_like(k), torch.empty_like(v)


def wy_fwd(k, v, beta, gc, g=None):
    """``(Ai [B, T, H, BT], w [B, T, H, K], u [B, T, H, V])``: the chunks' ``(I + A)^-1`` (float32, or
    the activations' dtype with ``WY_INPUT_DTYPE_DOTS``; with ``SKIP_UPPER_BLOCKS`` its strictly upper
    ``[16, 16]`` blocks, zeros, are left unwritten) and the WY factors, in three kernels
    (``A``, its inverse, ``w, u``). ``g``: the gate, from which the first kernel fills ``gc``."""
    A, Ai, w, u = _wy_buffers(k, v)
    _wy_kernels(k, v, beta, gc, A, Ai, w, u, 0, _cdiv(k.shape[1], BT), g)
    return Ai, w, u


def wu(k, v, beta, gc, Ai):
    """``w = Ai (beta exp(G) k)``, ``u = Ai (beta v)`` (the activations' dtype)."""
    w, u = torch.empty_like(k), torch.empty_like(v)
    _wu_kernels(k, v, beta, gc, Ai, w, u, 0, _cdiv(k.shape[1], BT))
    return w, u


def _fwd_h_walk(k, w, u, gc, h, vn, h_in, h_out, BV, c0, c1):
    """The forward state walk over chunks ``c0 .. c1 - 1`` from ``h_in`` (None: zero) to ``h_out``
    (None: not stored), both ``[B, H, K, V]`` float32 and possibly one buffer."""
    B, T, H, K = k.shape
    V = u.shape[-1]
    _fwd_h_kernel[(_cdiv(V, BV), B * H)](
        k, w, u, gc, h, vn, h_in, h_out, T, h.shape[1], c0, c1, H=H, K=K, V=V, BT=BT, BK=_pow2(K), BV=BV,
        USE_G=gc is not None, USE_H0=h_in is not None, STORE_HT=h_out is not None, DOT_PREC=_prec(k),
        **(_launch(LAUNCH, "fwd_h", k) if BV > 32 else _launch(LAUNCH, "fwd_h_bv32", k)))


def _walk_buffers(k, u, output_final_state):
    """``(h [B, NT, H, K, V], vn like u, ht [B, H, K, V] float32 | None)``, empty."""
    B, T, H, K = k.shape
    h = k.new_empty(B, _cdiv(T, BT), H, K, u.shape[-1], dtype=_state_dtype(k))
    ht = k.new_empty(B, H, K, u.shape[-1], dtype=torch.float32) if output_final_state else None
    return h, torch.empty_like(u), ht


def fwd_h(k, w, u, gc, h0, output_final_state):
    """``(h, vn, ht | None)`` from one walk over every chunk (the backward's recomputation)."""
    B, T, H, K = k.shape
    h, vn, ht = _walk_buffers(k, u, output_final_state)
    BV = walk_bv(k, B * H, u.shape[-1])  # the sequential walk: grid (V/BV, B*H), full K per program
    _fwd_h_walk(k, w, u, gc, h, vn, h0, ht, BV, 0, h.shape[1])
    return h, vn, ht


def _fwd_o_kernels(q, k, vn, gc, h, o, scale, c0, c1, p=None):
    """The output of chunks ``c0 .. c1 - 1`` into ``o`` (and their scores ``P`` into ``p`` unless None)."""
    B, T, H, K = q.shape
    V = vn.shape[-1]
    BK, BV = min(64, _pow2(K)), min(128, _pow2(V))
    _fwd_o_kernel[_chunk_grid(c1 - c0, B, H, _cdiv(V, BV))](
        q, k, vn, gc, h, o, p, scale, T, h.shape[1], c0, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
        USE_G=gc is not None, DOT_PREC=_prec(q), PAIR_FACTORED=PAIR_DECAY_FACTORED, HEADS_FASTEST=HEADS_FASTEST,
        STORE_P=p is not None, **_launch(LAUNCH, "fwd_o", q))


def _p_buffer(q: torch.Tensor, keep_p: bool) -> torch.Tensor | None:
    """``p [B, T, H, BT]`` (empty, ``q``'s dtype) for the chunks' scores when ``keep_p``, else None."""
    B, T, H, _ = q.shape
    return q.new_empty(B, T, H, BT) if keep_p else None


def forward(q, k, v, gc, beta, h0, scale, output_final_state, g=None, keep_p=False):
    """The forward: ``(o [B, T, H, V], Ai, w, u, h, vn, ht | None, p [B, T, H, BT] | None)``
    (``p``: the chunks' scores, with ``keep_p``: ``KEEP_P`` when a backward will run). The state walk runs in
    segments beside the WY kernels before it and the output kernel after it when it has few
    programs (``overlap``). ``g``: the gate, from which ``_kkt_kernel`` fills the empty ``gc``
    (``KKT_CUMSUM``); else ``gc`` is already filled (or None: ungated)."""
    assert g is None or gc is not None, "the gate's cumsum needs its buffer"
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    BV = walk_bv(k, B * H, V)
    segments = _segments(NT, _cdiv(V, BV) * B * H, k)
    if len(segments) == 1:
        # the walk's and the output's buffers allocated after the WY kernels are launched (as
        # before the segments): the host's time to the first launch is time the GPU idles in a
        # step that starts from an idle GPU
        Ai, w, u = wy_fwd(k, v, beta, gc, g)
        h, vn, ht = fwd_h(k, w, u, gc, h0, output_final_state)
        p = _p_buffer(q, keep_p)
        return fwd_o(q, k, vn, gc, h, scale, p), Ai, w, u, h, vn, ht, p
    A, Ai, w, u = _wy_buffers(k, v)
    p = _p_buffer(q, keep_p)
    h, vn, ht = _walk_buffers(k, u, output_final_state)
    o = torch.empty_like(vn)
    carry = k.new_empty(B, H, K, V, dtype=torch.float32)

    def wy(c0, c1):
        nonlocal A
        _wy_kernels(k, v, beta, gc, A, Ai, w, u, c0, c1, g)
        if c1 == NT:  # only these kernels, on the current stream, use A: free it as before
            A = None

    def walk(c0, c1, i):
        _fwd_h_walk(k, w, u, gc, h, vn, h0 if i == 0 else carry, ht if i == len(segments) - 1 else carry,
                    BV, c0, c1)

    _overlap.run(segments, wy, walk, lambda c0, c1: _fwd_o_kernels(q, k, vn, gc, h, o, scale, c0, c1, p), k)
    return o, Ai, w, u, h, vn, ht, p


def fwd_o(q, k, vn, gc, h, scale, p=None):
    """The output of every chunk (``o`` like ``vn``); the chunks' scores into ``p`` unless None."""
    o = torch.empty_like(vn)
    _fwd_o_kernels(q, k, vn, gc, h, o, scale, 0, h.shape[1], p)
    return o


def bwd(q, k, v, beta, gc, Ai, h0, do, dht, scale, need_dh0, w=None, u=None, h_kept=None, p=None):
    """All input gradients: ``(dq, dk, dv, dbeta, dg | None, dh0 | None)`` (dg/dbeta float32).
    ``w, u``: the forward's (``u`` only matters without ``h_kept``), ``h_kept`` its ``(h, vn)``,
    ``p`` its chunk scores (``KEEP_P``), read by ``_bwd_dv_local_kernel``; what is missing is
    recomputed. In more than one segment (``BWD_WALK_SEGMENTS``, or
    ``WALK_SEGMENTS`` when it is None) the reverse state walk runs in segments (from the last chunks)
    beside the kernels before and after it when it has few programs (``overlap``); in one segment
    each buffer is allocated just before its first kernel and the transient ones freed after their
    last (host time before a launch is GPU idle time in a step from an idle GPU)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    use_g = gc is not None
    prec = _prec(q)
    if w is None or (h_kept is None and u is None):
        w, u = wu(k, v, beta, gc, Ai)
    h, vn = h_kept if h_kept is not None else fwd_h(k, w, u, gc, h0, False)[:2]
    BKf = _pow2(K)
    BVo = min(128, _pow2(V))
    BV = walk_bv(q, B * H, V)
    segments = _segments(NT, _cdiv(V, BV) * B * H, q, backward=True)[::-1]  # walk order: the last chunks first
    one = len(segments) == 1

    def dv_local(c0, c1):
        _bwd_dv_local_kernel[_chunk_grid(c1 - c0, B, H, _cdiv(V, BVo))](
            q, k, gc, p, do, dv_loc, scale, T, c0, H=H, K=K, V=V, BT=BT, BK=min(64, BKf), BV=BVo,
            USE_G=use_g, DOT_PREC=prec, PAIR_FACTORED=PAIR_DECAY_FACTORED, HEADS_FASTEST=HEADS_FASTEST,
            FROM_P=p is not None, **_launch(LAUNCH, "bwd_dv_local", q))

    def walk(c0, c1, i):
        d_in = dht if i == 0 else carry
        d_out = dh0 if i == len(segments) - 1 else carry
        _bwd_dh_kernel[(_cdiv(V, BV), B * H)](
            q, k, w, gc_dh, do, dv_loc, dv2, dh, d_in, d_out, scale, T, NT, c0, c1, H=H, K=K, V=V, BT=BT,
            BK=BKf, BV=BV, USE_G=gc_dh is not None, USE_DHT=d_in is not None, STORE_DH0=d_out is not None,
            DOT_PREC=prec, **_launch(LAUNCH, "bwd_dh", q))

    # the constexprs that bwd_dqkwg's and wy_bwd's launches share
    shared = dict(H=H, K=K, V=V, BT=BT, USE_G=use_g, DOT_PREC=prec, PAIR_FACTORED=PAIR_DECAY_FACTORED,
                  HEADS_FASTEST=HEADS_FASTEST)

    def dqkwg(c0, c1):
        _bwd_dqkwg_kernel[_chunk_grid(c1 - c0, B, H, NK)](
            q, k, vn, gc, h, do, dh, dv2, dq, dk_p, dw, dG, scale, T, NT, B, c0, **shared, BK=BKs,
            BV=min(DQKWG_BV, _pow2(V)), DG_FROM_ROWS=DQKWG_DG_FROM_ROWS, DS_UNMASKED=DQKWG_DS_UNMASKED,
            **_dqkwg_launch(use_g, q))

    def wy_bwd(c0, c1):
        _wy_bwd_kernel[_chunk_grid(c1 - c0, B, H)](
            k, v, beta, gc, Ai, dw, dv2, dk_p, dG, dk, dv, dbeta, dg, T, B, c0, **shared, BK=min(32, BKf),
            BV=min(32, _pow2(V)), NK_G=NK, LOWP=_lowp(q), ROWSUMS_COMBINED=WY_BWD_ROWSUMS_COMBINED,
            SKIP_UPPER=SKIP_UPPER_BLOCKS,
            **(_launch(LAUNCH, "wy_bwd_gated", q) if use_g else _launch(LAUNCH, "wy_bwd", q)))

    # The gradients passed between kernels (dv_loc, dv2, dk_p, dw) are stored in the inputs'
    # dtype, as fla does; each kernel does its arithmetic in float32. In bf16 that halves their
    # memory traffic (4 x [B, T, H, D]: written once, read up to three times).
    dv_loc = torch.empty_like(v)
    if one:
        dv_local(0, NT)
    dh = q.new_empty(B, NT, H, K, V, dtype=_state_dtype(q))
    dv2 = torch.empty_like(v)
    dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if need_dh0 else None
    gc_dh = gc
    if gc_dh is None and UNGATED_DH_ZERO_GATE:
        gc_dh = torch.zeros(B, T, H, dtype=torch.float32, device=q.device)
    carry = None if one else q.new_empty(B, H, K, V, dtype=torch.float32)
    if one:
        walk(0, NT, 0)
        dv_loc = gc_dh = None
    dq = torch.empty_like(q)
    dk_p, dw = torch.empty_like(k), torch.empty_like(k)
    BKs = min(DQKWG_BK, BKf)  # the key split (DQKWG_BK); warps and stages from LAUNCH (swept)
    NK = _cdiv(K, BKs)
    dG = torch.empty(NK, B, T, H, dtype=torch.float32, device=q.device) if use_g else None

    def final_buffers():
        """``dk, dv`` like the inputs, ``dbeta`` and ``dg`` (gated only) float32 ``[B, T, H]``, empty."""
        return (torch.empty_like(k), torch.empty_like(v), torch.empty(B, T, H, dtype=torch.float32, device=q.device),
                torch.empty(B, T, H, dtype=torch.float32, device=q.device) if use_g else None)

    if not one:  # every buffer exists before the first walk (``overlap.run``'s contract)
        dk, dv, dbeta, dg = final_buffers()
        _overlap.run(segments, dv_local, walk, lambda c0, c1: (dqkwg(c0, c1), wy_bwd(c0, c1)), q)
    else:
        dqkwg(0, NT)
        h = dh = vn = None  # freed before the final gradients' buffers are allocated
        dk, dv, dbeta, dg = final_buffers()
        wy_bwd(0, NT)
    return dq, dk, dv, dbeta, dg, dh0


class ChunkDeltaRule(torch.autograd.Function):
    """``(q, k, v [B,T,H,*], g [B,T,H] | None, beta [B,T,H], scale, h0 [B,H,K,V] | None, final, keep_p)``
    -> ``(o [B,T,H,V], final_state [B,H,K,V] float32 | None)``. Requires ``K <= MAX_K``. ``keep_p``: keep
    the chunks' scores for the backward (``KEEP_P``, asked only when one will run: ``backward_will_run``)."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0, output_final_state, keep_p):
        kkt_cumsum = g is not None and KKT_CUMSUM
        if kkt_cumsum:  # filled by the forward's first kernel
            gc = torch.empty(g.shape, dtype=torch.float32, device=g.device)
        else:
            gc = chunk_cumsum(g) if g is not None else None
        o, Ai, w, u, h, vn, ht, p = forward(q, k, v, gc, beta, h0, scale, output_final_state,
                                            g if kkt_cumsum else None, keep_p)
        # Kept for backward: the inputs, gc, the chunks' inverses Ai ([B, T, H, 64]; fla keeps its
        # inverse too, in the activations' dtype, as WY_INPUT_DTYPE_DOTS does; rebuilding it costs
        # two kernels) and, with KEEP_WU, w (and u, which only the state walk reads: not with
        # KEEP_H). The chunk states and U are recomputed by the state walk unless KEEP_H (a
        # [B, T/64, H, K, V] tensor per layer).
        # keep_p (KEEP_P when a backward will run): the chunks' scores P, read by the backward's first
        # kernel (bwd_dv_local).
        ctx.kept = (KEEP_WU, KEEP_H, keep_p)  # as at forward time: the switches may change before backward
        kept_wu = ((w,) if KEEP_H else (w, u)) if KEEP_WU else ()
        ctx.save_for_backward(q, k, v, g, beta, gc, Ai, h0, *kept_wu, *((h, vn) if KEEP_H else ()),
                              *((p,) if keep_p else ()))
        ctx.scale = scale
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, gc, Ai, h0, *kept = ctx.saved_tensors
        keep_wu, keep_h, keep_p = ctx.kept
        p = kept.pop() if keep_p else None
        w = kept[0] if keep_wu else None
        u = kept[1] if keep_wu and not keep_h else None
        h_kept = tuple(kept[-2:]) if keep_h else None
        do = do.contiguous()
        if dht is not None:
            dht = dht.contiguous()
        need_dh0 = h0 is not None and ctx.needs_input_grad[6]
        try:
            dq, dk, dv, dbeta, dg, dh0 = bwd(q, k, v, beta, gc, Ai, h0, do, dht, ctx.scale, need_dh0,
                                             w, u, h_kept, p)
        except KernelDoesNotFit as exc:
            from blocks.ops.gated_delta_rule import chunk_delta as torch_form

            dq, dk, dv, dg, dbeta, dh0 = reference_gradients(
                exc, "delta_rule" if g is None else "gated_delta_rule",
                lambda q, k, v, g, beta, h0: torch_form(q, k, v, g, beta, ctx.scale, h0, dht is not None, BT),
                (q, k, v, g, beta, h0), (*ctx.needs_input_grad[:5], need_dh0), do, dht)
            return dq, dk, dv, dg, dbeta, None, dh0, None, None
        dg = dg.to(g.dtype) if dg is not None else None
        return dq, dk, dv, dg, dbeta.to(beta.dtype), None, dh0, None, None


def chunk_delta(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``gated_delta_rule.chunk`` (``g=None``: ``delta_rule.chunk``). Shapes as the ops;
    head dims ``K > MAX_K`` run the PyTorch form (the delta rule does not split over keys), as do
    sequences of 2^31 elements or more per (batch, head-row), beyond the kernels' int32 offsets."""
    check_qkv(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    if g is not None:
        check_gate("g", g, (B, T, H))
    check_gate("beta", beta, (B, T, H))
    if K > MAX_K or T * H * max(K, V, BT) >= 2 ** 31:  # (per-sequence offsets are int32 in the kernels)
        from blocks.ops.gated_delta_rule import chunk_delta as torch_chunk_delta

        return torch_chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
    scale = K ** -0.5 if scale is None else float(scale)
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state: must have shape {(B, H, K, V)}, got {tuple(initial_state.shape)}")
        initial_state = initial_state.float().contiguous()
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    if g is not None:
        g = g.contiguous()
    keep_p = KEEP_P and backward_will_run(q, k, v, g, beta, initial_state)
    return ChunkDeltaRule.apply(q, k, v, g, beta, scale, initial_state, output_final_state, keep_p)


@register_kernel("delta_rule", "chunk")
@torch.compiler.disable  # torch.compile graphs break here and run the kernels as they are
@falls_back_to("delta_rule")
def delta_rule_chunk(q, k, v, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``blocks.ops.delta_rule.chunk``."""
    return chunk_delta(q, k, v, None, beta, scale, initial_state, output_final_state, chunk_size)


@register_kernel("gated_delta_rule", "chunk")
@torch.compiler.disable
@falls_back_to("gated_delta_rule")
def gated_delta_rule_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           chunk_size=64):
    """Triton ``blocks.ops.gated_delta_rule.chunk``."""
    return chunk_delta(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
