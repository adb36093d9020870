"""ArchSpec: JSON round trip, hash stability, validation messages naming the field, stack strings."""
from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pytest

import blocks
from archsearch.errors import UserError
from archsearch.spec import ArchSpec, LayerSpec, stack_legend


def make(**overrides):
    d = {
        "vocab_size": 64,
        "d_model": 32,
        "layers": [
            {"block": "gated_deltanet", "config": {"num_heads": 2, "conv_size": 4}},
            {"block": "softmax", "config": {"num_heads": 2, "window": 16, "rope_theta": 10000.0}},
            {"block": "linear_attn", "config": {"feature_map": "elu1"}},
        ],
        "mlp_expansion": 8 / 3,
    }
    d.update(overrides)
    return ArchSpec.from_dict(d)


def test_json_round_trip_is_exact():
    spec = make()
    text = spec.to_json()
    back = ArchSpec.from_json(text)
    assert back == spec
    assert back.to_dict() == spec.to_dict()
    assert back.to_json() == text
    assert back.mlp_expansion == 8 / 3  # float survives exactly
    assert isinstance(back.layers[1].config["rope_theta"], float)
    assert json.loads(ArchSpec.from_json(spec.to_json(indent=2)).to_json()) == json.loads(text)


def test_nested_config_values_freeze_and_thaw():
    spec = ArchSpec(vocab_size=16, d_model=16, layers=(LayerSpec("softmax", {"extra": [1, {"a": 2}]}),))
    assert spec.layers[0].config["extra"] == (1, spec.layers[0].config["extra"][1])
    assert spec.to_dict()["layers"][0]["config"]["extra"] == [1, {"a": 2}]
    assert ArchSpec.from_json(spec.to_json()) == spec


def test_spec_is_frozen_and_hashable():
    spec = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.d_model = 64  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.layers[0].config["num_heads"] = 4  # type: ignore[index]
    assert len({spec, make()}) == 1


def test_spec_pickles_and_deep_copies():
    spec = make(layers=[{"block": "gla", "config": {"num_heads": 2, "extra": [1, {"a": 2}]}}])
    for clone in (pickle.loads(pickle.dumps(spec)), copy.deepcopy(spec)):
        assert clone == spec and clone.hash == spec.hash and clone.to_json() == spec.to_json()


def test_hash_ignores_key_order_and_float_spelling():
    base = make()
    d = base.to_dict()
    reordered = {k: d[k] for k in reversed(list(d))}
    reordered["layers"] = [{"config": dict(reversed(list(l["config"].items()))), "block": l["block"]} for l in d["layers"]]
    assert ArchSpec.from_dict(reordered).hash == base.hash
    # 10000.0 vs 10000, and a float written with extra digits that parses to the same value
    text = base.to_json().replace("10000.0", "10000")
    assert ArchSpec.from_json(text).hash == base.hash
    assert make(mlp_expansion=3.0).hash == make(mlp_expansion=3).hash
    t1 = make(mlp_expansion=0.1).to_json().replace("0.1", "0.10000000000000001")
    assert ArchSpec.from_json(t1).hash == make(mlp_expansion=0.1).hash
    assert len(base.hash) == 64 and int(base.hash, 16) >= 0


def test_hash_fills_block_defaults_and_separates_different_architectures():
    plain = ArchSpec(vocab_size=64, d_model=32, layers=(LayerSpec("gla"),))
    explicit = ArchSpec(vocab_size=64, d_model=32, layers=(LayerSpec("gla", {"conv_size": 0}),))
    assert plain != explicit and plain.hash == explicit.hash  # the default written out is the same net
    different = [
        make(),
        make(d_model=64),
        make(vocab_size=65),
        make(mlp_expansion=2),
        make(tied_embeddings=False),
        make(norm="layernorm"),
        make(layers=list(reversed(make().to_dict()["layers"]))),
        make(layers=[{"block": "gated_deltanet", "config": {"num_heads": 4, "conv_size": 4}}]),
    ]
    assert len({s.hash for s in different}) == len(different)


def _one_layer(block, config, d_model=64):
    return ArchSpec(vocab_size=64, d_model=d_model, layers=(LayerSpec(block, config),))


def test_hash_resolves_fields_derived_from_d_model():
    """Configs that build the same network at this d_model hash the same (the study trains a hash
    once); the JSON written keeps the config as given."""
    same = [
        ("gla", {}, {"num_heads": 1}),  # default heads max(1, 64 // 64)
        ("gla", {}, {"num_heads": 1, "head_dim_k": 64, "head_dim_v": 64}),
        ("gla", {"head_dim_v": 16, "expand_v": 2}, {"head_dim_v": 32}),
        ("softmax", {}, {"num_heads": 1, "num_kv_heads": 1, "head_dim": 64}),
        ("linear_attn", {"normalization": "output_norm"}, {"normalization": "output_norm", "output_norm": True}),
    ]
    for block, a, b in same:
        sa, sb = _one_layer(block, a), _one_layer(block, b)
        assert sa != sb and sa.hash == sb.hash, (block, a, b)
        assert sa.to_dict()["layers"][0]["config"] == a  # serialised as written, not resolved
        assert ArchSpec.from_json(sa.to_json()) == sa
    different = [
        _one_layer("gla", {}),
        _one_layer("gla", {"num_heads": 2}),
        _one_layer("gla", {"head_dim_k": 32}),
        _one_layer("gla", {}, d_model=128),  # derived heads 2 there: a different net anyway
        _one_layer("softmax", {"num_heads": 2}),
        _one_layer("softmax", {"num_heads": 2, "num_kv_heads": 1}),
        _one_layer("linear_attn", {}),
        _one_layer("linear_attn", {"output_norm": True}),
    ]
    assert len({s.hash for s in different}) == len(different)


