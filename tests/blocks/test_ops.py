"""blocks.ops: recurrent vs chunk vs step agree, forward and backward; long sequences stay finite.

The comparisons run through ``blocks.ops.agreement`` (also used by benchmarks/ops_agreement.py):
seeded float32 inputs, a random projection of ``o`` and the final state as the loss, and relative
errors ``||a - b|| / ||b||`` against the recurrent loop, checked per tensor.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from blocks import ops
from blocks.ops import agreement
from blocks.ops.agreement import LINEAR_FAMILIES, Case

# Per-tensor tolerances on the relative error vs the recurrent loop (float32). Measured worst
# cases are ~1e-6 (gate gradients, which sum over a chunk) and <= 7e-7 elsewhere.
TOL = {
    "o": 5e-6,
    "state": 5e-6,
    "state.1": 5e-6,
    "grad.q": 5e-6,
    "grad.k": 5e-6,
    "grad.v": 5e-6,
    "grad.g": 2e-5,
    "grad.gk": 2e-5,
    "grad.beta": 1e-5,
    "grad.initial_state": 5e-6,
    "grad.initial_state.0": 5e-6,
    "grad.initial_state.1": 5e-6,
}


def assert_agree(case: Case, forms=("chunk", "step")) -> None:
    errors = agreement.compare(case, forms)
    bad = [
        f"{form} {name}: rel err {err:.2e} > {TOL[name]:.0e}"
        for form, errs in errors.items()
        for name, err in errs.items()
        if not err <= TOL[name]  # also catches NaN
    ]
    assert not bad, f"{case}: " + "; ".join(bad)


@pytest.mark.parametrize("initial_state", [False, True], ids=["h0=none", "h0"])
@pytest.mark.parametrize("T", [1, 7, 64, 100])
@pytest.mark.parametrize("family", LINEAR_FAMILIES)
def test_linear_forms_agree(family, T, initial_state):
    # chunk_size 16: T=7 is one partial chunk, 64 exactly four, 100 six and a partial one.
    assert_agree(Case(family, T, initial_state=initial_state, chunk_size=16, seed=T))


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
@pytest.mark.parametrize("family", LINEAR_FAMILIES)
def test_linear_chunk_sizes(family, chunk_size):
    # 1: every position its own chunk; 5: not a power of two (gla sub-chunks of 5);
    # 64 > T: one padded chunk. Uneven K and V catch transposed state layouts.
    assert_agree(Case(family, 37, K=6, V=10, H=3, chunk_size=chunk_size, seed=chunk_size), forms=("chunk",))


@pytest.mark.parametrize("decay", ["strong", "none"])
@pytest.mark.parametrize("family", ["simple_gla", "gla", "gated_delta_rule"])
def test_gated_forms_agree_at_extreme_decay(family, decay):
    # Strong decay: gate gradients are ~1e-12 and must still match to float32 rounding.
    assert_agree(Case(family, 50, chunk_size=16, decay=decay, seed=3))


@pytest.mark.parametrize("initial_state", [False, True], ids=["empty", "cache"])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("kv_heads", [None, 1], ids=["mha", "gqa"])
@pytest.mark.parametrize("T", [1, 7, 64, 100])
def test_softmax_forms_agree(T, kv_heads, window, initial_state):
    assert_agree(Case("softmax", T, H=4, kv_heads=kv_heads, window=window, initial_state=initial_state,
                      state_len=9, seed=T + window))


@pytest.mark.parametrize("decay", ["strong", "none", -1e4])
@pytest.mark.parametrize("family", LINEAR_FAMILIES)
def test_chunk_stable_at_4096(family, decay):
    """Forward and backward of the training form stay finite over 4096 steps."""
    case = Case(family, 4096, B=1, H=1, K=8, V=8, chunk_size=64, decay=decay)
    out = agreement.forward_backward(case, "chunk")
    for name, t in out.items():
        assert torch.isfinite(t).all(), f"{family} decay={decay}: {name} not finite"
    assert out["o"].abs().max() > 0 and out["grad.q"].abs().max() > 0


@pytest.mark.slow
@pytest.mark.parametrize("family, decay", [("gla", "strong"), ("gated_delta_rule", "none")])
def test_chunk_matches_recurrent_at_4096(family, decay):
    """Long-sequence agreement (7 s each: the reference loop is 4096 Python steps, fwd and bwd)."""
    assert_agree(Case(family, 4096, B=1, H=1, K=8, V=8, chunk_size=64, decay=decay), forms=("chunk",))


def _bf16_args(family, T=20):
    case = Case(family, T, dtype=torch.bfloat16, seed=11)
    args, state = agreement.make_inputs(case)
    return case, args, state


@pytest.mark.parametrize("family", LINEAR_FAMILIES)
def test_linear_bf16_inputs(family):
    """bf16 activations: o comes back in bf16, the state in float32, both close to float32."""
    case, args, state = _bf16_args(family)
    ref, ref_state = agreement.run_form(
        case, "recurrent", {n: t.float() for n, t in args.items()}, state
    )
    for form in ("chunk", "step"):
        o, final = agreement.run_form(case, form, args, state)
        assert o.dtype == torch.bfloat16 and final.dtype == torch.float32, form
        assert agreement.rel_error(o, ref) < 1e-2, form
        assert agreement.rel_error(final, ref_state) < 1e-5, form  # float32 math on bf16-exact inputs


def test_softmax_bf16_keeps_cache_dtype():
    case, args, state = _bf16_args("softmax")
    o, (kc, vc) = ops.softmax.chunk(*args.values(), initial_state=state, output_final_state=True)
    assert o.dtype == kc.dtype == vc.dtype == torch.bfloat16
    ref, _ = ops.softmax.recurrent(*(t.float() for t in args.values()),
                                   initial_state=tuple(t.float() for t in state))
    assert agreement.rel_error(o, ref) < 1e-2


def test_softmax_cache_and_backend():
    q, k, v = torch.randn(2, 10, 4, 8), torch.randn(2, 10, 2, 8), torch.randn(2, 10, 2, 6)
    _, (kc, vc) = ops.softmax.chunk(q, k, v, output_final_state=True)
    assert kc.shape == (2, 10, 2, 8) and vc.shape == (2, 10, 2, 6)
    assert ops.softmax.backend_used() in {"flash", "efficient", "math", "cudnn"}
    _, (kc, vc) = ops.softmax.chunk(q, k, v, window=4, initial_state=(kc, vc), output_final_state=True)
    assert torch.equal(kc, k[:, -4:]) and torch.equal(vc, v[:, -4:])
    o, (kc, vc) = ops.softmax.step(q[:, 0], k[:, 0], v[:, 0], state=(kc, vc), window=4)
    assert o.shape == (2, 4, 6) and kc.shape == (2, 4, 2, 8) and torch.equal(kc[:, -1], k[:, 0])
    assert ops.softmax.last_backend == ops.softmax.backend_used()


@pytest.mark.parametrize("window", [0, 3])
def test_softmax_backend_fall_through(window):
    """The CUDA backend search, run on CPU: cuDNN and memory-efficient SDPA decline CPU tensors,
    the next backend runs, is reported, and is tried first next time."""
    from blocks.ops import softmax

    q, k, v = torch.randn(1, 6, 4, 8), torch.randn(1, 6, 2, 8), torch.randn(1, 6, 2, 8)
    mask = torch.ones(6, 6, dtype=torch.bool).tril() & ~torch.ones(6, 6, dtype=torch.bool).tril(-window)
    args = dict(attn_mask=mask if window else None, is_causal=not window, scale=None, enable_gqa=True)
    ref, _ = softmax.recurrent(q, k, v, window=window)
    for _ in range(2):
        o = softmax._attend_fastest(q, k, v, args, window, ("cudnn", "efficient", "flash_attn", "math"))
        assert softmax.last_backend == "math"
        torch.testing.assert_close(o, ref)
    assert "math" in softmax._chosen.values()


def test_gates_broadcast_per_head_not_per_batch():
    """A decay that differs per head acts on that head only (catches a transposed gate)."""
    B, T, H, K, V = 1, 9, 2, 4, 4
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    g = torch.zeros(B, T, H)
    g[..., 1] = -1e4  # head 1 forgets everything before the current token
    o, _ = ops.simple_gla.chunk(q, k, v, g, chunk_size=4)
    no_decay, _ = ops.linear_attn.chunk(q, k, v, chunk_size=4)
    torch.testing.assert_close(o[:, :, 0], no_decay[:, :, 0])
    only_current = K ** -0.5 * (q * k).sum(-1, keepdim=True) * v
    torch.testing.assert_close(o[:, :, 1], only_current[:, :, 1])


def test_delta_rule_writes_value_for_unit_beta():
    """With beta = 1 and a unit key, reading that key back returns exactly the written value."""
    B, H, K, V = 1, 1, 4, 3
    k = ops.l2norm(torch.randn(B, H, K))
    v = torch.randn(B, H, V)
    state = torch.randn(B, H, K, V)
    _, state = ops.delta_rule.step(k, k, v, torch.ones(B, H), state=state)
    torch.testing.assert_close(torch.einsum("bhk,bhkv->bhv", k, state), v, atol=1e-5, rtol=1e-5)


def test_l2norm():
    x = torch.randn(3, 5, 2, 16, dtype=torch.bfloat16)
    y = ops.l2norm(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float().norm(dim=-1), torch.ones(3, 5, 2), atol=1e-2, rtol=0)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda q, k, v: ops.simple_gla.chunk(q, k, v, torch.zeros(2, 5, 4)), r"^g: must have shape \(2, 5, 3\)"),
        (lambda q, k, v: ops.gla.recurrent(q, k, v, torch.zeros(2, 5, 3)), r"^gk: must have shape"),
        (lambda q, k, v: ops.delta_rule.chunk(q, k, v, torch.ones(2, 5, 3), chunk_size=0), r"^chunk_size: must"),
        (lambda q, k, v: ops.linear_attn.chunk(q, k[:, :4], v), r"^k: must have the shape of q"),
        (lambda q, k, v: ops.linear_attn.recurrent(q, k, v, initial_state=torch.zeros(2, 3, 4, 4)),
         r"^initial_state: must have shape \(2, 3, 4, 6\)"),
        (lambda q, k, v: ops.softmax.chunk(q, k[:, :, :2], v[:, :, :2]), r"^k: query heads 3 must be a multiple"),
        (lambda q, k, v: ops.softmax.recurrent(q, k, v, window=-1), r"^window: must be an integer >= 0"),
        (lambda q, k, v: ops.gla.chunk(q[:, :0], k[:, :0], v[:, :0], q[:, :0]), r"^q: must have at least one"),
        (lambda q, k, v: ops.softmax.chunk(q[:, :0], k[:, :0], v[:, :0]), r"^q: must have at least one"),
        (lambda q, k, v: ops.gated_delta_rule.step(q[:, 0], k[:, 0], v[:, 0], torch.zeros(2, 3), torch.ones(2)),
         r"^beta: must have shape \(2, 3\)"),
    ],
)
def test_bad_arguments_name_the_tensor(call, match):
    q, k, v = torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 4), torch.randn(2, 5, 3, 6)
    with pytest.raises(ValueError, match=match):
        call(q, k, v)


@pytest.mark.parametrize("form", ["chunk", "step"])
@pytest.mark.parametrize("family", agreement.FAMILIES)
def test_cuda_dispatch_hands_every_argument_to_the_kernel(monkeypatch, family, form):
    """The GPU hook: a registered kernel gets the op's exact arguments and its result is returned."""
    mod = importlib.import_module(f"blocks.ops.{family}")
    calls = []

    def kernel(*args, **kwargs):
        calls.append((args, kwargs))
        return "kernel result"

    asked = []
    monkeypatch.setattr(mod, "cuda_kernel", lambda fam, f, x, *inputs: asked.append((fam, f)) or kernel)
    args, state = agreement.make_inputs(Case(family, 5))
    tensors = list(args.values()) if form == "chunk" else [t[:, 0] for t in args.values()]
    extra = {"window": 3} if family == "softmax" else {}
    if form == "chunk":
        if family != "softmax":
            extra["chunk_size"] = 8
        result = mod.chunk(*tensors, scale=0.5, initial_state=state, output_final_state=True, **extra)
        expected = dict(scale=0.5, initial_state=state, output_final_state=True, **extra)
    else:
        result = mod.step(*tensors, state=state, scale=0.5, **extra)
        expected = dict(state=state, scale=0.5, **extra)
    assert result == "kernel result" and asked == [(family, form)] and len(calls) == 1
    got_args, got_kwargs = calls[0]
    assert len(got_args) == len(tensors) and all(a is b for a, b in zip(got_args, tensors))
    assert got_kwargs.keys() == expected.keys()
    assert all(got_kwargs[key] is expected[key] or got_kwargs[key] == expected[key] for key in expected)
    if family == "softmax":
        assert mod.last_backend == "kernel"


