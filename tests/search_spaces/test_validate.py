"""Schema validation: every error path is reported, all at once, with its YAML path and bad value."""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import yaml

import search_spaces
from archsearch.errors import UserError
from search_spaces.loader import builtin_path

BASE = {
    "name": "t",
    "task": {"name": "mqar", "params": {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4}},
    "model": {"depth": [1, 2], "d_model": 32, "num_heads": 2, "mlp_expansion": 0,
              "per_layer": {"blocks": ["linear_attn", "softmax"]}},
    "objectives": [{"name": "quality", "metric": "accuracy"}, {"name": "decode_memory", "context": 1024}],
    "budget": {"tokens": 1000},
}


def errors_of(d) -> list[str]:
    with pytest.raises(UserError) as exc:
        search_spaces.Space.from_dict(d)
    return str(exc.value).splitlines()


def with_(**changes):
    """BASE with dotted-path changes; a value of ... deletes the key."""
    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        keys = path.split("__")
        cur = d
        for k in keys[:-1]:
            cur = cur.setdefault(k, {})
        if value is ...:
            cur.pop(keys[-1], None)
        else:
            cur[keys[-1]] = value
    return d


def test_base_is_valid():
    space = search_spaces.Space.from_dict(BASE)
    assert space.objectives[0].direction == "maximize"  # from the task's metric
    assert space.objectives[1].direction == "minimize"


