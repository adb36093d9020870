"""Quality tasks: what a trial trains a candidate on and scores it by.

    archsearch.tasks.names()                      # ['lm', 'mad_compression', ..., 'mqar']
    task = archsearch.tasks.build("mqar", vocab_size=8192, seq_len=64, num_kv_pairs=8)
    task.vocab_size, task.seq_len, task.metrics   # the spec's vocabulary must cover task.vocab_size

Every task follows :class:`archsearch.tasks.base.Task`; unknown names and bad parameters raise
``archsearch.errors.UserError`` naming the parameter.
"""
from __future__ import annotations

from typing import Any

from archsearch.errors import UserError
from archsearch.tasks.base import Task

__all__ = ["Task", "build", "get", "names"]


def _registry() -> dict[str, type[Task]]:
    # Imported on first use so `import archsearch.tasks` stays light (lm pulls in `datasets`
    # only when its data are prepared; the modules here import numpy and torch only).
    from archsearch.tasks.lm import LanguageModeling
    from archsearch.tasks.mad import TASKS as MAD_TASKS
    from archsearch.tasks.mqar import MQAR

    return {cls.name: cls for cls in (MQAR, *MAD_TASKS, LanguageModeling)}


def names() -> list[str]:
    """Registered task names, sorted."""
    return sorted(_registry())


def get(name: str) -> type[Task]:
    """The task class registered as ``name``; UserError listing the names otherwise."""
    reg = _registry()
    if name not in reg:
        raise UserError(f"task: unknown task {name!r}; known tasks: {', '.join(sorted(reg))}")
    return reg[name]


def build(name: str, **params: Any) -> Task:
    """Construct task ``name`` with its parameters (validated; UserError ``<task>.<param>: ...``).
    Data are generated or loaded on first use, so building is cheap."""
    return get(name).from_params(**params)
