"""archsearch spaces / validate (validate's error output is tested in tests/search_spaces)."""
from __future__ import annotations

from archsearch.cli import main


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_spaces_and_validate(capsys):
    rc, out, _ = run(capsys, "spaces")
    assert rc == 0 and all(n in out for n in ("mqar_tiny", "hybrid_lm_small", "zoology_mqar"))
    rc, out, _ = run(capsys, "validate", "mqar_tiny")
    assert rc == 0 and "distinct architectures" in out and '"layers"' in out


def test_dashboard_without_optuna_dashboard_is_one_line(capsys, monkeypatch):
    import importlib.util
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "optuna_dashboard" else real(name, *a))
    rc, _, err = run(capsys, "dashboard", "anything", "--print-only")
    assert rc == 2 and "optuna-dashboard is not installed: pip install optuna-dashboard" in err


def test_launch_rejects_bad_storage_before_training(capsys, tmp_path):
    rc, _, err = run(capsys, "launch", "mqar_tiny", "--storage", "redis://x", "--root", str(tmp_path), "--no-progress")
    assert rc == 2 and "--storage: must be sqlite:///FILE" in err
    assert not (tmp_path / "mqar_tiny").exists()


def test_launch_refuses_a_study_name_that_is_a_path(capsys, tmp_path):
    # the name becomes a directory under --root: "../x" would write the journal outside it
    rc, _, err = run(capsys, "launch", "mqar_tiny", "--study", "../escaped", "--root", str(tmp_path / "r"),
                     "--no-progress")
    assert rc == 2 and err.strip().splitlines() == [
        "archsearch launch: error: --study: must be a name of letters, digits, _ . -, got '../escaped'"]
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "r").exists()


def test_pareto_of_a_single_objective_study_is_one_line(capsys, tmp_path):
    # a study made outside archsearch (one objective) once died in plot_hypervolume_history
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    (tmp_path / "single").mkdir()
    study = optuna.create_study(study_name="single",
                                storage=JournalStorage(JournalFileBackend(str(tmp_path / "single" / "journal.log"))))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    capsys.readouterr()
    for verb in ("pareto", "export"):
        argv = [verb, "single"] + ([str(tmp_path / "out")] if verb == "export" else []) + ["--root", str(tmp_path)]
        rc, _, err = run(capsys, *argv)
        assert rc == 2 and err.strip().splitlines() == [
            f"archsearch {verb}: error: study 'single' has 1 objective: a Pareto front needs 2 or more "
            "(is it an archsearch study?)"]
    assert not (tmp_path / "out").exists()


def _empty_study(tmp_path):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    (tmp_path / "empty").mkdir()
    optuna.create_study(study_name="empty", directions=["maximize", "minimize"],
                        storage=JournalStorage(JournalFileBackend(str(tmp_path / "empty" / "journal.log"))))


def test_show_and_pareto_on_a_study_without_trials(capsys, tmp_path):
    _empty_study(tmp_path)
    capsys.readouterr()  # optuna's "A new study created" log line
    rc, _, err = run(capsys, "show", "empty", "0", "--root", str(tmp_path))
    assert rc == 2 and err.strip() == "archsearch show: error: TRIAL: study 'empty' has no trials yet"
    rc, out, _ = run(capsys, "pareto", "empty", "--root", str(tmp_path))
    assert rc == 0 and out.strip() == "no feasible complete trials yet: no front, no plots"  # no empty table


def test_validate_file_errors_name_the_file_once(capsys, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("name: [unclosed\n")
    rc, _, err = run(capsys, "validate", str(f))
    assert rc == 2 and err.splitlines()[0].startswith(f"{f}: not valid YAML: line ")
    rc, _, err = run(capsys, "validate", str(tmp_path / "missing.yaml"))
    assert rc == 2 and err.splitlines()[0].startswith(f"{tmp_path / 'missing.yaml'}: no such file")
