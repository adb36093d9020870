"""A trial budget shared by every worker of a study: exactly ``n_trials`` complete, none twice.

Optuna's own budget (``optimize(n_trials=...)``, ``MaxTrialsCallback``) counts per process or
checks-then-asks without a lock, so N workers overshoot by up to N-1 trials. Here a worker asks
only while holding a study-wide lock, and only if ``COMPLETE + RUNNING < n_trials``; a trial
that fails does not count, so its budget is reclaimed by the next ask. The lock is the storage's
own where it has one that spans hosts:

* PostgreSQL: a session advisory lock (``pg_advisory_lock``) keyed by the study id;
* MySQL: ``GET_LOCK``;
* SQLite and journal files (one host): an ``fcntl`` lock on a file next to the database;
* in-memory: a process-local lock.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
import warnings
from typing import Iterator

import optuna
from optuna.trial import TrialState

_local_locks: dict[tuple[int, int], threading.Lock] = {}


def _backend(storage):
    """Unwrap Optuna's caching layer: the RDBStorage / JournalStorage underneath."""
    return getattr(storage, "_backend", storage)


def _lock_key(study: optuna.Study) -> int:
    digest = hashlib.sha256(f"archsearch-budget:{study.study_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def study_lock(study: optuna.Study) -> Iterator[None]:
    """Hold a lock that every worker of ``study`` (on any host sharing its storage) respects."""
    storage = study._storage
    inner = _backend(storage)
    if isinstance(inner, optuna.storages.RDBStorage):
        engine = inner.engine
        dialect = engine.dialect.name
        if dialect == "postgresql":
            import sqlalchemy

            key = _lock_key(study)
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
            return
        if dialect == "mysql":
            import sqlalchemy

            name = f"archsearch-{_lock_key(study)}"
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT GET_LOCK(:n, -1)"), {"n": name})
                try:
                    yield
                finally:
                    conn.execute(sqlalchemy.text("SELECT RELEASE_LOCK(:n)"), {"n": name})
            return
        if dialect == "sqlite" and engine.url.database and engine.url.database != ":memory:":
            with _file_lock(engine.url.database + ".archsearch-lock"):
                yield
            return
    path = _journal_file(storage)
    if path:
        with _file_lock(path + ".archsearch-lock"):
            yield
        return
    lock = _local_locks.setdefault((id(storage), study._study_id), threading.Lock())
    with lock:
        yield


def _journal_file(storage) -> str | None:
    """The file behind a ``JournalStorage(JournalFileBackend(path))``, else None."""
    if isinstance(storage, optuna.storages.JournalStorage):
        return getattr(storage._backend, "_file_path", None)
    return None


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials per state name (``COMPLETE``, ``RUNNING``, ``FAIL``, ...)."""
    out: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


def claim_trial(study: optuna.Study, n_trials: int, **ask_kwargs) -> tuple[optuna.Trial | None, bool]:
    """Ask for a trial if the shared budget allows: ``(trial, False)``, ``(None, False)`` = wait
    (the budget is held by RUNNING trials that may still fail), ``(None, True)`` = done.
    The trial comes marked with this process as its owner (``launch.reaper.mark_owner``).
    """
    with study_lock(study):
        c = counts(study)
        complete, running = c.get("COMPLETE", 0), c.get("RUNNING", 0)
        if complete >= n_trials:
            return None, True
        if complete + running >= n_trials:
            return None, False
        with warnings.catch_warnings():
            # We record heartbeats ourselves (launch.reaper.heartbeat) around ask/tell trials.
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = study.ask(**ask_kwargs)
        # Owner attrs before the lock is released: a trial is never visible to the reaper of
        # another worker without saying whose it is.
        from launch.reaper import mark_owner

        mark_owner(study, trial)
        return trial, False
