"""Several `archsearch worker` processes on one study, after a driver was SIGKILLed mid-trial.

The killed driver's trial is left RUNNING (and its process group orphaned); the next workers reap
it (owner pid gone on this host), kill the orphan, retry its candidate, and together complete
exactly the requested number of trials. PostgreSQL when ARCHSEARCH_TEST_POSTGRES_URL is set
(.ci/run sets it), else a journal file (the same lock and reaper paths, one host).
"""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

HERE = Path(__file__).parent
PG_URL = os.environ.get("ARCHSEARCH_TEST_POSTGRES_URL")


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # three worker processes and two real trials: ~40 s on 2 busy cores
def test_killed_driver_resumes_with_workers_exact_count(tmp_path):
    import search_spaces
    from archsearch.study import load_study, open_study

    url = PG_URL or str(tmp_path / "journal.log")
    name = f"workers-{uuid.uuid4().hex[:8]}"
    space = search_spaces.load(str(HERE / "tiny_space.yaml"))
    open_study(space, url, name, root=tmp_path / "studies")
    n = 2
    cmd = [sys.executable, "-m", "archsearch", "worker", "--storage", url, "--study", name,
           "--root", str(tmp_path / "studies"), "--no-progress", "--trials", str(n)]
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def start(tag):
        log = open(tmp_path / f"{tag}.log", "wb")
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    driver = start("driver")
    study = load_study(name, url, tmp_path / "studies")
    deadline = time.monotonic() + 120
    running = []
    while time.monotonic() < deadline and driver.poll() is None:
        running = [t for t in study.get_trials(states=(TrialState.RUNNING,)) if "launch_pgid" in t.user_attrs]
        if running:
            break
        time.sleep(0.3)
    assert running, (tmp_path / "driver.log").read_text()
    orphan = running[0]
    os.kill(driver.pid, signal.SIGKILL)  # the driver only: its trial lives on in its own session
    driver.wait()

    workers = [start(f"w{i}") for i in range(2)]
    for i, w in enumerate(workers):
        assert w.wait(300) == 0, (tmp_path / f"w{i}.log").read_text()

    trials = load_study(name, url, tmp_path / "studies").get_trials()
    by_state = {s: [t for t in trials if t.state == s] for s in TrialState}
    assert len(by_state[TrialState.COMPLETE]) == n
    assert not by_state[TrialState.RUNNING] and not by_state[TrialState.WAITING]
    reaped = [t for t in by_state[TrialState.FAIL] if t.number == orphan.number]
    assert reaped and reaped[0].user_attrs["reason"] == f"reaped: owner pid {driver.pid} on {orphan.user_attrs['owner_host']} is gone"
    assert len(by_state[TrialState.FAIL]) == 1
    assert [t.user_attrs.get("retry_of") for t in trials].count(orphan.number) == 1  # its candidate retried once
    assert len({t.user_attrs["run_dir"] for t in by_state[TrialState.COMPLETE]}) == n  # none trained twice
    assert not group_alive(orphan.user_attrs["launch_pgid"])
