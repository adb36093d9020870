"""One Triton kernel for a softmax layer's decode step between its input projection and SDPA:
rotary embeddings of the new query and key, and the key and value written into the static KV
cache at the current position.

Inside the captured decode graph (``archsearch.decode_graph``) the PyTorch path of this step is
~45 small kernels per softmax layer (the counts below: (418 - 148) / 6 layers) (the rotary angles from the position, cos, sin, the rotation
as slices, multiplies and a concatenation, two ``index_copy_``, the attention mask), 1-3 us each:
on the H200 (2026-12-01, 3:1 hybrid with softmax, 24 layers, batch 16) 418 kernels per step
before this kernel (14:40) and 148 with it (14:45), against 124 for the 24-layer linear model. Here it is one launch,
grid ``(B, H + Hkv)``; the attention mask becomes a persistent ``[cap]`` bool buffer of written
slots, this position's set here.

    q_rot         = rotary(q, pos)                      [B, 1, H, D]   (returned)
    k_cache[:, s] = rotary(k, pos),  v_cache[:, s] = v  s = pos % cap
    valid[s]      = True

Rotary as ``blocks.common.rotary`` (half-split layout, float32 angles ``pos * inv_freq`` with
``inv_freq`` from ``blocks.common.rotary_frequencies``), rounded to the activations' dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import register_kernel
from .tiles import pow2


@triton.jit
def rotated(ptr, mask, cos, sin, HALF: tl.constexpr, DTYPE: tl.constexpr):
    """``rotary`` of the half-split vectors at ``ptr`` (offsets of the first halves, any shape that
    broadcasts with ``cos``/``sin``) -> ``(first half, second half)`` rounded to ``DTYPE`` (also
    ``decode_attention``'s)."""
    x1 = tl.load(ptr, mask=mask, other=0.).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.).to(tl.float32)
    return (x1 * cos - x2 * sin).to(DTYPE), (x2 * cos + x1 * sin).to(DTYPE)


@triton.jit
def _rotate_store(src, dst, cos, sin, o, m, HALF: tl.constexpr):
    """``dst[:D] = rotary(src[:D])`` for one head (``o``: ``[BH]`` offsets in a half, ``m`` their mask)."""
    x1, x2 = rotated(src + o, m, cos, sin, HALF, dst.dtype.element_ty)
    tl.store(dst + o, x1, mask=m)
    tl.store(dst + HALF + o, x2, mask=m)


