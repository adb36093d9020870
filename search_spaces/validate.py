"""Turn a space dict (parsed YAML or ``Space.to_dict()``) into a ``Space``, collecting EVERY error.

Each error is one line ``<yaml.path>: <what is wrong>, got <value>``; ``parse_space`` raises one
``UserError`` whose message is all of them joined by newlines, so a user fixes a file in one pass.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import re
import warnings
from typing import Any, Callable

from archsearch.errors import UserError
from archsearch.spec import MLP_KINDS, NORM_KINDS

from .domains import Choice, Domain, Fixed, FloatRange, IntRange, parse_domain
from .schema import (
    DIRECTIONS,
    DTYPES,
    OBJECTIVE_KINDS,
    PLACEMENTS,
    SAMPLERS,
    Budget,
    Constraints,
    DecodeMemoryLimit,
    Model,
    Objective,
    Pattern,
    PerLayer,
    Sampler,
    Space,
    StudySettings,
    Task,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    """A finite number (.inf and .nan are YAML numbers too)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def int_at_least(lo: int) -> Callable[[Any], str | None]:
    return lambda v: None if _is_int(v) and v >= lo else (f"must be an integer >= {lo}")


def num_at_least(lo: float, strict: bool = False) -> Callable[[Any], str | None]:
    op = ">" if strict else ">="
    return lambda v: None if _is_num(v) and (v > lo if strict else v >= lo) else f"must be a number {op} {lo}"


def one_of(options) -> Callable[[Any], str | None]:
    return lambda v: None if v in options else f"must be one of {', '.join(map(str, options))}"


class _Parser:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, path: str, msg: str) -> None:
        self.errors.append(f"{path}: {msg}")

    def mapping(self, d: Any, path: str, known: set[str], required: set[str] = frozenset()) -> dict:
        if d is None:
            d = {}
        if not isinstance(d, dict):
            self.err(path, f"must be a mapping, got {d!r}")
            return {}
        for k in d:
            if k not in known:
                self.err(f"{path}.{k}" if path else str(k),
                         f"unknown field; known fields: {', '.join(sorted(known))}")
        for k in sorted(required):
            if k not in d:
                self.err(f"{path}.{k}" if path else k, "is required")
        return d

    def scalar(self, d: dict, key: str, path: str, default: Any, check: Callable[[Any], str | None],
               nullable: bool = False) -> Any:
        v = d.get(key, default)
        if v is None and nullable:
            return None
        why = check(v)
        if why:
            self.err(f"{path}.{key}", f"{why}, got {v!r}")
            return default
        return v

    def domain(self, d: dict, key: str, path: str, default: Any, check, nullable: bool = False) -> Domain | None:
        v = d.get(key, default)
        if v is None and nullable:
            return None
        return parse_domain(v, f"{path}.{key}", self.errors, check)


def _registered_blocks() -> list[str]:
    import blocks

    return blocks.names()


def _block_check(names: list[str]) -> Callable[[Any], str | None]:
    return lambda v: None if v in names else f"unknown block; registered blocks: {', '.join(names)}"


def name_error(v: Any) -> str | None:
    """Why ``v`` cannot name a space or study (it becomes a directory under the studies root)."""
    return None if isinstance(v, str) and _NAME.match(v) else "must be a name of letters, digits, _ . -"


def parse_space(d: Any) -> Space:
    p = _Parser()
    top = p.mapping(d, "", {"name", "description", "task", "model", "constraints", "objectives",
                            "budget", "sampler", "study"}, {"name", "task", "model", "objectives"})
    name = top.get("name", "space")
    if "name" in top and name_error(name):
        p.err("name", f"{name_error(name)}, got {name!r}")
    description = top.get("description") or ""
    task = _task(p, top.get("task"))
    model = _model(p, top.get("model"))
    constraints = _constraints(p, top.get("constraints"))
    objectives = _objectives(p, top.get("objectives"), task)
    budget = _budget(p, top.get("budget"))
    sampler = _sampler(p, top.get("sampler"))
    study = _study(p, top.get("study"))
    if p.errors:
        raise UserError("\n".join(p.errors))
    space = Space(name=name, description=str(description), task=task, model=model,
                  objectives=objectives, budget=budget, constraints=constraints, sampler=sampler,
                  study=study)
    _check_combinations(p, space)
    if p.errors:
        raise UserError("\n".join(p.errors))
    return space


