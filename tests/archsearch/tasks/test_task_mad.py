"""The six MAD tasks: well-formed batches, each task's token semantics, MAD's defaults, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from archsearch import tasks
from archsearch.errors import UserError
from archsearch.tasks.base import IGNORE
from archsearch.tasks.mad import memorization_map

MAD = ["mad_in_context_recall", "mad_fuzzy_recall", "mad_noisy_recall", "mad_selective_copying",
       "mad_compression", "mad_memorization"]
SMALL = dict(num_train_examples=300, num_test_examples=60)


@pytest.fixture(scope="module")
def built():
    return {name: tasks.build(name, **SMALL) for name in MAD}


@pytest.mark.parametrize("name", MAD)
def test_batches_are_well_formed(built, name):
    task = built[name]
    it = task.train_batches(batch_size=16, seed=0)
    for _ in range(3):
        x, y = next(it)
        assert x.shape == y.shape == (16, task.seq_len) and x.dtype == y.dtype == torch.long
        assert x.min() >= 0 and x.max() < task.vocab_size
        scored = y[y != IGNORE]
        assert len(scored) > 0 and scored.min() >= 0 and scored.max() < task.vocab_size
    tx, ty = task.data["test"]
    assert tx.shape == ty.shape == (60, task.seq_len)
    assert ((ty != IGNORE).sum(1) >= 1).all()  # every test example scores something
    assert tx.max() < task.vocab_size and ty.max() < task.vocab_size


@pytest.mark.parametrize("name", MAD)
def test_ranks_see_disjoint_examples(built, name):
    task = built[name]
    rows = []
    for rank in range(2):
        it = task.train_batches(batch_size=150, seed=3, rank=rank, world_size=2)  # one epoch each
        rows.append(next(it)[0])
    idx = [{bytes(r.numpy().tobytes()) for r in part} for part in rows]
    assert len(idx[0]) + len(idx[1]) == len(idx[0] | idx[1])


@pytest.mark.parametrize("name", [n for n in MAD if n != "mad_memorization"])
def test_no_test_sequence_repeats_a_training_sequence(built, name):
    train = {r.tobytes() for r in built[name].data["train"][0]}
    assert not any(r.tobytes() in train for r in built[name].data["test"][0])


@pytest.mark.parametrize("name", ["mad_in_context_recall", "mad_noisy_recall"])
def test_recall_semantics(built, name):
    task = built[name]
    p = task.p
    core = p.vocab_size - p.noise_vocab_size
    x, y = task.data["train"]
    assert np.array_equal(x[:, 1:], y[:, :-1])  # training: next-token targets (MAD)
    tx, ty = task.data["test"]
    assert task.seq_len == p.seq_len - 1  # MAD's multi-query length
    assert (ty[:, -1] != IGNORE).all()  # the final probe is always scored
    for row in range(len(tx)):
        seq, tgt = tx[row], ty[row]
        binding = {}
        for i in range(0, len(seq) - 1, 2):
            k, v = seq[i], seq[i + 1]
            if k >= core:  # a noise pair
                assert v >= core and tgt[i] == IGNORE
                continue
            assert k < core // 2 <= v < core
            assert binding.setdefault(k, v) == v  # one value per key in a sequence
            # scored exactly when the key was presented before (multi-query)
            assert (tgt[i] != IGNORE) == (k in binding and i > min(j for j in range(0, i + 1, 2) if seq[j] == k))
            if tgt[i] != IGNORE:
                assert tgt[i] == v
        assert tgt[-1] == binding[seq[-1]]
    if name == "mad_noisy_recall":
        pairs = tx[:, : (len(tx[0]) // 2) * 2].reshape(len(tx), -1, 2)
        frac = (pairs[:, :, 0] >= core).mean()
        assert 0.15 < frac < 0.25  # frac_noise 0.2


def test_fuzzy_recall_semantics(built):
    task = built["mad_fuzzy_recall"]
    pad = task.p.vocab_size - 1
    x, y = task.data["train"]
    assert np.array_equal(x[:, 1:], y[:, :-1])
    tx, ty = task.data["test"]
    assert (tx[:, 0] == pad).mean() > 0.5  # left padding
    assert (ty[:, -1] != IGNORE).all()
    core = task.p.vocab_size - 1
    scored = ty[ty != IGNORE]
    assert ((scored >= core // 2) & (scored < core)).all()  # only value tokens are scored


def test_selective_copying_semantics(built):
    task = built["mad_selective_copying"]
    V, n = task.p.vocab_size, task.p.num_tokens_to_copy
    blank, copy = V - 2, V - 1
    for split in ("train", "test"):
        x, y = task.data[split]
        assert (x[:, -n - 1] == copy).all() and (x[:, -n:] == blank).all()
        for row in range(len(x)):
            tokens = x[row, : -n - 1]
            assert np.array_equal(tokens[tokens != blank], y[row, -n:])
            assert tokens[-1] != blank  # MAD inserts blanks before tokens, never after the last
        assert (y[:, : -n] == IGNORE).all()


def test_memorization_uses_one_fixed_map(built):
    task = built["mad_memorization"]
    kv = memorization_map(256, 12345)
    assert len(set(kv.tolist())) == len(kv) == 127 and kv.min() >= 127 and kv.max() < 255
    assert np.array_equal(kv, memorization_map(256, 12345)) and not np.array_equal(kv, memorization_map(256, 1))
    for split in ("train", "test"):
        x, y = task.data[split]
        assert (x[:, 1::2] == 255).all() and (y[:, 0::2] == IGNORE).all()
        assert np.array_equal(y[:, 1::2], kv[x[:, 0::2]])


def test_compression_reconstructs_the_sequence(built):
    task = built["mad_compression"]
    L, V = task.p.seq_len, task.p.vocab_size
    assert task.seq_len == 2 * L and task.vocab_size == V + L
    x, y = task.data["test"]
    assert (x[:, L - 1] == V - 1).all()  # compression token
    assert np.array_equal(x[:, L:], np.broadcast_to(V + np.arange(L), (len(x), L)))
    assert np.array_equal(y[:, L:], x[:, :L]) and (y[:, :L] == IGNORE).all()

    class Copier(torch.nn.Module):  # reads the token a position query asks for
        def forward(self, inp):
            src = (inp[:, L:] - V).clamp(0, L - 1)
            pred = torch.cat([inp[:, :L], inp[:, :L].gather(1, src)], 1)
            return torch.nn.functional.one_hot(pred, V + L).float() * 30

    assert task.evaluate(Copier(), "cpu")["accuracy"] == 1.0
    noisy = tasks.build("mad_compression", noise_vocab_size=4, frac_noise=0.5, **SMALL)
    nx, ny = noisy.data["test"]
    noise = (nx[:, : L - 1] >= V - 1 - 4) & (nx[:, : L - 1] < V - 1)
    assert noise.mean() > 0.3 and (ny[:, L : 2 * L - 1][noise] == IGNORE).all()


def test_mad_defaults_match_mad_lab_configs():
    expect = {
        "mad_in_context_recall": dict(vocab_size=16, seq_len=128, multi_query=True, num_train_examples=12800),
        "mad_fuzzy_recall": dict(vocab_size=16, seq_len=128, k_motif_size=3, v_motif_size=3, multi_query=True),
        "mad_noisy_recall": dict(vocab_size=32, noise_vocab_size=16, frac_noise=0.2, seq_len=128, multi_query=True),
        "mad_selective_copying": dict(vocab_size=16, seq_len=256, num_tokens_to_copy=16, num_train_examples=12800),
        "mad_compression": dict(vocab_size=16, seq_len=32, num_train_examples=12800),
        "mad_memorization": dict(vocab_size=256, seq_len=32, num_train_examples=256),
    }
    for name, fields in expect.items():
        params = tasks.build(name).params
        assert {k: params[k] for k in fields} == fields, name
        assert params["num_test_examples"] == 1280


def test_evaluate_restores_training_mode_and_reports_chance_for_a_blank_model(built):
    task = built["mad_in_context_recall"]
    model = torch.nn.Sequential(torch.nn.Embedding(task.vocab_size, task.vocab_size))
    with torch.no_grad():
        model[0].weight.zero_()
    model.train()
    out = task.evaluate(model, "cpu", batch_size=7)
    assert model.training
    assert abs(out["loss"] - np.log(task.vocab_size)) < 1e-5 and out["accuracy"] < 0.2


@pytest.mark.parametrize(
    "name, params, field",
    [
        ("mad_in_context_recall", {"seq_len": 127}, "mad_in_context_recall.seq_len"),
        ("mad_noisy_recall", {"frac_noise": 1.0}, "mad_noisy_recall.frac_noise"),
        ("mad_noisy_recall", {"noise_vocab_size": 31}, "mad_noisy_recall.vocab_size"),
        ("mad_fuzzy_recall", {"k_motif_size": 0}, "mad_fuzzy_recall.k_motif_size"),
        ("mad_fuzzy_recall", {"seq_len": 10}, "mad_fuzzy_recall.seq_len"),
        ("mad_selective_copying", {"num_tokens_to_copy": 200}, "mad_selective_copying.seq_len"),
        ("mad_memorization", {"seq_len": 31}, "mad_memorization.seq_len"),
        ("mad_compression", {"frac_noise": 0.1}, "mad_compression.noise_vocab_size"),
        ("mad_compression", {"vocab_sz": 3}, "mad_compression.vocab_sz: unknown parameter"),
    ],
)
def test_bad_params_name_the_parameter(name, params, field):
    with pytest.raises(UserError) as err:
        tasks.build(name, **params)
    assert str(err.value).startswith(field)


def test_registry():
    assert tasks.names() == sorted(["mqar", "lm", *MAD])
    with pytest.raises(UserError, match="task: unknown task 'nope'; known tasks: lm, mad_compression"):
        tasks.build("nope")
    for name in tasks.names():
        cls = tasks.get(name)
        assert cls.metrics and set(cls.metrics.values()) <= {"maximize", "minimize"}


def test_a_test_set_that_cannot_avoid_the_training_set_is_a_user_error():
    # vocab 4, length 4: so few sequences exist that 200 training examples hold every one.
    task = tasks.build("mad_compression", vocab_size=4, seq_len=4, num_train_examples=200, num_test_examples=10)
    with pytest.raises(UserError, match="mad_compression.num_test_examples: cannot draw 10 test sequences"):
        task.data
