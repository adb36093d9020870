"""The result record of one trial: one JSON document with everything needed to audit its scores.

A record holds the spec, every objective's raw ingredients (task metrics, parameter count, FLOPs,
analytic and measured decode memory, measured throughput) together with the conditions they were
measured under (context, batch, dtype, device), where the training curve lives (a JSONL file and a
TensorBoard directory), timings, library versions, and the status with its failure reason::

    rec = record.build(spec=spec.to_dict(), spec_hash=spec.hash, status="ok", ...)
    record.write(rec, "runs/t0/record.json")        # atomic: a reader never sees half a file
    rec = record.read("runs/t0/record.json")        # validated; UserError names the bad key

``failure_record`` makes the record of a trial that never got to write one (the process was
killed, or a bad config), so every trial of a study leaves a record behind.

Keys (``validate`` checks each is present with its type; sections may carry more keys):

* ``spec``, ``spec_hash``: the ArchSpec as a dict and its sha256 (``ArchSpec.hash``).
* ``status``: ok | diverged | timeout | oom | failed | interrupted; ``reason``: one line, required
  unless ok; ``notes``: remarks that do not change the status (e.g. max_seconds reached).
* ``task``: name, params, vocab_size, seq_len; ``metrics``: the task's held-out metrics (final
  evaluation); ``metric_directions``: metric -> maximize | minimize.
* ``params``, ``flops_per_token``: parameter count; forward FLOPs per token at the decode context.
* ``decode_memory``: context, batch, dtype, analytic_bytes (exact state bytes), measured_peak_bytes
  (CUDA only, else null), gap_note (why they differ > 10%, or why not measured); on CUDA also the
  measured parts (prefill/decode peaks, held bytes, state tensor bytes).
* ``throughput``: device, decode_tokens_per_s, prefill_tokens_per_s, batch, context (prompt length)
  and the conditions: decode_steps, repeats, warmup, decode_mode (eager | cuda_graph | cuda_graph_compiled;
  decode_graph_error says why not the one asked for), dtype,
  threads, held_check (analytic vs held state bytes after a real prefill).
* ``train``: tokens, steps, planned_steps, seconds, final_loss (mean of the last 10 steps),
  curve_path (JSONL), tensorboard_dir, world_size, global_batch, micro_batch, grad_accum,
  precision, zero_stage.
* ``config``: the TrialConfig; ``timings``: seconds per phase; ``versions``: libraries and host.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from archsearch.errors import UserError

SCHEMA_VERSION = 1
STATUSES = ("ok", "diverged", "timeout", "oom", "failed", "interrupted")

# key -> JSON types it may hold (None = null allowed). Nested dicts list their own required keys.
TOP_KEYS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "spec": (dict,),
    "spec_hash": (str,),
    "status": (str,),
    "reason": (str,),
    "notes": (list,),
    "task": (dict,),
    "metrics": (dict,),
    "metric_directions": (dict,),
    "params": (int, type(None)),
    "flops_per_token": (int, type(None)),
    "decode_memory": (dict,),
    "throughput": (dict,),
    "train": (dict,),
    "config": (dict,),
    "timings": (dict,),
    "versions": (dict,),
}
DECODE_MEMORY_KEYS = ("context", "batch", "dtype", "analytic_bytes", "measured_peak_bytes", "gap_note")
THROUGHPUT_KEYS = ("device", "decode_tokens_per_s", "prefill_tokens_per_s", "batch", "context")
TRAIN_KEYS = ("tokens", "steps", "seconds", "final_loss", "curve_path", "tensorboard_dir", "world_size")


def empty_decode_memory(context: int | None = None, batch: int | None = None, dtype: str | None = None) -> dict[str, Any]:
    """The ``decode_memory`` section before (or without) measurement: every key present, values null."""
    return {"context": context, "batch": batch, "dtype": dtype, "analytic_bytes": None,
            "measured_peak_bytes": None, "gap_note": None}


def empty_throughput(batch: int | None = None, context: int | None = None) -> dict[str, Any]:
    """The ``throughput`` section when throughput was not measured."""
    return {"device": None, "decode_tokens_per_s": None, "prefill_tokens_per_s": None,
            "batch": batch, "context": context}


def empty_train(world_size: int = 1) -> dict[str, Any]:
    """The ``train`` section of a trial that did not train."""
    return {"tokens": 0, "steps": 0, "seconds": 0.0, "final_loss": None, "curve_path": None,
            "tensorboard_dir": None, "world_size": world_size}


def library_versions() -> dict[str, Any]:
    """Library versions that can change a result (torch, DeepSpeed, CUDA) and where it ran."""
    import archsearch

    out: dict[str, Any] = {"archsearch": archsearch.__version__, "python": platform.python_version(),
                           "platform": platform.platform(), "hostname": platform.node()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    ds = sys.modules.get("deepspeed")
    if ds is not None:
        out["deepspeed"] = ds.__version__
    return out


def build(
    *,
    spec: Mapping[str, Any],
    spec_hash: str,
    status: str,
    reason: str = "",
    notes: list[str] | None = None,
    task: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float] | None = None,
    metric_directions: Mapping[str, str] | None = None,
    params: int | None = None,
    flops_per_token: int | None = None,
    decode_memory: Mapping[str, Any] | None = None,
    throughput: Mapping[str, Any] | None = None,
    train: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    timings: Mapping[str, float] | None = None,
    versions: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble and validate a record; missing sections are filled with their null forms."""
    rec = {
        "schema_version": SCHEMA_VERSION,
        "spec": dict(spec),
        "spec_hash": spec_hash,
        "status": status,
        "reason": reason,
        "notes": list(notes or []),
        "task": dict(task or {}),
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "metric_directions": dict(metric_directions or {}),
        "params": params,
        "flops_per_token": flops_per_token,
        "decode_memory": dict(decode_memory or empty_decode_memory()),
        "throughput": dict(throughput or empty_throughput()),
        "train": dict(train or empty_train()),
        "config": dict(config or {}),
        "timings": {k: float(v) for k, v in (timings or {}).items()},
        "versions": dict(versions if versions is not None else library_versions()),
    }
    validate(rec)
    return rec


