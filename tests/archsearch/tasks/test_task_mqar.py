"""MQAR: Zoology's format and statistics, leakage, sharding, scoring."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from archsearch import tasks
from archsearch.errors import UserError
from archsearch.tasks.base import IGNORE, leaked_rows, weighted_sample_without_replacement
from archsearch.tasks.mqar import query_gap_probs

PARAMS = dict(vocab_size=256, seq_len=64, num_kv_pairs=8, num_train_examples=4000, num_test_examples=500)


@pytest.fixture(scope="module")
def task():
    return tasks.build("mqar", **PARAMS)


def test_shapes_and_vocabulary(task):
    for split, n in (("train", 4000), ("test", 500)):
        x, y = task.data[split]
        assert x.shape == y.shape == (n, 64)
        assert x.min() >= 0 and x.max() < 256
        assert set(np.unique(y[y != IGNORE])) <= set(range(128, 256))
    assert task.vocab_size == 256 and task.seq_len == 64


def test_pairs_queries_and_targets(task):
    x, y = task.data["train"]
    n, ctx = 8, 16
    keys, values = x[:, 0:ctx:2], x[:, 1:ctx:2]
    assert ((keys >= 1) & (keys < 128)).all() and ((values >= 128) & (values < 256)).all()
    assert all(len(set(r)) == n for r in keys)  # keys unique per example
    assert all(len(set(r)) == n for r in values)
    assert ((y != IGNORE).sum(1) == n).all()  # one scored query per pair
    rows, cols = np.nonzero(y != IGNORE)
    assert (cols >= ctx).all() and ((cols - ctx) % 2 == 0).all()  # queries at even offsets after the pairs
    # the input at a scored position is a key of its example and the target its bound value
    for r, c in zip(rows[:2000], cols[:2000]):
        k = int(np.nonzero(keys[r] == x[r, c])[0][0])
        assert y[r, c] == values[r, k]
    assert (y[:, :ctx] == IGNORE).all()


def test_query_placement_follows_the_power_law(task):
    x, y = task.data["train"]
    gaps = (np.nonzero(y != IGNORE)[1] - 16) // 2  # 0 .. space-1
    space = (64 - 16) // 2
    counts = np.bincount(gaps, minlength=space) / len(gaps)
    assert counts[0] > 2 * counts[space // 2] and counts[: space // 4].sum() > 0.4  # skewed to the start
    uniform = tasks.build("mqar", **{**PARAMS, "power_a": 1.0})
    ug = (np.nonzero(uniform.data["train"][1] != IGNORE)[1] - 16) // 2
    uc = np.bincount(ug, minlength=space) / len(ug)
    assert np.abs(uc - 1 / space).max() < 0.01  # power_a = 1 is uniform


def test_vectorised_gap_sampler_matches_numpy_choice_without_replacement():
    p = query_gap_probs(12, 0.01)
    rng = np.random.default_rng(0)
    ours = weighted_sample_without_replacement(rng, 6000, p, 4)
    ref = np.stack([rng.choice(12, 4, replace=False, p=p) for _ in range(6000)])
    for j in range(4):  # the distribution of the j-th draw agrees
        a = np.bincount(ours[:, j], minlength=12) / 6000
        b = np.bincount(ref[:, j], minlength=12) / 6000
        assert np.abs(a - b).max() < 0.04
    assert all(len(set(r)) == 4 for r in ours)


def test_filler_is_random_or_zero(task):
    x, y = task.data["train"]
    filler = x[:, 16:][(y[:, 16:] == IGNORE)]
    assert len(np.unique(filler)) > 100
    plain = tasks.build("mqar", **{**PARAMS, "random_non_queries": False, "num_train_examples": 50, "num_test_examples": 5})
    px, py = plain.data["train"]
    assert (px[:, 16:][py[:, 16:] == IGNORE] == 0).all()


def test_no_leakage_between_train_and_test():
    # a small key space where independent draws would collide often
    t = tasks.build("mqar", vocab_size=10, seq_len=8, num_kv_pairs=2, num_train_examples=150, num_test_examples=100)
    train, test = t.data["train"][0][:, :4], t.data["test"][0][:, :4]
    train_rows = {r.tobytes() for r in train}
    assert not any(r.tobytes() in train_rows for r in test)
    assert len({r.tobytes() for r in test}) == len(test)
    assert not leaked_rows(train, test).any()


def test_impossible_split_is_a_user_error():
    # 4 keys, 5 values, 1 pair: only 20 distinct key-value sequences exist
    t = tasks.build("mqar", vocab_size=10, seq_len=8, num_kv_pairs=1, num_train_examples=200, num_test_examples=10)
    with pytest.raises(UserError, match="mqar.num_test_examples"):
        t.data


def test_seeded_and_deterministic():
    a = tasks.build("mqar", **{**PARAMS, "num_train_examples": 100, "num_test_examples": 10})
    b = tasks.build("mqar", **{**PARAMS, "num_train_examples": 100, "num_test_examples": 10})
    c = tasks.build("mqar", **{**PARAMS, "num_train_examples": 100, "num_test_examples": 10, "data_seed": 1})
    assert np.array_equal(a.data["train"][0], b.data["train"][0])
    assert np.array_equal(a.data["test"][1], b.data["test"][1])
    assert not np.array_equal(a.data["train"][0], c.data["train"][0])


def test_train_batches_shard_ranks_and_repeat_epochs(task):
    x, _ = task.data["train"]
    per_rank = 4000 // 3
    seen = []
    for rank in range(3):
        it = task.train_batches(batch_size=per_rank // 4, seed=11, rank=rank, world_size=3)
        rows = torch.cat([next(it)[0] for _ in range(4)])
        seen.append({r.numpy().tobytes() for r in rows})
        xb, yb = next(it)
        assert xb.dtype == yb.dtype == torch.long and xb.shape == (per_rank // 4, 64)
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2]) and not (seen[0] & seen[2])
    it = task.train_batches(batch_size=1000, seed=1)
    for _ in range(9):  # more than two epochs of 4000
        xb, yb = next(it)
    a = next(task.train_batches(batch_size=8, seed=5))[0]
    assert torch.equal(a, next(task.train_batches(batch_size=8, seed=5))[0])
    assert not torch.equal(a, next(task.train_batches(batch_size=8, seed=6))[0])


class Oracle(torch.nn.Module):
    """Solves MQAR: at each position, the value that followed the same token in the key-value prefix."""

    def __init__(self, vocab: int, context: int) -> None:
        super().__init__()
        self.vocab, self.context = vocab, context

    def forward(self, x: torch.Tensor):
        keys, values = x[:, 0 : self.context : 2], x[:, 1 : self.context : 2]  # [B, n]
        match = x[:, :, None] == keys[:, None, :]  # [B, T, n]
        pred = torch.where(match.any(-1), values.gather(1, match.float().argmax(-1)), 0)
        return torch.nn.functional.one_hot(pred, self.vocab).float() * 30, None


def test_evaluate_scores_only_queried_positions(task):
    perfect = task.evaluate(Oracle(256, 16), "cpu", batch_size=128)
    assert perfect["accuracy"] == 1.0 and perfect["loss"] < 1e-3
    constant = task.evaluate(lambda x: torch.zeros(*x.shape, 256), "cpu")
    assert constant["accuracy"] < 0.02 and abs(constant["loss"] - np.log(256)) < 1e-4
    assert set(task.metrics) == {"accuracy", "loss"} and task.metrics["accuracy"] == "maximize"


@pytest.mark.parametrize(
    "params, field",
    [
        ({"seq_len": 63}, "mqar.seq_len"),
        ({"vocab_size": 64}, "mqar.vocab_size"),
        ({"num_kv_pairs": 17}, "mqar.num_kv_pairs"),
        ({"num_kv_pairs": 0}, "mqar.num_kv_pairs"),
        ({"power_a": 0.0}, "mqar.power_a"),
        ({"num_test_examples": 0}, "mqar.num_test_examples"),
        ({"seq_len": "64"}, "mqar.seq_len: must be an integer"),
        ({"random_non_queries": 1}, "mqar.random_non_queries: must be true or false"),
        ({"num_pairs": 4}, "mqar.num_pairs: unknown parameter"),
    ],
)
def test_bad_params_name_the_parameter(params, field):
    with pytest.raises(UserError) as err:
        tasks.build("mqar", **params)
    assert str(err.value).startswith(field)


def test_zoology_defaults():
    t = tasks.build("mqar")
    assert t.params == dict(vocab_size=8192, seq_len=64, num_kv_pairs=8, power_a=0.01, random_non_queries=True,
                            num_train_examples=100_000, num_test_examples=3_000, data_seed=0)


def test_a_test_set_that_cannot_avoid_the_training_set_is_a_user_error():
    # vocab 6, one pair: only 2 keys x 3 values exist, so 100 training examples hold them all.
    task = tasks.build("mqar", vocab_size=6, seq_len=4, num_kv_pairs=1, num_train_examples=100, num_test_examples=10)
    with pytest.raises(UserError, match="mqar.num_test_examples: cannot draw 10 test examples"):
        task.data
