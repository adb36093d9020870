"""One Triton kernel for a linear block's whole decode step between its two projections
(``deltanet``, ``gated_deltanet``, ``simple_gla``).

A decode step of such a layer runs, between the input projection and the output projection, the
short conv and its cache update, SiLU, the delta rules' L2 norms of q and k, the gates
(``beta = sigmoid(b)``; ``g = -exp(A_log) softplus(a + dt_bias)``, Mamba-2's decay of
gated_deltanet and simple_gla), the state update (``blocks.kernels.step``), the head norm and the
output gate: under ``torch.compile`` about eight kernels per gated_deltanet layer and step (the
2026-12-01 05:27 profile of the compiled 24-layer graph: ~20 kernels per layer, 0.42 ms of its
2.36 ms between kernels). Here they are one, one program per (batch, head) with the head's
``[K, V]`` float32 state in registers, whole or in slices of value columns (``CHUNKS``):

    x_c   = silu(sum_t w[c, t] * [cache | proj][t, c])          c: the head's q, k, v channels
    q, k  = l2norm(x_q), l2norm(x_k);  v = x_v                   (delta rules; else q, k = x_q, x_k)
    S     = exp(g) S;  S += k (beta (v - S^T k))^T;  o = scale S^T q      (simple_gla: S += k v^T)
    o     = rmsnorm(o) * w_norm * silu(gate)                     (as the block's options say)

The intermediate roundings follow the block's own path (``LinearBlock.forward``): every value the
block holds in the activation dtype (conv output, q, k, v, o) is rounded to it here too. The conv
cache and the state are updated in place inside ``blocks.kernels.inplace_decode_state()`` (each
program owns its head's channels and state), else written to new tensors.

On by default (``ENABLED``; off, the block keeps its own path, which ``decode_graph`` compiles).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import register_kernel
from .step import state_buffers
from .tiles import gdc_launch_dependents as _gdc_launch_dependents, gdc_wait as _gdc_wait
from .tiles import INTERPRET as _INTERPRET, pdl_launch, pow2

# Timed (H200, 2026-12-01 10:24, ``benchmarks/gpu_kernels.py --decode-mixers off,on``,
# docs/benchmarks/decode_mixer_pdl.md): the compiled 24-layer decode step at batch 16 went from 460
# to 244 kernels and 2.014 to 1.822 ms (gated_deltanet), 316 to 244 kernels and 1.882 to 1.703 ms
# (simple_gla). The kernel takes 11.9 / 10.0 us per layer against the step kernel's 10.2 / 9.5.
ENABLED = True
# One program per (batch, head) holds the head's [128, 128] float32 state: sm_90 compiles of the
# gated_deltanet kernel at K = V = 128 take 207 / 176 / 106 registers at 4 / 8 / 16 warps, no spills
# (``benchmarks/kernels_aot_regs.py --kernels decode_mixer --warps 4,8,16``), so 4 warps fit two
# programs per multiprocessor (256 programs at batch 16, 16 heads: one wave on 132). 8 warps lost
# (H200, 2026-12-01 11:43: gated_deltanet x24 1.398 -> 1.719 ms, docs/benchmarks/decode_pdl_sets.md).
NUM_WARPS = 4
# The head's value columns in slices, one after another in the program, the next slice's state
# load issued before this one's update is stored, so that reading and writing the state overlap
# (each column of S updates on its own: S[:, j] needs only k, q, beta, the decay and v[j]); the
# head norm then re-reads the row it stored. ``CHUNKS`` for the delta rules, ``PLAIN_CHUNKS`` for
# simple_gla (``S += k v^T``); 1: the whole [K, V] state at once. Timed (H200, 2026-12-01 11:53,
# compiled fused-layer graphs of 24 layers at batch 16, docs/benchmarks/decode_pdl_sets.md): the
# simple_gla kernel 10.73 -> 9.62 / 9.46 us at 2 / 4 slices (graph 1.423 -> 1.385 / 1.386 ms); the
# gated_deltanet kernel 12.18 -> 11.63 / 12.42 us, its graph 1.391 -> 1.498 / 1.487 ms: one slice then.
# Timed again with today's layers (2026-12-02 18:04, docs/benchmarks/decode_sets_1202_1804.md): the
# gated_deltanet x24 graph 1.379 -> 1.368 ms at 2 slices (every pass below every pass of one
# slice), 1.393 at 4: two slices since. A second call (18:10, decode_chunks_1202.md) on a host
# that ran in two modes: -0.9% in the faster one, a tie of medians.
# Lost: the value columns split over 4 programs per head, the kernel launched early with PDL to
# read its state under the input projection, its first instruction ``gdc_launch_dependents``, the
# state loads two slices ahead. history: docs/benchmarks/kernel_decisions/decode_mixer.md#lost
CHUNKS = 2
PLAIN_CHUNKS = 4
# Where the kernel lets the next one (o_proj's GEMM, launched with PDL) launch: "exit" (at the
# kernel's end, as without the instruction), "start" (its first instruction), "loads" (once its
# state loads and the q, k channels are issued), "stores" (after its last state store, before the
# head norm's re-read and the output gate): o_proj then starts, and pulls its first weight tiles
# into L2, under the mixer's tail. The GEMM reads the mixer's output only after ``gdc_wait``, i.e.
# after this kernel has finished, wherever this is. And the kernel itself launched with PDL under
# the input projection (which lets dependents launch first thing), its first instruction
# ``gdc_wait`` (``PDL_WAIT_FIRST``): its programs are resident when the GEMM ends instead of
# launching then; no load before the wait (the state read early lost, see the history).
# Timed (H200, 2026-12-02 19:56 / 20:02, compiled x24 graphs, ``--compiled-sets`` round-robin,
# docs/benchmarks/decode_sets_1202_2002.md): "stores" alone -0.5 / -0.4% (gated_deltanet /
# simple_gla, 5 of 6 passes below the base's), "loads" +2.0 / +2.4%, "start" +1.9 / +1.9%; with
# PDL_WAIT_FIRST 1.389 -> 1.372 ms and 1.338 -> 1.310 (5 of 6 passes below the base pass beside it,
# a host that moved between two modes ~4% apart); both against neither on a steady host (20:06,
# decode_sets_1202_2006.md): 1.394 -> 1.372 / 1.338 -> 1.317, every pass below every pass.
LAUNCH_DEPENDENTS = "stores"
_TRIGGERS = {"exit": 0, "start": 1, "loads": 2, "stores": 3}
PDL_WAIT_FIRST = True
# With ``PDL_WAIT_FIRST``, the state's first slice (``CHUNKS`` / ``PLAIN_CHUNKS``) loaded before
# ``gdc_wait`` instead of after it: the programs are resident under the input projection anyway, so
# the state read overlaps the GEMM instead of starting after it. The state is not the kernel
# before's output: its last writer is this layer's mixer one decode step earlier, and between the
# two steps lies a kernel launched without PDL (``mixer_step``'s docstring: the ordering it needs).
# Timed (H200 2026-12-03, docs/benchmarks/decode_sets_1203.md): at 04:58 the mixer's share of the
# step's path fell 11.8 -> 9.7 us per gated_deltanet layer (8.3 with the whole state early, CHUNKS=1)
# while the input projection's rose 10.1 -> 12.4 (whole state); at 06:10 (5 round-robin passes, steady host) the x24 graphs with it and ``skinny.SWAP_AB``
# gated_deltanet 1.327 -> 1.309 ms (alone 1.315), simple_gla 1.275 -> 1.273 (a tie).
STATE_BEFORE_WAIT = True
# The delta rules' output from the state as loaded, not from the updated one: with
# ``S_d = exp(g) S`` and ``u = beta (v - S_d^T k)``, ``o = S_new^T q = exp(g) S^T q + (k.q) u``, so
# ``S^T k`` and ``S^T q`` come out of one two-operand reduction over the loaded slice (one
# shared-memory round trip across the warps; sm_90: 28 -> 25 barriers, 1024 -> 2048 B of shared
# memory at CHUNKS 2) and the updated slice only goes to its store, in place of two reductions one
# after the other (``S^T k``, then ``S_new^T q``). The same sums in another order (float32 rounding).
# Timed (H200 2026-12-04 03:27, compiled x24 graphs, 5 round-robin passes,
# docs/benchmarks/decode_sets_1204_old_state.md): gated_deltanet 1.294 -> 1.286 ms, the mixer on the
# step's path 9.88 -> 9.11 us per layer; with CHUNKS 4 1.343. simple_gla's form (``o = exp(g) S^T q
# + (k.q) v``) lost, 1.258 -> 1.279 ms (8.17 -> 9.31 us): it has one reduction either way, so it
# keeps the updated state's.
OLD_STATE_OUTPUT = True
# The conv cache's shift (each channel's rows moved up one, the new input last) written after the
# state's update and the output instead of inside each ``_conv_silu``: there, in place, every call
# (q, k and each value slice: 2 + CHUNKS) needs a barrier between all threads' reads of the old rows
# and the first overwrite, on the way from the loads to the state update. Last, the rows are read
# again (a head's 2K+V channels, W-1 rows: ~2.3 KB at K = V = 128, W = 4, from L2) and stored after
# one barrier, beside o_proj's start (``LAUNCH_DEPENDENTS`` "stores" comes before). sm_90, gated_deltanet at
# CHUNKS 2: 236 -> 209 registers, 25 -> 24 barriers, 1736 -> 1784 SASS instructions. H200 2026-12-04
# 05:55 (compiled x24 graphs, 5 round-robin passes, docs/benchmarks/decode_sets_1204_cache_shift.md):
# gated_deltanet 1.278 -> 1.274 ms, simple_gla 1.250 -> 1.247 (a tie within the passes' spread; kept for
# the registers and the barrier off the state's path); the decode GPU tests with it on: 64 passed.
CACHE_SHIFT_LAST = True
SWITCHES = {"CHUNKS": (1, 2, 4), "PLAIN_CHUNKS": (1, 2, 4), "LAUNCH_DEPENDENTS": tuple(_TRIGGERS),
            "PDL_WAIT_FIRST": (False, True), "STATE_BEFORE_WAIT": (False, True), "OLD_STATE_OUTPUT": (False, True),
            "CACHE_SHIFT_LAST": (False, True)}


@triton.jit
def _conv_silu(proj, cache, new_cache, conv_w, i_b, c0, o_c, m_c, sp_b, C, W: tl.constexpr,
               DTYPE: tl.constexpr, WRITE_CACHE: tl.constexpr):
    """``silu(conv)`` of channels ``c0 + o_c`` (``[BC]`` float32, rounded to ``DTYPE`` as the block
    holds it) and, with ``WRITE_CACHE``, the shifted cache rows of these channels into ``new_cache``
    (``ShortConv``: rows ``t < W-1`` of the window are the cache, row ``W-1`` the new input, tap
    ``t`` weighs row ``t``; W in 2..4). ``W == 0``: no conv, the projection itself."""
    c = c0 + o_c
    x_new = tl.load(proj + i_b * sp_b + c, mask=m_c, other=0.)
    if W == 0:
        return x_new.to(tl.float32)
    p_row = cache + i_b * (W - 1) * C + c
    y = x_new.to(tl.float32) * tl.load(conv_w + c * W + W - 1, mask=m_c, other=0.).to(DTYPE).to(tl.float32)
    x_0 = tl.load(p_row, mask=m_c, other=0.)
    y += x_0.to(tl.float32) * tl.load(conv_w + c * W, mask=m_c, other=0.).to(DTYPE).to(tl.float32)
    x_1 = x_new  # (rows W does not have: never stored, as in ``_cache_rows``)
    x_2 = x_new
    if W >= 3:
        x_1 = tl.load(p_row + C, mask=m_c, other=0.)
        y += x_1.to(tl.float32) * tl.load(conv_w + c * W + 1, mask=m_c, other=0.).to(DTYPE).to(tl.float32)
    if W >= 4:
        x_2 = tl.load(p_row + 2 * C, mask=m_c, other=0.)
        y += x_2.to(tl.float32) * tl.load(conv_w + c * W + 2, mask=m_c, other=0.).to(DTYPE).to(tl.float32)
    if WRITE_CACHE:
        tl.debug_barrier()  # every thread has read the old rows before any is overwritten (in place)
        _store_shifted(new_cache, i_b, c0, o_c, m_c, C, W, x_1, x_2, x_new)
    y = y.to(DTYPE).to(tl.float32)  # the conv's output in the activation dtype, then SiLU
    return (y * tl.sigmoid(y)).to(DTYPE).to(tl.float32)


@triton.jit
def _cache_rows(proj, cache, i_b, c0, o_c, m_c, sp_b, C, W: tl.constexpr):
    """What ``_conv_silu``'s cache write stores for channels ``c0 + o_c``, read again: the old rows
    1 and 2 (where W has them; else the new input in their place, never stored) and the new input."""
    c = c0 + o_c
    x_new = tl.load(proj + i_b * sp_b + c, mask=m_c, other=0.)
    x_1 = x_new
    x_2 = x_new
    if W >= 3:
        x_1 = tl.load(cache + i_b * (W - 1) * C + C + c, mask=m_c, other=0.)
    if W >= 4:
        x_2 = tl.load(cache + i_b * (W - 1) * C + 2 * C + c, mask=m_c, other=0.)
    return x_1, x_2, x_new


@triton.jit
def _store_shifted(new_cache, i_b, c0, o_c, m_c, C, W: tl.constexpr, x_1, x_2, x_new):
    """The conv cache's shift for channels ``c0 + o_c``: rows 1 .. W-2 of the old cache (``x_1``,
    ``x_2``) and the new input into ``new_cache``'s rows 0 .. W-2; from ``_conv_silu``'s loads
    (``CACHE_SHIFT_LAST`` off) or ``_cache_rows``' (on)."""
    p_new = new_cache + i_b * (W - 1) * C + c0 + o_c
    if W == 2:
        tl.store(p_new, x_new, mask=m_c)
    if W == 3:
        tl.store(p_new, x_1, mask=m_c)
        tl.store(p_new + C, x_new, mask=m_c)
    if W == 4:
        tl.store(p_new, x_1, mask=m_c)
        tl.store(p_new + C, x_2, mask=m_c)
        tl.store(p_new + 2 * C, x_new, mask=m_c)


