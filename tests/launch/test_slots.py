"""plan_slots: GPU lists, k GPUs per trial, CPU slots, distinct free ports, bad input."""
import socket

import pytest

from archsearch.errors import UserError
from launch import slots as slots_mod
from launch.slots import parse_gpu_list, plan_slots, port_is_free, visible_gpus


def test_gpu_slots_split_the_list_without_sharing():
    s = plan_slots([0, 1, 2, 3], 2, cpu_slots=1)
    assert [x.gpus for x in s] == [(0, 1), (2, 3)]
    assert all(x.device == "cuda" and x.num_procs == 2 for x in s)
    assert [x.index for x in s] == [0, 1]


def test_one_gpu_per_trial_gives_one_slot_per_gpu_and_keeps_physical_ids():
    s = plan_slots([3, 5, 6], 1, cpu_slots=4)  # cpu_slots is ignored on GPU
    assert [x.gpus for x in s] == [(3,), (5,), (6,)]


def test_leftover_gpus_stay_idle():
    s = plan_slots([0, 1, 2], 2, cpu_slots=1)
    assert [x.gpus for x in s] == [(0, 1)]


def test_cpu_slots_are_gloo_groups_of_k_processes():
    s = plan_slots([], 2, cpu_slots=3)
    assert len(s) == 3
    assert all(x.gpus == () and x.device == "cpu" and x.num_procs == 2 for x in s)
    assert all(x.cpu_threads >= 1 for x in s)


def test_ports_are_distinct_and_free():
    s = plan_slots([], 1, cpu_slots=6)
    ports = [x.master_port for x in s]
    assert len(set(ports)) == 6
    assert all(slots_mod.PORT_LOW <= p < slots_mod.PORT_HIGH and port_is_free(p) for p in ports)


def test_busy_port_is_skipped(monkeypatch):
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        busy = held.getsockname()[1]
        assert not port_is_free(busy)
        monkeypatch.setattr(slots_mod, "PORT_LOW", busy)
        monkeypatch.setattr(slots_mod, "PORT_HIGH", busy + 2)
        s = plan_slots([], 1, cpu_slots=1)
        assert s[0].master_port == busy + 1


@pytest.mark.parametrize("gpus,k,n,msg", [
    ([0, 1], 3, 1, "gpus_per_trial: must be <= the 2 GPU"),
    ([0, 0], 1, 1, "gpus: each GPU may be listed once"),
    ([-1], 1, 1, "gpus: GPU ids must be integers >= 0"),
    ([], 0, 1, "gpus_per_trial: must be an integer >= 1"),
    ([], 1, 0, "slots: must be an integer >= 1"),
])
def test_bad_input_names_the_field(gpus, k, n, msg):
    with pytest.raises(UserError, match=msg):
        plan_slots(gpus, k, n)


def test_visible_gpus_reads_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert visible_gpus() == [2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == []
    assert plan_slots(None, 1, cpu_slots=2)[0].device == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234abcd")
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES"):
        visible_gpus()


def test_parse_gpu_list():
    assert parse_gpu_list("0,1, 3") == [0, 1, 3]
    assert parse_gpu_list("none") == []
    assert parse_gpu_list(None) is None
    with pytest.raises(UserError, match="--gpus"):
        parse_gpu_list("0;1")


def test_hostfile_slot(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("# two nodes\nnode-a slots=4\nnode-b slots=4\n")
    (s,) = plan_slots(None, 4, 1, hostfile=str(hf))
    assert s.hostfile == str(hf) and s.num_procs == 8 and s.master_addr == "node-a"
    assert s.gpus == (0, 1, 2, 3) and s.device == "cuda"
    hf.write_text("node-a 4\n")
    with pytest.raises(UserError, match=r"hostfile .*:1: expected 'HOST slots=N'"):
        plan_slots(None, 4, 1, hostfile=str(hf))