# ---- sections ------------------------------------------------------------------------------
def _task(p: _Parser, d: Any) -> Task:
    d = p.mapping(d, "task", {"name", "params"}, {"name"})
    name = d.get("name", "")
    params = {} if d.get("params") is None else d["params"]  # [] is an error, not "no params"
    if not isinstance(params, dict):
        p.err("task.params", f"must be a mapping, got {params!r}")
        params = {}
    if "name" in d:
        _check_task(p, "task", name, params)
    return Task(name=name, params=dict(params))


def _check_task(p: _Parser, path: str, name: Any, params: dict) -> dict[str, str] | None:
    """Build the task once (cheap: generators are lazy) to check name and params; returns metrics."""
    from archsearch import tasks

    known = tasks.names()
    if name not in known:
        p.err(f"{path}.name", f"unknown task; known tasks: {', '.join(known)}, got {name!r}")
        return None
    try:
        return dict(tasks.build(name, **params).metrics)
    except (UserError, TypeError, ValueError) as exc:
        p.err(f"{path}.params", str(exc))
        return None


def _model(p: _Parser, d: Any) -> Model:
    path = "model"
    fields = {f.name for f in dataclasses.fields(Model)} - {"stack"} | {"per_layer", "pattern"}
    d = p.mapping(d, path, fields, {"depth"})
    names = _registered_blocks()
    m = Model(
        depth=p.domain(d, "depth", path, 4, int_at_least(1)),
        d_model=p.domain(d, "d_model", path, 64, int_at_least(1)),
        num_heads=p.domain(d, "num_heads", path, 4, int_at_least(1)),
        head_dim_k=p.domain(d, "head_dim_k", path, None, int_at_least(1), nullable=True),
        head_dim_v=p.domain(d, "head_dim_v", path, None, int_at_least(1), nullable=True),
        state_expansion=p.domain(d, "state_expansion", path, None, num_at_least(0, strict=True), nullable=True),
        feature_map=p.domain(d, "feature_map", path, None,
                             lambda v: None if isinstance(v, str) else "must be a string", nullable=True),
        short_conv=p.domain(d, "short_conv", path, None,
                            lambda v: None if isinstance(v, bool) else "must be true or false", nullable=True),
        conv_size=p.scalar(d, "conv_size", path, 4, lambda v: None if _is_int(v) and 2 <= v <= 4 else "must be an integer in 2..4"),
        mlp_expansion=p.domain(d, "mlp_expansion", path, 2.0, num_at_least(0)),
        # the spec's own lists: a kind it refuses would fail every trial
        mlp=p.scalar(d, "mlp", path, "swiglu", one_of(MLP_KINDS)),
        norm=p.scalar(d, "norm", path, "rmsnorm", one_of(NORM_KINDS)),
        vocab_size=p.scalar(d, "vocab_size", path, None, int_at_least(2), nullable=True),
    )
    if ("per_layer" in d) == ("pattern" in d):
        p.err(path, "needs exactly one of per_layer (a block choice per layer) or pattern (softmax placed by rule)")
    elif "per_layer" in d:
        pl = p.mapping(d["per_layer"], f"{path}.per_layer", {"blocks"}, {"blocks"})
        bl = pl.get("blocks", [])
        if not isinstance(bl, list) or not bl:
            p.err(f"{path}.per_layer.blocks", f"must be a non-empty list of block names, got {bl!r}")
            bl = []
        for i, b in enumerate(bl):
            if b not in names:
                p.err(f"{path}.per_layer.blocks[{i}]", f"unknown block {b!r}; registered blocks: {', '.join(names)}")
        if len(set(map(str, bl))) != len(bl):
            p.err(f"{path}.per_layer.blocks", f"block names must be distinct, got {bl!r}")
        m.stack = PerLayer(list(bl))
    else:
        pp = f"{path}.pattern"
        pd = p.mapping(d["pattern"], pp, {"mixer", "softmax", "every", "share", "placement"}, {"mixer"})
        pat = Pattern(
            mixer=p.domain(pd, "mixer", pp, "gated_deltanet", _block_check(names)),
            softmax=p.scalar(pd, "softmax", pp, "softmax", _block_check(names)),
            every=p.domain(pd, "every", pp, None, lambda v: None if _is_int(v) and v >= 1 else "must be >= 1", nullable=True),
            share=p.domain(pd, "share", pp, None, lambda v: None if _is_num(v) and 0 <= v <= 1 else "must be in [0, 1]", nullable=True),
            placement=(p.domain(pd, "placement", pp, "even", one_of(PLACEMENTS))
                       if "share" in pd or "placement" in pd else None),
        )
        if ("every" in pd) == ("share" in pd):
            p.err(pp, "needs exactly one of every (softmax every k-th layer) or share (a fraction of layers)")
        if "placement" in pd and "every" in pd:
            p.err(f"{pp}.placement", "applies to share only; every places softmax at layers k, 2k, ...")
        m.stack = pat
    bd = {} if d.get("blocks") is None else d["blocks"]
    if not isinstance(bd, dict):
        p.err(f"{path}.blocks", f"must be a mapping of block name to field ranges, got {bd!r}")
        bd = {}
    for bname, fields_d in bd.items():
        bp = f"{path}.blocks.{bname}"
        if bname not in names:
            p.err(bp, f"unknown block {bname!r}; registered blocks: {', '.join(names)}")
            continue
        import blocks

        known = {f.name for f in dataclasses.fields(blocks.get(bname).Config)}
        fd = p.mapping(fields_d, bp, known)
        m.blocks[bname] = {}
        for fname in fd:
            if fname in known:
                dom = p.domain(fd, fname, bp, None, None)
                if dom is not None:
                    m.blocks[bname][fname] = dom
    return m


