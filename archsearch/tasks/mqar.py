"""MQAR: multi-query associative recall as Zoology defines it (Arora et al. 2023, arXiv:2312.04927).

Each example opens with ``num_kv_pairs`` key-value pairs, then queries every key once in the rest
of the sequence; the target at a query position is the value bound to that key::

            Key  Val  Key  Val             Query                          Query
    Inputs:  2    8    4    7    r    r    4    r    r    r    r    r    2    r    r
    Labels: -100 -100 -100 -100 -100 -100  7   -100 -100 -100 -100 -100  8   -100 -100

Keys come from ``[1, vocab/2)`` and values from ``[vocab/2, vocab)``, distinct within an example.
Query positions are the even offsets of the query region; the gap (in pairs) of each query is drawn
without replacement with probability ``~ power_a * i**(power_a - 1)`` for ``i = 1..space`` (a power
law: most queries close to the context, as repeated bigrams are in real text). With
``random_non_queries`` the filler ``r`` is uniform over the vocabulary (else 0). This follows
Zoology's ``multiquery_ar`` generator with one pass (``num_passes=1``), vectorised; train and test
sets are drawn from separate seeded streams and no test example repeats a training example's
key-value sequence (checked, and redrawn if it does). Score: accuracy over the queried positions.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np
import torch

from archsearch.errors import UserError
from archsearch.tasks.base import (
    IGNORE,
    Batch,
    Task,
    array_batches,
    redraw_leaked,
    require,
    sample_without_replacement,
    score_token_predictions,
    weighted_sample_without_replacement,
)


@dataclasses.dataclass
class MQARParams:
    """Zoology's defaults: vocab 8192, 64 tokens, 8 pairs, power_a 0.01, 100k train / 3k test."""

    vocab_size: int = 8192
    seq_len: int = 64
    num_kv_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = True
    num_train_examples: int = 100_000
    num_test_examples: int = 3_000
    data_seed: int = 0

    def validate(self) -> None:
        n = "mqar."
        require(self.seq_len >= 4 and self.seq_len % 2 == 0, n + "seq_len", "be an even number >= 4", self.seq_len)
        require(self.vocab_size > self.seq_len, n + "vocab_size", f"be > seq_len ({self.seq_len})", self.vocab_size)
        require(self.num_kv_pairs >= 1, n + "num_kv_pairs", "be >= 1", self.num_kv_pairs)
        require(
            4 * self.num_kv_pairs <= self.seq_len,
            n + "num_kv_pairs",
            f"be <= seq_len / 4 = {self.seq_len // 4} (the pairs and their queries must fit)",
            self.num_kv_pairs,
        )
        require(self.num_kv_pairs <= self.vocab_size // 2 - 1, n + "num_kv_pairs",
                f"be <= the {self.vocab_size // 2 - 1} distinct keys vocab_size allows", self.num_kv_pairs)
        require(0 < self.power_a <= 1, n + "power_a", "be in (0, 1] (1 = uniform placement)", self.power_a)
        require(self.num_train_examples >= 1, n + "num_train_examples", "be >= 1", self.num_train_examples)
        require(self.num_test_examples >= 1, n + "num_test_examples", "be >= 1", self.num_test_examples)


def query_gap_probs(space: int, power_a: float) -> np.ndarray:
    """Zoology's power law over query gaps ``1..space``: ``p_i ~ power_a * i**(power_a - 1)``."""
    p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def generate(p: MQARParams, num_examples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``num_examples`` MQAR examples -> ``(inputs [N, seq_len], labels [N, seq_len])`` int32.

    Zoology builds ``seq_len + 1`` tokens and shifts labels by one; writing the query key and its
    value at the same position ``2 * n_kv + 2 * gap`` directly gives the same arrays with less memory.
    """
    n_kv = p.num_kv_pairs
    context = 2 * n_kv
    half = p.vocab_size // 2
    keys = 1 + sample_without_replacement(rng, num_examples, half - 1, n_kv)  # [N, n_kv] in [1, half)
    values = half + sample_without_replacement(rng, num_examples, p.vocab_size - half, n_kv)  # [half, V)
    space = (p.seq_len - context) // 2
    gaps = weighted_sample_without_replacement(rng, num_examples, query_gap_probs(space, p.power_a), n_kv)
    where = context + 2 * gaps  # [N, n_kv] query positions

    inputs = np.zeros((num_examples, p.seq_len), dtype=np.int32)
    inputs[:, 0:context:2] = keys
    inputs[:, 1:context:2] = values
    np.put_along_axis(inputs, where, keys.astype(np.int32), axis=1)
    labels = np.full((num_examples, p.seq_len), IGNORE, dtype=np.int32)
    np.put_along_axis(labels, where, values.astype(np.int32), axis=1)  # a query's label is its value
    if p.random_non_queries:
        filler = inputs == 0  # keys are >= 1 and values >= vocab/2, so zeros are exactly the filler
        inputs[filler] = rng.integers(0, p.vocab_size, size=int(filler.sum()), dtype=np.int32)
    return inputs, labels


class MQAR(Task):
    """Multi-query associative recall (see module docstring). Data are generated on first use."""

    name = "mqar"
    Params = MQARParams
    metrics = {"accuracy": "maximize", "loss": "minimize"}
    max_redraws = 50

    def __init__(self, params: MQARParams) -> None:
        super().__init__(params)
        self.vocab_size = params.vocab_size
        self.seq_len = params.seq_len
        self._data: dict[str, tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def data(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{"train": (inputs, labels), "test": (inputs, labels)}``, each ``[N, seq_len]``."""
        if self._data is None:
            self._data = self._generate()
        return self._data

    def _generate(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        p = self.p
        context = 2 * p.num_kv_pairs
        train = generate(p, p.num_train_examples, np.random.default_rng([p.data_seed, 0]))
        test_rng = np.random.default_rng([p.data_seed, 1])
        test = generate(p, p.num_test_examples, test_rng)
        # No leakage: a test example must not repeat a training (or earlier test) key-value sequence.
        if not redraw_leaked(train[0][:, :context], test, context, lambda n: generate(p, n, test_rng),
                             self.max_redraws):
            raise UserError(
                f"mqar.num_test_examples: cannot draw {p.num_test_examples} test examples whose key-value "
                f"sequences are absent from the {p.num_train_examples} training examples; raise vocab_size "
                "or num_kv_pairs, or lower num_train_examples"
            )
        return {"train": train, "test": test}  # int32 storage; batches are int64

    def train_batches(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        inputs, labels = self.data["train"]
        return array_batches(inputs, labels, batch_size, seed, rank, world_size)

    def evaluate(self, model: Any, device: torch.device | str, batch_size: int = 64) -> dict[str, float]:
        inputs, labels = self.data["test"]
        return score_token_predictions(model, inputs, labels, device, batch_size)
