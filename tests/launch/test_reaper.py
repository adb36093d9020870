"""reap_stale_trials: only trials of dead owners are failed; their orphans are killed; retried once."""
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from launch import reaper
from launch.process import start_trial
from launch.slots import plan_slots

FAKE = [str(Path(__file__).with_name("fake_trial.py"))]


def make_study(tmp_path, name="s"):
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "journal.log")))
    return optuna.create_study(study_name=name, storage=storage, directions=["minimize"])


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def running_trial(study, **attrs):
    t = study.ask()
    t.suggest_float("x", 0, 1)
    for k, v in attrs.items():
        t.set_user_attr(k, v)
    return t


def state(study, trial):
    return study._storage.get_trial(trial._trial_id).state


def test_only_trials_of_dead_owners_on_this_host_are_reaped(tmp_path):
    study = make_study(tmp_path)
    host = reaper.this_host()
    done = running_trial(study)
    study.tell(done, 0.5)
    mine = running_trial(study)
    reaper.mark_owner(study, mine)                       # this process: alive
    dead = running_trial(study, owner_host=host, owner_pid=dead_pid())
    reused = running_trial(study, owner_host=host, owner_pid=os.getpid(), owner_start=1)  # pid reused by us
    remote = running_trial(study, owner_host="some-other-host", owner_pid=dead_pid())
    unknown = running_trial(study)                        # no owner recorded: cannot tell, keep

    reaped = reaper.reap_stale_trials(study)

    assert sorted(t.number for t in reaped) == sorted([dead.number, reused.number])
    assert state(study, dead) == state(study, reused) == TrialState.FAIL
    assert state(study, mine) == state(study, remote) == state(study, unknown) == TrialState.RUNNING
    assert state(study, done) == TrialState.COMPLETE
    failed = study._storage.get_trial(dead._trial_id)
    assert failed.user_attrs["status"] == "failed" and failed.user_attrs["reason"].startswith("reaped: owner pid")
    # each reaped candidate is enqueued once more, with its params
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.user_attrs[reaper.RETRY_OF] for t in waiting) == sorted([dead.number, reused.number])
    # a second sweep finds nothing: no trial is failed (or retried) twice
    assert reaper.reap_stale_trials(study) == []
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2


def test_retry_chain_is_bounded(tmp_path):
    study = make_study(tmp_path)
    t = running_trial(study, owner_host=reaper.this_host(), owner_pid=dead_pid())
    reaper.reap_stale_trials(study, max_retries=1)
    retry = study.ask()  # pops the enqueued retry: its suggestions replay the reaped candidate
    assert retry.suggest_float("x", 0, 1) == t.params["x"] and retry.user_attrs[reaper.RETRY_OF] == t.number
    retry.set_user_attr(reaper.OWNER_HOST, reaper.this_host())
    retry.set_user_attr(reaper.OWNER_PID, dead_pid())
    assert [x.number for x in reaper.reap_stale_trials(study, max_retries=1)] == [retry.number]
    assert study.get_trials(states=(TrialState.WAITING,)) == []


def test_orphaned_trial_group_of_a_dead_owner_is_killed(tmp_path):
    study = make_study(tmp_path)
    (slot,) = plan_slots([], 1, 1)
    proc = start_trial(tmp_path / "s", tmp_path / "c", tmp_path / "r.json", slot, tmp_path / "log",
                       entry=FAKE, env={"FAKE_TRIAL_MODE": "sleep"})
    try:
        t = running_trial(study)
        reaper.mark_owner(study, t, proc)
        t.set_user_attr(reaper.OWNER_PID, dead_pid())  # as if the driver that started it had died
        t.set_user_attr(reaper.OWNER_START, None)
        assert proc.poll() is None
        assert [x.number for x in reaper.reap_stale_trials(study)] == [t.number]
        assert proc.wait(10) is not None and proc.returncode == -9
    finally:
        proc.kill(grace_s=0.1)


def test_unrelated_group_with_a_recycled_id_is_not_killed(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert not reaper.kill_orphan_group(p.pid, str(tmp_path / "not-its-record.json"))
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_heartbeat_stale_trials_are_reaped_from_any_host(tmp_path):
    storage = reaper.make_heartbeat_storage(f"sqlite:///{tmp_path / 'hb.db'}", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(study_name="hb", storage=storage, directions=["minimize"])
    alive = running_trial(study, owner_host="remote", owner_pid=1)
    stale = running_trial(study, owner_host="remote", owner_pid=1)
    with reaper.heartbeat(study, alive):
        with reaper.heartbeat(study, stale):
            time.sleep(0.2)  # one beat each
        time.sleep(3.0)      # `stale` misses its beats (> 2 s); `alive` beats every 1 s
        reaped = reaper.reap_stale_trials(study, retry=False)
    assert [t.number for t in reaped] == [stale.number]
    assert state(study, stale) == TrialState.FAIL and state(study, alive) == TrialState.RUNNING
    assert study._storage.get_trial(stale._trial_id).user_attrs["reason"].startswith("reaped: heartbeat stale")
