"""``archsearch trial SPEC.json``: run one trial by hand and print its record.

SPEC.json is an ArchSpec (see ``archsearch/examples/hybrid_small.json``) or a trial's record, whose
spec and config are then reused, so any trial of a study can be reproduced::

    archsearch trial archsearch/examples/hybrid_small.json --tokens 20000 --device cpu
    archsearch trial studies/s/trials/0007/record.json --json      # same spec, same config

Options override the config field by field. The process trains in place (world size 1); a
multi-GPU trial is ``deepspeed --module archsearch.trial --spec S --config C --out R``.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HELP = "run one trial (train, evaluate, measure) from a spec or record file and print its record"


def add_arguments(p) -> None:
    p.add_argument("spec", metavar="SPEC.json", help="an ArchSpec JSON file, or a trial record (reuses its spec and config)")
    p.add_argument("--config", metavar="CFG.json", help="a TrialConfig JSON (or a record) to start from")
    g = p.add_argument_group("task")
    g.add_argument("--task", help="task name (default mqar)")
    g.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="task parameter, VALUE read as YAML (repeatable), e.g. --task-param num_kv_pairs=4")
    g = p.add_argument_group("training")
    g.add_argument("--tokens", type=int, help="training budget in tokens")
    g.add_argument("--seconds", type=float, help="wall-clock limit of training")
    g.add_argument("--batch", type=int, help="global batch size (sequences)")
    g.add_argument("--lr", type=float, help="peak learning rate")
    g.add_argument("--eval-every", type=int, help="evaluate every N steps (0 = at the end only)")
    g.add_argument("--precision", choices=("auto", "fp32", "bf16"), help="auto: bf16 on a GPU with native bf16 (compute capability 8.0 on), else fp32")
    g.add_argument("--seed", type=int, help="seed of initialisation and data order")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"))
    g.add_argument("--ds-config", metavar="NAME|JSON",
                   help="DeepSpeed config merged over the defaults: a shipped name (zero2_bf16, ...) or a file")
    g = p.add_argument_group("measurement")
    g.add_argument("--context", type=int, help="decode-memory context (tokens)")
    g.add_argument("--measure-batch", type=int, help="batch for decode memory and throughput")
    g.add_argument("--prefill-len", type=int, help="prompt length for throughput")
    g.add_argument("--repeats", type=int, help="timed repetitions (median)")
    g.add_argument("--no-throughput", action="store_true", help="skip throughput (analytic numbers only)")
    p.add_argument("--out", metavar="DIR", help="output directory (default runs/trials/<hash>-<time>)")
    p.add_argument("--json", action="store_true", help="print the record as JSON (nothing else on stdout)")


def _is_record(d: Any) -> bool:
    return isinstance(d, dict) and "spec" in d and "status" in d and "config" in d


def _task_params(items: list[str]) -> dict[str, Any]:
    import yaml

    from archsearch.errors import UserError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--task-param: must be KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def build_config(args, base: dict[str, Any] | None, spec_hash: str) -> Any:
    """The TrialConfig: ``base`` (a config dict) or the defaults, overridden by the options."""
    from archsearch.errors import UserError
    from archsearch.trial import TrialConfig

    if base is not None and not isinstance(base, dict):
        raise UserError(f"config: must be a mapping, got {type(base).__name__}")
    d = json.loads(json.dumps(base)) if base else {}
    if args.task is not None and args.task != d.get("task"):
        d["task"], d["task_params"] = args.task, {}
    # The options write into these sections, so they must be mappings before TrialConfig sees them.
    for name in ("train", "measure", "task_params"):
        if not isinstance(d.setdefault(name, {}), dict):
            raise UserError(f"{name}: must be a mapping, got {type(d[name]).__name__}")
    train, measure = d["train"], d["measure"]
    d["task_params"].update(_task_params(args.task_param))
    for opt, section, field in (("tokens", train, "tokens"), ("seconds", train, "max_seconds"),
                                ("batch", train, "batch_size"), ("lr", train, "lr"),
                                ("eval_every", train, "eval_every"), ("precision", train, "precision"),
                                ("context", measure, "context"), ("measure_batch", measure, "batch"),
                                ("prefill_len", measure, "prefill_len"), ("repeats", measure, "repeats"),
                                ("seed", d, "seed"), ("device", d, "device")):
        value = getattr(args, opt)
        if value is not None:
            section[field] = value
    if args.no_throughput:
        measure["throughput"] = False
    if args.ds_config:
        from launch.dsconfig import load_ds_config

        d["ds_config"] = load_ds_config(args.ds_config)
    if args.out:
        d["out_dir"] = args.out
    elif not base or "out_dir" not in d:
        d["out_dir"] = str(Path("runs") / "trials" / f"{spec_hash[:12]}-{time.strftime('%Y%m%d-%H%M%S')}")
    else:  # reproducing a record: never overwrite the original trial's directory
        d["out_dir"] = str(Path(d["out_dir"]).with_name(Path(d["out_dir"]).name + f"-rerun-{time.strftime('%H%M%S')}"))
    return TrialConfig.from_dict(d)


def _fmt_bytes(n: Any) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return str(n)  # pragma: no cover


def _fmt(x: Any, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def summary_table(rec: dict[str, Any], path: str, stack: str) -> Any:
    """A rich Table with the record's headline numbers."""
    from rich.table import Table

    t = Table(title=f"trial {rec['spec_hash'][:12]}  {stack}", show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    style = "green" if rec["status"] == "ok" else "red"
    t.add_row("status", f"[{style}]{rec['status']}[/{style}]" + (f"  {rec['reason']}" if rec["reason"] else ""))
    for note in rec["notes"]:
        t.add_row("note", note)
    task = rec["task"]
    if task:
        t.add_row("task", f"{task['name']} (vocab {task['vocab_size']}, seq {task['seq_len']})")
    for name, value in rec["metrics"].items():
        t.add_row(f"  {name}", f"{value:.4f} ({rec['metric_directions'].get(name, '?')})")
    t.add_row("params", f"{rec['params']:,}" if rec["params"] is not None else "-")
    t.add_row("FLOPs/token", f"{rec['flops_per_token']:,}" if rec["flops_per_token"] is not None else "-")
    mem = rec["decode_memory"]
    t.add_row("decode memory", f"{_fmt_bytes(mem['analytic_bytes'])} analytic, {_fmt_bytes(mem['measured_peak_bytes'])} "
              f"measured  (batch {mem['batch']}, context {mem['context']}, {mem['dtype']})")
    if mem.get("gap_note"):
        t.add_row("  note", mem["gap_note"])
    tp = rec["throughput"]
    if tp.get("decode_tokens_per_s") is not None:
        t.add_row("decode", f"{tp['decode_tokens_per_s']:,.0f} tok/s  (batch {tp['batch']}, context {tp['context']}, "
                  f"{tp.get('decode_mode', '?')})")
        t.add_row("prefill", f"{tp['prefill_tokens_per_s']:,.0f} tok/s  (batch {tp['batch']}, length {tp['context']})")
    t.add_row("device", str(tp.get("device") or "-"))
    tr = rec["train"]
    t.add_row("trained", f"{tr['tokens']:,} tokens, {tr['steps']} steps, {_fmt(tr['seconds'], '.1f')} s, "
              f"final loss {_fmt(tr['final_loss'])}, world size {tr['world_size']}")
    t.add_row("curve", str(tr["curve_path"] or "-"))
    t.add_row("tensorboard", str(tr["tensorboard_dir"] or "-"))
    t.add_row("record", path)
    return t


def run(args) -> int:
    import contextlib

    from archsearch.errors import UserError
    from archsearch.spec import ArchSpec
    from archsearch.trial import read_json

    data = read_json(args.spec, "spec")
    base = None
    if _is_record(data):
        base, data = data.get("config") or None, data["spec"]
    if args.config:
        cfg_data = read_json(args.config, "--config")
        base = cfg_data["config"] if _is_record(cfg_data) else cfg_data
    if not isinstance(data, dict):
        raise UserError(f"spec: {args.spec} must hold a JSON object, got {type(data).__name__}")
    spec = ArchSpec.from_dict(data).validate()
    cfg = build_config(args, base, spec.hash)

    from archsearch.trial import run_trial

    # DeepSpeed prints to stdout (op builds, warnings); keep stdout for the record itself.
    with contextlib.redirect_stdout(sys.stderr):
        rec = run_trial(spec, cfg)
        _close_process_group()
    path = str(Path(cfg.out_dir) / "record.json")
    if args.json:
        print(json.dumps(rec, indent=2))
    else:
        from rich.console import Console

        Console().print(summary_table(rec, path, spec.stack_string()))
    return 0 if rec["status"] == "ok" else 1


def _close_process_group() -> None:
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        tdist.destroy_process_group()