@triton.jit
def _rope_cache_kernel(q, k, v, sq_b, sk_b, sv_b, inv_freq, pos_ptr, q_out, k_cache, v_cache, valid, cap,
                       H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                       BH: tl.constexpr):
    """Grid (B, H + HKV): program ``(b, j)`` rotates query head ``j < H`` into ``q_out: [B, H, D]``,
    or key/value head ``j - H`` into the caches ``[B, cap, HKV, D]`` at slot ``pos % cap``; ``q, k,
    v``: the projection's columns ``[B, heads * D]`` (row strides ``sq_b``, ...)."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    pos = tl.load(pos_ptr)
    o = tl.arange(0, BH)
    m = o < HALF
    ang = pos.to(tl.float32) * tl.load(inv_freq + o, mask=m, other=0.)
    cos = tl.cos(ang)
    sin = tl.sin(ang)
    if j < H:
        _rotate_store(q + b * sq_b + j * D, q_out + (b * H + j) * D, cos, sin, o, m, HALF)
    else:
        i = j - H
        slot = (pos % cap).to(tl.int64)
        dst = ((b * cap + slot) * HKV + i) * D
        _rotate_store(k + b * sk_b + i * D, k_cache + dst, cos, sin, o, m, HALF)
        src = v + b * sv_b + i * D
        tl.store(v_cache + dst + o, tl.load(src + o, mask=m), mask=m)
        tl.store(v_cache + dst + HALF + o, tl.load(src + HALF + o, mask=m), mask=m)
        if b == 0 and i == 0:
            tl.store(valid + slot, 1)


def projection_rows(x: torch.Tensor, B: int, width: int, name: str) -> torch.Tensor:
    """``x: [B, 1, width]`` (a view of the projection) as ``[B, width]`` with unit column stride."""
    if tuple(x.shape) != (B, 1, width) or x.stride(-1) != 1:
        raise ValueError(f"{name}: must be [{B}, 1, {width}] with unit last stride, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    return x[:, 0]


def check_cache_args(inv_freq: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     valid: torch.Tensor) -> None:
    """The one-line errors of the cache arguments this kernel and ``decode_attention.attend_cache``
    share: contiguous ``[B, cap, Hkv, D]`` caches of even D and one dtype, float32 ``[D/2]``
    frequencies, a bool ``[cap]`` mask, a 0-d int64 position, all on the key cache's device."""
    B, cap, Hkv, D = k_cache.shape
    if D % 2 or tuple(v_cache.shape) != (B, cap, Hkv, D) or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"k_cache, v_cache: must be contiguous [B, cap, Hkv, D] of even D, got "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if tuple(inv_freq.shape) != (D // 2,) or inv_freq.dtype != torch.float32:
        raise ValueError(f"inv_freq: must be float32 [{D // 2}], got {inv_freq.dtype} {tuple(inv_freq.shape)}")
    if tuple(valid.shape) != (cap,) or valid.dtype != torch.bool:
        raise ValueError(f"valid: must be bool [{cap}], got {valid.dtype} {tuple(valid.shape)}")
    if pos.dim() != 0 or pos.dtype != torch.int64 or pos.device != k_cache.device:
        raise ValueError(f"pos: must be a 0-d int64 tensor on {k_cache.device}, got {pos.dtype} "
                         f"{tuple(pos.shape)} on {pos.device}")
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"v_cache: must be {k_cache.dtype} as k_cache, got {v_cache.dtype}")
    for name, t in (("v_cache", v_cache), ("inv_freq", inv_freq), ("valid", valid)):
        if t.device != k_cache.device:
            raise ValueError(f"{name}: must be on {k_cache.device} with k_cache, got {t.device}")


def check_projection_dtypes(k_cache: torch.Tensor, **columns: torch.Tensor | None) -> None:
    """The projection's columns (``q``, ``k``, ``v``, ``gate``; None skipped) in the cache's dtype
    and on its device, as the PyTorch path's cache writes and SDPA require."""
    for name, t in columns.items():
        if t is not None and (t.dtype != k_cache.dtype or t.device != k_cache.device):
            raise ValueError(f"{name}: must be {k_cache.dtype} on {k_cache.device} as the cache, "
                             f"got {t.dtype} on {t.device}")


@register_kernel("rope_cache", "decode")
@torch.compiler.disable  # compiled callers break here, as at the other decode kernels
def rope_into_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_freq: torch.Tensor, pos: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``q: [B, 1, H*D]``, ``k, v: [B, 1, Hkv*D]`` (the input projection's columns), ``inv_freq: [D/2]``
    float32, ``pos``: 0-d int64 (the new token's position), ``k_cache, v_cache: [B, cap, Hkv, D]``,
    ``valid: [cap]`` bool -> ``q`` rotated, ``[B, 1, H, D]``; the rotated key, the value and the
    slot's flag written at slot ``pos % cap``."""
    check_cache_args(inv_freq, pos, k_cache, v_cache, valid)
    check_projection_dtypes(k_cache, q=q, k=k, v=v)
    B, cap, Hkv, D = k_cache.shape
    H = q.shape[-1] // D
    half = D // 2
    q2, k2, v2 = (projection_rows(q, B, H * D, "q"), projection_rows(k, B, Hkv * D, "k"),
                  projection_rows(v, B, Hkv * D, "v"))
    q_out = q.new_empty(B, 1, H, D)
    _rope_cache_kernel[(B, H + Hkv)](
        q2, k2, v2, q2.stride(0), k2.stride(0), v2.stride(0), inv_freq, pos, q_out, k_cache, v_cache,
        valid.view(torch.uint8), cap, H=H, HKV=Hkv, D=D, HALF=half, BH=pow2(half),
        num_warps=1)  # 64-element halves: one warp
    return q_out
