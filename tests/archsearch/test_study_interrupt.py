"""Ctrl-C during a trial: it is marked failed (interrupted), the study resumes, no duplicates."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from optuna.trial import TrialState

from archsearch import study as st
from study_spaces import tiny

pytestmark = pytest.mark.slow  # three real trial processes, one of them interrupted


def launch(space_file: Path, root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "archsearch", "launch", str(space_file), "--root", str(root),
                             "--no-progress", "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_interrupt_then_resume(tmp_path):
    space_file = tmp_path / "tiny.yaml"
    space_file.write_text(yaml.safe_dump(tiny(constraints={}, study={"trials": 2, "seed": 0},
                                              model__per_layer={"blocks": ["linear_attn", "softmax"]})))
    root = tmp_path / "studies"
    proc = launch(space_file, root)
    deadline = time.monotonic() + 120
    while not list(root.glob("tiny/trials/*/run0-*/trial.log")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else "timeout"
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "archsearch launch: interrupted" in out and "Traceback" not in out
    study = st.load_study("tiny", None, root)
    (t0,) = study.trials
    assert t0.state == TrialState.FAIL and t0.user_attrs["status"] == "interrupted" and t0.user_attrs["reason"] == "interrupted"
    pgid = t0.user_attrs["launch_pgid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # the trial's process group is gone

    proc = launch(space_file, root)
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    study = st.load_study("tiny", None, root)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 2 and len(study.trials) == 3
    trained = [t.user_attrs["spec_hash"] for t in complete if st.REUSED_FROM not in t.user_attrs]
    assert len(trained) == len(set(trained))  # no candidate trained twice
