"""linear_attn: feature maps, the two normalisations, the denominator guard, performer redraws."""
import math

import pytest
import torch

import blocks
from blocks.base import ConfigError
from blocks.feature_maps import FEATURE_MAPS, Hedgehog, Performer, Taylor, feature_dim

D = 32


def _bare(feature_map, normalization="denominator", **cfg):
    """A block whose output is the attention readout itself: one head of width d_model, no norm,
    no gate, identity output projection."""
    torch.manual_seed(0)
    b = blocks.build("linear_attn", d_model=D, num_heads=1, feature_map=feature_map,
                     normalization=normalization, output_gate=False, **cfg).eval()
    with torch.no_grad():
        b.o_proj.weight.copy_(torch.eye(D))
    return b


@pytest.mark.parametrize("fm", ["elu1", "relu", "performer", "taylor", "hedgehog"])
def test_denominator_matches_parallel_form(fm):
    """y_i = sum_{j<=i} phi(q_i).phi(k_j) v_j / (d_i + eps), d_i = sum_{j<=i} phi(q_i).phi(k_j) > 0."""
    b = _bare(fm, **({"head_dim_k": 4} if fm == "taylor" else {}))
    x = torch.randn(2, 11, D)
    y, _ = b(x)
    with torch.no_grad():
        q, k, v = b.project(x)
        q = b.feature_map(q.reshape(2, 11, 1, -1), is_query=True)[:, :, 0]  # [B, T, K]
        k = b.feature_map(k.reshape(2, 11, 1, -1), is_query=False)[:, :, 0]
        A = (q @ k.transpose(1, 2)).tril()  # [B, T, T]
        ref = (A @ v) / (A.sum(-1, keepdim=True) + b.config.denominator_eps)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


def test_output_norm_normalisation_is_rmsnorm_of_numerator():
    b = _bare("elu1", normalization="output_norm")
    x = torch.randn(2, 9, D)
    y, state = b(x)
    with torch.no_grad():
        q, k, v = b.project(x)
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        num = (q @ k.transpose(1, 2)).tril() @ v
        ref = num * torch.rsqrt(num.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    assert state["S"].shape == (2, 1, D, D)  # no denominator column


def test_denominator_state_carries_z_in_extra_column():
    b = _bare("elu1")
    x = torch.randn(2, 7, D)
    _, state = b(x)
    k = torch.nn.functional.elu(b.project(x)[1]) + 1  # [B, T, K]
    assert state["S"].shape == (2, 1, D, D + 1)
    torch.testing.assert_close(state["S"][:, 0, :, -1], k.sum(1), rtol=1e-5, atol=1e-5)
    assert b.state_bytes(2, 7) == 2 * D * (D + 1) * 4


def test_guard_keeps_denominator_at_least_eps():
    b = _bare("identity", denominator_eps=1e-3)
    V = D
    for den in (0.0, 1e-9, -1e-9, 5e-4, -5e-4, -1e-3, 2.0, -2.0):  # -eps: where a plain d + eps hits 0
        o = torch.ones(1, 1, 1, V + 1)
        o[..., -1] = den
        y = b.mix_outputs(o)
        g = den + 1e-3 * (1.0 if den >= 0 else -1.0)
        assert abs(g) >= 1e-3
        torch.testing.assert_close(y, torch.full((1, 1, 1, V), 1.0 / g))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fm", ["identity", "relu"])
def test_adversarial_zero_denominator_stays_finite(fm, dtype):
    """identity: the second key cancels the first (x_2 = -x_1), so phi(q).z = 0 exactly; relu: the
    queries are all negative, so phi(q) = 0. Forward and backward must stay finite."""
    b = _bare(fm).to(dtype)
    torch.manual_seed(1)
    x1 = torch.randn(2, 1, D)
    if fm == "identity":
        x = torch.cat([x1, -x1, torch.randn(2, 3, D) * 1e-4], dim=1)
    else:
        with torch.no_grad():
            Wq = b.in_proj.weight[:D]  # the query rows (one head of width D)
            Wq.copy_(-Wq.abs())
        x = torch.rand(2, 5, D)  # positive inputs -> negative queries -> relu(q) = 0
    x = x.to(dtype).requires_grad_(True)
    y, _ = b(x)
    if fm == "identity":
        S = b.project(x)[1][:, :2].sum(1)  # z after two tokens
        assert S.abs().max() < 1e-6
    assert torch.isfinite(y).all()
    y.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all()
    for name, p in b.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_near_zero_denominators_random_sweep_finite():
    """Scale the keys toward zero so every phi(q).z is ~1e-12: still finite, forward and backward."""
    b = _bare("identity")
    with torch.no_grad():
        b.in_proj.weight[D:2 * D].mul_(1e-12)  # the key rows
    x = torch.randn(4, 16, D, requires_grad=True)
    y, _ = b(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in b.parameters() if p.grad is not None)


def test_taylor_kernel_is_second_order_exp():
    fm = Taylor(1, 8)
    q, k = torch.randn(5, 1, 1, 8), torch.randn(5, 1, 1, 8)
    s = (q * k).sum(-1) / math.sqrt(8)
    got = (fm(q, True) * fm(k, False)).sum(-1)
    torch.testing.assert_close(got, 1 + s + s * s / 2, rtol=1e-5, atol=1e-5)
    assert fm.out_dim == 1 + 8 + 64 == feature_dim("taylor", 8, 0)


def test_taylor_default_head_dim_is_small():
    b = blocks.build("linear_attn", d_model=128, num_heads=2, feature_map="taylor")
    assert b.head_dim_k == 16 and b.state_dims() == (1 + 16 + 256, 64 + 1)


def test_hedgehog_is_a_distribution_and_learnable():
    fm = Hedgehog(2, 4, 6)
    x = torch.randn(3, 5, 2, 4)
    phi = fm(x, True)
    assert phi.shape == (3, 5, 2, 12) and (phi > 0).all()
    torch.testing.assert_close(phi.sum(-1), torch.ones(3, 5, 2))
    assert fm.weight.requires_grad and fm.weight.shape == (2, 4, 6)


def test_performer_rows_orthogonal_within_blocks():
    W = Performer.draw(20, 8, generator=torch.Generator().manual_seed(0))  # blocks of 8, 8, 4 rows
    for lo, hi in ((0, 8), (8, 16), (16, 20)):
        Wb = W[lo:hi]
        unit = Wb / Wb.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(hi - lo), atol=1e-5, rtol=0)


