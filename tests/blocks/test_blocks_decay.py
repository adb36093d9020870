"""retnet, simple_gla, gla, deltanet, gated_deltanet: the gates each block feeds its op, checked
against the papers' parallel forms (written out here as dense [T, T] matrices, not via the ops)."""
import math

import pytest
import torch
import torch.nn.functional as F

import blocks

D = 32


def _bare(name, **cfg):
    """One head of width d_model, no conv/norm/gate, identity output projection: y = the op's o."""
    torch.manual_seed(0)
    b = blocks.build(name, d_model=D, num_heads=1, conv_size=0, output_norm=False, output_gate=False, **cfg).eval()
    with torch.no_grad():
        b.o_proj.weight.copy_(torch.eye(D))
    return b


def _decay_parallel(q, k, v, G):
    """o_i = scale * sum_{j<=i} exp(G_i - G_j) (q_i . k_j) v_j with G the inclusive cumsum of log
    decays; ``G: [B, T]`` (scalar decay) on ``q, k: [B, T, K]``, ``v: [B, T, V]``."""
    T = q.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    D_ = (G[:, :, None] - G[:, None, :]).masked_fill(~mask, float("-inf")).exp()  # [B, T, T]
    return ((q @ k.transpose(1, 2)) * D_ * q.shape[-1] ** -0.5) @ v


def test_retnet_decays_are_papers():
    b = blocks.build("retnet", d_model=64, num_heads=4)
    torch.testing.assert_close(b.log_decay("cpu").exp(), 1 - torch.tensor([2.0 ** -5, 2.0 ** -6, 2.0 ** -7, 2.0 ** -8]))
    assert b.num_params() == sum(p.numel() for p in b.parameters())
    assert b.letter == "R"


def test_retnet_matches_parallel_retention():
    b = _bare("retnet")
    x = torch.randn(2, 10, D)
    y, _ = b(x)
    G = torch.full((2, 10), math.log(1 - 2 ** -5)).cumsum(1)
    with torch.no_grad():
        ref = _decay_parallel(*b.project(x), G)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


def test_simple_gla_is_mamba2_decay():
    b = _bare("simple_gla")
    x = torch.randn(2, 10, D)
    y, _ = b(x)
    with torch.no_grad():
        g = -b.A_log.exp() * F.softplus(_side(b, x, "dt") + b.dt_bias)  # [B, T, 1]
        assert (g <= 0).all()
        ref = _decay_parallel(*b.project(x), g[..., 0].cumsum(1))
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    # Mamba-2 init: A in [1, 16], softplus(dt_bias) in [1e-3, 1e-1]
    assert 1 <= b.A_log.exp().min() and b.A_log.exp().max() <= 16
    dt = F.softplus(b.dt_bias)
    assert (dt > 0.9e-3).all() and (dt < 0.11).all()


def test_gla_vector_gates_match_parallel_form():
    b = _bare("gla", head_dim_k=8)
    x = torch.randn(2, 9, D)
    y, _ = b(x)
    with torch.no_grad():
        gk = F.logsigmoid(b.gk_up(_side(b, x, "gk_low"))) / 16.0  # [B, T, K]
        assert (gk <= 0).all()
        G = gk.cumsum(1)
        q, k, v = b.project(x)
        # o_i = scale * sum_{j<=i} sum_c q_ic k_jc exp(G_ic - G_jc) v_j
        w = torch.exp(G[:, :, None, :] - G[:, None, :, :])  # [B, i, j, K]
        A = torch.einsum("bic,bjc,bijc->bij", q, k, w).tril() * 8 ** -0.5
        ref = A @ v
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    assert b.in_proj.widths[-1] == b.gk_up.in_features == 16  # low-rank dim


def _side(b, x, name):
    """``x`` through the rows of ``name`` in the block's one input matmul, written out."""
    return x @ b.in_proj.weight[b.in_proj.rows(name)].T


