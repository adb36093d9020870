"""A second quality task trains each candidate twice (one process per task); both metrics reach Optuna."""
from __future__ import annotations

import pytest
from optuna.trial import TrialState

import search_spaces
from archsearch import study as st
from launch.slots import plan_slots
from study_spaces import tiny

pytestmark = pytest.mark.slow  # two real trial processes


def test_second_quality_task_runs_after_the_first(tmp_path):
    d = tiny(study={"trials": 1, "seed": 0}, constraints={}, model__per_layer={"blocks": ["linear_attn"]})
    d["objectives"] = [
        {"name": "quality", "metric": "accuracy"},
        {"name": "quality", "task": "mad_in_context_recall", "metric": "loss",
         "task_params": {"seq_len": 32, "num_train_examples": 64, "num_test_examples": 16}},
        {"name": "params"},
    ]
    space = search_spaces.Space.from_dict(d)
    summary = st.run_study(space, root=tmp_path, slots=plan_slots([], 1, 1), progress=False)
    assert summary.trained == 2  # one candidate, two training runs
    study = st.load_study("tiny", None, tmp_path)
    assert study.metric_names == ["mqar.accuracy", "mad_in_context_recall.loss", "params"]
    (t,) = study.get_trials(states=(TrialState.COMPLETE,))
    first, second = t.user_attrs[st.RECORDS]
    assert first["task"]["name"] == "mqar" and second["task"]["name"] == "mad_in_context_recall"
    assert t.values == [first["metrics"]["accuracy"], second["metrics"]["loss"], float(t.user_attrs["facts"]["params"])]
    runs = sorted(p.name for p in (tmp_path / "tiny" / "trials" / f"{t.number:05d}").iterdir() if p.is_dir())
    assert runs == ["run0-mqar", "run1-mad_in_context_recall"]
