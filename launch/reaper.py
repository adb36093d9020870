"""Trials left RUNNING by a dead driver or worker: find them, fail them, kill their orphans, retry.

Two ways to know a trial's owner is dead:

* RDB storages (PostgreSQL, SQLite) with heartbeats: the owner records a heartbeat every
  ``heartbeat_interval`` seconds while the trial runs (``heartbeat()`` below); a trial whose
  heartbeat is older than ``grace_period`` is failed by ``optuna.storages.fail_stale_trials``.
  Works across hosts.
* Any storage (the journal file in particular): the owner writes its host, pid and the pid's
  start time into the trial's user attrs (``mark_owner``). A sweep may fail a RUNNING trial only
  when its owner is on *this* host and that process is gone (or the pid now belongs to another
  process). Trials owned by other hosts are left alone: we cannot see their processes.

A dead driver cannot kill its trials (they run in their own sessions, on purpose), so the sweep
also kills the orphaned process group, recognised by the recorded group id *and* the trial's
record path on the members' command lines (a recycled pid never matches both).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import warnings
from typing import Iterator

import optuna
from optuna.storages import fail_stale_trials
from optuna.storages._heartbeat import BaseHeartbeat, is_heartbeat_enabled
from optuna.trial import FrozenTrial, TrialState

from launch.hostfile import this_host

log = logging.getLogger(__name__)

# Trial user attrs written by mark_owner / read by the reaper.
OWNER_HOST = "owner_host"
OWNER_PID = "owner_pid"
OWNER_START = "owner_start"       # the owner pid's start time (clock ticks since boot), guards pid reuse
TRIAL_PGID = "launch_pgid"        # the trial's process group
TRIAL_OUT = "launch_out"          # the trial's record path, on every member's command line
RETRY_OF = "retry_of"             # on a re-enqueued candidate: the number of the reaped trial
STATUS, REASON = "status", "reason"


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[19])


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True when ``pid`` runs on this host and, if given, started at ``start_time`` (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    if start_time is not None:
        now = process_start_time(pid)
        if now is not None and now != start_time:
            return False
    return True


def owner_attrs(proc=None) -> dict:
    """The user attrs that name this process as a trial's owner (and ``proc``'s process group)."""
    attrs = {OWNER_HOST: this_host(), OWNER_PID: os.getpid(), OWNER_START: process_start_time(os.getpid())}
    if proc is not None:
        attrs[TRIAL_PGID] = proc.pgid
        attrs[TRIAL_OUT] = str(proc.out_path)
    return attrs


def mark_owner(study: optuna.Study, trial, proc=None) -> None:
    """Record this process (and the trial's process group ``proc``) as the owner of ``trial``.

    Call right after ``study.ask()`` and again with ``proc`` once ``start_trial`` returned.
    ``trial`` is an ``optuna.Trial`` or a ``FrozenTrial``.
    """
    for key, value in owner_attrs(proc).items():
        if isinstance(trial, optuna.Trial):
            trial.set_user_attr(key, value)  # also updates the trial's own view of its attrs
        else:
            study._storage.set_trial_user_attr(trial._trial_id, key, value)


def normalize_db_url(url: str) -> str:
    """Pick the PostgreSQL driver that is installed for a bare ``postgresql://`` URL.

    SQLAlchemy 2.1 maps ``postgresql://`` to psycopg 3; archsearch's ``postgres`` extra installs
    psycopg2 (binary wheels everywhere). ``postgres://`` (Heroku style) is accepted too.
    """
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres") and sep:
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + rest
        return "postgresql://" + rest
    return url


def make_heartbeat_storage(url: str, heartbeat_interval: int = 10, grace_period: int | None = None):
    """An ``RDBStorage`` for ``url`` that records heartbeats (for ``heartbeat()`` and the reaper).

    ``grace_period`` defaults to 3 heartbeats: a worker busy in a long ``ask()`` must not look dead.
    """
    url = normalize_db_url(url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period or 3 * heartbeat_interval,
            engine_kwargs={"pool_pre_ping": True},
        )


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial) -> Iterator[None]:
    """Record the trial's heartbeat while the block runs (no-op on storages without heartbeats).

    ``study.optimize`` does this itself; ask/tell loops (ours, with trials in subprocesses) must.
    """
    from optuna.storages._heartbeat import get_heartbeat_thread

    thread = get_heartbeat_thread(trial._trial_id, study._storage)
    with thread:
        yield


def _proc_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _group_members(pgid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid:
            members.append(int(name))
    return members


def kill_orphan_group(pgid: int | None, out_path: str | None) -> bool:
    """SIGKILL process group ``pgid`` if one of its members runs the trial writing ``out_path``."""
    if not pgid or not out_path:
        return False
    if not any(out_path in _proc_cmdline(pid) for pid in _group_members(int(pgid))):
        return False
    try:
        os.killpg(int(pgid), signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    log.warning("killed orphaned trial process group %s (%s)", pgid, out_path)
    return True


def owner_is_dead(trial: FrozenTrial, host: str | None = None) -> bool:
    """True only when the trial's recorded owner ran on this host and is gone."""
    attrs = trial.user_attrs
    if attrs.get(OWNER_HOST) != (host or this_host()) or not isinstance(attrs.get(OWNER_PID), int):
        return False
    return not pid_alive(attrs[OWNER_PID], attrs.get(OWNER_START))


def _fail(study: optuna.Study, trial: FrozenTrial, reason: str) -> bool:
    storage = study._storage
    try:
        storage.set_trial_user_attr(trial._trial_id, STATUS, "failed")
        storage.set_trial_user_attr(trial._trial_id, REASON, reason)
        return bool(storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL))
    except optuna.exceptions.UpdateFinishedTrialError:
        return False  # another worker finished or reaped it first


