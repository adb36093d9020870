"""Triton chunk kernels for ``gla`` and the delta rules (``blocks.kernels.gla``,
``blocks.kernels.delta``) against the reference, forward and backward, called directly; the ops
dispatch to them on CUDA.

* GPU tests need CUDA and Triton and skip cleanly without them.
* Interpreter tests run the kernels on CPU tensors through Triton's interpreter. They
  run only when ``triton`` is importable AND ``TRITON_INTERPRET=1`` was set before the test process
  started (Triton reads it when the kernels are defined, at import, so a test cannot switch it on),
  and skip otherwise. They check float32 (and float16 for the WY path): the interpreter's ``tl.dot``
  multiplies bfloat16 tiles as their raw 16-bit integers, so bf16 is covered by the GPU tests alone. Run them with
  ``TRITON_INTERPRET=1 python -m pytest -q tests/blocks/test_kernels_gpu_gla_delta.py -k interpreter``.

Inputs are seeded draws (made on the CPU, so every device sees the same values) at lengths that are
and are not multiples of the kernels' chunk (64), with an initial state or none, and random, very
strong (``g = -30``: every step forgets ~all) or no decay. The reference is the op's PyTorch chunk
form in float64 on the same values (``_reference``).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from interpreter_bounds import checked_memory

import blocks.kernels as blocks_kernels
from blocks.ops import delta_rule as delta_ops
from blocks.ops import gated_delta_rule as gated_ops
from blocks.ops import gla as gla_ops
from blocks.ops.utils import l2norm

HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_GPU = HAS_TRITON and torch.cuda.is_available()
INTERPRET = HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU and Triton")
interpreter = pytest.mark.skipif(
    not INTERPRET or HAS_GPU,
    reason="needs triton and TRITON_INTERPRET=1 set before the process starts (and no GPU: there the "
           "GPU tests run the same kernels for real)")
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")

FAMILIES = ("gla", "delta_rule", "gated_delta_rule")
_CHUNK = {"gla": gla_ops.chunk, "delta_rule": delta_ops.chunk, "gated_delta_rule": gated_ops.chunk}


def _reference(family):
    """The op's PyTorch chunk form in float64 (kernels off). ``tests/blocks/test_ops.py`` holds it
    to the ``recurrent`` loop (strong and no decay included); unlike the loop it runs a few batched
    ops per 64-token chunk instead of several small kernels per token, which on a GPU is most of a
    test case's time at T=1000."""
    def run(*args, initial_state=None, output_final_state=False):
        from blocks import kernels

        with kernels.disabled():
            return _CHUNK[family](*(a.double() for a in args),
                                  initial_state=None if initial_state is None else initial_state.double(),
                                  output_final_state=output_final_state)
    return run


REFERENCE = {f: _reference(f) for f in _CHUNK}


def chunk_kernel(family: str):
    """The Triton chunk kernel for ``family`` (imported lazily: the modules need triton)."""
    if family == "gla":
        from blocks.kernels import gla

        return gla.gla_chunk
    from blocks.kernels import delta

    return delta.delta_rule_chunk if family == "delta_rule" else delta.gated_delta_rule_chunk


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / max(||b||, 1e-3 sqrt(n))``: relative, except that a reference whose entries
    are all below ~1e-3 (a gate gradient under strong decay) is judged by absolute error."""
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values"
    return ((a - b).norm() / max(b.norm().item(), 1e-3 * b.numel() ** 0.5)).item()


def make_inputs(family, B, T, H, K, V, decay, with_h0, seed):
    """Positional op inputs (float32, CPU) in call order, and the initial state or None."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H, V)
    gate_shape = (B, T, H, K) if family == "gla" else (B, T, H)
    if decay == "random":
        g = F.logsigmoid(rnd(*gate_shape) + (1.0 if family == "gla" else 0.0))
    elif decay == "strong":
        g = torch.full(gate_shape, -30.0)
    elif decay == "moderate":  # -1.5 a step: a 16-row block spans 22.5 (factored path, factors up
        # to exp(22.5) = 6e9: beyond float16)
        g = torch.full(gate_shape, -1.5)
    elif decay == "steep":  # -3 a step on half the channels: a 16-row block spans 45 > gla.SPAN_MAX (its
        # exact diagonal path) while neighbours still weigh exp(-3) and the other channels decay mildly
        g = F.logsigmoid(rnd(*gate_shape) + 2.0)
        g[..., ::2] = -3.0
    elif decay == "mixed":  # per chunk, both of gla's paths in one call: random gates, except that
        # head 0's second chunk falls by 3 a step on half the channels (span 189 > gla.SPAN_MAX_CHUNK:
        # sub-chunk kernels) and head 1 by 0.93 a step everywhere (span 58.6 over a full chunk, just
        # under the limit: whole-chunk kernels with factors up to exp(58.6))
        g = F.logsigmoid(rnd(*gate_shape) + (1.0 if family == "gla" else 0.0))
        if family == "gla":
            g[:, 64:128, 0, ::2] = -3.0
        else:
            g[:, 64:128, 0] = -3.0
        if H < 2:
            raise ValueError('make_inputs: decay "mixed" needs H >= 2 (head 1 is the near-limit one)')
        g[:, :, 1] = -0.93
    else:
        g = torch.zeros(gate_shape)
    if family == "gla":
        args = [q, k, v, g]
    else:
        if decay == "correlated":  # keys of pairwise cosine ~0.9 and beta ~1, where the chunk
            # inverse's repeated squaring amplifies rounding (benchmarks/solve_tril_precision.py)
            k = l2norm(3.0 * l2norm(rnd(1, 1, H, K)) + l2norm(k))
            beta = torch.sigmoid(rnd(B, T, H) + 6.0)
        else:
            k = l2norm(k)
            beta = torch.sigmoid(rnd(B, T, H))
        args = [q, k, v, beta] if family == "delta_rule" else [q, k, v, g, beta]
    return args, (rnd(B, H, K, V) if with_h0 else None)