def test_performer_estimates_softmax_kernel_ratio():
    """phi(q).phi(k1) / phi(q).phi(k2) -> exp((q.k1 - q.k2) / sqrt(d)) (the query stabiliser cancels)."""
    torch.manual_seed(0)
    d = 4
    fm = Performer(1, d, 8192, redraw=False)
    errs = []
    for _ in range(8):
        q, k1, k2 = (torch.randn(1, 1, 1, d) * 0.5 for _ in range(3))
        pq = fm(q, True)
        ratio = (pq * fm(k1, False)).sum() / (pq * fm(k2, False)).sum()
        want = torch.exp(((q * k1).sum() - (q * k2).sum()) / math.sqrt(d))
        errs.append(abs(ratio.item() / want.item() - 1))
    # Unbiased features give ~1% here; QR without the sign fix of Q gave ~13%.
    assert sum(errs) / len(errs) < 0.05, errs


def test_performer_redraw_only_in_training():
    b = blocks.build("linear_attn", d_model=D, feature_map="performer", performer_redraw=True)
    x = torch.randn(1, 4, D)
    b.eval()
    W0 = b.feature_map.proj.clone()
    y1, _ = b(x)
    y2, _ = b(x)
    assert torch.equal(b.feature_map.proj, W0) and torch.equal(y1, y2)
    b.train()
    b(x)
    assert not torch.equal(b.feature_map.proj, W0)
    assert "feature_map.proj" in b.state_dict()  # a buffer: saved, so decode after loading is identical
    fixed = blocks.build("linear_attn", d_model=D, feature_map="performer", performer_redraw=False).train()
    W1 = fixed.feature_map.proj.clone()
    fixed(x)
    assert torch.equal(fixed.feature_map.proj, W1)
    assert fixed.num_params() == sum(p.numel() for p in fixed.parameters())  # the buffer is not a parameter


def test_performer_redraws_agree_across_replicas():
    """Two replicas built from the same seed (data-parallel ranks) redraw identical features."""
    reps = []
    for _ in range(2):
        torch.manual_seed(7)
        reps.append(blocks.build("linear_attn", d_model=D, feature_map="performer", performer_redraw=True).train())
    x = torch.randn(1, 4, D)
    for _ in range(3):
        ya, yb = reps[0](x)[0], reps[1](x)[0]
        assert torch.equal(reps[0].feature_map.proj, reps[1].feature_map.proj) and torch.equal(ya, yb)


def test_performer_num_features_sets_state_dim():
    b = blocks.build("linear_attn", d_model=D, num_heads=2, feature_map="performer", num_features=40)
    _, state = b(torch.randn(1, 3, D))
    assert state["S"].shape == (1, 2, 40, 17)


@pytest.mark.parametrize("fm", FEATURE_MAPS)
def test_every_feature_map_builds_with_defaults(fm):
    b = blocks.build("linear_attn", d_model=64, feature_map=fm)
    y, s = b(torch.randn(1, 2, 64))
    assert y.shape == (1, 2, 64) and b.held_state_bytes(s) == b.state_bytes(1, 2)


def test_error_messages_name_field_and_value():
    with pytest.raises(ConfigError, match=r"^feature_map: must be one of elu1\|relu.*got 'softplus'"):
        blocks.build("linear_attn", d_model=D, feature_map="softplus")
    with pytest.raises(ConfigError, match=r"^output_norm: must be true"):
        blocks.build("linear_attn", d_model=D, normalization="output_norm", output_norm=False)
