"""``archsearch launch SPACE``: run (or resume) a study of a search space and print its front."""
from __future__ import annotations

from pathlib import Path

HELP = "launch or resume a study of a search space (file or built-in name) and print the Pareto front"


def add_arguments(p) -> None:
    p.add_argument("space", metavar="SPACE", help="a YAML file or a built-in space name (archsearch spaces)")
    p.add_argument("--study", metavar="NAME", help="study name (default: the space's study.name or name)")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage (default: journal file ./studies/NAME/journal.log): "
                        "sqlite:///F.db, postgresql://user@host/db, or a path ending .log/.journal")
    p.add_argument("--trials", type=int, metavar="N", help="complete trials to reach (default: the space's study.trials)")
    from launch.cliargs import add_slot_arguments

    add_slot_arguments(p)
    p.add_argument("--root", default="studies", type=Path, help="directory for journals and trial runs (default ./studies)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (one log line per trial)")
    p.add_argument("--no-report", action="store_true", help="do not print the front or write the plots at the end")


def run(args) -> int:
    import search_spaces
    from archsearch.errors import UserError
    from archsearch.study import check_study_name, run_study
    from launch.cliargs import slots_from_args

    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials: must be >= 1, got {args.trials}")
    if args.study is not None:
        check_study_name(args.study, "--study")
    space = search_spaces.load(args.space)
    if args.gpus is None and args.hostfile is None and space.budget.device == "cpu":
        args.gpus = "none"  # a CPU space never takes the GPUs
    slots = slots_from_args(args)
    from archsearch.cli._common import console as make_console

    console = make_console()
    name = args.study or space.study_name
    console.print(f"[bold]study[/bold] {name}: space {space.name}, {args.trials or space.study.trials} trials, "
                  f"{len(slots)} slot(s): {', '.join(s.describe() for s in slots)}")
    summary = run_study(space, study_name=args.study, storage=args.storage, n_trials=args.trials, slots=slots,
                        root=args.root, progress=not args.no_progress, console=console)
    console.print(f"done: {summary.complete} complete ({summary.infeasible} infeasible), {summary.failed} failed, "
                  f"{summary.trained} trained this run, {summary.seconds:.0f} s")
    if not args.no_report:
        from archsearch.cli.pareto import report
        from archsearch.study import load_study

        report(load_study(name, args.storage or space.study.storage, args.root), args.root / name, console)
    return 0
