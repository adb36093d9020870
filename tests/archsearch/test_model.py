"""HybridLM: incremental decode == full forward for every block family, generation, accounting."""
from __future__ import annotations

import pytest
import torch

import blocks
from blocks.base import Block
from archsearch.errors import UserError
from archsearch.model import HybridLM, mixer_sequence_flops, mlp_hidden
from archsearch.spec import ArchSpec, LayerSpec

D_MODEL, VOCAB = 32, 53


def layer_for(name: str, variant: int = 0) -> LayerSpec:
    """A small config of block ``name``; ``variant`` 1 turns on the optional parts (conv, window)."""
    cfg: dict = {"num_heads": 2}
    if name == "softmax" and variant:
        cfg.update(window=5, num_kv_heads=1, output_gate=True)
    elif name != "softmax" and variant:
        cfg.update(conv_size=4)
    return LayerSpec(name, cfg)


def all_families_spec(**kw) -> ArchSpec:
    names = blocks.names()
    layers = [layer_for(n) for n in names] + [layer_for(n, 1) for n in names]
    return ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=tuple(layers), **kw)


def model_of(spec: ArchSpec, seed: int = 0) -> HybridLM:
    torch.manual_seed(seed)
    return HybridLM(spec).eval()


def decode_logits(model: HybridLM, x: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits for positions ``prompt-1 .. T-1`` from prefill + one decode step per token: ``[B, T-prompt+1, V]``."""
    with torch.no_grad():
        logits, states = model.prefill(x[:, :prompt])
        out = [logits]
        for t in range(prompt, x.shape[1]):
            logits, states = model.decode_step(x[:, t], states)
            out.append(logits)
    return torch.stack(out, dim=1)


def test_incremental_decode_equals_full_forward_for_a_stack_of_all_families():
    model = model_of(all_families_spec())
    x = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(x)
    inc = decode_logits(model, x, prompt=6)
    torch.testing.assert_close(inc, full[:, 5:], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", blocks.names())
def test_incremental_decode_equals_full_forward_per_family(name):
    # each family next to a different one, with and without its optional parts
    other = "softmax" if name != "softmax" else "gated_deltanet"
    spec = ArchSpec(vocab_size=VOCAB, d_model=D_MODEL,
                    layers=(layer_for(name), layer_for(other, 1), layer_for(name, 1)))
    model = model_of(spec, seed=3)
    x = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _ = model(x)
    torch.testing.assert_close(decode_logits(model, x, prompt=1), full, atol=2e-5, rtol=1e-4)


def test_forward_continues_from_states_in_chunks():
    model = model_of(all_families_spec())
    x = torch.randint(0, VOCAB, (2, 30))
    with torch.no_grad():
        full, _ = model(x)
        a, states = model(x[:, :11])
        b, states = model(x[:, 11:19], states)
        c, _ = model(x[:, 19:], states)
    torch.testing.assert_close(torch.cat([a, b, c], 1), full, atol=2e-5, rtol=1e-4)


def test_forward_rejects_wrong_number_of_states():
    model = model_of(all_families_spec())
    with pytest.raises(ValueError, match="states"):
        model(torch.zeros(1, 2, dtype=torch.long), [None])


def test_generate_greedy_is_deterministic_and_matches_argmax_of_full_forward():
    model = model_of(all_families_spec())
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(4))
    out = model.generate(prompt, 8)
    assert out.shape == (2, 13) and torch.equal(out[:, :5], prompt)
    assert torch.equal(out, model.generate(prompt, 8))
    with torch.no_grad():
        for t in range(5, 13):  # each generated token is the argmax of a fresh full pass
            logits, _ = model(out[:, :t])
            assert torch.equal(out[:, t], logits[:, -1].argmax(-1))
    assert torch.equal(model.generate(prompt, 0), prompt)


def test_generate_sampled_is_reproducible_with_a_generator_and_respects_top_k():
    model = model_of(all_families_spec())
    prompt = torch.randint(0, VOCAB, (4, 3), generator=torch.Generator().manual_seed(5))
    a = model.generate(prompt, 12, temperature=1.5, generator=torch.Generator().manual_seed(7))
    b = model.generate(prompt, 12, temperature=1.5, generator=torch.Generator().manual_seed(7))
    c = model.generate(prompt, 12, temperature=1.5, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert torch.equal(model.generate(prompt, 6, temperature=1.0, top_k=1), model.generate(prompt, 6))
    out = model.generate(prompt, 6, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        for t in range(3, 9):
            top3 = model(out[:, :t])[0][:, -1].topk(3).indices
            assert (top3 == out[:, t : t + 1]).any(-1).all()


@pytest.mark.parametrize("kw", [{"temperature": -1.0}, {"top_k": 0}])
def test_generate_rejects_bad_sampling_arguments(kw):
    model = model_of(all_families_spec())
    with pytest.raises(ValueError):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, **kw)


@pytest.mark.parametrize("context", [1, 4, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_equal_the_state_held_after_prefill(context, dtype):
    model = model_of(all_families_spec()).to(dtype)
    x = torch.randint(0, VOCAB, (3, context))
    with torch.no_grad():
        _, states = model.prefill(x)
        for layer, state in zip(model.layers, states):  # layer by layer, then the sum
            assert layer.mixer.state_bytes(3, context, dtype) == Block.held_state_bytes(state), layer.mixer.name
        held = sum(Block.held_state_bytes(s) for s in states)
        assert model.state_bytes(3, context, dtype) == held
        _, states = model.decode_step(x[:, 0], states)  # one more token
    assert model.state_bytes(3, context + 1, dtype) == sum(Block.held_state_bytes(s) for s in states)


def test_num_params_counts_tied_matrix_once():
    tied = model_of(all_families_spec())
    untied = model_of(all_families_spec(tied_embeddings=False))
    assert untied.num_params() - tied.num_params() == VOCAB * D_MODEL
    assert tied.head.weight is tied.embed.weight
    unique = {id(p): p.numel() for p in tied.parameters()}
    assert tied.num_params() == sum(unique.values())


def test_mlp_expansion_zero_removes_the_mlp():
    spec = ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(layer_for("gla"),), mlp_expansion=0)
    model = model_of(spec)
    assert model.layers[0].mlp is None and mlp_hidden(spec) == 0
    with_mlp = model_of(ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(layer_for("gla"),), mlp_expansion=2))
    assert with_mlp.num_params() - model.num_params() == 3 * D_MODEL * 2 * D_MODEL + D_MODEL  # w1 w2 w3 + norm2


def test_flops_per_token_formula():
    sm = ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(LayerSpec("softmax", {"num_heads": 2}),), mlp_expansion=2)
    model = model_of(sm)
    H, D = 2, D_MODEL // 2
    # q, k, v, o projections + SwiGLU (3 * d * 2d) + head (d * V), twice, + 4 * context * H * D
    matmul = 4 * D_MODEL * D_MODEL + 3 * D_MODEL * 2 * D_MODEL + D_MODEL * VOCAB
    assert model.flops_per_token(100) == 2 * matmul + 4 * 100 * H * D
    win = model_of(ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(LayerSpec("softmax", {"num_heads": 2, "window": 8}),)))
    assert win.flops_per_token(1000) == win.flops_per_token(8) > win.flops_per_token(7)
    lin = model_of(ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(LayerSpec("gla", {"num_heads": 2}),)))
    assert lin.flops_per_token(10) == lin.flops_per_token(10_000)
    block = lin.layers[0].mixer
    ks, vs = block.state_dims()
    assert mixer_sequence_flops(block, 10) == 4 * 2 * ks * vs
    delta = model_of(ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(LayerSpec("deltanet", {"num_heads": 2}),)))
    ks, vs = delta.layers[0].mixer.state_dims()
    assert mixer_sequence_flops(delta.layers[0].mixer, 10) == 6 * 2 * ks * vs
    with pytest.raises(ValueError):
        model.flops_per_token(0)


def test_every_family_has_countable_flops():
    model = model_of(all_families_spec())
    for layer in model.layers:
        assert mixer_sequence_flops(layer.mixer, 64) > 0


def test_model_validates_its_spec():
    with pytest.raises(UserError, match=r"layers\[0\].config.num_heads"):
        HybridLM(ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(LayerSpec("gla", {"num_heads": 5}),)))


def test_training_step_reduces_loss():
    spec = ArchSpec(vocab_size=VOCAB, d_model=D_MODEL, layers=(layer_for("gated_deltanet"), layer_for("softmax")))
    model = model_of(spec).train()
    x = torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        logits, _ = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_meta_device_build_gives_the_same_accounting():
    # the study builds candidates on the meta device to check constraints without memory
    spec = all_families_spec()
    real = model_of(spec)
    with torch.device("meta"):
        meta = HybridLM(spec)
    assert meta.num_params() == real.num_params()
    assert meta.flops_per_token(4096) == real.flops_per_token(4096)
    assert meta.state_bytes(8, 4096, torch.bfloat16) == real.state_bytes(8, 4096, torch.bfloat16)
