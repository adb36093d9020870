"""The delta rules' ``_bwd_dqkwg_kernel`` hand-scheduled for Hopper in Gluon (TMA loads, asynchronous
warpgroup MMA), used by ``delta.bwd`` where ``delta.DQKWG_TMA`` is on and ``eligible`` holds.

Why a second form of a kernel Triton already compiles (``delta._bwd_dqkwg_kernel``): Nsight Compute had
the gated rule's kernel at 58% of DRAM bandwidth against the ungated one's 75%, the same bytes
(``docs/benchmarks/ncu/ncu_kernels_1203.md``): its gate epilogue (~1400 more SASS instructions per
program) runs at two programs of 4 warps per SM with no loads in flight for that program. Every
Triton-level way to overlap it failed (``docs/benchmarks/kernel_decisions/delta.md``: persistence and
flattened loops spilled at 4 warps and lost at 8). Here each program walks ``TILES`` consecutive tiles
and issues the next tile's loads by TMA (shared memory only: no registers held for them) before its
current tile's dots and epilogue, so the loads of one tile run under the epilogue of the one before.

One tile = one chunk of ``BT`` = 64 rows of one (batch, head) and one key half (``BK`` = 64):

* loads (TMA, into one of two stages): ``q``, ``k`` ``[BT, BK]``; per value block of ``BV`` = 64:
  ``vn``, ``do``, ``dv2`` ``[BT, BV]`` and the chunk's state ``h`` and its gradient ``dh``
  ``[BK, BV]`` (rows of ``[B, NT, H, K, V]`` seen as ``[B*NT*H*K, V]``);
* dots (``warpgroup_mma``, operands in shared memory): ``dq += do h^T``, ``dk += vn dh^T``,
  ``dw += dv2 h^T``, ``dP += do vn^T``;
* epilogue: exactly ``delta._bwd_dqkwg_kernel``'s with ``DG_FROM_ROWS`` and ``PAIR_FACTORED``
  (``ds = mask(dP) scale exp(G_i - G_j)``, ``dq += ds k``, ``dk += ds^T q``, the diagonal terms and the
  gate's row sums into ``dG[i_k]``).

Limits (``eligible``): CUDA, 16-bit inputs, ``K = 128`` or 64 and ``V`` a multiple of 64, every chunk
full (``T % 64 == 0``: TMA boxes cannot stop at a sequence's end inside the flattened rows).
Elsewhere ``delta`` launches the Triton kernel. Gluon kernels do not run in Triton's interpreter:
the checks are GPU tests (``tests/blocks/test_kernels_gpu_dqkwg_tma.py``) and an sm_90 compile on CPU
(``benchmarks/kernels_aot_regs.py --kernels delta.bwd_dqkwg_tma``).
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
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BT = 64  # chunk rows (delta.BT)
BLOCK = 64  # the key half and the value block: every tile is [64, 64]
# the same as the kernels see them (a jitted function reads only constexpr globals)
_BT = triton.language.constexpr(BT)
_BLOCK = triton.language.constexpr(BLOCK)


def eligible(q: torch.Tensor, K: int, V: int) -> bool:
    """Whether this form can take ``delta.bwd``'s ``bwd_dqkwg`` for ``q: [B, T, H, K]``."""
    if not HAVE_GLUON or not q.is_cuda or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:  # warpgroup MMA is Hopper's
        return False
    return q.shape[1] % BT == 0 and K in (64, 128) and V % BLOCK == 0


