"""What the chunk-kernel modules share: launch settings chosen on the host, and the row-tile loads
and stores of ``[B, T, H, D]`` tensors inside the kernels.

Host side: ``pow2`` (block sizes; ``tl.dot`` needs every dim >= 16), ``warps``/``stages`` (one
warp and no pipelining under Triton's CPU interpreter), ``dot_prec`` (full-precision dots for
float32 inputs, TF32 otherwise), ``state_dtype`` (chunk-start states in the activation dtype).
Device side: ``load_rows``/``store_rows`` and ``dot_operand`` (a tile cast to the activations' dtype
for a bf16 tensor-core dot).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from . import triton_version

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# ``fast_exp``: exponentials with subnormal results flushed to zero (``ex2.approx.ftz.f32``), where
# ``tl.exp`` lowers to ``ex2.approx.f32``, which ptxas wraps in a subnormal fix-up (a compare and two
# predicated multiplies around each ``MUFU.EX2``: 5 SASS instructions per exponential instead of 2;
# in sm_90 compiles 12% of a gla walk step's loop body). Results differ only where exp(x) < 2^-126,
# which become 0 instead of a subnormal. Used by gla's kernels: -1.1..-1.6% per step at 2k-32k on the
# H200; the delta rules keep ``tl.exp``: gated_delta_rule 0.0..+0.8% with it (its ``kkt`` took 29 more
# registers, docs/benchmarks/fast_exp_1202/), and with it only in their per-chunk kernels and walks
# (kkt and wu left alone) -0.2..+0.9% per step queued, the spread
# (docs/benchmarks/train_ab_1202_delta_flushed_exp.md). ARCHSEARCH_FAST_EXP=0 at import time: ``tl.exp``. Read
# once: a Triton kernel cannot see a global change after it compiled (so A/B it across processes).
# Inline PTX rather than ``tl.math.exp2(x * log2 e)``, which lowers to the same instruction in Triton
# 3.9 here; how the GPU host's Triton 3.6 lowers it is not checked, the PTX is the same everywhere.
FAST_EXP = os.environ.get("ARCHSEARCH_FAST_EXP", "1") != "0"
_FAST_EXP: tl.constexpr = tl.constexpr(FAST_EXP and not INTERPRET)  # the interpreter runs no PTX


# The host code's integer helpers are plain Python on purpose: ``triton.cdiv`` and
# ``triton.next_power_of_2`` are ``constexpr_function``s in recent Triton. On the project's CPU
# machine (Triton 3.9; ``python -m timeit -s "import triton" "triton.cdiv(2048, 64)"``, the same for
# ``next_power_of_2(100)``, ``tiles.cdiv``, ``tiles.pow2``): 2.8 and 5.1 us a call against 0.1 and
# 0.8. A delta-rule training step made 11 + 12 such calls (counted once, kernels stubbed out), so
# ~80 us of host time per step there; whether Triton 3.6 on the GPU host costs the same is not
# measured.
def pow2(n: int, lo: int = 16) -> int:
    """The next power of two >= ``n``, at least ``lo`` (``tl.dot`` needs block dims >= 16; masks
    cover the padding)."""
    return max(lo, 1 << max(n - 1, 0).bit_length())


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for launch grids."""
    return -(-a // b)


def warps(n: int) -> int:
    return 1 if INTERPRET else n


def stages(x: torch.Tensor) -> int:
    # float32 tiles are twice the shared memory of bf16 ones: no double buffering for them
    return 1 if INTERPRET or x.dtype == torch.float32 else 2


# Grid dependency control in Triton (``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents``, placed by the
# decode kernels' ``PDL`` constexpr): Triton 3.3 has none, and 3.4.0's pass its compiler an argument that
# compiler no longer takes (TypeError: unexpected keyword argument '_semantic'); 3.5.1, 3.6 and 3.9 work (sm_90
# compiles on a CPU: benchmarks/kernels_aot_regs.py under each, 2026-12-05). Before 3.5 the kernels get no-op
# stand-ins and launch with PDL off: Triton resolves every name a kernel uses, even in a branch a constexpr
# turns off (3.3 stopped at the missing attribute), and compiles the rest as on a GPU without PDL.
TRITON_HAS_GDC = triton_version() >= (3, 5) and hasattr(tl.extra.cuda, "gdc_wait")
if TRITON_HAS_GDC:
    gdc_wait = tl.extra.cuda.gdc_wait
    gdc_launch_dependents = tl.extra.cuda.gdc_launch_dependents
else:
    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


def pdl_launch(on: bool, device: torch.device) -> dict:
    """A kernel's programmatic-dependent-launch arguments: ``PDL`` (the kernel's constexpr that
    places ``gdc_launch_dependents`` / ``gdc_wait``) and ``launch_pdl``, on only where switched on,
    the GPU has grid dependency control (sm_90 and later) and this Triton does (``arch_has_gdc``;
    never in the interpreter)."""
    on = bool(on) and not INTERPRET and device.type == "cuda" and _has_gdc(device)
    return dict(PDL=on, **({"launch_pdl": True} if on else {}))


def arch_has_gdc(major: int) -> bool:
    """Whether kernels for compute capability ``major``.x get grid dependency control (``griddepcontrol``):
    sm_90 on, with a Triton that has it (``TRITON_HAS_GDC``)."""
    return TRITON_HAS_GDC and major >= 9


@functools.lru_cache(maxsize=None)
def _has_gdc(device: torch.device) -> bool:
    return arch_has_gdc(torch.cuda.get_device_capability(device)[0])


def launch(table: dict, name: str, x: torch.Tensor) -> dict:
    """``num_warps``/``num_stages`` (and ``maxnreg`` where the entry has one) of kernel ``name`` from
    a module's launch table, which holds the bf16/fp16 settings (stages ``None``: ``stages(x)``).
    Float32 inputs run every kernel at one stage (``stages``: their tiles are twice the shared
    memory; 3 stages of some exceed the SM's); a register cap (``maxnreg``, ptxas' registers per
    thread) applies to bf16 inputs only, the dtype it was measured with (float32 tiles would spill,
    and float16 compiles some kernels differently, e.g. gla's ``intra_a`` with float32 diagonal
    dots); an entry's ``num_warps_fp32`` is its warp count for float32 inputs (their FMA dots hold
    whole rows of both operands per thread and spill KBs per thread at the bf16 warps:
    docs/benchmarks/fp32_compiles_1205.md); the interpreter runs at one warp and one stage."""
    if INTERPRET:
        return dict(num_warps=1, num_stages=1)
    cfg = dict(table[name])
    fp32_warps = cfg.pop("num_warps_fp32", None)
    if x.dtype == torch.float32 and fp32_warps is not None:
        cfg["num_warps"] = fp32_warps
    if cfg.get("num_stages") is None or x.dtype == torch.float32:
        cfg["num_stages"] = stages(x)
    if x.dtype != torch.bfloat16 or not supports_maxnreg():
        cfg.pop("maxnreg", None)
    return cfg


@functools.lru_cache(maxsize=None)
def supports_maxnreg() -> bool:
    """Whether this Triton takes the ``maxnreg`` launch option: its CUDA backend has it (ROCm
    builds and Triton versions without it would reject or mis-read the keyword, so the caps are
    left out there and the kernels run uncapped)."""
    if torch.version.hip is not None:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "maxnreg" in getattr(CUDAOptions, "__dataclass_fields__", {})


def dot_prec(x: torch.Tensor) -> str:
    # float32 inputs get full-precision dots so results match the PyTorch forms (which do not use
    # TF32 by default); bf16/fp16 inputs already carry ~3 significant digits, and TF32 on their
    # float32 intermediates costs nothing there.
    return "ieee" if x.dtype == torch.float32 else "tf32"


def state_dtype(x: torch.Tensor) -> torch.dtype:
    # Chunk-start states are stored in the activation dtype (fla's choice: half the traffic in
    # bf16); the carried state itself is float32 in registers and in initial/final states.
    return torch.float32 if x.dtype == torch.float32 else x.dtype


# walk_bv's default; a module may set its own (delta.WALK_MIN_PER_SM). 1 since the H200 sweeps of
# 2026-12-01 05:15 / 05:25 (it was 4): V block 64 instead of 32 at 4k / 8k / 16k per fwd+bwd step:
# linear_attn -0.9 / -9.3 / -3.5%, simple_gla -0.9 / -9.7 / -6.0%, gla +0.1 / -7.9 / -3.6%; at 32k
# (128 programs at block 64) these walks stay at 32, as before (64 there: within the 3% spread).
WALK_MIN_PER_SM = 1


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """The CUDA device's multiprocessor count (asked once per device)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def backward_will_run(*tensors) -> bool:
    """Whether autograd will run a backward through an op on ``tensors`` (None entries skipped): grad
    mode on and one of them requiring grad. An ``autograd.Function``'s forward cannot tell (grad mode
    is off inside it, and ``ctx.needs_input_grad`` reads True under ``torch.no_grad`` too), so the
    kernels' entry points ask before ``apply``: what a forward keeps only for the backward (delta's
    ``KEEP_P`` scores, gla's ``KEEP_A``) is then not written in evaluation or prefill."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def chunk_grid(chunks: int, B: int, H: int, lead: int | None, heads_fastest: bool) -> tuple:
    """A per-chunk kernel's grid over ``chunks`` chunks of ``B`` sequences of ``H`` heads (and ``lead``
    tiles of each: ``tile_ids``; else ``chunk_ids``): ``([lead,] chunks, B * H)``, or with
    ``heads_fastest`` ``([lead *] chunks * H, B)``: CUDA launches a grid's programs first axis fastest,
    so the programs resident at once then cover every head of a stretch of tokens (whole 4 KB rows of
    a ``[B, T, 16, 128]`` bf16 tensor) rather than a few heads' 256 B slices of many rows. The first
    axis is the wide one (2^31 - 1 programs; the others 65535)."""
    if heads_fastest:
        return ((lead or 1) * chunks * H, B)
    return (chunks, B * H) if lead is None else (lead, chunks, B * H)


