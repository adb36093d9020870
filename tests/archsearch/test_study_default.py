"""The embedded default space (mqar_tiny) end to end at a reduced budget, through the CLI."""
from __future__ import annotations

import pytest
import yaml
from optuna.trial import TrialState

import search_spaces
from archsearch import study as st
from archsearch.cli import main

pytestmark = pytest.mark.slow  # three real trial processes


def test_mqar_tiny_reduced(tmp_path, capsys):
    d = search_spaces.load("mqar_tiny").to_dict()
    d["budget"]["tokens"] = 32 * 16 * 3  # 3 steps
    d["study"]["trials"] = 3
    space_file = tmp_path / "mqar_tiny.yaml"
    space_file.write_text(yaml.safe_dump(d))
    rc = main(["launch", str(space_file), "--root", str(tmp_path / "studies"), "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    study = st.load_study("mqar_tiny", None, tmp_path / "studies")
    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 3
    assert study.best_trials and "Pareto front of mqar_tiny" in out and "hypervolume" in out
    assert (tmp_path / "studies" / "mqar_tiny" / "pareto.png").exists()
    assert (tmp_path / "studies" / "mqar_tiny" / "pareto.html").exists()
