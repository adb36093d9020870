"""``archsearch pareto STUDY``: the front as a table, PNG and HTML plots, the hypervolume."""
from __future__ import annotations

from pathlib import Path

from archsearch.cli._common import add_study_arguments, load

HELP = "print a study's Pareto front (table), write its plots (PNG, HTML) and hypervolume"


def add_arguments(p) -> None:
    add_study_arguments(p)
    p.add_argument("--out", type=Path, metavar="DIR", help="where to write pareto.png / pareto.html (default: the study's directory)")


def report(study, out_dir: Path, console) -> None:
    from archsearch import pareto

    ref = pareto.reference_point(study)
    if ref is None:  # checked first: the table would be empty
        console.print("no feasible complete trials yet: no front, no plots")
        return
    table, legend = pareto.front_table(study)
    console.print(table)
    console.print(legend)
    names = pareto.metric_names(study)
    console.print(f"hypervolume {pareto.hypervolume(study, ref):.6g} (reference point "
                  + ", ".join(f"{n}={pareto.format_value(n, v)}" for n, v in zip(names, ref)) + ")")
    for note in pareto.throughput_condition_notes(study):
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    png = pareto.write_png(study, out_dir / "pareto.png")
    html = pareto.write_html(study, out_dir / "pareto.html")
    console.print(f"plots: {png}  {html}")


def run(args) -> int:
    study = load(args)
    from archsearch.cli._common import console

    report(study, args.out or (args.root / study.study_name), console())
    return 0
