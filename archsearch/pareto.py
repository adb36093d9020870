"""The Pareto front of a study: table, plots (PNG and HTML), hypervolume, export.

The front is Optuna's own ``study.best_trials`` (feasible COMPLETE trials no other trial
dominates; infeasible trials, which carry a positive constraint value, are excluded), sorted by the
first objective, best first.

Hypervolume reference point (documented in README.md): per objective, the worst value among the
feasible COMPLETE trials, pushed out by 10% of that objective's range over those trials (by 10% of
its magnitude, or 1, when all trials share one value). It depends on the trials, so it is printed
with every hypervolume; the history is computed against the final reference point.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from archsearch.errors import UserError
from archsearch.study import FACTS, RECORDS, REUSED_FROM, RUN_DIR, SPEC, SPEC_HASH, STACK, STATUS


def metric_names(study: optuna.Study) -> list[str]:
    return study.metric_names or [f"objective_{i}" for i in range(len(study.directions))]


def _sign(d: StudyDirection) -> int:
    return 1 if d == StudyDirection.MINIMIZE else -1


def feasible(t: FrozenTrial) -> bool:
    return all(v <= 0 for v in t.constraints.values())


def front(study: optuna.Study) -> list[FrozenTrial]:
    """``study.best_trials`` sorted by the first objective, best first."""
    if len(study.directions) < 2:  # best_trials would be the single best; the plots refuse it
        raise UserError(f"study {study.study_name!r} has {len(study.directions)} objective: a Pareto front "
                        "needs 2 or more (is it an archsearch study?)")
    s = _sign(study.directions[0])
    return sorted(study.best_trials, key=lambda t: (s * t.values[0], t.number))


def stack_legend(trials: list[FrozenTrial]) -> dict[str, str]:
    from archsearch.spec import stack_legend as legend

    names = [layer["block"] for t in trials for layer in t.user_attrs.get(SPEC, {}).get("layers", [])]
    return legend(names)


def format_value(name: str, v: float) -> str:
    if "memory" in name or name.endswith("bytes"):
        return _bytes(v)
    if name == "params":
        return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"
    return f"{v:.4g}"


def _bytes(v: float) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= div:
            return f"{v / div:.2f} {unit}"
    return f"{v:.0f} B"


def front_table(study: optuna.Study):
    """A rich Table of the front and a legend line for the stack letters."""
    from rich.table import Table

    names = metric_names(study)
    members = front(study)
    table = Table(title=f"Pareto front of {study.study_name}: {len(members)} of "
                        f"{len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))} complete trials, "
                        f"{len(unique_by_spec(members))} distinct architectures",
                  title_justify="left")
    table.add_column("trial", justify="right")
    for n, d in zip(names, study.directions):
        table.add_column(f"{n} {'↓' if d == StudyDirection.MINIMIZE else '↑'}", justify="right")
    table.add_column("params", justify="right")
    table.add_column("d_model", justify="right")
    table.add_column("stack")
    for t, repeats in unique_by_spec(members):
        facts = t.user_attrs.get(FACTS, {})
        spec = t.user_attrs.get(SPEC, {})
        note = f" ({','.join(str(r.number) for r in repeats)})" if repeats else ""
        table.add_row(str(t.number) + note, *[format_value(n, v) for n, v in zip(names, t.values)],
                      format_value("params", facts.get("params", float("nan"))) if facts else "?",
                      str(spec.get("d_model", "?")), t.user_attrs.get(STACK, "?"))
    legend = "  ".join(f"{k} = {v}" for k, v in stack_legend(members).items())
    return table, (f"stack: one letter per layer, first layer left; {legend}; "
                   "(n,m): later trials of the same spec, their result reused")


# What a throughput measurement depends on besides the architecture (a record's ``throughput`` keys): trials
# measured under different values compare machines or modes, not only models. A study whose hosts carry
# different GPUs, or whose decode graph could not be captured for some candidates (they decode eagerly:
# ``decode_graph_error`` says why), gets such a front.
THROUGHPUT_CONDITIONS = ("device", "decode_mode", "dtype")


def throughput_condition_notes(study: optuna.Study) -> list[str]:
    """One line per ``THROUGHPUT_CONDITIONS`` key whose value differs across the feasible complete trials'
    measured throughput (their first record's; trials without one, e.g. a study with no throughput
    objective, are left out): each value with its trials, and why a decode graph was not used where one
    was not. Empty when every trial was measured alike."""
    by_key: dict[str, dict[str, list[int]]] = {k: {} for k in THROUGHPUT_CONDITIONS}
    why: dict[int, str] = {}
    for t in _feasible_complete(study):
        records = t.user_attrs.get(RECORDS) or []
        tp = records[0].get("throughput") if records and isinstance(records[0], dict) else None
        if not isinstance(tp, dict) or tp.get("decode_tokens_per_s") is None:
            continue
        for key in THROUGHPUT_CONDITIONS:
            by_key[key].setdefault(str(tp.get(key)), []).append(t.number)
        if tp.get("decode_graph_error"):
            why[t.number] = str(tp["decode_graph_error"])
    notes = []
    for key, groups in by_key.items():
        if len(groups) < 2:
            continue
        parts = ", ".join(f"{value} (trial{'s' if len(nums) > 1 else ''} {_numbers(nums)})"
                          for value, nums in sorted(groups.items(), key=lambda kv: -len(kv[1])))
        notes.append(f"throughput measured with different {key}: {parts}; those trials' throughput compares "
                     f"that too, not only their architectures")
    if why and len(by_key["decode_mode"]) > 1:
        first = min(why)
        notes.append(f"no decode graph for trial {first}: {why[first]}"
                     + (f" (and {len(why) - 1} more: archsearch show N)" if len(why) > 1 else ""))
    return notes


def _numbers(nums: list[int], shown: int = 6) -> str:
    head = ", ".join(map(str, nums[:shown]))
    return head + (f" and {len(nums) - shown} more" if len(nums) > shown else "")


def unique_by_spec(trials: list[FrozenTrial]) -> list[tuple[FrozenTrial, list[FrozenTrial]]]:
    """Group trials of one spec hash (reused results): ``[(first trial, [repeats]), ...]`` in order."""
    groups: dict[str, tuple[FrozenTrial, list[FrozenTrial]]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        key = t.user_attrs.get(SPEC_HASH) or f"#{t.number}"
        if key in groups:
            groups[key][1].append(t)
        else:
            groups[key] = (t, [])
    order = {t.number: i for i, t in enumerate(trials)}
    return sorted(groups.values(), key=lambda g: order[g[0].number])


# ---- hypervolume ---------------------------------------------------------------------------
def _feasible_complete(study: optuna.Study) -> list[FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if feasible(t)]


def reference_point(study: optuna.Study) -> list[float] | None:
    """The reference point in the objectives' own directions (see the module docstring)."""
    trials = _feasible_complete(study)
    if not trials:
        return None
    vals = np.array([t.values for t in trials], dtype=float)
    ref = []
    for j, d in enumerate(study.directions):
        s = _sign(d)
        col = s * vals[:, j]  # minimisation space
        worst, best = col.max(), col.min()
        margin = 0.1 * (worst - best) if worst > best else (0.1 * abs(worst) or 1.0)
        ref.append(float(s * (worst + margin)))
    return ref


