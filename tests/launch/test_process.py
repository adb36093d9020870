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


def tiny_trial_files(tmp_path, ds_config):
    """Spec and config of a real, tiny trial (2 layers, d_model 16, 4 steps of MQAR)."""
    import json

    from archsearch.spec import ArchSpec, LayerSpec

    spec = ArchSpec(vocab_size=64, d_model=16, mlp_expansion=0,
                    layers=(LayerSpec("linear_attn", {"num_heads": 2}), LayerSpec("softmax", {"num_heads": 2})))
    (tmp_path / "spec.json").write_text(spec.to_json())
    cfg = {"task": "mqar", "task_params": {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4,
                                           "num_train_examples": 256, "num_test_examples": 32},
           "train": {"tokens": 2048, "max_seconds": 60, "batch_size": 16, "precision": "auto"},
           "measure": {"context": 128, "batch": 1, "prefill_len": 16, "repeats": 1, "decode_steps": 2},
           "seed": 0, "device": "cpu", "out_dir": str(tmp_path / "run"), "ds_config": ds_config}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    return tmp_path / "spec.json", tmp_path / "cfg.json"


@pytest.mark.slow  # ~40 s on 2 busy cores: two launchers, four ranks, one real DeepSpeed trial
def test_real_zero2_trial_survives_a_rank_killed_in_the_next_slot(tmp_path):
    """Two CPU slots of 2 gloo ranks stand in for two 2-GPU slots: slot 0 trains a real trial with
    the shipped ZeRO-2 bf16 config while a rank of slot 1 is SIGKILLed; only slot 1's group dies."""
    from launch.dsconfig import load_ds_config

    slots = plan_slots([], 2, cpu_slots=2, ds_config="zero2_bf16")
    assert slots[0].master_port != slots[1].master_port
    spec, cfg = tiny_trial_files(tmp_path, load_ds_config(slots[0].ds_config))
    real = start_trial(spec, cfg, tmp_path / "real.json", slots[0], tmp_path / "real.log")
    victim = run(tmp_path, slots[1], "sleep", name="victim")
    assert real.via_launcher and victim.via_launcher and "deepspeed.launcher.runner" in real.cmd

    pids = [int(x) for x in wait_for_log(victim, r"mode sleep pid (\d+)", count=2, timeout=120)]
    os.kill(pids[1], signal.SIGKILL)
    assert victim.wait(60) is not None
    status, reason, _ = victim.outcome()
    assert status == "failed" and reason.startswith("killed: SIGKILL"), reason
    deadline = time.monotonic() + 10
    while any(alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(x) for x in pids)  # the launcher took the surviving rank down with it

    assert real.wait(300) == 0, real.log_tail()
    status, reason, rec = real.outcome()
    assert (status, reason) == ("ok", "")
    t = rec["train"]
    # data parallel over the slot's 2 ranks, ZeRO-2 and bf16 from the shipped config, global batch kept
    assert (t["world_size"], t["zero_stage"], t["precision"]) == (2, 2, "bf16")
    assert (t["global_batch"], t["micro_batch"], t["grad_accum"]) == (16, 8, 1)
    assert t["steps"] == 4 and t["final_loss"] == t["final_loss"]  # ran, and not NaN


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


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_slots_pin_each_trial_to_its_own_gpus(tmp_path):
    slots = plan_slots(None, 1, cpu_slots=1)
    assert slots and all(s.device == "cuda" for s in slots)
    last = slots[-1]
    p = run(tmp_path, last, "ok")
    assert p.wait(300) == 0, p.log_tail()
    # the launcher turned --include localhost:<id> into the rank's CUDA_VISIBLE_DEVICES
    assert p.outcome()[2]["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, last.gpus))
    spec, cfg = tiny_trial_files(tmp_path, None)
    import json

    c = json.loads(cfg.read_text())
    c["device"] = "cuda"
    cfg.write_text(json.dumps(c))
    real = start_trial(spec, cfg, tmp_path / "real.json", last, tmp_path / "real.log")
    assert real.wait(600) == 0, real.log_tail()
    status, _, rec = real.outcome()
    assert status == "ok" and rec["throughput"]["device"] and rec["train"]["precision"] == "bf16"
