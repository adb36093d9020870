"""Front, reference point, hypervolume, plots and table on hand-made studies (no training)."""
from __future__ import annotations

import optuna
import pytest
from optuna.trial import create_trial

from archsearch import pareto

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def make_study(points, directions=("maximize", "minimize"), infeasible=()):
    study = optuna.create_study(directions=list(directions))
    study.set_metric_names(["mqar.accuracy", "decode_memory@2048x1", "params"][: len(directions)])
    for i, values in enumerate(points):
        study.add_trial(create_trial(
            values=list(values),
            user_attrs={"stack": "LS", "spec": {"d_model": 32, "layers": [{"block": "linear_attn"}, {"block": "softmax"}]},
                        "facts": {"params": 1000 + i}},
            system_attrs={"constraints:max_params": 1.0 if i in infeasible else -0.5},
        ))
    return study


def test_front_excludes_dominated_and_infeasible_and_is_sorted():
    study = make_study([(0.9, 100.0), (0.5, 10.0), (0.4, 50.0), (1.0, 5.0)], infeasible=(3,))
    front = pareto.front(study)
    assert [t.number for t in front] == [0, 1]  # best accuracy first; #2 dominated by #1; #3 infeasible
    assert {t.number for t in front} == {t.number for t in study.best_trials}


def test_reference_point_and_hypervolume():
    study = make_study([(0.9, 100.0), (0.5, 10.0)])
    ref = pareto.reference_point(study)
    assert ref == pytest.approx([0.5 - 0.04, 100.0 + 9.0])
    # minimisation space: points (-0.9, 100), (-0.5, 10), ref (-0.46, 109)
    expected = (0.9 - 0.46) * (109 - 100) + (0.5 - 0.46) * (100 - 10)
    assert pareto.hypervolume(study, ref) == pytest.approx(expected)
    xs, ys = pareto.hypervolume_history(study, ref)
    assert xs == [0, 1] and ys[-1] == pytest.approx(expected)


def test_plots_and_table_for_three_objectives(tmp_path):
    study = make_study([(0.9, 100.0, 3.0), (0.5, 10.0, 2.0), (0.7, 50.0, 1.0), (0.1, 200.0, 9.0)],
                       directions=("maximize", "minimize", "minimize"), infeasible=(3,))
    png = pareto.write_png(study, tmp_path / "p.png")
    html = pareto.write_html(study, tmp_path / "p.html")
    assert png.stat().st_size > 1000 and "plotly" in html.read_text()
    table, legend = pareto.front_table(study)
    assert table.row_count == 3 and "L = linear_attn" in legend and "S = softmax" in legend


def test_four_objectives_use_a_scatter_matrix(tmp_path):
    study = optuna.create_study(directions=["maximize", "minimize", "minimize", "maximize"])
    for v in [(0.9, 1, 2, 3), (0.5, 0.5, 3, 1)]:
        study.add_trial(create_trial(values=list(v), user_attrs={"stack": "NN"}))
    text = pareto.write_html(study, tmp_path / "p.html").read_text()
    assert "splom" in text
    assert pareto.write_png(study, tmp_path / "p.png").exists()


def test_format_value():
    assert pareto.format_value("decode_memory@2048x1", 3 * 2**20) == "3.00 MiB"
    assert pareto.format_value("params", 12_345) == "12.3k"
    assert pareto.format_value("mqar.accuracy", 0.123456) == "0.1235"


def test_export_into_a_file_is_a_user_error(tmp_path):
    from archsearch.errors import UserError

    study = make_study([(0.9, 100.0)])
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"^export directory .*f: exists and is not a directory$"):
        pareto.export_front(study, tmp_path / "f")
    with pytest.raises(UserError, match=r"^export directory .*sub: cannot create it: "):
        pareto.export_front(study, tmp_path / "f" / "sub")


def test_plots_into_a_file_are_a_user_error(tmp_path):
    from archsearch.errors import UserError

    study = make_study([(0.9, 100.0), (0.5, 10.0)])
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"^plot directory .*f: exists and is not a directory$"):
        pareto.write_png(study, tmp_path / "f" / "pareto.png")
    with pytest.raises(UserError, match=r"^plot directory .*f: exists and is not a directory$"):
        pareto.write_html(study, tmp_path / "f" / "pareto.html")


def _throughput_study(conditions):
    """A study whose trial i carries a first record measured under ``conditions[i]`` (a dict of throughput
    keys, or None: throughput not measured)."""
    study = optuna.create_study(directions=["maximize", "maximize"])
    study.set_metric_names(["mqar.accuracy", "decode_tokens_per_s"])
    for i, cond in enumerate(conditions):
        tp = {"decode_tokens_per_s": None} if cond is None else {
            "decode_tokens_per_s": 1000.0 + i, "device": "NVIDIA H100", "decode_mode": "cuda_graph", "dtype": "bfloat16",
            **cond}
        study.add_trial(create_trial(values=[0.5 + i / 10, 1000.0 - i], user_attrs={"records": [{"throughput": tp}]},
                                     system_attrs={"constraints:max_params": -1.0}))
    return study


def test_throughput_measured_under_different_conditions_is_noted():
    """A front whose trials' throughput was measured on different GPUs, in different decode modes or dtypes
    gets one line per condition naming each value's trials (most first), and why a graph was not used;
    trials measured alike, or without throughput, get none."""
    alike = _throughput_study([{}, {}, None])
    assert pareto.throughput_condition_notes(alike) == []
    mixed = _throughput_study([{}, {"device": "NVIDIA A100-SXM4-80GB"}, {},
                               {"decode_mode": "eager", "decode_graph_error": "capture: KernelDoesNotFit ..."}])
    notes = pareto.throughput_condition_notes(mixed)
    assert notes == [
        "throughput measured with different device: NVIDIA H100 (trials 0, 2, 3), NVIDIA A100-SXM4-80GB (trial 1); "
        "those trials' throughput compares that too, not only their architectures",
        "throughput measured with different decode_mode: cuda_graph (trials 0, 1, 2), eager (trial 3); "
        "those trials' throughput compares that too, not only their architectures",
        "no decode graph for trial 3: capture: KernelDoesNotFit ..."]