def run_case(kernel, family, shape, dtype, decay, with_h0, device, seed=0):
    """``{name: rel error}`` of the kernel's ``o``, final state and every input gradient."""
    B, T, H, K, V = shape
    args, h0 = make_inputs(family, B, T, H, K, V, decay, with_h0, seed)
    # q, k, v in the tested dtype; gates, beta and the state stay float32 (as the blocks pass them)
    ins = [a.to(device=device, dtype=dtype if i < 3 else torch.float32) for i, a in enumerate(args)]
    got, ref = {}, {}
    for out, fn in ((got, kernel), (ref, REFERENCE[family])):
        leaves = [x.detach().clone().requires_grad_(True) for x in ins]
        s0 = h0.to(device).requires_grad_(True) if h0 is not None else None
        call_args = leaves
        o, ht = fn(*call_args, initial_state=s0, output_final_state=True)
        if fn is kernel:
            assert o.dtype == dtype and o.shape == (B, T, H, V), (o.dtype, o.shape)
            assert ht.dtype == torch.float32 and ht.shape == (B, H, K, V)
        gen = torch.Generator().manual_seed(seed + 1)
        do = torch.randn(o.shape, generator=gen).to(device)
        dht = torch.randn(ht.shape, generator=gen).to(device)
        wrt = leaves + ([s0] if s0 is not None else [])
        grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), wrt)
        out["o"], out["state"] = o.detach(), ht.detach()
        names = ["q", "k", "v", *(["g"] if family != "delta_rule" else []), *(["beta"] if family != "gla" else [])]
        for name, gr in zip(names + ["initial_state"], grads):
            out[f"d{name}"] = gr
    return {name: rel(got[name], ref[name]) for name in ref}


# --- GPU ---------------------------------------------------------------------------------------
SHAPES = [  # B, T, H, K, V. One head count: H, K and V are compile-time constants of the kernels
    (2, 64, 2, 64, 64),  # and every distinct triple costs a fresh Triton compile of every kernel
    (2, 65, 2, 64, 64),  # one full chunk and one row more
    (1, 1, 2, 32, 48),  # a single step; K < V, neither a power of two
    (1, 200, 2, 128, 64),  # ragged tail, K > V
    (1, 1000, 2, 128, 128),  # the benchmark's head dims, 16 chunks
    (1, 100, 2, 160, 32),  # K > 128: gla splits into key slices, the delta rules run the PyTorch form
]
# "steep" (added 2026-11-30 night, not yet run on a GPU): gla's exact diagonal path with weights that
# matter; "strong" reaches it only where they are ~1e-13
CASES = (("random", True), ("strong", False), ("steep", True), ("none", True), ("mixed", True))
TOL = {torch.float32: 2e-4, torch.bfloat16: 4e-2}


@gpu
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_kernel_matches_reference(family, shape, dtype):
    kernel = chunk_kernel(family)
    for decay, with_h0 in CASES:
        if family == "delta_rule" and decay != "random":
            continue
        errs = run_case(kernel, family, shape, dtype, decay, with_h0, "cuda")
        bad = {n: e for n, e in errs.items() if e > TOL[dtype]}
        assert not bad, f"{family} {decay} h0={with_h0}: {bad} (all: {errs})"


@gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_kernels_in_float16(family):
    """float16 inputs run their own compiles (the bf16-style dots take float16 operands, whose range
    ends at 65504): one shape, every decay case plus "moderate", whose diagonal-block factors reach
    exp(22.5) (they overflowed float16 in gla's forward before its diagonal dots kept float32)."""
    kernel = chunk_kernel(family)
    for decay, with_h0 in CASES + (("moderate", False),):
        if family == "delta_rule" and decay != "random":
            continue
        errs = run_case(kernel, family, (1, 200, 2, 128, 64), torch.float16, decay, with_h0, "cuda")
        bad = {n: e for n, e in errs.items() if not e <= TOL[torch.bfloat16]}  # NaN fails too
        assert not bad, f"{family} {decay} h0={with_h0}: {bad} (all: {errs})"


def fixed_walk_bv(block_v: int):
    """A stand-in for a module's ``walk_bv`` that always picks ``block_v`` (capped at V's power of 2)."""
    return lambda x, chains, V: min(block_v, max(16, 1 << (V - 1).bit_length()))


def flip_switches(family: str, monkeypatch, only: str | None = None) -> list[str]:
    """Turn every alternative the family's kernel module offers (its ``SWITCHES``, which the launch
    sweep times against the defaults), or ``only`` that one, to its other value; returns
    ``NAME=value`` strings."""
    from blocks.kernels import kernel_module, other_switch_values

    mod = kernel_module(family)
    flipped = other_switch_values(mod, only)
    for name, value in flipped.items():
        monkeypatch.setattr(mod, name, value)
    return [f"{name}={value}" for name, value in flipped.items()]


@gpu
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shape", [(2, 65, 2, 64, 64), (1, 1000, 2, 128, 128)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_kernels_with_switches_flipped_match_reference(family, shape, dtype, monkeypatch):
    flipped = flip_switches(family, monkeypatch)
    for decay, with_h0 in CASES:
        if family == "delta_rule" and decay != "random":
            continue
        errs = run_case(chunk_kernel(family), family, shape, dtype, decay, with_h0, "cuda")
        bad = {n: e for n, e in errs.items() if e > TOL[dtype]}
        assert not bad, f"{flipped} {decay} h0={with_h0}: {bad} (all: {errs})"


def segmented_outputs(family, shape, dtype, device, segments, monkeypatch, junk=False, decay="random",
                      states=True, bwd_segments=None):
    """The family's kernel's ``o``, final state and every input gradient (with ``h0`` and a
    final-state gradient; ``states=False``: neither, ``o`` and the inputs' gradients only) with its
    walks in ``segments`` segments (``WALK_SEGMENTS`` of delta or gla; cut at any walk size), delta's
    reverse walk in ``bwd_segments`` (its ``BWD_WALK_SEGMENTS``; None: ``segments`` too).
    ``junk``: right after the forward and the backward return, without waiting for the GPU, fill
    fresh memory with NaN and free it (the allocator hands out what the call freed: a walk still
    reading it on its stream would see the NaN)."""
    from blocks.kernels import kernel_module

    mod = kernel_module(family)
    monkeypatch.setattr(mod, "WALK_SEGMENTS", segments)
    if hasattr(mod, "BWD_WALK_SEGMENTS"):
        monkeypatch.setattr(mod, "BWD_WALK_SEGMENTS", bwd_segments)
    monkeypatch.setattr(mod, "WALK_OVERLAP_BELOW_PER_SM", float("inf"))
    B, T, H, K, V = shape
    args, h0 = make_inputs(family, B, T, H, K, V, decay, True, seed=3)
    leaves = [a.to(device=device, dtype=dtype if i < 3 else torch.float32).requires_grad_(True)
              for i, a in enumerate(args)]
    s0 = h0.to(device).requires_grad_(True)
    gen = torch.Generator().manual_seed(4)
    do = torch.randn((B, T, H, V), generator=gen).to(device)
    dht = torch.randn((B, H, K, V), generator=gen).to(device)
    if not states:
        o, _ = chunk_kernel(family)(*leaves)
        return [o.detach(), *torch.autograd.grad((o.float() * do).sum(), leaves)]
    o, ht = chunk_kernel(family)(*leaves, initial_state=s0, output_final_state=True)
    if junk:
        torch.full((1 << 26,), float("nan"), device=device)
    grads = torch.autograd.grad((o.float() * do).sum() + (ht * dht).sum(), leaves + [s0])
    if junk:
        torch.full((1 << 26,), float("nan"), device=device)
    return [o.detach(), ht.detach(), *grads]


