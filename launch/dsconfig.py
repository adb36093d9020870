"""DeepSpeed JSON configs for trials: the shipped defaults in ``launch/configs/`` and user overrides.

The config chooses the ZeRO stage, bf16 and gradient accumulation; the trial fills in the batch
sizes so the *global* batch stays fixed when the slot size k changes:
``micro_batch = global_batch // (k * gradient_accumulation_steps)`` (``micro_batch()`` below).

Defaults per slot: CPU -> ``zero0_fp32`` (bf16 autocast on CPU is slower than fp32 on most cores,
and ZeRO buys nothing for tiny models); one GPU -> ``zero0_bf16``; k > 1 GPUs -> ``zero2_bf16``
(data parallel with sharded gradients and optimizer state). A GPU slot's default leaves the bf16 flag
to the trial's device (``archsearch.train.resolve_precision``): bf16 where the GPU has it natively
(compute capability 8.0 on), fp32 on a V100 or T4, which only emulate it. A config named by the user
(``--ds-config zero0_bf16``) keeps its flag.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from archsearch.errors import UserError

CONFIG_DIR = Path(__file__).with_name("configs")


def shipped_configs() -> list[str]:
    """Names of the configs in ``launch/configs/`` (without ``.json``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_ds_config(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """A shipped config by name (``zero2_bf16``) or a user's JSON file; UserError on a bad file."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = CONFIG_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise UserError(f"ds-config: no shipped config {str(name_or_path)!r}; shipped: {', '.join(shipped_configs())}")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"ds-config: cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"ds-config: {path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    validate_ds_config(cfg, str(path))
    return cfg


def validate_ds_config(cfg: Any, where: str = "ds-config") -> None:
    """Check the fields we rely on; the rest is DeepSpeed's to judge."""
    if not isinstance(cfg, dict):
        raise UserError(f"{where}: must be a JSON object, got {type(cfg).__name__}")
    zero = cfg.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise UserError(f"{where}: zero_optimization must be an object, got {zero!r}")
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise UserError(f"{where}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    accum = cfg.get("gradient_accumulation_steps", 1)
    if not isinstance(accum, int) or isinstance(accum, bool) or accum < 1:
        raise UserError(f"{where}: gradient_accumulation_steps must be an integer >= 1, got {accum!r}")
    if cfg.get("fp16", {}).get("enabled"):
        raise UserError(f"{where}: fp16.enabled: use bf16 (fp16 needs loss scaling the trials do not tune)")


def default_ds_config(num_gpus: int) -> dict[str, Any]:
    """The shipped default for a slot with ``num_gpus`` GPUs (0 = CPU); for GPUs without its bf16 flag,
    which the trial sets for its own device (see the module's docstring)."""
    if num_gpus == 0:
        return load_ds_config("zero0_fp32")
    cfg = load_ds_config("zero0_bf16" if num_gpus == 1 else "zero2_bf16")
    del cfg["bf16"]
    return cfg


def ds_config_for_slot(slot, override: str | os.PathLike | dict | None = None) -> dict[str, Any]:
    """The config a trial on ``slot`` runs with: ``override`` (a path, name or dict), else the
    slot's own (``--ds-config``), else the default for the slot's GPU count."""
    if override is None:
        override = getattr(slot, "ds_config", None)
    if override is None:
        return default_ds_config(len(slot.gpus))
    if isinstance(override, dict):
        validate_ds_config(override)
        return copy.deepcopy(override)
    return load_ds_config(override)


def micro_batch(global_batch: int, world_size: int, ds_config: dict[str, Any] | None = None) -> int:
    """Per-rank micro batch that keeps ``global_batch`` fixed; UserError when it does not divide."""
    accum = int((ds_config or {}).get("gradient_accumulation_steps", 1))
    per = world_size * accum
    if global_batch < per or global_batch % per:
        raise UserError(
            f"batch_size: global batch {global_batch} must be a multiple of ranks x gradient_accumulation_steps "
            f"= {world_size} x {accum} = {per}"
        )
    return global_batch // per