# (change, expected message fragment: path and value)
CASES = [
    (dict(model__pattern={"mixer": "gated_deltanet", "every": 0}, model__per_layer=...),
     "model.pattern.every: must be >= 1, got 0"),
    (dict(model__per_layer={"blocks": ["linear_attn", "mamba9"]}),
     "model.per_layer.blocks[1]: unknown block 'mamba9'; registered blocks: deltanet, gated_deltanet, gla,"),
    (dict(model__depth=0), "model.depth: must be an integer >= 1, got 0"),
    (dict(model__d_model={"low": 64, "high": 32}), "model.d_model: low must be <= high, got low=64 high=32"),
    (dict(model__num_heads=[]), "model.num_heads: a choice list must not be empty, got []"),
    (dict(model__num_heads=[2, 2]), "model.num_heads: choices must be distinct, got [2, 2]"),
    (dict(model__d_model={"low": 1, "hi": 2}), "model.d_model: a range needs keys low and high"),
    (dict(model__d_model={"low": 32, "high": 64, "step": 0}), "model.d_model.step: must be > 0, got 0"),
    (dict(model__state_expansion={"low": 1.0, "high": float("inf"), "step": 0.5}),
     "model.state_expansion.high: must be a finite number, got inf"),
    (dict(model__mlp_expansion=-1), "model.mlp_expansion: must be a number >= 0, got -1"),
    (dict(model__short_conv="yes"), "model.short_conv: must be true or false, got 'yes'"),
    # these passed validate and then failed every trial ("invalid spec: mlp: ...")
    (dict(model__mlp="gelu"), "model.mlp: must be one of swiglu, got 'gelu'"),
    (dict(model__norm="batchnorm"), "model.norm: must be one of rmsnorm, layernorm, got 'batchnorm'"),
    (dict(model__mlp_expansion=float("inf")), "model.mlp_expansion: must be a number >= 0, got inf"),
    (dict(budget__lr=float("inf")), "budget.lr: must be a number > 0, got inf"),
    (dict(model__conv_size=9), "model.conv_size: must be an integer in 2..4, got 9"),
    (dict(model__per_layer=...), "model: needs exactly one of per_layer"),
    (dict(model__pattern={"mixer": "gla", "every": 2}), "model: needs exactly one of per_layer"),
    (dict(model__per_layer=..., model__pattern={"mixer": "gla"}), "model.pattern: needs exactly one of every"),
    (dict(model__per_layer=..., model__pattern={"mixer": "gla", "share": 1.5}), "model.pattern.share: must be in [0, 1], got 1.5"),
    (dict(model__per_layer=..., model__pattern={"mixer": "gla", "share": 0.5, "placement": "top"}),
     "model.pattern.placement: must be one of first, middle, last, even, got 'top'"),
    (dict(model__blocks={"linear_attn": {"feature_map": ["elu1", "nope"]}}), "model.blocks.linear_attn.feature_map[1]: "),
    (dict(model__blocks={"linear_attn": {"colour": 3}}), "model.blocks.linear_attn.colour: unknown field; known fields:"),
    (dict(model__blocks={"mamba9": {}}), "model.blocks.mamba9: unknown block 'mamba9'; registered blocks:"),
    (dict(model__widht=3), "model.widht: unknown field; known fields:"),
    (dict(task__name="wikitext"), "task.name: unknown task; known tasks:"),
    (dict(task__params={"num_kv_pairs": 0}), "task.params: mqar.num_kv_pairs: must be >= 1, got 0"),
    (dict(objectives=[{"name": "quality"}]), "objectives: must be a list of 2 to 4 objectives"),
    (dict(objectives=[{"name": "quality"}, {"name": "speed"}]), "objectives[1].name: must be one of quality, decode_memory,"),
    (dict(objectives=[{"name": "quality", "metric": "f1"}, "params"]),
     "objectives[0].metric: not a metric of task mqar; its metrics: accuracy, loss, got 'f1'"),
    (dict(objectives=[{"name": "quality"}, {"name": "decode_memory"}]), "objectives[1].context: is required"),
    (dict(objectives=[{"name": "quality", "direction": "up"}, "params"]),
     "objectives[0].direction: must be one of minimize, maximize, got 'up'"),
    (dict(objectives=["params", "params"]), "objectives[1]: duplicates objectives[0] (params)"),
    (dict(objectives=["params", {"name": "decode_throughput", "context": 64, "compile": "yes"}]),
     "objectives[1].compile: must be true or false, got 'yes'"),
    (dict(objectives=["params", {"name": "decode_memory", "context": 64, "compile": True}]),
     "objectives[1].compile: unknown field"),
    (dict(objectives=[{"name": "decode_throughput", "context": 64, "compile": True},
                      {"name": "decode_throughput", "context": 128}]),
     "objectives: decode_throughput objectives must agree on compile"),
    (dict(constraints={"max_params": 0}), "constraints.max_params: must be an integer >= 1, got 0"),
    (dict(constraints={"min_softmax_share": 0.8, "max_softmax_share": 0.2}),
     "constraints.min_softmax_share: must be <= max_softmax_share (0.2), got 0.8"),
    (dict(constraints={"max_decode_memory": {"bytes": "lots", "context": 10}}),
     "constraints.max_decode_memory.bytes: must be a positive byte count"),
    (dict(constraints={"max_decode_memory": {"bytes": "1MiB"}}), "constraints.max_decode_memory.context: is required"),
    (dict(model__vocab_size=5), "model.vocab_size: must be >= the tasks' vocabulary (64), got 5"),
    # an empty list where a mapping goes was taken for "nothing set"
    (dict(task__params=[]), "task.params: must be a mapping, got []"),
    (dict(model__blocks=[]), "model.blocks: must be a mapping of block name to field ranges, got []"),
    (dict(sampler={"name": "tpe", "options": []}), "sampler.options: must be a mapping of tpe sampler arguments, got []"),
    (dict(budget__tokens=0), "budget.tokens: must be an integer >= 1, got 0"),
    (dict(budget__precision="fp16"), "budget.precision: must be one of auto, fp32, bf16, got 'fp16'"),
    (dict(budget__warmup_frac=1.0), "budget.warmup_frac: must be in [0, 1), got 1.0"),
    (dict(sampler={"name": "cmaes"}), "sampler.name: must be one of tpe, nsga2, gp, random, grid, got 'cmaes'"),
    (dict(sampler={"name": "tpe", "options": {"n_startup": 3}}), "sampler.options.n_startup: not an argument of the tpe sampler"),
    # option values reach Optuna only at the first ask(): checked here, or launch dies with a TypeError
    (dict(sampler={"name": "tpe", "options": {"n_startup_trials": "x"}}),
     "sampler.options.n_startup_trials: must be an integer (like the default 10), got 'x'"),
    (dict(sampler={"name": "tpe", "options": {"constant_liar": "off"}}),
     "sampler.options.constant_liar: must be true or false (like the default True), got 'off'"),
    (dict(sampler={"name": "nsga2", "options": {"population_size": -1}}),
     "sampler.options: the nsga2 sampler refuses them: `population_size` must be greater than or equal to 2."),
    (dict(sampler={"name": "grid"}, model__state_expansion={"low": 1.0, "high": 2.0}),
     "sampler.name: grid needs every searched setting to be finite"),
    (dict(study={"trials": 0}), "study.trials: must be an integer >= 1, got 0"),
    (dict(study={"seed": 2**32}), "study.seed: must be an integer in 0..4294967295, got 4294967296"),
    (dict(name="bad name!"), "name: must be a name of letters, digits, _ . -, got 'bad name!'"),
    (dict(surprise=1), "surprise: unknown field; known fields:"),
]