def test_hash_of_a_config_invalid_at_d_model_is_still_defined():
    bad = _one_layer("gla", {"num_heads": 3})  # does not divide 64: nothing to derive
    assert bad.hash == _one_layer("gla", {"num_heads": 3, "conv_size": 0}).hash  # defaults still filled
    assert bad.hash != _one_layer("gla", {"num_heads": 1}).hash


def test_validate_accepts_good_spec():
    assert make().validate() is not None


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"d_model": 0}, "d_model: must be >= 8, got 0"),
        ({"d_model": 16.0}, "d_model: must be an integer"),
        ({"vocab_size": 1}, "vocab_size: must be >= 2, got 1"),
        ({"vocab_size": True}, "vocab_size: must be an integer"),
        ({"layers": []}, "layers: must list at least one layer"),
        ({"mlp": "gelu"}, "mlp: must be one of swiglu, got 'gelu'"),
        ({"mlp_expansion": -1}, "mlp_expansion: must be a number >= 0"),
        ({"norm": "batchnorm"}, "norm: must be one of rmsnorm, layernorm"),
        ({"tied_embeddings": "yes"}, "tied_embeddings: must be true or false"),
    ],
)
def test_validate_names_the_top_level_field(overrides, message):
    with pytest.raises(UserError) as err:
        make(**overrides).validate()
    assert message in str(err.value)


def test_unknown_block_names_layer_and_lists_registered():
    layers = make().to_dict()["layers"] + [{"block": "foo"}]
    with pytest.raises(UserError) as err:
        make(layers=layers[:2] + [{"block": "foo"}]).validate()
    msg = str(err.value)
    assert msg.startswith("layers[2].block: unknown block 'foo'; registered blocks: ")
    for name in blocks.names():
        assert name in msg


@pytest.mark.parametrize(
    "config, field",
    [
        ({"num_heads": 3}, "layers[1].config.num_heads"),  # does not divide d_model=32
        ({"conv_size": 9}, "layers[1].config.conv_size"),
        ({"nonsense": 1}, "layers[1].config.nonsense"),
    ],
)
def test_bad_block_config_is_caught_by_the_blocks_config(config, field):
    layers = make().to_dict()["layers"]
    layers[1] = {"block": "gla", "config": config}
    with pytest.raises(UserError) as err:
        make(layers=layers).validate()
    assert str(err.value).startswith(field + ":"), str(err.value)


@pytest.mark.parametrize(
    "d, message",
    [
        ({"vocab_size": 8, "d_model": 8, "layers": ["gla"], "depth": 3}, "depth: unknown spec field"),
        ({"vocab_size": 8, "layers": ["gla"]}, "d_model: required"),
        ({"vocab_size": 8, "d_model": 8, "layers": "gla"}, "layers: must be a list"),
        ({"vocab_size": 8, "d_model": 8, "layers": [{"config": {}}]}, "layers[0].block: required"),
        ({"vocab_size": 8, "d_model": 8, "layers": [{"block": "gla", "cfg": {}}]}, "layers[0].cfg: unknown layer field"),
        ({"vocab_size": 8, "d_model": 8, "layers": [{"block": "gla", "config": [1]}]}, "layers[0].config: must be a mapping"),
        ({"vocab_size": 8, "d_model": 8, "layers": [{"block": "gla", "config": {"x": float("nan")}}]}, "layers[0].config.x: must be a finite"),
    ],
)
def test_from_dict_errors_name_the_field(d, message):
    with pytest.raises(UserError) as err:
        ArchSpec.from_dict(d)
    assert message in str(err.value)


def test_from_json_bad_text_is_user_error():
    with pytest.raises(UserError, match="spec JSON"):
        ArchSpec.from_json("{not json")


def test_layers_accept_bare_block_names():
    spec = ArchSpec.from_dict({"vocab_size": 8, "d_model": 8, "layers": ["gla", "softmax"]})
    assert spec.layers == (LayerSpec("gla"), LayerSpec("softmax"))


def test_stack_string_groups_of_four_and_legend():
    gdn, sm = LayerSpec("gated_deltanet"), LayerSpec("softmax")
    spec = ArchSpec(vocab_size=16, d_model=16, layers=(gdn, gdn, gdn, sm) * 2 + (gdn,))
    g, s = blocks.get("gated_deltanet").letter, blocks.get("softmax").letter
    assert spec.stack_string() == f"{g * 3}{s} {g * 3}{s} {g}"
    assert spec.stack_legend() == {g: "gated_deltanet", s: "softmax"}
    full = stack_legend()
    assert sorted(full.values()) == sorted(blocks.names())  # letters are unique per block
    assert all(len(letter) == 1 for letter in full)