@gpu
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule", "gla"])
def test_gpu_walk_segments_give_the_same_bits(family, monkeypatch):
    """The walks in segments on their own stream, beside the per-chunk kernels on the current one
    (``overlap``), must give exactly the unsegmented results: same kernels per chunk, the state
    carried in float32 between segments (gla: its gate cumsum launched per segment too,
    ``SEGMENTED_CUMSUM``). Uneven segments (31 chunks in 4 and 7), bf16, and fresh memory filled with
    NaN right after the forward and the backward return (``junk``)."""
    shape = (2, 1984 - 10, 4, 128, 128)
    decay = "mixed" if family == "gla" else "random"  # gla: steep chunks too (kernels after the walks)
    ref = segmented_outputs(family, shape, torch.bfloat16, "cuda", 1, monkeypatch, decay=decay)
    for segments in (4, 7):
        got = segmented_outputs(family, shape, torch.bfloat16, "cuda", segments, monkeypatch, junk=True,
                                decay=decay)
        for i, (a, b) in enumerate(zip(got, ref)):
            assert torch.equal(a, b), f"{family} segments={segments}: output {i} differs"
    ref = segmented_outputs(family, shape, torch.bfloat16, "cuda", 1, monkeypatch, decay=decay, states=False)
    got = segmented_outputs(family, shape, torch.bfloat16, "cuda", 4, monkeypatch, decay=decay, states=False)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"{family} segments=4 without states: output {i} differs"


@gpu
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("block_v", [32, 64])
def test_gpu_walks_at_both_value_blocks(family, block_v, monkeypatch):
    """The walks' V block depends on the batch and the GPU's SM count (``walk_bv``): the test
    shapes alone would only reach block 32, the benchmark's 64k-token batches 64 (at the launches
    of the modules' tables, e.g. delta's 4-warp forward walk). Both, forced, in bf16."""
    from blocks.kernels import kernel_module

    mod = kernel_module(family)
    monkeypatch.setattr(mod, "walk_bv", fixed_walk_bv(block_v))
    for decay, with_h0 in CASES:
        if family == "delta_rule" and decay != "random":
            continue
        errs = run_case(chunk_kernel(family), family, (2, 300, 2, 128, 128), torch.bfloat16, decay, with_h0, "cuda")
        bad = {n: e for n, e in errs.items() if e > TOL[torch.bfloat16]}
        assert not bad, f"{family} BV={block_v} {decay} h0={with_h0}: {bad} (all: {errs})"


def check_delta_segments_bf16(family, label, monkeypatch, segment_counts=(1, 3)):
    """The delta rule ``family``'s kernel in bf16 against the reference (random decay with ``h0``; the gated
    rule also strong decay without) with its walks in each of ``segment_counts`` segments, the reverse walk
    as the forward one; ``label`` names the settings in a failure."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "WALK_OVERLAP_BELOW_PER_SM", float("inf"))
    monkeypatch.setattr(delta, "BWD_WALK_SEGMENTS", None)
    for segments in segment_counts:
        monkeypatch.setattr(delta, "WALK_SEGMENTS", segments)
        for decay, with_h0 in CASES[:2] if family == "gated_delta_rule" else CASES[:1]:
            errs = run_case(chunk_kernel(family), family, (2, 300, 2, 128, 128), torch.bfloat16, decay, with_h0, "cuda")
            bad = {n: e for n, e in errs.items() if e > TOL[torch.bfloat16]}
            assert not bad, f"{family} {label} segments={segments} {decay}: {bad} (all: {errs})"


@gpu
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("keep_p", [False, True])
@pytest.mark.parametrize("block_v", [32, 64])
def test_gpu_delta_keep_p_forms(family, keep_p, block_v, monkeypatch):
    """``delta.KEEP_P`` on and off (the backward's ``P^T do`` from the forward's kept ``P`` or from ``P``
    formed again) at both walk V blocks, in bf16, against the reference, in one segment and in three."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "KEEP_P", keep_p)
    monkeypatch.setattr(delta, "walk_bv", fixed_walk_bv(block_v))
    check_delta_segments_bf16(family, f"KEEP_P={keep_p} BV={block_v}", monkeypatch)


@gpu
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
def test_gpu_delta_rules_with_correlated_keys(family):
    """Keys of pairwise cosine ~0.9 with beta ~1: TF32 in the chunk inverse's diagonal blocks gave
    an O(0.1-1) error there (CPU emulation, benchmarks/solve_tril_precision.py); the kernels solve
    those blocks in float32 (forward substitution, ``delta.SOLVE_TRIL_DIAG_SUBST``; exact dots with it
    off) and take only the merges in TF32 (bf16 inputs)."""
    errs = run_case(chunk_kernel(family), family, (1, 300, 2, 128, 128), torch.bfloat16, "correlated", True, "cuda")
    bad = {n: e for n, e in errs.items() if not e <= TOL[torch.bfloat16]}
    assert not bad, f"{family}: {bad} (all: {errs})"


@gpu
@pytest.mark.parametrize("family", ["gla", "gated_delta_rule"])
def test_gpu_gate_gradient_under_strong_decay_is_relative(family):
    """The kernels keep the tiny true gate gradient of a strong decay (they leave the
    ``G_x - G_x`` terms out instead of adding and subtracting them): relative error, no floor."""
    kernel = chunk_kernel(family)
    B, T, H, K, V = 1, 130, 2, 64, 64
    args, _ = make_inputs(family, B, T, H, K, V, "strong", False, seed=3)
    ins = [a.cuda().requires_grad_(True) for a in args]
    o, _ = kernel(*ins)
    gk = torch.autograd.grad(o.sum(), ins[3])[0]
    ref_ins = [a.cuda().requires_grad_(True) for a in args]
    o_ref, _ = REFERENCE[family](*ref_ins)
    gk_ref = torch.autograd.grad(o_ref.sum(), ref_ins[3])[0]
    err = ((gk.double() - gk_ref.double()).norm() / gk_ref.double().norm()).item()
    assert err < 1e-3, err


@gpu
def test_gpu_ops_dispatch_to_registered_kernels():
    """``blocks.ops.<family>.chunk`` on CUDA returns exactly what the registered kernel returns
    (the benchmark measures the kernels through the ops)."""
    import blocks.kernels as kernels

    for family in FAMILIES:
        kernel = kernels.get_kernel(family, "chunk")
        if kernel is None:
            continue
        args, h0 = make_inputs(family, 1, 100, 2, 64, 64, "random", True, seed=5)
        ins = [a.cuda() for a in args]
        op = {"gla": gla_ops, "delta_rule": delta_ops, "gated_delta_rule": gated_ops}[family]
        o_op, s_op = op.chunk(*ins, initial_state=h0.cuda(), output_final_state=True)
        o_k, s_k = kernel(*ins, initial_state=h0.cuda(), output_final_state=True)
        assert torch.equal(o_op, o_k) and torch.equal(s_op, s_k), family


