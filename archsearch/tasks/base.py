"""The Task interface every quality task implements, and the pieces the synthetic tasks share.

A task hands the trainer an infinite stream of ``(input_ids [B, T], targets [B, T])`` batches
(targets are -100 where no loss is taken) and scores a model on a held-out set::

    task = archsearch.tasks.build("mqar", num_kv_pairs=8)
    for input_ids, targets in task.train_batches(batch_size=64, seed=0, rank=r, world_size=w): ...
    task.evaluate(model, device)   # {"accuracy": 0.93, "loss": 0.21}; directions in task.metrics
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, ClassVar, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from archsearch.errors import UserError

IGNORE = -100
Batch = tuple[torch.Tensor, torch.Tensor]


class Task:
    """Base class: ``name``, ``vocab_size``, ``seq_len`` (input length T), ``metrics`` (name ->
    "maximize" | "minimize"), ``params`` (the resolved parameters, JSON-able)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = object
    metrics: ClassVar[dict[str, str]] = {}
    vocab_size: int
    seq_len: int

    def __init__(self, params: Any) -> None:
        self.p = params

    @property
    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self.p)

    @classmethod
    def from_params(cls, **params: Any) -> "Task":
        """Validate ``params`` against ``cls.Params`` (UserError naming ``<task>.<param>``) and build."""
        return cls(parse_params(cls.name, cls.Params, params))

    def train_batches(self, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
        """Infinite stream of ``(input_ids [B, T] long, targets [B, T] long)`` with ``B = batch_size``
        rows for this rank (a per-rank micro-batch). Ranks of one job (same ``seed``) see disjoint
        shards of the training data."""
        raise NotImplementedError

    def evaluate(self, model: Any, device: torch.device | str, batch_size: int = 64) -> dict[str, float]:
        """Score ``model`` (``model(input_ids) -> logits [B, T, V]`` or ``(logits, ...)``) on the
        held-out set; keys are ``self.metrics``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


# --- parameter validation ---------------------------------------------------------------------------
def parse_params(task: str, cls: type, params: dict[str, Any]) -> Any:
    """``cls(**params)`` with unknown names and wrong types reported as ``<task>.<param>: ...``.

    ``cls`` is a dataclass; its optional ``validate(self)`` raises UserError for value checks.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in params:
        if key not in fields:
            raise UserError(f"{task}.{key}: unknown parameter; known parameters: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    for key, value in params.items():
        params[key] = _coerce(f"{task}.{key}", hints[key], value)
    obj = cls(**params)
    check = getattr(obj, "validate", None)
    if check is not None:
        check()
    return obj


def _coerce(field: str, hint: Any, value: Any) -> Any:
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)] if args else [hint]
    if len(options) != 1 or typing.get_origin(options[0]) is not None:
        return value  # e.g. path | list | dict: the task's validate() checks it
    base = options[0]
    if base is bool:
        if not isinstance(value, bool):
            raise UserError(f"{field}: must be true or false, got {value!r}")
    elif base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{field}: must be an integer, got {value!r}")
    elif base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"{field}: must be a number, got {value!r}")
        value = float(value)
    elif base is str:
        if not isinstance(value, str):
            raise UserError(f"{field}: must be a string, got {value!r}")
    return value


def require(cond: bool, field: str, must: str, value: Any) -> None:
    """UserError ``<field>: must <must>, got <value>`` unless ``cond``."""
    if not cond:
        raise UserError(f"{field}: must {must}, got {value!r}")


def check_stream_args(batch_size: int, rank: int, world_size: int) -> None:
    require(isinstance(batch_size, int) and batch_size >= 1, "batch_size", "be >= 1", batch_size)
    require(isinstance(world_size, int) and world_size >= 1, "world_size", "be >= 1", world_size)
    require(isinstance(rank, int) and 0 <= rank < world_size, "rank", f"be in [0, {world_size})", rank)


# --- streams and scoring shared by the array-backed tasks -----------------------------------------------
def shard_indices(n: int, seed: int, rank: int, world_size: int) -> Iterator[int]:
    """Endless example indices for ``rank``: each epoch one permutation of ``range(n)`` seeded by
    ``(seed, epoch)`` (the same on every rank), cut to a multiple of ``world_size`` and dealt
    round-robin, so ranks see disjoint, equally long shards."""
    per_rank = n // world_size
    if per_rank == 0:
        raise UserError(f"world_size: the training set has {n} examples, fewer than the {world_size} ranks")
    epoch = 0
    while True:
        perm = np.random.default_rng([seed, epoch]).permutation(n)[: per_rank * world_size]
        yield from perm[rank::world_size].tolist()
        epoch += 1


def array_batches(
    inputs: np.ndarray, targets: np.ndarray, batch_size: int, seed: int, rank: int, world_size: int
) -> Iterator[Batch]:
    """Infinite per-rank batches from example arrays ``[N, T]`` (see :func:`shard_indices`)."""
    check_stream_args(batch_size, rank, world_size)
    order = shard_indices(len(inputs), seed, rank, world_size)
    while True:
        idx = np.fromiter(order, dtype=np.int64, count=batch_size)
        yield (torch.from_numpy(inputs[idx].astype(np.int64)), torch.from_numpy(targets[idx].astype(np.int64)))


