"""``archsearch export STUDY DIR``: each front member's spec, metrics and trial config."""
from __future__ import annotations

from pathlib import Path

from archsearch.cli._common import add_study_arguments, load

HELP = "write each Pareto-front member's spec.json, metrics.json and config.json under DIR"


def add_arguments(p) -> None:
    add_study_arguments(p)
    p.add_argument("dir", metavar="DIR", type=Path, help="output directory")


def run(args) -> int:
    from archsearch import pareto

    study = load(args)
    dirs = pareto.export_front(study, args.dir)
    print(f"exported {len(dirs)} front architecture(s) of {study.study_name} to {args.dir} (index: {args.dir / 'front.json'})")
    for d in dirs:
        cfg = d / "config.json"
        run = f"archsearch trial {d / 'spec.json'} --config {cfg} --out {d / 'run'}"
        print(f"  {d.name}: {run if cfg.exists() else d / 'spec.json'}")
    return 0
