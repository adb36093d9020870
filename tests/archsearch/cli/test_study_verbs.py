"""pareto / show / export / dashboard / spaces / validate on a finished tiny study."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from archsearch import study as st
from archsearch.cli import main
from archsearch.spec import ArchSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study_spaces import finished_study  # noqa: E402

pytestmark = pytest.mark.slow  # trains two tiny candidates in real trial processes


@pytest.fixture(scope="module")
def root():
    return finished_study()[1]


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_pareto_table_is_optunas_front(root, capsys, tmp_path):
    rc, out, err = run(capsys, "pareto", "tiny", "--root", str(root), "--out", str(tmp_path))
    assert rc == 0, err
    study = st.load_study("tiny", None, root)
    cells = re.findall(r"^│\s+(\d+(?: \([\d,]+\))?)\s+│", out, re.M)
    numbers = [int(n) for cell in cells for n in re.findall(r"\d+", cell)]
    assert sorted(numbers) == sorted(t.number for t in study.best_trials)
    assert "L = linear_attn" in out and "hypervolume" in out and "reference point" in out
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    html = (tmp_path / "pareto.html").read_text()
    assert "plotly" in html and "Hypervolume" in html


def test_show_prints_everything(root, capsys):
    study = st.load_study("tiny", None, root)
    ok = next(t for t in study.trials if t.user_attrs["status"] == "ok" and st.REUSED_FROM not in t.user_attrs)
    rc, out, _ = run(capsys, "show", "tiny", str(ok.number), "--root", str(root))
    assert rc == 0
    for needle in ("status ok", "mqar.accuracy", "decode_memory", '"layers"', "metrics:", "train:",
                   "TensorBoard: tensorboard --logdir", "run directory"):
        assert needle in out, needle
    bad = next(t for t in study.trials if t.user_attrs["status"] == "infeasible")
    rc, out, _ = run(capsys, "show", "tiny", str(bad.number), "--root", str(root))
    assert "reason: violates max_softmax_share" in out
    rc, _, err = run(capsys, "show", "tiny", "99", "--root", str(root))
    assert rc == 2 and "has no trial 99" in err


def test_export_writes_runnable_members(root, capsys, tmp_path):
    rc, out, _ = run(capsys, "export", "tiny", str(tmp_path / "ex"), "--root", str(root))
    assert rc == 0
    study = st.load_study("tiny", None, root)
    index = json.loads((tmp_path / "ex" / "front.json").read_text())
    exported = [n for m in index["front"] for n in [m["trial"], *m["same_spec_trials"]]]
    assert sorted(exported) == sorted(t.number for t in study.best_trials)
    from archsearch.trial import TrialConfig

    for m in index["front"]:
        d = tmp_path / "ex" / m["dir"]
        spec = ArchSpec.from_dict(json.loads((d / "spec.json").read_text()))
        assert spec.hash == study.trials[m["trial"]].user_attrs["spec_hash"]
        TrialConfig.from_dict({**json.loads((d / "config.json").read_text()), "out_dir": str(tmp_path)})
        assert json.loads((d / "metrics.json").read_text())["values"] == m["values"]
    assert "archsearch trial " in out and "--config" in out


def test_dashboard_prints_command(root, capsys):
    rc, out, _ = run(capsys, "dashboard", "tiny", "--root", str(root), "--port", "8123", "--print-only")
    assert rc == 0
    assert str(root / "tiny" / "journal.log") in out and "http://127.0.0.1:8123/dashboard/" in out
    rc, _, err = run(capsys, "dashboard", "nope", "--root", str(root), "--print-only")
    assert rc == 2 and "no study 'nope'" in err


def test_export_into_a_file_is_one_line(root, capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    rc, _, err = run(capsys, "export", "tiny", str(tmp_path / "f"), "--root", str(root))
    assert rc == 2 and err.strip().splitlines() == [
        f"archsearch export: error: export directory {tmp_path / 'f'}: exists and is not a directory"]


def test_pareto_plots_into_a_file_is_one_line(root, capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    rc, _, err = run(capsys, "pareto", "tiny", "--root", str(root), "--out", str(tmp_path / "f"))
    assert rc == 2 and err.strip().splitlines() == [
        f"archsearch pareto: error: plot directory {tmp_path / 'f'}: exists and is not a directory"]
