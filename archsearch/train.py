"""Train one candidate through a DeepSpeed engine: one code path for CPU (fp32, gloo) and GPU (bf16).

AdamW (a torch optimizer handed to ``deepspeed.initialize``), linear warm-up then cosine decay,
DeepSpeed's ``gradient_clipping``, a budget in tokens and a wall-clock limit, periodic and final
evaluation. The global batch is fixed by ``TrainConfig.batch_size`` whatever the world size:
``micro_batch x gradient_accumulation_steps x world_size = batch_size``::

    result = train(lambda: HybridLM(spec), task, TrainConfig(tokens=200_000), seed=0,
                   dist=setup_distributed("cpu"), out_dir="runs/t0")
    result.status        # "ok" | "diverged" | "oom" | "interrupted"
    result.model         # the trained module (full weights) on rank 0, for measurement

Failure modes end training without an exception: a NaN/inf loss (checked on every rank and
agreed through one all-reduce per step) -> ``diverged``; CUDA (or CPU allocator) out-of-memory
-> ``oom`` (with several ranks, the rank that ran out of memory exits at once with ``EXIT_OOM``
instead: its peers wait in a collective it will not join, and the launcher ends them);
Ctrl-C/SIGTERM -> ``interrupted``. Reaching ``max_seconds`` stops training early with
a note, runs the final evaluation, and keeps status ``ok``.

Rank 0 logs a JSONL curve (``curve.jsonl``) and TensorBoard events (``tensorboard/``): loss,
learning rate, gradient norm, tokens/s, evaluation metrics, and the spec as text.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from archsearch.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16")
FINAL_LOSS_WINDOW = 10  # final_loss = mean training loss over the last this many steps
ADAM_BETAS = (0.9, 0.95)  # the usual language-model setting (GPT-3, Llama)


@dataclasses.dataclass
class TrainConfig:
    """Training budget and optimiser settings of one trial.

    tokens: input tokens to train on (global, all ranks); steps = ceil(tokens / (batch_size * seq_len)).
    max_seconds: wall-clock limit of the training loop (periodic evaluations included).
    batch_size: global batch in sequences, the same for any world size.
    lr, warmup_frac, min_lr_frac: peak AdamW learning rate, linear warm-up over that fraction of
        steps, then cosine decay to ``min_lr_frac * lr``.
    weight_decay: AdamW decay of matrices (norm weights and other 1-D parameters are not decayed).
    grad_clip: global gradient-norm clip (DeepSpeed ``gradient_clipping``; 0 = off).
    eval_every: evaluate every this many steps (0 = only at the end).
    precision: "auto" (bf16 on a GPU with native bf16, compute capability 8.0 on, unless the DeepSpeed
        config says otherwise; fp32 on older GPUs and on CPU), "fp32", "bf16".
    micro_batch_size: per-rank micro batch (0 = derive from the DeepSpeed config's
        gradient_accumulation_steps, default 1).
    eval_batch_size: batch size of the evaluation passes.
    log_every: write a curve row / TensorBoard point every this many steps.
    """

    tokens: int = 200_000
    max_seconds: float = 600.0
    batch_size: int = 32
    lr: float = 3e-3
    warmup_frac: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 0
    precision: str = "auto"
    micro_batch_size: int = 0
    min_lr_frac: float = 0.1
    eval_batch_size: int = 64
    log_every: int = 1

    def __post_init__(self) -> None:
        check_int(self.tokens, "train.tokens", 1)
        check_int(self.batch_size, "train.batch_size", 1)
        check_int(self.eval_every, "train.eval_every", 0)
        check_int(self.micro_batch_size, "train.micro_batch_size", 0)
        check_int(self.eval_batch_size, "train.eval_batch_size", 1)
        check_int(self.log_every, "train.log_every", 1)
        check_number(self.max_seconds, "train.max_seconds", lo=0.0, lo_open=True)
        check_number(self.lr, "train.lr", lo=0.0, lo_open=True)
        check_number(self.warmup_frac, "train.warmup_frac", lo=0.0, hi=1.0)
        check_number(self.min_lr_frac, "train.min_lr_frac", lo=0.0, hi=1.0)
        check_number(self.weight_decay, "train.weight_decay", lo=0.0)
        check_number(self.grad_clip, "train.grad_clip", lo=0.0)
        if self.precision not in PRECISIONS:
            raise UserError(f"train.precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TrainConfig":
        return config_from_dict(cls, d, "train")


def config_from_dict(cls: type, d: Mapping[str, Any] | None, prefix: str) -> Any:
    """``cls(**d)`` for a config dataclass (None: the defaults), with one-line errors naming
    ``prefix.<key>`` for a non-mapping or an unknown key; the dataclass checks the values."""
    d = d or {}
    if not isinstance(d, Mapping):
        raise UserError(f"{prefix}: must be a mapping, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in d:
        if key not in known:
            raise UserError(f"{prefix}.{key}: unknown field; known fields: {', '.join(sorted(known))}")
    return cls(**dict(d))


def check_int(value: Any, field: str, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise UserError(f"{field}: must be an integer >= {lo}, got {value!r}")


def check_number(value: Any, field: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        bound = []
        if lo is not None:
            bound.append(f"{'>' if lo_open else '>='} {lo:g}")
        if hi is not None:
            bound.append(f"<= {hi:g}")
        raise UserError(f"{field}: must be a number {' and '.join(bound)}, got {value!r}")


def ensure_extensions_dir() -> str:
    """Give DeepSpeed's JIT-compiled ops a cache that later trials find intact; returns its path.

    DeepSpeed JIT-compiles C++ ops on first use (its CPU shared-memory comm op took 70-110 s on
    two busy cores; ``setup_distributed`` now skips that one, but a user's ds_config may still
    ask for others, e.g. CPU Adam for offload); later processes load them from
    ``TORCH_EXTENSIONS_DIR`` in well under a second. Two things made that cache rebuild again and
    again when it was torch's shared default (~/.cache/torch_extensions), so both are pinned:

    * ninja: a venv ships its own (pip ``ninja`` 1.13) next to a system one (1.11); which one a
      process finds depends on its PATH, and the two hash commands differently in ``.ninja_log``,
      so each sees the other's build as stale. The interpreter's own bin directory goes first.
    * the directory: unless the user set one, an archsearch-owned directory keyed by the Python
      environment, so tools with other flags or interpreters never rebuild it under us.
    """
    bindir = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if os.path.exists(os.path.join(bindir, "ninja")) and path.split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + (os.pathsep + path if path else "")
    if not os.environ.get("TORCH_EXTENSIONS_DIR"):
        import hashlib

        import torch
        from torch import _appdirs

        acc = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
        env = hashlib.sha1(f"{sys.prefix}|{torch.__version__}".encode()).hexdigest()[:8]
        name = f"py{sys.version_info.major}{sys.version_info.minor}_{acc}_{env}"
        os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(_appdirs.user_cache_dir("archsearch"), "torch_extensions", name)
    return os.environ["TORCH_EXTENSIONS_DIR"]


# --- process group ---------------------------------------------------------------------------------
@dataclasses.dataclass
class DistInfo:
    """Where this process sits: rank, world size, local rank, its device and the backend used."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; UserError for "cuda" without one."""
    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"device: must be auto, cpu or cuda, got {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("device: cuda requested but no CUDA GPU is visible (torch.cuda.is_available() is False)")
    return device


