"""Start one trial as its own process group on a slot; watch it, time it out, kill it, classify it.

Every trial runs in a new session (``setsid``): the DeepSpeed launcher, its per-node launcher and
every rank share one process group that belongs to the trial, not to the study. A crash, an OOM
or a hang therefore ends only that group, and ``kill()`` ends the whole tree at once
(``killpg``) rather than chasing children.

How a trial starts:

* GPU slots and multi-process CPU slots go through DeepSpeed's launcher::

      python -m deepspeed.launcher.runner --master_port P --no_local_rank \\
          --include localhost:2,3 --module archsearch.trial --spec S --config C --out R

  (``--num_gpus k`` instead of ``--include`` for k gloo processes on CPU; ``--hostfile`` for a
  trial spanning hosts). ``--include`` names physical GPU ids; the launcher turns them into the
  ranks' ``CUDA_VISIBLE_DEVICES``, so two slots never share a GPU.
* Single-process CPU slots start ``python -m archsearch.trial`` directly with ``RANK=0``,
  ``WORLD_SIZE=1``, ``LOCAL_RANK=0``, ``MASTER_ADDR``, ``MASTER_PORT`` set (still in its own
  session). Why: the launcher imports DeepSpeed twice (runner, then the per-node launcher) and
  polls its ranks once a second; on a 2-core CPU box that measured ~10 s of overhead per trial
  against ~0.1 s for a plain ``python`` start (docs/distributed.md), more than a tiny CPU trial's
  training time. Nothing is lost: with one process there is no group to rendezvous.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import time
import weakref
from pathlib import Path
from typing import Sequence

from launch.faults import classify, read_record
from launch.slots import Slot, pick_free_port, port_is_free

DEFAULT_ENTRY: tuple[str, ...] = ("-m", "archsearch.trial")
LOG_TAIL_BYTES = 256 * 1024

_live: "weakref.WeakSet[TrialProcess]" = weakref.WeakSet()


def _entry_args(entry: Sequence[str], launcher: bool) -> list[str]:
    """``("-m", "pkg.mod")`` or ``("path/script.py",)`` as the plain or the launcher spelling."""
    entry = list(entry)
    if entry and entry[0] == "-m":
        return (["--module", entry[1]] if launcher else ["-m", entry[1]]) + entry[2:]
    return entry


def build_command(
    spec_path: str | os.PathLike,
    config_path: str | os.PathLike,
    out_path: str | os.PathLike,
    slot: Slot,
    master_port: int,
    *,
    entry: Sequence[str] = DEFAULT_ENTRY,
    use_launcher: bool | None = None,
    launcher_args: Sequence[str] = (),
    base_env: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str], bool]:
    """The argv and environment that run one trial on ``slot``; returns ``(cmd, env, via_launcher)``.

    use_launcher: None = the DeepSpeed launcher unless the slot is a single CPU process (see the
    module docstring); True/False force it.
    """
    if use_launcher is None:
        use_launcher = bool(slot.gpus) or slot.num_procs > 1 or slot.hostfile is not None
    trial_args = ["--spec", str(spec_path), "--config", str(config_path), "--out", str(out_path)]
    env = dict(os.environ if base_env is None else base_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["OMP_NUM_THREADS"] = str(slot.cpu_threads)

    if not use_launcher:
        if slot.num_procs != 1 or slot.hostfile:
            raise ValueError(f"{slot.describe()}: {slot.num_procs} processes need the DeepSpeed launcher")
        env.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1",
            MASTER_ADDR=slot.master_addr, MASTER_PORT=str(master_port),
        )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot.gpus))
        if not slot.gpus:
            env["DS_ACCELERATOR"] = "cpu"
        cmd = [sys.executable, "-u"] + _entry_args(entry, launcher=False) + trial_args
        return cmd, env, False

    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--master_port", str(master_port), "--no_local_rank"]
    if slot.hostfile:
        # DeepSpeed's default multi-node backend: pdsh over ssh runs deepspeed.launcher.launch on
        # every host with its node rank, which sets RANK/WORLD_SIZE/... for the ranks there.
        cmd += ["--hostfile", slot.hostfile, "--master_addr", slot.master_addr]
    elif slot.gpus:
        cmd += ["--include", "localhost:" + ",".join(map(str, slot.gpus))]
        # --include already names physical ids; a CUDA_VISIBLE_DEVICES left in the launcher's
        # env would only produce its "ignoring VISIBLE_DEVICES" warning.
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        cmd += ["--num_gpus", str(slot.num_procs)]
        env["DS_ACCELERATOR"] = "cpu"
        env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd += list(launcher_args)
    cmd += _entry_args(entry, launcher=True) + trial_args
    return cmd, env, True


class TrialProcess:
    """A running trial's process group. ``poll()`` also enforces the per-trial timeout."""

    def __init__(self, popen, slot: Slot, cmd: list[str], out_path: Path, log_path: Path,
                 master_port: int, via_launcher: bool, timeout_s: float | None) -> None:
        self.popen = popen
        self.slot = slot
        self.cmd = cmd
        self.out_path = out_path
        self.log_path = log_path
        self.master_port = master_port
        self.via_launcher = via_launcher
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        self.finished: float | None = None
        self.timed_out = False
        self.killed = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pgid(self) -> int:
        """The trial's process group id (= the leader's pid: it was started with setsid)."""
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    def poll(self) -> int | None:
        """The exit status once the group is done, else None; kills the group past its timeout."""
        rc = self.popen.poll()
        if rc is not None:
            self._done()
            return rc
        if self.timeout_s is not None and time.monotonic() - self.started > self.timeout_s:
            self.timed_out = True
            return self.kill()
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds (None = until done); the exit status, or None if still running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.02
        while True:
            rc = self.poll()
            if rc is not None:
                return rc
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 0.25)

    def kill(self, grace_s: float = 3.0) -> int:
        """End the whole group: SIGTERM (ranks may write an ``interrupted`` record), SIGKILL after ``grace_s``."""
        self.killed = True
        if self.popen.poll() is None:
            _signal_group(self.pgid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except Exception:  # subprocess.TimeoutExpired
                pass
        _signal_group(self.pgid, signal.SIGKILL)
        rc = self.popen.wait()
        self._done()
        return rc

    def _done(self) -> None:
        if self.finished is None:
            self.finished = time.monotonic()
            # Leftovers (a rank the launcher did not wait for, a rank's own helpers) go with the leader.
            _signal_group(self.pgid, signal.SIGKILL)
            _live.discard(self)

    def log_tail(self, nbytes: int = LOG_TAIL_BYTES) -> str:
        """The last ``nbytes`` of the trial's combined log (every rank), decoded leniently."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - nbytes))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def record(self) -> dict | None:
        """The record rank 0 wrote, or None."""
        return read_record(self.out_path)

    def outcome(self) -> tuple[str, str, dict | None]:
        """``(status, reason, record)`` of a finished trial; see ``launch.faults.classify``."""
        if self.returncode is None:
            raise RuntimeError("outcome() of a trial that is still running; poll() or wait() first")
        rec = self.record()
        status, reason = classify(self.returncode, rec, self.log_tail(), self.timed_out)
        return status, reason, rec

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"rc={self.returncode}"
        return f"<TrialProcess pid={self.pid} {self.slot.describe()} port={self.master_port} {state}>"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_trial(
    spec_path: str | os.PathLike,
    config_path: str | os.PathLike,
    out_path: str | os.PathLike,
    slot: Slot,
    log_path: str | os.PathLike,
    *,
    timeout_s: float | None = None,
    entry: Sequence[str] = DEFAULT_ENTRY,
    use_launcher: bool | None = None,
    launcher_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> TrialProcess:
    """Start ``python -m archsearch.trial --spec --config --out`` on ``slot`` as its own process group.

    log_path receives stdout and stderr of every rank. timeout_s: ``poll()``/``wait()`` kill the
    group after this many seconds and the outcome is ``("failed", "timeout")``. entry: the program
    (``("-m", "module")`` or ``("script.py",)``); tests use it to run fault-injecting trials.
    env: extra environment variables for the trial. A stale record at ``out_path`` is removed
    first so a record always belongs to this run.
    """
    import subprocess

    out_path, log_path = Path(out_path), Path(log_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.unlink(missing_ok=True)

    port = slot.master_port
    if not slot.hostfile and not port_is_free(port):
        # Ports are checked when planned; a slot reused later may find its port taken by someone else.
        port = pick_free_port({port})
    cmd, full_env, via_launcher = build_command(
        spec_path, config_path, out_path, slot, port,
        entry=entry, use_launcher=use_launcher, launcher_args=launcher_args,
    )
    if env:
        full_env.update(env)
    with open(log_path, "wb") as log:
        log.write(f"# archsearch: {slot.describe()} port {port}: {' '.join(cmd)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=full_env, cwd=cwd, start_new_session=True,
        )
    proc = TrialProcess(popen, slot, cmd, out_path, log_path, port, via_launcher, timeout_s)
    _live.add(proc)
    return proc


@atexit.register
def _kill_live_trials() -> None:
    # A study that exits (normally, on an exception or Ctrl-C) takes its running trials with it;
    # a SIGKILLed driver cannot, and launch.reaper kills those orphans on the next start.
    for proc in list(_live):
        try:
            proc.kill(grace_s=1.0)
        except Exception:  # pragma: no cover - best effort at interpreter exit
            pass
