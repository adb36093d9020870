"""`archsearch worker` input errors are one line (no traceback); worker seeds differ per process."""
import time

import optuna
import pytest

from archsearch.cli import main
from archsearch.cli.worker import worker_seed


def test_missing_study_is_a_one_line_error(tmp_path, capsys):
    rc = main(["worker", "--storage", str(tmp_path / "nothing.log"), "--study", "nope"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("archsearch worker: error: no study 'nope'") and "\n" not in err


def test_wait_gives_up_after_the_given_time(tmp_path, capsys):
    t0 = time.monotonic()
    rc = main(["worker", "--storage", str(tmp_path / "nothing.log"), "--study", "nope", "--wait", "0.5"])
    assert rc == 2 and 0.5 <= time.monotonic() - t0 < 10
    assert "no study 'nope'" in capsys.readouterr().err


def test_study_without_a_stored_space_is_refused(tmp_path, capsys):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = str(tmp_path / "j.log")
    optuna.create_study(study_name="bare", storage=JournalStorage(JournalFileBackend(path)))
    rc = main(["worker", "--storage", path, "--study", "bare", "--gpus", "none"])
    assert rc == 2 and "has no stored space" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--gpus", "0;1"], "--gpus: must be comma-separated GPU ids"),
    (["--trials", "0"], "--trials: must be >= 1"),
    # a seed outside numpy's range died in the sampler with a ValueError traceback
    (["--seed", "-1"], "--seed: must be an integer in 0..4294967295, got -1"),
    (["--seed", str(2**32)], "--seed: must be an integer in 0..4294967295, got 4294967296"),
    (["--wait", "-1"], "--wait: must be a number of seconds >= 0, got -1.0"),
    (["--wait", "nan"], "--wait: must be a number of seconds >= 0, got nan"),
])
def test_bad_flags(tmp_path, capsys, argv, msg):
    rc = main(["worker", "--storage", str(tmp_path / "j.log"), "--study", "x"] + argv)
    assert rc == 2 and msg in capsys.readouterr().err


def test_worker_seeds_differ_per_host_and_pid():
    seeds = {worker_seed(0, "h1", 10), worker_seed(0, "h1", 11), worker_seed(0, "h2", 10)}
    assert len(seeds) == 3 and worker_seed(0, "h1", 10) == worker_seed(0, "h1", 10)


def test_worker_seed_stays_in_numpys_range():
    top = 2**32 - 1
    assert all(0 <= worker_seed(top, "h", pid) <= top for pid in range(50))