def hypervolume(study: optuna.Study, ref: list[float] | None = None) -> float:
    """Hypervolume of the feasible front against ``ref`` (default ``reference_point``)."""
    from optuna._hypervolume import compute_hypervolume

    ref = ref or reference_point(study)
    trials = _feasible_complete(study)
    if ref is None or not trials:
        return 0.0
    signs = np.array([_sign(d) for d in study.directions], dtype=float)
    pts = np.array([t.values for t in trials], dtype=float) * signs
    r = np.array(ref, dtype=float) * signs
    pts = pts[(pts < r).all(axis=1)]
    return float(compute_hypervolume(pts, r)) if len(pts) else 0.0


def hypervolume_history(study: optuna.Study, ref: list[float] | None = None) -> tuple[list[int], list[float]]:
    """(trial numbers, hypervolume after each COMPLETE trial), via optuna's hypervolume history."""
    ref = ref or reference_point(study)
    if ref is None:
        return [], []
    with warnings.catch_warnings():  # experimental since 3.3; stable enough for our use
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        fig = optuna.visualization.plot_hypervolume_history(study, reference_point=ref)
    return list(fig.data[0].x), list(fig.data[0].y)


# ---- plots ---------------------------------------------------------------------------------
def _groups(study: optuna.Study) -> tuple[list[FrozenTrial], list[FrozenTrial], list[FrozenTrial]]:
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    on_front = {t.number for t in study.best_trials}
    fr = front(study)
    dominated = [t for t in complete if feasible(t) and t.number not in on_front]
    infeasible = [t for t in complete if not feasible(t)]
    return fr, dominated, infeasible


