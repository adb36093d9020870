"""The search-space schema: dataclasses that are both the Python API and the parsed YAML.

A space is plain data. Build one in code::

    from search_spaces import Space, Task, Model, PerLayer, Objective, Budget, IntRange
    space = Space(
        name="mine",
        task=Task("mqar", {"num_kv_pairs": 8}),
        model=Model(depth=IntRange(2, 4), d_model=64, stack=PerLayer(["linear_attn", "softmax"])),
        objectives=[Objective("quality", metric="accuracy"), Objective("decode_memory", context=2048)],
        budget=Budget(tokens=200_000),
    )
    space.validate()        # UserError listing every problem, one per line

or load the same thing from YAML with ``search_spaces.load(path_or_name)``. ``Space.from_dict`` and
``Space.to_dict`` convert between the two; validation always runs on the dict form, so YAML and
Python spaces get identical checks and messages (``model.pattern.every: must be >= 1, got 0``).
Every field, its type and default is listed in README.md ("Writing a space"); keep them in sync.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .domains import Choice, Domain, Fixed, FloatRange, IntRange, as_domain, to_yaml

SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid")
PLACEMENTS = ("first", "middle", "last", "even")
OBJECTIVE_KINDS = ("quality", "decode_memory", "decode_throughput", "prefill_throughput", "params")
DIRECTIONS = ("minimize", "maximize")
DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass
class Task:
    """The training task every trial runs (``archsearch.tasks.build(name, **params)``)."""

    name: str
    params: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PerLayer:
    """Each layer picks its block from ``blocks`` (one categorical per layer)."""

    blocks: list[str]


@dataclasses.dataclass
class Pattern:
    """Stacks of one linear ``mixer`` with ``softmax`` layers placed by rule.

    Exactly one of ``every`` (softmax at layers k, 2k, ... counted from 1) or ``share`` (a
    fraction of the depth, rounded, placed by ``placement``: first, middle, last or even).
    """

    mixer: Any = "gated_deltanet"
    softmax: str = "softmax"
    every: Any = None
    share: Any = None
    placement: Any = None  # with share: default "even"


@dataclasses.dataclass
class Model:
    """Architecture dimensions. Searchable fields take a value, a list or a range (see domains)."""

    depth: Any = 4
    d_model: Any = 64
    num_heads: Any = 4
    head_dim_k: Any = None        # None: the block's default (d_model / num_heads)
    head_dim_v: Any = None
    state_expansion: Any = None   # linear blocks: head_dim_v = expansion * d_model / num_heads
    feature_map: Any = None       # blocks with a feature_map field (linear_attn)
    short_conv: Any = None        # True/False sets conv_size on blocks that have it; None: default
    conv_size: int = 4
    mlp_expansion: Any = 2.0      # 0: no MLP
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    vocab_size: int | None = None  # None: the task's vocabulary
    stack: PerLayer | Pattern = dataclasses.field(
        default_factory=lambda: PerLayer(["gated_deltanet", "softmax"])
    )
    blocks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class DecodeMemoryLimit:
    bytes: int
    context: int
    batch: int = 1
    dtype: str = "bfloat16"


@dataclasses.dataclass
class Constraints:
    """Checked from the spec alone, before any training; violators are recorded infeasible."""

    max_params: int | None = None
    max_decode_memory: DecodeMemoryLimit | None = None
    min_softmax_share: float | None = None
    max_softmax_share: float | None = None


@dataclasses.dataclass
class Objective:
    """One objective. ``kind`` is quality, decode_memory, decode_throughput, prefill_throughput or params.

    quality: ``metric`` of ``task`` (default: the space's task) after training; a different task
    (with ``task_params``) trains the candidate a second time on that task.
    decode_memory: exact decode-state bytes (KV cache + recurrent state) at ``context``/``batch``/``dtype``.
    decode_throughput: tokens/s of one decode step at ``context``/``batch``; ``compile`` (GPU only)
    runs each linear layer through ``torch.compile`` inside the captured decode graph.
    prefill_throughput: tokens/s of a prefill of ``length`` tokens at ``batch``.
    params: trainable parameters.
    """

    kind: str
    direction: str | None = None  # None: the natural one (metric's own, minimize memory/params, maximize throughput)
    metric: str | None = None
    task: str | None = None
    task_params: dict[str, Any] | None = None
    context: int | None = None
    length: int | None = None
    batch: int = 1
    dtype: str = "bfloat16"
    compile: bool = False


@dataclasses.dataclass
class Budget:
    """Per-trial training budget and settings (passed to ``archsearch.trial.TrainConfig``)."""

    tokens: int = 1_000_000
    max_seconds: float = 600.0
    batch_size: int = 32
    lr: float = 3e-3
    warmup_frac: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 0
    precision: str = "auto"
    device: str = "auto"
    seed: int = 0
    measure_repeats: int = 5


@dataclasses.dataclass
class Sampler:
    name: str = "tpe"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StudySettings:
    trials: int = 20
    seed: int = 0
    name: str | None = None     # None: the space name
    storage: str | None = None  # None: journal file ./studies/NAME/journal.log


@dataclasses.dataclass
class Space:
    name: str
    task: Task
    model: Model
    objectives: list[Objective]
    budget: Budget = dataclasses.field(default_factory=Budget)
    constraints: Constraints = dataclasses.field(default_factory=Constraints)
    sampler: Sampler = dataclasses.field(default_factory=Sampler)
    study: StudySettings = dataclasses.field(default_factory=StudySettings)
    description: str = ""

    # ---- conversions -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The YAML form (domains as values/lists/ranges); ``from_dict(to_dict())`` round-trips."""
        return _to_plain(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Space":
        """Parse and validate; raises ``UserError`` listing every problem, one per line."""
        from .validate import parse_space

        return parse_space(d)

    def validate(self) -> "Space":
        """Validate a space built in code; returns the normalised space (domains parsed)."""
        return Space.from_dict(self.to_dict())

    @property
    def study_name(self) -> str:
        return self.study.name or self.name


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, (Fixed, Choice, IntRange, FloatRange)):
        return to_yaml(obj)
    if isinstance(obj, PerLayer):
        return {"per_layer": {"blocks": list(obj.blocks)}}
    if isinstance(obj, Pattern):
        d = {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
             if getattr(obj, f.name) is not None}
        return {"pattern": d}
    if isinstance(obj, Objective):
        d = {"name": obj.kind}
        for f in dataclasses.fields(obj)[1:]:
            v = getattr(obj, f.name)
            if v is not None and v != f.default:
                d[f.name] = _to_plain(v)
        return d
    if isinstance(obj, Model):
        d = {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "stack"}
        d.update(_to_plain(obj.stack))  # YAML writes model.per_layer / model.pattern directly
        return d
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def domain(value: Any) -> Domain:
    """A field value as a domain (the validator has already parsed them; this is for raw API use)."""
    return as_domain(value)
