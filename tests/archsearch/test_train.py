"""archsearch.train: DeepSpeed training on CPU (gloo, fp32) of tiny models on an easy MQAR.

One process group (world size 1) serves the module; every run is a few seconds on one core.
"""
from __future__ import annotations

import json
import math

import pytest
import torch

from archsearch import tasks
from archsearch.errors import UserError
from archsearch.model import HybridLM
from archsearch.spec import ArchSpec
from archsearch.train import (
    TrainConfig,
    build_ds_config,
    lm_loss,
    lr_lambda,
    param_groups,
    resolve_precision,
    setup_distributed,
    train,
)
from archsearch.trial import lone_process_env

# Easy MQAR: 2 key-value pairs over 16 tokens, 16 possible values -> chance accuracy 1/16.
TASK = dict(vocab_size=32, seq_len=16, num_kv_pairs=2, num_train_examples=4096, num_test_examples=256)
CHANCE = 1 / 16
SPEC = ArchSpec.from_dict({
    "vocab_size": 32, "d_model": 32,
    "layers": [{"block": "linear_attn", "config": {"num_heads": 2}},
               {"block": "softmax", "config": {"num_heads": 2}}],
})


@pytest.fixture(scope="module")
def dist():
    with lone_process_env():  # LOCAL_RANK etc. must stay set while deepspeed.initialize runs
        yield setup_distributed("cpu")


@pytest.fixture(scope="module")
def task():
    return tasks.build("mqar", **TASK)


def _train(dist, task, out_dir=None, **cfg):
    cfg.setdefault("batch_size", 32)
    cfg.setdefault("max_seconds", 120)
    return train(lambda: HybridLM(SPEC), task, TrainConfig(**cfg), seed=0, dist=dist, out_dir=out_dir,
                 spec_text=SPEC.to_json(indent=2))


def test_tiny_training_lowers_loss_and_beats_chance(dist, task, tmp_path):
    res = _train(dist, task, tmp_path, tokens=40 * 32 * 16, lr=1e-2, eval_every=20)
    assert res.status == "ok" and res.reason == ""
    assert res.steps == res.planned_steps == 40
    assert res.tokens == 40 * 32 * 16
    rows = [json.loads(line) for line in open(res.curve_path)]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 40
    first = sum(losses[:5]) / 5
    assert res.final_loss < first - 0.5, (first, res.final_loss)
    assert abs(first - math.log(32)) < 0.5  # starts near uniform over the vocabulary
    assert res.eval_metrics["accuracy"] > 3 * CHANCE, res.eval_metrics
    assert [r["step"] for r in rows if "eval" in r] == [20, 40]  # periodic + final
    assert res.model is not None
    # lr: linear warm-up over 10% of the steps to the peak, cosine down to min_lr_frac * peak
    lrs = [r["lr"] for r in rows if "lr" in r]
    assert lrs[0] == pytest.approx(1e-2 / 4) and max(lrs) == pytest.approx(1e-2)
    assert lrs[-1] == pytest.approx(1e-3, rel=0.05)
    assert all(r["grad_norm"] > 0 for r in rows if "grad_norm" in r)


