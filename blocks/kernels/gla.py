"""Triton chunk kernels, forward and backward, for gated linear attention with a decay per key
channel (``gla``): whole-chunk kernels where a chunk's decay allows, fla's secondary chunking of the
intra-chunk scores where it does not.

    S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T       S: [K, V] per (batch, head), float32 carry
    o_t = scale * S_t^T q_t

Shapes: ``q, k, gk: [B, T, H, K]``, ``v: [B, T, H, V]``, state ``[B, H, K, V]`` float32.

Two paths, chosen per chunk on the GPU (no host sync) by the chunk's ``span``, the largest range of
its chunk-local cumulative gate ``G`` in one key channel (``_cumsum_kernel``):

* below ``SPAN_MAX_CHUNK`` (60; every chunk of gates like ``logsigmoid(x) / 16``, fla's GLA
  default, and of plain ``logsigmoid`` over 64 rows unless a channel averages below -0.95 a step):
  the scores factor through the chunk's first row, ``A = scale mask((q exp(G - G_0)) (k exp(G_0 -
  G))^T)`` with factors within exp(+-60), so the forward's ``_fwd_o_kernel`` forms them beside the
  state read (and keeps them for the backward, ``KEEP_A``), the backward's ``_bwd_dv_kernel``
  gives dv from them (every chunk) and ``_bwd_chunk_kernel`` dq, dk and the gate's gradient of a
  chunk in one program per key slice, as [64, K] tensor-core dots;
* at or above it, the sub-chunk kernels below (``_intra_a_kernel``, ``_bwd_sub_kernel``,
  ``_rev_cumsum_kernel``), which skip the other chunks.

The sub-chunk path: a chunk of ``BT = 64`` positions is cut into four sub-chunks of ``BC = 16``. With chunk-local
inclusive prefix sums ``G`` (per channel), the intra-chunk score ``A_ij = sum_c q_ic k_jc
exp(G_ic - G_jc)`` is

* for query sub-chunk ``a`` after key sub-chunk ``b``: a matmul through the reference row
  ``n`` = the first row of ``a``, ``(q_a * exp(G_a - G_n)) (k_b * exp(G_n - G_b))^T``; ``G`` does
  not increase, so both exponents are <= 0 and no decay strength overflows;
* on the four diagonal 16x16 blocks: the same factoring through row ``n`` while the decay inside
  the block spans less than ``SPAN_MAX`` per channel (the factors stay within float32), else exact,
  all pairs as ``[16, 16, 32]`` tiles over key slices, pairs ``j > i`` masked to -inf before ``exp``.

So the exponentials per chunk are ``O(64 K)``, and at most ``4 * 16 * 16 * K`` on the diagonal under
steep decay, a quarter of the ``64 * 64 * K`` that exact pairwise scores over the whole chunk take;
the rest is tensor-core matmuls. The forward's scores run one program per 16-row block
(``_intra_a_kernel``); the backward of dq, dk and the gate one per 16-row block and 64-key slice
(``_bwd_sub_kernel``); with the whole-chunk kernels on, ``UNITS`` of them per program, steep chunks
only. On both paths the chunk states come from one sequential walk over the chunks inside a
kernel (``_fwd_h_kernel``), kept for the backward (``KEEP_H``; recomputed under
``ARCHSEARCH_LOW_MEMORY_KERNELS=1``); a reverse walk gives their gradients. The walks take a chunk
range ``[C0, C1)`` with the state carried in and out in float32, and the per-chunk kernels a first
chunk ``C0``: at long sequences (few walk programs) the walks run in segments on a side stream
while the per-chunk kernels of the segments already walked run beside them (``WALK_SEGMENTS``,
``overlap``), and the gate's cumsum runs per segment ahead of each (``SEGMENTED_CUMSUM``), with the
same results bit for bit.

Gate gradient: chunk-local, term by term (through ``exp(G) q`` for the state read, ``exp(G_C - G) k``
and ``exp(G_C)`` for the state write, and the strictly lower pairs of the scores), then a reverse
cumsum inside the chunk. Terms whose exponent is ``G_x - G_x`` carry no gradient and are left out
instead of being added and subtracted, so a tiny true gradient (strong decay) is not lost in
float32 rounding of ``+x - x``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from blocks.ops.utils import check_gate, check_qkv

from . import disabled, low_memory_from_env, overlap as _overlap, register_kernel
from .fallback import falls_back_to, reference_gradients
from .fitted import KernelDoesNotFit, jit as _jit
from .tiles import cdiv as _cdiv, dot_operand as _op, fast_exp as _exp, launch as _launch
from .tiles import dot_prec as _prec, load_rows as _rows, pow2 as _pow2, sm_count as _sm_count
from .tiles import state_dtype as _state_dtype, store_rows as _store, walk_bv as _tiles_walk_bv
from .tiles import block_lower as _block_lower, load_rows_where as _rows_where, store_rows_where as _store_where
from .tiles import backward_will_run

BT = 64  # chunk length inside the kernels
BC = 16  # sub-chunk (tl.dot's smallest block)
NC = BT // BC
_BC: tl.constexpr = tl.constexpr(BC)  # BC inside kernels (Triton reads only constexpr globals)
BKD = 32  # key slice of the [BC, BC, BKD] diagonal-block tiles (8 KB of float32 per temporary)
# Diagonal 16x16 blocks factor through their first row while the log decay inside them spans less
# than this (per key channel): the factors reach exp(SPAN_MAX) ~ 2e17, far below float32's 3e38,
# and their reciprocals stay normal. Stronger decay takes the exact pairwise path.
SPAN_MAX = 40.0
MAX_K = 128  # the per-chunk kernels keep full-K rows in registers; larger K is split into slices
# Warps and pipelining stages per kernel ("walk": the forward state walk and the reverse gradient
# walk; ``num_stages: None`` = ``tiles.stages``): the fastest of benchmarks/kernel_launch_sweep.py's
# one-at-a-time variants on the H200 (docs/benchmarks/kernel_launch_sweep.md).
# ``maxnreg``: a cap on registers per thread (ptxas; bf16 inputs only, ``tiles.launch``) that lets
# one more program onto each SM: ``intra_a``, the reverse cumsum, the walks (and that day's ``bwd_dv``)
# capped together -3.6 / -3.4% per fwd+bwd step at 2k / 32k (H200 2026-12-01 18:06,
# docs/benchmarks/register_caps.md); ``fwd_o``'s and ``bwd_chunk``'s caps: at their entries.
# history: docs/benchmarks/kernel_decisions/gla.md#launch
LAUNCH = {
    "cumsum": dict(num_warps=4, num_stages=3),
    "walk": dict(num_warps=4, num_stages=2, maxnreg=104),
    # the walks at V block 32 (long sequences, ``tiles.walk_bv``) at 3 stages: -3.0 / -3.7% per
    # fwd+bwd step at 32k synced / queued (H200 2026-12-02 02:55, ``train_ab.py``, both walks,
    # docs/benchmarks/train_ab_1202_bwd_chunk.md); at block 64 (2k) the same +4.1%, so it stays 2
    "walk_bv32": dict(num_warps=4, num_stages=3, maxnreg=104),
    # the walks over all of V (``WALK_FULL_V``, V block 128) at 8 warps with the walks' 104-register cap:
    # -1.9 / -3.6% per fwd+bwd step at 2k / 32k synced against V block 64 / 32 at 4 warps (H200
    # 2026-12-02 03:54, docs/benchmarks/train_ab_1202_walks.md); 3 stages -1.7 / -3.9% at 16k / 32k vs 2 (04:02)
    # history: docs/benchmarks/kernel_decisions/gla.md#launch-walk_bv128
    "walk_bv128": dict(num_warps=8, num_stages=3, maxnreg=104),
    "intra_a": dict(num_warps=4, num_stages=3, maxnreg=128),
    # the whole-chunk output kernel at 8 warps capped to 128 registers (2 programs per SM, no spills):
    # -1.0 / -1.1 / -1.2 / -0.6% per fwd+bwd step at 2k / 8k / 16k / 32k synced against 4 warps uncapped
    # (H200 2026-12-02 05:49, docs/benchmarks/train_ab_1202_epilogue.md); 1 stage: -1.7 / -2.9% at 2k /
    # 32k synced against 2 (H200 2026-12-02 02:55, docs/benchmarks/train_ab_1202_bwd_chunk.md)
    # history: docs/benchmarks/kernel_decisions/gla.md#launch-fwd_o
    "fwd_o": dict(num_warps=8, num_stages=1, maxnreg=128),
    # bwd_chunk at 8 warps capped to 128 registers (2 programs of 8 warps per SM, 368 B of spills in
    # sm_90 compiles, against 2 of 4 warps at 255 registers): -2.1 / -1.4% per fwd+bwd step at 2k /
    # 32k synced (H200 2026-12-02 01:33, docs/benchmarks/train_ab_1202_caps.md); 3 stages -2.4 / -2.5%
    # against 2 (H200 2026-12-02 02:52, docs/benchmarks/train_ab_1202_bwd_chunk.md)
    # history: docs/benchmarks/kernel_decisions/gla.md#launch-bwd_chunk
    "bwd_chunk": dict(num_warps=8, num_stages=3, maxnreg=128),
    "bwd_dv": dict(num_warps=8, num_stages=None),  # with BWD_DV_SEPARATE; 4 warps within 0.2% (23:53)
    # 2 warps -43.5 / -40.5% vs 8 (sweep 19:35), 1 stage -7.9 / -6.7% vs 2 (19:46);
    # at 19:59 (fewer spills) 4 warps +14.6 / +13.1%, 2 or 3 stages +10%
    "bwd_sub": dict(num_warps=2, num_stages=1),
    "rev_cumsum": dict(num_warps=4, num_stages=3, maxnreg=128),
}
# On the sub-chunk path (steep chunks; every chunk without ``WHOLE_CHUNK``) the backward of dq, dk
# and the gate runs one program per 16-row sub-chunk (``_bwd_sub_kernel``) plus a reverse-cumsum
# pass (``_rev_cumsum_kernel``): against the split pair it fuses (float32 partials and score
# gradients through memory) 7.70 / 8.82 vs 8.35 / 9.43 ms per fwd+bwd step at 2k / 32k (H200
# 2026-11-30 19:59, docs/benchmarks/kernel_launch_sweep_gla_final.md).
# history: docs/benchmarks/kernel_decisions/gla.md#sub-chunk-backward
# The forward's gate cumsum is a pass of its own (``_cumsum_kernel``): formed inside the state walk
# (``FWD_H_CUMSUM``, removed) it lost +21..+26% per step (H200 2026-12-02 10:49,
# docs/benchmarks/train_ab_1202_fwd_h_cumsum.md).
# history: docs/benchmarks/kernel_decisions/gla.md#bwd_da_kept-and-fwd_h_cumsum
# ``benchmarks/kernel_launch_sweep.py`` keeps timing the other value of every name in ``SWITCHES``.
# ARCHSEARCH_LOW_MEMORY_KERNELS=1 in the environment: the backward recomputes what the switches
# below keep from the forward.
LOW_MEMORY = low_memory_from_env()
# Keep the forward's chunk states h ([B, T/64, H, K, V], 8 KB per token at 16 heads of 128 in
# bf16) for the backward instead of rerunning the state walk (``fwd_h``: 0.87 ms for both calls of a 9.9 ms step
# at 64k tokens). Sweep 2026-11-30 16:49 (H200): fwd+bwd -4.6 / -9.0% (2k / 32k). Off under
# ARCHSEARCH_LOW_MEMORY_KERNELS=1.
KEEP_H = not LOW_MEMORY
# ``_bwd_sub_kernel``'s key slice: 64, two programs per sub-chunk at K = 128; 128 (one) measured
# +18.7 / +16.0% per fwd+bwd step at 2k / 32k at the kernel's launch (H200 sweep 2026-11-30 19:59,
# docs/benchmarks/kernel_launch_sweep_gla_final.md). Other shapes of the kernel lost too.
# history: docs/benchmarks/kernel_decisions/gla.md#bwd_sub_bk (other shapes: #sub-chunk-backward-per-chunk)
BWD_SUB_BK = 64
# ``_intra_a_kernel``'s dots on operands in the activations' dtype (bf16 tensor-core dots; the
# exponent factors are <= 1 off the diagonal and <= exp(SPAN_MAX) on it, in bf16's range but not
# float16's: float16 inputs keep float32 operands on the diagonal blocks), as
# fla's intra-chunk forward does; else float32 operands (TF32 dots). Off measured +1.1 / +1.0% fwd+bwd
# at 2k / 32k (sweep 19:35), +3.3 / +2.7% (19:59).
INTRA_A_INPUT_DTYPE_DOTS = True
# Whole-chunk kernels: a chunk whose cumulative gate spans less than ``SPAN_MAX_CHUNK`` in every key
# channel (``_cumsum_kernel``'s ``span``) has its scores and their gradients factored through its
# first row, ``(q exp(G - G_0)) (k exp(G_0 - G))^T``, as [64, K] tensor-core dots (``_fwd_o_kernel``
# one program per chunk, ``_bwd_chunk_kernel`` one per chunk and key slice), the way the
# scalar-decay kernels work. The
# factors stay within exp(+-60) ~ 1e26 (bf16's and float32's range; products of masked-out pairs
# up to ~1e26 |q||k| K); steeper chunks (a key channel falling by 60 within 64 rows: ~-0.95 a
# step; ``logsigmoid`` gates over 64 rows at -0.7 a step stay below) take the sub-chunk kernels,
# which skip every other chunk (``UNITS`` chunks or sub-chunks per program keep those launches
# short when few are steep). Off: every chunk takes the sub-chunk kernels, as before this switch.
SPAN_MAX_CHUNK = 60.0
WHOLE_CHUNK = True
# Key slices of ``_bwd_chunk_kernel`` (64: two programs per chunk at K = 128) and of ``_fwd_o_kernel``'s
# loop. ``_bwd_chunk_kernel`` at 32 in its launch: +6.2 / +6.8 / +5.2 / +4.5% per fwd+bwd step at
# 2k / 8k / 16k / 32k synced (H200 2026-12-02 04:02, docs/benchmarks/train_ab_1202_walks.md);
# ``_fwd_o_kernel`` at 32: 0.84-0.86 vs 0.78 ms (H200 2026-12-01 21:31-21:37, docs/benchmarks/gla_whole_chunk.md).
# history: docs/benchmarks/kernel_decisions/gla.md#bwd_chunk_bk-and-fwd_o_bk
BWD_CHUNK_BK = 64
FWD_O_BK = 64
# Removed after losing (H200 2026-12-02): ``_bwd_chunk_kernel``'s ``BWD_CHUNK_PREFETCH`` and
# ``BWD_CHUNK_SERIAL_SLICES``.
# history: docs/benchmarks/kernel_decisions/gla.md#bwd_chunk_prefetch-and-bwd_chunk_serial_slices
# ``BWD_DV_SEPARATE``: dv from its own kernel (``_bwd_dv_kernel``, one program per chunk and 128 value
# columns), ``_bwd_chunk_kernel`` the dq, dk and gate part only; ``KEEP_A``: every chunk's scores A kept
# from the forward for that dv (``[B, T, H, 64]`` in the activations' dtype: 2 KB per token and layer
# at 16 heads in bf16) instead of formed again in the backward. Both: -14.9 / -12.4% per fwd+bwd step
# at 2k / 32k against neither (H200 2026-12-01 23:53, docs/benchmarks/gla_whole_chunk.md).
# KEEP_A is off under ARCHSEARCH_LOW_MEMORY_KERNELS=1, and applies only when a backward will run
# (``tiles.backward_will_run``; under ``torch.no_grad`` the forward writes only the steep chunks' A).
# history: docs/benchmarks/kernel_decisions/gla.md#bwd_dv_separate-and-keep_a
BWD_DV_SEPARATE = True
KEEP_A = not LOW_MEMORY
# The chunks' causal [64, 64] scores ``A`` moved without their strictly upper [BC, BC] blocks
# (``tiles.block_lower``): the kept scores' zeros there are not written (``_fwd_o_kernel``) and no
# kernel reads them (``_fwd_o_kernel``'s steep chunks, ``_dv_blocks``); ``intra_a`` still writes its
# zeros (its scores are returned whole).
SKIP_UPPER_BLOCKS = True
STEEP_UNITS = 16  # sub-chunk kernels' work units per program when few chunks are steep (not swept; a power of 2)
# The sub-chunk kernels (``intra_a``, ``bwd_sub``, ``rev_cumsum``) launch over every chunk, since
# which chunks are steep is known on the GPU only (``span``); a program first reads the spans of all
# its ``STEEP_UNITS`` units in one vector load and returns when none is steep, instead of one
# dependent load per unit in its loop (16 round trips to L2 for each of 8192 ``bwd_sub`` programs
# at 64k tokens). Off: the per-unit checks alone. H200 2026-12-04 10:35 (``train_ab.py``,
# docs/benchmarks/train_ab_1204_steep_check.md): the three kernels 0.063 -> 0.021 ms per step at 2k with no
# steep chunk; off +0.8 / +0.7 / +0.8% per step queued at 2k / 16k / 32k (+1.4 / +1.4 / +2.1% synced).
# history: docs/benchmarks/kernel_decisions/gla.md#steep_check_first
STEEP_CHECK_FIRST = True
# The state walks (``_fwd_h_kernel``, ``_bwd_dh_kernel``) in segments of chunks on a high-priority
# stream, the per-chunk kernels after them (``_fwd_o_kernel``; ``_bwd_dv_kernel``,
# ``_bwd_chunk_kernel``) running on the current stream as each segment's chunks are ready
# (``overlap``, as delta's walks), when a walk has fewer than WALK_OVERLAP_BELOW_PER_SM programs
# per SM: long sequences, where each walk program is a chain of T/64 dependent steps at low
# occupancy (H200 2026-12-02 00:52, ms per fwd+bwd step: the two walks 0.97 + 0.85 at 32k
# against 0.44 + 0.43 at 2k, the whole step's difference). WALK_SEGMENTS = 1: one launch of each
# kernel over every chunk. Memory: one [B, H, K, V] float32 carry more (every other buffer coexists
# with the walks' outputs either way: ``dh`` lives until ``_bwd_sub_kernel``);
# ARCHSEARCH_LOW_MEMORY_KERNELS=1 keeps one segment all the same, as for delta. About
# ``WALK_SEGMENT_SPREAD`` / (programs per SM) segments, at most ``WALK_SEGMENTS``, and none below
# ``WALK_OVERLAP_BELOW_PER_SM``: with the walks over all of V, 1 segment at 8k -1.5% and 4 at 32k
# -4.1% per fwd+bwd step synced against 2 (H200 2026-12-02 04:02, docs/benchmarks/train_ab_1202_walks.md).
# history: docs/benchmarks/kernel_decisions/gla.md#walk_segments
WALK_SEGMENTS = 1 if LOW_MEMORY else 4
WALK_OVERLAP_BELOW_PER_SM = 2.5
WALK_SEGMENT_SPREAD = 2.0
# The forward's gate cumsum (``_cumsum_kernel``, 0.26-0.27 ms per step at every length: it reads the
# float32 gate and writes the float32 ``gc``) launched per walk segment as the segment's "before"
# (``overlap.run``), so that the first segment's walk starts after its own chunks' cumsum instead of
# every chunk's; the steep chunks' scores (``intra_a``) after the last segment's. With one segment
# it changes nothing. H200 2026-12-03 13:13 (``train_ab.py``, docs/benchmarks/train_ab_1203_segments.md):
# 32k 4.475 -> 4.399 ms per step queued (-1.7%), synced +2.2% (the host launched the four cumsums
# before the first walk; launching each walk right after its cumsum did not help), 16k within 0.2%
# queued; again -1.2 / -1.1% queued, +3.1 / +2.8% synced at 32k (13:23, 13:42). The throughput target
# is read on the queued figures (a training loop's).
SEGMENTED_CUMSUM = True
# Each walk program forms its chunk's decayed keys ``k exp(G_C - G)`` ([64, BK] with an exponential
# per element) before its dot, and every V block's program of one key slice forms the same ones.
# Over all of V at once (V block 128, 8 warps) they are formed once per key slice: fewer programs
# (64 at 32k, half a program per SM), each with the state [64, 128] float32 over 256 threads.
# Off: ``tiles.walk_bv``'s rule (V block 64, 32 below one program per SM).
# On: -1.9 / -3.6% per fwd+bwd step at 2k / 32k synced against V block 64 / 32 at 4 warps (H200
# 2026-12-02 03:54, docs/benchmarks/train_ab_1202_walks.md; its launch: ``LAUNCH["walk_bv128"]``).
WALK_FULL_V = True
# The walks' key slice stays 64 (``_walk_blocks``): 32 where 64 gives fewer than one program per SM
# lost, +1.7 / +1.3% per fwd+bwd step synced at 16k / 32k (H200 2026-12-02 10:39,
# docs/benchmarks/train_ab_1202_walk_bk.md).
# history: docs/benchmarks/kernel_decisions/gla.md#walk-key-slice
# ``_bwd_chunk_kernel``'s gate: the reverse cumsum's chunk total and the chunk-wide term
# ``sum_{j<last} k_j dk_j`` (the state write's part of dk) in one column sum, that of ``q.dq - k.dk``
# without the state write's part, before it is taken out of the rows (which is also what the two sums
# added up to: the ``+x - x`` of those terms is gone), instead of two column sums of [BT, BK] tiles,
# each across the warps. -3.0 / -2.7 / -3.5 / -2.0% per step synced at 2k / 8k / 16k / 32k (H200
# 2026-12-02 08:25, ``train_ab.py --families gla``, docs/benchmarks/train_ab_1202_switches.md).
# history: docs/benchmarks/kernel_decisions/gla.md#bwd_chunk_one_total
BWD_CHUNK_ONE_TOTAL = True
SWITCHES = {"KEEP_H": (False, True), "BWD_SUB_BK": (64, 128), "INTRA_A_INPUT_DTYPE_DOTS": (False, True),
            "WHOLE_CHUNK": (False, True), "BWD_CHUNK_BK": (64, 128), "FWD_O_BK": (32, 64),
            "BWD_DV_SEPARATE": (False, True), "KEEP_A": (False, True), "WALK_SEGMENTS": (1, 2, 4, 8),
            "WALK_FULL_V": (False, True), "BWD_CHUNK_ONE_TOTAL": (False, True), "SEGMENTED_CUMSUM": (False, True), "SKIP_UPPER_BLOCKS": (False, True),
            "STEEP_CHECK_FIRST": (False, True)}
# --- device helpers --------------------------------------------------------------------------
@triton.jit
def _g_row(gc, i_b, i_h, r, last, T, H: tl.constexpr, K: tl.constexpr, c0, BK: tl.constexpr):
    """Row ``min(r, last)`` of the chunk-local cumulative gate ``gc: [B, T, H, K]``, ``[BK]``."""
    o_k = c0 + tl.arange(0, BK)
    return tl.load(gc + ((i_b * T + tl.minimum(r, last)) * H + i_h) * K + o_k, mask=o_k < K, other=0.)


@triton.jit
def _g_rows(gc, g_last, i_b, i_h, r0, T, H: tl.constexpr, K: tl.constexpr, c0,
            BR: tl.constexpr, BK: tl.constexpr):
    """Rows of ``gc`` with rows past ``T`` set to the chunk's last valid row ``g_last`` (so every
    exponent formed from them stays <= 0)."""
    o_r = r0 + tl.arange(0, BR)
    b_g = _rows(gc, i_b, i_h, r0, T, H, K, c0, BR, BK)
    return tl.where((o_r < T)[:, None], b_g, g_last[None, :])


@triton.jit
def _dq_from_earlier(b_dAab, k, gc, g_last, b_gn, i_b, i_h, i_t, b, T, H: tl.constexpr, K: tl.constexpr,
                     c0, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr):
    """Query sub-chunk ``a``, key sub-chunk ``b`` before it, their score gradients ``b_dAab: [BC, BC]``:
    ``dA_ab (k_b exp(G_n - G_b))``, ``[BC, BK]`` (times ``exp(G_a - G_n)`` later, ``n`` = the first
    row of ``a``)."""
    rb = i_t * BT + b * BC
    b_kb = _rows(k, i_b, i_h, rb, T, H, K, c0, BC, BK).to(tl.float32)
    b_gb = _g_rows(gc, g_last, i_b, i_h, rb, T, H, K, c0, BC, BK)
    return tl.dot(b_dAab, b_kb * _exp(b_gn[None, :] - b_gb), input_precision=DOT_PREC)


@triton.jit
def _dk_from_later(b_dAca, q, gc, g_last, b_gm, i_b, i_h, i_t, c, T, H: tl.constexpr, K: tl.constexpr,
                   c0, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr):
    """Key sub-chunk ``a``, query sub-chunk ``c`` after it, their score gradients ``b_dAca: [BC, BC]``:
    ``dA_ca^T (q_c exp(G_c - G_m))``, ``[BC, BK]`` (times ``exp(G_m - G_a)`` later, ``m`` = the last
    row of ``a``)."""
    rc = i_t * BT + c * BC
    b_qc = _rows(q, i_b, i_h, rc, T, H, K, c0, BC, BK).to(tl.float32)
    b_gc = _g_rows(gc, g_last, i_b, i_h, rc, T, H, K, c0, BC, BK)
    return tl.dot(tl.trans(b_dAca), b_qc * _exp(b_gc - b_gm[None, :]), input_precision=DOT_PREC)


@triton.jit
def _dA_block(do, v, i_b, i_h, ri, rj, scale, T, H: tl.constexpr, V: tl.constexpr,
              BC: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr):
    """Score gradients ``dA = scale mask(do v^T)`` of query rows ``ri ..`` against key rows ``rj ..``
    (sub-chunks of one chunk), unmasked: ``scale do_i v_j^T``, ``[BC, BC]`` float32."""
    b_dA = tl.zeros([BC, BC], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        b_do = _rows(do, i_b, i_h, ri, T, H, V, i_v * BV, BC, BV)
        b_v = _rows(v, i_b, i_h, rj, T, H, V, i_v * BV, BC, BV)
        b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
    return b_dA * scale


@triton.jit
def _diag_grads(b_dAaa, b_q, b_k, b_ga, b_gn, b_gm, b_dqs, b_dks,
                BC: tl.constexpr, DOT_PREC: tl.constexpr, SPAN_MAX: tl.constexpr):
    """Add the diagonal block's strictly-lower pairs to a sub-chunk's ``(dqs, dks)`` (``[BC, BK]``):
    ``dq_ic += sum_j dA_ij k_jc E_ijc``, ``dk_jc += sum_i dA_ij q_ic E_ijc``, ``E = exp(G_ic - G_jc)``;
    factored through row ``n`` (two dots) while the block's decay span allows, else exactly, one
    key row ``j`` at a time. Also returns the diagonal of ``dA_aa`` (``[BC]``)."""
    o_c = tl.arange(0, BC)
    if tl.max(b_gn - b_gm, axis=0) < SPAN_MAX:
        b_dAm = tl.where(o_c[:, None] > o_c[None, :], b_dAaa, 0.)
        b_en = _exp(b_ga - b_gn[None, :])  # <= 1
        b_dqs += tl.dot(b_dAm, b_k / b_en, input_precision=DOT_PREC) * b_en
        b_dks += tl.dot(tl.trans(b_dAm), b_q * b_en, input_precision=DOT_PREC) / b_en
    else:
        # one key row j at a time: [BC, BK] temporaries, not an [i, j, c] tile (16 KB of float32
        # at BK = 64, which the compiler reserves registers for even though this path is rare)
        for j in range(BC):
            sel_j = o_c == j
            b_kj = tl.sum(tl.where(sel_j[:, None], b_k, 0.), axis=0)  # [BK]
            b_gj = tl.sum(tl.where(sel_j[:, None], b_ga, 0.), axis=0)
            b_dAj = tl.sum(tl.where(sel_j[None, :], b_dAaa, 0.), axis=1)  # dA_ij over rows i: [BC]
            b_de = b_dAj[:, None] * _exp(tl.where((o_c > j)[:, None], b_ga - b_gj[None, :], float("-inf")))
            b_dqs += b_de * b_kj[None, :]
            b_dks += tl.where(sel_j[:, None], tl.sum(b_de * b_q, axis=0)[None, :], 0.)
    b_diag = tl.sum(tl.where(o_c[:, None] == o_c[None, :], b_dAaa, 0.), axis=1)
    return b_dqs, b_dks, b_diag


# --- kernels ---------------------------------------------------------------------------------
@_jit(do_not_specialize=["T", "NT", "C0"])  # one compile for every length
def _cumsum_kernel(gk, gc, span, T, NT, C0, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """Grid (chunks, B*H), BK >= K: for chunks ``C0 ..``, the chunk-local inclusive cumsum of ``gk``
    into float32 ``gc``, and the chunk's ``span: [B*H, NT]`` float32, the largest range (max - min
    over its rows) of that cumsum in any key channel: the chunk's scores factor through one
    reference row while it is below ``SPAN_MAX_CHUNK``."""
    i_t = tl.program_id(0) + C0
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    b_c = tl.cumsum(_rows(gk, i_b, i_h, i_t * BT, T, H, K, 0, BT, BK).to(tl.float32), axis=0)
    _store(gc, b_c, i_b, i_h, i_t * BT, T, H, K, 0, BT, BK)
    m_r = ((i_t * BT + tl.arange(0, BT)) < T)[:, None]
    b_span = tl.max(tl.where(m_r, b_c, float("-inf")), axis=0) - tl.min(tl.where(m_r, b_c, float("inf")), axis=0)
    tl.store(span + i_bh * NT + i_t, tl.max(b_span, axis=0))


@_jit(do_not_specialize=["T", "NT", "C0", "C1"])  # one compile for every length
def _fwd_h_kernel(k, v, gc, h, h0, ht, T, NT, C0, C1,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_H0: tl.constexpr, STORE_HT: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (K/BK, V/BV, B*H): walk chunks ``C0 .. C1 - 1`` in order from ``h0`` (zero without
    ``USE_H0``); ``h[b, t, h]`` = state before chunk t; ``ht``: the state after chunk ``C1 - 1``."""
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + i_bh * K * V + p_kv, mask=m_kv, other=0.)
    for i_t in range(C0, C1):
        tl.store(h + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        last = tl.minimum(i_t * BT + BT, T) - 1
        g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, i_k * BK, BK)
        b_g = _g_rows(gc, g_last, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
        b_k = _rows(k, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
        b_v = _rows(v, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_h *= _exp(g_last)[:, None]
        b_kd = (b_k * _exp(g_last[None, :] - b_g)).to(b_v.dtype)
        b_h += tl.dot(tl.trans(b_kd), b_v, input_precision=DOT_PREC)
    if STORE_HT:
        tl.store(ht + i_bh * K * V + p_kv, b_h, mask=m_kv)


@triton.jit
def _intra_a_rows(q, k, gc, A, scale, T, i_b, i_h, i_t, a, last, g_last,
                  H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr,
                  BK: tl.constexpr, BKD: tl.constexpr, DOT_PREC: tl.constexpr, SPAN_MAX: tl.constexpr,
                  LOWP: tl.constexpr, LOWP_DIAG: tl.constexpr):
    """Row block ``a`` (16 query rows) of chunk ``i_t``'s scores into ``A``: the blocks against
    earlier key sub-chunks, the diagonal block, zeros after it."""
    o_c = tl.arange(0, BC)
    ra = i_t * BT + a * BC
    b_q = _rows(q, i_b, i_h, ra, T, H, K, 0, BC, BK).to(tl.float32)
    b_ga = _g_rows(gc, g_last, i_b, i_h, ra, T, H, K, 0, BC, BK)
    b_gn = _g_row(gc, i_b, i_h, ra, last, T, H, K, 0, BK)
    b_qs = b_q * _exp(b_ga - b_gn[None, :])
    b_qs_lp = _op(b_qs, q, LOWP)
    for b in tl.static_range(NC):
        if b < a:
            rb = i_t * BT + b * BC
            b_kb = _rows(k, i_b, i_h, rb, T, H, K, 0, BC, BK).to(tl.float32)
            b_gb = _g_rows(gc, g_last, i_b, i_h, rb, T, H, K, 0, BC, BK)
            b_ks = _op(b_kb * _exp(b_gn[None, :] - b_gb), q, LOWP)
            b_A = tl.dot(b_qs_lp, tl.trans(b_ks), input_precision=DOT_PREC) * scale
            _store(A, b_A, i_b, i_h, ra, T, H, BT, b * BC, BC, BC)
        if b > a:
            _store(A, tl.zeros([BC, BC], dtype=tl.float32), i_b, i_h, ra, T, H, BT, b * BC, BC, BC)
    # the diagonal block. G falls by at most ``span`` inside it; while exp(span) is far from
    # float32's range the pairs factor through row n like the blocks above, one tensor-core
    # dot; else exactly, E[i, j, c] = exp(G_ic - G_jc) for j <= i (-inf before exp above) as
    # [BC, BC, BKD] tiles over key slices.
    b_gm = _g_row(gc, i_b, i_h, ra + BC - 1, last, T, H, K, 0, BK)
    if tl.max(b_gn - b_gm, axis=0) < SPAN_MAX:
        b_ka = _rows(k, i_b, i_h, ra, T, H, K, 0, BC, BK).to(tl.float32) * _exp(b_gn[None, :] - b_ga)
        if LOWP_DIAG:
            b_A = tl.dot(b_qs_lp, tl.trans(_op(b_ka, q, True)), input_precision=DOT_PREC)
        else:
            b_A = tl.dot(b_qs, tl.trans(b_ka), input_precision=DOT_PREC)
        b_A = tl.where(o_c[:, None] >= o_c[None, :], b_A, 0.)
    else:
        b_A = tl.zeros([BC, BC], dtype=tl.float32)
        m_ij = (o_c[:, None] >= o_c[None, :])[:, :, None]
        for i_k in tl.static_range(BK // BKD):
            d_q = _rows(q, i_b, i_h, ra, T, H, K, i_k * BKD, BC, BKD).to(tl.float32)
            d_k = _rows(k, i_b, i_h, ra, T, H, K, i_k * BKD, BC, BKD).to(tl.float32)
            d_g = _g_rows(gc, _g_row(gc, i_b, i_h, last, last, T, H, K, i_k * BKD, BKD),
                          i_b, i_h, ra, T, H, K, i_k * BKD, BC, BKD)
            d_e = _exp(tl.where(m_ij, d_g[:, None, :] - d_g[None, :, :], float("-inf")))
            b_A += tl.sum(d_q[:, None, :] * d_k[None, :, :] * d_e, axis=2)
    _store(A, b_A * scale, i_b, i_h, ra, T, H, BT, a * BC, BC, BC)


@triton.jit
def _is_steep(span, i_bh, i_t, NT, SPAN_MAX_CHUNK: tl.constexpr):
    """Whether chunk ``i_t`` of sequence-head ``i_bh`` takes the sub-chunk path: its ``span`` not
    below ``SPAN_MAX_CHUNK`` (a NaN span, from a NaN or infinite gate, too)."""
    return ~(tl.load(span + i_bh * NT + i_t) < SPAN_MAX_CHUNK)


@triton.jit
def _any_steep(span, i_bh, u0, n_units, NT, PER: tl.constexpr, SPAN_MAX_CHUNK: tl.constexpr, UNITS: tl.constexpr):
    """Whether any of units ``u0 .. u0 + UNITS - 1`` (below ``n_units``; unit ``u`` lies in chunk
    ``u // PER``) is in a steep chunk (``_is_steep``), from one vector load of their spans."""
    o_u = u0 + tl.arange(0, UNITS)
    m_u = o_u < n_units
    b_s = tl.load(span + i_bh * NT + o_u // PER, mask=m_u, other=0.)
    return tl.sum((m_u & ~(b_s < SPAN_MAX_CHUNK)).to(tl.int32), axis=0) > 0


@_jit(do_not_specialize=["T", "NT"])  # one compile for every length
def _intra_a_kernel(q, k, gc, span, A, scale, T, NT,
                    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                    NC: tl.constexpr, BK: tl.constexpr, BKD: tl.constexpr, DOT_PREC: tl.constexpr,
                    SPAN_MAX: tl.constexpr, LOWP: tl.constexpr, LOWP_DIAG: tl.constexpr,
                    SPAN_MAX_CHUNK: tl.constexpr, UNITS: tl.constexpr, CHECK_FIRST: tl.constexpr):
    """Grid (cdiv(NT*NC, UNITS), B*H), BK >= K: row blocks ``u % NC`` of chunks ``u // NC`` (``UNITS``
    consecutive ``u`` per program) of the steep chunks' scores ``A: [B, T, H, BT]`` float32 (scale
    included, zero above the diagonal; other chunks' rows are not written); ``LOWP``: dots on
    operands in ``q``'s dtype, ``LOWP_DIAG``: on the diagonal blocks too (factors up to
    exp(SPAN_MAX): bf16 only, float16 overflows). One program per 16-row block when every chunk
    takes this path (``UNITS`` 1): a program per chunk walking its four blocks in order was
    latency-bound (12% occupancy at 243 registers; Nsight Compute 22:59) and measured +4.0 / +3.3%
    per fwd+bwd step at 2k / 32k (sweep 23:21)."""
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    u0 = tl.program_id(0) * UNITS
    if CHECK_FIRST:  # STEEP_CHECK_FIRST
        if not _any_steep(span, i_bh, u0, NT * NC, NT, NC, SPAN_MAX_CHUNK, UNITS):
            return
    for u in range(u0, tl.minimum(u0 + UNITS, NT * NC)):
        i_t = u // NC
        if _is_steep(span, i_bh, i_t, NT, SPAN_MAX_CHUNK):
            last = tl.minimum(i_t * BT + BT, T) - 1
            g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, 0, BK)
            _intra_a_rows(q, k, gc, A, scale, T, i_b, i_h, i_t, u % NC, last, g_last,
                          H, K, BT, BC, NC, BK, BKD, DOT_PREC, SPAN_MAX, LOWP, LOWP_DIAG)


@_jit(do_not_specialize=["T", "NT", "C0"])  # one compile for every length
def _fwd_o_kernel(q, k, v, gc, span, h, A, o, scale, T, NT, C0,
                  H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
                  SPAN_MAX_CHUNK: tl.constexpr, LOWP: tl.constexpr, STORE_A: tl.constexpr,
                  SKIP_UPPER: tl.constexpr):
    """Grid (V/BV, chunks, B*H), chunks from ``C0``: ``o = scale (q * exp(G)) h + A v``, the
    scores ``A`` of a chunk whose span is below ``SPAN_MAX_CHUNK`` formed here through its first
    row ``0``, ``A = scale mask((q exp(G - G_0)) (k exp(G_0 - G))^T)`` (factors within
    exp(+-span)), else read from ``A`` (``_intra_a_kernel``); ``LOWP``: those dots on operands in ``q``'s dtype (bf16: float32's
    exponent range); ``STORE_A`` (``KEEP_A``): the scores it forms also written to ``A`` (by the
    programs of value block 0), for the backward."""
    i_v = tl.program_id(0)
    i_t = C0 + tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    r0 = i_t * BT
    last = tl.minimum(r0 + BT, T) - 1
    steep = _is_steep(span, i_bh, i_t, NT, SPAN_MAX_CHUNK)
    o_v = i_v * BV + tl.arange(0, BV)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, i_k * BK, BK)
        b_g = _g_rows(gc, g_last, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
        b_q = _rows(q, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
        b_h = tl.load(h + ((i_b * NT + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=(o_k < K)[:, None] & (o_v < V)[None, :], other=0.)
        if steep:
            b_o += tl.dot((b_q * _exp(b_g)).to(b_h.dtype), b_h, input_precision=DOT_PREC)
        else:  # _factored_scores_t's sum, untransposed, on the q and G tiles read above
            b_g0 = _g_row(gc, i_b, i_h, r0, last, T, H, K, i_k * BK, BK)
            b_k = _rows(k, i_b, i_h, r0, T, H, K, i_k * BK, BT, BK)
            # q exp(G) as (q exp(G - G_0)) exp(G_0): one [BT, BK] exponential fewer than forming it
            # apart, which costs +2.3 / +1.6 / +1.4 / -0.1% per fwd+bwd step at 2k / 8k / 16k / 32k
            # synced (H200 2026-12-02 05:35, docs/benchmarks/train_ab_1202_epilogue.md)
            b_qe = b_q * _exp(b_g - b_g0[None, :])
            b_o += tl.dot((b_qe * _exp(b_g0)[None, :]).to(b_h.dtype), b_h, input_precision=DOT_PREC)
            b_kf = _op(b_k * _exp(b_g0[None, :] - b_g), q, LOWP)
            b_A += tl.dot(_op(b_qe, q, LOWP), tl.trans(b_kf), input_precision=DOT_PREC)
    if steep:  # float32 as the other branch's (a kept A is in v's dtype)
        b_A = _rows_where(A, _block_lower(BT, _BC, SKIP_UPPER), i_b, i_h, r0, T, H, BT, 0, BT, BT).to(tl.float32)
    else:
        o_i = tl.arange(0, BT)
        b_A = tl.where(o_i[:, None] >= o_i[None, :], b_A * scale, 0.)
        if STORE_A:
            if i_v == 0:  # causal scores: the strictly upper [BC, BC] blocks (zeros) are never read
                _store_where(A, b_A, _block_lower(BT, _BC, SKIP_UPPER), i_b, i_h, r0, T, H, BT, 0, BT, BT)
    b_v = _rows(v, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)
    b_o = b_o * scale + tl.dot(b_A.to(b_v.dtype), b_v, input_precision=DOT_PREC)
    _store(o, b_o, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)


@_jit(do_not_specialize=["T", "NT", "C0", "C1"])  # one compile for every length
def _bwd_dh_kernel(q, do, gc, dh, dht, dh0, scale, T, NT, C0, C1,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, DOT_PREC: tl.constexpr):
    """Grid (K/BK, V/BV, B*H): reverse walk over chunks ``C1 - 1 .. C0`` from ``dht`` (zero without
    ``USE_DHT``); ``dh[b, t, h]`` = dLoss/d(state after chunk t); ``dh0``: the gradient of the state
    before chunk ``C0``."""
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    p_kv = o_k[:, None] * V + o_v[None, :]
    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_DHT:
        b_dh += tl.load(dht + i_bh * K * V + p_kv, mask=m_kv, other=0.)
    for i_r in range(C1 - C0):
        i_t = C1 - 1 - i_r
        tl.store(dh + ((i_b * NT + i_t) * H + i_h) * K * V + p_kv, b_dh.to(dh.dtype.element_ty), mask=m_kv)
        last = tl.minimum(i_t * BT + BT, T) - 1
        g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, i_k * BK, BK)
        b_g = _rows(gc, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)  # padded rows: q = 0
        b_q = _rows(q, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
        b_do = _rows(do, i_b, i_h, i_t * BT, T, H, V, i_v * BV, BT, BV)
        b_dh *= _exp(g_last)[:, None]
        b_qd = (b_q * _exp(b_g) * scale).to(b_do.dtype)
        b_dh += tl.dot(tl.trans(b_qd), b_do, input_precision=DOT_PREC)
    if STORE_DH0:
        tl.store(dh0 + i_bh * K * V + p_kv, b_dh, mask=m_kv)


@triton.jit
def _factored_scores_t(q, k, gc, i_b, i_h, r0, last, scale, T,
                       H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       DOT_PREC: tl.constexpr, LOWP: tl.constexpr):
    """A chunk's transposed scores ``A^T[j, i] = scale sum_c k_jc q_ic exp(G_ic - G_jc)`` for
    ``i >= j``, else 0, ``[BT, BT]`` float32, factored through the chunk's first row (its span
    below ``SPAN_MAX_CHUNK``), over all keys in slices of ``BK``."""
    o_i = tl.arange(0, BT)
    b_At = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        c0 = i_k * BK
        g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, c0, BK)
        g0 = _g_row(gc, i_b, i_h, r0, last, T, H, K, c0, BK)
        b_g = _g_rows(gc, g_last, i_b, i_h, r0, T, H, K, c0, BT, BK)
        b_kf = _op(_rows(k, i_b, i_h, r0, T, H, K, c0, BT, BK) * _exp(g0[None, :] - b_g), q, LOWP)
        b_qf = _op(_rows(q, i_b, i_h, r0, T, H, K, c0, BT, BK) * _exp(b_g - g0[None, :]), q, LOWP)
        b_At += tl.dot(b_kf, tl.trans(b_qf), input_precision=DOT_PREC)
    return tl.where(o_i[:, None] <= o_i[None, :], b_At * scale, 0.)


@triton.jit
def _dv_blocks(q, k, gc, A, do, dh, dv, steep, i_b, i_h, r0, last, p_h, scale, T, v0, v_step,
               H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr, DOT_PREC: tl.constexpr, LOWP: tl.constexpr, READ_A: tl.constexpr,
               SKIP_UPPER: tl.constexpr):
    """A chunk's ``dv = A^T do + (k exp(G_C - G)) dh^T`` for value blocks ``v0, v0 + v_step, ..``
    (``A`` through row 0, or read from ``A`` on a steep chunk or, with ``READ_A`` (``KEEP_A``),
    on every chunk)."""
    NK = tl.cdiv(K, BK)
    if READ_A or steep:  # float32 as the other branch's (a kept A is in v's dtype)
        b_At = tl.trans(_rows_where(A, _block_lower(BT, _BC, SKIP_UPPER), i_b, i_h, r0, T, H, BT, 0, BT, BT).to(tl.float32))
    else:
        b_At = _factored_scores_t(q, k, gc, i_b, i_h, r0, last, scale, T, H, K, BT, BK, DOT_PREC, LOWP)
    b_At = b_At.to(do.dtype.element_ty)
    for i_v in range(v0, tl.cdiv(V, BV), v_step):
        o_v = i_v * BV + tl.arange(0, BV)
        b_do = _rows(do, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)
        b_dv = tl.dot(b_At, b_do, input_precision=DOT_PREC)
        for i_kk in range(NK):  # the state write: (k exp(G_C - G)) dh^T over all keys
            c0 = i_kk * BK
            o_kk = c0 + tl.arange(0, BK)
            g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, c0, BK)
            b_g = _g_rows(gc, g_last, i_b, i_h, r0, T, H, K, c0, BT, BK)
            b_k = _rows(k, i_b, i_h, r0, T, H, K, c0, BT, BK)
            b_kd = (b_k * _exp(g_last[None, :] - b_g)).to(b_k.dtype)
            b_dh = tl.load(dh + p_h + o_kk[:, None] * V + o_v[None, :],
                           mask=(o_kk < K)[:, None] & (o_v < V)[None, :], other=0.)  # [BK, BV]
            b_dv += tl.dot(b_kd, b_dh.to(b_kd.dtype), input_precision=DOT_PREC)
        _store(dv, b_dv, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)


@_jit(do_not_specialize=["T", "NT", "C0"])  # one compile for every length
def _bwd_dv_kernel(q, k, gc, span, A, do, dh, dv, scale, T, NT, C0,
                   H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
                   SPAN_MAX_CHUNK: tl.constexpr, LOWP: tl.constexpr, READ_A: tl.constexpr,
                   SKIP_UPPER: tl.constexpr):
    """Grid (V/BV, chunks, B*H), chunks from ``C0`` (``BWD_DV_SEPARATE``): chunk ``i_t``'s dv for
    value block ``i_v``, every chunk: the chunk's ``A^T`` read (``READ_A``, ``KEEP_A``) or formed
    once per value block instead of once per key slice of ``_bwd_chunk_kernel``, which then does
    the dq, dk and gate part only."""
    i_v = tl.program_id(0)
    i_t = C0 + tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    r0 = i_t * BT
    last = tl.minimum(r0 + BT, T) - 1
    steep = _is_steep(span, i_bh, i_t, NT, SPAN_MAX_CHUNK)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    _dv_blocks(q, k, gc, A, do, dh, dv, steep, i_b, i_h, r0, last, p_h, scale, T, i_v, tl.cdiv(V, BV),
               H, K, V, BT, BK, BV, DOT_PREC, LOWP, READ_A, SKIP_UPPER)


@_jit(do_not_specialize=["T", "NT", "C0"])  # one compile for every length
def _bwd_chunk_kernel(q, k, v, gc, span, h, A, do, dh, dq, dk, dv, dg, scale, T, NT, C0,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
                      SPAN_MAX_CHUNK: tl.constexpr, LOWP: tl.constexpr, WITH_DV: tl.constexpr,
                      READ_A: tl.constexpr, ONE_TOTAL: tl.constexpr, SKIP_UPPER: tl.constexpr):
    """Grid (K/BK, chunks, B*H), chunks from ``C0``: chunk ``i_t``'s ``dv = A^T do + (k exp(G_C -
    G)) dh^T`` for the value blocks ``i_k, i_k + K/BK, ..`` (every chunk; ``A`` as in
    ``_fwd_o_kernel``: through row 0 below ``SPAN_MAX_CHUNK``, else read), and on chunks below ``SPAN_MAX_CHUNK`` also ``dq``, ``dk``
    and ``dg`` (final: after the chunk's reverse cumsum) of key slice ``i_k``:

        dq = scale (do h^T) exp(G) + (dA (k exp(G_0 - G))) exp(G - G_0) + diag(dA) k
        dk = (v dh^T) exp(G_C - G) + (dA^T (q exp(G - G_0))) exp(G_0 - G) + diag(dA) q

    with ``dA = scale do v^T`` strictly lower (the diagonal pairs, exponent 0, apart: no gate
    gradient). Gate: the row terms ``q.dq - k.dk`` without the ``G_x - G_x`` terms (as
    ``_bwd_sub_kernel``), their reverse cumsum over the chunk, plus the chunk-wide term
    ``sum_{j<last} k_j dk_j + exp(G_C) <h, dh>``. Steep chunks' ``dq, dk, dg`` come from
    ``_bwd_sub_kernel`` and ``_rev_cumsum_kernel``. Key slices, not one program over all keys:
    [64, 128] float32 tiles at 8 warps spilled (255 registers, 552 B in sm_90 compiles); the
    slices recompute the chunk's ``A`` and ``dA`` (two [64, 64] dots over 128 channels each).
    Without ``WITH_DV`` (``BWD_DV_SEPARATE``: ``_bwd_dv_kernel`` gives dv), the dq, dk and gate part
    only. ``READ_A``: every chunk's ``A`` read (``KEEP_A``)."""
    i_k = tl.program_id(0)
    i_t = C0 + tl.program_id(1)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    NK = tl.cdiv(K, BK)
    r0 = i_t * BT
    last = tl.minimum(r0 + BT, T) - 1
    steep = _is_steep(span, i_bh, i_t, NT, SPAN_MAX_CHUNK)
    o_i = tl.arange(0, BT)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    if WITH_DV:
        _dv_blocks(q, k, gc, A, do, dh, dv, steep, i_b, i_h, r0, last, p_h, scale, T, i_k, NK,
                   H, K, V, BT, BK, BV, DOT_PREC, LOWP, READ_A, SKIP_UPPER)
    if not steep:
        c0 = i_k * BK
        o_k = c0 + tl.arange(0, BK)
        b_dq = tl.zeros([BT, BK], dtype=tl.float32)
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        b_dA = tl.zeros([BT, BT], dtype=tl.float32)
        b_hdh = tl.zeros([BK], dtype=tl.float32)
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_vk = (o_v < V)[:, None] & (o_k < K)[None, :]
            b_v = _rows(v, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)
            b_do = _rows(do, i_b, i_h, r0, T, H, V, i_v * BV, BT, BV)
            b_hT = tl.load(h + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)  # [BV, BK]
            b_dhT = tl.load(dh + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)
            b_dq += tl.dot(b_do, b_hT.to(b_do.dtype), input_precision=DOT_PREC)
            b_dk += tl.dot(b_v, b_dhT.to(b_v.dtype), input_precision=DOT_PREC)
            b_dA += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
            b_hdh += tl.sum(b_hT.to(tl.float32) * b_dhT.to(tl.float32), axis=0)
        b_dA = b_dA * scale
        b_diag = tl.sum(tl.where(o_i[:, None] == o_i[None, :], b_dA, 0.), axis=1)
        b_dAm = _op(tl.where(o_i[:, None] > o_i[None, :], b_dA, 0.), q, LOWP)
        g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, c0, BK)
        b_g0 = _g_row(gc, i_b, i_h, r0, last, T, H, K, c0, BK)
        b_g = _g_rows(gc, g_last, i_b, i_h, r0, T, H, K, c0, BT, BK)
        b_q = _rows(q, i_b, i_h, r0, T, H, K, c0, BT, BK).to(tl.float32)
        b_k = _rows(k, i_b, i_h, r0, T, H, K, c0, BT, BK).to(tl.float32)
        b_e = _exp(b_g - b_g0[None, :])  # exp(G - G_0) in [exp(-span), 1]
        b_einv = _exp(b_g0[None, :] - b_g)
        # dq without the diagonal pairs: the state read (exp(G) = exp(G - G_0) exp(G_0)), earlier
        # keys; then dk: the state write (exp(G_C - G) = exp(G_C - G_0) exp(G_0 - G)), later
        # queries. In this order, each stored once done: 223 registers instead of 254 (sm_90, bf16)
        b_dq = (b_dq * (_exp(b_g0) * scale)[None, :]
                + tl.dot(b_dAm, _op(b_k * b_einv, q, LOWP), input_precision=DOT_PREC)) * b_e
        b_dG = b_q * b_dq
        _store(dq, b_dq + b_diag[:, None] * b_k, i_b, i_h, r0, T, H, K, c0, BT, BK)
        b_dk = b_dk * b_einv * _exp(g_last - b_g0)[None, :]
        # the moved part (every row but the chunk's last) masked where used, not kept as a tile of
        # its own beside dk: 232 B of spills instead of 256 on the GPU host's Triton 3.6 (sm_90, 8
        # warps, 128 registers); -1.8 / -0.5 / -1.0% per fwd+bwd step at 2k / 8k / 32k synced, -1.3 /
        # -0.9 / -1.1% queued (H200 2026-12-02 05:44, docs/benchmarks/train_ab_1202_epilogue.md).
        # history: docs/benchmarks/kernel_decisions/gla.md#bwd_chunk-epilogue
        m_moved = ((r0 + o_i) < last)[:, None]
        if ONE_TOTAL:
            # the chunk-wide total sum_t (q.dq - k.dk_intra)_t in one column sum (BWD_CHUNK_ONE_TOTAL)
            b_dki = tl.dot(tl.trans(b_dAm), _op(b_q * b_e, q, LOWP), input_precision=DOT_PREC) * b_einv
            b_dG -= b_k * b_dki
            b_tot = tl.sum(b_dG, axis=0) + _exp(g_last) * b_hdh
            b_dG -= b_k * tl.where(m_moved, b_dk, 0.)
            _store(dk, b_dk + b_dki + b_diag[:, None] * b_q, i_b, i_h, r0, T, H, K, c0, BT, BK)
            b_dg = b_tot[None, :] - tl.cumsum(b_dG, axis=0) + b_dG
        else:
            b_P = tl.sum(tl.where(m_moved, b_k * b_dk, 0.), axis=0) + _exp(g_last) * b_hdh
            b_dki = tl.dot(tl.trans(b_dAm), _op(b_q * b_e, q, LOWP), input_precision=DOT_PREC) * b_einv
            b_dG -= b_k * (tl.where(m_moved, b_dk, 0.) + b_dki)
            _store(dk, b_dk + b_dki + b_diag[:, None] * b_q, i_b, i_h, r0, T, H, K, c0, BT, BK)
            b_dg = tl.sum(b_dG, axis=0)[None, :] - tl.cumsum(b_dG, axis=0) + b_dG + b_P[None, :]
        _store(dg, b_dg, i_b, i_h, r0, T, H, K, c0, BT, BK)


@_jit(do_not_specialize=["T", "NT"])  # one compile for every length
def _bwd_sub_kernel(q, k, v, gc, span, h, do, dh, dq, dk, dG, P, scale, T, NT,
                    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                    NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
                    SPAN_MAX: tl.constexpr, SPAN_MAX_CHUNK: tl.constexpr, UNITS: tl.constexpr,
                    CHECK_FIRST: tl.constexpr):
    """Grid (K/BK, cdiv(NT*NC, UNITS), B*H): ``_bwd_sub`` of sub-chunks ``u`` (``UNITS`` consecutive
    per program) of the steep chunks (span at or above ``SPAN_MAX_CHUNK``)."""
    i_k = tl.program_id(0)
    i_bh = tl.program_id(2).to(tl.int64)
    u0 = tl.program_id(1) * UNITS
    if CHECK_FIRST:  # STEEP_CHECK_FIRST
        if not _any_steep(span, i_bh, u0, NT * NC, NT, NC, SPAN_MAX_CHUNK, UNITS):
            return
    for i_tc in range(u0, tl.minimum(u0 + UNITS, NT * NC)):
        if _is_steep(span, i_bh, i_tc // NC, NT, SPAN_MAX_CHUNK):
            _bwd_sub(q, k, v, gc, h, do, dh, dq, dk, dG, P, scale, T, NT, i_k, i_tc, i_bh,
                     H, K, V, BT, BC, NC, BK, BV, DOT_PREC, SPAN_MAX)


@triton.jit
def _bwd_sub(q, k, v, gc, h, do, dh, dq, dk, dG, P, scale, T, NT, i_k, i_tc, i_bh,
             H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
             NC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr,
             SPAN_MAX: tl.constexpr):
    """The backward of sub-chunk ``a`` (sub-chunk ``i_tc % NC`` of chunk
    ``i_tc // NC``; key columns ``i_k*BK ..``): the state parts of ``dq, dk`` for its 16 rows from
    ``h, dh``, and the intra-chunk parts from the score gradients it needs (``dA_ab``, ``b <= a``;
    ``dA_ca``, ``c > a``), computed from ``do, v`` here, so neither ``dA`` nor float32 partials of
    ``dq/dk/dg`` go through memory.
    Writes ``dq, dk`` (final), ``dG`` (float32, before the reverse cumsum) and ``P: [B, NT*NC, H, K]``
    float32, the sub-chunk's share of the chunk-wide gate term ``sum_{j<last} k_j dk_j + exp(G_C)
    <S, dS'>`` that ``_rev_cumsum_kernel`` adds to every row of the chunk."""
    i_b = i_bh // H
    i_h = i_bh % H
    i_t = i_tc // NC
    a = i_tc % NC
    c0 = i_k * BK
    last = tl.minimum(i_t * BT + BT, T) - 1
    g_last = _g_row(gc, i_b, i_h, last, last, T, H, K, c0, BK)
    ra = i_t * BT + a * BC
    # q, k rows kept in their own dtype (at 2 warps a [16, 64] float32 tile is 16 registers a thread)
    b_q = _rows(q, i_b, i_h, ra, T, H, K, c0, BC, BK)
    b_k = _rows(k, i_b, i_h, ra, T, H, K, c0, BC, BK)
    b_ga = _g_rows(gc, g_last, i_b, i_h, ra, T, H, K, c0, BC, BK)
    b_gn = _g_row(gc, i_b, i_h, ra, last, T, H, K, c0, BK)  # first row of a: keys in b < a
    b_gm = _g_row(gc, i_b, i_h, ra + BC - 1, last, T, H, K, c0, BK)  # last row of a: queries in c > a
    # state parts: do h^T, v dh^T and <h, dh> per key channel
    o_k = c0 + tl.arange(0, BK)
    p_h = ((i_b * NT + i_t) * H + i_h) * K * V
    b_dq = tl.zeros([BC, BK], dtype=tl.float32)
    b_dk = tl.zeros([BC, BK], dtype=tl.float32)
    b_hdh = tl.zeros([BK], dtype=tl.float32)
    b_dAaa = tl.zeros([BC, BC], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_vk = (o_v < V)[:, None] & (o_k < K)[None, :]
        b_do = _rows(do, i_b, i_h, ra, T, H, V, i_v * BV, BC, BV)
        b_v = _rows(v, i_b, i_h, ra, T, H, V, i_v * BV, BC, BV)
        # the diagonal block's score gradients from the rows already here (loading them again for
        # _dA_block measured +0.5..0.8% per step, sweep 22:57)
        b_dAaa += tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
        b_hT = tl.load(h + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)  # [BV, BK]
        b_dhT = tl.load(dh + p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.)
        b_dq += tl.dot(b_do, b_hT.to(b_do.dtype), input_precision=DOT_PREC)
        b_dk += tl.dot(b_v, b_dhT.to(b_v.dtype), input_precision=DOT_PREC)
        if a == 0:  # one program per chunk and key slice adds <h, dh>
            b_hdh += tl.sum(b_hT.to(tl.float32) * b_dhT.to(tl.float32), axis=0)
    b_dq = b_dq * _exp(b_ga) * scale
    b_dk = b_dk * _exp(g_last[None, :] - b_ga)
    # gate through the state: q . dq for the state read; the state write exp(G_C - G_j) k_j moves
    # gradient from row j < last to the chunk-wide term (row last: exponent 0, no gradient), as does
    # exp(G_C) S with <S, dS'>; the row terms are formed at the end
    o_r = ra + tl.arange(0, BC)
    b_dk_moved = tl.where((o_r < last)[:, None], b_dk, 0.)
    tl.store(P + ((i_b * NT * NC + i_tc) * H + i_h) * K + o_k,
             tl.sum(b_k.to(tl.float32) * b_dk_moved, axis=0) + _exp(g_last) * b_hdh, mask=o_k < K)
    # intra-chunk parts: pairs with earlier (b < a) and later (c > a) sub-chunks, then the diagonal block
    b_dqs = tl.zeros([BC, BK], dtype=tl.float32)
    b_dks = tl.zeros([BC, BK], dtype=tl.float32)
    for b in range(0, a):
        b_dAab = _dA_block(do, v, i_b, i_h, ra, i_t * BT + b * BC, scale, T, H, V, BC, BV, DOT_PREC)
        b_dqs += _dq_from_earlier(b_dAab, k, gc, g_last, b_gn, i_b, i_h, i_t, b, T, H, K, c0, BT, BC, BK, DOT_PREC)
    for c in range(a + 1, NC):
        b_dAca = _dA_block(do, v, i_b, i_h, i_t * BT + c * BC, ra, scale, T, H, V, BC, BV, DOT_PREC)
        b_dks += _dk_from_later(b_dAca, q, gc, g_last, b_gm, i_b, i_h, i_t, c, T, H, K, c0, BT, BC, BK, DOT_PREC)
    b_dqs = b_dqs * _exp(b_ga - b_gn[None, :])
    b_dks = b_dks * _exp(b_gm[None, :] - b_ga)
    b_dAaa = b_dAaa * scale  # masked in _diag_grads
    b_qf, b_kf = b_q.to(tl.float32), b_k.to(tl.float32)
    b_dqs, b_dks, b_diag = _diag_grads(b_dAaa, b_qf, b_kf, b_ga, b_gn, b_gm, b_dqs, b_dks, BC, DOT_PREC, SPAN_MAX)
    # gate: q . dq through the state read and the intra-chunk pairs, minus k . dk of what leaves
    # the row (rows < last: the state write; every row: the later queries in the chunk)
    _store(dG, b_qf * (b_dq + b_dqs) - b_kf * (b_dk_moved + b_dks), i_b, i_h, ra, T, H, K, c0, BC, BK)
    _store(dq, b_dq + b_dqs + b_diag[:, None] * b_kf, i_b, i_h, ra, T, H, K, c0, BC, BK)
    _store(dk, b_dk + b_dks + b_diag[:, None] * b_qf, i_b, i_h, ra, T, H, K, c0, BC, BK)


@_jit(do_not_specialize=["T", "NT"])  # one compile for every length
def _rev_cumsum_kernel(x, P, span, T, NT, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       NP: tl.constexpr, SPAN_MAX_CHUNK: tl.constexpr, UNITS: tl.constexpr, CHECK_FIRST: tl.constexpr):
    """Grid (K/BK, cdiv(NT, UNITS), B*H): on the steep chunks (``UNITS`` consecutive per program), in
    place, ``x[t] <- sum_{s >= t in t's chunk} x[s]`` (float32 ``[B, T, H, K]``; rows past ``T``
    count as zero) plus the sum of the chunk's ``NP`` rows of ``P: [B, NT*NP, H, K]`` on every row."""
    i_k = tl.program_id(0)
    i_bh = tl.program_id(2).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    u0 = tl.program_id(1) * UNITS
    if CHECK_FIRST:  # STEEP_CHECK_FIRST
        if not _any_steep(span, i_bh, u0, NT, NT, 1, SPAN_MAX_CHUNK, UNITS):
            return
    for i_t in range(u0, tl.minimum(u0 + UNITS, NT)):
        if _is_steep(span, i_bh, i_t, NT, SPAN_MAX_CHUNK):
            b_x = _rows(x, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)
            b_rev = tl.sum(b_x, axis=0)[None, :] - tl.cumsum(b_x, axis=0) + b_x
            b_rev += tl.sum(_rows(P, i_b, i_h, i_t * NP, NT * NP, H, K, i_k * BK, NP, BK), axis=0)[None, :]
            _store(x, b_rev, i_b, i_h, i_t * BT, T, H, K, i_k * BK, BT, BK)


# --- host side -------------------------------------------------------------------------------
def walk_bv(x: torch.Tensor, chains: int, V: int) -> int:
    """V block of gla's walks over ``chains`` (batch, head, key slice) chains: all of V up to 128
    (``WALK_FULL_V``), else ``tiles.walk_bv``'s."""
    return min(128, _pow2(V)) if WALK_FULL_V else _tiles_walk_bv(x, chains, V)


def _walk_blocks(x: torch.Tensor, B: int, H: int, K: int, V: int) -> tuple[int, int]:
    """(BK, BV) of the sequential chunk walks (grid ``(K/BK, V/BV, B*H)``; ``walk_bv``)."""
    BK = min(64, _pow2(K))
    return BK, walk_bv(x, B * H * _cdiv(K, BK), V)


def _cumsum_buffers(gk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gc [B, T, H, K] float32, span [B*H, NT] float32)``, empty (``chunk_cumsum``'s outputs)."""
    B, T, H, K = gk.shape
    gc = torch.empty(B, T, H, K, dtype=torch.float32, device=gk.device)
    return gc, torch.empty(B * H, _cdiv(T, BT), dtype=torch.float32, device=gk.device)


def _cumsum_chunks(gk, gc, span, c0, c1):
    """``gc`` and ``span`` of chunks ``c0 .. c1 - 1`` (``_cumsum_kernel``)."""
    B, T, H, K = gk.shape
    _cumsum_kernel[(c1 - c0, B * H)](gk, gc, span, T, span.shape[1], c0, H=H, K=K, BT=BT, BK=_pow2(K),
                                     **_launch(LAUNCH, "cumsum", gk))


def chunk_cumsum(gk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gc [B, T, H, K] float32, span [B*H, NT] float32)``: the chunk-local cumsum of ``gk`` and
    each chunk's largest range of it over one key channel (``_cumsum_kernel``)."""
    gc, span = _cumsum_buffers(gk)
    _cumsum_chunks(gk, gc, span, 0, span.shape[1])
    return gc, span


def chunk_paths() -> tuple[float, int]:
    """``(SPAN_MAX_CHUNK, UNITS)`` for the kernels of one call: chunks whose ``span`` is below the
    first take the whole-chunk kernels, the rest the sub-chunk ones, which run ``UNITS`` sub-chunks
    (or chunks) per program; without ``WHOLE_CHUNK`` every chunk takes the sub-chunk kernels, one
    per program as before."""
    return (SPAN_MAX_CHUNK, STEEP_UNITS) if WHOLE_CHUNK else (-1.0, 1)


def _segments(nt: int, programs: int, x: torch.Tensor) -> list[tuple[int, int]]:
    """Chunk ranges of a walk with ``programs`` programs, in chunk order (``overlap.plan``): on a GPU
    ``round(WALK_SEGMENT_SPREAD / programs per SM)`` of them, at least 1 and at most
    ``WALK_SEGMENTS``, and one below ``WALK_OVERLAP_BELOW_PER_SM`` programs per SM."""
    n = WALK_SEGMENTS
    if x.is_cuda:
        n = min(n, max(1, round(WALK_SEGMENT_SPREAD * _sm_count(x.device) / max(programs, 1))))
    return _overlap.plan(nt, programs, x, n, WALK_OVERLAP_BELOW_PER_SM)


def _walk_launch(x: torch.Tensor, BV: int) -> dict:
    """Launch settings of the walks at V block ``BV`` (``LAUNCH``: ``walk_bv128`` above 64, ``walk``
    at 64, ``walk_bv32`` at 32 and below)."""
    if BV > 64:
        return _launch(LAUNCH, "walk_bv128", x)
    return _launch(LAUNCH, "walk", x) if BV > 32 else _launch(LAUNCH, "walk_bv32", x)


def _walk_programs(x: torch.Tensor, B: int, H: int, K: int, V: int) -> int:
    BK, BV = _walk_blocks(x, B, H, K, V)
    return _cdiv(K, BK) * _cdiv(V, BV) * B * H


def _fwd_h_walk(k, v, gc, h, h_in, h_out, c0, c1):
    """The forward walk over chunks ``c0 .. c1 - 1`` into ``h [B, NT, H, K, V]``, from ``h_in``
    (None: zero) to ``h_out`` (None: not stored), both ``[B, H, K, V]`` float32, possibly one buffer."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    BK, BV = _walk_blocks(k, B, H, K, V)
    _fwd_h_kernel[(_cdiv(K, BK), _cdiv(V, BV), B * H)](
        k, v, gc, h, h_in, h_out, T, h.shape[1], c0, c1, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
        USE_H0=h_in is not None, STORE_HT=h_out is not None, DOT_PREC=_prec(k), **_walk_launch(k, BV))


def _walk_buffers(k, V, output_final_state):
    """``(h [B, NT, H, K, V] in the state dtype, ht [B, H, K, V] float32 | None)``, empty."""
    B, T, H, K = k.shape
    h = k.new_empty(B, _cdiv(T, BT), H, K, V, dtype=_state_dtype(k))
    return h, (k.new_empty(B, H, K, V, dtype=torch.float32) if output_final_state else None)


def fwd_h(k, v, gc, h0, output_final_state):
    """``(h, ht | None)`` from one walk over every chunk (the backward's recomputation)."""
    h, ht = _walk_buffers(k, v.shape[-1], output_final_state)
    _fwd_h_walk(k, v, gc, h, h0, ht, 0, h.shape[1])
    return h, ht


def _intra_a_lowp(dtype: torch.dtype) -> tuple[bool, bool]:
    """``_intra_a_kernel``'s ``(LOWP, LOWP_DIAG)`` for inputs of ``dtype`` (``INTRA_A_INPUT_DTYPE_DOTS``):
    16-bit dot operands off the diagonal blocks, and on them only in bf16 (float32's exponent range;
    their factors reach exp(SPAN_MAX), beyond float16's)."""
    return (INTRA_A_INPUT_DTYPE_DOTS and dtype != torch.float32,
            INTRA_A_INPUT_DTYPE_DOTS and dtype == torch.bfloat16)


def intra_a(q, k, gc, span, scale, paths, dtype=torch.float32):
    """The steep chunks' scores ``A: [B, T, H, BT]`` in ``dtype`` (other chunks' rows left
    unwritten); ``paths``: ``chunk_paths()``."""
    B, T, H, K = q.shape
    NT = _cdiv(T, BT)
    span_max, units = paths
    A = torch.empty(B, T, H, BT, dtype=dtype, device=q.device)
    lowp, lowp_diag = _intra_a_lowp(q.dtype)
    _intra_a_kernel[(_cdiv(NT * NC, units), B * H)](
        q, k, gc, span, A, scale, T, NT, H=H, K=K, BT=BT, BC=BC, NC=NC, BK=_pow2(K), BKD=min(_pow2(K), BKD),
        DOT_PREC=_prec(q), SPAN_MAX=SPAN_MAX, LOWP=lowp, LOWP_DIAG=lowp_diag, SPAN_MAX_CHUNK=span_max,
        UNITS=units, CHECK_FIRST=STEEP_CHECK_FIRST, **_launch(LAUNCH, "intra_a", q))
    return A


def _whole_chunk_lowp(dtype: torch.dtype) -> bool:
    """Whether the whole-chunk kernels' factored dots take operands in the activations' dtype:
    bf16 only (factors up to exp(SPAN_MAX_CHUNK), far beyond float16's range)."""
    return dtype == torch.bfloat16


def _fwd_o_kernels(q, k, v, gc, span, h, A, o, scale, paths, store_a, c0, c1):
    """The output of chunks ``c0 .. c1 - 1`` into ``o``; ``store_a``: the whole-chunk scores it
    forms written to ``A`` too."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK, BV = min(FWD_O_BK, _pow2(K)), min(128, _pow2(V))
    _fwd_o_kernel[(_cdiv(V, BV), c1 - c0, B * H)](
        q, k, v, gc, span, h, A, o, scale, T, h.shape[1], c0, H=H, K=K, V=V, BT=BT, BK=BK, BV=BV,
        DOT_PREC=_prec(q), SPAN_MAX_CHUNK=paths[0], LOWP=_whole_chunk_lowp(q.dtype), STORE_A=store_a,
        SKIP_UPPER=SKIP_UPPER_BLOCKS, **_launch(LAUNCH, "fwd_o", q))


def forward(q, k, v, gk, h0, scale, paths, output_final_state, keep_a):
    """``(o [B, T, H, V], h, ht | None, A, gc, span)``: the gate's chunk-local cumsum (``gc``, ``span``:
    ``chunk_cumsum``'s), the state walk, the steep chunks' scores (``intra_a``; ``A`` in v's dtype with
    ``keep_a``, where ``_fwd_o_kernel`` stores the other chunks' too, without their strictly upper
    ``[BC, BC]`` blocks under ``SKIP_UPPER_BLOCKS``) and the output. The walk runs
    in segments beside the output kernel when it has few programs (``overlap``), and then, with
    ``SEGMENTED_CUMSUM``, the cumsum of each segment's chunks as its "before"; else the cumsum is one
    launch before the walk."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    segments = _segments(NT, _walk_programs(k, B, H, K, V), k)
    per_segment = SEGMENTED_CUMSUM and len(segments) > 1
    gc, span = _cumsum_buffers(gk) if per_segment else chunk_cumsum(gk)
    h, ht = _walk_buffers(k, V, output_final_state)
    carry = None if len(segments) == 1 else k.new_empty(B, H, K, V, dtype=torch.float32)

    def walk(c0, c1, i):
        _fwd_h_walk(k, v, gc, h, h0 if i == 0 else carry, ht if i == len(segments) - 1 else carry, c0, c1)

    if len(segments) == 1:  # the walk launched first: host time before it is GPU idle time
        walk(0, NT, 0)
    o = torch.empty_like(v)
    A = None

    def scores():
        nonlocal A
        A = intra_a(q, k, gc, span, scale, paths, v.dtype if keep_a else torch.float32)

    def before(c0, c1):  # per segment: its chunks' gc; after the last, the scores (they read every gc)
        if per_segment:
            _cumsum_chunks(gk, gc, span, c0, c1)
            if c1 == NT:
                scores()

    if not per_segment:  # (with segments, before the walks: the first segment waits ~0.02 ms for it)
        scores()

    def output(c0, c1):
        _fwd_o_kernels(q, k, v, gc, span, h, A, o, scale, paths, keep_a, c0, c1)

    if len(segments) == 1:
        output(0, NT)
    else:  # every buffer the walks touch exists before the first one (``overlap.run``'s contract)
        _overlap.run(segments, before, walk, output, k)
    return o, h, ht, A, gc, span


def bwd(q, k, v, gc, span, A, h0, do, dht, scale, need_dh0, paths, h_kept=None, read_a=False):
    """``(dq, dk, dv, dgk float32, dh0 | None)``; ``A``: the steep chunks' scores (``intra_a``),
    every chunk's with ``read_a`` (``KEEP_A``), ``paths``: the forward's ``chunk_paths()``,
    ``h_kept``: the forward's chunk states, else recomputed. The reverse state walk runs in
    segments (from the last chunks) beside the per-chunk kernels after it when it has few programs
    (``overlap``); the steep chunks' kernels run after the last segment."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    NT = _cdiv(T, BT)
    prec = _prec(q)
    span_max, units = paths
    # (without KEEP_H this recomputing walk runs whole before the reverse walk's segments, both
    # at low occupancy at long sequences; they are independent and could overlap: not built)
    h = h_kept if h_kept is not None else fwd_h(k, v, gc, h0, False)[0]
    BKw, BVw = _walk_blocks(q, B, H, K, V)
    segments = _segments(NT, _walk_programs(q, B, H, K, V), q)[::-1]  # walk order: the last chunks first
    dh = q.new_empty(B, NT, H, K, V, dtype=_state_dtype(q))
    dh0 = q.new_empty(B, H, K, V, dtype=torch.float32) if need_dh0 else None
    carry = None if len(segments) == 1 else q.new_empty(B, H, K, V, dtype=torch.float32)

    def walk(c0, c1, i):
        d_in = dht if i == 0 else carry
        d_out = dh0 if i == len(segments) - 1 else carry
        _bwd_dh_kernel[(_cdiv(K, BKw), _cdiv(V, BVw), B * H)](
            q, do, gc, dh, d_in, d_out, scale, T, NT, c0, c1, H=H, K=K, V=V, BT=BT, BK=BKw, BV=BVw,
            USE_DHT=d_in is not None, STORE_DH0=d_out is not None, DOT_PREC=prec, **_walk_launch(q, BVw))

    dv_separate = BWD_DV_SEPARATE
    BKc = min(BWD_CHUNK_BK, _pow2(K))

    def per_chunk(c0, c1):
        if dv_separate:
            BVd = min(128, _pow2(V))
            _bwd_dv_kernel[(_cdiv(V, BVd), c1 - c0, B * H)](
                q, k, gc, span, A, do, dh, dv, scale, T, NT, c0, H=H, K=K, V=V, BT=BT, BK=min(64, _pow2(K)),
                BV=BVd, DOT_PREC=prec, SPAN_MAX_CHUNK=span_max, LOWP=_whole_chunk_lowp(q.dtype), READ_A=read_a,
                SKIP_UPPER=SKIP_UPPER_BLOCKS, **_launch(LAUNCH, "bwd_dv", q))
        _bwd_chunk_kernel[(_cdiv(K, BKc), c1 - c0, B * H)](
            q, k, v, gc, span, h, A, do, dh, dq, dk, dv, dg, scale, T, NT, c0, H=H, K=K, V=V, BT=BT, BK=BKc,
            BV=min(64, _pow2(V)), DOT_PREC=prec, SPAN_MAX_CHUNK=span_max, LOWP=_whole_chunk_lowp(q.dtype),
            WITH_DV=not dv_separate, READ_A=read_a, ONE_TOTAL=BWD_CHUNK_ONE_TOTAL, SKIP_UPPER=SKIP_UPPER_BLOCKS,
            **_launch(LAUNCH, "bwd_chunk", q))

    if len(segments) == 1:  # the walk launched before the other buffers are allocated
        walk(0, NT, 0)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dg = torch.empty(B, T, H, K, dtype=torch.float32, device=q.device)
    if len(segments) == 1:
        per_chunk(0, NT)
    else:  # every buffer exists before the first walk (``overlap.run``'s contract)
        _overlap.run(segments, lambda c0, c1: None, walk, per_chunk, q)
    P = torch.empty(B, NT * NC, H, K, dtype=torch.float32, device=q.device)  # chunk-wide gate terms
    BKf = min(BWD_SUB_BK, _pow2(K))
    _bwd_sub_kernel[(_cdiv(K, BKf), _cdiv(NT * NC, units), B * H)](
        q, k, v, gc, span, h, do, dh, dq, dk, dg, P, scale, T, NT, H=H, K=K, V=V, BT=BT, BC=BC, NC=NC,
        BK=BKf, BV=min(64, _pow2(V)), DOT_PREC=prec, SPAN_MAX=SPAN_MAX, SPAN_MAX_CHUNK=span_max, UNITS=units,
        CHECK_FIRST=STEEP_CHECK_FIRST, **_launch(LAUNCH, "bwd_sub", q))
    del h, dh
    BKr = min(64, _pow2(K))
    _rev_cumsum_kernel[(_cdiv(K, BKr), _cdiv(NT, units), B * H)](
        dg, P, span, T, NT, H=H, K=K, BT=BT, BK=BKr, NP=NC, SPAN_MAX_CHUNK=span_max, UNITS=units,
        CHECK_FIRST=STEEP_CHECK_FIRST, **_launch(LAUNCH, "rev_cumsum", q))
    return dq, dk, dv, dg, dh0


class ChunkGLASubchunk(torch.autograd.Function):
    """``(q, k, v, gk [B,T,H,K], scale, h0 [B,H,K,V] | None, final, keep_a)`` -> ``(o [B,T,H,V],
    final_state [B,H,K,V] float32 | None)``; requires ``K <= MAX_K``. ``keep_a``: keep every chunk's
    scores for the backward (``KEEP_A``, asked only when one will run: ``backward_will_run``)."""

    @staticmethod
    def forward(ctx, q, k, v, gk, scale, h0, output_final_state, keep_a):
        paths = chunk_paths()
        # keep_a: KEEP_A when a backward will run (the entry point's backward_will_run); without
        # WHOLE_CHUNK every chunk's A comes from intra_a
        keep_a = keep_a and WHOLE_CHUNK
        # kept A in v's dtype: both readers cast it to that for their dots (same bits as float32)
        o, h, ht, A, gc, span = forward(q, k, v, gk, h0, scale, paths, output_final_state, keep_a)
        # the chunk states are recomputed in backward unless KEEP_H ([B, T/64, H, K, V] per
        # layer); the steep chunks' scores are recomputed too (A is [B, T, H, 64] float32 whether
        # one chunk or all are steep), except with KEEP_A (every chunk's A, kept) or without
        # WHOLE_CHUNK (every chunk is steep).
        ctx.keep_h = KEEP_H  # as at forward time: the switches may change before backward
        ctx.paths = paths
        ctx.read_a = keep_a
        ctx.save_for_backward(q, k, v, gk, gc, span, h0, A if keep_a or not WHOLE_CHUNK else None,
                              *((h,) if KEEP_H else ()))
        ctx.scale = scale
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, gk, gc, span, h0, A, *kept = ctx.saved_tensors
        do = do.contiguous()
        if dht is not None:
            dht = dht.contiguous()
        need_dh0 = h0 is not None and ctx.needs_input_grad[5]
        try:
            if A is None:
                A = intra_a(q, k, gc, span, ctx.scale, ctx.paths)
            dq, dk, dv, dg, dh0 = bwd(q, k, v, gc, span, A, h0, do, dht, ctx.scale, need_dh0, ctx.paths,
                                      kept[0] if ctx.keep_h else None, read_a=ctx.read_a)
        except KernelDoesNotFit as exc:
            from blocks.ops.gla import chunk as torch_form

            def reference(q, k, v, gk, h0):
                with disabled():
                    return torch_form(q, k, v, gk, ctx.scale, h0, dht is not None, BT)

            dq, dk, dv, dg, dh0 = reference_gradients(exc, "gla", reference, (q, k, v, gk, h0),
                                                      (*ctx.needs_input_grad[:4], need_dh0), do, dht)
            return dq, dk, dv, dg, None, dh0, None, None
        return dq, dk, dv, dg.to(gk.dtype), None, dh0, None, None


@register_kernel("gla", "chunk")
@torch.compiler.disable  # torch.compile graphs break here and run the kernels as they are
@falls_back_to("gla")
def gla_chunk(q, k, v, gk, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
    """Triton ``blocks.ops.gla.chunk`` (``chunk_size`` is the PyTorch form's; see ``BT``). Head
    dims above ``MAX_K`` are cut into key slices: the output is a sum over key channels and the
    state rows are independent."""
    check_qkv(q, k, v)
    check_gate("gk", gk, q.shape)
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else float(scale)
    if initial_state is not None:
        if tuple(initial_state.shape) != (B, H, K, V):
            raise ValueError(f"initial_state: must have shape {(B, H, K, V)}, got {tuple(initial_state.shape)}")
        initial_state = initial_state.float().contiguous()
    q, k, v, gk = q.contiguous(), k.contiguous(), v.contiguous(), gk.contiguous()
    if T * H * max(K, V, BT) >= 2 ** 31:  # per-sequence offsets are int32 in the kernels
        from blocks.ops.gla import chunk as torch_chunk

        with disabled():
            return torch_chunk(q, k, v, gk, scale, initial_state, output_final_state, chunk_size)
    keep_a = KEEP_A and backward_will_run(q, k, v, gk, initial_state)
    if K <= MAX_K:
        return ChunkGLASubchunk.apply(q, k, v, gk, scale, initial_state, output_final_state, keep_a)
    o, states = None, []
    for s in range(0, K, MAX_K):
        sl = slice(s, min(K, s + MAX_K))
        h0 = None if initial_state is None else initial_state[:, :, sl].contiguous()
        o_s, ht_s = ChunkGLASubchunk.apply(q[..., sl].contiguous(), k[..., sl].contiguous(), v,
                                           gk[..., sl].contiguous(), scale, h0, output_final_state, keep_a)
        o = o_s if o is None else o + o_s
        states.append(ht_s)
    return o, (torch.cat(states, dim=2) if output_final_state else None)