@triton.jit
def _l2norm(x, DTYPE: tl.constexpr):
    """``blocks.ops.utils.l2norm`` of a ``[BK]`` float32 vector, rounded to ``DTYPE``."""
    return (x * tl.rsqrt(tl.sum(x * x, 0) + 1e-6)).to(DTYPE).to(tl.float32)


@triton.jit
def _add_pair(a0, b0, a1, b1):
    """``tl.reduce``'s combine for two sums at once."""
    return a0 + a1, b0 + b1


@triton.jit
def _mixer_kernel(proj, sp_b, cache, new_cache, conv_w, a, sa_b, bl, sb_b, A_log, dt_bias,
                  s_in, s_out, gate, sg_b, norm_w, eps, o, scale, H, C,
                  K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NC: tl.constexpr,
                  TRIGGER: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr, W: tl.constexpr,
                  DELTA: tl.constexpr, OLD_O: tl.constexpr, LATE_CACHE: tl.constexpr,
                  GATED: tl.constexpr, NORM: tl.constexpr,
                  OUT_GATE: tl.constexpr, WRITE_CACHE: tl.constexpr, DTYPE: tl.constexpr):
    """Grid (B*H,): one head. ``proj: [B, C]`` the q|k|v columns of the input projection (row
    stride ``sp_b``; C = H*(2K+V)); ``cache``/``new_cache: [B, W-1, C]``; ``conv_w: [C, W]``;
    ``DELTA``: the delta rule with L2-normed q, k (else ``S += k v^T``); ``GATED``: Mamba-2's decay.
    ``a``, ``bl``: the decay and beta logits ``[B, H]`` (row strides ``sa_b``, ``sb_b``, column
    slices of the projection); ``A_log, dt_bias: [H]``; state ``[B, H, K, V]`` float32; ``gate``:
    the output gate's pre-activation ``[B, H*V]`` (stride ``sg_b``); ``norm_w: [V]``;
    ``o: [B, H*V]``. The value columns go in ``NC`` slices of ``BV // NC`` (``CHUNKS``); with more
    than one and a norm, each slice's output is stored before the norm and the row re-read.
    ``TRIGGER`` (``LAUNCH_DEPENDENTS``): 0 none, else where ``gdc_launch_dependents`` goes (1 first,
    2 after the first state load and q, k, 3 after the last state store); ``PDL``
    (``PDL_WAIT_FIRST``): launched with PDL, ``gdc_wait`` before anything else but, with ``EARLY``
    (``STATE_BEFORE_WAIT``), the state's first slice; ``OLD_O`` (``OLD_STATE_OUTPUT``, with
    ``DELTA`` only): the output from the loaded slice, ``decay S^T q + (k.q) u``; ``LATE_CACHE``
    (``CACHE_SHIFT_LAST``): the conv cache written at the end, after one barrier."""
    EARLY_CACHE: tl.constexpr = WRITE_CACHE and not LATE_CACHE
    BC: tl.constexpr = BV // NC
    if TRIGGER == 1:
        _gdc_launch_dependents()
    i_bh = tl.program_id(0).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_c = tl.arange(0, BC)
    m_k = o_k < K
    p_s = i_bh * K * V + o_k[:, None] * V + o_c[None, :]
    m_s0 = m_k[:, None] & (o_c < V)[None, :]  # the first slice
    if EARLY:
        b_next = tl.load(s_in + p_s, mask=m_s0, other=0.)
    if PDL:  # launched early (PDL_WAIT_FIRST): every input but the state is the kernels before's output
        _gdc_wait()
    if not EARLY:
        b_next = tl.load(s_in + p_s, mask=m_s0, other=0.)
    i_b = i_bh // H
    i_h = i_bh % H
    b_q = _conv_silu(proj, cache, new_cache, conv_w, i_b, i_h * K, o_k, m_k, sp_b, C, W, DTYPE, EARLY_CACHE)
    b_k = _conv_silu(proj, cache, new_cache, conv_w, i_b, (H + i_h) * K, o_k, m_k, sp_b, C, W, DTYPE, EARLY_CACHE)
    if DELTA:
        b_q = _l2norm(b_q, DTYPE)
        b_k = _l2norm(b_k, DTYPE)
    b_q = b_q * scale
    if OLD_O:
        kq = tl.sum(b_k * b_q, 0)
    decay = 1.
    if GATED:
        x = tl.load(a + i_b * sa_b + i_h).to(tl.float32) + tl.load(dt_bias + i_h).to(tl.float32)
        softplus = tl.where(x > 20., x, tl.log(1. + tl.exp(tl.minimum(x, 20.))))  # F.softplus's threshold
        decay = tl.exp(-tl.exp(tl.load(A_log + i_h).to(tl.float32)) * softplus)
    beta = 1.
    if DELTA:
        beta = tl.sigmoid(tl.load(bl + i_b * sb_b + i_h).to(tl.float32))
    if TRIGGER == 2:
        _gdc_launch_dependents()
    sum_sq = 0.
    for j in tl.static_range(NC):
        b_s = b_next
        o_v = j * BC + o_c
        m_v = o_v < V
        m_kv = m_k[:, None] & m_v[None, :]
        if j + 1 < NC:  # issued before this slice's store: the two overlap
            b_next = tl.load(s_in + p_s + (j + 1) * BC, mask=m_k[:, None] & (o_v + BC < V)[None, :], other=0.)
        b_v = _conv_silu(proj, cache, new_cache, conv_w, i_b, 2 * H * K + i_h * V + j * BC, o_c, m_v, sp_b, C, W,
                         DTYPE, EARLY_CACHE)
        if OLD_O:  # delta rules only
            b_sk, b_sq = tl.reduce((b_s * b_k[:, None], b_s * b_q[:, None]), 0, _add_pair)
            b_v = (b_v - b_sk * decay) * beta
            b_s = b_s * decay + b_k[:, None] * b_v[None, :]
            tl.store(s_out + p_s + j * BC, b_s, mask=m_kv)
            b_o = b_sq * decay + kq * b_v
        else:
            if GATED:
                b_s = b_s * decay
            if DELTA:
                b_v = (b_v - tl.sum(b_s * b_k[:, None], axis=0)) * beta
            b_s = b_s + b_k[:, None] * b_v[None, :]
            tl.store(s_out + p_s + j * BC, b_s, mask=m_kv)
            b_o = tl.sum(b_s * b_q[:, None], axis=0)
        b_o = tl.where(m_v, b_o.to(DTYPE).to(tl.float32), 0.)  # the op's output dtype
        if NC == 1 or not NORM:
            _finish_row(b_o, o_v, m_v, tl.sum(b_o * b_o, 0), norm_w, gate, sg_b, o, eps, i_b, i_h, H, V,
                        NORM, OUT_GATE, DTYPE)
        else:  # the norm needs the whole row: store the slice as it is, finish below
            tl.store(o + i_b * H * V + i_h * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
            sum_sq += tl.sum(b_o * b_o, 0)
    if TRIGGER == 3:
        _gdc_launch_dependents()
    if NC > 1 and NORM:
        tl.debug_barrier()  # every thread's slice stores before the row is re-read (same CTA: visible)
        o_f = tl.arange(0, BV)
        m_f = o_f < V
        b_f = tl.load(o + i_b * H * V + i_h * V + o_f, mask=m_f, other=0.).to(tl.float32)
        _finish_row(b_f, o_f, m_f, sum_sq, norm_w, gate, sg_b, o, eps, i_b, i_h, H, V, NORM, OUT_GATE, DTYPE)
    if WRITE_CACHE and LATE_CACHE:
        o_a = tl.arange(0, BV)
        m_a = o_a < V
        q_1, q_2, q_n = _cache_rows(proj, cache, i_b, i_h * K, o_k, m_k, sp_b, C, W)
        k_1, k_2, k_n = _cache_rows(proj, cache, i_b, (H + i_h) * K, o_k, m_k, sp_b, C, W)
        v_1, v_2, v_n = _cache_rows(proj, cache, i_b, 2 * H * K + i_h * V, o_a, m_a, sp_b, C, W)
        tl.debug_barrier()  # every thread has read the old rows before any is overwritten (in place)
        _store_shifted(new_cache, i_b, i_h * K, o_k, m_k, C, W, q_1, q_2, q_n)
        _store_shifted(new_cache, i_b, (H + i_h) * K, o_k, m_k, C, W, k_1, k_2, k_n)
        _store_shifted(new_cache, i_b, 2 * H * K + i_h * V, o_a, m_a, C, W, v_1, v_2, v_n)


@triton.jit
def _finish_row(b_o, o_v, m_v, sum_sq, norm_w, gate, sg_b, o, eps, i_b, i_h, H, V: tl.constexpr,
                NORM: tl.constexpr, OUT_GATE: tl.constexpr, DTYPE: tl.constexpr):
    """Columns ``o_v`` of the head's output: ``b_o`` (float32, zero where ``m_v`` is off) through
    the head norm (``sum_sq``: the whole row's sum of squares) and the SiLU output gate, stored."""
    if NORM:
        b_o = b_o * tl.rsqrt(sum_sq / V + eps) * tl.load(norm_w + o_v, mask=m_v, other=0.).to(tl.float32)
        b_o = b_o.to(DTYPE).to(tl.float32)
    if OUT_GATE:
        b_g = tl.load(gate + i_b * sg_b + i_h * V + o_v, mask=m_v, other=0.).to(tl.float32)
        b_g = (b_g * tl.sigmoid(b_g)).to(DTYPE).to(tl.float32)
        b_o = b_o * b_g
    tl.store(o + i_b * H * V + i_h * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """``x`` (rows read through their stride), copied only if its last dim is not contiguous."""
    return x if x.stride(-1) == 1 else x.contiguous()


# the blocks this kernel serves, by registered name -> (delta rule, the side projection of their
# Mamba-2 decay). By block, not by op: retnet runs the simple_gla op with a fixed decay.
KINDS = {"deltanet": (True, None), "gated_deltanet": (True, "a"), "simple_gla": (False, "dt")}


def _kind(block) -> tuple[bool, str | None] | None:
    return KINDS.get(block.name)


@register_kernel("mixer", "decode")
@torch.compiler.disable  # compiled callers break here, as at blocks.kernels.step.fused_step
def mixer_step(block, proj: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    """The decode step of a ``deltanet`` / ``gated_deltanet`` / ``simple_gla`` block between its
    projections.

    ``proj``: the block's ``InputProjection`` output for one position (``[B, 1, width]`` views);
    ``state``: its decode state (``S: [B, H, K, V]`` float32, ``conv: [B, W-1, C]``). Returns
    ``(o: [B, 1, H*V]`` ready for ``o_proj``, ``new_state)``, in place inside
    ``inplace_decode_state()`` when the state tensors allow it.

    Ordering (``STATE_BEFORE_WAIT``): on sm_90 the kernel may start while the kernel before it runs
    (when that one is a ``skinny`` GEMM) and reads ``S`` before waiting for it, so ``S`` must not be
    written by a kernel that may still be running: between ``S``'s last writer (this layer's
    previous step) and this call, some kernel launched without PDL (any PyTorch op; in
    ``GraphDecoder`` the position update and the LM head) must lie in the stream, since it starts
    only after every kernel before it has finished."""
    H, K, V = block.num_heads, block.head_dim_k, block.head_dim_v
    qkv = _unit_last(proj["qkv"][:, 0])  # [B, C]
    B, C = qkv.shape
    dtype = qkv.dtype
    W = block.conv.size if block.conv is not None else 0
    S = state["S"]
    if tuple(S.shape) != (B, H, K, V):
        raise ValueError(f"state S: must have shape {(B, H, K, V)}, got {tuple(S.shape)}")
    if W and tuple(state["conv"].shape) != (B, W - 1, C):
        raise ValueError(f"state conv: must have shape {(B, W - 1, C)}, got {tuple(state['conv'].shape)}")
    s_in, s_out = state_buffers(S)
    new_state = {"S": s_out}
    cache = new_cache = conv_w = qkv  # placeholders, never read without a conv
    if W:
        cache, new_cache = state_buffers(state["conv"], dtype)
        new_state["conv"] = new_cache
        conv_w = block.conv.weight.reshape(C, W)
    delta, decay = _kind(block)
    # [B, H] column slices of the projection, read in place (placeholders where the kind has none)
    beta_logit = _unit_last(proj["beta"][:, 0]) if delta else qkv
    a = _unit_last(proj[decay][:, 0]) if decay else qkv
    gate = _unit_last(proj["gate"][:, 0]) if block.gate is not None else qkv
    o = qkv.new_empty(B, H * V)
    norm_w = block.norm.weight if block.norm is not None else block.o_proj.weight
    _mixer_kernel[(B * H,)](
        qkv, qkv.stride(0), cache, new_cache, conv_w, a, a.stride(0), beta_logit, beta_logit.stride(0),
        block.A_log if decay else s_in, block.dt_bias if decay else s_in, s_in, s_out, gate, gate.stride(0),
        norm_w, block.norm.eps if block.norm is not None else 0.0, o, K ** -0.5, H, C,
        K=K, V=V, BK=pow2(K), BV=pow2(V), NC=_slices(V, delta), TRIGGER=_trigger(qkv.device),
        EARLY=_state_before_wait(), W=W, DELTA=delta, OLD_O=_old_state_output(delta),
        LATE_CACHE=CACHE_SHIFT_LAST,
        GATED=decay is not None, NORM=block.norm is not None, OUT_GATE=block.gate is not None, WRITE_CACHE=W > 0,
        DTYPE=_DTYPES[dtype], num_warps=1 if _INTERPRET else NUM_WARPS, **pdl_launch(PDL_WAIT_FIRST, qkv.device))
    return o[:, None], new_state


def _state_before_wait() -> bool:
    """The kernel's ``EARLY``: ``STATE_BEFORE_WAIT``, which only means something with ``PDL_WAIT_FIRST``."""
    return STATE_BEFORE_WAIT and PDL_WAIT_FIRST


def _old_state_output(delta: bool) -> bool:
    """The kernel's ``OLD_O``: ``OLD_STATE_OUTPUT``, which the delta rules alone take (simple_gla's
    form of it lost)."""
    return OLD_STATE_OUTPUT and delta


def _trigger(device: torch.device) -> int:
    """``LAUNCH_DEPENDENTS`` as the kernel's ``TRIGGER``: 0 where there is no grid dependency
    control (the interpreter, GPUs before sm_90)."""
    if LAUNCH_DEPENDENTS not in _TRIGGERS:
        raise ValueError(f"decode_mixer.LAUNCH_DEPENDENTS: one of {', '.join(_TRIGGERS)}, got {LAUNCH_DEPENDENTS!r}")
    return _TRIGGERS[LAUNCH_DEPENDENTS] if pdl_launch(True, device)["PDL"] else 0


def _slices(V: int, delta: bool) -> int:
    """Value-column slices of a head: ``CHUNKS`` (delta rules) or ``PLAIN_CHUNKS``, at most one per
    16 columns of V's power of two."""
    return max(1, min(CHUNKS if delta else PLAIN_CHUNKS, pow2(V) // 16))


def applies(block, x: torch.Tensor) -> bool:
    """Whether ``mixer_step`` runs ``block``'s decode step for the input ``x``: switched on, one of
    ``KINDS``, the block's chunk mode, a SiLU output gate (if any), head dims up to 128 (one
    program holds a head's whole state), a known dtype. (It has no backward: ``cuda_kernel`` does
    not offer it while a gradient is needed.)"""
    return (ENABLED and _kind(block) is not None and block.config.mode == "chunk"
            and (block.gate is None or block.gate.act_name == "silu")
            and block.head_dim_k <= 128 and block.head_dim_v <= 128 and x.dtype in _DTYPES)


mixer_step.applies = applies
