"""The MAD synthetic tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
Architectures", arXiv:2403.17844), generated as MAD-Lab's ``mad/data/instances.py`` does, with the
baseline parameters of MAD-Lab's ``configs/tasks/*.yml`` as defaults (12,800 training and 1,280
test examples each; memorization 256 training examples).

Token layout per task (``V`` = vocab_size; specials at the top of the vocabulary, as in MAD):

- ``mad_in_context_recall``: ``k v k v ...`` pairs, keys from ``[0, n/2)``, values ``[n/2, n)``, each
  key bound to one value per sequence; multi-query: every repeated key's value is scored.
- ``mad_noisy_recall``: the same with noise pairs (tokens from a separate noise vocabulary) replacing
  a ``frac_noise`` share of the pairs.
- ``mad_fuzzy_recall``: keys and values are motifs of 1-3 tokens (keys of exactly ``k_motif_size``
  tokens at test time), left-padded to the sequence length.
- ``mad_selective_copying``: ``num_tokens_to_copy`` tokens scattered among blanks, then a copy token
  and blanks; the model must emit the tokens in order at the trailing blanks.
- ``mad_memorization``: ``k <insert>`` pairs whose values come from one fixed key-value map
  (seeded) that must be stored in the weights.
- ``mad_compression``: see :class:`Compression` (adapted to a token task).

As in MAD, the recall tasks train on every next token (the training targets are the shifted inputs)
and test only on the recalled values; the other tasks train and test on the same targets. MAD's
multi-query recall sequences are ``seq_len - 1`` tokens long (its generator drops one token for the
autoregressive shift), and so are ours. Score: accuracy (and loss) over the scored positions.
"""
from __future__ import annotations

import dataclasses
from itertools import permutations
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
    score_token_predictions,
)

Arrays = tuple[np.ndarray, np.ndarray]