def walk_bv(x: torch.Tensor, chains: int, V: int, min_per_sm: float = WALK_MIN_PER_SM) -> int:
    """V block of a sequential chunk walk over ``chains * cdiv(V, BV)`` programs (each a chain of
    NT dependent steps, its ``[BK, BV]`` float32 state in registers): 64, or 32 when block 64 would
    give fewer than ``min_per_sm`` programs per SM (few (batch, head) pairs, i.e. long sequences):
    fewer, longer programs win while the SMs stay covered."""
    BV = min(64, pow2(V))
    if x.is_cuda and BV > 32:
        if chains * cdiv(V, BV) < min_per_sm * sm_count(x.device):
            BV = 32
    return BV


@triton.jit
def load_rows(x, i_b, i_h, row0, T, H: tl.constexpr, D: tl.constexpr, col0, BR: tl.constexpr, BD: tl.constexpr):
    """``x[b, row0:row0+BR, h, col0:col0+BD]`` of ``x: [B, T, H, D]``, ``[BR, BD]``, zero past ``T``
    and ``D``."""
    o_r = row0 + tl.arange(0, BR)
    o_d = col0 + tl.arange(0, BD)
    # int64 only in the scalar base; per-element offsets in int32 (the wrappers check T*H*D < 2^31):
    # 64-bit address tensors for [64, 128] tiles cost registers the dots need
    base = x + (i_b * T * H + i_h) * D
    return tl.load(base + o_r[:, None] * (H * D) + o_d[None, :],
                   mask=(o_r < T)[:, None] & (o_d < D)[None, :], other=0.)