def _parse_bytes(v: Any) -> int | None:
    if _is_int(v):
        return v
    if isinstance(v, str):
        mt = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", v)
        if mt and mt.group(2).lower() in _UNITS:
            return int(float(mt.group(1)) * _UNITS[mt.group(2).lower()])
    return None


def _constraints(p: _Parser, d: Any) -> Constraints:
    path = "constraints"
    d = p.mapping(d, path, {f.name for f in dataclasses.fields(Constraints)})
    c = Constraints(
        max_params=p.scalar(d, "max_params", path, None, int_at_least(1), nullable=True),
        min_softmax_share=p.scalar(d, "min_softmax_share", path, None,
                                   lambda v: None if _is_num(v) and 0 <= v <= 1 else "must be in [0, 1]", nullable=True),
        max_softmax_share=p.scalar(d, "max_softmax_share", path, None,
                                   lambda v: None if _is_num(v) and 0 <= v <= 1 else "must be in [0, 1]", nullable=True),
    )
    if c.min_softmax_share is not None and c.max_softmax_share is not None and c.min_softmax_share > c.max_softmax_share:
        p.err(f"{path}.min_softmax_share",
              f"must be <= max_softmax_share ({c.max_softmax_share}), got {c.min_softmax_share!r}")
    if d.get("max_decode_memory") is not None:
        mp = f"{path}.max_decode_memory"
        md = p.mapping(d["max_decode_memory"], mp, {"bytes", "context", "batch", "dtype"}, {"bytes", "context"})
        nbytes = _parse_bytes(md.get("bytes", 1))
        if nbytes is None or nbytes < 1:
            p.err(f"{mp}.bytes", f"must be a positive byte count (an integer or e.g. '64MiB'), got {md.get('bytes')!r}")
        c.max_decode_memory = DecodeMemoryLimit(
            bytes=nbytes or 1,
            context=p.scalar(md, "context", mp, 1, int_at_least(1)),
            batch=p.scalar(md, "batch", mp, 1, int_at_least(1)),
            dtype=p.scalar(md, "dtype", mp, "bfloat16", one_of(DTYPES)),
        )
    return c


_OBJ_FIELDS = {
    "quality": {"metric", "task", "task_params"},
    "decode_memory": {"context", "batch", "dtype"},
    "decode_throughput": {"context", "batch", "compile"},
    "prefill_throughput": {"length", "batch"},
    "params": set(),
}