def reap_stale_trials(study: optuna.Study, *, retry: bool = True, max_retries: int = 1) -> list[FrozenTrial]:
    """Fail the RUNNING trials whose owner is dead; kill their orphans; re-enqueue their candidates.

    Heartbeat-stale trials (RDB storages with heartbeats) from any host, and trials whose recorded
    owner ran on this host and is gone. Completed trials are never touched. ``retry`` enqueues each
    reaped candidate's params once more (at most ``max_retries`` times along a chain) so a study
    interrupted mid-trial still evaluates it. Returns the reaped trials (as they were before).
    Safe to run from several workers at once: a trial is failed by exactly one of them.
    """
    reaped: list[FrozenTrial] = []
    reasons: dict[int, str] = {}
    running = {t._trial_id: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return reaped

    storage = study._storage
    if isinstance(storage, BaseHeartbeat) and is_heartbeat_enabled(storage):
        stale = set(storage._get_stale_trial_ids(study._study_id))
        for tid in stale & set(running):
            t = running[tid]
            reasons[tid] = ("reaped: heartbeat stale (owner "
                            f"{t.user_attrs.get(OWNER_HOST, '?')}:{t.user_attrs.get(OWNER_PID, '?')})")
            if _fail(study, t, reasons[tid]):
                reaped.append(t)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            fail_stale_trials(study)  # anything that went stale since; runs the storage's callback too

    done = {t._trial_id for t in reaped}
    for tid, t in running.items():
        if tid in done or not owner_is_dead(t):
            continue
        kill_orphan_group(t.user_attrs.get(TRIAL_PGID), t.user_attrs.get(TRIAL_OUT))
        reasons[tid] = f"reaped: owner pid {t.user_attrs[OWNER_PID]} on {t.user_attrs[OWNER_HOST]} is gone"
        if _fail(study, t, reasons[tid]):
            reaped.append(t)

    for t in reaped:
        if t.user_attrs.get(OWNER_HOST) == this_host():
            kill_orphan_group(t.user_attrs.get(TRIAL_PGID), t.user_attrs.get(TRIAL_OUT))
        log.warning("trial %d %s", t.number, reasons[t._trial_id])
        if retry and t.params and _retry_depth(study, t) < max_retries:
            study.enqueue_trial(t.params, user_attrs={RETRY_OF: t.number}, skip_if_exists=False)
    return reaped


def _retry_depth(study: optuna.Study, trial: FrozenTrial) -> int:
    """How many reaped ancestors this candidate already has (via the ``retry_of`` chain)."""
    by_number = None
    depth, cur = 0, trial
    while RETRY_OF in cur.user_attrs:
        depth += 1
        if by_number is None:
            by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
        cur = by_number.get(cur.user_attrs[RETRY_OF])
        if cur is None:
            break
    return depth