if HAVE_GLUON:
    @gluon.jit
    def _tile_coords(tile, T, NT, C0, NC, H: gl.constexpr, K: gl.constexpr, NK: gl.constexpr):
        """``(i_k, i_b, i_h, i_t, row, h_row)`` of ``tile`` = ``((bh * NC + c) * NK + i_k)``: its key half,
        batch, head, chunk, first row in ``[B*T, .]`` and first row of its state slice in ``[B*NT*H*K, V]``."""
        i_k = tile % NK
        i_bh = tile // NK // NC
        i_t = C0 + (tile // NK) % NC
        i_b = i_bh // H
        i_h = i_bh % H
        return i_k, i_b, i_h, i_t, i_b * T + i_t * _BT, ((i_b * NT + i_t) * H + i_h) * K + i_k * _BLOCK

    @gluon.jit
    def _load_values(tile, bar, vn_desc, do_desc, dv2_desc, h_desc, dh_desc, vn_s, do_s, dv2_s, h_s, dh_s,
                     T, NT, C0, NC, H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, NK: gl.constexpr,
                     NV: gl.constexpr):
        """Start the TMA loads of ``tile``'s value-side tiles (``vn``, ``do``, ``dv2``, ``h``, ``dh`` per
        value block) into their buffers; ``bar`` completes when all have landed."""
        i_k, i_b, i_h, i_t, row, h_row = _tile_coords(tile, T, NT, C0, NC, H, K, NK)
        mbarrier.expect(bar, 5 * NV * _BT * _BLOCK * 2)
        for i_v in gl.static_range(NV):
            col = i_h * V + i_v * _BLOCK
            tma.async_copy_global_to_shared(vn_desc, [row, col], bar, vn_s.index(i_v))
            tma.async_copy_global_to_shared(do_desc, [row, col], bar, do_s.index(i_v))
            tma.async_copy_global_to_shared(dv2_desc, [row, col], bar, dv2_s.index(i_v))
            tma.async_copy_global_to_shared(h_desc, [h_row, i_v * _BLOCK], bar, h_s.index(i_v))
            tma.async_copy_global_to_shared(dh_desc, [h_row, i_v * _BLOCK], bar, dh_s.index(i_v))

    @gluon.jit
    def _load_qk(tile, bar, q_desc, k_desc, q_s, k_s, T, NT, C0, NC, H: gl.constexpr, K: gl.constexpr,
                 NK: gl.constexpr):
        """Start the TMA loads of ``tile``'s ``q`` and ``k`` key-half tiles; ``bar`` completes with them."""
        i_k, i_b, i_h, i_t, row, h_row = _tile_coords(tile, T, NT, C0, NC, H, K, NK)
        mbarrier.expect(bar, 2 * _BT * _BLOCK * 2)
        tma.async_copy_global_to_shared(q_desc, [row, i_h * K + i_k * _BLOCK], bar, q_s)
        tma.async_copy_global_to_shared(k_desc, [row, i_h * K + i_k * _BLOCK], bar, k_s)

    @gluon.jit(do_not_specialize=["T", "NT", "B", "C0", "NC", "n_tiles"])  # one compile for every length
    def _bwd_dqkwg_tma_kernel(q_desc, k_desc, vn_desc, do_desc, dv2_desc, h_desc, dh_desc,
                              gc, dq, dk, dw, dG, scale, T, NT, B, C0, NC, n_tiles,
                              H: gl.constexpr, K: gl.constexpr, V: gl.constexpr, TILES: gl.constexpr,
                              USE_G: gl.constexpr, SPAN_MAX: gl.constexpr, num_warps: gl.constexpr):
        """Grid (cdiv(n_tiles, TILES),), ``n_tiles = NK * NC * B * H`` for chunks ``C0 .. C0 + NC - 1``;
        tile ``((bh * NC + c) * NK + i_k)``. Outputs as ``delta._bwd_dqkwg_kernel``'s: ``dq`` (final),
        ``dk`` / ``dw`` (their output-and-state parts) ``[B, T, H, K]`` in the inputs' dtype, and with
        ``USE_G`` the key half's share of the chunk-local gate gradient ``dG: [NK, B, T, H]`` float32.

        One buffer per input (~104 KB: two programs per SM), two barriers: the value-side tiles of the
        next tile are loaded as soon as this tile's four dots are done, under its epilogue; its ``q`` /
        ``k`` once the epilogue has read them."""
        NK: gl.constexpr = K // _BLOCK
        NV: gl.constexpr = V // _BLOCK
        dtype: gl.constexpr = q_desc.dtype
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, _BLOCK, 16])
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        rows_l: gl.constexpr = gl.SliceLayout(1, mma)
        cols_l: gl.constexpr = gl.SliceLayout(0, mma)
        tile_l: gl.constexpr = q_desc.layout  # every [64, 64] 16-bit tile has this shared layout

        q_s = gl.allocate_shared_memory(dtype, [_BT, _BLOCK], tile_l)
        k_s = gl.allocate_shared_memory(dtype, [_BT, _BLOCK], tile_l)
        vn_s = gl.allocate_shared_memory(dtype, [NV, _BT, _BLOCK], tile_l)
        do_s = gl.allocate_shared_memory(dtype, [NV, _BT, _BLOCK], tile_l)
        dv2_s = gl.allocate_shared_memory(dtype, [NV, _BT, _BLOCK], tile_l)
        h_s = gl.allocate_shared_memory(dtype, [NV, _BLOCK, _BLOCK], tile_l)
        dh_s = gl.allocate_shared_memory(dtype, [NV, _BLOCK, _BLOCK], tile_l)
        ds_s = gl.allocate_shared_memory(dtype, [_BT, _BT], tile_l)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        bar_v = bars.index(0)
        bar_qk = bars.index(1)
        mbarrier.init(bar_v, count=1)
        mbarrier.init(bar_qk, count=1)

        o_i = gl.arange(0, _BT, layout=rows_l)
        o_j = gl.arange(0, _BT, layout=cols_l)
        o_c = gl.arange(0, _BLOCK, layout=cols_l)
        t0 = gl.program_id(0) * TILES
        count = gl.minimum(n_tiles - t0, TILES)
        _load_values(t0, bar_v, vn_desc, do_desc, dv2_desc, h_desc, dh_desc, vn_s, do_s, dv2_s, h_s, dh_s,
                     T, NT, C0, NC, H, K, V, NK, NV)
        _load_qk(t0, bar_qk, q_desc, k_desc, q_s, k_s, T, NT, C0, NC, H, K, NK)
        for j in range(count):
            tile = t0 + j
            i_k, i_b, i_h, i_t, row, h_row = _tile_coords(tile, T, NT, C0, NC, H, K, NK)
            mbarrier.wait(bar_v, j & 1)
            mbarrier.wait(bar_qk, j & 1)
            b_dq = gl.zeros([_BT, _BLOCK], gl.float32, mma)
            b_dk = gl.zeros([_BT, _BLOCK], gl.float32, mma)
            b_dw = gl.zeros([_BT, _BLOCK], gl.float32, mma)
            b_dP = gl.zeros([_BT, _BT], gl.float32, mma)
            hdh = 0.0
            for i_v in gl.static_range(NV):
                h_t = h_s.index(i_v).permute((1, 0))  # [BV, BK] view: h^T
                b_dq = warpgroup_mma(do_s.index(i_v), h_t, b_dq, is_async=True)
                b_dk = warpgroup_mma(vn_s.index(i_v), dh_s.index(i_v).permute((1, 0)), b_dk, is_async=True)
                b_dw = warpgroup_mma(dv2_s.index(i_v), h_t, b_dw, is_async=True)
                b_dP = warpgroup_mma(do_s.index(i_v), vn_s.index(i_v).permute((1, 0)), b_dP, is_async=True)
                if USE_G:  # sum(h * dh), the chunk-total decay's gradient (read while the dots run)
                    b_h = h_s.index(i_v).load(mma).to(gl.float32)
                    b_dh = dh_s.index(i_v).load(mma).to(gl.float32)
                    hdh += gl.sum(gl.sum(b_h * b_dh, axis=1), axis=0)
            b_dq, b_dk, b_dw, b_dP = warpgroup_mma_wait(num_outstanding=0, deps=(b_dq, b_dk, b_dw, b_dP))
            if j + 1 < count:  # the value-side buffers are read: the next tile's loads run under the epilogue
                gl.thread_barrier()
                _load_values(tile + 1, bar_v, vn_desc, do_desc, dv2_desc, h_desc, dh_desc, vn_s, do_s, dv2_s,
                             h_s, dh_s, T, NT, C0, NC, H, K, V, NK, NV)

            o_t = i_t * _BT + o_i
            p_out = (row + o_i)[:, None] * (H * K) + (i_h * K + i_k * _BLOCK + o_c)[None, :]
            gl.store(dw + p_out, (-b_dw).to(dtype))
            if USE_G:
                b_g = gl.load(gc + (row + o_i) * H + i_h)
                b_gj = gl.load(gc + (row + o_j) * H + i_h)
                g0 = gl.load(gc + row * H + i_h)
                g_last = gl.load(gc + (row + _BT - 1) * H + i_h)
                b_dq = b_dq * (scale * gl.exp(b_g))[:, None]
                b_dk = b_dk * gl.exp(g_last - b_g)[:, None]
                m_ij = o_i[:, None] >= o_j[None, :]
                if g0 - g_last < SPAN_MAX:  # through the chunk's first row: 2 BT exponentials
                    b_e = gl.exp(b_g - g0)[:, None] * gl.exp(g0 - b_gj)[None, :]
                else:
                    b_e = gl.exp(gl.where(m_ij, b_g[:, None] - b_gj[None, :], float("-inf")))
                b_ds = gl.where(m_ij, b_dP * scale * b_e, 0.)
                b_kf = k_s.load(mma).to(gl.float32)
                b_qf = q_s.load(mma).to(gl.float32)
                # the last key's exp(G_C - G_C) carries no gradient (as in delta._bwd_dqkwg_kernel)
                b_kdk = gl.where(o_i < _BT - 1, gl.sum(b_kf * b_dk, axis=1), 0.)
                b_diag = gl.sum(gl.where(o_i[:, None] == o_j[None, :], b_ds, 0.), axis=1)
                b_ds = gl.where(o_i[:, None] > o_j[None, :], b_ds, 0.).to(dtype)
                ds_s.store(b_ds)
                fence_async_shared()
                gl.thread_barrier()
                b_dq = warpgroup_mma(gl.convert_layout(b_ds, dot_a), k_s, b_dq, is_async=True)
                b_dks = warpgroup_mma(ds_s.permute((1, 0)), q_s, gl.zeros([_BT, _BLOCK], gl.float32, mma),
                                      is_async=True)
                b_dq, b_dks = warpgroup_mma_wait(num_outstanding=0, deps=(b_dq, b_dks))
                b_dg = gl.sum(b_qf * b_dq, axis=1) - b_kdk - gl.sum(b_kf * b_dks, axis=1)
                b_dq += b_diag[:, None] * b_kf
                b_dk += b_dks + b_diag[:, None] * b_qf
                b_dg += gl.where(o_i == _BT - 1, gl.sum(b_kdk, axis=0) + hdh * gl.exp(g_last), 0.)
                gl.store(dG + ((i_k * B + i_b) * T + o_t) * H + i_h, b_dg)
            else:
                b_ds = gl.where(o_i[:, None] >= o_j[None, :], b_dP * scale, 0.).to(dtype)
                ds_s.store(b_ds)
                fence_async_shared()
                gl.thread_barrier()
                b_dq = warpgroup_mma(gl.convert_layout(b_ds, dot_a), k_s, b_dq * scale, is_async=True)
                b_dk = warpgroup_mma(ds_s.permute((1, 0)), q_s, b_dk, is_async=True)
                b_dq, b_dk = warpgroup_mma_wait(num_outstanding=0, deps=(b_dq, b_dk))
            if j + 1 < count:  # q and k are read: the next tile's come in while this one stores
                gl.thread_barrier()
                _load_qk(tile + 1, bar_qk, q_desc, k_desc, q_s, k_s, T, NT, C0, NC, H, K, NK)
            gl.store(dq + p_out, b_dq.to(dtype))
            gl.store(dk + p_out, b_dk.to(dtype))
        mbarrier.invalidate(bar_v)
        mbarrier.invalidate(bar_qk)


