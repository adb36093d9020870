"""The argv and environment start_trial builds for each kind of slot (no process started)."""
import pytest

from launch.process import build_command
from launch.slots import Slot

BASE_ENV = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def cmd_for(slot, **kw):
    return build_command("s.json", "c.json", "r.json", slot, slot.master_port, base_env=dict(BASE_ENV), **kw)


def test_gpu_slot_uses_the_launcher_with_physical_ids():
    cmd, env, via = cmd_for(Slot(index=1, gpus=(2, 3), num_procs=2, master_port=23456, cpu_threads=8))
    assert via
    i = cmd.index("deepspeed.launcher.runner")
    assert cmd[i - 1] == "-m"
    assert cmd[i + 1:] == ["--master_port", "23456", "--no_local_rank", "--include", "localhost:2,3",
                           "--module", "archsearch.trial", "--spec", "s.json", "--config", "c.json", "--out", "r.json"]
    # the launcher sets the ranks' CUDA_VISIBLE_DEVICES from --include; the parent's would only be ignored
    assert "CUDA_VISIBLE_DEVICES" not in env and env["OMP_NUM_THREADS"] == "8"


def test_multi_process_cpu_slot_asks_the_launcher_for_k_gloo_ranks():
    cmd, env, via = cmd_for(Slot(index=0, gpus=(), num_procs=2, master_port=21000))
    assert via and cmd[cmd.index("--num_gpus") + 1] == "2" and "--include" not in cmd
    assert env["DS_ACCELERATOR"] == "cpu"


def test_single_cpu_slot_starts_directly_with_rendezvous_env():
    cmd, env, via = cmd_for(Slot(index=0, gpus=(), num_procs=1, master_port=21001, cpu_threads=2))
    assert not via and "deepspeed.launcher.runner" not in cmd
    assert cmd[1:5] == ["-u", "-m", "archsearch.trial", "--spec"]
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")} == {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "21001",
        "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "2"}


def test_launcher_can_be_forced_and_a_script_entry_is_passed_as_is():
    slot = Slot(index=0, gpus=(), num_procs=1, master_port=21002)
    cmd, _, via = cmd_for(slot, use_launcher=True, entry=("tests/x.py",))
    assert via and "--module" not in cmd and cmd[cmd.index("tests/x.py") + 1] == "--spec"
    with pytest.raises(ValueError, match="need the DeepSpeed launcher"):
        cmd_for(Slot(index=0, gpus=(), num_procs=2, master_port=1), use_launcher=False)


def test_hostfile_slot_spans_the_hosts():
    slot = Slot(index=0, gpus=(0, 1), num_procs=4, master_port=22000, hostfile="/shared/hostfile",
                master_addr="node-a")
    cmd, _, via = cmd_for(slot)
    assert via and cmd[cmd.index("--hostfile") + 1] == "/shared/hostfile"
    assert cmd[cmd.index("--master_addr") + 1] == "node-a" and "--include" not in cmd