def setup_distributed(device: str) -> DistInfo:
    """Join (or create) the process group through ``deepspeed.init_distributed``.

    Needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the environment (the DeepSpeed
    launcher sets them; ``archsearch.trial`` sets them for a lone process). gloo on CPU, nccl on CUDA.
    """
    kind = resolve_device(device)
    # DeepSpeed picks its accelerator once, at import; a CPU trial on a GPU host must say so first.
    if kind == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    ensure_extensions_dir()
    import deepspeed
    import deepspeed.ops
    from deepspeed.utils import logger as ds_logger

    if not os.environ.get("ARCHSEARCH_DS_SHM_OP"):
        # DeepSpeed's comm backend JIT-compiles a shared-memory all-reduce op on creation (70-110 s
        # on first use; a compile killed midway leaves a torch_extensions lock that hangs every later
        # process). Only tensor-parallel inference (inference_all_reduce) uses it, never training;
        # marked incompatible, DeepSpeed falls back to torch.distributed as on platforms without it.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    if not os.environ.get("ARCHSEARCH_DS_VERBOSE"):
        ds_logger.setLevel("WARNING")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        dev = torch.device("cpu")
        backend = "gloo"
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
    return DistInfo(
        rank=torch.distributed.get_rank(),
        world_size=torch.distributed.get_world_size(),
        local_rank=local_rank,
        device=dev,
        backend=torch.distributed.get_backend(),
    )