def ensure_dir(path: str | Path, what: str) -> Path:
    """Create the output directory ``path``; one that is a file or cannot be made is a UserError."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{what} {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot create it: {exc.strerror or exc}") from None
    return path


def _pairs(k: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(k) for j in range(i + 1, k)]


def write_png(study: optuna.Study, path: str | Path) -> Path:
    """Pairwise panels of the objectives (one panel for two objectives) plus the hypervolume history."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = metric_names(study)
    fr, dominated, infeasible = _groups(study)
    pairs = _pairs(len(names))
    ncols = len(pairs) + 1
    fig, axes = plt.subplots(1, ncols, figsize=(5 * ncols, 4.2), squeeze=False)
    for ax, (i, j) in zip(axes[0], pairs):
        for trials, style in ((dominated, dict(c="0.7", marker="o", s=22, label="dominated")),
                              (infeasible, dict(c="tab:red", marker="x", s=28, label="infeasible")),
                              (fr, dict(c="tab:blue", marker="o", s=40, label="front", zorder=3))):
            if trials:
                ax.scatter([t.values[i] for t in trials], [t.values[j] for t in trials], **style)
        if len(names) == 2 and fr:
            pts = sorted((t.values[0], t.values[1]) for t in fr)
            ax.plot(*zip(*pts), c="tab:blue", lw=1, alpha=0.6)
        for t, _ in unique_by_spec(fr):
            ax.annotate(f"{t.number}:{t.user_attrs.get(STACK, '')}", (t.values[i], t.values[j]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(f"{names[i]} ({study.directions[i].name.lower()})")
        ax.set_ylabel(f"{names[j]} ({study.directions[j].name.lower()})")
        if any("memory" in names[k] for k in (i, j)):
            for k, setter in ((i, ax.set_xscale), (j, ax.set_yscale)):
                vals = [t.values[k] for t in fr + dominated + infeasible]
                if "memory" in names[k] and vals and min(vals) > 0 and max(vals) / min(vals) > 20:
                    setter("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ref = reference_point(study)
    xs, ys = hypervolume_history(study, ref)
    ax = axes[0][-1]
    ax.plot(xs, ys, marker=".")
    ax.set_xlabel("trial")
    ax.set_ylabel("hypervolume")
    ax.set_title("reference " + ", ".join(format_value(n, v) for n, v in zip(names, ref or [])), fontsize=8)
    ax.grid(alpha=0.3)
    fig.suptitle(f"{study.study_name}: Pareto front ({len(fr)} trials)")
    fig.tight_layout()
    path = Path(path)
    ensure_dir(path.parent, "plot directory")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_html(study: optuna.Study, path: str | Path) -> Path:
    """Interactive front (optuna.visualization.plot_pareto_front for 2-3 objectives, a plotly
    scatter matrix for 4) and the hypervolume history, in one self-contained HTML file."""
    import plotly.graph_objects as go

    names = metric_names(study)
    figs = []
    if len(names) <= 3:
        fig = optuna.visualization.plot_pareto_front(study, target_names=names)
    else:
        fr, dominated, infeasible = _groups(study)
        fig = go.Figure()
        for trials, label, color in ((dominated, "dominated", "lightgrey"), (infeasible, "infeasible", "red"),
                                     (fr, "front", "royalblue")):
            fig.add_trace(go.Splom(
                dimensions=[dict(label=n, values=[t.values[k] for t in trials]) for k, n in enumerate(names)],
                text=[f"trial {t.number}: {t.user_attrs.get(STACK, '')}" for t in trials],
                name=label, marker=dict(color=color, size=7), diagonal_visible=False))
    fig.update_layout(title=f"{study.study_name}: Pareto front")
    figs.append(fig)
    ref = reference_point(study)
    if ref is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            hv = optuna.visualization.plot_hypervolume_history(study, reference_point=ref)
        hv.update_layout(title="hypervolume history (reference " + ", ".join(
            format_value(n, v) for n, v in zip(names, ref)) + ")")
        figs.append(hv)
    parts = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]
    path = Path(path)
    ensure_dir(path.parent, "plot directory")
    path.write_text(f"<html><head><meta charset='utf-8'><title>{study.study_name}</title></head><body>"
                    + "\n".join(parts) + "</body></html>")
    return path


# ---- export --------------------------------------------------------------------------------
def export_front(study: optuna.Study, out_dir: str | Path) -> list[Path]:
    """Per front architecture (trials that reused its result are listed, not repeated)
    ``out_dir/trial_NNNNN/`` with ``spec.json`` (an ArchSpec), ``metrics.json``
    (objective values, spec facts, trial records) and ``config.json`` (the trial config it was
    trained with) -- ready for ``archsearch trial spec.json --config config.json --out DIR``
    or a longer run (raise ``train.tokens``). Also ``front.json``, the index."""
    members = unique_by_spec(front(study))  # one directory per architecture
    out = ensure_dir(out_dir, "export directory")
    names = metric_names(study)
    index, dirs = [], []
    for t, repeats in members:
        d = out / f"trial_{t.number:05d}"
        d.mkdir(exist_ok=True)
        (d / "spec.json").write_text(json.dumps(t.user_attrs.get(SPEC, {}), indent=2, sort_keys=True))
        metrics = {"trial": t.number, "values": dict(zip(names, t.values)),
                   "directions": {n: dr.name.lower() for n, dr in zip(names, study.directions)},
                   "spec_hash": t.user_attrs.get(SPEC_HASH), "stack": t.user_attrs.get(STACK),
                   "facts": t.user_attrs.get(FACTS), "records": t.user_attrs.get(RECORDS),
                   "params": t.params, "run_dir": t.user_attrs.get(RUN_DIR)}
        (d / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        cfg = _trial_config(t)
        if cfg is not None:
            (d / "config.json").write_text(json.dumps(cfg, indent=2))
        index.append({"trial": t.number, "same_spec_trials": [r.number for r in repeats], "dir": d.name,
                      "stack": t.user_attrs.get(STACK), "values": dict(zip(names, t.values))})
        dirs.append(d)
    (out / "front.json").write_text(json.dumps({"study": study.study_name, "metrics": names,
                                                "directions": [d.name.lower() for d in study.directions],
                                                "front": index}, indent=2))
    return dirs


def _trial_config(t: FrozenTrial) -> dict[str, Any] | None:
    run_dir = t.user_attrs.get(RUN_DIR)
    if not run_dir:
        return None
    for cfg in sorted(Path(run_dir).glob("run0-*/config.json")):
        d = json.loads(cfg.read_text())
        d.pop("out_dir", None)  # the exporter's user picks where the new run writes
        return d
    return None


def status_of(t: FrozenTrial) -> str:
    if t.state == TrialState.COMPLETE:
        return t.user_attrs.get(STATUS, "ok")
    return t.user_attrs.get(STATUS, t.state.name.lower())