@triton.jit
def chunk_ids(p_t, p_bh, C0, H: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """``(i_t, i_b, i_h)`` of a per-chunk program from its two grid positions (``chunk_grid``): the
    chunk axis ``p_t`` (from chunk ``C0``) and the (batch, head) axis ``p_bh``, or with
    ``HEADS_FASTEST`` the (chunk, head) axis ``p_t`` (heads fastest) and the batch ``p_bh``. Only
    divisions by the constant ``H``: no registers over the chunk-major order (sm_90 compiles)."""
    if HEADS_FASTEST:
        i_t = p_t // H + C0
        i_h = (p_t % H).to(tl.int64)
        i_b = p_bh.to(tl.int64)
    else:
        i_bh = p_bh.to(tl.int64)
        i_t = p_t + C0
        i_b = i_bh // H
        i_h = i_bh % H
    return i_t, i_b, i_h


@triton.jit
def tile_ids(NX: tl.constexpr, C0, H: tl.constexpr, HEADS_FASTEST: tl.constexpr):
    """``(i_x, i_t, i_b, i_h)`` of a per-chunk program over ``NX`` tiles of each chunk (key or value
    blocks; ``chunk_grid`` with ``lead``): the tile fastest, then as ``chunk_ids``."""
    if HEADS_FASTEST:
        p = tl.program_id(0)
        i_x = p % NX
        i_t, i_b, i_h = chunk_ids(p // NX, tl.program_id(1), C0, H, HEADS_FASTEST)
    else:
        i_x = tl.program_id(0)
        i_t, i_b, i_h = chunk_ids(tl.program_id(1), tl.program_id(2), C0, H, HEADS_FASTEST)
    return i_x, i_t, i_b, i_h


@triton.jit
def block_lower(BT: tl.constexpr, BC: tl.constexpr, ON: tl.constexpr):
    """``[BT, BT]`` mask of a chunk's block-lower part in ``[BC, BC]`` blocks (block row >= block
    column): where a lower-triangular ``[BT, BT]`` matrix (a chunk's scores, ``I + A``'s inverse) can
    be non-zero. Loads and stores masked by it skip the strictly upper blocks' bytes: at ``BC`` = 16,
    6 of 16 blocks, whole 32-byte sectors of a bf16 row (64 bytes in float32), so no sector is
    written in part. ``ON`` False: every element (the modules' ``SKIP_UPPER_BLOCKS`` off)."""
    o = tl.arange(0, BT) // BC
    if ON:
        return o[:, None] >= o[None, :]
    else:
        return (o[:, None] >= 0) & (o[None, :] >= 0)


@triton.jit
def load_rows_where(x, keep, i_b, i_h, row0, T, H: tl.constexpr, D: tl.constexpr, col0, BR: tl.constexpr,
                    BD: tl.constexpr):
    """``load_rows`` reading only where ``keep`` (``[BR, BD]``) holds; zero elsewhere."""
    o_r = row0 + tl.arange(0, BR)
    o_d = col0 + tl.arange(0, BD)
    base = x + (i_b * T * H + i_h) * D
    return tl.load(base + o_r[:, None] * (H * D) + o_d[None, :],
                   mask=(o_r < T)[:, None] & (o_d < D)[None, :] & keep, other=0.)


@triton.jit
def store_rows_where(x, val, keep, i_b, i_h, row0, T, H: tl.constexpr, D: tl.constexpr, col0, BR: tl.constexpr,
                     BD: tl.constexpr):
    """``store_rows`` writing only where ``keep`` (``[BR, BD]``) holds; the rest left alone."""
    o_r = row0 + tl.arange(0, BR)
    o_d = col0 + tl.arange(0, BD)
    base = x + (i_b * T * H + i_h) * D
    tl.store(base + o_r[:, None] * (H * D) + o_d[None, :], val.to(x.dtype.element_ty),
             mask=(o_r < T)[:, None] & (o_d < D)[None, :] & keep)


@triton.jit
def fast_exp(x):
    """``exp(x)`` of a float32 tensor of any shape, subnormal results flushed to zero (``FAST_EXP``;
    else ``tl.exp``)."""
    if _FAST_EXP:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)


@triton.jit
def seq(x, i_b, i_h, T, H: tl.constexpr):
    """Pointer to ``x[b, 0, h]`` of a per-position vector ``x: [B, T, H]``: add ``o_t * H`` for rows
    ``o_t``. Only this scalar base is int64; the per-row offsets stay int32 (the wrappers check
    ``T * H * max(K, V, BT) < 2^31``), as ``load_rows`` keeps them for tiles. In ``delta.py`` (not yet
    the other modules): its gated kernels compile to 3-5% fewer SASS instructions (sm_90), and its
    ``_bwd_dh_kernel`` took 0.559 instead of 0.575 ms per step at 2k (H200 2026-12-02 07:03;
    ``delta._pair_decay``'s two scalar loads keep int64 offsets, see there)."""
    return x + i_b * T * H + i_h


@triton.jit
def store_rows(x, val, i_b, i_h, row0, T, H: tl.constexpr, D: tl.constexpr, col0, BR: tl.constexpr,
               BD: tl.constexpr):
    """Write ``val: [BR, BD]`` (cast to ``x``'s dtype) where ``load_rows`` reads, rows past ``T``
    and columns past ``D`` left alone."""
    o_r = row0 + tl.arange(0, BR)
    o_d = col0 + tl.arange(0, BD)
    base = x + (i_b * T * H + i_h) * D
    tl.store(base + o_r[:, None] * (H * D) + o_d[None, :], val.to(x.dtype.element_ty),
             mask=(o_r < T)[:, None] & (o_d < D)[None, :])


@triton.jit
def dot_operand(x, ref, LOWP: tl.constexpr):
    """``x`` as a ``tl.dot`` operand: in ``ref``'s element dtype when ``LOWP`` (bf16 activations:
    bf16 tensor-core dots with float32 accumulation, half the registers per tile), else as it is."""
    if LOWP:
        x = x.to(ref.dtype.element_ty)
    return x
