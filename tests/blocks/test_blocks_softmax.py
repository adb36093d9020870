"""softmax: rotary, grouped-query heads, sliding window, KV-cache state and the backend record."""
import pytest
import torch

import blocks
from blocks.common import rotary

D = 32
BACKENDS = {"cudnn", "flash_attn", "flash", "efficient", "math", "kernel"}


def _naive(b, x):
    """Dense causal (windowed) attention with RoPE and GQA, written out from the definitions."""
    B, T, _ = x.shape
    H, Hkv, Dh = b.num_heads, b.num_kv_heads, b.head_dim
    W = b.in_proj.weight  # rows: q, k, v, (gate)
    q = rotary((x @ W[b.in_proj.rows("q")].T).view(B, T, H, Dh), 0, b.config.rope_theta)
    k = rotary((x @ W[b.in_proj.rows("k")].T).view(B, T, Hkv, Dh), 0, b.config.rope_theta).repeat_interleave(H // Hkv, 2)
    v = (x @ W[b.in_proj.rows("v")].T).view(B, T, Hkv, Dh).repeat_interleave(H // Hkv, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * Dh ** -0.5
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    allowed = j <= i
    if b.config.window:
        allowed &= j > i - b.config.window
    o = torch.einsum("bhij,bjhd->bihd", s.masked_fill(~allowed, float("-inf")).softmax(-1), v)
    o = o.reshape(B, T, H * Dh)
    if b.gate is not None:
        o = o * torch.sigmoid(x @ W[b.in_proj.rows("gate")].T)
    return b.o_proj(o)


@pytest.mark.parametrize("cfg", [{}, {"num_heads": 4, "num_kv_heads": 2}, {"num_heads": 4, "num_kv_heads": 1},
                                 {"num_heads": 2, "window": 3, "output_gate": True}])
def test_matches_dense_reference(cfg):
    torch.manual_seed(0)
    b = blocks.build("softmax", d_model=D, **cfg)
    x = torch.randn(2, 11, D)
    y, state = b(x)
    with torch.no_grad():
        torch.testing.assert_close(y, _naive(b, x), rtol=1e-4, atol=1e-5)
    assert b.last_backend in BACKENDS
    S = min(11, cfg.get("window") or 11)
    assert state["k_cache"].shape == (2, S, b.num_kv_heads, b.head_dim) and int(state["pos"]) == 11


def test_rotary_is_relative():
    """Starting at absolute position 1000 with an empty cache gives the same output as at 0."""
    torch.manual_seed(0)
    b = blocks.build("softmax", d_model=D, num_heads=2)
    x = torch.randn(1, 6, D)
    y0, _ = b(x)
    empty = {"k_cache": torch.zeros(1, 0, 2, 16), "v_cache": torch.zeros(1, 0, 2, 16),
             "pos": torch.tensor(1000)}
    y1, s1 = b(x, empty)
    torch.testing.assert_close(y0, y1, rtol=1e-4, atol=1e-5)
    assert int(s1["pos"]) == 1006


def test_rotary_rotates_pairs():
    x = torch.randn(1, 3, 1, 8)
    r = rotary(x, 0, 10000.0)
    torch.testing.assert_close(r[:, 0], x[:, 0])  # position 0: identity
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps norms
    # a token at offset 5 of a sequence == the same token alone, started at position 5
    x1 = x[:, :1]
    torch.testing.assert_close(rotary(x1, torch.tensor(5), 10000.0)[:, 0],
                               rotary(x1.expand(1, 6, 1, 8), 0, 10000.0)[:, 5])


def test_window_cache_and_bytes_over_long_decode():
    torch.manual_seed(0)
    b = blocks.build("softmax", d_model=D, num_heads=4, num_kv_heads=2, window=4)
    x = torch.randn(1, 10, D)
    y_ref, _ = b(x)
    state, ys = None, []
    for t in range(10):
        y, state = b(x[:, t:t + 1], state)
        ys.append(y)
        assert state["k_cache"].shape[1] == min(t + 1, 4)
        assert b.held_state_bytes(state) == b.state_bytes(1, t + 1)
    torch.testing.assert_close(torch.cat(ys, 1), y_ref, rtol=1e-4, atol=1e-5)
    assert b.state_bytes(8, 128_000, torch.bfloat16) == 2 * 8 * 4 * 2 * 8 * 2 + 8
    full = blocks.build("softmax", d_model=D, num_heads=4, num_kv_heads=2)
    assert full.state_bytes(8, 128_000, torch.bfloat16) == 2 * 8 * 128_000 * 2 * 8 * 2 + 8


def test_backend_recorded_per_path():
    b = blocks.build("softmax", d_model=D)
    _, s = b(torch.randn(1, 3, D))
    assert b.last_backend in BACKENDS
    b(torch.randn(1, 1, D), s)
    assert b.last_backend in BACKENDS
    r = blocks.build("softmax", d_model=D, mode="recurrent")
    r(torch.randn(1, 3, D))
    assert r.last_backend == "recurrent"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_uses_a_fused_backend():
    b = blocks.build("softmax", d_model=256, num_heads=2).cuda().to(torch.bfloat16)
    b(torch.randn(2, 128, 256, device="cuda", dtype=torch.bfloat16))
    assert b.last_backend in BACKENDS - {"math"}
