"""classify(): exit code + record + log -> (status, reason), one case per fault."""
import pytest

from launch.faults import classify, describe_returncode, last_error_line

OOM_LOG = "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


@pytest.mark.parametrize("rc,record,log,timed_out,expected", [
    (0, {"status": "ok"}, "", False, ("ok", "")),
    # ZeRO ranks may abort at exit after rank 0 wrote an ok record: the record wins.
    (247, {"status": "ok"}, "", False, ("ok", "")),
    (0, {"status": "oom", "reason": "CUDA out of memory"}, "", False, ("infeasible", "oom")),
    (1, None, OOM_LOG, False, ("infeasible", "oom")),
    # One rank OOMs, its peers hang in a collective, the timeout kills the group: still oom.
    (-9, None, OOM_LOG, True, ("infeasible", "oom")),
    (0, {"status": "diverged", "reason": "loss is nan at step 3"}, "", False, ("failed", "diverged")),
    (-9, None, "step 1\n", True, ("failed", "timeout")),
    (None, None, "", True, ("failed", "timeout")),
    (0, {"status": "timeout"}, "", False, ("failed", "timeout")),
    (1, {"status": "failed", "reason": "spec: bad"}, "", False, ("failed", "failed: spec: bad")),
    (130, {"status": "interrupted"}, "", False, ("failed", "interrupted")),
    (-9, None, "", False, ("failed", "killed: SIGKILL")),
    (0, None, "", False, ("failed", "no record: the trial exited 0 without writing its record")),
])
def test_classify(rc, record, log, timed_out, expected):
    assert classify(rc, record, log, timed_out) == expected


def test_launcher_and_shell_signal_encodings():
    # deepspeed.launcher.launch exits with sys.exit(-9) -> status 247; shells use 128 + 9.
    assert describe_returncode(247).startswith("killed: SIGKILL")
    assert describe_returncode(137).startswith("killed: SIGKILL")
    assert describe_returncode(-15) == "killed: SIGTERM"
    assert describe_returncode(2) == "crashed: exit code 2"


def test_crash_reason_carries_the_last_error_line():
    log = ("Traceback (most recent call last):\n  File 'x.py'\nKeyError: 'a'\n"
           "During handling...\nValueError: injected crash\n")
    assert last_error_line(log) == "ValueError: injected crash"
    assert classify(1, None, log, False) == ("failed", "crashed: exit code 1: ValueError: injected crash")


def test_the_line_of_a_rank_leaving_its_group_out_of_memory_is_oom_whatever_the_error_text():
    """``archsearch.train`` prints ``OOM_EXIT_LINE`` before a rank leaves a multi-rank trial on an
    out-of-memory error; its peer's record may then say failed (a broken collective). The line
    alone decides, even when the error's own text matches none of the framework patterns."""
    from archsearch.train import EXIT_OOM, OOM_EXIT_LINE

    log = ("step 3\n" + OOM_EXIT_LINE.format(rank=3, world_size=8)
           + ": RuntimeError: allocator said no\n")
    peer = {"status": "failed", "reason": "RuntimeError: Connection reset by peer"}
    assert classify(EXIT_OOM, None, log, False) == ("infeasible", "oom")
    assert classify(1, peer, log, False) == ("infeasible", "oom")
    assert classify(1, None, "RuntimeError: allocator said no\n", False)[0] == "failed"
