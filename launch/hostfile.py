"""DeepSpeed hostfiles: ``hostname slots=N`` per line, ``#`` comments.

We parse the file ourselves rather than import ``deepspeed.launcher.runner.fetch_hostfile``:
importing DeepSpeed costs seconds and probes accelerators, and the study driver only needs the
host list (to plan the multi-node slot and name its master address) with a clear error per line.
"""
from __future__ import annotations

import os
import re
import socket
from collections import OrderedDict

from archsearch.errors import UserError

_LINE = re.compile(r"^(?P<host>[A-Za-z0-9_.:\-\[\]]+)\s+slots\s*=\s*(?P<slots>\d+)\s*$")


def read_hostfile(path: str | os.PathLike) -> "OrderedDict[str, int]":
    """``{host: slots}`` in file order; UserError naming the file and line on a bad entry."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise UserError(f"hostfile: cannot read {path}: {exc.strerror}") from None
    hosts: OrderedDict[str, int] = OrderedDict()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise UserError(f"hostfile {path}:{n}: expected 'HOST slots=N', got {raw.strip()!r}")
        host, slots = m["host"], int(m["slots"])
        if slots < 1:
            raise UserError(f"hostfile {path}:{n}: slots must be >= 1, got {slots}")
        if host in hosts:
            raise UserError(f"hostfile {path}:{n}: host {host!r} is listed twice")
        hosts[host] = slots
    if not hosts:
        raise UserError(f"hostfile {path}: lists no hosts")
    return hosts


def write_hostfile(path: str | os.PathLike, hosts: "dict[str, int]") -> str:
    """Write ``{host: slots}`` as a DeepSpeed hostfile; returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        for host, slots in hosts.items():
            f.write(f"{host} slots={int(slots)}\n")
    return str(path)


def slurm_hostfile(path: str | os.PathLike, gpus_per_node: int, nodelist: str | None = None) -> str:
    """Write a hostfile for the current Slurm allocation (``SLURM_JOB_NODELIST`` expanded by
    ``scontrol show hostnames``), ``gpus_per_node`` slots per node; returns the path."""
    import subprocess

    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise UserError("SLURM_JOB_NODELIST: not set (not inside a Slurm allocation?)")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise UserError(f"scontrol show hostnames {nodelist}: failed ({exc})") from None
    return write_hostfile(path, {h: gpus_per_node for h in out.split()})


def this_host() -> str:
    """The name other hosts know this one by (recorded as a trial's owner)."""
    return socket.gethostname()
