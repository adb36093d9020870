"""Faults inside a running study (archsearch.study's loop on launch/): each fault is recorded with
its reason, the slot is reused and the study goes on to its budget. The first trial starts sleep
and is killed with SIGKILL by the test, the next ones report divergence and CUDA OOM, the rest are
real trials of a tiny space.
"""
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

HERE = Path(__file__).parent
FAKE = (str(HERE / "fake_trial.py"),)


@pytest.mark.slow  # one real trial (~10 s on 2 busy cores) plus three injected faults
def test_kill_divergence_and_oom_in_a_study(tmp_path, monkeypatch):
    import search_spaces
    from archsearch.study import StudyRunner, open_study
    from launch.slots import plan_slots

    counter = tmp_path / "starts"
    monkeypatch.setenv("FAKE_TRIAL_MODE", "sequence")
    monkeypatch.setenv("FAKE_TRIAL_SEQUENCE", "sleep,record:diverged,oom")
    monkeypatch.setenv("FAKE_TRIAL_COUNTER", str(counter))
    space = search_spaces.load(str(HERE / "tiny_space.yaml"))
    study = open_study(space, str(tmp_path / "journal.log"), "faults", root=tmp_path)
    (slot,) = plan_slots([], 1, 1)
    runner = StudyRunner(space, study, [slot], n_trials=2, root=tmp_path, progress=False, entry=FAKE)

    result = {}
    th = threading.Thread(target=lambda: result.setdefault("summary", runner.run()), daemon=True)
    th.start()
    # the first trial sleeps: kill it as an OOM killer or a user would, with SIGKILL
    deadline = time.monotonic() + 60
    pid = None
    while pid is None and time.monotonic() < deadline:
        for log in tmp_path.glob("faults/trials/00000/run0-*/trial.log"):
            m = re.search(r"mode sleep pid (\d+)", log.read_text())
            pid = int(m.group(1)) if m else None
        time.sleep(0.1)
    assert pid, "the first trial never started"
    os.kill(pid, signal.SIGKILL)
    th.join(240)
    assert not th.is_alive()

    trials = sorted(optuna.load_study(study_name="faults", storage=study._storage).get_trials(),
                    key=lambda t: t.number)
    got = [(t.state, t.user_attrs.get("status"), t.user_attrs.get("reason")) for t in trials]
    assert got[0] == (TrialState.FAIL, "failed", "killed: SIGKILL")
    assert got[1] == (TrialState.FAIL, "failed", "diverged")
    assert got[2][:3] == (TrialState.COMPLETE, "infeasible", "oom")   # told, so the sampler learns
    assert got[3][:2] == (TrialState.COMPLETE, "ok")                   # the slot was reused
    assert len(trials) == 4 and result["summary"].complete == 2
    assert len(counter.read_text().split()) == 4  # one process per trial, no trial started twice
    rec = json.loads(next(tmp_path.glob("faults/trials/00003/run0-*/record.json")).read_text())
    assert rec["status"] == "ok" and rec["train"]["steps"] > 0