def model_logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``model(input_ids)`` -> logits ``[B, T, V]`` whether it returns logits or ``(logits, states)``."""
    out = model(input_ids)
    return out[0] if isinstance(out, (tuple, list)) else out


@torch.no_grad()
def score_sums(
    model: Any, inputs: np.ndarray, targets: np.ndarray, device: torch.device | str, batch_size: int
) -> tuple[int, float, int]:
    """``(correct, total nats, scored positions)`` over positions with ``target != -100``:
    ``correct`` counts argmax == target; nats are summed float32 cross-entropies.

    ``model`` (an ``nn.Module``, a DeepSpeed engine or any callable) is put in eval mode for the
    pass and restored to its previous mode afterwards.
    """
    require(isinstance(batch_size, int) and batch_size >= 1, "batch_size", "be >= 1", batch_size)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    correct, nll, count = 0, 0.0, 0
    try:
        for start in range(0, len(inputs), batch_size):
            x = torch.from_numpy(inputs[start : start + batch_size].astype(np.int64)).to(device)
            y = torch.from_numpy(targets[start : start + batch_size].astype(np.int64)).to(device)
            mask = y != IGNORE
            if not bool(mask.any()):
                continue
            logits = model_logits(model, x).float()
            sel_logits, sel_y = logits[mask], y[mask]  # [M, V], [M]
            correct += int((sel_logits.argmax(-1) == sel_y).sum())
            nll += float(F.cross_entropy(sel_logits, sel_y, reduction="sum"))
            count += int(mask.sum())
    finally:
        if was_training:
            model.train()
    if count == 0:
        raise ValueError("the evaluation set has no scored positions (every target is -100)")
    return correct, nll, count


def score_token_predictions(
    model: Any, inputs: np.ndarray, targets: np.ndarray, device: torch.device | str, batch_size: int
) -> dict[str, float]:
    """``{"accuracy", "loss"}``: argmax accuracy and mean cross-entropy over the scored positions."""
    correct, nll, count = score_sums(model, inputs, targets, device, batch_size)
    return {"accuracy": correct / count, "loss": nll / count}


def leaked_rows(train_keys: np.ndarray, test_keys: np.ndarray) -> np.ndarray:
    """Boolean ``[N_test]``: rows of ``test_keys [N_test, L]`` that equal some row of ``train_keys``
    or an earlier test row (rows compared as byte strings of equal dtype)."""
    seen = {row.tobytes() for row in np.ascontiguousarray(train_keys)}
    out = np.zeros(len(test_keys), dtype=bool)
    for i, row in enumerate(np.ascontiguousarray(test_keys)):
        b = row.tobytes()
        if b in seen:
            out[i] = True
        else:
            seen.add(b)
    return out


def redraw_leaked(train_keys: np.ndarray, test: tuple[np.ndarray, np.ndarray], key_len: int,
                  draw: Any, tries: int) -> bool:
    """Redraw, in place, the test examples whose first ``key_len`` input tokens repeat a training
    example's or an earlier test example's (see :func:`leaked_rows`), with ``draw(n) -> (inputs,
    targets)``, up to ``tries`` rounds. True when no leaked example is left."""
    for _ in range(tries):
        bad = leaked_rows(train_keys, test[0][:, :key_len])
        if not bad.any():
            return True
        test[0][bad], test[1][bad] = draw(int(bad.sum()))
    return False


def sample_without_replacement(rng: np.random.Generator, rows: int, population: int, k: int) -> np.ndarray:
    """``[rows, k]`` int64: per row, ``k`` distinct values of ``range(population)`` in random order,
    each ordered k-subset equally likely (what ``rng.choice(population, k, replace=False)`` draws
    per row, vectorised)."""
    if k > population:
        raise ValueError(f"cannot draw {k} distinct values from {population}")
    if k * k <= 4 * population:  # rejection: a row collides with prob <= ~1 - e^-2; cheap memory
        out = rng.integers(0, population, size=(rows, k))
        while True:
            srt = np.sort(out, axis=1)
            bad = (srt[:, 1:] == srt[:, :-1]).any(axis=1) if k > 1 else np.zeros(rows, bool)
            if not bad.any():
                return out
            out[bad] = rng.integers(0, population, size=(int(bad.sum()), k))
    # Dense: argsort of iid uniforms is a uniform random permutation; keep its first k. Chunked so
    # the random matrix stays under ~32 MB.
    out = np.empty((rows, k), dtype=np.int64)
    chunk = max(1, (4 << 20) // population)
    for s in range(0, rows, chunk):
        r = rng.random((min(chunk, rows - s), population))
        part = np.argpartition(r, k - 1, axis=1)[:, :k] if k < population else np.argsort(r, axis=1)
        order = np.argsort(np.take_along_axis(r, part, axis=1), axis=1)
        out[s : s + len(r)] = np.take_along_axis(part, order, axis=1)
    return out


def weighted_sample_without_replacement(rng: np.random.Generator, rows: int, p: np.ndarray, k: int) -> np.ndarray:
    """``[rows, k]``: per row, ``k`` distinct indices drawn one after another with probability
    proportional to ``p`` among those left (numpy's ``choice(len(p), k, replace=False, p=p)``),
    vectorised with the Gumbel-top-k trick, which has exactly that distribution and order."""
    gumbel = -np.log(-np.log(rng.random((rows, len(p)))))
    keys = np.log(p)[None, :] + gumbel
    top = np.argpartition(-keys, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(keys, top, axis=1), axis=1)
    return np.take_along_axis(top, order, axis=1)