# --- DeepSpeed config ------------------------------------------------------------------------------
def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``over`` wins, nested dicts are merged key by key."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively: a CUDA GPU of compute capability 8.0 or later (A100,
    RTX 30xx, H100 on) or a ROCm GPU. ``torch.cuda.is_bf16_supported()`` says yes on a V100 or T4 too,
    which emulate bf16 (slower than their float32, and our kernels' bf16 tiles spill there)."""
    if device.type != "cuda":
        return False
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


def resolve_precision(cfg: TrainConfig, device: torch.device, ds_config: Mapping[str, Any] | None) -> str:
    """"fp32" or "bf16": an explicit ``train.precision`` wins, then the DeepSpeed config's bf16 flag,
    then bf16 on a GPU with native bf16 (``native_bf16``) and fp32 elsewhere (older GPUs, CPU). The
    default configs of GPU slots leave the flag out (``launch.dsconfig.default_ds_config``), so this
    device decides."""
    bf16 = (ds_config or {}).get("bf16", {})
    if cfg.precision != "auto":
        chosen = cfg.precision
    elif isinstance(bf16, Mapping) and "enabled" in bf16:
        chosen = "bf16" if bf16["enabled"] else "fp32"
    else:
        return "bf16" if native_bf16(device) else "fp32"
    if chosen == "bf16" and device.type == "cuda" and not native_bf16(device):
        major, minor = torch.cuda.get_device_capability(device)
        warnings.warn(f"train.precision: bf16 asked for on a GPU of compute capability {major}.{minor}, which "
                      f"emulates it (slower than float32 there); precision auto picks fp32 on it", stacklevel=2)
    return chosen


def build_ds_config(cfg: TrainConfig, world_size: int, precision: str,
                    user: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Our defaults with ``user`` (launch/'s ZeRO config) merged over them, batch sizes made consistent.

    Raises UserError when the global batch cannot be split as micro x accumulation x world size,
    or the user config sets what the trial owns (optimizer, scheduler, fp16, another global batch).
    """
    user = dict(user or {})
    for key, why in (("optimizer", "the trial passes AdamW (train.lr, train.weight_decay)"),
                     ("scheduler", "the trial schedules warm-up + cosine (train.warmup_frac)")):
        if key in user:
            raise UserError(f"ds_config.{key}: not allowed; {why}")
    if isinstance(user.get("fp16"), Mapping) and user["fp16"].get("enabled"):
        raise UserError("ds_config.fp16: not supported; use train.precision bf16")
    if "train_batch_size" in user and user["train_batch_size"] != cfg.batch_size:
        raise UserError(f"ds_config.train_batch_size: {user['train_batch_size']} conflicts with "
                        f"train.batch_size {cfg.batch_size} (the global batch is train.batch_size)")
    B = cfg.batch_size
    if user.get("train_micro_batch_size_per_gpu") is not None:  # 0 = unset, as in train.micro_batch_size
        check_int(user["train_micro_batch_size_per_gpu"], "ds_config.train_micro_batch_size_per_gpu", 0)
    micro = user.get("train_micro_batch_size_per_gpu") or cfg.micro_batch_size
    if not micro:
        accum = user.get("gradient_accumulation_steps", 1)
        check_int(accum, "ds_config.gradient_accumulation_steps", 1)
        if B % (world_size * accum):
            raise UserError(f"train.batch_size: {B} must be a multiple of world size x gradient_accumulation_steps "
                            f"= {world_size} x {accum}")
        micro = B // (world_size * accum)
    if B % (micro * world_size):
        raise UserError(f"train.batch_size: {B} must be a multiple of micro batch x world size = {micro} x {world_size}")
    accum = B // (micro * world_size)
    user.pop("gradient_accumulation_steps", None)
    base = {
        "train_batch_size": B,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": {"stage": 0},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    merged = _merge(base, user)
    merged["train_micro_batch_size_per_gpu"] = micro
    merged["gradient_accumulation_steps"] = accum
    merged["bf16"] = _merge(merged.get("bf16", {}) if isinstance(merged.get("bf16"), Mapping) else {},
                            {"enabled": precision == "bf16"})
    return merged


# --- pieces of the loop ----------------------------------------------------------------------------
def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over positions with ``targets != -100``; ``logits [B, T, V]``, ``targets [B, T]``.

    Computed as sum / max(count, 1) in float32 so a micro batch without scored positions gives 0,
    not the NaN of an empty mean (which would read as divergence).
    """
    flat = logits.reshape(-1, logits.shape[-1]).float()
    tgt = targets.reshape(-1)
    total = F.cross_entropy(flat, tgt, ignore_index=-100, reduction="sum")
    return total / (tgt != -100).sum().clamp(min=1)


def lr_lambda(total_steps: int, warmup_frac: float, min_lr_frac: float) -> Callable[[int], float]:
    """Multiplier of the peak lr after ``step`` optimiser steps: linear warm-up, cosine to ``min_lr_frac``.

    Written here rather than DeepSpeed's WarmupCosineLR, which gives lr 0 to the first step and
    warns at construction; this one starts warm-up at 1/warmup of the peak.
    """
    warmup = int(round(warmup_frac * total_steps))

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return min_lr_frac + (1 - min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return f


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices (dim >= 2); leave norms, biases, gates' scalars (dim < 2) undecayed."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def is_oom(exc: BaseException) -> bool:
    """CUDA out-of-memory, or the CPU allocator failing to allocate."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")[:300]


def _finite(x: Any) -> Any:
    """``x`` with NaN/inf floats as None (strict JSON; a diverged step logs loss null)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {k: _finite(v) for k, v in x.items()}
    return x


class CurveLog:
    """Rank 0's training curve: a JSONL file (one row per logged step or evaluation) and TensorBoard."""

    def __init__(self, out_dir: str | os.PathLike | None, enabled: bool, spec_text: str = "") -> None:
        self.enabled = enabled and out_dir is not None
        self.path = Path(out_dir) / "curve.jsonl" if out_dir is not None else None
        self.tb_dir = Path(out_dir) / "tensorboard" if out_dir is not None else None
        self._f = None
        self._tb = None
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(log_dir=str(self.tb_dir))
        if spec_text:
            # Indented as Markdown code so TensorBoard's text tab shows the JSON as written.
            self._tb.add_text("spec", "    " + spec_text.replace("\n", "\n    "), 0)

    def row(self, step: int, tokens: int, seconds: float, **values: Any) -> None:
        if not self.enabled:
            return
        row = {"step": step, "tokens": tokens, "seconds": round(seconds, 4), **_finite(values)}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        for name, v in values.items():
            if isinstance(v, Mapping):
                for k, x in v.items():
                    if isinstance(x, (int, float)):
                        self._tb.add_scalar(f"{name}/{k}", x, step)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                self._tb.add_scalar(f"train/{name}", v, step)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None


@dataclasses.dataclass
class TrainResult:
    """What training produced; ``model`` (rank 0 only) holds full trained weights for measurement."""

    status: str = "ok"
    reason: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    steps: int = 0
    planned_steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    final_loss: float | None = None
    curve_path: str | None = None
    tensorboard_dir: str | None = None
    world_size: int = 1
    global_batch: int = 0
    micro_batch: int = 0
    grad_accum: int = 1
    precision: str = "fp32"
    zero_stage: int = 0
    eval_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    model: Any = None

    def section(self) -> dict[str, Any]:
        """The record's ``train`` section."""
        return {
            "tokens": self.tokens, "steps": self.steps, "planned_steps": self.planned_steps,
            "seconds": round(self.seconds, 4), "final_loss": self.final_loss,
            "curve_path": self.curve_path, "tensorboard_dir": self.tensorboard_dir,
            "world_size": self.world_size, "global_batch": self.global_batch,
            "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "precision": self.precision, "zero_stage": self.zero_stage,
        }


def _all_reduce_sum(values: list[float], dist: DistInfo) -> list[float]:
    """Sum a few floats over ranks (one collective); identity for a lone process."""
    if dist.world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=dist.device if dist.backend == "nccl" else "cpu")
    torch.distributed.all_reduce(t)
    return t.tolist()


def _barrier(dist: DistInfo) -> None:
    if dist.world_size > 1:
        torch.distributed.barrier()


def _evaluate(engine: Any, task: Any, cfg: TrainConfig, dist: DistInfo, zero_stage: int) -> dict[str, float]:
    """Task metrics of the current weights. Rank 0 evaluates; under ZeRO-3 every rank runs the same
    passes inside a gather (the parameters are sharded), and rank 0 keeps the result."""
    metrics: dict[str, float] = {}
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
            metrics = task.evaluate(engine.module, dist.device, batch_size=cfg.eval_batch_size)
    elif dist.is_main:
        metrics = task.evaluate(engine.module, dist.device, batch_size=cfg.eval_batch_size)
    _barrier(dist)
    return {k: float(v) for k, v in metrics.items()} if dist.is_main else {}


def _full_model(engine: Any, build_model: Callable[[], torch.nn.Module], dist: DistInfo,
                zero_stage: int) -> torch.nn.Module | None:
    """Rank 0's model with full weights (ZeRO-3: gathered from every rank into a fresh copy)."""
    if zero_stage != 3:
        return engine.module if dist.is_main else None
    state = engine._zero3_consolidated_16bit_state_dict()  # collective; full dict on rank 0 only
    if not dist.is_main:
        return None
    model = build_model().to(device=dist.device, dtype=next(iter(state.values())).dtype)
    model.load_state_dict(state, strict=False)
    return model


def _grad_norm(model: torch.nn.Module) -> float | None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    return float(torch.nn.utils.get_total_norm(grads))


def _engine(build_model: Callable[[], torch.nn.Module], cfg: TrainConfig, ds_cfg: dict[str, Any], seed: int,
            total_steps: int, device: torch.device, timings: dict[str, float]) -> Any:
    """Seeded model, AdamW (a torch optimizer: no fused-Adam compile), warm-up/cosine schedule,
    wrapped by ``deepspeed.initialize``."""
    import deepspeed

    t = time.perf_counter()
    torch.manual_seed(seed)
    model = build_model().to(device)
    timings["build_model"] = time.perf_counter() - t
    t = time.perf_counter()
    # The first torch optimizer of a process imports torch._dynamo (torch marks optimizer methods
    # as not traceable): about 1.5 s on an idle core, the largest fixed cost after `import torch`.
    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=ADAM_BETAS)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(total_steps, cfg.warmup_frac, cfg.min_lr_frac))
    timings["optimizer"] = time.perf_counter() - t
    t = time.perf_counter()
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_cfg, dist_init_required=False)
    timings["deepspeed_initialize"] = time.perf_counter() - t
    return engine


