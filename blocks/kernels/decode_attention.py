"""A softmax layer's whole decode step between its projections as one Triton kernel: rotary of the
new query and key, the key and value written into the static KV cache, attention over the cache
and the output gate (``archsearch.decode_graph._SoftmaxCache.attend``).

Inside the captured decode graph the step was, before this kernel, ``blocks.kernels.rope_cache``'s
kernel, SDPA (cuDNN) with the cache's ``[cap]`` bool mask, which PyTorch turns into an additive
float mask at every call (two fills and an elementwise kernel per layer), and the gate's kernels.
Here it is one launch (two when the cache is split), and it reads only the slots written so far:
SDPA read the whole capacity.

    q', k'         = rotary(q, pos), rotary(k, pos)                  [B, H, D], [B, Hkv, D]
    k_cache[:, s]  = k',  v_cache[:, s] = v,  valid[s] = True        s = pos % cap
    o[b, h]        = softmax(q'[b, h] . K^T / sqrt(D)) V             K, V: the kv head h // (H / Hkv)'s
                                                                     written slots (``valid``) and
                                                                     this token
    o             *= sigmoid(gate)                                   (with an output gate)

Grid ``(B * Hkv, SPLITS)``: program ``(b, j, s)`` takes the ``G = H / Hkv`` query heads of key/value
head ``j`` as the rows of ``[16, D]`` tiles (tensor-core dots; the rows past G are padding) over
its share ``s`` of the slots below ``min(pos + 1, cap)``, with the online softmax of
FlashAttention. No slot at or past ``min(pos + 1, cap)`` is marked written (the decoder writes slot
``pos % cap`` at position ``pos``; ``load`` and ``fill`` mark the slots of positions below ``pos``,
``load`` refusing a cache that leaves one out), so reading below that bound (and, with
``ATTEND_MASK`` "flags", masking by ``valid``) is the attention SDPA computed over the mask. The new token
enters from registers (split 0 starts its softmax with it and writes the cache), the slot it
overwrites is masked out, so no program reads what another writes. With one split the program
normalises, gates and stores; with more, each stores its running max, sum and ``[G, D]``
accumulator in float32 and ``_combine_kernel`` merges them per head.

Rotary as ``blocks.common.rotary`` (float32 angles ``pos * inv_freq``, rounded to the activations'
dtype); scores and the accumulator in float32, the probabilities rounded to the activations' dtype
for the second dot (as FlashAttention does); the output rounded once (the PyTorch path rounds
SDPA's output, then the gate's product).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import register_kernel
from .fitted import jit as _jit
from .rope_cache import check_cache_args, check_projection_dtypes, projection_rows, rotated
from .tiles import cdiv, dot_prec, launch, pow2, sm_count, warps

# Slots per loop step, launch settings and how many programs to aim for per SM (the cache is split
# over SPLITS programs per key/value head while B * Hkv programs would fill fewer). Timed in the
# 3:1 hybrid's decode graph (H200, 2026-12-01 15:36-15:41, 24 layers, batch 16, B * Hkv = 256
# programs; docs/benchmarks/decode_attention.md): 8 warps against 4 1.545 / 2.083 / 4.193 ms
# against 1.547 / 2.090 / 4.205 at 1k / 4k / 16k context; lost: 2 programs per SM (one split
# more and the combine kernel: 1.691 against 1.594 ms at 1k), 128 slots per step (1.641), 2 or 4
# stages (1.571 / 1.554 against 1.547); and launching the kernel early with programmatic
# dependent launch, its first 0-4 blocks of keys and values pulled into L2 before waiting for the
# input projection: 1.559-1.594 against 1.553 ms at 1k, 4.817-4.915 against 4.177 at 16k (its
# programs hold the SMs the GEMM needs, as the decode mixer's did); and, launched normally, each
# program's first 1 / 2 / 4 blocks pulled into L2 before its rotary (15:47): 1.553 / 1.557 / 1.547
# against 1.551 ms at 1k, 2.090 / 2.078 / 2.080 against 2.092 at 4k, within the passes' spread.
ATTEND_BLOCK_N = 64
ATTEND_WARPS = 8
ATTEND_STAGES = 3
ATTEND_PROGRAMS_PER_SM = 1
# Which slots below min(pos + 1, cap) are attended to: "flags", those ``valid`` marks (a load per
# block of slots, not software-pipelined); "positions", all of them (the same slots: the decoder
# writes them in order, and ``load`` / ``fill`` mark exactly the slots of positions < pos).
# "positions" won (15:39): 1.547 / 2.090 / 4.205 ms against 1.570 / 2.177 / 4.583 at 1k / 4k / 16k;
# the attention kernel 38.8 against 43.2 us a layer at 1k, 483 against 544 at 16k (4.44 TB/s read).
ATTEND_MASK = "positions"
SWITCHES = {"ATTEND_BLOCK_N": (32, 64, 128), "ATTEND_WARPS": (4, 8), "ATTEND_STAGES": (2, 3, 4),
            "ATTEND_PROGRAMS_PER_SM": (1, 2, 4), "ATTEND_MASK": ("flags", "positions")}


@triton.jit
def _store_out(o, gate, sg_b, out, b, heads, m_g, o_d, m_d, H: tl.constexpr, D: tl.constexpr,
               OUT_GATE: tl.constexpr):
    """``o[b, heads] = out`` (``[GP, BD]`` float32), times ``sigmoid(gate[b, heads])`` with
    ``OUT_GATE``; ``o: [B, H*D]``, ``gate``: rows of stride ``sg_b``."""
    m = m_g[:, None] & m_d[None, :]
    cols = heads[:, None] * D + o_d[None, :]
    if OUT_GATE:
        out = out * tl.sigmoid(tl.load(gate + b * sg_b + cols, mask=m, other=0.).to(tl.float32))
    tl.store(o + b * (H * D) + cols, out.to(o.dtype.element_ty), mask=m)


# capacities vary (prompt + steps): one compile for all. BN, the block of cache slots each step of the
# loop reads, is a loop block (blocks.kernels.fitted): every program derives its slot range from it, so a GPU
# short of shared memory may take it smaller (float32 at 64: 72 KB, over a T4's 64 KB)
@_jit(do_not_specialize=["cap"], loop_blocks=("BN",))
def _attend_kernel(q, k, v, gate, sq_b, sk_b, sv_b, sg_b, inv_freq, pos_ptr, k_cache, v_cache, valid, cap,
                   o, part, part_ml, scale_log2,
                   H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                   GP: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr,
                   SPLITS: tl.constexpr, OUT_GATE: tl.constexpr, DOT_PREC: tl.constexpr, FLAGS: tl.constexpr):
    """Grid (B * HKV, SPLITS). ``q, k, v``: the projection's columns ``[B, heads * D]`` (row strides
    ``sq_b``, ...); caches ``[B, cap, HKV, D]``; ``valid: [cap]`` uint8; ``o: [B, H*D]``; with
    SPLITS > 1 ``part: [B*HKV*SPLITS*GP, BD]`` and ``part_ml: [B*HKV*SPLITS*GP, 2]`` float32."""
    i_bj = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1)
    b = i_bj // HKV
    j = i_bj % HKV
    pos = tl.load(pos_ptr)
    cur = pos % cap
    n = tl.minimum(pos + 1, cap)
    DT: tl.constexpr = k_cache.dtype.element_ty
    o_h = tl.arange(0, BH)
    m_h = o_h < HALF
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    o_g = tl.arange(0, GP)
    m_g = o_g < G
    heads = j * G + o_g
    ang = pos.to(tl.float32) * tl.load(inv_freq + o_h, mask=m_h, other=0.)
    cos = tl.cos(ang)
    sin = tl.sin(ang)
    q1, q2 = rotated(q + b * sq_b + heads[:, None] * D + o_h[None, :], m_g[:, None] & m_h[None, :],
                      cos[None, :], sin[None, :], HALF, DT)  # [GP, BH] each
    k1, k2 = rotated(k + b * sk_b + j * D + o_h, m_h, cos, sin, HALF, DT)  # [BH] each
    v_new = tl.load(v + b * sv_b + j * D + o_d, mask=m_d, other=0.)
    first = i_s == 0
    if first:  # the new token into the cache (its slot is masked out of every program's reads)
        dst = ((b * cap + cur) * HKV + j) * D
        tl.store(k_cache + dst + o_h, k1, mask=m_h)
        tl.store(k_cache + dst + HALF + o_h, k2, mask=m_h)
        tl.store(v_cache + dst + o_d, v_new.to(DT), mask=m_d)
        if i_bj == 0:
            tl.store(valid + cur, 1)
    # split 0's softmax starts with the new token, the others empty (a finite max: no inf - inf)
    s_new = (tl.sum(q1.to(tl.float32) * k1.to(tl.float32)[None, :], 1)
             + tl.sum(q2.to(tl.float32) * k2.to(tl.float32)[None, :], 1)) * scale_log2  # [GP]
    m_i = tl.where(first, s_new, -1e30)
    l_i = tl.where(first, 1., 0.) + tl.zeros([GP], tl.float32)
    acc = tl.where(first, 1., 0.) * v_new.to(DT).to(tl.float32)[None, :] + tl.zeros([GP, BD], tl.float32)
    per = tl.cdiv(tl.cdiv(n, BN), SPLITS) * BN
    lo = i_s * per
    hi = tl.minimum(lo + per, n)
    o_n = tl.arange(0, BN)
    base = (b * cap * HKV + j) * D
    for start in range(lo, hi, BN):
        slots = start + o_n
        inb = slots < hi
        rows = base + slots.to(tl.int64)[:, None] * (HKV * D)
        kt1 = tl.load(k_cache + rows + o_h[None, :], mask=inb[:, None] & m_h[None, :], other=0.)
        kt2 = tl.load(k_cache + rows + HALF + o_h[None, :], mask=inb[:, None] & m_h[None, :], other=0.)
        vt = tl.load(v_cache + rows + o_d[None, :], mask=inb[:, None] & m_d[None, :], other=0.)
        live = inb & (slots != cur)
        if FLAGS:
            live = live & (tl.load(valid + slots, mask=inb, other=0) != 0)
        s = (tl.dot(q1, tl.trans(kt1), input_precision=DOT_PREC)
             + tl.dot(q2, tl.trans(kt2), input_precision=DOT_PREC))  # [GP, BN]
        s = tl.where(live[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), vt, input_precision=DOT_PREC)
        m_i = m_new
    if SPLITS == 1:
        _store_out(o, gate, sg_b, acc / l_i[:, None], b, heads, m_g, o_d, m_d, H, D, OUT_GATE)
    else:
        r = (i_bj * SPLITS + i_s) * GP + o_g
        tl.store(part + r[:, None] * BD + o_d[None, :], acc)
        tl.store(part_ml + r * 2, m_i)
        tl.store(part_ml + r * 2 + 1, l_i)


@triton.jit
def _combine_kernel(part, part_ml, gate, sg_b, o, H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr,
                    D: tl.constexpr, GP: tl.constexpr, BD: tl.constexpr, SPLITS: tl.constexpr,
                    OUT_GATE: tl.constexpr):
    """Grid (B * HKV,): the SPLITS partial softmaxes of ``_attend_kernel`` merged, gated, stored."""
    i_bj = tl.program_id(0).to(tl.int64)
    o_d = tl.arange(0, BD)
    o_g = tl.arange(0, GP)
    m_run = tl.full([GP], -1e30, tl.float32)
    l_run = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, BD], tl.float32)
    for s in range(SPLITS):
        r = (i_bj * SPLITS + s) * GP + o_g
        m_s = tl.load(part_ml + r * 2)
        m_new = tl.maximum(m_run, m_s)
        c_run = tl.exp2(m_run - m_new)
        c_s = tl.exp2(m_s - m_new)
        l_run = l_run * c_run + tl.load(part_ml + r * 2 + 1) * c_s
        acc = acc * c_run[:, None] + tl.load(part + r[:, None] * BD + o_d[None, :]) * c_s[:, None]
        m_run = m_new
    _store_out(o, gate, sg_b, acc / l_run[:, None], i_bj // HKV, (i_bj % HKV) * G + o_g, o_g < G, o_d, o_d < D,
               H, D, OUT_GATE)


def splits_for(programs: int, cap: int, device: torch.device) -> int:
    """How many programs share one key/value head's cache: enough for ``ATTEND_PROGRAMS_PER_SM``
    programs per SM over the ``programs = B * Hkv`` heads, at most one per ``ATTEND_BLOCK_N`` slots."""
    sms = sm_count(device) if device.type == "cuda" else 1
    return max(1, min(cdiv(int(sms * ATTEND_PROGRAMS_PER_SM), programs), cdiv(cap, ATTEND_BLOCK_N)))


@register_kernel("attend_cache", "decode")
@torch.compiler.disable  # compiled callers break here, as at the other decode kernels
def attend_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None,
                 inv_freq: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 valid: torch.Tensor, splits: int | None = None) -> torch.Tensor:
    """``q: [B, 1, H*D]``, ``k, v: [B, 1, Hkv*D]``, ``gate: [B, 1, H*D]`` (the sigmoid gate's
    pre-activation) or None (the input projection's columns), ``inv_freq: [D/2]`` float32, ``pos``:
    0-d int64 (the new token's position), ``k_cache, v_cache: [B, cap, Hkv, D]``, ``valid: [cap]``
    bool (the slots written) -> ``o: [B, 1, H*D]``, the layer's attention output before ``o_proj``;
    the rotated key, the value and the slot's flag written at slot ``pos % cap``. ``splits``: the
    programs per key/value head (default ``splits_for``)."""
    check_cache_args(inv_freq, pos, k_cache, v_cache, valid)
    B, cap, Hkv, D = k_cache.shape
    if q.shape[-1] % (Hkv * D):
        raise ValueError(f"q: its width {q.shape[-1]} must be a multiple of Hkv * D = {Hkv * D}")
    check_projection_dtypes(k_cache, q=q, k=k, v=v, gate=gate)
    if splits is not None and not (isinstance(splits, int) and splits >= 1):
        raise ValueError(f"splits: a positive integer or None, got {splits!r}")
    if ATTEND_MASK not in SWITCHES["ATTEND_MASK"]:
        raise ValueError(f"decode_attention.ATTEND_MASK: one of {SWITCHES['ATTEND_MASK']}, got {ATTEND_MASK!r}")
    H = q.shape[-1] // D
    G = H // Hkv
    q2, k2, v2 = (projection_rows(q, B, H * D, "q"), projection_rows(k, B, Hkv * D, "k"),
                  projection_rows(v, B, Hkv * D, "v"))
    g2 = projection_rows(gate, B, H * D, "gate") if gate is not None else q2
    S = splits or splits_for(B * Hkv, cap, k_cache.device)
    GP, BD = pow2(G), pow2(D)
    o = q.new_empty(B, 1, H * D)
    part = part_ml = o  # unused with one split
    if S > 1:
        part = torch.empty(B * Hkv * S * GP, BD, device=q.device, dtype=torch.float32)
        part_ml = torch.empty(B * Hkv * S * GP, 2, device=q.device, dtype=torch.float32)
    # tiles.launch: one warp and stage in the interpreter, one stage for float32 tiles
    settings = launch({"attend": dict(num_warps=ATTEND_WARPS, num_stages=ATTEND_STAGES)}, "attend", k_cache)
    _attend_kernel[(B * Hkv, S)](
        q2, k2, v2, g2, q2.stride(0), k2.stride(0), v2.stride(0), g2.stride(0), inv_freq, pos, k_cache, v_cache,
        valid.view(torch.uint8), cap, o, part, part_ml, math.log2(math.e) / math.sqrt(D),
        H=H, HKV=Hkv, G=G, D=D, HALF=D // 2, GP=GP, BH=pow2(D // 2), BD=BD, BN=ATTEND_BLOCK_N,
        SPLITS=S, OUT_GATE=gate is not None, DOT_PREC=dot_prec(k_cache), FLAGS=ATTEND_MASK == "flags", **settings)
    if S > 1:
        _combine_kernel[(B * Hkv,)](part, part_ml, g2, g2.stride(0), o, H=H, HKV=Hkv, G=G, D=D, GP=GP, BD=BD,
                                    SPLITS=S, OUT_GATE=gate is not None, num_warps=warps(4))
    return o
