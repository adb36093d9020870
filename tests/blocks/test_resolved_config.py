"""``Config.resolved(d_model)``: the config with its derived fields written out builds the same block.

Parametrised from the registry over every block's example configs (``blocks.contract.cases()``),
so a new block, or a new ``None``-means-derived field, is checked without editing this file. The
spec hash is taken of ``resolved`` (``archsearch.spec``), so a wrong value here would make two
different networks share a hash, and a missing one would train the same network twice.
"""
from __future__ import annotations

import pytest
import torch

import blocks
from blocks import contract

CASES = contract.cases()
IDS = [c.id for c in CASES]


def _resolved(name: str, config: dict, d_model: int) -> dict:
    cfg = blocks.get(name).Config.from_kwargs(**config)
    cfg.validate(d_model)
    return cfg.resolved(d_model)


def _assert_same_block(name: str, config: dict, d_model: int, seed: int) -> None:
    """Build ``name`` from ``config`` and from its resolved form: same parameter and buffer
    shapes, same state_bytes, and (weights copied over) the same outputs and states."""
    resolved = _resolved(name, config, d_model)
    torch.manual_seed(seed)
    orig = blocks.build(name, d_model=d_model, **config).eval()
    twin = blocks.build(name, d_model=d_model, **resolved).eval()
    shapes = lambda m: {k: tuple(t.shape) for k, t in m.state_dict().items()}  # parameters and buffers
    assert shapes(twin) == shapes(orig), f"{name} {config} -> {resolved}: parameter shapes differ"
    assert twin.num_params() == orig.num_params()
    for batch, context in ((1, 1), (2, 7), (3, 40)):
        for dtype in (torch.float32, torch.bfloat16):
            assert twin.state_bytes(batch, context, dtype) == orig.state_bytes(batch, context, dtype), (
                f"{name} {config} -> {resolved}: state_bytes({batch}, {context}, {dtype}) differ")
    twin.load_state_dict(orig.state_dict(), strict=True)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 11, d_model, generator=gen)
    with torch.no_grad():
        y0, s0 = orig(x[:, :7])
        y1, s1 = twin(x[:, :7])
        torch.testing.assert_close(y1, y0, rtol=0, atol=0)
        assert s1.keys() == s0.keys()
        for key in s0:
            torch.testing.assert_close(s1[key], s0[key], rtol=0, atol=0, msg=f"state {key!r}")
        # continue from the state (chunk, then single decode steps)
        for t in range(7, 11):
            y0, s0 = orig(x[:, t : t + 1], s0)
            y1, s1 = twin(x[:, t : t + 1], s1)
            torch.testing.assert_close(y1, y0, rtol=0, atol=0)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_resolved_builds_the_same_block(case):
    _assert_same_block(case.name, case.full_config(), contract.D_MODEL, case.seed("resolved"))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_resolved_is_idempotent_and_valid(case):
    d = contract.D_MODEL
    once = _resolved(case.name, case.full_config(), d)
    assert _resolved(case.name, once, d) == once
    assert set(once) == set(blocks.get(case.name).Config().to_dict())  # same fields, nothing added


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_resolved_leaves_no_field_to_derive(case):
    """A ``None`` left in the resolved config would hash unlike the value it stands for."""
    once = _resolved(case.name, case.full_config(), contract.D_MODEL)
    unresolved = sorted(k for k, v in once.items() if v is None)
    assert not unresolved, (f"{case.name}: {unresolved} still None after resolved(); override "
                            f"{blocks.get(case.name).Config.__name__}.resolved to write out the derived value")


@pytest.mark.parametrize("name", blocks.names())
def test_resolved_default_config_at_a_width_with_several_heads(name):
    """At d_model 128 the derived num_heads is 2 (at the contract's 32 it is 1)."""
    resolved = _resolved(name, {}, 128)
    assert resolved["num_heads"] == 2
    _assert_same_block(name, {}, 128, seed=7)


def test_configs_that_build_the_same_network_resolve_alike():
    d = 64
    same = [
        ("gla", {}, {"num_heads": 1, "head_dim_k": 64, "head_dim_v": 64}),
        ("gla", {"head_dim_v": 16, "expand_v": 2}, {"head_dim_v": 32}),
        ("softmax", {"num_heads": 2}, {"num_heads": 2, "num_kv_heads": 2, "head_dim": 32}),
        ("linear_attn", {"normalization": "output_norm"}, {"normalization": "output_norm", "output_norm": True}),
        ("linear_attn", {"feature_map": "performer"}, {"feature_map": "performer", "num_features": 64}),
        ("linear_attn", {"feature_map": "taylor"}, {"feature_map": "taylor", "head_dim_k": 16}),
    ]
    for name, a, b in same:
        assert _resolved(name, a, d) == _resolved(name, b, d), (name, a, b)
    different = [
        ("gla", {}, {"num_heads": 2}),
        ("softmax", {"num_heads": 2}, {"num_heads": 2, "num_kv_heads": 1}),
        ("linear_attn", {}, {"output_norm": True}),
        ("linear_attn", {"feature_map": "performer"}, {"feature_map": "performer", "num_features": 32}),
    ]
    for name, a, b in different:
        assert _resolved(name, a, d) != _resolved(name, b, d), (name, a, b)