# --- CPU, through the Triton interpreter --------------------------------------------------------
INTERPRETER_CASES = [  # family, shape, decay, with_h0
    ("gated_delta_rule", (1, 70, 1, 16, 16), "random", True),
    ("gated_delta_rule", (1, 70, 1, 32, 16), "strong", False),
    ("delta_rule", (2, 40, 1, 16, 32), "none", True),
    ("gla", (1, 70, 1, 16, 16), "random", True),
    ("gla", (1, 70, 1, 32, 16), "strong", False),
    ("gla", (1, 70, 1, 64, 16), "random", True),  # two key slices of the diagonal-block tiles
    ("gla", (1, 70, 1, 32, 16), "steep", True),  # the exact diagonal path with weights that matter
    ("gla", (1, 80, 1, 16, 136), "random", True),  # V > 128: dv in three value blocks
    ("gla", (1, 200, 2, 32, 48), "mixed", True),  # whole-chunk and sub-chunk kernels side by side
]


@interpreter
@pytest.mark.parametrize("family,shape,decay,with_h0", INTERPRETER_CASES,
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
# Under a strong decay the gated bwd_dqkwg's pair decay overflows to inf (then inf * 0 = nan) in the
# pairs j > i, which its selection drops (delta._pair_decay_all says so); NumPy warns about those lanes.
# The results are compared with the reference below, finite values asserted.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning",
                            "ignore:invalid value encountered in multiply:RuntimeWarning")
def test_interpreter_kernel_matches_reference(family, shape, decay, with_h0):
    with checked_memory():  # every load and store inside the launch's tensors
        errs = run_case(chunk_kernel(family), family, shape, torch.float32, decay, with_h0, "cpu")
    # float32 everywhere: agreement to float32 rounding (measured 1e-7 .. 2e-6)
    bad = {n: e for n, e in errs.items() if e > 2e-5}
    assert not bad, f"{family} {decay}: {bad} (all: {errs})"


@interpreter
@pytest.mark.parametrize("family", ["gla", "gated_delta_rule"])
@pytest.mark.parametrize("block_v", [16, 64])
def test_interpreter_walks_at_every_value_block(family, block_v, monkeypatch):
    """The sequential chunk walks pick their V block from the GPU's size (``tiles.walk_bv``: 64, or
    32 for few long sequences); the kernel launch sweep also tries 16. Every choice must give the
    same results and stay inside its tensors."""
    from blocks.kernels import delta, gla

    mod = gla if family == "gla" else delta
    monkeypatch.setattr(mod, "walk_bv", fixed_walk_bv(block_v))
    with checked_memory():
        errs = run_case(chunk_kernel(family), family, (1, 70, 1, 32, 64), torch.float32, "random", True, "cpu")
    bad = {n: e for n, e in errs.items() if e > 2e-5}
    assert not bad, f"{family} BV={block_v}: {bad} (all: {errs})"