def tile_layout(dtype: torch.dtype):
    """The shared layout of a ``[64, 64]`` tile of ``dtype`` (TMA's and the dots')."""
    return gl.NVMMASharedLayout.get_default_for([BT, BLOCK], gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def _rows_desc(x: torch.Tensor, rows: int, cols: int, layout) -> "TensorDescriptor":
    """``x`` (contiguous) seen as ``[rows, cols]`` in ``[64, 64]`` boxes."""
    return TensorDescriptor(x, [rows, cols], [cols, 1], [BT, BLOCK], layout)


def bwd_dqkwg(q, k, vn, gc, h, do, dh, dv2, dq, dk, dw, dG, scale, c0, c1, tiles, span_max):
    """``delta._bwd_dqkwg_kernel``'s outputs for chunks ``c0 .. c1 - 1`` (``eligible`` inputs; ``gc`` /
    ``dG`` None for the ungated rule); ``tiles``: tiles per program (``delta.DQKWG_TMA_TILES``)."""
    B, T, H, K = q.shape
    V = vn.shape[-1]
    NT = T // BT
    lay = tile_layout(q.dtype)
    descs = [_rows_desc(x, B * T, H * K, lay) for x in (q, k)]
    descs += [_rows_desc(x, B * T, H * V, lay) for x in (vn, do, dv2)]
    descs += [_rows_desc(x, B * NT * H * K, V, lay) for x in (h, dh)]
    n_tiles = (K // BLOCK) * (c1 - c0) * B * H
    _bwd_dqkwg_tma_kernel[(triton.cdiv(n_tiles, tiles),)](
        *descs, gc, dq, dk, dw, dG, scale, T, NT, B, c0, c1 - c0, n_tiles, H=H, K=K, V=V, TILES=tiles,
        USE_G=gc is not None, SPAN_MAX=span_max, num_warps=4)