@pytest.mark.parametrize("changes,expected", CASES, ids=[c[1].split(":")[0] for c in CASES])
def test_error_names_path_and_value(changes, expected):
    errs = errors_of(with_(**changes))
    assert any(expected in e for e in errs), errs


def test_decode_throughput_compile_reaches_the_trials_measure_settings():
    from archsearch.objectives import measure_settings

    def settings(objective):
        return measure_settings(search_spaces.Space.from_dict(with_(objectives=["params", objective])))

    plain = settings({"name": "decode_throughput", "context": 64, "batch": 2})
    assert plain["throughput"] and plain["decode_compile"] is False and plain["batch"] == 2
    assert settings({"name": "decode_throughput", "context": 64, "compile": True})["decode_compile"] is True
    assert settings({"name": "decode_memory", "context": 64})["decode_compile"] is False


def test_all_errors_reported_at_once():
    d = with_(model__depth=0, budget__tokens=-5, sampler={"name": "cmaes"},
              objectives=[{"name": "quality", "metric": "f1"}, {"name": "speed"}])
    errs = errors_of(d)
    for path in ("model.depth", "budget.tokens", "sampler.name", "objectives[0].metric", "objectives[1].name"):
        assert any(e.startswith(path + ":") for e in errs), (path, errs)


def test_required_sections():
    errs = errors_of({"name": "x"})
    for key in ("task", "model", "objectives"):
        assert f"{key}: is required" in errs


def test_bad_yaml_is_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: [unclosed\n")
    with pytest.raises(UserError, match=r"not valid YAML: line \d+"):
        search_spaces.load(f)
    with pytest.raises(UserError, match="not a built-in space; built-in spaces: hybrid_lm_small, mqar_tiny"):
        search_spaces.load(tmp_path / "missing.yaml")


def test_unreadable_space_file_is_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(UserError, match=r"s.yaml: not UTF-8 text: "):
        search_spaces.load(f)


def test_cli_prints_one_line_per_error_and_exits_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(with_(model__depth=0, budget__tokens=0, sampler={"name": "cmaes"})))
    r = subprocess.run([sys.executable, "-m", "archsearch", "validate", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if "WARNING" not in ln and "accelerator" not in ln]
    assert "Traceback" not in r.stderr
    assert lines[-1] == "archsearch validate: 3 errors"
    assert {ln.split(": ")[1] for ln in lines[:-1]} == {"model.depth", "budget.tokens", "sampler.name"}


@pytest.mark.parametrize("name", search_spaces.builtin_names())
def test_builtins_validate(name):
    space = search_spaces.load(name)
    assert space.name == name
    assert builtin_path(name).exists()
    search_spaces.example(space).validate()


def test_budget_defaults_match_the_trainer_and_fill_missing_fields():
    """A space's ``budget`` and ``archsearch.train.TrainConfig`` state the same optimiser defaults
    (search_spaces must not import the trainer, so they are written twice; this keeps them equal).
    ``tokens`` differs on purpose: a study's default budget is larger than a single trial's."""
    import dataclasses

    from archsearch.train import TrainConfig

    budget, train = search_spaces.Budget(), TrainConfig()
    shared = {f.name for f in dataclasses.fields(budget)} & {f.name for f in dataclasses.fields(train)}
    assert shared >= {"lr", "batch_size", "warmup_frac", "weight_decay", "grad_clip", "max_seconds", "precision"}
    assert {n: getattr(budget, n) for n in shared - {"tokens"}} == {n: getattr(train, n) for n in shared - {"tokens"}}
    from search_spaces.validate import parse_space

    d = yaml.safe_load(builtin_path("mqar_tiny").read_text())
    d["budget"] = {"tokens": 5000}  # every other field from the defaults
    assert parse_space(d).budget == dataclasses.replace(budget, tokens=5000)