@interpreter
@pytest.mark.parametrize("family,shape,decay,with_h0", INTERPRETER_CASES,
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_interpreter_kernels_with_switches_flipped(family, shape, decay, with_h0, monkeypatch):
    flipped = flip_switches(family, monkeypatch)
    with checked_memory():
        errs = run_case(chunk_kernel(family), family, shape, torch.float32, decay, with_h0, "cpu")
    bad = {n: e for n, e in errs.items() if e > 2e-5}
    assert not bad, f"{flipped} {decay}: {bad} (all: {errs})"


# each switch alone too (the sweep times them one at a time; "all flipped" misses e.g. KEEP_H with
# the default KEEP_WU): the first interpreter case of each family
ONE_SWITCH_CASES = [(c, name) for c in {c[0]: c for c in reversed(INTERPRETER_CASES)}.values()
                    for name in (blocks_kernels.kernel_module(c[0]).SWITCHES if HAS_TRITON else ())]


@interpreter
@pytest.mark.parametrize("case,switch", ONE_SWITCH_CASES, ids=lambda x: x if isinstance(x, str) else x[0])
def test_interpreter_kernels_with_one_switch_flipped(case, switch, monkeypatch):
    family, shape, decay, with_h0 = case
    flipped = flip_switches(family, monkeypatch, only=switch)
    with checked_memory():
        errs = run_case(chunk_kernel(family), family, shape, torch.float32, decay, with_h0, "cpu")
    bad = {n: e for n, e in errs.items() if e > 2e-5}
    assert not bad, f"{flipped} {decay}: {bad} (all: {errs})"


@interpreter
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("input_dtype_dots", [True, False])
def test_interpreter_wy_dots_in_half_precision(family, input_dtype_dots, monkeypatch):
    """``delta.WY_INPUT_DTYPE_DOTS`` only acts on 16-bit inputs (float32 ones keep float32
    operands), which the float32 cases above never reach. The interpreter multiplies float16
    correctly (not bfloat16), so float16 inputs run that path here: a float16 ``Ai`` and float16
    dot operands in the WY kernels, against the float64 reference (measured 2e-4 .. 7e-4)."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "WY_INPUT_DTYPE_DOTS", input_dtype_dots)
    with checked_memory():
        errs = run_case(chunk_kernel(family), family, (1, 70, 2, 32, 48), torch.float16, "random", True, "cpu")
    bad = {n: e for n, e in errs.items() if e > 3e-3}
    assert not bad, f"{family} WY_INPUT_DTYPE_DOTS={input_dtype_dots}: {bad} (all: {errs})"
    (_, k, v, *_, beta), _ = make_inputs(family, 1, 70, 2, 32, 48, "random", False, seed=0)
    Ai = delta.wy_fwd(k.half(), v.half(), beta, None)[0]  # the switch decides the stored inverse's dtype
    assert Ai.dtype == (torch.float16 if input_dtype_dots else torch.float32)


class _LaunchSpy:
    """Stands in for a Triton kernel: records each launch's arguments, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((args, kwargs))
            return self.kernel[grid](*args, **kwargs)
        return launch


@interpreter
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
def test_interpreter_delta_walk_segments_give_the_same_bits(family, monkeypatch):
    """Walks in segments (5 chunks: ranges of 1, 2, 2 and of 1 each; the carried state through
    ``h0``/``ht`` of the forward walk and ``dht``/``dh0`` of the reverse one, the per-chunk kernels
    from their segment's first chunk): the unsegmented bits, inside every tensor."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "KEEP_H", True)  # no recomputing walk in the backward to count
    shape = (1, 300, 2, 32, 16)
    ref = segmented_outputs(family, shape, torch.float32, "cpu", 1, monkeypatch)
    for segments in (3, 5):
        spy = _LaunchSpy(delta._fwd_h_kernel)
        monkeypatch.setattr(delta, "_fwd_h_kernel", spy)
        with checked_memory():
            got = segmented_outputs(family, shape, torch.float32, "cpu", segments, monkeypatch)
        assert [args[10:12] for args, _ in spy.calls] == \
            ([(0, 1), (1, 3), (3, 5)] if segments == 3 else [(c, c + 1) for c in range(5)])
        for i, (a, b) in enumerate(zip(got, ref)):
            assert torch.equal(a, b), f"{family} segments={segments}: output {i} differs"


@interpreter
@pytest.mark.parametrize("backward", [1, 2, None])
def test_interpreter_delta_reverse_walk_takes_its_own_segment_count(backward, monkeypatch):
    """``BWD_WALK_SEGMENTS``: the reverse walk in that many segments (None: ``WALK_SEGMENTS``, as the
    forward walk), from the last chunks; the forward walk keeps ``WALK_SEGMENTS``; the same bits."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "KEEP_H", True)
    shape = (1, 300, 2, 32, 16)  # 5 chunks
    ref = segmented_outputs("gated_delta_rule", shape, torch.float32, "cpu", 1, monkeypatch)
    fwd_spy, bwd_spy = _LaunchSpy(delta._fwd_h_kernel), _LaunchSpy(delta._bwd_dh_kernel)
    monkeypatch.setattr(delta, "_fwd_h_kernel", fwd_spy)
    monkeypatch.setattr(delta, "_bwd_dh_kernel", bwd_spy)
    got = segmented_outputs("gated_delta_rule", shape, torch.float32, "cpu", 3, monkeypatch, bwd_segments=backward)
    assert [args[10:12] for args, _ in fwd_spy.calls] == [(0, 1), (1, 3), (3, 5)]
    # the reverse walk's chunk range [C0, C1) is its 13th / 14th argument, launched last chunks first
    expected = {1: [(0, 5)], 2: [(2, 5), (0, 2)], None: [(3, 5), (1, 3), (0, 1)]}[backward]
    assert [args[13:15] for args, _ in bwd_spy.calls] == expected
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"BWD_WALK_SEGMENTS={backward}: output {i} differs"


@interpreter
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("form", ["two kernels", "fused"])
def test_interpreter_delta_program_orders_give_the_same_bits(family, form, monkeypatch):
    """``delta.HEADS_FASTEST`` reorders which program of a per-chunk kernel's grid takes which
    (chunk, batch, head): with two sequences of three heads, a last chunk cut short and the walks in
    two segments (so the per-chunk grids start at a chunk ``C0`` > 0), every output and gradient has
    the bits of the chunk-major order with kkt and solve apart, and every program stays inside its
    tensors, for each kkt / solve form: two kernels, one (``KKT_SOLVE_FUSED``)."""
    from blocks.kernels import delta

    shape = (2, 150, 3, 16, 16)
    monkeypatch.setattr(delta, "KKT_SOLVE_FUSED", False)
    monkeypatch.setattr(delta, "HEADS_FASTEST", False)
    ref = segmented_outputs(family, shape, torch.float32, "cpu", 2, monkeypatch)
    monkeypatch.setattr(delta, "KKT_SOLVE_FUSED", form == "fused")
    monkeypatch.setattr(delta, "HEADS_FASTEST", True)
    with checked_memory():
        got = segmented_outputs(family, shape, torch.float32, "cpu", 2, monkeypatch)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"{family}: output {i} differs"


@gpu
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
def test_gpu_delta_program_orders_give_the_same_bits(family, monkeypatch):
    """The GPU twin of the interpreter test above, at full width (2 sequences of 1000 tokens, a cut last
    chunk, 3 heads of 128, the walks in two segments, bf16): heads-fastest against chunk-major, the same
    bits (with the fused kkt / solve in both: kkt and solve as two kernels compile to other warp counts,
    whose dots may round in another order; the tolerance tests check them). bf16 only: in float32 each
    case compiled for ~70 s on the H200 host (2026-12-04 15:40), which pushed the GPU test step past its cap."""
    from blocks.kernels import delta

    shape = (2, 1000, 3, 128, 128)
    monkeypatch.setattr(delta, "KKT_SOLVE_FUSED", True)
    monkeypatch.setattr(delta, "HEADS_FASTEST", False)
    ref = segmented_outputs(family, shape, torch.bfloat16, "cuda", 2, monkeypatch)
    monkeypatch.setattr(delta, "HEADS_FASTEST", True)
    got = segmented_outputs(family, shape, torch.bfloat16, "cuda", 2, monkeypatch)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"{family}: output {i} differs by {(a.float() - b.float()).abs().max().item():.3g}"


@interpreter
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("keep_p", [False, True])
@pytest.mark.parametrize("segments", [1, 3])
def test_interpreter_delta_keep_p_reads_the_forwards_scores(family, keep_p, segments, monkeypatch):
    """``delta.KEEP_P``: ``_fwd_o_kernel`` stores the chunks' scores ``P`` (``STORE_P``) and the
    backward's ``_bwd_dv_local_kernel`` reads them for ``P^T do`` (``FROM_P``); off, it forms them again.
    Either against the float64 reference, in one segment and in three (a partial last chunk: T=300,
    5 chunks); float16 inputs keep ``P`` in float16."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "KEEP_P", keep_p)
    monkeypatch.setattr(delta, "WALK_SEGMENTS", segments)
    monkeypatch.setattr(delta, "BWD_WALK_SEGMENTS", None)
    monkeypatch.setattr(delta, "WALK_OVERLAP_BELOW_PER_SM", float("inf"))
    spies = {name: _LaunchSpy(getattr(delta, name)) for name in ("_fwd_o_kernel", "_bwd_dv_local_kernel")}
    for name, spy in spies.items():
        monkeypatch.setattr(delta, name, spy)
    with checked_memory():
        errs = run_case(chunk_kernel(family), family, (1, 300, 2, 32, 16), torch.float32, "random", True, "cpu")
    assert max(errs.values()) < 2e-5, errs
    for name, flag in (("_fwd_o_kernel", "STORE_P"), ("_bwd_dv_local_kernel", "FROM_P")):
        assert [kw[flag] for _, kw in spies[name].calls] == [keep_p] * segments, name
    errs = run_case(chunk_kernel(family), family, (1, 130, 2, 32, 48), torch.float16, "random", True, "cpu")
    assert max(errs.values()) < 3e-3, errs


@interpreter
@pytest.mark.parametrize("family,flag", [("gated_delta_rule", "STORE_P"), ("delta_rule", "STORE_P"), ("gla", "STORE_A")])
def test_interpreter_forward_keeps_scores_only_for_a_backward(family, flag, monkeypatch):
    """The scores a forward keeps only for the backward (delta's ``KEEP_P``, gla's ``KEEP_A``) are written
    when a backward will run and not under ``torch.no_grad`` or on inputs that need no gradient
    (evaluation, prefill: ``tiles.backward_will_run``), with the same output either way."""
    from blocks.kernels import delta, gla, tiles

    mod = gla if family == "gla" else delta
    monkeypatch.setattr(mod, "KEEP_A" if family == "gla" else "KEEP_P", True)
    spy = _LaunchSpy(mod._fwd_o_kernel)
    monkeypatch.setattr(mod, "_fwd_o_kernel", spy)
    args, _ = make_inputs(family, 1, 130, 2, 32, 16, "random", False, seed=5)
    kernel = chunk_kernel(family)

    def flags_and_output(*inputs) -> tuple[set, torch.Tensor]:
        """The flag of every output-kernel launch of one forward (one per walk segment), and its output."""
        spy.calls.clear()
        o, _ = kernel(*inputs)
        return {kw[flag] for _, kw in spy.calls}, o.detach()

    with torch.no_grad():
        eval_flags, o_eval = flags_and_output(*args)
    plain_flags, o_plain = flags_and_output(*args)  # grad mode on, but no input requires grad
    train_flags, o_train = flags_and_output(*[a.clone().requires_grad_(True) for a in args])
    assert (eval_flags, plain_flags, train_flags) == ({False}, {False}, {True})
    assert torch.equal(o_eval, o_plain) and torch.equal(o_eval, o_train)
    t = torch.ones(1, requires_grad=True)
    assert tiles.backward_will_run(None, t) and not tiles.backward_will_run(None, torch.ones(1))
    with torch.no_grad():
        assert not tiles.backward_will_run(t)


@interpreter
@pytest.mark.parametrize("keep_h,segmented_cumsum", [(True, False), (False, False), (True, True)])
def test_interpreter_gla_walk_segments_give_the_same_bits(keep_h, segmented_cumsum, monkeypatch):
    """gla's walks in segments (5 chunks: ranges 1, 2, 2 and five of 1), both chunk paths ("mixed":
    head 0's second chunk steep, its sub-chunk kernels after the last segment), the carried state
    through ``h0``/``ht`` and ``dht``/``dh0`` (and without either), the per-chunk kernels from their
    segment's first chunk, with the forward's states kept or recomputed in one walk, and the gate's
    cumsum in one launch or one per segment (``SEGMENTED_CUMSUM``): the unsegmented bits. (Off the
    GPU the segments run one after another: the streams' ordering is the GPU test's.)"""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "KEEP_H", keep_h)
    monkeypatch.setattr(gla, "SEGMENTED_CUMSUM", segmented_cumsum)
    shape = (1, 300, 2, 32, 16)
    ref = segmented_outputs("gla", shape, torch.float32, "cpu", 1, monkeypatch, decay="mixed")
    for segments in (3, 5):
        fwd, bwd = _LaunchSpy(gla._fwd_h_kernel), _LaunchSpy(gla._bwd_dh_kernel)
        chunk, cumsum = _LaunchSpy(gla._bwd_chunk_kernel), _LaunchSpy(gla._cumsum_kernel)
        monkeypatch.setattr(gla, "_fwd_h_kernel", fwd)
        monkeypatch.setattr(gla, "_bwd_dh_kernel", bwd)
        monkeypatch.setattr(gla, "_bwd_chunk_kernel", chunk)
        monkeypatch.setattr(gla, "_cumsum_kernel", cumsum)
        with checked_memory():
            got = segmented_outputs("gla", shape, torch.float32, "cpu", segments, monkeypatch, decay="mixed")
        cuts = [(0, 1), (1, 3), (3, 5)] if segments == 3 else [(c, c + 1) for c in range(5)]
        recompute = [] if keep_h else [(0, 5)]  # the backward's walk for the states: one segment
        assert [args[8:10] for args, _ in fwd.calls] == cuts + recompute
        assert [args[9:11] for args, _ in bwd.calls] == cuts[::-1]
        assert [args[16] for args, _ in chunk.calls] == [c0 for c0, _ in cuts[::-1]]
        assert [args[5] for args, _ in cumsum.calls] == ([c0 for c0, _ in cuts] if segmented_cumsum else [0])
        for i, (a, b) in enumerate(zip(got, ref)):
            assert torch.equal(a, b), f"segments={segments}: output {i} differs"
    # no initial state, no final state: the first and last segments' walks read / write no carry
    ref = segmented_outputs("gla", shape, torch.float32, "cpu", 1, monkeypatch, decay="mixed", states=False)
    got = segmented_outputs("gla", shape, torch.float32, "cpu", 3, monkeypatch, decay="mixed", states=False)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"segments=3 without states: output {i} differs"


@interpreter
@pytest.mark.parametrize("kkt_cumsum", [True, False])
def test_interpreter_gated_gate_cumsum_formed_in_kkt(kkt_cumsum, monkeypatch):
    """``delta.KKT_CUMSUM``: the gated forward launches no ``_cumsum_kernel``, its first kernel
    (``_kkt_kernel``, or ``_kkt_solve_kernel`` with ``KKT_SOLVE_FUSED``) gets the gate and ``CUMSUM``
    and fills ``gc`` (the results against the reference: the switch tests); off, one cumsum launch and
    kkt reading ``gc``. The ungated rule launches neither."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "KKT_CUMSUM", kkt_cumsum)
    first = "_kkt_solve_kernel" if delta.KKT_SOLVE_FUSED else "_kkt_kernel"
    cumsum, kkt = _LaunchSpy(delta._cumsum_kernel), _LaunchSpy(getattr(delta, first))
    monkeypatch.setattr(delta, "_cumsum_kernel", cumsum)
    monkeypatch.setattr(delta, first, kkt)
    with checked_memory():
        errs = run_case(chunk_kernel("gated_delta_rule"), "gated_delta_rule", (1, 70, 2, 32, 16), torch.float32,
                        "random", True, "cpu")
    assert max(errs.values()) < 2e-5, errs
    assert len(cumsum.calls) == (0 if kkt_cumsum else 1)
    assert kkt.calls and all(kw["CUMSUM"] is kkt_cumsum and (args[2] is not None) is kkt_cumsum
                             for args, kw in kkt.calls)
    cumsum.calls.clear()
    kkt.calls.clear()
    run_case(chunk_kernel("delta_rule"), "delta_rule", (1, 70, 2, 32, 16), torch.float32, "random", True, "cpu")
    assert not cumsum.calls and all(kw["CUMSUM"] is False and args[2] is None for args, kw in kkt.calls)


@interpreter
@pytest.mark.parametrize("zero_gate", [True, False])
def test_interpreter_ungated_bwd_dh_runs_on_a_zero_gate(zero_gate, monkeypatch):
    """``delta.UNGATED_DH_ZERO_GATE``: the ungated rule's state-gradient walk is launched as the
    gated kernel (``USE_G``) on an all-zero [B, T, H] gate (measured faster on the H200), with the
    same results; off, as the ungated kernel without a gate."""
    from blocks.kernels import delta

    monkeypatch.setattr(delta, "UNGATED_DH_ZERO_GATE", zero_gate)
    spy = _LaunchSpy(delta._bwd_dh_kernel)
    monkeypatch.setattr(delta, "_bwd_dh_kernel", spy)
    with checked_memory():
        errs = run_case(chunk_kernel("delta_rule"), "delta_rule", (1, 70, 2, 32, 48), torch.float32, "random", True, "cpu")
    assert max(errs.values()) < 2e-5, errs
    assert len(spy.calls) == len(delta._segments(2, 1, torch.empty(0), backward=True))  # one launch per segment
    for args, kwargs in spy.calls:
        gate = args[3]
        assert kwargs["USE_G"] is zero_gate
        if zero_gate:
            assert gate.shape == (1, 70, 2) and gate.dtype == torch.float32 and not gate.any()
        else:
            assert gate is None


@interpreter
@pytest.mark.parametrize("key_slice", [16, 64])
def test_interpreter_gla_backward_per_sub_chunk(key_slice, monkeypatch):
    """``_bwd_sub_kernel`` (one program per 16-row sub-chunk and key slice; score gradients
    recomputed there, the chunk-wide gate term through ``P`` into the reverse cumsum) at a length
    whose last chunk ends in its third sub-chunk (100 = 64 + 36), with a steep decay (the exact
    diagonal path), a random one and none (where the chunk-wide term ``exp(G_C) <S, dS'>`` is not
    negligible); over two key slices (``BWD_SUB_BK`` 16 at K = 32) and over all keys in one."""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "WHOLE_CHUNK", False)  # else only "steep" has chunks for this kernel
    monkeypatch.setattr(gla, "BWD_SUB_BK", key_slice)
    spy = _LaunchSpy(gla._bwd_sub_kernel)
    monkeypatch.setattr(gla, "_bwd_sub_kernel", spy)
    for decay in ("random", "steep", "none"):
        with checked_memory():
            errs = run_case(chunk_kernel("gla"), "gla", (1, 100, 2, 32, 48), torch.float32, decay, True, "cpu")
        assert max(errs.values()) < 2e-5, (decay, errs)
    assert spy.calls and all(kw["BK"] == min(key_slice, 32) for _, kw in spy.calls)


