"""The delta rules' reverse state walk (``delta._bwd_dh_kernel``) hand-scheduled for Hopper in Gluon, used by
``delta.bwd`` where ``delta.DH_WALK_GLUON`` is on and ``eligible`` holds.

Why a second form of a kernel Triton already compiles: at long sequences (32k tokens per sequence in a
64k-token batch) the reverse walk runs alone on the GPU, one program of 4 warps per SM, each a chain of 512
dependent steps, and Triton 3.6 waits for each of a step's three warpgroup-MMA groups (``k dh``, ``q^T do``,
``w^T dv2``) right after issuing it (sm_90 SASS: ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each;
``docs/benchmarks/kernel_decisions/delta.md``, "Measured: where gated 32k's step goes"). ``q^T do`` does not
depend on the step's ``dh``; here it is issued asynchronously right after ``k dh`` and left in flight
(``warpgroup_mma_wait(num_outstanding=1)``) while ``k dh``'s result becomes ``dv2``, and ``- w^T dv2`` is
accumulated onto it. The chunk's rows come by TMA into a 3-stage ring (mbarriers), two chunks ahead, as the
Triton kernel's pipelined copies do; ``dh`` and ``dv2`` leave by TMA from the shared-memory tiles the dots read.

Eight warps, two warpgroups (where Triton's walk, and its 8-warp forms that lost, run one 4-warp program per SM
with one warp per scheduler, every instruction's latency exposed): the state ``dh [K, BV]`` float32 in registers
split by key rows (64 per warpgroup: ``q^T do`` and ``w^T dv2`` are M = 128 MMAs), ``k dh [BT, BV]`` and the
elementwise work on it split by value columns. Per step (chunk ``i_t``, walking from ``C1 - 1`` down to ``C0``):

* ``dh`` (bf16) to shared memory (the B operand of ``k dh``), stored from there to ``dh[b, i_t]`` by TMA;
* ``kdh = k dh`` (async), then ``dh *= exp(G_C)``, ``do * scale exp(G)`` to shared memory and
  ``dh += q^T (do scale exp(G))`` (async, left in flight);
* wait for ``kdh``; ``dv2 = dv + kdh exp(G_C - G)`` to shared memory (stored by TMA, and negated for the dot);
  ``dh += w^T (-dv2)`` (async); wait for all.

Limits (``eligible``): CUDA on sm_90, 16-bit inputs, ``K = 128``, value block 32 or 64 (224 KB of shared
memory at 64), ``V`` a multiple of it, every chunk whole (``T % 64 == 0``: a TMA box cannot stop at a sequence's end inside the flattened rows), int32
offsets. Elsewhere ``delta`` launches the Triton kernel. Gluon kernels do not run in Triton's interpreter: the
checks are GPU tests (``tests/blocks/test_kernels_gpu_dh_walk_gluon.py``) and an sm_90 compile on CPU
(``benchmarks/kernels_aot_regs.py --kernels bwd_dh_gluon``).
"""
from __future__ import annotations

import torch
import triton
import triton.language

try:  # Gluon ships with Triton >= 3.5; without it this form is simply not eligible
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    # the TMA load's name: ``async_copy_global_to_shared`` in Triton 3.6 (the H200 host's), ``async_load`` from 3.7
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # likewise: ``barrier`` from 3.7
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global  # ``async_store`` from 3.7
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BT = 64  # chunk rows (delta.BT)
KH = 64  # key rows per warpgroup: K = 2 * KH
STAGES = 3  # chunks whose rows are in shared memory at once: this one and the next two
_BT = triton.language.constexpr(BT)
_KH = triton.language.constexpr(KH)
_STAGES = triton.language.constexpr(STAGES)


