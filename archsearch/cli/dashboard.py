"""``archsearch dashboard STUDY``: optuna-dashboard on the study's storage."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

from archsearch.cli._common import add_study_arguments

HELP = "open optuna-dashboard on a study's storage (prints the command and URL)"


def add_arguments(p) -> None:
    add_study_arguments(p)
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--print-only", action="store_true", help="print the command and URL without starting it")


def storage_argument(args) -> str:
    """What optuna-dashboard takes: the journal file path, or the RDB URL."""
    from archsearch.errors import UserError
    from archsearch.study import journal_path, load_study

    study = load_study(args.study_opt or args.study, args.storage, args.root)  # checks it exists
    if args.storage:
        return args.storage
    if not args.study:
        raise UserError("name a study (STUDY, or --storage URL --study NAME)")
    return str(journal_path(study.study_name, args.root))


def run(args) -> int:
    from archsearch.errors import UserError

    if not 1 <= args.port <= 65535:
        raise UserError(f"--port: must be in 1..65535, got {args.port}")
    exe = shutil.which("optuna-dashboard")
    if exe is None and importlib.util.find_spec("optuna_dashboard") is None:
        raise UserError("optuna-dashboard is not installed: pip install optuna-dashboard "
                        "(or pip install 'archsearch[dashboard]')")
    storage = storage_argument(args)
    cmd = [exe] if exe else [sys.executable, "-m", "optuna_dashboard"]
    cmd += [storage, "--port", str(args.port), "--host", args.host]
    print("command: " + " ".join(cmd))
    print(f"open: http://{args.host}:{args.port}/dashboard/")
    if args.print_only:
        return 0
    try:
        return subprocess.call(cmd)
    except KeyboardInterrupt:
        return 0
