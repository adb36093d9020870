"""``archsearch trial``: runs the shipped example spec and prints its record; bad input is one line."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from archsearch import record
from archsearch.cli import main
from archsearch.cli import trial as cli_trial
from archsearch.spec import ArchSpec

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "archsearch" / "examples" / "hybrid_small.json"
EXAMPLE_CFG = ROOT / "archsearch" / "examples" / "trial_cpu_tiny.json"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli_trial.add_arguments(p)
    return p.parse_args(list(argv))


def test_example_spec_mixes_families_and_validates():
    spec = ArchSpec.from_json(EXAMPLE.read_text()).validate()
    assert len({layer.block for layer in spec.layers}) >= 3
    assert "softmax" in {layer.block for layer in spec.layers}


def test_trial_on_the_example_prints_the_record(tmp_path):
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "archsearch", "trial", str(EXAMPLE), "--config", str(EXAMPLE_CFG),
         "--tokens", "2048", "--prefill-len", "8", "--repeats", "1", "--context", "32768",
         "--task-param", "num_train_examples=512", "--task-param", "num_test_examples=64",
         "--out", str(out), "--json"],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = json.loads(proc.stdout)  # --json: the record and nothing else on stdout
    assert printed == record.read(out / "record.json")
    assert printed["status"] == "ok" and printed["spec"] == json.loads(EXAMPLE.read_text())
    assert printed["train"]["tokens"] == 2048 and printed["decode_memory"]["context"] == 32768
    assert printed["config"]["task_params"]["num_test_examples"] == 64

    # The table view of the same record (rendered in process: no second training run).
    from rich.console import Console

    console = Console(width=200, record=True)
    spec = ArchSpec.from_dict(printed["spec"])
    console.print(cli_trial.summary_table(printed, str(out / "record.json"), spec.stack_string()))
    text = console.export_text()
    for needle in ("status", "ok", "accuracy", "decode memory", "tok/s", spec.stack_string(), "record.json"):
        assert needle in text

    # A record reproduces its trial: same spec and config, a fresh output directory.
    cfg = cli_trial.build_config(_args(str(out / "record.json")), printed["config"], spec.hash)
    assert cfg.train.tokens == 2048 and cfg.task_params == printed["config"]["task_params"]
    assert cfg.out_dir != printed["config"]["out_dir"]


def test_options_override_the_config():
    args = _args("s.json", "--task", "mqar", "--task-param", "num_kv_pairs=4", "--tokens", "999",
                 "--seconds", "7.5", "--batch", "8", "--lr", "0.01", "--device", "cpu", "--context", "4096",
                 "--measure-batch", "16", "--prefill-len", "32", "--repeats", "5", "--no-throughput",
                 "--seed", "3", "--out", "x", "--ds-config", "zero2_bf16")
    cfg = cli_trial.build_config(args, None, "ab" * 32)
    assert cfg.task_params == {"num_kv_pairs": 4}
    assert (cfg.train.tokens, cfg.train.max_seconds, cfg.train.batch_size, cfg.train.lr) == (999, 7.5, 8, 0.01)
    assert (cfg.measure.context, cfg.measure.batch, cfg.measure.prefill_len, cfg.measure.repeats) == (4096, 16, 32, 5)
    assert cfg.measure.throughput is False and (cfg.seed, cfg.device, cfg.out_dir) == (3, "cpu", "x")
    assert cfg.ds_config["zero_optimization"]["stage"] == 2
    assert cli_trial.build_config(_args("s.json"), None, "ab" * 32).out_dir.startswith(os.path.join("runs", "trials", "abab"))


@pytest.mark.parametrize("content, message", [
    (None, "spec: no such file"),
    ("{not json", "is not valid JSON"),
    ('{"vocab_size": 8, "d_model": 16, "layers": [{"block": "mamba9"}]}', "layers[0].block: unknown block"),
    ('{"vocab_size": 8, "d_model": 16, "layers": [], "colour": 1}', "colour: unknown spec field"),
    ("[1, 2]", "must hold a JSON object"),
])
def test_bad_spec_files_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "spec.json"
    if content is not None:
        path.write_text(content)
    assert main(["trial", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_options_are_one_line_errors(tmp_path, capsys):
    assert main(["trial", str(EXAMPLE), "--tokens", "0", "--out", str(tmp_path)]) == 2
    assert "train.tokens: must" in capsys.readouterr().err
    assert main(["trial", str(EXAMPLE), "--task-param", "novalue", "--out", str(tmp_path)]) == 2
    assert "--task-param: must be KEY=VALUE" in capsys.readouterr().err


def test_table_renders_a_record_without_results():
    from rich.console import Console

    rec = record.failure_record({"vocab_size": 8}, "oom", "OutOfMemoryError: CUDA out of memory", spec_hash="f" * 64)
    console = Console(width=160, record=True)
    console.print(cli_trial.summary_table(rec, "r.json", "?"))
    text = console.export_text()
    assert "oom" in text and "CUDA out of memory" in text and "params" in text


@pytest.mark.parametrize("content, message", [
    ("[1]", "config: must be a mapping, got list"),
    ('{"measure": "x"}', "measure: must be a mapping, got str"),
    ('{"train": [1]}', "train: must be a mapping, got list"),
    ('{"task_params": [1]}', "task_params: must be a mapping, got list"),
])
def test_bad_config_files_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "cfg.json"
    path.write_text(content)
    assert main(["trial", str(EXAMPLE), "--config", str(path), "--no-throughput", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
