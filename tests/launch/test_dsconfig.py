"""Shipped DeepSpeed configs, user overrides, and the global-batch rule."""
import json

import pytest

from archsearch.errors import UserError
from launch.dsconfig import (default_ds_config, ds_config_for_slot, load_ds_config, micro_batch,
                             shipped_configs)
from launch.slots import Slot, plan_slots


def test_every_shipped_config_loads():
    names = shipped_configs()
    assert {"zero0_fp32", "zero0_bf16", "zero1_bf16", "zero2_bf16", "zero3_bf16"} <= set(names)
    for n in names:
        cfg = load_ds_config(n)
        assert cfg["zero_optimization"]["stage"] == int(n[4])
        assert cfg["bf16"]["enabled"] == n.endswith("bf16")


def test_defaults_follow_the_slot():
    assert default_ds_config(0)["bf16"]["enabled"] is False
    assert "bf16" not in default_ds_config(1) and "bf16" not in default_ds_config(2)  # the trial's device decides
    assert default_ds_config(1)["zero_optimization"]["stage"] == 0
    assert default_ds_config(2)["zero_optimization"]["stage"] == 2
    gpu2 = Slot(index=0, gpus=(0, 1), num_procs=2, master_port=1)
    assert ds_config_for_slot(gpu2)["zero_optimization"]["stage"] == 2


def test_user_config_overrides_on_the_slot_and_explicitly(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"zero_optimization": {"stage": 3}, "gradient_accumulation_steps": 2}))
    (slot,) = plan_slots([], 1, 1, ds_config=str(mine))
    assert slot.ds_config == str(mine)
    assert ds_config_for_slot(slot)["zero_optimization"]["stage"] == 3
    assert ds_config_for_slot(slot, "zero1_bf16")["zero_optimization"]["stage"] == 1
    assert ds_config_for_slot(slot, {"zero_optimization": {"stage": 0}})["zero_optimization"]["stage"] == 0


@pytest.mark.parametrize("text,msg", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"zero_optimization": {"stage": 4}}', "zero_optimization.stage must be 0, 1, 2 or 3, got 4"),
    ('{"gradient_accumulation_steps": 0}', "gradient_accumulation_steps must be an integer >= 1"),
    ('{"fp16": {"enabled": true}}', "fp16.enabled: use bf16"),
])
def test_bad_user_config_is_a_one_line_error_before_any_trial(tmp_path, text, msg):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(UserError, match=msg):
        plan_slots([], 1, 1, ds_config=str(bad))


def test_unknown_name_lists_the_shipped_ones():
    with pytest.raises(UserError, match="shipped: .*zero2_bf16"):
        load_ds_config("zero9")


def test_micro_batch_keeps_the_global_batch():
    assert micro_batch(64, 1) == 64
    assert micro_batch(64, 2) == 32
    assert micro_batch(64, 4, {"gradient_accumulation_steps": 2}) == 8
    with pytest.raises(UserError, match="batch_size: global batch 64 must be a multiple of .* = 3 x 1 = 3"):
        micro_batch(64, 3)