def eligible(q: torch.Tensor, V: int, BV: int) -> bool:
    """Whether this form can take ``delta.bwd``'s reverse walk for ``q: [B, T, H, K]`` at value block ``BV``."""
    if not HAVE_GLUON or not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:  # warpgroup MMA is Hopper's
        return False
    B, T, H, K = q.shape
    return (T % BT == 0 and K == 2 * KH and BV in (32, 64) and V % BV == 0
            and B * T * H * max(K, V) < 2 ** 31 and B * (T // BT) * H * K * V < 2 ** 31)


if HAVE_GLUON:
    @gluon.jit
    def _issue_loads(i_r, n, C1, bars, q_desc, k_desc, w_desc, do_desc, dv_desc, q_s, k_s, w_s, do_s, dv_s,
                     row_b, i_h, i_v, H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr):
        """Start the TMA loads of walk step ``i_r`` (chunk ``C1 - 1 - i_r``) into its stage, if ``i_r < n``:
        ``q``, ``k``, ``w`` ``[BT, K]``, ``do``, ``dv`` ``[BT, BV]``."""
        if i_r < n:
            stage = i_r % _STAGES
            row = row_b + (C1 - 1 - i_r) * _BT
            bar = bars.index(stage)
            mbarrier.expect(bar, (3 * K + 2 * BV) * _BT * 2)
            col = i_h * K
            _tma_load(q_desc, [row, col], bar, q_s.index(stage))
            _tma_load(k_desc, [row, col], bar, k_s.index(stage))
            _tma_load(w_desc, [row, col], bar, w_s.index(stage))
            vcol = i_h * V + i_v * BV
            _tma_load(do_desc, [row, vcol], bar, do_s.index(stage))
            _tma_load(dv_desc, [row, vcol], bar, dv_s.index(stage))

    @gluon.jit(do_not_specialize=["T", "NT", "C0", "C1"])  # one compile for every length
    def _bwd_dh_gluon_kernel(q_desc, k_desc, w_desc, do_desc, dv_desc, dv2_desc, dh_desc, gc, dht, dh0, scale, T, NT,
                             C0, C1, H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                             USE_G: gl.constexpr, USE_DHT: gl.constexpr, STORE_DH0: gl.constexpr,
                             num_warps: gl.constexpr):
        """Grid (V/BV, B*H), 8 warps = two warpgroups: the state ``dh [K, BV]`` split by key rows (one warpgroup
        each), ``k dh [BT, BV]`` by value columns."""
        dtype: gl.constexpr = q_desc.dtype
        st_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BV, 16])  # [K, BV]: rows per warpgroup
        ch_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                                       instr_shape=[16, BV // (num_warps // 4), 16])  # [BT, BV]
        t_l: gl.constexpr = gl.SliceLayout(1, ch_l)
        key_l: gl.constexpr = q_desc.layout  # [BT, K] tiles
        val_l: gl.constexpr = do_desc.layout  # [BT, BV] tiles
        sta_l: gl.constexpr = dh_desc.layout  # [K, BV]

        q_s = gl.allocate_shared_memory(dtype, [_STAGES, _BT, K], key_l)
        k_s = gl.allocate_shared_memory(dtype, [_STAGES, _BT, K], key_l)
        w_s = gl.allocate_shared_memory(dtype, [_STAGES, _BT, K], key_l)
        do_s = gl.allocate_shared_memory(dtype, [_STAGES, _BT, BV], val_l)
        dv_s = gl.allocate_shared_memory(dtype, [_STAGES, _BT, BV], val_l)
        dh_s = gl.allocate_shared_memory(dtype, [K, BV], sta_l)
        dos_s = gl.allocate_shared_memory(dtype, [_BT, BV], val_l)
        dv2_s = gl.allocate_shared_memory(dtype, [_BT, BV], val_l)
        bars = gl.allocate_shared_memory(gl.int64, [_STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(_STAGES):
            mbarrier.init(bars.index(i), count=1)

        i_v = gl.program_id(0)
        i_bh = gl.program_id(1).to(gl.int64)
        i_b = i_bh // H
        i_h = i_bh % H
        row_b = (i_b * T).to(gl.int32)
        n = C1 - C0
        o_t = gl.arange(0, _BT, layout=t_l)
        o_k = gl.arange(0, K, layout=gl.SliceLayout(1, st_l))
        o_v = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, st_l))
        p_kv = o_k[:, None] * V + o_v[None, :]
        b_dh = gl.zeros([K, BV], gl.float32, st_l)
        if USE_DHT:
            b_dh += gl.load(dht + i_bh * K * V + p_kv)
        for s in gl.static_range(_STAGES - 1):
            _issue_loads(s, n, C1, bars, q_desc, k_desc, w_desc, do_desc, dv_desc, q_s, k_s, w_s, do_s, dv_s,
                         row_b, i_h.to(gl.int32), i_v, H, K, V, BV)
        for i_r in range(n):
            i_t = C1 - 1 - i_r
            stage = i_r % _STAGES
            if USE_G:
                g_row = gc + i_b * T * H + i_h
                b_g = gl.load(g_row + (i_t * _BT + o_t) * H)
                g_last = gl.load(g_row + (i_t * _BT + _BT - 1) * H)
            tma.store_wait(0)
            dh_s.store(b_dh.to(dtype))
            fence_async_shared()
            _cta_barrier()
            dh_row = (((i_b * NT + i_t) * H + i_h) * K).to(gl.int32)
            _tma_store(dh_desc, [dh_row, i_v * BV], dh_s)
            _issue_loads(i_r + _STAGES - 1, n, C1, bars, q_desc, k_desc, w_desc, do_desc, dv_desc, q_s, k_s, w_s,
                         do_s, dv_s, row_b, i_h.to(gl.int32), i_v, H, K, V, BV)
            mbarrier.wait(bars.index(stage), (i_r // _STAGES) & 1)
            kdh = warpgroup_mma(k_s.index(stage), dh_s, gl.zeros([_BT, BV], gl.float32, ch_l), use_acc=False,
                                is_async=True)
            b_do = do_s.index(stage).load(ch_l).to(gl.float32)
            if USE_G:
                b_do = b_do * (scale * gl.exp(b_g))[:, None]
                b_dh = b_dh * gl.exp(g_last)
            else:
                b_do = b_do * scale
            dos_s.store(b_do.to(dtype))
            fence_async_shared()
            _cta_barrier()
            b_dh = warpgroup_mma(q_s.index(stage).permute((1, 0)), dos_s, b_dh, is_async=True)
            kdh = warpgroup_mma_wait(num_outstanding=1, deps=(kdh,))
            if USE_G:
                kdh = kdh * gl.exp(g_last - b_g)[:, None]
            b_dv2 = dv_s.index(stage).load(ch_l).to(gl.float32) + kdh
            # dv2 leaves from this stage's do tile, read into registers before the barrier above; the stage is
            # refilled only after the next step's store_wait
            do_s.index(stage).store(b_dv2.to(dtype))
            dv2_s.store((-b_dv2).to(dtype))
            fence_async_shared()
            _cta_barrier()
            _tma_store(dv2_desc, [row_b + i_t * _BT, (i_h * V).to(gl.int32) + i_v * BV], do_s.index(stage))
            b_dh = warpgroup_mma(w_s.index(stage).permute((1, 0)), dv2_s, b_dh, is_async=True)
            b_dh = warpgroup_mma_wait(num_outstanding=0, deps=(b_dh,))
        tma.store_wait(0)
        if STORE_DH0:
            gl.store(dh0 + i_bh * K * V + p_kv, b_dh)
        for i in gl.static_range(_STAGES):
            mbarrier.invalidate(bars.index(i))


def _gl_dtype(dtype: torch.dtype):
    return gl.bfloat16 if dtype == torch.bfloat16 else gl.float16


def layouts(dtype: torch.dtype, BV: int, K: int = 128) -> tuple:
    """The shared layouts of the walk's ``[BT, K]`` key tiles, ``[BT, BV]`` value tiles and ``[K, BV]`` state."""
    return (gl.NVMMASharedLayout.get_default_for([BT, K], _gl_dtype(dtype)),
            gl.NVMMASharedLayout.get_default_for([BT, BV], _gl_dtype(dtype)),
            gl.NVMMASharedLayout.get_default_for([K, BV], _gl_dtype(dtype)))


def bwd_dh(q, k, w, gc, do, dv, dv2, dh, d_in, d_out, scale, c0, c1, BV):
    """``delta._bwd_dh_kernel``'s launch for chunks ``c0 .. c1 - 1`` (``eligible`` inputs): ``gc`` None runs the
    ungated walk, ``d_in`` / ``d_out`` None: no carried gradient in / out (float32 ``[B, H, K, V]``)."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    key_l, val_l, sta_l = layouts(q.dtype, BV, K)
    descs = [TensorDescriptor(x, [B * T, H * K], [H * K, 1], [BT, K], key_l) for x in (q, k, w)]
    descs += [TensorDescriptor(x, [B * T, H * V], [H * V, 1], [BT, BV], val_l) for x in (do, dv, dv2)]
    descs.append(TensorDescriptor(dh, [dh.numel() // V, V], [V, 1], [K, BV], sta_l))  # [B*NT*H*K, V] rows
    _bwd_dh_gluon_kernel[(V // BV, B * H)](
        *descs, gc, d_in, d_out, scale, T, T // BT, c0, c1, H=H, K=K, V=V, BV=BV, USE_G=gc is not None,
        USE_DHT=d_in is not None, STORE_DH0=d_out is not None, num_warps=8)