def _delta_loop(q, k, v, beta, g=None):
    """Plain loop of the (gated) delta rule on ``[B, T, K]`` inputs, written from the paper."""
    B, T, K = q.shape
    S = torch.zeros(B, K, v.shape[-1])
    outs = []
    for t in range(T):
        if g is not None:
            S = S * g[:, t].exp()[:, None, None]
        pred = torch.einsum("bk,bkv->bv", k[:, t], S)
        S = S + beta[:, t, None, None] * k[:, t, :, None] * (v[:, t] - pred)[:, None, :]
        outs.append(torch.einsum("bk,bkv->bv", q[:, t] * K ** -0.5, S))
    return torch.stack(outs, 1)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_delta_blocks_normalise_qk_and_gate(name):
    b = _bare(name)
    x = torch.randn(2, 8, D)
    y, _ = b(x)
    with torch.no_grad():
        q, k, v = b.project(x)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = torch.sigmoid(_side(b, x, "beta"))[..., 0]
        g = None
        if name == "gated_deltanet":
            g = (-b.A_log.exp() * F.softplus(_side(b, x, "a") + b.dt_bias))[..., 0]
        ref = _delta_loop(q, k, v, beta, g)
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


def test_delta_defaults_follow_fla():
    d = blocks.build("deltanet", d_model=128)
    n = blocks.build("gated_deltanet", d_model=128)
    assert d.config.conv_size == 4 and d.gate is None and d.norm is not None
    assert n.config.conv_size == 4 and n.gate is not None and n.norm is not None
    assert (d.num_heads, d.head_dim_k, d.head_dim_v) == (2, 64, 64)


def test_expand_v_and_head_dims():
    b = blocks.build("gla", d_model=D, num_heads=2, head_dim_k=8, head_dim_v=12, expand_v=1.5, conv_size=3)
    assert (b.head_dim_k, b.head_dim_v) == (8, 18)
    _, s = b(torch.randn(3, 5, D))
    assert s["S"].shape == (3, 2, 8, 18)
    assert s["conv"].shape == (3, 2, 16 + 16 + 36)
    assert b.state_bytes(3, 10**6, torch.bfloat16) == 3 * 2 * 8 * 18 * 4 + 3 * 2 * (16 + 16 + 36) * 2


def test_conv_state_is_last_inputs():
    b = blocks.build("retnet", d_model=D, conv_size=4)
    x = torch.randn(1, 6, D)
    _, s = b(x)
    torch.testing.assert_close(s["conv"], _side(b, x, "qkv")[:, -3:])
    _, s2 = b(x[:, :2])  # shorter than the conv: zero-padded on the left
    torch.testing.assert_close(s2["conv"][:, 0], torch.zeros(1, 3 * D))
    torch.testing.assert_close(s2["conv"][:, 1:], _side(b, x[:, :2], "qkv"))


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet", "simple_gla", "gla"])
def test_linear_blocks_hand_a_decode_step_to_the_fused_mixer_when_it_applies(name, monkeypatch):
    """A one-token step continuing a state goes to ``blocks.kernels.decode_mixer`` (through
    ``cuda_kernel``) when it says it applies, and its output through ``o_proj``; otherwise, and
    for prefill, the block's own path runs."""
    import blocks.linear_family as linear_family

    block = blocks.build(name, d_model=32, num_heads=2)
    x1, xs = torch.randn(2, 1, 32), torch.randn(2, 5, 32)
    _, state = block(xs)
    calls = []

    def fake_step(blk, proj, st):
        calls.append((blk, set(proj), st))
        return torch.ones(2, 1, 2 * blk.head_dim_v), {"S": st["S"] + 1}

    for applies in (False, True):
        fake_step.applies = lambda blk, x, applies=applies: applies
        monkeypatch.setattr(linear_family, "cuda_kernel",
                            lambda fam, form, x, *inputs: fake_step if (fam, form) == ("mixer", "decode") else None)
        calls.clear()
        y, new = block(x1, state)
        block(xs, state)  # T > 1: never the decode mixer
        if applies:
            assert len(calls) == 1 and calls[0][0] is block and calls[0][2] is state and "qkv" in calls[0][1]
            assert torch.equal(y, block.o_proj(torch.ones(2, 1, 2 * block.head_dim_v)))
            assert torch.equal(new["S"], state["S"] + 1)
        else:
            assert not calls and set(new) == set(state)
