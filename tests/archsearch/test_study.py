"""The study loop end to end on a tiny space with real trial processes (a few steps each).

One module-scoped study serves several tests: it trains two candidates, records one infeasible
candidate without training it, and reuses one result for a repeated spec.
"""
from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import search_spaces
from archsearch import study as st
from archsearch.errors import UserError
from launch.slots import plan_slots
from study_spaces import finished_study, tiny

pytestmark = pytest.mark.slow  # two real trial processes: ~20-40 s on 2 busy cores


@pytest.fixture(scope="module")
def finished():
    space, root, summaries = finished_study()
    return space, root, st.load_study("tiny", None, root), summaries


def test_end_to_end(finished):
    space, root, study, summary = finished
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    first, again = summary
    assert first.trained == 2 and first.complete == 3 and first.infeasible == 1
    assert again.trained == 0 and again.complete == 4
    assert study.metric_names == ["mqar.accuracy", "decode_memory@256x1"]
    assert study.user_attrs[st.SPACE_ATTR]["name"] == "tiny"
    by_status = {}
    for t in trials:
        by_status.setdefault(t.user_attrs["status"], []).append(t)
    assert len(by_status["infeasible"]) == 1 and len(by_status["ok"]) == 3
    reused = [t for t in trials if st.REUSED_FROM in t.user_attrs]
    assert len(reused) == 1 and reused[0].number == 3
    orig = study.trials[reused[0].user_attrs[st.REUSED_FROM]]
    assert orig.values == reused[0].values and orig.user_attrs["spec_hash"] == reused[0].user_attrs["spec_hash"]
    for t in by_status["ok"]:
        rec = t.user_attrs[st.RECORDS][0]
        assert rec["status"] == "ok" and 0.0 <= t.values[0] <= 1.0
        assert t.values[1] == t.user_attrs[st.FACTS]["decode_bytes"]["256x1:bfloat16"] > 0


def test_infeasible_never_trained(finished):
    space, root, study, _ = finished
    (bad,) = [t for t in study.trials if t.user_attrs["status"] == "infeasible"]
    assert bad.user_attrs["stack"] == "S"
    assert bad.constraints["max_softmax_share"] > 0 and bad.user_attrs["violated"] == ["max_softmax_share"]
    assert st.RUN_DIR not in bad.user_attrs and st.RECORDS not in bad.user_attrs
    # no process ever started for it: only the trained trials have run directories
    trained = {t.number for t in study.trials if t.user_attrs["status"] == "ok" and st.REUSED_FROM not in t.user_attrs}
    dirs = {int(p.name) for p in (root / "tiny" / "trials").iterdir()}
    assert dirs == trained and bad.number not in dirs
    assert bad.number not in {t.number for t in study.best_trials}


def test_rerun_resumes_without_new_trials(finished):
    space, root, study, _ = finished
    summary = st.run_study(space, root=root, n_trials=4, slots=plan_slots([], 1, 1), progress=False)
    assert summary.trained == 0 and len(st.load_study("tiny", None, root).trials) == 4


def test_changed_space_on_resume_is_an_error(finished):
    _, root, _, _ = finished
    changed = search_spaces.Space.from_dict(tiny(model__d_model=32))
    with pytest.raises(UserError, match=r"created from a different space \(model.d_model: 16 -> 32\)"):
        st.open_study(changed, root=root)
    # the trial count is not part of what a study searches: raising it resumes
    st.open_study(search_spaces.Space.from_dict(tiny(study={"trials": 9, "seed": 0})), root=root)


def test_study_is_plain_optuna(finished):
    _, root, _, _ = finished
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(root / "tiny" / "journal.log")))
    study = optuna.load_study(study_name="tiny", storage=storage)
    assert len(study.best_trials) >= 1
