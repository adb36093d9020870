"""The delta rules' reverse state walk in its hand-scheduled Hopper form (``blocks.kernels.dh_walk_gluon``,
``delta.DH_WALK_GLUON``) against the Triton kernel it replaces, and the ops' gradients with it on against off.
Gluon kernels do not run in Triton's interpreter: these tests need an H100 / H200 and skip cleanly elsewhere; on
CPU ``test_kernels_host_triton.py`` compiles the kernel for sm_90 (``kernels_aot_regs.py``'s jobs).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

HAS_TRITON = importlib.util.find_spec("triton") is not None
HOPPER = HAS_TRITON and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
hopper = pytest.mark.skipif(not HOPPER, reason="needs an H100 / H200 (warpgroup MMA) and Triton")
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="needs triton")

H, K, V = 2, 128, 128


def _draw(shape, seed, scale=1.0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).cuda()


def _inputs(B, T, gated, seed):
    """The walk's inputs: ``q, k, w [B, T, H, K]``, ``do, dv [B, T, H, V]`` bf16, ``gc`` the chunk-local cumsum
    of mild log decays (float32, None ungated), ``dht`` float32 ``[B, H, K, V]``."""
    x = {name: _draw((B, T, H, K if name in ("q", "k", "w") else V), seed + i, scale=0.5 if name != "w" else 0.1)
         for i, name in enumerate(("q", "k", "w", "do", "dv"))}
    x["gc"] = None
    if gated:
        g = F.logsigmoid(torch.randn(B, T, H, generator=torch.Generator().manual_seed(seed + 9)) + 3.0) / 4
        x["gc"] = g.view(B, T // 64, 64, H).cumsum(2).view(B, T, H).contiguous().cuda()
    x["dht"] = _draw((B, H, K, V), seed + 11, scale=0.1, dtype=torch.float32)
    return x


def _outputs(B, T):
    NT = T // 64
    return {"dv2": torch.full((B, T, H, V), float("nan"), dtype=torch.bfloat16, device="cuda"),
            "dh": torch.full((B, NT, H, K, V), float("nan"), dtype=torch.bfloat16, device="cuda"),
            "dh0": torch.full((B, H, K, V), float("nan"), dtype=torch.float32, device="cuda")}


def _triton(x, out, T, c0, c1, BV, scale, carry):
    from blocks.kernels import delta

    B = x["q"].shape[0]
    delta._bwd_dh_kernel[(V // BV, B * H)](
        x["q"], x["k"], x["w"], x["gc"], x["do"], x["dv"], out["dv2"], out["dh"], carry, out["dh0"], scale, T, T // 64,
        c0, c1, H=H, K=K, V=V, BT=64, BK=K, BV=BV, USE_G=x["gc"] is not None, USE_DHT=carry is not None,
        STORE_DH0=True, DOT_PREC=delta._prec(x["q"]), **delta._launch(delta.LAUNCH, "bwd_dh", x["q"]))


def _gluon(x, out, c0, c1, BV, scale, carry):
    from blocks.kernels import dh_walk_gluon

    dh_walk_gluon.bwd_dh(x["q"], x["k"], x["w"], x["gc"], x["do"], x["dv"], out["dv2"], out["dh"], carry,
                         out["dh0"], scale, c0, c1, BV)


def _close(a, b, what):
    """Within bf16 rounding of the larger: the two kernels sum the same products in another order and the
    Gluon walk accumulates ``-w^T dv2`` where Triton subtracts ``w^T dv2``."""
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all() and torch.isfinite(b).all(), f"{what}: not finite"
    err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-6)
    assert err < 2e-2, f"{what}: max difference {err:.2e} of the largest value"


@hopper
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("BV", [32, 64])
@pytest.mark.parametrize("B,T,c0,c1,with_dht", [(2, 256, 0, 4, True), (1, 1024, 3, 11, False), (3, 128, 1, 2, True),
                                                 (2, 2048, 0, 32, True)])
def test_gluon_walk_matches_the_triton_walk(gated, BV, B, T, c0, c1, with_dht):
    """``dh`` of every walked chunk, ``dv2`` of its rows and the carried gradient out (``dh0``) as the Triton
    kernel gives them (value blocks 32 and 64), for chunk ranges from the start, the middle and the end of the
    sequences, with a carried gradient in or none, gated or not; chunks outside the range left untouched."""
    x = _inputs(B, T, gated, seed=5)
    scale = K ** -0.5
    carry = x["dht"] if with_dht else None
    ref, got = _outputs(B, T), _outputs(B, T)
    _triton(x, ref, T, c0, c1, BV, scale, carry)
    _gluon(x, got, c0, c1, BV, scale, carry)
    torch.cuda.synchronize()
    rows = slice(c0 * 64, c1 * 64)
    _close(got["dh"][:, c0:c1], ref["dh"][:, c0:c1], "dh")
    _close(got["dv2"][:, rows], ref["dv2"][:, rows], "dv2")
    _close(got["dh0"], ref["dh0"], "dh0")
    assert torch.isnan(got["dh"][:, :c0].float()).all() and torch.isnan(got["dh"][:, c1:].float()).all()
    assert torch.isnan(got["dv2"][:, :c0 * 64].float()).all() and torch.isnan(got["dv2"][:, c1 * 64:].float()).all()


@hopper
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("setting", [True, 64])
@pytest.mark.parametrize("B,T", [(2, 1024), (1, 4096), (1, 1000)])
def test_ops_gradients_with_the_gluon_walk(family, setting, B, T, monkeypatch):
    """The kernel ops' gradients (and output, final state) with ``DH_WALK_GLUON`` on against off; the Gluon
    walk is taken where ``eligible`` holds (not at ``T = 1000``, a chunk cut short), at the walk's V block (32
    for these few heads) or, with 64, at 64."""
    from blocks.kernels import delta, dh_walk_gluon

    calls = []
    real = dh_walk_gluon.bwd_dh

    def counted(*args):
        calls.append(args[-1])  # the value block
        return real(*args)

    monkeypatch.setattr(dh_walk_gluon, "bwd_dh", counted)
    gen = torch.Generator().manual_seed(3)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 3.0) if family == "gated_delta_rule" else None
    h0 = 0.1 * torch.randn(B, H, K, V, generator=gen)
    do, dht = torch.randn(B, T, H, V, generator=gen), torch.randn(B, H, K, V, generator=gen)

    def run(on):
        monkeypatch.setattr(delta, "DH_WALK_GLUON", on)
        leaves = [t.cuda().to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]
        leaves += [beta.cuda().requires_grad_(True)] + ([g.cuda().requires_grad_(True)] if g is not None else [])
        s0 = h0.cuda().requires_grad_(True)
        args = leaves[:3] + ([leaves[4]] if g is not None else []) + [leaves[3]]
        fn = delta.gated_delta_rule_chunk if g is not None else delta.delta_rule_chunk
        o, ht = fn(*args, initial_state=s0, output_final_state=True)
        grads = torch.autograd.grad((o.float() * do.cuda()).sum() + (ht * dht.cuda()).sum(), leaves + [s0])
        return [o, ht, *grads]

    ref = run(False)
    assert not calls
    got = run(setting)
    assert bool(calls) == (T % 64 == 0) and all(bv == (64 if setting == 64 else 32) for bv in calls)
    for i, (a, b) in enumerate(zip(got, ref)):
        _close(a, b, f"{family} output {i}")


@needs_triton
def test_eligible_names_what_the_gluon_walk_takes():
    """``eligible``: CUDA sm_90 16-bit inputs, K = 128, whole chunks, V block 32 or 64 and V a multiple of it;
    a CPU tensor never (so the interpreter tests always run the Triton walk)."""
    from blocks.kernels import dh_walk_gluon

    assert not dh_walk_gluon.eligible(torch.zeros(1, 64, 2, 128, dtype=torch.bfloat16), 128, 32)
    if HOPPER:
        q = torch.zeros(1, 128, 2, 128, dtype=torch.bfloat16, device="cuda")
        assert dh_walk_gluon.eligible(q, 128, 32) and dh_walk_gluon.eligible(q, 128, 64)
        assert not dh_walk_gluon.eligible(q.float(), 128, 32)
        assert not dh_walk_gluon.eligible(q[:, :100], 128, 32)  # a chunk cut short
        assert not dh_walk_gluon.eligible(q[..., :64], 128, 32)  # K = 64
        assert not dh_walk_gluon.eligible(q, 80, 32) and not dh_walk_gluon.eligible(q, 128, 16)
