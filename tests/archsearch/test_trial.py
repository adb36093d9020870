"""archsearch.trial and archsearch.record: one trial end to end, in process and as a process
(alone, and as two gloo ranks under DeepSpeed's launcher), and the record it leaves."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from archsearch import record
from archsearch.errors import UserError
from archsearch.spec import ArchSpec
from archsearch.trial import MeasureConfig, TrainConfig, TrialConfig, lone_process_env, run_trial

ROOT = Path(__file__).resolve().parents[2]
SPEC = ArchSpec.from_dict({
    "vocab_size": 32, "d_model": 32,
    "layers": [{"block": "gated_deltanet", "config": {"num_heads": 2}},
               {"block": "softmax", "config": {"num_heads": 2}}],
})
TASK = dict(vocab_size=32, seq_len=16, num_kv_pairs=2, num_train_examples=1024, num_test_examples=64)

# The keys docs/internals.md promises (the study and the Pareto report read these).
RECORD_KEYS = {"spec", "spec_hash", "status", "reason", "metrics", "params", "flops_per_token",
               "decode_memory", "throughput", "train", "timings", "versions"}


def _config(out_dir, **train) -> TrialConfig:
    train = {"tokens": 8 * 16 * 16, "batch_size": 16, "lr": 1e-2, "max_seconds": 60, **train}
    return TrialConfig(task="mqar", task_params=dict(TASK), train=TrainConfig(**train),
                       measure=MeasureConfig(context=8192, batch=2, prefill_len=8, repeats=1, decode_steps=2),
                       seed=0, device="cpu", out_dir=str(out_dir))


@pytest.fixture(scope="module")
def ok_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("trial")
    return run_trial(SPEC, _config(out)), out


def test_run_trial_records_every_ingredient(ok_record):
    rec, out = ok_record
    assert rec["status"] == "ok", rec["reason"]
    assert RECORD_KEYS <= set(rec)
    assert rec["spec"] == SPEC.to_dict() and rec["spec_hash"] == SPEC.hash
    assert set(rec["metrics"]) == {"accuracy", "loss"} and rec["metric_directions"]["accuracy"] == "maximize"
    mem = rec["decode_memory"]
    assert {"context", "batch", "dtype", "analytic_bytes", "measured_peak_bytes", "gap_note"} <= set(mem)
    assert (mem["context"], mem["batch"], mem["dtype"]) == (8192, 2, "float32")
    assert mem["analytic_bytes"] > 0 and mem["measured_peak_bytes"] is None and mem["gap_note"]
    tp = rec["throughput"]
    assert tp["decode_tokens_per_s"] > 0 and tp["prefill_tokens_per_s"] > 0 and tp["device"]
    assert tp["held_check"]["match"]
    tr = rec["train"]
    assert (tr["steps"], tr["tokens"], tr["world_size"], tr["global_batch"]) == (8, 8 * 16 * 16, 1, 16)
    assert Path(tr["curve_path"]).is_file() and Path(tr["tensorboard_dir"]).is_dir()
    assert rec["params"] > 0 and rec["flops_per_token"] > 0
    assert {"init_distributed", "deepspeed_initialize", "train_loop", "measure", "run_trial"} <= set(rec["timings"])
    assert rec["versions"]["torch"] and rec["versions"]["deepspeed"]
    assert TrialConfig.from_dict(rec["config"]).to_dict() == rec["config"]
    assert record.read(out / "record.json") == rec


def test_record_round_trips_json(ok_record, tmp_path):
    rec, _ = ok_record
    path = record.write(rec, tmp_path / "sub" / "r.json")
    assert record.read(path) == rec
    assert json.loads(path.read_text()) == rec
    assert not [p for p in path.parent.iterdir() if p.name != "r.json"]  # no temp files left


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("throughput"), "record.throughput: required"),
    (lambda r: r["decode_memory"].pop("analytic_bytes"), "record.decode_memory.analytic_bytes: required"),
    (lambda r: r["train"].pop("curve_path"), "record.train.curve_path: required"),
    (lambda r: r.update(status="great"), "record.status: must be one of"),
    (lambda r: r.update(status="failed", reason=""), "record.reason"),
    (lambda r: r["train"].update(final_loss=float("nan")), "record.train.final_loss: must be a finite"),
    (lambda r: r.update(params="many"), "record.params: must be int or null"),
])
def test_record_validation_names_the_key(ok_record, mutate, message):
    rec = json.loads(json.dumps(ok_record[0]))
    mutate(rec)
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        record.validate(rec)


def test_reading_a_torn_or_missing_record_is_a_user_error(tmp_path):
    (tmp_path / "torn.json").write_text('{"spec": {')
    with pytest.raises(UserError, match="not a JSON record"):
        record.read(tmp_path / "torn.json")
    with pytest.raises(UserError, match="cannot read record"):
        record.read(tmp_path / "missing.json")


def test_failure_record_is_a_valid_record():
    rec = record.failure_record({"vocab_size": 4}, "timeout", "killed after 600 s")
    record.validate(rec)
    assert rec["status"] == "timeout" and rec["train"]["steps"] == 0 and rec["metrics"] == {}


def test_diverged_trial_still_records_the_analytic_numbers(tmp_path):
    rec = run_trial(SPEC, _config(tmp_path, lr=1e6, warmup_frac=0.0, grad_clip=0.0, tokens=100 * 16 * 16))
    assert rec["status"] == "diverged" and "non-finite" in rec["reason"]
    assert rec["metrics"] == {} and rec["train"]["steps"] < 100
    assert rec["params"] > 0 and rec["decode_memory"]["analytic_bytes"] > 0
    assert rec["throughput"]["decode_tokens_per_s"] is None
    assert "diverged" in rec["decode_memory"]["gap_note"]


def test_bad_input_is_refused_before_training(tmp_path):
    with pytest.raises(UserError, match="mqar.num_kv_pairs"):
        run_trial(SPEC, TrialConfig(task="mqar", task_params={"num_kv_pairs": -1}, device="cpu", out_dir=str(tmp_path)))
    with pytest.raises(UserError, match="vocab_size: the spec's vocabulary"):
        run_trial(SPEC, TrialConfig(task="mqar", task_params={"vocab_size": 64, "seq_len": 16, "num_kv_pairs": 2}, device="cpu",
                                    out_dir=str(tmp_path)))
    with pytest.raises(UserError, match="train.lr: must"):
        TrialConfig.from_dict({"train": {"lr": -1}})
    with pytest.raises(UserError, match="train: must be a mapping, got str"):
        TrialConfig.from_dict({"train": "fast"})
    with pytest.raises(UserError, match="measure: must be a mapping, got list"):
        TrialConfig.from_dict({"measure": [1]})
    with pytest.raises(UserError, match="device: must"):
        TrialConfig(device="tpu")
    assert not (tmp_path / "record.json").exists()


def test_lone_process_env_fills_in_and_restores(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    with lone_process_env():
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("0", "1", "0")
        assert os.environ["MASTER_ADDR"] == "10.0.0.1" and int(os.environ["MASTER_PORT"]) > 0
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ
    assert os.environ["MASTER_ADDR"] == "10.0.0.1"


def test_extensions_dir_is_pinned_with_the_interpreters_ninja(monkeypatch, tmp_path):
    from archsearch.trial import ensure_extensions_dir

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    path = ensure_extensions_dir()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == path
    assert "archsearch" in path and Path(path).name.startswith(f"py{sys.version_info.major}{sys.version_info.minor}_")
    assert ensure_extensions_dir() == path  # stable: same environment, same directory
    bindir = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(bindir, "ninja")):
        assert os.environ["PATH"].split(os.pathsep)[0] == bindir
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # a user's choice is kept
    assert ensure_extensions_dir() == str(tmp_path)


# --- the process entry point ---------------------------------------------------------------------------
def _files(tmp_path, cfg: TrialConfig):
    spec_path, cfg_path = tmp_path / "spec.json", tmp_path / "cfg.json"
    spec_path.write_text(SPEC.to_json())
    cfg_path.write_text(cfg.to_json())
    return spec_path, cfg_path, tmp_path / "record.json"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))
    return env


def test_process_entry_point_alone_writes_the_record(tmp_path):
    spec_path, cfg_path, out = _files(tmp_path, _config(tmp_path / "run"))
    proc = subprocess.run([sys.executable, "-m", "archsearch.trial", "--spec", spec_path, "--config", cfg_path,
                           "--out", out], env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = record.read(out)
    assert rec["status"] == "ok" and rec["train"]["world_size"] == 1
    assert rec["timings"]["process_total"] >= rec["timings"]["run_trial"] > 0


def test_process_entry_point_writes_a_failed_record_for_bad_input(tmp_path):
    spec_path, cfg_path, out = _files(tmp_path, _config(tmp_path / "run"))
    cfg_path.write_text('{"task": "mqar", "train": {"tokens": -5}}')
    proc = subprocess.run([sys.executable, "-m", "archsearch.trial", "--spec", spec_path, "--config", cfg_path,
                           "--out", out], env=_clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "train.tokens: must" in proc.stderr and "Traceback" not in proc.stderr
    rec = record.read(out)
    assert rec["status"] == "failed" and "train.tokens" in rec["reason"]


def test_sigterm_ends_the_trial_as_interrupted_with_a_record(tmp_path):
    import signal
    import time

    spec_path, cfg_path, out = _files(tmp_path, _config(tmp_path / "run", tokens=10**9, max_seconds=600))
    proc = subprocess.Popen([sys.executable, "-m", "archsearch.trial", "--spec", spec_path, "--config", cfg_path,
                             "--out", out], env=_clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    curve = tmp_path / "run" / "curve.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if curve.exists() and len(curve.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    rec = record.read(out)
    assert rec["status"] == "interrupted" and rec["train"]["steps"] >= 2
    assert rec["params"] > 0 and rec["decode_memory"]["analytic_bytes"] > 0


@pytest.mark.slow
def test_two_gloo_ranks_under_the_deepspeed_launcher_keep_the_global_batch(tmp_path, ok_record):
    """World size 2 on CPU: each rank gets half the global batch, the step count and tokens stay."""
    from archsearch.trial import free_port

    spec_path, cfg_path, out = _files(tmp_path, _config(tmp_path / "run"))
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           "--no_local_rank", "--module", "archsearch.trial",
           "--spec", str(spec_path), "--config", str(cfg_path), "--out", str(out)]
    proc = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rec, one = record.read(out), ok_record[0]
    assert rec["status"] == "ok"
    assert rec["train"]["world_size"] == 2 and one["train"]["world_size"] == 1
    assert rec["train"]["global_batch"] == one["train"]["global_batch"] == 16
    assert rec["train"]["micro_batch"] == 8 and one["train"]["micro_batch"] == 16
    assert rec["train"]["steps"] == one["train"]["steps"] and rec["train"]["tokens"] == one["train"]["tokens"]


def test_one_rank_out_of_memory_ends_the_whole_group_at_once(tmp_path):
    """Rank 1 of 2 runs out of memory in its second optimizer step (``oom_shim``) while rank 0
    goes on into the next step's collectives. The OOM rank leaves at once with ``EXIT_OOM``, the
    launcher ends rank 0 (or rank 0's collective fails first), and the log makes the candidate
    infeasible. Before, both ranks waited for each other until the trial timeout (here: the
    subprocess timeout)."""
    from archsearch.train import EXIT_OOM, OOM_EXIT_LINE
    from archsearch.trial import free_port
    from launch import faults

    spec_path, cfg_path, out = _files(tmp_path, _config(tmp_path / "run", tokens=8 * 16 * 16 * 4))
    env = _clean_env()
    env.update(PYTHONPATH=os.pathsep.join([str(Path(__file__).parent / "oom_shim"), str(ROOT)]),
               ARCHSEARCH_TEST_OOM_RANK="1")
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           "--no_local_rank", "--module", "archsearch.trial",
           "--spec", str(spec_path), "--config", str(cfg_path), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    log = proc.stdout + proc.stderr
    # EXIT_OOM when the launcher ends rank 0 first; 1 when gloo already told rank 0 that its peer
    # went away (rank 0 then records a failure, which the log's OOM line overrides below)
    assert proc.returncode in (EXIT_OOM, 1), log[-3000:]
    assert OOM_EXIT_LINE.format(rank=1, world_size=2) + ": OutOfMemoryError: CUDA out of memory" in log, log[-3000:]
    rec = record.read(out) if out.exists() else None
    assert faults.classify(proc.returncode, rec, log, timed_out=False) == ("infeasible", "oom")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_trial_trains_in_bf16_and_measures_peak_memory(tmp_path):
    cfg = _config(tmp_path)
    cfg.device = "cuda"
    rec = run_trial(SPEC, cfg)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["train"]["precision"] == "bf16" and rec["decode_memory"]["dtype"] == "bfloat16"
    mem = rec["decode_memory"]
    assert mem["measured_peak_bytes"] > 0
    assert mem["measured_state_tensor_bytes"] == mem["analytic_bytes"]
    assert rec["throughput"]["device"] == torch.cuda.get_device_name()