@interpreter
def test_interpreter_gla_scores_on_half_precision_dots(monkeypatch):
    """``gla.INTRA_A_INPUT_DTYPE_DOTS`` only acts on 16-bit inputs. The interpreter multiplies
    float16 correctly (not bfloat16), so float16 inputs run it here (its off-diagonal dots; bf16
    takes the diagonal blocks' too): the scores differ from the float32-operand ones (the switch is
    wired) by float16 rounding, and the whole op stays as close to the float64 reference as with
    float32 operands, also under a decay whose diagonal factors exceed float16's range."""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "WHOLE_CHUNK", False)  # every chunk's scores from _intra_a_kernel
    (q, k, _, gk, *_), _ = make_inputs("gla", 1, 100, 2, 32, 48, "random", False, seed=0)
    q, k = q.half(), k.half()
    gc, span = gla.chunk_cumsum(gk)
    scores, worst = {}, {}
    for lowp in (True, False):
        monkeypatch.setattr(gla, "INTRA_A_INPUT_DTYPE_DOTS", lowp)
        scores[lowp] = gla.intra_a(q, k, gc, span, 32 ** -0.5, gla.chunk_paths())
        with checked_memory():
            errs = run_case(chunk_kernel("gla"), "gla", (1, 100, 2, 32, 48), torch.float16, "random", True, "cpu")
        worst[lowp] = max(errs.values())
    gap = (scores[True] - scores[False]).abs().max().item()
    assert 0 < gap < 1e-2 * scores[False].abs().max().item(), gap
    assert worst[True] < 3e-3 and worst[True] < 2 * worst[False] + 1e-4, worst
    # the diagonal blocks' factors reach exp(SPAN_MAX): float16 keeps float32 operands there (as
    # float16 dots they overflowed to inf/NaN under this decay)
    monkeypatch.setattr(gla, "INTRA_A_INPUT_DTYPE_DOTS", True)
    errs = run_case(chunk_kernel("gla"), "gla", (1, 64, 1, 32, 16), torch.float16, "moderate", False, "cpu")
    assert max(errs.values()) < 3e-3, errs


