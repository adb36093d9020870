"""``archsearch show STUDY TRIAL``: one trial in full."""
from __future__ import annotations

import json

from archsearch.cli._common import add_study_arguments, load

HELP = "print one trial in full: spec, measurements, failure reason, TensorBoard location"


def add_arguments(p) -> None:
    add_study_arguments(p)
    p.add_argument("trial", metavar="TRIAL", type=int, help="trial number")


def run(args) -> int:
    from rich.syntax import Syntax

    from archsearch import pareto
    from archsearch.errors import UserError
    from archsearch.study import FACTS, REASON, RECORDS, REUSED_FROM, RUN_DIR, SPEC, STACK

    study = load(args)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if not trials:
        raise UserError(f"TRIAL: study {study.study_name!r} has no trials yet")
    if args.trial not in trials:
        raise UserError(f"TRIAL: study {study.study_name!r} has no trial {args.trial} (trials 0..{max(trials)})")
    t = trials[args.trial]
    from archsearch.cli._common import console

    c = console()
    names = pareto.metric_names(study)
    on_front = any(b.number == t.number for b in study.best_trials) if t.values else False
    c.print(f"[bold]trial {t.number}[/bold] of {study.study_name}: {t.state.name}, status {pareto.status_of(t)}"
            + (" [bold blue](on the front)[/bold blue]" if on_front else ""))
    if t.user_attrs.get(REASON):
        c.print(f"reason: {t.user_attrs[REASON]}")
    if REUSED_FROM in t.user_attrs:
        c.print(f"result reused from trial {t.user_attrs[REUSED_FROM]} (same spec hash)")
    if t.values:
        for n, d, v in zip(names, study.directions, t.values):
            c.print(f"  {n} ({d.name.lower()}): {pareto.format_value(n, v)}  [{v!r}]")
    if t.constraints:
        c.print("constraints (> 0 violated): " + ", ".join(f"{k}={v:.4g}" for k, v in t.constraints.items()))
    c.print(f"stack: {t.user_attrs.get(STACK, '?')}   params (Optuna): {t.params}")
    if FACTS in t.user_attrs:
        c.print(f"from the spec: {json.dumps(t.user_attrs[FACTS])}")
    if SPEC in t.user_attrs:
        c.print("spec:")
        c.print(Syntax(json.dumps(t.user_attrs[SPEC], indent=2), "json"))
    for i, rec in enumerate(t.user_attrs.get(RECORDS) or []):
        if not rec:
            continue
        c.print(f"[bold]record {i}[/bold] (task {rec.get('task', {}).get('name', '?')}, status {rec.get('status')}"
                + (f": {rec.get('reason')}" if rec.get("reason") else "") + ")")
        for key in ("metrics", "params", "flops_per_token", "decode_memory", "throughput", "train", "timings"):
            if key in rec:
                c.print(f"  {key}: {json.dumps(rec[key])}")
        tb = (rec.get("train") or {}).get("tensorboard_dir")
        if tb:
            c.print(f"  TensorBoard: tensorboard --logdir {tb}")
    if RUN_DIR in t.user_attrs:
        c.print(f"run directory (spec, configs, logs, records): {t.user_attrs[RUN_DIR]}")
    if t.user_attrs.get("log"):
        c.print(f"log: {t.user_attrs['log']}")
    return 0