def _step(engine: Any, batches: Any, accum: int, device: torch.device) -> tuple[float, float, float | None]:
    """One optimiser step over ``accum`` micro batches on this rank.

    Returns (mean micro-batch loss, count of non-finite losses and gradient norms, pre-clip
    global gradient norm or None). A non-finite loss still runs backward and step, so every
    rank enters the same collectives; the caller stops after the step.
    """
    loss_sum, nonfinite, manual_norm = 0.0, 0.0, None
    for _ in range(accum):
        x, y = next(batches)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits, _ = engine(x)  # [B, T, V]
        loss = lm_loss(logits, y)
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():
            manual_norm = _grad_norm(engine.module)  # None when ZeRO holds the gradients
        engine.step()
        value = float(loss.detach())
        loss_sum += value
        nonfinite += 0.0 if math.isfinite(value) else 1.0
    # DeepSpeed keeps the norm under ZeRO and bf16; plain fp32 engines clip without storing it.
    norm = engine.get_global_grad_norm()
    norm = float(norm) if norm is not None else manual_norm
    if norm is not None and not math.isfinite(norm):
        nonfinite += 1.0
    return loss_sum / accum, nonfinite, norm


def train(
    build_model: Callable[[], torch.nn.Module],
    task: Any,
    cfg: TrainConfig,
    *,
    seed: int,
    dist: DistInfo,
    out_dir: str | os.PathLike | None,
    ds_config: Mapping[str, Any] | None = None,
    spec_text: str = "",
) -> TrainResult:
    """Train ``build_model()`` on ``task`` under ``cfg``; see the module docstring.

    Every rank calls this with the same arguments. ``build_model`` is called once per rank after
    seeding (same initial weights everywhere) and again on rank 0 under ZeRO-3 to hold the
    gathered weights. ``out_dir`` receives ``curve.jsonl`` and ``tensorboard/`` (rank 0).
    Raises UserError for a config that cannot run (batch split, ds_config keys); other
    exceptions than out-of-memory and interruption are bugs and propagate.
    """
    timings: dict[str, float] = {}
    precision = resolve_precision(cfg, dist.device, ds_config)
    ds_cfg = build_ds_config(cfg, dist.world_size, precision, ds_config)
    zero_stage = int(ds_cfg.get("zero_optimization", {}).get("stage", 0))
    res = TrainResult(world_size=dist.world_size, global_batch=cfg.batch_size,
                      micro_batch=ds_cfg["train_micro_batch_size_per_gpu"],
                      grad_accum=ds_cfg["gradient_accumulation_steps"], precision=precision,
                      zero_stage=zero_stage, timings=timings)
    tokens_per_step = cfg.batch_size * task.seq_len
    total_steps = res.planned_steps = max(1, math.ceil(cfg.tokens / tokens_per_step))

    t = time.perf_counter()
    log = CurveLog(out_dir, dist.is_main, spec_text)
    timings["curve_log_setup"] = time.perf_counter() - t
    if log.enabled:
        res.curve_path, res.tensorboard_dir = str(log.path), str(log.tb_dir)
    engine = None
    losses: list[float] = []
    t_start = time.perf_counter()
    try:
        engine = _engine(build_model, cfg, ds_cfg, seed, total_steps, dist.device, timings)
        t = time.perf_counter()
        batches = task.train_batches(res.micro_batch, seed, dist.rank, dist.world_size)
        timings["task_data"] = time.perf_counter() - t
        engine.train()
        t_start = t_log = time.perf_counter()
        tokens_log = 0
        for step in range(1, total_steps + 1):
            lr = engine.get_lr()[0]  # the rate this step's update uses (the scheduler advances in step())
            loss, nonfinite, norm = _step(engine, batches, res.grad_accum, dist.device)
            elapsed = time.perf_counter() - t_start
            if step == 1:
                timings["first_step"] = elapsed
            over_time = 1.0 if dist.is_main and elapsed > cfg.max_seconds else 0.0
            # One collective per step: mean loss, any rank non-finite, rank 0's clock decision.
            loss_sum, nonfinite, over_time = _all_reduce_sum([loss, nonfinite, over_time], dist)
            mean_loss = loss_sum / dist.world_size
            res.steps, res.tokens = step, step * tokens_per_step
            res.seconds = time.perf_counter() - t_start
            if nonfinite:
                res.status = "diverged"
                res.reason = f"non-finite loss or gradient norm at step {step} (loss {mean_loss}, lr {lr:.3g})"
                log.row(step, res.tokens, res.seconds, loss=mean_loss, diverged=True)
                break
            losses.append(mean_loss)
            if step % cfg.log_every == 0 or step == total_steps or over_time:
                now = time.perf_counter()
                tps = (res.tokens - tokens_log) / max(now - t_log, 1e-9)
                t_log, tokens_log = now, res.tokens
                log.row(step, res.tokens, res.seconds, loss=mean_loss, lr=lr, grad_norm=norm, tokens_per_s=tps)
            if over_time:
                res.notes.append(f"max_seconds {cfg.max_seconds:g} reached: trained {step} of {total_steps} steps "
                                 f"({res.tokens} of {total_steps * tokens_per_step} tokens)")
                break
            if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
                metrics = _evaluate(engine, task, cfg, dist, zero_stage)
                log.row(step, res.tokens, time.perf_counter() - t_start, eval=metrics)
        timings["train_loop"] = time.perf_counter() - t_start
        if losses:
            res.final_loss = sum(losses[-FINAL_LOSS_WINDOW:]) / len(losses[-FINAL_LOSS_WINDOW:])
        if res.status == "ok":
            t = time.perf_counter()
            metrics = _evaluate(engine, task, cfg, dist, zero_stage)
            timings["final_eval"] = time.perf_counter() - t
            log.row(res.steps, res.tokens, time.perf_counter() - t_start, eval=metrics, final=True)
            bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))  # rank 0 has the metrics
            if _all_reduce_sum([float(bool(bad))], dist)[0]:  # agreed: _full_model may be collective
                # finite training loss, non-finite held-out score: the weights are not usable
                res.status = "diverged"
                res.reason = f"non-finite evaluation metric {bad[0]} ({metrics[bad[0]]})" if bad else "non-finite evaluation metric"
                res.eval_metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}
            else:
                res.eval_metrics = metrics
                res.model = _full_model(engine, build_model, dist, zero_stage)
                if res.model is not None:
                    res.model.zero_grad(set_to_none=True)
    except KeyboardInterrupt:
        res.status, res.reason = "interrupted", f"interrupted after {res.steps} steps"
    except Exception as exc:
        if not is_oom(exc):
            raise
        res.status, res.reason = "oom", first_line(exc)
        res.model = None
    finally:
        timings.setdefault("train_loop", time.perf_counter() - t_start)
        t = time.perf_counter()
        log.close()
        # The engine holds optimizer state (fp32 masters under bf16); free it before measurement.
        # A full collection costs ~0.5 s of a tiny CPU trial, so only where the memory matters.
        del engine
        if dist.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
        timings["teardown"] = time.perf_counter() - t
    if res.status == "oom" and dist.world_size > 1:
        _leave_group_out_of_memory(dist, res.reason)
    return res


EXIT_OOM = 3  # a rank's exit status after running out of memory in a group of several ranks
# What that rank prints last; launch.faults recognises it in the trial log (whatever the error's text)
OOM_EXIT_LINE = "archsearch.train: rank {rank}/{world_size} out of memory, leaving the process group"


def _leave_group_out_of_memory(dist: DistInfo, reason: str) -> None:
    """End this rank's process after an out-of-memory error in a group of several ranks.

    Its peers are, or soon will be, blocked in a collective this rank will not join (a gradient
    all-reduce), so carrying on would hold the whole slot until the trial timeout. The line on
    stderr names the OOM, which ``launch.faults`` reads from the log to record the candidate
    infeasible; the non-zero exit makes the DeepSpeed launcher end the peers within a second.
    """
    print(f"{OOM_EXIT_LINE.format(rank=dist.rank, world_size=dist.world_size)}: {reason}",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_OOM)
