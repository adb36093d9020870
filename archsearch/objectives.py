"""Objective values and constraints of a candidate, from its spec and its trial records.

What can be known from the spec alone (parameters, decode-state bytes, softmax share) is computed
here on the meta device, before any training: it is what the constraints check, so infeasible
candidates cost no training. Trained quantities (task metrics, throughput) come from the records
the trial processes write (``archsearch.record``).

Infeasible candidates are still told to Optuna as COMPLETE trials (so every sampler learns from
them) with a positive constraint value (``trial.set_constraint``: Optuna's samplers and
``study.best_trials`` treat any constraint > 0 as infeasible) and with dominated objective values:
the spec-derived objectives keep their true value, trained ones get a worst case (0 for a maximised
metric or throughput; ``ln(vocab)``, the loss of a uniform guess, for a minimised loss; 1e9 for any
other minimised metric). See ``worst_values``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from search_spaces.sampling import softmax_blocks
from search_spaces.schema import Objective, Space
from search_spaces.validate import objective_key

RUNTIME_CONSTRAINT = "runs"  # 1 when the candidate ran out of memory while training, else 0

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


@dataclasses.dataclass(frozen=True)
class StaticFacts:
    """What the spec alone says about a candidate."""

    params: int
    softmax_share: float
    decode_bytes: dict[tuple[int, int, str], int]  # (context, batch, dtype) -> bytes

    def to_attrs(self) -> dict[str, Any]:
        return {"params": self.params, "softmax_share": self.softmax_share,
                "decode_bytes": {f"{c}x{b}:{d}": v for (c, b, d), v in self.decode_bytes.items()}}


def metric_names(space: Space) -> list[str]:
    return [objective_key(o, space.task.name) for o in space.objectives]


def directions(space: Space) -> list[str]:
    return [o.direction for o in space.objectives]


def _memory_points(space: Space) -> list[tuple[int, int, str]]:
    pts = [(o.context, o.batch, o.dtype) for o in space.objectives if o.kind == "decode_memory"]
    lim = space.constraints.max_decode_memory
    if lim is not None:
        pts.append((lim.context, lim.batch, lim.dtype))
    return list(dict.fromkeys(pts))


def static_facts(space: Space, spec) -> StaticFacts:
    """Build ``HybridLM(spec)`` (on the meta device when large) and read its accounting."""
    import torch

    from archsearch.model import HybridLM

    # Small models are built for real on the CPU: meta-device init of some blocks imports
    # torch._dynamo (seconds, once per process), more than building a small model costs.
    approx = spec.d_model * spec.vocab_size + 16 * len(spec.layers) * spec.d_model**2
    with torch.device("cpu" if approx < 20_000_000 else "meta"):
        model = HybridLM(spec)
    soft = softmax_blocks(space)
    share = sum(layer.block in soft for layer in spec.layers) / len(spec.layers)
    mem = {(c, b, d): int(model.state_bytes(b, c, getattr(torch, _DTYPES[d]))) for c, b, d in _memory_points(space)}
    return StaticFacts(params=int(model.num_params()), softmax_share=share, decode_bytes=mem)


def constraint_values(space: Space, facts: StaticFacts, runtime_ok: bool = True) -> dict[str, float]:
    """Optuna constraint values: <= 0 satisfied, > 0 violated (relative excess, so scales compare)."""
    c = space.constraints
    out: dict[str, float] = {}
    if c.max_params is not None:
        out["max_params"] = (facts.params - c.max_params) / c.max_params
    if c.max_decode_memory is not None:
        lim = c.max_decode_memory
        used = facts.decode_bytes[(lim.context, lim.batch, lim.dtype)]
        out["max_decode_memory"] = (used - lim.bytes) / lim.bytes
    if c.min_softmax_share is not None:
        out["min_softmax_share"] = c.min_softmax_share - facts.softmax_share
    if c.max_softmax_share is not None:
        out["max_softmax_share"] = facts.softmax_share - c.max_softmax_share
    out[RUNTIME_CONSTRAINT] = 0.0 if runtime_ok else 1.0
    return out


def violated(constraints: Mapping[str, float]) -> list[str]:
    return [k for k, v in constraints.items() if v > 0]


def _static_value(o: Objective, facts: StaticFacts) -> float | None:
    if o.kind == "params":
        return float(facts.params)
    if o.kind == "decode_memory":
        return float(facts.decode_bytes[(o.context, o.batch, o.dtype)])
    return None


def worst_values(space: Space, facts: StaticFacts, vocab_size: int) -> list[float]:
    """Dominated values for an infeasible candidate (see the module docstring)."""
    out = []
    for o in space.objectives:
        v = _static_value(o, facts)
        if v is None:
            if o.direction == "maximize":
                v = 0.0
            elif o.kind == "quality" and "loss" in (o.metric or ""):
                v = math.log(vocab_size)
            else:
                v = 1e9
        out.append(v)
    return out


def quality_tasks(space: Space) -> list[tuple[str, dict[str, Any]]]:
    """The distinct (task, params) a candidate trains on: the space's task first, then any other
    task a quality objective names (each is one more trial process for the same spec)."""
    runs = [(space.task.name, dict(space.task.params))]
    for o in space.objectives:
        if o.kind == "quality" and o.task is not None:
            key = (o.task, dict(o.task_params or {}))
            if key not in runs:
                runs.append(key)
    return runs


def values(space: Space, facts: StaticFacts, records: list[dict[str, Any]]) -> list[float]:
    """Objective values of a trained candidate. ``records[i]`` is the record of ``quality_tasks()[i]``;
    the first one also carries the throughput measurements."""
    runs = quality_tasks(space)
    out = []
    for o in space.objectives:
        v = _static_value(o, facts)
        if v is None:
            if o.kind == "quality":
                key = (space.task.name, dict(space.task.params)) if o.task is None else (o.task, dict(o.task_params or {}))
                rec = records[runs.index(key)]
                if o.metric not in rec.get("metrics", {}):
                    raise KeyError(f"record of task {key[0]} has no metric {o.metric!r} "
                                   f"(it has {', '.join(rec.get('metrics', {}))})")
                v = float(rec["metrics"][o.metric])
            elif o.kind == "decode_throughput":
                v = float(records[0]["throughput"]["decode_tokens_per_s"])
            elif o.kind == "prefill_throughput":
                v = float(records[0]["throughput"]["prefill_tokens_per_s"])
        out.append(v)
    return out


def measure_settings(space: Space) -> dict[str, Any]:
    """The trial's MeasureConfig fields implied by the objectives (throughput only when asked for)."""
    dec = next((o for o in space.objectives if o.kind == "decode_throughput"), None)
    pre = next((o for o in space.objectives if o.kind == "prefill_throughput"), None)
    mem = next((o for o in space.objectives if o.kind == "decode_memory"), None)
    ref = dec or pre or mem
    return {
        "context": (dec or mem).context if (dec or mem) else (pre.length if pre else 1024),
        "batch": ref.batch if ref else 1,
        "prefill_len": pre.length if pre else (dec.context if dec else 512),
        "repeats": space.budget.measure_repeats,
        "throughput": bool(dec or pre),
        "decode_compile": bool(dec and dec.compile),
    }