def failure_record(spec: Mapping[str, Any] | None, status: str, reason: str, *, spec_hash: str = "",
                   config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record of a trial that produced nothing else (killed, bad input): status and reason only."""
    return build(spec=spec or {}, spec_hash=spec_hash, status=status, reason=reason, config=config)


def _check_section(rec: Mapping[str, Any], section: str, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in rec[section]]
    if missing:
        raise UserError(f"record.{section}.{missing[0]}: required key is missing")


def validate(rec: Any) -> None:
    """Raise UserError naming the first missing or mistyped key; the record must also be pure JSON
    (finite floats only: NaN is not JSON, a diverged loss is recorded as null)."""
    if not isinstance(rec, Mapping):
        raise UserError(f"record: must be a JSON object, got {type(rec).__name__}")
    for key, types in TOP_KEYS.items():
        if key not in rec:
            raise UserError(f"record.{key}: required key is missing")
        value = rec[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise UserError(f"record.{key}: must be {names}, got {type(value).__name__}")
    if rec["status"] not in STATUSES:
        raise UserError(f"record.status: must be one of {', '.join(STATUSES)}, got {rec['status']!r}")
    if rec["status"] != "ok" and not rec["reason"]:
        raise UserError(f"record.reason: a {rec['status']!r} record must say why")
    _check_section(rec, "decode_memory", DECODE_MEMORY_KEYS)
    _check_section(rec, "throughput", THROUGHPUT_KEYS)
    _check_section(rec, "train", TRAIN_KEYS)
    _check_json(rec, "record")


def _check_json(value: Any, path: str) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise UserError(f"{path}: keys must be strings, got {k!r}")
            _check_json(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{path}[{i}]")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{path}: must be a finite number (use null), got {value!r}")
    elif not (value is None or isinstance(value, (bool, int, str))):
        raise UserError(f"{path}: must be a JSON value, got {type(value).__name__}")


def write(rec: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Validate and write ``rec`` as indented JSON, atomically (temp file + rename in the same dir)."""
    validate(rec)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(rec, f, indent=2, sort_keys=False, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a record; a missing, torn or invalid file is a one-line UserError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read record: {exc.strerror or exc}") from None
    try:
        rec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not a JSON record: {exc}") from None
    validate(rec)
    return rec