def _objectives(p: _Parser, lst: Any, task: Task) -> list[Objective]:
    if not isinstance(lst, list) or not 2 <= len(lst) <= 4:
        p.err("objectives", f"must be a list of 2 to 4 objectives, got {lst!r}")
        return []
    out = []
    for i, od in enumerate(lst):
        path = f"objectives[{i}]"
        if isinstance(od, str):
            od = {"name": od}
        kind = od.get("name") if isinstance(od, dict) else None
        if kind not in OBJECTIVE_KINDS:
            p.err(f"{path}.name", f"must be one of {', '.join(OBJECTIVE_KINDS)}, got {kind!r}")
            continue
        od = p.mapping(od, path, {"name", "direction"} | _OBJ_FIELDS[kind],
                       {"context"} if kind in ("decode_memory", "decode_throughput") else
                       {"length"} if kind == "prefill_throughput" else set())
        o = Objective(kind=kind)
        o.direction = p.scalar(od, "direction", path, None, one_of(DIRECTIONS), nullable=True)
        if kind in ("decode_memory", "decode_throughput"):
            o.context = p.scalar(od, "context", path, 1, int_at_least(1))
        if kind == "prefill_throughput":
            o.length = p.scalar(od, "length", path, 1, int_at_least(1))
        if kind in ("decode_memory", "decode_throughput", "prefill_throughput"):
            o.batch = p.scalar(od, "batch", path, 1, int_at_least(1))
        if kind == "decode_memory":
            o.dtype = p.scalar(od, "dtype", path, "bfloat16", one_of(DTYPES))
        if kind == "decode_throughput":
            o.compile = p.scalar(od, "compile", path, False,
                                 lambda v: None if isinstance(v, bool) else "must be true or false")
        if kind == "quality":
            o.task = od.get("task")
            o.task_params = od.get("task_params")
            if o.task_params is not None and not isinstance(o.task_params, dict):
                p.err(f"{path}.task_params", f"must be a mapping, got {o.task_params!r}")
                o.task_params = None
            if o.task is not None and o.task == task.name and o.task_params is None:
                o.task = None  # same as the space's task
            metrics = None
            if o.task is None:
                if task.name and not any(e.startswith("task") for e in p.errors):
                    from archsearch import tasks

                    try:
                        metrics = dict(tasks.build(task.name, **task.params).metrics)
                    except Exception:  # reported by _task already
                        metrics = None
            else:
                metrics = _check_task(p, path, o.task, o.task_params or {})
                if metrics is None:
                    p.errors[-1] = p.errors[-1].replace(f"{path}.name", f"{path}.task")
            o.metric = od.get("metric")
            if metrics is not None:
                if o.metric is None:
                    o.metric = next(iter(metrics))
                if o.metric not in metrics:
                    p.err(f"{path}.metric", f"not a metric of task {o.task or task.name}; its metrics: "
                          f"{', '.join(metrics)}, got {o.metric!r}")
                elif o.direction is None:
                    o.direction = metrics[o.metric]
        if o.direction is None:
            o.direction = "maximize" if kind.endswith("throughput") else "minimize"
        out.append(o)
    keys = [objective_key(o, task.name) for o in out]
    for i, k in enumerate(keys):
        if k in keys[:i]:
            p.err(f"objectives[{i}]", f"duplicates objectives[{keys.index(k)}] ({k})")
    tp = [o for o in out if o.kind in ("decode_throughput", "prefill_throughput")]
    if len({o.batch for o in tp}) > 1:
        p.err("objectives", "decode_throughput and prefill_throughput must use the same batch "
              f"(one measurement run), got {sorted({o.batch for o in tp})}")
    compiles = {o.compile for o in out if o.kind == "decode_throughput"}
    if len(compiles) > 1:
        p.err("objectives", "decode_throughput objectives must agree on compile (one measurement "
              "run), got both true and false")
    return out


def objective_key(o: Objective, space_task: str = "task") -> str:
    """The metric name Optuna shows for an objective, e.g. ``mqar.accuracy`` or ``decode_memory@2048x1``."""
    if o.kind == "quality":
        return f"{o.task or space_task}.{o.metric}"
    if o.kind in ("decode_memory", "decode_throughput"):
        return f"{o.kind}@{o.context}x{o.batch}"
    if o.kind == "prefill_throughput":
        return f"prefill_throughput@{o.length}x{o.batch}"
    return "params"


def _budget(p: _Parser, d: Any) -> Budget:
    path = "budget"
    d = p.mapping(d, path, {f.name for f in dataclasses.fields(Budget)}, {"tokens"})
    dflt = Budget()  # the defaults live on the dataclass only
    return Budget(
        tokens=p.scalar(d, "tokens", path, dflt.tokens, int_at_least(1)),
        max_seconds=p.scalar(d, "max_seconds", path, dflt.max_seconds, num_at_least(0, strict=True)),
        batch_size=p.scalar(d, "batch_size", path, dflt.batch_size, int_at_least(1)),
        lr=p.scalar(d, "lr", path, dflt.lr, num_at_least(0, strict=True)),
        warmup_frac=p.scalar(d, "warmup_frac", path, dflt.warmup_frac,
                             lambda v: None if _is_num(v) and 0 <= v < 1 else "must be in [0, 1)"),
        weight_decay=p.scalar(d, "weight_decay", path, dflt.weight_decay, num_at_least(0)),
        grad_clip=p.scalar(d, "grad_clip", path, dflt.grad_clip, num_at_least(0)),
        eval_every=p.scalar(d, "eval_every", path, dflt.eval_every, int_at_least(0)),
        precision=p.scalar(d, "precision", path, dflt.precision, one_of(("auto", "fp32", "bf16"))),
        device=p.scalar(d, "device", path, dflt.device, one_of(("auto", "cpu", "cuda"))),
        seed=p.scalar(d, "seed", path, dflt.seed, int_at_least(0)),
        measure_repeats=p.scalar(d, "measure_repeats", path, dflt.measure_repeats, int_at_least(1)),
    )