@interpreter
def test_interpreter_gla_chunk_spans_pick_each_chunks_path(monkeypatch):
    """``_cumsum_kernel``'s ``span`` per chunk is the largest range of the chunk-local cumsum over
    one key channel (rows past ``T`` left out), and it alone decides the path: with the sub-chunk
    kernels stubbed out (launched, doing nothing), a call whose chunks all span less than
    ``SPAN_MAX_CHUNK`` still matches the reference, so the whole-chunk kernels computed every
    output; one with a steep chunk then does not, and with them in place it does."""
    from blocks.kernels import gla

    (*_, gk), _ = make_inputs("gla", 1, 200, 2, 32, 48, "mixed", False, seed=0)
    gc, span = gla.chunk_cumsum(gk)
    want = torch.empty(2, 4)  # [B*H, NT]; the last chunk has 8 rows
    for h in range(2):
        for t in range(4):
            G = gk[0, t * 64:t * 64 + 64, h].cumsum(0)
            want[h, t] = (G.amax(0) - G.amin(0)).max()
    assert torch.allclose(span, want, rtol=1e-5, atol=1e-4), (span, want)
    assert span[0, 1] > gla.SPAN_MAX_CHUNK and (span[0, [0, 2, 3]] < gla.SPAN_MAX_CHUNK).all()
    assert 55 < span[1, 0] < gla.SPAN_MAX_CHUNK  # head 1: 0.93 a step, 63 steps

    class _Stub:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    for name in ("_intra_a_kernel", "_bwd_sub_kernel", "_rev_cumsum_kernel"):
        monkeypatch.setattr(gla, name, _Stub())
    errs = run_case(chunk_kernel("gla"), "gla", (1, 200, 2, 32, 48), torch.float32, "random", True, "cpu")
    assert max(errs.values()) < 2e-5, errs
    torch.manual_seed(0)
    with pytest.raises(AssertionError):  # garbage (or NaN) where the stubs should have written
        errs = run_case(chunk_kernel("gla"), "gla", (1, 200, 2, 32, 48), torch.float32, "mixed", True, "cpu")
        assert max(errs.values()) < 2e-5, errs
    monkeypatch.undo()
    errs = run_case(chunk_kernel("gla"), "gla", (1, 200, 2, 32, 48), torch.float32, "mixed", True, "cpu")
    assert max(errs.values()) < 2e-5, errs


