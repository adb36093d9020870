"""The shared trial budget: several worker processes on one study complete exactly n trials.

Journal file storage always; PostgreSQL when ARCHSEARCH_TEST_POSTGRES_URL is set (.ci/run sets it).
Each worker claims under the study lock, "trains" for a moment, and fails every third of its
trials, so failed trials' budget must be reclaimed.
"""
import multiprocessing as mp
import os
import time
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from launch.budget import claim_trial, study_lock

PG_URL = os.environ.get("ARCHSEARCH_TEST_POSTGRES_URL")


def open_storage(url):
    if url.startswith("postgresql://"):
        from launch.reaper import make_heartbeat_storage

        return make_heartbeat_storage(url)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(url))


def worker(url, name, n_trials, seed, out):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=open_storage(url),
                              sampler=optuna.samplers.RandomSampler(seed=seed))
    told = 0
    while True:
        trial, done = claim_trial(study, n_trials)
        if done:
            break
        if trial is None:
            time.sleep(0.05)
            continue
        x = trial.suggest_float("x", -1, 1)
        time.sleep(0.02)
        told += 1
        if told % 3 == 0:
            study.tell(trial, state=TrialState.FAIL)
        else:
            trial.set_user_attr("worker", seed)
            study.tell(trial, x * x)
    out.put(seed)


def run_workers(url, n_workers=4, n_trials=15):
    name = f"budget-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=open_storage(url), directions=["minimize"])
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, name, n_trials, seed, q)) for seed in range(n_workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    trials = study.get_trials()
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(complete) == n_trials
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert len({t.number for t in trials}) == len(trials)              # no trial twice
    assert len({t.user_attrs["worker"] for t in complete}) > 1          # the work was shared
    return study


def test_journal_workers_complete_exactly_n(tmp_path):
    run_workers(str(tmp_path / "journal.log"), n_workers=3, n_trials=12)


@pytest.mark.postgres
@pytest.mark.skipif(not PG_URL, reason="ARCHSEARCH_TEST_POSTGRES_URL not set (.ci/run sets it)")
def test_postgres_workers_complete_exactly_n():
    run_workers(PG_URL, n_workers=3, n_trials=10)


def test_claim_waits_while_running_trials_hold_the_budget(tmp_path):
    study = optuna.create_study(storage=open_storage(str(tmp_path / "j.log")), directions=["minimize"])
    a, _ = claim_trial(study, 1)
    assert a is not None
    assert a.user_attrs["owner_pid"] == os.getpid()  # marked before anyone else can see it
    assert claim_trial(study, 1) == (None, False)   # held by a RUNNING trial that may still fail
    study.tell(a, state=TrialState.FAIL)
    b, _ = claim_trial(study, 1)                     # its budget is reclaimed
    assert b is not None
    study.tell(b, 1.0)
    assert claim_trial(study, 1) == (None, True)


def test_study_lock_excludes_other_processes(tmp_path):
    url = str(tmp_path / "j.log")
    study = optuna.create_study(study_name="l", storage=open_storage(url), directions=["minimize"])
    ctx = mp.get_context("fork")
    got = ctx.Event()

    def other():
        s = optuna.load_study(study_name="l", storage=open_storage(url))
        with study_lock(s):
            got.set()

    with study_lock(study):
        p = ctx.Process(target=other)
        p.start()
        assert not got.wait(0.5)  # blocked while we hold it
    assert got.wait(10)
    p.join(10)