def sampler_class(name: str):
    import optuna

    return {
        "tpe": optuna.samplers.TPESampler,
        "nsga2": optuna.samplers.NSGAIISampler,
        "gp": optuna.samplers.GPSampler,
        "random": optuna.samplers.RandomSampler,
        "grid": optuna.samplers.GridSampler,
    }[name]


def _sampler(p: _Parser, d: Any) -> Sampler:
    path = "sampler"
    if isinstance(d, str):
        d = {"name": d}
    d = p.mapping(d, path, {"name", "options"})
    s = Sampler(name=p.scalar(d, "name", path, "tpe", one_of(SAMPLERS)), options={} if d.get("options") is None else d["options"])
    if not isinstance(s.options, dict):
        p.err(f"{path}.options", f"must be a mapping of {s.name} sampler arguments, got {s.options!r}")
        s.options = {}
    elif s.name in SAMPLERS:
        # The options go straight to the Optuna sampler's constructor; check names against it.
        params = inspect.signature(sampler_class(s.name).__init__).parameters
        reserved = {"self", "seed", "search_space", "constraints_func"}
        allowed = sorted(set(params) - reserved)
        n_errors = len(p.errors)
        for k, v in s.options.items():
            if k not in allowed:
                why = "is set from study.seed" if k == "seed" else f"not an argument of the {s.name} sampler; allowed: {', '.join(allowed)}"
                p.err(f"{path}.options.{k}", why)
            else:
                why = _option_type_error(v, params[k].default)
                if why:
                    p.err(f"{path}.options.{k}", f"{why}, got {v!r}")
        if len(p.errors) == n_errors and s.name != "grid":  # grid's search space comes from the model
            # Optuna reads most option values only at the first ask(), deep inside a study: build
            # the sampler now so that its own checks (population_size >= 2, ...) are user errors.
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sampler_class(s.name)(**s.options)
            except (TypeError, ValueError) as exc:
                p.err(f"{path}.options", f"the {s.name} sampler refuses them: {exc}")
    return s


def _option_type_error(value: Any, default: Any) -> str | None:
    """The type a sampler option must have, read from its default (None: no default to go by)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else f"must be true or false (like the default {default})"
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"must be an integer (like the default {default})"
    if isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"must be a number (like the default {default})"
    return None


def _study(p: _Parser, d: Any) -> StudySettings:
    path = "study"
    d = p.mapping(d, path, {"trials", "seed", "name", "storage"})
    st = StudySettings(
        trials=p.scalar(d, "trials", path, 20, int_at_least(1)),
        seed=p.scalar(d, "seed", path, 0, lambda v: None if _is_int(v) and 0 <= v < 2**32
                      else "must be an integer in 0..4294967295"),  # numpy's seed range (the samplers')
        name=p.scalar(d, "name", path, None, name_error, nullable=True),
        storage=p.scalar(d, "storage", path, None, lambda v: None if isinstance(v, str) else "must be a storage URL string", nullable=True),
    )
    return st


def _check_combinations(p: _Parser, space: Space) -> None:
    """Checks that need the whole space: the vocabulary fits the tasks; grid needs finite domains;
    every block field value builds."""
    from .sampling import block_field_errors, finite, task_vocab_size

    if space.model.vocab_size is not None and space.model.vocab_size < task_vocab_size(space):
        # every trial would fail on it (the trial refuses a spec smaller than its task's vocabulary)
        p.err("model.vocab_size", f"must be >= the tasks' vocabulary ({task_vocab_size(space)}), "
              f"got {space.model.vocab_size}")
    if space.sampler.name == "grid" and not finite(space):
        p.err("sampler.name", "grid needs every searched setting to be finite (lists or ranges with a step), "
              "got a continuous range")
    p.errors.extend(block_field_errors(space))