@interpreter
@pytest.mark.parametrize("units", [4, 8])
def test_interpreter_gla_steep_check_first_gives_the_same_bits(units, monkeypatch):
    """``STEEP_CHECK_FIRST``: a sub-chunk kernel's program reads its units' spans at once and returns
    when none is steep. With ``units`` per program (``STEEP_UNITS``; 4: a chunk's sub-chunks per
    program, 8: two chunks, the steep one second) over 6 chunks, the last partial (its program's
    units past the sequence masked), only head 0's second chunk steep ("mixed"): the outputs and
    every gradient are the same bits as with the per-unit checks alone, and match the reference."""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "STEEP_UNITS", units)
    shape = (1, 330, 2, 32, 48)
    got = {}
    for first in (False, True):
        monkeypatch.setattr(gla, "STEEP_CHECK_FIRST", first)
        got[first] = segmented_outputs("gla", shape, torch.float32, "cpu", 1, monkeypatch, decay="mixed")
    for i, (a, b) in enumerate(zip(got[False], got[True])):
        assert torch.equal(a, b), f"units={units}: output {i} differs"
    with checked_memory():
        errs = run_case(chunk_kernel("gla"), "gla", shape, torch.float32, "mixed", True, "cpu")
    assert max(errs.values()) < 2e-5, errs


@interpreter
@pytest.mark.parametrize("dv_separate", [False, True])
@pytest.mark.parametrize("keep_a", [False, True], ids=["recompute_a", "keep_a"])
def test_interpreter_gla_whole_chunk_over_key_slices(dv_separate, keep_a, monkeypatch):
    """``_bwd_chunk_kernel`` runs one program per key slice: with ``BWD_CHUNK_BK`` 16 at K = 40 (three
    slices, the last half masked, each forming the chunk's scores over all of them) and V = 136
    (three value blocks: slice i writes dv's block i), on both paths (the "mixed" decay); and
    ``_fwd_o_kernel`` over key slices of 16 (``FWD_O_BK``); dv from ``_bwd_chunk_kernel`` or from
    ``_bwd_dv_kernel`` (``BWD_DV_SEPARATE``), on scores formed again or kept from the forward
    (``KEEP_A``: ``_fwd_o_kernel`` stores them over its key slices). The interpreter cases above
    have one slice (K <= 64) and powers of two."""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "BWD_DV_SEPARATE", dv_separate)
    monkeypatch.setattr(gla, "KEEP_A", keep_a)
    monkeypatch.setattr(gla, "BWD_CHUNK_BK", 16)
    monkeypatch.setattr(gla, "FWD_O_BK", 16)
    with checked_memory():
        errs = run_case(chunk_kernel("gla"), "gla", (1, 130, 2, 40, 136), torch.float32, "mixed", True, "cpu")
    assert max(errs.values()) < 2e-5, errs


@interpreter
@pytest.mark.parametrize("keep_a", [False, True], ids=["recompute_a", "keep_a"])
def test_interpreter_gla_keep_a_skips_the_backwards_scores(keep_a, monkeypatch):
    """With ``KEEP_A`` the backward reads the forward's scores (``intra_a`` runs once, in the
    forward, and the kept ``A`` is in the activations' dtype); without it the backward forms the
    steep chunks' again (a second call, float32)."""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "KEEP_A", keep_a)
    made = []
    real = gla.intra_a

    def counted(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(gla, "intra_a", counted)
    errs = run_case(chunk_kernel("gla"), "gla", (1, 130, 2, 32, 48), torch.float16, "mixed", True, "cpu")
    assert max(errs.values()) < 3e-3, errs
    assert [a.dtype for a in made] == ([torch.float16] if keep_a else [torch.float32, torch.float32])


@interpreter
@pytest.mark.parametrize("shape,decay,with_h0", [c[1:] for c in INTERPRETER_CASES if c[0] == "gla"],
                         ids=lambda x: "x".join(map(str, x)) if isinstance(x, tuple) else str(x))
def test_interpreter_gla_sub_chunk_path_on_every_case(shape, decay, with_h0, monkeypatch):
    """The gla cases above mostly run the whole-chunk kernels (only "strong", "steep" and one chunk
    of "mixed" are steep); here every chunk takes the sub-chunk kernels (``WHOLE_CHUNK`` off),
    the path steep gates take."""
    from blocks.kernels import gla

    monkeypatch.setattr(gla, "WHOLE_CHUNK", False)
    with checked_memory():
        errs = run_case(chunk_kernel("gla"), "gla", shape, torch.float32, decay, with_h0, "cpu")
    assert max(errs.values()) < 2e-5, (decay, errs)


# --- CPU, anywhere triton imports ---------------------------------------------------------------
@needs_triton
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_gate_shape_is_a_one_line_error(family):
    args, _ = make_inputs(family, 1, 8, 2, 16, 16, "random", False, seed=0)
    args[-1] = args[-1][:, :4]  # gk / beta with the wrong length
    name = "gk" if family == "gla" else "beta"
    with pytest.raises(ValueError, match=name):
        chunk_kernel(family)(*args)


@interpreter
def test_interpreter_walk_forms_transition_walk_gives_the_walks_states():
    """``benchmarks/walk_forms.py``'s screen times a walk it does not ship; its states must still be
    the delta rule's (``h <- h - N h + k^T u`` against ``delta.fwd_h``), or the timing would compare
    a wrong kernel: float32, 200 tokens (a ragged last chunk), K 32, V block 16."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        forms = importlib.import_module("walk_forms")
    finally:
        sys.path.pop(0)
    assert forms.check() < 1e-5


@interpreter
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule", "gla"])
def test_interpreter_kernels_read_only_memory_they_wrote(family, monkeypatch):
    """Every buffer the op allocates uninitialised (``torch.empty``, ``empty_like``, ``new_empty``)
    filled with NaN first: the outputs and gradients still match the reference, so no kernel reads
    an element no kernel wrote. With ``SKIP_UPPER_BLOCKS`` the strictly upper blocks of delta's ``A``
    and of gla's kept scores are never written (and must never be read): NaN there would show."""
    from blocks.kernels import kernel_module

    assert kernel_module(family).SKIP_UPPER_BLOCKS
    empty, empty_like, new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan(empty_like(*a, **kw)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **kw: nan(new_empty(self, *a, **kw)))
    errs = run_case(chunk_kernel(family), family, (1, 100, 2, 32, 48), torch.float32, "random", True, "cpu")
    bad = {n: e for n, e in errs.items() if not e <= TOL[torch.float32]}
    assert not bad, f"{family}: {bad} (all: {errs})"
