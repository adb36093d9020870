"""DeepSpeed hostfiles: parsing with per-line errors, writing, and Slurm node lists."""
import os
import stat

import pytest

from archsearch.errors import UserError
from launch.hostfile import read_hostfile, slurm_hostfile, write_hostfile


def test_round_trip_and_comments(tmp_path):
    p = write_hostfile(tmp_path / "hf", {"a": 8, "b": 4})
    (tmp_path / "hf").write_text("# cluster\n" + open(p).read() + "\n   \n")
    assert list(read_hostfile(p).items()) == [("a", 8), ("b", 4)]


@pytest.mark.parametrize("text,msg", [
    ("a slots=0\n", "slots must be >= 1"),
    ("a slots=2\na slots=2\n", "listed twice"),
    ("a 2\n", "expected 'HOST slots=N'"),
    ("# nothing\n", "lists no hosts"),
])
def test_bad_lines_are_named(tmp_path, text, msg):
    (tmp_path / "hf").write_text(text)
    with pytest.raises(UserError, match=msg):
        read_hostfile(tmp_path / "hf")


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="hostfile: cannot read"):
        read_hostfile(tmp_path / "nope")


def test_slurm_hostfile_expands_the_node_list(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "scontrol"  # stands in for Slurm's scontrol on a machine without it
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[1-2]" ] && printf "gpu1\\ngpu2\\n"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[1-2]")
    p = slurm_hostfile(tmp_path / "hf", 8)
    assert list(read_hostfile(p).items()) == [("gpu1", 8), ("gpu2", 8)]
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    with pytest.raises(UserError, match="SLURM_JOB_NODELIST: not set"):
        slurm_hostfile(tmp_path / "hf2", 8)
