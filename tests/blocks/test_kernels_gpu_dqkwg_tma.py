"""The delta rules' ``bwd_dqkwg`` in its hand-scheduled Hopper form (``blocks.kernels.delta_gluon``,
``delta.DQKWG_TMA``) against the Triton kernel it replaces, and the ops' gradients with it on against
off. Gluon kernels do not run in Triton's interpreter: these tests need an H100 / H200 and skip
cleanly elsewhere; on CPU ``test_kernels_host_triton.py`` compiles the kernel for sm_90.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

HAS_TRITON = importlib.util.find_spec("triton") is not None
HOPPER = HAS_TRITON and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
hopper = pytest.mark.skipif(not HOPPER, reason="needs an H100 / H200 (warpgroup MMA) and Triton")

H, K, V = 2, 128, 128


def _draw(shape, seed, dtype=torch.bfloat16, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype).cuda()


def _chunk_cumsum(g: torch.Tensor) -> torch.Tensor:
    """``[B, T, H]`` log decays -> their cumsum within chunks of 64 (``delta.chunk_cumsum``'s)."""
    B, T, Hh = g.shape
    return g.view(B, T // 64, 64, Hh).cumsum(2).view(B, T, Hh).contiguous()


def _inputs(B, T, gated, decay, seed):
    """``bwd_dqkwg``'s inputs: activations ``[B, T, H, *]`` and chunk states ``[B, T/64, H, K, V]`` in
    bf16, the chunk-local gate cumsum ``gc [B, T, H]`` float32 (None ungated): ``decay`` "mild"
    (spans far below ``PAIR_SPAN_MAX``) or "steep" (-1 per token: a chunk spans 63, the exact path)."""
    NT = T // 64
    x = {name: _draw((B, T, H, K if name in "qk" else V), seed + i, scale=0.5)
         for i, name in enumerate(("q", "k", "vn", "do", "dv2"))}
    x["h"] = _draw((B, NT, H, K, V), seed + 7, scale=0.1)
    x["dh"] = _draw((B, NT, H, K, V), seed + 8, scale=0.1)
    if gated:
        g = torch.full((B, T, H), -1.0) if decay == "steep" else \
            F.logsigmoid(torch.randn(B, T, H, generator=torch.Generator().manual_seed(seed + 9)) + 3.0) / 4
        x["gc"] = _chunk_cumsum(g.cuda())
    else:
        x["gc"] = None
    return x


def _outputs(x, B, T, gated, fill=float("nan")):
    NK = K // 64
    out = {n: torch.full((B, T, H, K), fill, dtype=torch.bfloat16, device="cuda") for n in ("dq", "dk", "dw")}
    out["dG"] = torch.full((NK, B, T, H), fill, dtype=torch.float32, device="cuda") if gated else None
    return out


def _triton(x, out, B, T, c0, c1, scale):
    from blocks.kernels import delta

    NT = T // 64
    use_g = x["gc"] is not None
    delta._bwd_dqkwg_kernel[(K // 64, c1 - c0, B * H)](
        x["q"], x["k"], x["vn"], x["gc"], x["h"], x["do"], x["dh"], x["dv2"], out["dq"], out["dk"], out["dw"],
        out["dG"], scale, T, NT, B, c0, H=H, K=K, V=V, BT=64, BK=64, BV=64, USE_G=use_g,
        DOT_PREC=delta._prec(x["q"]), PAIR_FACTORED=True, DG_FROM_ROWS=True, **delta._dqkwg_launch(use_g, x["q"]))


def _tma(x, out, c0, c1, scale, tiles):
    from blocks.kernels import delta, delta_gluon

    delta_gluon.bwd_dqkwg(x["q"], x["k"], x["vn"], x["gc"], x["h"], x["do"], x["dh"], x["dv2"], out["dq"],
                          out["dk"], out["dw"], out["dG"], scale, c0, c1, tiles, float(delta.PAIR_SPAN_MAX.value))


@hopper
@pytest.mark.parametrize("gated,decay", [(True, "mild"), (True, "steep"), (False, None)])
@pytest.mark.parametrize("B,T,c0,c1,tiles", [(2, 256, 0, 4, 8), (1, 1024, 3, 11, 3), (3, 128, 1, 2, 1),
                                             (2, 2048, 0, 32, 32)])
def test_dqkwg_tma_matches_the_triton_kernel(gated, decay, B, T, c0, c1, tiles):
    """Same outputs as ``delta._bwd_dqkwg_kernel`` on chunks ``c0 .. c1 - 1`` (within bf16 rounding of
    the outputs: both accumulate in float32, in different orders), and nothing written outside them."""
    x = _inputs(B, T, gated, decay, seed=T + c0 + B)
    scale = K ** -0.5
    ref, got = _outputs(x, B, T, gated), _outputs(x, B, T, gated)
    _triton(x, ref, B, T, c0, c1, scale)
    _tma(x, got, c0, c1, scale, tiles)
    torch.cuda.synchronize()
    inside = slice(c0 * 64, c1 * 64)
    for name in ("dq", "dk", "dw", "dG"):
        if ref[name] is None:
            continue
        r, o = ref[name], got[name]
        r_in = r[:, :, inside] if name == "dG" else r[:, inside]
        o_in = o[:, :, inside] if name == "dG" else o[:, inside]
        assert torch.isfinite(o_in).all(), f"{name}: non-finite values inside the chunks"
        tol = 2e-2 * r_in.float().abs().max().item() + 1e-6
        err = (o_in.float() - r_in.float()).abs().max().item()
        assert err <= tol, f"{name}: max |tma - triton| {err:.3g} > {tol:.3g}"
        assert torch.isnan(o).sum() == torch.isnan(r).sum(), f"{name}: wrote outside chunks {c0}..{c1 - 1}"


@hopper
@pytest.mark.parametrize("family", ["delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("B,T", [(2, 1024), (1, 8192)])  # 8192 at 2 heads: the walk runs in segments
def test_ops_gradients_with_dqkwg_tma_on_and_off(family, B, T, monkeypatch):
    """The op's gradients with ``DQKWG_TMA`` on equal those with it off (bf16 rounding apart); at
    8192 tokens of 2 heads the backward runs in walk segments, so the kernel takes chunk ranges."""
    from blocks.kernels import delta
    from blocks.ops import delta_rule as delta_ops
    from blocks.ops import gated_delta_rule as gated_ops
    from blocks.ops.utils import l2norm

    g = torch.Generator().manual_seed(B * T)
    q = torch.randn(B, T, H, K, generator=g).bfloat16().cuda()
    k = l2norm(torch.randn(B, T, H, K, generator=g)).bfloat16().cuda()
    v = torch.randn(B, T, H, V, generator=g).bfloat16().cuda()
    beta = torch.rand(B, T, H, generator=g).sigmoid().bfloat16().cuda()
    gate = (F.logsigmoid(torch.randn(B, T, H, generator=g) + 3) / 4).cuda()
    do = torch.randn(B, T, H, V, generator=g).bfloat16().cuda()

    def grads(on: bool):
        monkeypatch.setattr(delta, "DQKWG_TMA", on)
        leaves = [t.clone().requires_grad_() for t in ((q, k, v, gate, beta) if family == "gated_delta_rule"
                                                       else (q, k, v, beta))]
        if family == "gated_delta_rule":
            o, _ = gated_ops.chunk(*leaves)
        else:
            o, _ = delta_ops.chunk(*leaves)
        o.backward(do)
        return [t.grad.float() for t in leaves]

    assert delta_gluon_used(q, delta), "the inputs should take the Gluon form"
    off, on = grads(False), grads(True)
    for i, (a, b) in enumerate(zip(off, on)):
        tol = 3e-2 * a.abs().max().item() + 1e-6
        err = (a - b).abs().max().item()
        assert err <= tol, f"gradient {i}: max |on - off| {err:.3g} > {tol:.3g}"


def delta_gluon_used(q, delta) -> bool:
    from blocks.kernels import delta_gluon

    return delta_gluon.eligible(q, K, V) and delta.DQKWG_BK == 64


HAS_GLUON = HAS_TRITON and importlib.util.find_spec("triton.experimental.gluon") is not None


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton with Gluon")
def test_dqkwg_tma_host_side_without_a_gpu(monkeypatch):
    """The host half on CPU tensors, the launch recorded instead of run: the TMA descriptors see each
    tensor as rows of 64 x 64 boxes, the grid covers every tile of the chunk range in ``tiles`` per
    program, and ``eligible`` refuses what the kernel cannot take (CPU tensors, float32, partial chunks)."""
    from blocks.kernels import delta_gluon

    B, T, c0, c1, tiles = 2, 256, 1, 4, 5
    NT = T // 64
    act = lambda: torch.zeros(B, T, H, K, dtype=torch.bfloat16)  # noqa: E731
    q, k, vn, do, dv2, dq, dk, dw = (act() for _ in range(8))
    h, dh = (torch.zeros(B, NT, H, K, V, dtype=torch.bfloat16) for _ in range(2))
    gc, dG = torch.zeros(B, T, H), torch.zeros(2, B, T, H)
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.update(grid=grid, args=args, kwargs=kwargs)
            return launch

    monkeypatch.setattr(delta_gluon, "_bwd_dqkwg_tma_kernel", Recorder())
    delta_gluon.bwd_dqkwg(q, k, vn, gc, h, do, dh, dv2, dq, dk, dw, dG, 0.5, c0, c1, tiles, 40.0)
    n_tiles = 2 * (c1 - c0) * B * H
    assert seen["grid"] == (-(-n_tiles // tiles),)
    descs = seen["args"][:7]
    assert [list(d.shape) for d in descs] == [[B * T, H * K]] * 5 + [[B * NT * H * K, V]] * 2
    assert all(list(d.block_shape) == [64, 64] and list(d.strides)[-1] == 1 for d in descs)
    assert seen["args"][7:] == (gc, dq, dk, dw, dG, 0.5, T, NT, B, c0, c1 - c0, n_tiles)
    assert seen["kwargs"]["TILES"] == tiles and seen["kwargs"]["USE_G"] is True
    assert not delta_gluon.eligible(q, K, V)  # CPU
    assert not delta_gluon.eligible(q.float(), K, V)
