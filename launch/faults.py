"""What happened to a trial process: one decision from its exit code, its record and its log.

``classify(returncode, record, log_text, timed_out) -> (status, reason)`` where status is

* ``"ok"``          the record says ok: score the candidate (reason ``""``);
* ``"infeasible"``  the candidate does not fit (reason ``"oom"``): record it so the sampler learns
                    to avoid that region instead of retrying it;
* ``"failed"``      no usable result; reason is a code, optionally followed by ``": detail"``:
                    ``diverged`` (NaN/inf loss), ``timeout`` (the per-trial limit killed it),
                    ``killed: SIGKILL`` (a signal ended it), ``crashed: exit code 1: <last error line>``,
                    ``no record: ...``, or the record's own status (``interrupted``, ``failed: ...``).
"""
from __future__ import annotations

import json
import re
import signal
from typing import Any, Mapping

OK, INFEASIBLE, FAILED = "ok", "infeasible", "failed"

# Out-of-memory as PyTorch/CUDA/NCCL print it. A rank that runs out of memory often leaves its
# peers hanging in a collective, so the log is checked even when the group was killed on timeout.
_OOM_PATTERNS = re.compile(
    r"CUDA out of memory|torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError|OutOfMemoryError"
    r"|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation|NCCL.*out of memory"
    r"|DefaultCPUAllocator: can't allocate memory"
    r"|archsearch\.train: rank \d+/\d+ out of memory",  # archsearch.train.OOM_EXIT_LINE
)
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Interrupt)|[\w.]+Error:|AssertionError)\b.*$", re.M)


def is_oom_log(log_text: str) -> bool:
    """True when the log shows an out-of-memory error from any rank."""
    return bool(log_text) and _OOM_PATTERNS.search(log_text) is not None


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def describe_returncode(returncode: int) -> str:
    """Human description of an exit status, seeing through the DeepSpeed launcher's encoding.

    A rank killed by signal S makes ``deepspeed.launcher.launch`` call ``sys.exit(-S)``, which the
    OS reports as ``256 - S`` (SIGKILL -> 247); shells report ``128 + S`` (SIGKILL -> 137).
    """
    if returncode < 0:
        return f"killed: {signal_name(-returncode)}"
    if 256 - 64 < returncode < 256:
        return f"killed: {signal_name(256 - returncode)} (exit code {returncode} from the DeepSpeed launcher)"
    if 128 < returncode <= 128 + 64:
        return f"killed: {signal_name(returncode - 128)} (exit code {returncode})"
    return f"crashed: exit code {returncode}"


def last_error_line(log_text: str) -> str:
    """The last ``SomethingError: message`` line of a log (a traceback's summary), or ``""``."""
    if not log_text:
        return ""
    hits = _ERROR_LINE.findall(log_text)
    return hits[-1].strip()[:300] if hits else ""


def read_record(path) -> dict[str, Any] | None:
    """The trial's JSON record, or None when it is missing, empty or torn (a killed writer)."""
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def classify(
    returncode: int | None,
    record: Mapping[str, Any] | None,
    log_text: str,
    timed_out: bool,
) -> tuple[str, str]:
    """Decide a finished trial's ``(status, reason)``; see the module docstring for the values.

    returncode: the process group's exit status (None if it never exited, e.g. still hung when killed).
    record: the JSON record rank 0 wrote, or None if there is none.
    log_text: the combined stdout/stderr of every rank (may be a tail).
    timed_out: True when the per-trial timeout killed the group.
    """
    rec_status = str(record.get("status", "")) if record else ""
    rec_reason = str(record.get("reason") or "") if record else ""

    # A record that says ok is the result, even if the group then died on the way out (ZeRO-2/3
    # ranks can abort at exit after rank 0 wrote the record) or raced the timeout.
    if rec_status == "ok":
        return OK, ""
    if rec_status == "oom" or is_oom_log(log_text):
        return INFEASIBLE, "oom"
    if rec_status == "diverged":
        return FAILED, "diverged"
    if timed_out or rec_status == "timeout":
        return FAILED, "timeout"
    if rec_status:
        if rec_reason and rec_reason != rec_status:
            return FAILED, f"{rec_status}: {rec_reason}"[:500]
        return FAILED, rec_status
    if returncode is None:
        return FAILED, "killed: the trial did not exit"
    if returncode == 0:
        return FAILED, "no record: the trial exited 0 without writing its record"
    reason = describe_returncode(returncode)
    err = last_error_line(log_text)
    if err and reason.startswith("crashed"):
        reason += f": {err}"
    return FAILED, reason
