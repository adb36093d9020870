"""The registry, shared config fields and the shared pieces (short conv, head norm)."""
import pytest
import torch
import torch.nn.functional as F

import blocks
from blocks.base import ConfigError
from blocks.common import HeadNorm, ShortConv

EXPECTED = {"linear_attn": "L", "retnet": "R", "simple_gla": "M", "gla": "G", "deltanet": "D",
            "gated_deltanet": "N", "softmax": "S"}


def test_registry_lists_the_seven_families_with_letters():
    assert set(EXPECTED) <= set(blocks.names())
    for name, letter in EXPECTED.items():
        assert blocks.get(name).letter == letter and blocks.get(name).name == name


def test_unknown_block_lists_registered_ones():
    with pytest.raises(blocks.UnknownBlockError, match="unknown block 'mamba'; registered blocks: .*gla"):
        blocks.get("mamba")


def test_unknown_field_is_named():
    with pytest.raises(ConfigError, match=r"^num_head: unknown field"):
        blocks.build("gla", d_model=32, num_head=2)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_defaults_derived_from_d_model(name):
    b = blocks.build(name, d_model=256)
    assert b.num_heads == 4
    dims = (b.head_dim,) if name == "softmax" else (b.head_dim_k, b.head_dim_v)
    assert all(d == 64 for d in dims)


@pytest.mark.parametrize("bad,field", [({"num_heads": True}, "num_heads"), ({"conv_size": 2.0}, "conv_size"),
                                       ({"head_dim_v": 0}, "head_dim_v"), ({"output_norm": None}, "output_norm")])
def test_type_errors_name_field(bad, field):
    with pytest.raises(ConfigError, match=rf"^{field}: must .* got "):
        blocks.build("simple_gla", d_model=32, **bad)


def test_d_model_checked():
    with pytest.raises(ConfigError, match="^d_model:"):
        blocks.build("retnet", d_model=0)


def test_short_conv_is_causal_depthwise_conv_with_silu():
    torch.manual_seed(0)
    conv = ShortConv(6, 3)
    x = torch.randn(2, 9, 6)
    y, cache = conv(x)
    ref = F.conv1d(F.pad(x.transpose(1, 2), (2, 0)), conv.weight, groups=6).transpose(1, 2)
    torch.testing.assert_close(y, F.silu(ref))
    torch.testing.assert_close(cache, x[:, -2:])
    # split anywhere, one token at a time
    ys, c = [], None
    for t in range(9):
        yt, c = conv(x[:, t:t + 1], c)
        ys.append(yt)
    torch.testing.assert_close(torch.cat(ys, 1), y)
    assert conv.cache_bytes(2, torch.bfloat16) == 2 * 2 * 6 * 2


def test_conv_paths_agree():
    """The CPU path (shifted multiply-adds) and the CUDA path (cuDNN conv1d) compute one conv."""
    from blocks.common import depthwise_conv_cuda, depthwise_conv_shifts

    xp, w = torch.randn(3, 10 + 3, 5, requires_grad=True), torch.randn(5, 1, 4, requires_grad=True)
    a, b = depthwise_conv_cuda(xp, w), depthwise_conv_shifts(xp, w)  # conv1d also runs on CPU
    torch.testing.assert_close(a, b)
    ga = torch.autograd.grad(a.square().sum(), [xp, w])
    gb = torch.autograd.grad(b.square().sum(), [xp, w])
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v)


def test_short_conv_cache_owns_its_memory():
    conv = ShortConv(4, 4)
    _, cache = conv(torch.randn(1, 100, 4))
    assert cache.untyped_storage().nbytes() == cache.numel() * cache.element_size()


def test_head_norm_float32_with_bf16_weights():
    n = HeadNorm(8).to(torch.bfloat16)
    o = torch.randn(2, 3, 4, 8, dtype=torch.bfloat16) * 100
    out = n(o)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float().pow(2).mean(-1), torch.ones(2, 3, 4), rtol=2e-2, atol=2e-2)


def test_block_runs_in_bfloat16():
    for name in EXPECTED:
        b = blocks.build(name, d_model=32).to(torch.bfloat16)
        x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
        y, s = b(x)
        y2, s = b(x[:, :1], s)
        assert y.dtype == torch.bfloat16 and torch.isfinite(y).all() and torch.isfinite(y2).all()
        if "S" in s:
            assert s["S"].dtype == torch.float32  # recurrent state stays float32


def test_num_params_counts_zero3_partitioned_params():
    """ZeRO-3 leaves empty local tensors and the full size in ``ds_numel``."""
    b = blocks.build("gla", d_model=32)
    full = b.num_params()
    for p in b.parameters():
        p.ds_numel = p.numel()
        p.data = torch.empty(0)
    assert b.num_params() == full > 0


LINEAR = sorted(set(EXPECTED) - {"softmax"})


@pytest.mark.parametrize("name", LINEAR)
def test_linear_decode_step_traces_without_graph_breaks(name):
    """archsearch.decode_graph may torch.compile linear layers: their forward must be one graph."""
    import torch._dynamo as dynamo

    b = blocks.build(name, d_model=32, num_heads=2, conv_size=2).eval()
    with torch.no_grad():
        _, state = b(torch.randn(1, 3, 32))
        explained = dynamo.explain(b)(torch.randn(1, 1, 32), state)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