def test_tensorboard_has_the_curves_and_the_spec(dist, task, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    res = _train(dist, task, tmp_path, tokens=4 * 32 * 16, lr=1e-2, eval_every=2)
    acc = EventAccumulator(res.tensorboard_dir, size_guidance={"tensors": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/accuracy", "eval/loss"} <= scalars
    assert len(acc.Scalars("train/loss")) == 4
    text_tags = acc.Tags()["tensors"]
    assert any(t.startswith("spec") for t in text_tags)


def test_absurd_learning_rate_ends_diverged_without_exception(dist, task, tmp_path):
    res = _train(dist, task, tmp_path, tokens=200 * 32 * 16, lr=1e6, warmup_frac=0.0, grad_clip=0.0)
    assert res.status == "diverged"
    assert "non-finite" in res.reason
    assert res.steps < 200
    assert res.model is None and res.eval_metrics == {}
    last = json.loads(open(res.curve_path).read().splitlines()[-1])
    assert last["diverged"] is True


def test_wall_clock_limit_stops_training_with_evaluation(dist, task):
    res = _train(dist, task, tokens=10_000 * 32 * 16, lr=1e-3, max_seconds=0.5)
    assert res.status == "ok"
    assert 1 <= res.steps < res.planned_steps == 10_000
    assert res.notes and "max_seconds" in res.notes[0]
    assert set(res.eval_metrics) == {"accuracy", "loss"}
    assert res.model is not None


def test_global_batch_is_split_over_world_size_and_accumulation():
    cfg = TrainConfig(batch_size=32)
    for world, accum in [(1, 1), (2, 1), (4, 1), (2, 4), (8, 2)]:
        ds = build_ds_config(cfg, world, "fp32", {"gradient_accumulation_steps": accum})
        assert ds["train_batch_size"] == 32
        assert ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world == 32
        assert ds["gradient_accumulation_steps"] == accum
    ds = build_ds_config(TrainConfig(batch_size=32, micro_batch_size=4), 2, "bf16")
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (4, 4)
    assert ds["bf16"]["enabled"] is True and ds["gradient_clipping"] == 1.0
    with pytest.raises(UserError, match="train.batch_size"):
        build_ds_config(TrainConfig(batch_size=30), 4, "fp32")


def test_launch_zero_configs_merge_over_the_defaults():
    import launch.dsconfig as dsc

    zero2 = dsc.load_ds_config("zero2_bf16")
    ds = build_ds_config(TrainConfig(batch_size=16, grad_clip=0.5), 2, "bf16", zero2)
    assert ds["zero_optimization"]["stage"] == 2 and ds["zero_optimization"]["overlap_comm"] is True
    assert ds["gradient_clipping"] == 0.5 and ds["train_micro_batch_size_per_gpu"] == 8
    assert resolve_precision(TrainConfig(), torch.device("cpu"), dsc.load_ds_config("zero0_fp32")) == "fp32"
    assert resolve_precision(TrainConfig(), torch.device("cpu"), zero2) == "bf16"
    assert resolve_precision(TrainConfig(precision="fp32"), torch.device("cpu"), zero2) == "fp32"


@pytest.mark.parametrize("capability, auto", [((7, 0), "fp32"), ((7, 5), "fp32"), ((8, 0), "bf16"), ((9, 0), "bf16")])
def test_auto_precision_is_bf16_only_where_the_gpu_has_it_natively(monkeypatch, capability, auto):
    """A V100 (7.0) or T4 (7.5) emulates bf16 (``torch.cuda.is_bf16_supported()`` still says yes): auto
    picks fp32 there, with a GPU slot's default DeepSpeed config (no bf16 flag of its own); bf16 asked for
    explicitly stays bf16 there, with a warning that names the capability."""
    import warnings

    import launch.dsconfig as dsc

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    gpu = torch.device("cuda", 0)
    for num_gpus in (1, 2):
        assert "bf16" not in dsc.default_ds_config(num_gpus)
        assert resolve_precision(TrainConfig(), gpu, dsc.default_ds_config(num_gpus)) == auto
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert resolve_precision(TrainConfig(precision="bf16"), gpu, None) == "bf16"
        assert resolve_precision(TrainConfig(), gpu, dsc.load_ds_config("zero2_bf16")) == "bf16"
    expected = 2 if auto == "fp32" else 0
    assert len(seen) == expected and all(f"compute capability {capability[0]}.{capability[1]}" in str(w.message)
                                         for w in seen)
    assert resolve_precision(TrainConfig(), torch.device("cpu"), None) == "fp32"


@pytest.mark.parametrize("user, field", [
    ({"optimizer": {"type": "Adam"}}, "ds_config.optimizer"),
    ({"scheduler": {"type": "WarmupLR"}}, "ds_config.scheduler"),
    ({"fp16": {"enabled": True}}, "ds_config.fp16"),
    ({"train_batch_size": 64}, "ds_config.train_batch_size"),
])
def test_ds_config_keys_the_trial_owns_are_refused(user, field):
    with pytest.raises(UserError, match=field):
        build_ds_config(TrainConfig(batch_size=32), 1, "fp32", user)


@pytest.mark.parametrize("user, field", [
    ({"train_micro_batch_size_per_gpu": "a"}, "ds_config.train_micro_batch_size_per_gpu: must"),
    ({"train_micro_batch_size_per_gpu": -4}, "ds_config.train_micro_batch_size_per_gpu: must"),
    ({"gradient_accumulation_steps": 0}, "ds_config.gradient_accumulation_steps: must"),
    ({"gradient_accumulation_steps": "x"}, "ds_config.gradient_accumulation_steps: must"),
])
def test_ds_config_batch_fields_are_checked_before_the_arithmetic(user, field):
    with pytest.raises(UserError, match=field):
        build_ds_config(TrainConfig(batch_size=32), 1, "fp32", user)


@pytest.mark.parametrize("field, value", [
    ("tokens", 0), ("batch_size", -1), ("lr", 0.0), ("lr", float("nan")), ("warmup_frac", 1.5),
    ("max_seconds", 0), ("precision", "fp16"), ("eval_every", 1.5), ("grad_clip", -1.0),
])
def test_train_config_names_the_bad_field(field, value):
    with pytest.raises(UserError, match=f"train.{field}: must"):
        TrainConfig(**{field: value})
    with pytest.raises(UserError, match="train.bogus: unknown field"):
        TrainConfig.from_dict({"bogus": 1})


def test_lr_schedule_warmup_then_cosine_to_floor():
    f = lr_lambda(total_steps=100, warmup_frac=0.1, min_lr_frac=0.1)
    assert [f(s) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(55) == pytest.approx(0.1 + 0.9 * 0.5, abs=0.02)
    assert f(100) == pytest.approx(0.1) and f(500) == pytest.approx(0.1)
    assert lr_lambda(10, 0.0, 0.0)(0) == pytest.approx(1.0)


def test_loss_ignores_unscored_positions_and_never_divides_by_zero():
    logits = torch.randn(2, 5, 7)
    targets = torch.full((2, 5), -100)
    assert lm_loss(logits, targets).item() == 0.0
    targets[0, 2] = 3
    expected = torch.nn.functional.cross_entropy(logits[0, 2][None], torch.tensor([3]))
    assert lm_loss(logits, targets).item() == pytest.approx(expected.item(), rel=1e-5)


def test_weight_decay_skips_vectors():
    groups = param_groups(HybridLM(SPEC), 0.1)
    assert groups[0]["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in groups[0]["params"])
    assert groups[1]["weight_decay"] == 0.0 and all(p.dim() < 2 for p in groups[1]["params"])


class _FailsAtStep(HybridLM):
    """Raises ``exc`` on its ``n``-th forward: stands in for a CUDA OOM / a Ctrl-C mid-training."""

    def __init__(self, spec, n, exc):
        super().__init__(spec)
        self.calls, self.n, self.exc = 0, n, exc

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.n:
            raise self.exc
        return super().forward(*args, **kwargs)


@pytest.mark.parametrize("exc, status", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "oom"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), "oom"),
    (KeyboardInterrupt(), "interrupted"),
])
def test_out_of_memory_and_interrupt_end_with_a_status(dist, task, exc, status):
    res = train(lambda: _FailsAtStep(SPEC, 3, exc), task, TrainConfig(tokens=10 * 32 * 16, batch_size=32),
                seed=0, dist=dist, out_dir=None)
    assert res.status == status and res.steps == 2 and res.model is None
    assert res.reason and ("out of memory" in res.reason or "can't allocate" in res.reason or status == "interrupted")


def test_a_bug_is_raised_not_recorded_as_oom(dist, task):
    with pytest.raises(ValueError, match="a bug"):
        train(lambda: _FailsAtStep(SPEC, 2, ValueError("a bug")), task, TrainConfig(tokens=10 * 32 * 16),
              seed=0, dist=dist, out_dir=None)


def test_out_of_memory_while_building_the_model_is_oom(dist, task):
    def build():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    res = train(build, task, TrainConfig(tokens=1000), seed=0, dist=dist, out_dir=None)
    assert res.status == "oom" and res.steps == 0 and "80.00 GiB" in res.reason


def test_non_finite_evaluation_is_diverged(dist, task, tmp_path):
    class NaNScore:  # the task, but its held-out score comes out NaN
        seq_len = task.seq_len
        train_batches = task.train_batches

        def evaluate(self, model, device, batch_size=64):
            return {"accuracy": 0.5, "loss": float("nan")}

    res = train(lambda: HybridLM(SPEC), NaNScore(), TrainConfig(tokens=2 * 32 * 16), seed=0, dist=dist,
                out_dir=tmp_path)
    assert res.status == "diverged" and "loss" in res.reason
    assert res.eval_metrics == {"accuracy": 0.5} and res.model is None
    last = json.loads(open(res.curve_path).read().splitlines()[-1])  # strict JSON: NaN written as null
    assert last["eval"] == {"accuracy": 0.5, "loss": None}
