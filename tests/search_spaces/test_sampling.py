"""From a space to specs: pattern placement, per-layer choices, the Python API, size counting."""
from __future__ import annotations

import optuna
import pytest

import search_spaces
from search_spaces import Budget, Choice, IntRange, Model, Objective, Pattern, PerLayer, Space, Task
from search_spaces.sampling import combinations, softmax_positions, spec_dict


@pytest.mark.parametrize("depth,every,share,placement,expected", [
    (8, 4, None, None, [3, 7]),           # LLLS LLLS
    (4, 1, None, None, [0, 1, 2, 3]),
    (3, 4, None, None, []),
    (8, None, 0.25, "even", [3, 7]),
    (8, None, 0.25, "first", [0, 1]),
    (8, None, 0.25, "last", [6, 7]),
    (8, None, 0.25, "middle", [3, 4]),
    (6, None, 0.5, "even", [1, 3, 5]),
    (4, None, 0.0, "even", []),
    (4, None, 1.0, "middle", [0, 1, 2, 3]),
])
def test_softmax_positions(depth, every, share, placement, expected):
    assert softmax_positions(depth, every, share, placement) == expected


def api_space(**model_kw) -> Space:
    model = dict(depth=IntRange(2, 3), d_model=32, num_heads=2, mlp_expansion=0,
                 stack=PerLayer(["linear_attn", "softmax"]))
    model.update(model_kw)
    return Space(name="api", task=Task("mqar", {"vocab_size": 64, "seq_len": 32, "num_kv_pairs": 4}),
                 model=Model(**model),
                 objectives=[Objective("quality", metric="accuracy"), Objective("decode_memory", context=512)],
                 budget=Budget(tokens=1000))


def test_python_api_equals_yaml():
    space = api_space().validate()
    yaml_space = search_spaces.load_text("""
name: api
task: {name: mqar, params: {vocab_size: 64, seq_len: 32, num_kv_pairs: 4}}
model:
  depth: {low: 2, high: 3}
  d_model: 32
  num_heads: 2
  mlp_expansion: 0
  per_layer: {blocks: [linear_attn, softmax]}
objectives:
  - {name: quality, metric: accuracy}
  - {name: decode_memory, context: 512}
budget: {tokens: 1000}
""")
    assert space.to_dict() == yaml_space.to_dict()
    assert Space.from_dict(space.to_dict()).to_dict() == space.to_dict()


def test_python_api_reports_errors():
    from archsearch.errors import UserError

    with pytest.raises(UserError, match=r"model.depth.low: must be an integer >= 1, got 0"):
        api_space(depth=IntRange(0, 2)).validate()


def test_suggest_per_layer_with_optuna():
    space = api_space(feature_map=Choice(["elu1", "hedgehog"])).validate()
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        spec = search_spaces.suggest(space, trial)
        depth = trial.params["depth"]
        assert len(spec.layers) == depth
        assert [layer.block for layer in spec.layers] == [trial.params[f"layer_{i}"] for i in range(depth)]
        for layer in spec.layers:
            if layer.block == "linear_attn":
                assert layer.config["feature_map"] == trial.params["feature_map"]
            else:
                assert "feature_map" not in layer.config  # softmax has no feature map
        seen.add(spec.stack_string())
        study.tell(trial, [0.0, 0.0])
    assert len(seen) > 3


def test_pattern_spec_and_state_expansion():
    space = api_space(stack=Pattern(mixer="gated_deltanet", every=2), depth=4, state_expansion=2,
                      short_conv=True).validate()
    spec = search_spaces.example(space)
    assert [layer.block for layer in spec.layers] == ["gated_deltanet", "softmax"] * 2
    gdn = spec.layers[0].config
    assert gdn["expand_v"] == 2 and gdn["conv_size"] == 4 and gdn["num_heads"] == 2
    assert spec.stack_string() == "NSNS"


def test_size_counts_distinct_architectures():
    # depth 2..3 over {L, S}: 4 + 8 stacks; the feature map only matters for stacks with an L
    space = api_space(feature_map=Choice(["elu1", "hedgehog"])).validate()
    text, n = search_spaces.size(space)
    assert combinations(space) == 2 * (4 + 8)
    assert n == (4 - 1) * 2 + 1 + (8 - 1) * 2 + 1  # all-softmax stacks do not multiply
    assert "distinct architectures" in text
    cont = api_space(state_expansion={"low": 1.0, "high": 2.0}).validate()
    assert search_spaces.size(cont) == ("continuous (a float range has no step)", None)
    big = api_space(depth=IntRange(1, 24)).validate()
    assert search_spaces.size(big)[1] is None and "not enumerated" in search_spaces.size(big)[0]


def test_huge_ranges_are_counted_not_listed():
    # a typo'd bound (depth up to 100000, d_model up to 1e11) once died with OverflowError in
    # size() and MemoryError in validate (every value of the range was put in a list)
    deep = api_space(depth=IntRange(1, 100_000)).validate()
    assert combinations(deep) == (2 ** 100_001 - 2)  # sum of 2**d for d in 1..100000
    text, n = search_spaces.size(deep)
    assert n is None and text.startswith("up to about 10^30103 parameter combinations")
    wide = api_space(d_model=IntRange(32, 10**11, step=32)).validate()
    assert search_spaces.example(wide).d_model == 32
    assert "not enumerated" in search_spaces.size(wide)[0]
    assert combinations(api_space(depth=Choice([2, 3])).validate()) == 4 + 8  # a choice list: summed


def test_spec_dict_is_deterministic_for_same_params():
    space = api_space().validate()
    fixed = optuna.trial.FixedTrial({"depth": 2, "layer_0": "softmax", "layer_1": "linear_attn"})
    a = spec_dict(space, fixed)
    b = spec_dict(space, optuna.trial.FixedTrial({"depth": 2, "layer_0": "softmax", "layer_1": "linear_attn"}))
    assert a == b and [layer["block"] for layer in a["layers"]] == ["softmax", "linear_attn"]
