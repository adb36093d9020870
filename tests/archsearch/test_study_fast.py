"""Study pieces that need no training: storage URLs, infeasible-only studies, grid spaces."""
from __future__ import annotations

import pytest

import search_spaces
from archsearch import study as st
from archsearch.errors import UserError
from launch.slots import plan_slots
from study_spaces import tiny


def test_all_infeasible_study_starts_no_process(tmp_path):
    space = search_spaces.Space.from_dict(tiny(constraints={"max_params": 1}, study={"trials": 3, "seed": 0}))
    summary = st.run_study(space, root=tmp_path, slots=plan_slots([], 1, 1), progress=False)
    assert summary.trained == 0 and summary.complete == 3 and summary.infeasible == 3
    assert not (tmp_path / "tiny" / "trials").exists()
    study = st.load_study("tiny", None, tmp_path)
    assert study.best_trials == []  # infeasible trials never make the front
    for t in study.trials:
        assert t.constraints["max_params"] > 0 and t.user_attrs["status"] == "infeasible"
        assert t.values[0] == 0.0  # worst accuracy; memory keeps its true value
        assert t.values[1] == t.user_attrs["facts"]["decode_bytes"]["256x1:bfloat16"]


def test_cuda_space_on_cpu_slots_is_refused_before_the_study_exists(tmp_path):
    # it used to start 5 trials that each failed "no CUDA GPU is visible", then stop
    space = search_spaces.Space.from_dict(tiny(budget__device="cuda"))
    with pytest.raises(UserError, match=r"^budget.device: cuda, but every slot is a CPU slot"):
        st.run_study(space, root=tmp_path, slots=plan_slots([], 1, 1), progress=False)
    assert not (tmp_path / "tiny").exists()


def test_launch_trials_override_is_stored_for_workers(tmp_path):
    """`launch --trials N` records N in the study, so `archsearch worker` without --trials joins
    toward the same count instead of the space's default."""
    space = search_spaces.Space.from_dict(tiny(constraints={"max_params": 1}, study={"trials": 3, "seed": 0}))
    summary = st.run_study(space, root=tmp_path, slots=plan_slots([], 1, 1), progress=False, n_trials=2)
    assert summary.complete == 2
    study = st.load_study("tiny", None, tmp_path)
    assert study.user_attrs["n_trials"] == 2


@pytest.mark.parametrize("url,msg", [
    ("redis://localhost", "--storage: must be sqlite:///FILE, postgresql://"),
    ("postgresql://nobody@127.0.0.1:1/none", "--storage postgresql://nobody@127.0.0.1:1/none: cannot open"),
    ("/nonexistent-dir/x.log", "--storage /nonexistent-dir/x.log: cannot open the journal file"),
])
def test_bad_storage_is_one_line(url, msg):
    with pytest.raises(UserError) as exc:
        st.open_storage(url, "s")
    assert msg in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("text", ["a training log\nnot a journal\n", '{"op_code": 0, "study_name": "s"}\nbroken\n{}\n'])
def test_a_file_that_is_not_a_journal_is_refused_untouched(tmp_path, text):
    # launch --storage train.log on someone's log once appended Optuna entries to it, then died
    # with a JSONDecodeError traceback
    f = tmp_path / "train.log"
    f.write_text(text)
    with pytest.raises(UserError) as exc:
        st.open_storage(str(f), "s")
    assert str(exc.value).startswith(f"--storage {f}: not an Optuna journal file") and "\n" not in str(exc.value)
    assert f.read_text() == text


def test_missing_study_names_the_known_ones(tmp_path):
    space = search_spaces.Space.from_dict(tiny(constraints={"max_params": 1}, study={"trials": 1, "seed": 0}))
    st.run_study(space, root=tmp_path, slots=plan_slots([], 1, 1), progress=False)
    with pytest.raises(UserError, match=r"no study 'nope'.*studies here: tiny"):
        st.load_study("nope", None, tmp_path)


def test_sqlite_storage(tmp_path):
    space = search_spaces.Space.from_dict(tiny(constraints={"max_params": 1}, study={"trials": 2, "seed": 0}))
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    st.run_study(space, storage=url, root=tmp_path, slots=plan_slots([], 1, 1), progress=False)
    assert len(st.load_study("tiny", url, tmp_path).trials) == 2


def test_grid_search_space_lists_every_layer_param():
    space = search_spaces.Space.from_dict(tiny(model__depth=[1, 2]))
    grid = st.grid_search_space(space)
    assert grid == {"depth": [1, 2], "layer_0": ["linear_attn", "softmax", "gated_deltanet"],
                    "layer_1": ["linear_attn", "softmax", "gated_deltanet"]}


def test_space_changes_lists_paths():
    a = search_spaces.Space.from_dict(tiny()).to_dict()
    b = search_spaces.Space.from_dict(tiny(budget={"tokens": 7})).to_dict()
    changes = st.space_changes(a, b)
    assert "budget.tokens: 384 -> 7" in changes


@pytest.mark.parametrize("name,options", [("tpe", {"n_startup_trials": 3}), ("nsga2", {"population_size": 4}),
                                          ("gp", {}), ("random", {}), ("grid", {})])
def test_every_sampler_runs_an_infeasible_only_study(tmp_path, name, options):
    import optuna

    space = search_spaces.Space.from_dict(tiny(constraints={"max_params": 1}, study={"trials": 2, "seed": 3},
                                               sampler={"name": name, "options": options}))
    sampler = st.make_sampler(space)
    assert type(sampler).__name__.lower().startswith(
        {"tpe": "tpe", "nsga2": "nsgaii", "gp": "gp", "random": "random", "grid": "_asktellgrid"}[name])
    st.run_study(space, root=tmp_path, slots=plan_slots([], 1, 1), progress=False)
    assert len(st.load_study("tiny", None, tmp_path).get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2
