"""Slots: the units of hardware one trial runs on, one trial per slot at a time.

A GPU slot is ``gpus_per_trial`` GPUs that no other slot shares (they reach the trial as
``CUDA_VISIBLE_DEVICES``); ``G`` GPUs give ``G // k`` concurrent slots. Without GPUs a slot is a
group of ``gpus_per_trial`` gloo processes on the CPU, and ``cpu_slots`` of them run side by side.
Every slot has its own master port (checked free when planned, re-checked when a trial starts),
so the process groups of concurrent trials never meet.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket

from archsearch.errors import UserError

log = logging.getLogger(__name__)

# Master ports come from below Linux's ephemeral range (32768-60999), so the kernel never hands
# one of them to an outgoing connection, and from a random start, so two workers planning on the
# same host at the same moment are unlikely to pick the same port (start_trial re-checks anyway).
PORT_LOW, PORT_HIGH = 20000, 32000


@dataclasses.dataclass(frozen=True)
class Slot:
    """One trial's share of the machine.

    index: position in the plan (0..n-1), used in log and run directory names.
    gpus: physical GPU ids of this slot (what ``CUDA_VISIBLE_DEVICES`` will say); ``()`` on CPU.
    num_procs: processes in the trial's process group (= len(gpus) on GPU; gloo ranks on CPU).
    master_port: the rendezvous port of the slot's process group.
    cpu_threads: OMP/torch threads per process, so concurrent CPU slots do not oversubscribe cores.
    hostfile: a DeepSpeed hostfile for a trial that spans several hosts (None = this host only).
    master_addr: the rendezvous address (the first host of the hostfile for multi-node trials).
    ds_config: the user's DeepSpeed config (``--ds-config``: a path or a shipped name) for trials on
        this slot; None = the default for the slot (``launch.dsconfig.default_ds_config``).
    """

    index: int
    gpus: tuple[int, ...]
    num_procs: int
    master_port: int
    cpu_threads: int = 1
    hostfile: str | None = None
    master_addr: str = "127.0.0.1"
    ds_config: str | None = None

    @property
    def device(self) -> str:
        """``"cuda"`` for a GPU slot, ``"cpu"`` otherwise."""
        return "cuda" if self.gpus else "cpu"

    def describe(self) -> str:
        """Short human label, e.g. ``slot 1 (GPU 2,3)`` or ``slot 0 (CPU x2)``."""
        what = f"GPU {','.join(map(str, self.gpus))}" if self.gpus else f"CPU x{self.num_procs}"
        if self.hostfile:
            what += f", hostfile {self.hostfile}"
        return f"slot {self.index} ({what})"


def visible_gpus() -> list[int]:
    """Physical ids of the GPUs this process may use.

    ``CUDA_VISIBLE_DEVICES`` (when set) names them; otherwise all GPUs torch sees. Ids, not torch
    indices, because the DeepSpeed launcher's ``--include localhost:i`` means physical GPU ``i``.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        env = env.strip()
        if env in ("", "-1"):
            return []
        ids = []
        for part in env.split(","):
            part = part.strip()
            if not part.isdigit():
                raise UserError(
                    f"CUDA_VISIBLE_DEVICES: only integer GPU ids are supported for slot planning, got {env!r}; "
                    "pass --gpus explicitly"
                )
            ids.append(int(part))
        return ids
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return []
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def usable_cpus() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def port_is_free(port: int, host: str = "") -> bool:
    """True when a TCP listener could bind ``port`` now (the check gloo/NCCL's store will do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(exclude: set[int] | frozenset[int] = frozenset(), rng: random.Random | None = None) -> int:
    """A free port in [PORT_LOW, PORT_HIGH) not in ``exclude``, starting from a random point."""
    rng = rng or random.Random()
    span = PORT_HIGH - PORT_LOW
    start = rng.randrange(span)
    for i in range(span):
        port = PORT_LOW + (start + i) % span
        if port not in exclude and port_is_free(port):
            return port
    raise RuntimeError(f"no free TCP port in [{PORT_LOW}, {PORT_HIGH})")


def plan_slots(
    gpus: list[int] | None,
    gpus_per_trial: int,
    cpu_slots: int,
    *,
    hostfile: str | None = None,
    ds_config: str | None = None,
) -> list["Slot"]:
    """Split the machine into slots.

    gpus: physical GPU ids to use; ``None`` = all visible (``visible_gpus()``); ``[]`` = CPU only.
    gpus_per_trial: GPUs per trial (k) on GPU; gloo processes per trial on CPU.
    cpu_slots: concurrent CPU trials when there are no GPUs (ignored on GPU: G // k slots).
    hostfile: a DeepSpeed hostfile; gives one slot whose trials span every host in it, one rank per
    ``slots=`` entry (gpus and gpus_per_trial then come from the file).
    ds_config: a DeepSpeed config file (or shipped name) every slot's trials use instead of the
    default; checked here so a bad file fails before any trial starts.
    Bad values raise UserError naming the argument.
    """
    if not isinstance(gpus_per_trial, int) or gpus_per_trial < 1:
        raise UserError(f"gpus_per_trial: must be an integer >= 1, got {gpus_per_trial!r}")
    if not isinstance(cpu_slots, int) or cpu_slots < 1:
        raise UserError(f"slots: must be an integer >= 1, got {cpu_slots!r}")
    if ds_config is not None:
        from launch.dsconfig import load_ds_config

        load_ds_config(ds_config)
        if os.path.exists(ds_config):
            ds_config = os.path.abspath(ds_config)
    if hostfile is not None:
        from launch.hostfile import read_hostfile

        hosts = read_hostfile(hostfile)
        return [
            Slot(
                index=0,
                gpus=tuple(range(next(iter(hosts.values())))),  # each host's GPUs, as its slots= says
                num_procs=sum(hosts.values()),
                master_port=pick_free_port(),
                cpu_threads=1,
                hostfile=os.path.abspath(hostfile),
                master_addr=next(iter(hosts)),
                ds_config=ds_config,
            )
        ]
    if gpus is None:
        gpus = visible_gpus()
    else:
        gpus = list(gpus)
        for g in gpus:
            if not isinstance(g, int) or isinstance(g, bool) or g < 0:
                raise UserError(f"gpus: GPU ids must be integers >= 0, got {g!r}")
        if len(set(gpus)) != len(gpus):
            raise UserError(f"gpus: each GPU may be listed once, got {gpus}")

    ports: set[int] = set()
    slots = []
    if gpus:
        if gpus_per_trial > len(gpus):
            raise UserError(f"gpus_per_trial: must be <= the {len(gpus)} GPU(s) given ({gpus}), got {gpus_per_trial}")
        n = len(gpus) // gpus_per_trial
        if len(gpus) % gpus_per_trial:
            log.warning("GPUs %s stay idle: %d GPUs do not split into trials of %d",
                        gpus[n * gpus_per_trial:], len(gpus), gpus_per_trial)
        threads = max(1, usable_cpus() // len(gpus))
        for i in range(n):
            port = pick_free_port(ports)
            ports.add(port)
            group = tuple(gpus[i * gpus_per_trial:(i + 1) * gpus_per_trial])
            slots.append(Slot(index=i, gpus=group, num_procs=gpus_per_trial, master_port=port,
                              cpu_threads=threads, ds_config=ds_config))
        return slots

    threads = max(1, usable_cpus() // (cpu_slots * gpus_per_trial))
    for i in range(cpu_slots):
        port = pick_free_port(ports)
        ports.add(port)
        slots.append(Slot(index=i, gpus=(), num_procs=gpus_per_trial, master_port=port,
                          cpu_threads=threads, ds_config=ds_config))
    return slots


def parse_gpu_list(text: str | None) -> list[int] | None:
    """Parse a ``--gpus`` value: ``"0,1,3"`` -> [0, 1, 3]; ``"none"``/``""`` -> [] (CPU); None -> None."""
    if text is None:
        return None
    text = text.strip()
    if text.lower() in ("", "none", "cpu"):
        return []
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UserError(f"--gpus: must be comma-separated GPU ids like 0,1 (or 'none'), got {text!r}")
        out.append(int(part))
    return out
