"""``archsearch worker``: join a study through its shared storage and run trials on this host.

Every host of a multi-host study runs one worker (or ``archsearch launch`` pointed at the same
storage). The space comes from the study itself (stored by ``launch`` when it created the study),
so a worker needs only the study name and the storage URL. Workers share one trial budget
(``launch.budget``): together they complete exactly the study's number of trials.
"""
from __future__ import annotations

import argparse
import copy
import os
import socket
import sys
import time
import zlib
from pathlib import Path

HELP = "join a study through a shared storage (PostgreSQL) and run its trials on this host's slots"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from launch.cliargs import add_slot_arguments

    p.add_argument("--study", default=None, metavar="NAME", help="study name (optional if the storage holds one)")
    p.add_argument("--storage", required=True, metavar="URL",
                   help="shared storage: postgresql://USER@HOST/DB (or sqlite:///F, or a journal file on a shared disk)")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="COMPLETE trials the study should reach (default: the number the study was launched with)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampler seed of this worker (default: the space's seed offset by host and pid, so "
                        "workers do not propose the same first candidates)")
    p.add_argument("--root", default="studies", metavar="DIR", help="where this host keeps trial run dirs (default studies/)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to this long for the study to be created (workers started before launch)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (for logs)")
    add_slot_arguments(p)


SEED_LIMIT = 2**32  # numpy's RandomState, which Optuna's samplers seed, takes 0..2**32 - 1


def worker_seed(base: int, host: str | None = None, pid: int | None = None) -> int:
    """A seed distinct per worker: TPE's random start-up trials would repeat across workers otherwise."""
    tag = f"{host or socket.gethostname()}:{pid or os.getpid()}".encode()
    return (base + 1 + zlib.crc32(tag) % 1_000_003) % SEED_LIMIT  # numpy seeds stop at 2**32 - 1


def _load_with_wait(study_name, storage, root: Path, wait_s: float):
    from archsearch.errors import UserError
    from archsearch.study import load_study

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return load_study(study_name, storage, root)
        except UserError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def run(args: argparse.Namespace) -> int:
    import optuna

    from archsearch.errors import UserError
    from archsearch.study import StudyRunner, make_sampler, stored_space
    from launch.slots import parse_gpu_list, plan_slots

    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials: must be >= 1, got {args.trials}")
    if args.seed is not None and not 0 <= args.seed < SEED_LIMIT:
        raise UserError(f"--seed: must be an integer in 0..{SEED_LIMIT - 1}, got {args.seed}")
    if not args.wait >= 0:  # also nan, which would wait forever
        raise UserError(f"--wait: must be a number of seconds >= 0, got {args.wait}")
    gpus = parse_gpu_list(args.gpus)
    root = Path(args.root)
    study = _load_with_wait(args.study, args.storage, root, args.wait)
    space = stored_space(study)
    if space is None:
        raise UserError(f"study {study.study_name!r} has no stored space (user attr 'space'): "
                        "create it with `archsearch launch SPACE --storage URL` first")
    if gpus is None and space.budget.device == "cpu":
        gpus = []  # a CPU space never takes this host's GPUs (as `launch` does)
    slots = plan_slots(gpus, args.gpus_per_trial, args.slots, hostfile=args.hostfile, ds_config=args.ds_config)
    space = copy.deepcopy(space)
    space.study.seed = args.seed if args.seed is not None else worker_seed(space.study.seed)
    study = optuna.load_study(study_name=study.study_name, storage=study._storage, sampler=make_sampler(space))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n_trials = args.trials or study.user_attrs.get("n_trials") or space.study.trials

    where = ", ".join(s.describe() for s in slots)
    print(f"archsearch worker: study {study.study_name!r}, {n_trials} trials, {where}", file=sys.stderr)
    summary = StudyRunner(space, study, slots, n_trials, root, progress=not args.no_progress).run()
    print(f"study {summary.study_name}: {summary.complete} complete, {summary.failed} failed, "
          f"{summary.infeasible} infeasible, front {summary.front}; this worker trained {summary.trained} "
          f"in {summary.seconds:.0f} s")
    return 0
