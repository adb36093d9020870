"""Arguments and helpers shared by the study verbs (launch, pareto, show, export, dashboard)."""
from __future__ import annotations

from pathlib import Path


def add_study_arguments(p, positional: bool = True) -> None:
    if positional:
        p.add_argument("study", metavar="STUDY", nargs="?",
                       help="a study name under --root (its journal file), or omit with --storage/--study")
    p.add_argument("--storage", metavar="URL", help="Optuna storage: sqlite:///F, postgresql://..., or a journal .log path")
    p.add_argument("--study", dest="study_opt", metavar="NAME", help="study name inside --storage")
    p.add_argument("--root", default="studies", type=Path, help="where studies live (default ./studies)")


def load(args):
    from archsearch.study import load_study

    return load_study(args.study_opt or args.study, args.storage, args.root)


def console():
    """A rich Console; when stdout is not a terminal (logs, pipes, tests) wide enough for the front
    table, where rich would otherwise assume 80 columns and wrap it."""
    import os
    import sys

    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=140)
