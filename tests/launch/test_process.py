"""start_trial: real process groups on CPU slots, with a fault-injecting trial program.

Single-process CPU slots start the program directly; multi-process slots go through DeepSpeed's
launcher and form a real gloo group (two CPU slots of two processes stand in for two GPU slots).
"""
import os
import re
import signal
import time
from pathlib import Path

import pytest

from launch.process import start_trial
from launch.slots import plan_slots

FAKE = [str(Path(__file__).with_name("fake_trial.py"))]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except OSError:
        return False


def wait_for_log(proc, pattern, count=1, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hits = re.findall(pattern, proc.log_tail())
        if len(hits) >= count:
            return hits
        assert proc.poll() is None, f"trial ended early:\n{proc.log_tail()}"
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not seen in the log:\n{proc.log_tail()}")


def run(tmp_path, slot, mode, name="t", **kw):
    env = {"FAKE_TRIAL_MODE": mode, **kw.pop("env", {})}
    return start_trial(tmp_path / "spec.json", tmp_path / "cfg.json", tmp_path / f"{name}.json", slot,
                       tmp_path / f"{name}.log", entry=FAKE, env=env, **kw)


def test_single_cpu_slot_starts_directly_with_rank_env(tmp_path):
    (slot,) = plan_slots([], 1, cpu_slots=1)
    p = run(tmp_path, slot, "ok")
    assert p.wait(60) == 0
    assert not p.via_launcher
    status, reason, rec = p.outcome()
    assert (status, reason) == ("ok", "")
    assert rec["env"] == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(slot.master_port), "CUDA_VISIBLE_DEVICES": "",
                          "OMP_NUM_THREADS": str(slot.cpu_threads)}
    assert os.getpgid(0) != p.pgid  # its own process group, not the test's


@pytest.mark.slow  # ~20 s on 2 cores: two launchers and four torch imports at once
def test_two_cpu_slots_run_concurrent_gloo_groups_through_the_launcher(tmp_path):
    slots = plan_slots([], 2, cpu_slots=2)
    procs = [run(tmp_path, s, "ok", name=f"t{s.index}") for s in slots]
    for p in procs:
        assert p.wait(120) == 0, p.log_tail()
    for p in procs:
        assert p.via_launcher and "deepspeed.launcher.runner" in p.cmd
        status, _, rec = p.outcome()
        assert status == "ok"
        assert rec["world_size"] == 2 and rec["rank_sum"] == 0 + 1  # both ranks met in one group
        assert rec["env"]["MASTER_PORT"] == str(p.master_port)
    assert procs[0].master_port != procs[1].master_port


def test_kill_9_of_a_rank_fails_the_trial_and_ends_its_whole_group(tmp_path):
    (slot,) = plan_slots([], 2, cpu_slots=1)
    p = run(tmp_path, slot, "sleep")
    pids = [int(x) for x in wait_for_log(p, r"mode sleep pid (\d+)", count=2)]
    os.kill(pids[1], signal.SIGKILL)
    assert p.wait(60) is not None
    status, reason, _ = p.outcome()
    assert status == "failed" and reason.startswith("killed: SIGKILL"), reason
    deadline = time.monotonic() + 10
    while any(alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(x) for x in pids)


def test_killed_trial_frees_its_slot_for_the_next(tmp_path):
    (slot,) = plan_slots([], 1, cpu_slots=1)
    p = run(tmp_path, slot, "sleep", name="a")
    wait_for_log(p, r"mode sleep")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(30)
    assert p.outcome()[:2] == ("failed", "killed: SIGKILL")
    q = run(tmp_path, slot, "ok", name="b")
    assert q.wait(60) == 0 and q.outcome()[0] == "ok"


def test_timeout_kills_the_group_and_says_timeout(tmp_path):
    (slot,) = plan_slots([], 1, cpu_slots=1)
    p = run(tmp_path, slot, "sleep", timeout_s=1.0)
    t0 = time.monotonic()
    rc = p.wait()
    assert rc is not None and time.monotonic() - t0 < 10
    assert p.timed_out and not alive(p.pid)
    assert p.outcome()[:2] == ("failed", "timeout")


def test_cuda_oom_message_makes_the_candidate_infeasible(tmp_path):
    (slot,) = plan_slots([], 1, cpu_slots=1)
    p = run(tmp_path, slot, "oom")
    assert p.wait(60) == 1
    assert p.outcome()[:2] == ("infeasible", "oom")


def test_crash_reason_names_the_exception(tmp_path):
    (slot,) = plan_slots([], 1, cpu_slots=1)
    p = run(tmp_path, slot, "crash")
    assert p.wait(60) == 1
    status, reason, rec = p.outcome()
    assert status == "failed" and reason == "crashed: exit code 1: ValueError: injected crash" and rec is None


def test_wait_with_timeout_returns_none_while_running_and_stale_record_is_removed(tmp_path):
    (slot,) = plan_slots([], 1, cpu_slots=1)
    (tmp_path / "t.json").write_text('{"status": "ok"}')  # left over from an earlier run
    p = run(tmp_path, slot, "sleep")
    assert not (tmp_path / "t.json").exists()
    assert p.wait(0.2) is None and p.returncode is None
    p.kill(grace_s=0.5)
    assert p.returncode is not None and p.outcome()[0] == "failed"