class MADTask(Task):
    """Array-backed MAD task: ``generate(n, rng, training)`` makes ``(inputs, targets)`` ``[n, T]``.

    Train and test are drawn from separate seeded streams; test examples that repeat a training
    input sequence are redrawn (MAD only warns about such leakage), except for memorization where
    test and train share the key-value map by design.
    """

    metrics = {"accuracy": "maximize", "loss": "minimize"}
    check_leakage = True
    max_redraws = 50

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        self.vocab_size = self.model_vocab_size()
        self.seq_len = self.input_len()
        self._data: dict[str, Arrays] | None = None

    def model_vocab_size(self) -> int:
        return self.p.vocab_size

    def input_len(self) -> int:
        return self.p.seq_len

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> Arrays:  # pragma: no cover
        raise NotImplementedError

    @property
    def data(self) -> dict[str, Arrays]:
        """``{"train": (inputs, targets), "test": (inputs, targets)}``, generated on first use."""
        if self._data is None:
            p = self.p
            train = self.generate(p.num_train_examples, np.random.default_rng([p.data_seed, 0]), True)
            test_rng = np.random.default_rng([p.data_seed, 1])
            test = self.generate(p.num_test_examples, test_rng, False)
            if self.check_leakage and not redraw_leaked(
                    train[0], test, test[0].shape[1], lambda n: self.generate(n, test_rng, False), self.max_redraws):
                raise UserError(
                    f"{self.name}.num_test_examples: cannot draw {p.num_test_examples} test sequences "
                    "absent from the training set; raise vocab_size or seq_len, or lower num_train_examples"
                )
            # int32 storage halves memory; batches are int64.
            self._data = {k: (x.astype(np.int32), y.astype(np.int32)) for k, (x, y) in (("train", train), ("test", test))}
        return self._data

    def train_batches(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        inputs, targets = self.data["train"]
        return array_batches(inputs, targets, batch_size, seed, rank, world_size)

    def evaluate(self, model: Any, device: torch.device | str, batch_size: int = 64) -> dict[str, float]:
        inputs, targets = self.data["test"]
        return score_token_predictions(model, inputs, targets, device, batch_size)


def _common_checks(name: str, p: Any) -> None:
    require(p.num_train_examples >= 1, f"{name}.num_train_examples", "be >= 1", p.num_train_examples)
    require(p.num_test_examples >= 1, f"{name}.num_test_examples", "be >= 1", p.num_test_examples)


def _shift(inputs: np.ndarray, targets: np.ndarray, training: bool) -> Arrays:
    """MAD's autoregressive shift: train on next tokens, test on the scored targets."""
    if training:
        return np.ascontiguousarray(inputs[:, :-1]), np.ascontiguousarray(inputs[:, 1:])
    return np.ascontiguousarray(inputs[:, :-1]), np.ascontiguousarray(targets[:, 1:])


# --- in-context recall and noisy recall ------------------------------------------------------------------
@dataclasses.dataclass
class RecallParams:
    vocab_size: int = 16
    seq_len: int = 128
    multi_query: bool = True
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    num_train_examples: int = 12_800
    num_test_examples: int = 1_280
    data_seed: int = 0
    _task = "mad_in_context_recall"

    def validate(self) -> None:
        n = self._task + "."
        require(self.seq_len >= 4 and self.seq_len % 2 == 0, n + "seq_len", "be an even number >= 4", self.seq_len)
        require(self.noise_vocab_size >= 0, n + "noise_vocab_size", "be >= 0", self.noise_vocab_size)
        require(0 <= self.frac_noise < 1, n + "frac_noise", "be in [0, 1)", self.frac_noise)
        require(self.frac_noise == 0 or self.noise_vocab_size > 0, n + "noise_vocab_size",
                "be > 0 when frac_noise > 0", self.noise_vocab_size)
        usable = self.vocab_size - (0 if self.multi_query else 1) - self.noise_vocab_size
        require(usable >= 2, n + "vocab_size",
                f"leave >= 2 key/value tokens after {self.noise_vocab_size} noise tokens"
                + ("" if self.multi_query else " and the copy token"), self.vocab_size)
        _common_checks(self._task, self)


@dataclasses.dataclass
class NoisyRecallParams(RecallParams):
    vocab_size: int = 32
    noise_vocab_size: int = 16
    frac_noise: float = 0.2
    _task = "mad_noisy_recall"


class InContextRecall(MADTask):
    """MAD in-context recall (``generate_in_context_recall_instance``), vectorised over examples."""

    name = "mad_in_context_recall"
    Params = RecallParams

    def input_len(self) -> int:
        # MAD: 2 * (seq_len/2) pair tokens (+1 copy prefix when single-query), minus one for the shift.
        return self.p.seq_len - (1 if self.p.multi_query else 0)

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> Arrays:
        p = self.p
        mq = p.multi_query
        core = p.vocab_size - (0 if mq else 1) - p.noise_vocab_size
        n_keys, n_vals = core // 2, core - core // 2
        slots = p.seq_len // 2 - 1  # pairs before the final probe pair
        rows = np.arange(n)

        value_of = core // 2 + rng.integers(0, n_vals, size=(n, n_keys))  # each key's value, per example
        keys = rng.integers(0, n_keys, size=(n, slots))
        values = value_of[rows[:, None], keys]
        noise = np.zeros((n, slots), dtype=bool)
        if p.frac_noise > 0:
            noise = rng.random((n, slots)) < p.frac_noise
            keep = rng.integers(0, p.seq_len // 2, size=n)  # MAD keeps one pair noise-free
            inside = keep < slots
            noise[rows[inside], keep[inside]] = False
            noise[noise.all(axis=1), 0] = False  # guarantees a key to probe (MAD's draw can miss)
            noise_tok = core + rng.integers(0, p.noise_vocab_size, size=(n, slots, 2))
        # Which slots repeat a key presented earlier (MAD scores those values when multi-query).
        seen = np.zeros((n, n_keys), dtype=bool)
        repeat = np.zeros((n, slots), dtype=bool)
        for s in range(slots):
            k = keys[:, s]
            repeat[:, s] = seen[rows, k] & ~noise[:, s]
            seen[rows, k] |= ~noise[:, s]
        # Probe: a key drawn uniformly among the distinct keys presented.
        probe = np.argmax(np.where(seen, rng.random((n, n_keys)), -1.0), axis=1)
        probe_val = value_of[rows, probe]

        pair_in = np.stack([keys, values], axis=2)  # [n, slots, 2]
        pair_tg = np.full((n, slots, 2), IGNORE, dtype=np.int64)
        if mq:
            pair_tg[:, :, 1] = np.where(repeat, values, IGNORE)
        if p.frac_noise > 0:
            pair_in = np.where(noise[:, :, None], noise_tok, pair_in)
            pair_tg[noise] = IGNORE
        tail_in = [probe, probe_val] if mq else [np.full(n, p.vocab_size - 1), probe, probe_val]
        tail_tg = [np.full(n, IGNORE)] * (len(tail_in) - 1) + [probe_val]
        inputs = np.concatenate([pair_in.reshape(n, -1), np.stack(tail_in, axis=1)], axis=1)
        targets = np.concatenate([pair_tg.reshape(n, -1), np.stack(tail_tg, axis=1)], axis=1)
        return _shift(inputs, targets, training)


class NoisyRecall(InContextRecall):
    """MAD noisy in-context recall: in-context recall with noise pairs (defaults: vocab 32 of which
    16 noise tokens, 20% noise)."""

    name = "mad_noisy_recall"
    Params = NoisyRecallParams


# --- fuzzy recall ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class FuzzyRecallParams:
    vocab_size: int = 16
    seq_len: int = 128
    k_motif_size: int = 3
    v_motif_size: int = 3
    multi_query: bool = True
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    num_train_examples: int = 12_800
    num_test_examples: int = 1_280
    data_seed: int = 0

    def validate(self) -> None:
        n = "mad_fuzzy_recall."
        require(self.k_motif_size >= 1, n + "k_motif_size", "be >= 1", self.k_motif_size)
        require(self.v_motif_size >= 1, n + "v_motif_size", "be >= 1", self.v_motif_size)
        require(self.noise_vocab_size >= 0, n + "noise_vocab_size", "be >= 0", self.noise_vocab_size)
        require(0 <= self.frac_noise < 1, n + "frac_noise", "be in [0, 1)", self.frac_noise)
        require(self.frac_noise == 0 or self.noise_vocab_size > 0, n + "noise_vocab_size",
                "be > 0 when frac_noise > 0", self.noise_vocab_size)
        core = self.vocab_size - (1 if self.multi_query else 2) - self.noise_vocab_size
        require(core // 2 >= self.k_motif_size and core - core // 2 >= self.v_motif_size, n + "vocab_size",
                "leave enough key and value tokens for motifs of k_motif_size and v_motif_size distinct tokens",
                self.vocab_size)
        need = 3 * (self.k_motif_size + self.v_motif_size) + 1
        require(self.seq_len >= need, n + "seq_len", f"be >= {need} for these motif sizes", self.seq_len)
        _common_checks("mad_fuzzy_recall", self)


class FuzzyRecall(MADTask):
    """MAD fuzzy in-context recall (``generate_fuzzy_in_context_recall_instance``): keys and values
    are ordered motifs of distinct tokens; sequences are left-padded with a pad token."""

    name = "mad_fuzzy_recall"
    Params = FuzzyRecallParams

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> Arrays:
        p = self.p
        mq = p.multi_query
        pad = p.vocab_size - (1 if mq else 2)
        copy_prefix = p.vocab_size - 1
        core = p.vocab_size - (1 if mq else 2) - p.noise_vocab_size
        key_vocab, value_vocab = range(core // 2), range(core // 2, core)
        k_sizes = list(range(1, p.k_motif_size + 1)) if training else [p.k_motif_size]
        v_sizes = list(range(1, p.v_motif_size + 1))
        # Motif tables (MAD draws uniformly among all ordered motifs of each size; the table order is
        # irrelevant to the distribution, so it is not shuffled).
        keys = {s: list(permutations(key_vocab, s)) for s in k_sizes}
        vals = {s: list(permutations(value_vocab, s)) for s in v_sizes}
        noise_base = core
        T = p.seq_len
        inputs = np.full((n, T + 1), pad, dtype=np.int64)
        targets = np.full((n, T + 1), IGNORE, dtype=np.int64)
        budget = T  # upper bound on pairs per example (each pair has >= 2 tokens)
        for row in range(n):
            # Randomness for this example drawn in bulk (cheaper than per-token numpy calls).
            ks = rng.choice(k_sizes, size=budget + 1)
            vs = rng.choice(v_sizes, size=budget + 1)
            kpick = rng.random(budget + 1)
            vpick = rng.random(budget + 1)
            is_noise = (rng.random(budget) < p.frac_noise) if p.frac_noise > 0 else np.zeros(budget, bool)
            k_probe = keys[int(ks[-1])][int(kpick[-1] * len(keys[int(ks[-1])]))]
            v_probe = vals[int(vs[-1])][int(vpick[-1] * len(vals[int(vs[-1])]))]
            probe_len = len(k_probe) + len(v_probe)
            probe_at = int(rng.integers(0, T - 2 * probe_len))
            limit = T - probe_len - (p.k_motif_size + p.v_motif_size)
            seq: list[int] = []
            tgt: list[int] = []
            kv_map: dict[tuple, tuple] = {k_probe: v_probe}
            presented: set[tuple] = set()
            probe_added = False
            i = 0
            while len(seq) < limit:
                if len(seq) >= probe_at and not probe_added:
                    seq += [*k_probe, *v_probe]
                    tgt += [IGNORE] * probe_len
                    presented.add(k_probe)
                    probe_added = True
                    continue
                k_tab, v_tab = keys[int(ks[i])], vals[int(vs[i])]
                if is_noise[i]:
                    size = len(k_tab[0]) + len(v_tab[0])
                    seq += (noise_base + rng.integers(0, p.noise_vocab_size, size=size)).tolist()
                    tgt += [IGNORE] * size
                else:
                    k = k_tab[int(kpick[i] * len(k_tab))]
                    if k == k_probe:
                        probe_added = True
                    v = kv_map.setdefault(k, v_tab[int(vpick[i] * len(v_tab))])
                    seq += [*k, *v]
                    tgt += [IGNORE] * len(k)
                    tgt += list(v) if (mq and k in presented) else [IGNORE] * len(v)
                    presented.add(k)
                i += 1
            if not mq:
                seq.append(copy_prefix)
                tgt.append(IGNORE)
            seq += [*k_probe, *v_probe]
            tgt += [IGNORE] * len(k_probe) + list(v_probe)
            seq, tgt = seq[-(T + 1):], tgt[-(T + 1):]
            inputs[row, T + 1 - len(seq):] = seq
            targets[row, T + 1 - len(tgt):] = tgt
        return _shift(inputs, targets, training)


# --- selective copying -------------------------------------------------------------------------------
@dataclasses.dataclass
class SelectiveCopyingParams:
    vocab_size: int = 16
    seq_len: int = 256
    num_tokens_to_copy: int = 16
    num_train_examples: int = 12_800
    num_test_examples: int = 1_280
    data_seed: int = 0

    def validate(self) -> None:
        n = "mad_selective_copying."
        require(self.vocab_size >= 3, n + "vocab_size", "be >= 3 (tokens, blank, copy)", self.vocab_size)
        require(self.num_tokens_to_copy >= 1, n + "num_tokens_to_copy", "be >= 1", self.num_tokens_to_copy)
        require(self.seq_len > 2 * self.num_tokens_to_copy + 1, n + "seq_len",
                f"be > 2 * num_tokens_to_copy + 1 = {2 * self.num_tokens_to_copy + 1}", self.seq_len)
        _common_checks("mad_selective_copying", self)


class SelectiveCopying(MADTask):
    """MAD selective copying (``generate_copying_instance(selective=True)``): the tokens to copy with
    ``seq_len - 2n - 1`` blanks inserted before them at random, a copy token, then ``n`` blanks at
    which the tokens are to be reproduced in order."""

    name = "mad_selective_copying"
    Params = SelectiveCopyingParams

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> Arrays:
        p = self.p
        m = p.num_tokens_to_copy
        copy_tok, blank = p.vocab_size - 1, p.vocab_size - 2
        n_blank = p.seq_len - 2 * m - 1
        to_copy = rng.integers(0, p.vocab_size - 2, size=(n, m))
        # MAD: np.insert at uniform indices in [0, m) puts blanks before token j; blanks never trail.
        before = np.zeros((n, m), dtype=np.int64)
        np.add.at(before, (np.repeat(np.arange(n), n_blank), rng.integers(0, m, size=n * n_blank)), 1)
        pos = np.arange(m)[None, :] + np.cumsum(before, axis=1)  # [n, m] token positions
        inputs = np.full((n, p.seq_len), blank, dtype=np.int64)
        np.put_along_axis(inputs, pos, to_copy, axis=1)
        inputs[:, m + n_blank] = copy_tok
        targets = np.full((n, p.seq_len), IGNORE, dtype=np.int64)
        targets[:, m + n_blank + 1 :] = to_copy
        return inputs, targets


# --- memorization -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class MemorizationParams:
    vocab_size: int = 256
    seq_len: int = 32
    num_train_examples: int = 256
    num_test_examples: int = 1_280
    data_seed: int = 0
    kv_map_seed: int = 12345

    def validate(self) -> None:
        n = "mad_memorization."
        require(self.vocab_size >= 3, n + "vocab_size", "be >= 3", self.vocab_size)
        require(self.seq_len >= 2 and self.seq_len % 2 == 0, n + "seq_len", "be an even number >= 2", self.seq_len)
        _common_checks("mad_memorization", self)


def memorization_map(vocab_size: int, seed: int) -> np.ndarray:
    """MAD's fixed key -> value map: keys ``[0, v/2)``, values ``[v/2, v)`` shuffled (``v`` = vocab - 1,
    the insert token excluded); ``out[k]`` is key k's value."""
    rng = np.random.default_rng(seed)
    v = vocab_size - 1
    keys = rng.permutation(v // 2)
    values = v // 2 + rng.permutation(v - v // 2)
    out = np.empty(v // 2, dtype=np.int64)
    out[keys] = values[: v // 2]
    return out


class Memorization(MADTask):
    """MAD memorization: ``k <insert>`` pairs; the target at each insert token is the value of the
    preceding key in one fixed key-value map (seeded by ``kv_map_seed``), the same for train and
    test, so only facts stored in the weights score."""

    name = "mad_memorization"
    Params = MemorizationParams
    check_leakage = False  # the facts are shared by design; only their order differs

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> Arrays:
        p = self.p
        kv = memorization_map(p.vocab_size, p.kv_map_seed)
        insert = p.vocab_size - 1
        keys = rng.integers(0, len(kv), size=(n, p.seq_len // 2))
        inputs = np.empty((n, p.seq_len), dtype=np.int64)
        inputs[:, 0::2], inputs[:, 1::2] = keys, insert
        targets = np.full((n, p.seq_len), IGNORE, dtype=np.int64)
        targets[:, 1::2] = kv[keys]
        return inputs, targets


# --- compression ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class CompressionParams:
    vocab_size: int = 16
    seq_len: int = 32
    noise_vocab_size: int = 0
    frac_noise: float = 0.0
    num_train_examples: int = 12_800
    num_test_examples: int = 1_280
    data_seed: int = 0

    def validate(self) -> None:
        n = "mad_compression."
        require(self.seq_len >= 2, n + "seq_len", "be >= 2", self.seq_len)
        require(self.noise_vocab_size >= 0, n + "noise_vocab_size", "be >= 0", self.noise_vocab_size)
        require(0 <= self.frac_noise < 1, n + "frac_noise", "be in [0, 1)", self.frac_noise)
        require(self.frac_noise == 0 or self.noise_vocab_size > 0, n + "noise_vocab_size",
                "be > 0 when frac_noise > 0", self.noise_vocab_size)
        require(self.vocab_size - 1 - self.noise_vocab_size >= 1, n + "vocab_size",
                "leave >= 1 content token after the compression and noise tokens", self.vocab_size)
        _common_checks("mad_compression", self)


class Compression(MADTask):
    """MAD compression, adapted to a token task.

    MAD encodes ``seq_len`` tokens (``seq_len - 1`` random tokens and a compression token) with the
    model, pools the last position into one vector, and decodes every position from that vector
    plus a position embedding with a separate MLP head (``mad/model/auto_encoder.py``). A decoder-only
    LM has no such head, so here the sequence is followed by ``seq_len`` position-query tokens
    ``q_0 .. q_{seq_len-1}`` (extra vocabulary ``vocab_size .. vocab_size + seq_len - 1``) and the
    target at ``q_i`` is input token ``i``: the model must reconstruct the sequence from what it
    carried past the compression token, the state at that point playing the encoding's role (a
    softmax layer can still attend back, as it would in an attention encoder). Input length is
    ``2 * seq_len``; model vocabulary ``vocab_size + seq_len``. Noise tokens, when enabled, are not
    scored (the reconstruction target there is -100).
    """

    name = "mad_compression"
    Params = CompressionParams

    def model_vocab_size(self) -> int:
        return self.p.vocab_size + self.p.seq_len

    def input_len(self) -> int:
        return 2 * self.p.seq_len

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> Arrays:
        p = self.p
        L = p.seq_len
        content = p.vocab_size - 1 - p.noise_vocab_size
        seq = np.empty((n, L), dtype=np.int64)
        seq[:, :-1] = rng.integers(0, content, size=(n, L - 1))
        seq[:, -1] = p.vocab_size - 1  # the compression token
        recon = seq.copy()
        if p.frac_noise > 0:
            noisy = rng.random((n, L - 1)) < p.frac_noise
            seq[:, :-1] = np.where(noisy, content + rng.integers(0, p.noise_vocab_size, size=(n, L - 1)), seq[:, :-1])
            recon[:, :-1][noisy] = IGNORE
        queries = np.broadcast_to(p.vocab_size + np.arange(L), (n, L))
        inputs = np.concatenate([seq, queries], axis=1)
        targets = np.concatenate([np.full((n, L), IGNORE, dtype=np.int64), recon], axis=1)
        return inputs, targets


TASKS = (InContextRecall, NoisyRecall, FuzzyRecall, SelectiveCopying, Memorization, Compression)