def test_no_kernel_dispatch_on_cpu():
    from blocks.ops.utils import cuda_kernel

    assert cuda_kernel("simple_gla", "chunk", torch.zeros(1)) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", agreement.FAMILIES)
def test_cuda_forms_match_cpu_recurrent(family):
    """On CUDA, chunk/step (a registered kernel, or the PyTorch form) match the CPU reference."""
    case = Case(family, 100, H=4, K=32, V=32, chunk_size=64, seed=5)
    ref = agreement.forward_backward(case, "recurrent", device="cpu")
    for form in ("chunk", "step"):
        got = agreement.forward_backward(case, form, device="cuda")
        for name, t in ref.items():
            err = agreement.rel_error(got[name].cpu(), t)
            assert err < 1e-3, f"{family}.{form} {name}: rel err {err:.2e}"  # TF32 matmuls allowed


def test_step_kernels_are_not_used_while_a_gradient_is_needed(monkeypatch):
    """The ``step`` kernels and the decode mixer have no backward: ``cuda_kernel`` offers one only
    when no input needs a gradient (or autograd is off); the chunk kernels, autograd functions, always."""
    import blocks.kernels
    from blocks.ops.utils import cuda_kernel

    class OnCuda:  # a stand-in for a CUDA tensor: cuda_kernel reads these two attributes
        is_cuda = True

        def __init__(self, requires_grad: bool) -> None:
            self.requires_grad = requires_grad

    monkeypatch.setattr(blocks.kernels, "get_kernel", lambda family, form: f"{family}.{form}")
    plain, needs = OnCuda(False), OnCuda(True)
    assert cuda_kernel("gla", "step", plain, plain, None) == "gla.step"
    assert cuda_kernel("gla", "step", plain, needs) is None and cuda_kernel("gla", "step", needs) is None
    with torch.no_grad():
        assert cuda_kernel("gla", "step", plain, needs) == "gla.step"
    assert cuda_kernel("gla", "chunk", needs) == "gla.chunk"
    assert cuda_kernel("mixer", "decode", plain, needs) is None and cuda_kernel("mixer", "decode", plain) == "mixer.decode"
    assert cuda_kernel("gla", "step", torch.zeros(1)) is None  # not on CUDA
