"""One trial end to end: build the candidate, train it, evaluate, measure, write the result record.

In a study every trial runs as its own process group (``launch.process``)::

    python -m archsearch.trial --spec SPEC.json --config CFG.json --out RECORD.json

alone (world size 1: the missing RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT are filled in)
or under DeepSpeed's launcher (several ranks: all train, rank 0 evaluates, measures and writes the
record, then every rank leaves through ``os._exit`` after a barrier, because ZeRO-2/3 processes
can abort in interpreter teardown after finishing). In-process, ``run_trial(spec, cfg)`` does the
same and returns the record; ``archsearch trial SPEC.json`` is its command-line face.
"""
from __future__ import annotations

import time

_T_START = time.perf_counter()  # before the heavy imports, to time them

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator, Mapping  # noqa: E402

from archsearch.errors import UserError  # noqa: E402
from archsearch.measure import MeasureConfig  # noqa: E402  (re-exported: the interface lives here)
from archsearch.train import TrainConfig, ensure_extensions_dir  # noqa: E402

__all__ = ["TrialConfig", "TrainConfig", "MeasureConfig", "run_trial", "main"]

DEVICES = ("auto", "cpu", "cuda")


@dataclasses.dataclass
class TrialConfig:
    """Everything about a trial except the architecture: task, budgets, measurement, placement.

    ds_config: a DeepSpeed config merged over the trial's defaults (launch/ supplies ZeRO configs);
    the global batch stays ``train.batch_size`` whatever the world size.
    """

    task: str = "mqar"
    task_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    measure: MeasureConfig = dataclasses.field(default_factory=MeasureConfig)
    seed: int = 0
    device: str = "auto"
    out_dir: str = "runs/trial"
    ds_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.train, TrainConfig):
            self.train = TrainConfig.from_dict(self.train)
        if not isinstance(self.measure, MeasureConfig):
            self.measure = MeasureConfig.from_dict(self.measure)
        if not isinstance(self.task, str) or not self.task:
            raise UserError(f"task: must be a task name, got {self.task!r}")
        if not isinstance(self.task_params, Mapping):
            raise UserError(f"task_params: must be a mapping, got {type(self.task_params).__name__}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UserError(f"seed: must be an integer >= 0, got {self.seed!r}")
        if self.device not in DEVICES:
            raise UserError(f"device: must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if not isinstance(self.out_dir, (str, os.PathLike)) or not str(self.out_dir):
            raise UserError(f"out_dir: must be a directory path, got {self.out_dir!r}")
        self.out_dir = str(self.out_dir)
        if self.ds_config is not None and not isinstance(self.ds_config, Mapping):
            raise UserError(f"ds_config: must be a mapping or null, got {type(self.ds_config).__name__}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrialConfig":
        if not isinstance(d, Mapping):
            raise UserError(f"config: must be a mapping, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in d:
            if key not in known:
                raise UserError(f"{key}: unknown trial config field; known fields: {', '.join(sorted(known))}")
        return cls(**dict(d))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "TrialConfig":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"config JSON: {exc}") from None
        return cls.from_dict(d)


# --- environment ---------------------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (the OS picks; racy only against other pickers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fill_lone_env() -> list[str]:
    """Set the rendezvous variables missing from the environment for a world of one; their names."""
    defaults = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    added = []
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if key not in os.environ:
            os.environ[key] = defaults[key] if key in defaults else str(free_port())
            added.append(key)
    return added


@contextlib.contextmanager
def lone_process_env() -> Iterator[None]:
    """Fill in the rendezvous variables a lone process lacks (RANK=0, WORLD_SIZE=1, LOCAL_RANK=0,
    MASTER_ADDR=127.0.0.1, a free MASTER_PORT); variables already set (a launcher) are kept.
    Those filled in are removed again on exit, so an in-process trial leaves the environment as it
    found it (a later subprocess must not inherit a stale MASTER_PORT)."""
    added = _fill_lone_env()
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


# --- one trial --------------------------------------------------------------------------------------------
def _load_task(cfg: TrialConfig, spec: Any) -> Any:
    from archsearch import tasks

    task = tasks.build(cfg.task, **dict(cfg.task_params))
    if spec.vocab_size < task.vocab_size:
        raise UserError(f"vocab_size: the spec's vocabulary ({spec.vocab_size}) is smaller than task "
                        f"{cfg.task}'s ({task.vocab_size})")
    return task


def _analytic_model(spec: Any) -> Any:
    """An untrained model for the analytic numbers (params, FLOPs, state bytes) of a trial that has
    no trained model: built on the meta device, so even a model that ran out of memory costs nothing."""
    import torch

    from archsearch.model import HybridLM

    try:
        with torch.device("meta"):
            return HybridLM(spec)
    except Exception:  # a block whose construction needs real tensors
        return HybridLM(spec)


def _task_section(task: Any) -> dict[str, Any]:
    return {"name": task.name, "params": dict(task.params), "vocab_size": task.vocab_size, "seq_len": task.seq_len}


def run_trial(spec: Any, cfg: TrialConfig, record_path: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """Train, evaluate and measure ``spec`` under ``cfg``; write and return the result record.

    Every rank of the process group calls this; rank 0 returns the record (also written to
    ``record_path``, default ``<out_dir>/record.json``), other ranks return None. Bad input (spec,
    task parameters, config) raises UserError before any training. A failure during the trial
    (divergence, out of memory, interruption, or a bug) is recorded as the status, not raised.
    """
    from archsearch import record as rec_mod
    from archsearch.model import HybridLM
    from archsearch.train import setup_distributed, train

    t_total = time.perf_counter()
    timings: dict[str, float] = {}
    spec.validate()
    task = _load_task(cfg, spec)
    out_dir = Path(cfg.out_dir)
    record_path = Path(record_path) if record_path is not None else out_dir / "record.json"
    timings["prepare"] = time.perf_counter() - t_total

    with lone_process_env():
        t = time.perf_counter()
        dist = setup_distributed(cfg.device)
        timings["init_distributed"] = time.perf_counter() - t
        notes: list[str] = []
        status, reason = "ok", ""
        result = None
        try:
            result = train(lambda: HybridLM(spec), task, cfg.train, seed=cfg.seed, dist=dist,
                           out_dir=out_dir if dist.is_main else None, ds_config=cfg.ds_config,
                           spec_text=spec.to_json(indent=2))
            status, reason = result.status, result.reason
            notes += result.notes
            timings.update(result.timings)
        except KeyboardInterrupt:
            status, reason = "interrupted", "interrupted before training finished"
        except UserError:
            raise
        except Exception as exc:
            status, reason = "failed", _failure(exc, out_dir if dist.is_main else None)
        if not dist.is_main:
            return None

        t = time.perf_counter()
        m, status, reason = _measurements(spec, cfg, result, status, reason, dist.device, notes, out_dir)
        timings["measure"] = time.perf_counter() - t
        timings["run_trial"] = time.perf_counter() - t_total

        train_section = result.section() if result is not None else rec_mod.empty_train(dist.world_size)
        versions = rec_mod.library_versions()
        versions["torch_extensions_dir"] = os.environ.get("TORCH_EXTENSIONS_DIR")
        record = rec_mod.build(
            spec=spec.to_dict(), spec_hash=spec.hash, status=status, reason=reason, notes=notes,
            task=_task_section(task), metrics=result.eval_metrics if result is not None else {},
            metric_directions=dict(task.metrics), params=m.get("params"),
            flops_per_token=m.get("flops_per_token"),
            decode_memory=m.get("decode_memory") or rec_mod.empty_decode_memory(cfg.measure.context, cfg.measure.batch),
            throughput=m.get("throughput") or rec_mod.empty_throughput(cfg.measure.batch, cfg.measure.prefill_len),
            train=train_section, config=cfg.to_dict(), timings=timings, versions=versions,
        )
        rec_mod.write(record, record_path)
        return record


def _measurements(spec: Any, cfg: TrialConfig, result: Any, status: str, reason: str, device: Any,
                  notes: list[str], out_dir: Path) -> tuple[dict[str, Any], str, str]:
    """Params, FLOPs, decode memory, throughput of the trained model; for a trial without one
    (diverged, oom, ...) the analytic numbers of an untrained copy. Returns (m, status, reason)."""
    import torch

    from archsearch.measure import analytic, measure

    try:
        if status == "ok" and result is not None and result.model is not None:
            m = measure(result.model, cfg.measure, device)
            check = m["throughput"].get("held_check")
            if check and not check["match"]:
                notes.append(f"analytic state bytes {check['analytic_bytes']} != held {check['held_bytes']} "
                             f"after a real prefill of {check['context']} tokens")
            return m, status, reason
        dtype = torch.bfloat16 if result is not None and result.precision == "bf16" else torch.float32
        return analytic(_analytic_model(spec), cfg.measure, f"trial status {status}", dtype), status, reason
    except Exception as exc:  # a measurement bug must not lose the training result
        if status == "ok":
            status, reason = "failed", "measurement: " + _failure(exc, out_dir)
        return {"params": None, "flops_per_token": None}, status, reason


def _failure(exc: BaseException, out_dir: Path | None) -> str:
    """One line for the record; the full traceback to stderr and ``<out_dir>/traceback.txt``."""
    from archsearch.train import first_line

    text = "".join(traceback.format_exception(exc))
    print(text, file=sys.stderr, end="")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "traceback.txt").write_text(text, encoding="utf-8")
    return first_line(exc)


# --- process entry point ---------------------------------------------------------------------------------
def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m archsearch.trial", description=__doc__.split("\n")[0])
    p.add_argument("--spec", required=True, help="ArchSpec JSON file")
    p.add_argument("--config", required=True, help="TrialConfig JSON file")
    p.add_argument("--out", required=True, help="where rank 0 writes the result record (JSON)")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # old-style launchers
    return p.parse_args(argv)


def read_json(path: str, what: str) -> Any:
    """The JSON in ``path``; a missing, unreadable or malformed file is a UserError naming ``what``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what}: no such file: {path}") from None
    except OSError as exc:
        raise UserError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{what}: {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None


def _sigterm(signum: int, frame: Any) -> None:
    # Turned into KeyboardInterrupt so training stops where it is and the record says "interrupted".
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of a trial process; never returns (``os._exit``) so ZeRO teardown cannot abort it."""
    args = _parse(argv)
    _fill_lone_env()  # kept for the process's lifetime (unlike lone_process_env)
    signal.signal(signal.SIGTERM, _sigterm)
    rank = int(os.environ["RANK"])
    code = 0
    spec_dict = None
    cfg_dict = None
    try:
        from archsearch.spec import ArchSpec

        spec_dict = read_json(args.spec, "spec")
        cfg_dict = read_json(args.config, "config")
        spec = ArchSpec.from_dict(spec_dict)
        cfg = TrialConfig.from_dict(cfg_dict)
        t_imports = time.perf_counter() - _T_START
        rec = run_trial(spec, cfg, args.out)
        if rec is not None:
            rec["timings"]["imports_and_config"] = t_imports
            rec["timings"]["process_total"] = time.perf_counter() - _T_START
            from archsearch.record import write

            write(rec, args.out)
            code = {"ok": 0, "diverged": 0, "oom": 0, "interrupted": 130}.get(rec["status"], 1)
            metrics = ", ".join(f"{k}={v:.4g}" for k, v in rec["metrics"].items())
            print(f"archsearch.trial: {rec['status']}{': ' + rec['reason'] if rec['reason'] else ''} "
                  f"({rec['train']['steps']} steps, {rec['timings']['process_total']:.1f} s{', ' + metrics if metrics else ''})"
                  f" -> {args.out}")
    except UserError as exc:
        print(f"archsearch.trial: error: {exc}", file=sys.stderr)
        code = 2
        if rank == 0:
            _write_failure(spec_dict, cfg_dict, "failed", str(exc), args.out)
    except KeyboardInterrupt:
        code = 130
        if rank == 0:
            _write_failure(spec_dict, cfg_dict, "interrupted", "interrupted (SIGTERM or Ctrl-C) before the record was written", args.out)
    except BaseException as exc:  # a bug: traceback to the log, a record that says so
        traceback.print_exc()
        code = 1
        if rank == 0:
            from archsearch.train import first_line

            _write_failure(spec_dict, cfg_dict, "failed", first_line(exc), args.out)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _leave(code)
    return code  # pragma: no cover - _leave does not return


def _write_failure(spec: Any, cfg: Any, status: str, reason: str, out: str) -> None:
    from archsearch.record import failure_record, write

    try:
        spec = spec if isinstance(spec, dict) else {}
        write(failure_record(spec, status, reason, config=cfg if isinstance(cfg, dict) else None), out)
    except Exception:  # the record is best effort here; the exit code and log still tell
        traceback.print_exc()


def _leave(code: int) -> None:
    """Barrier with the other ranks (if a group exists), then exit without interpreter teardown."""
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
            tdist.barrier()
    except Exception:
        pass
    os._exit(code)


if __name__ == "__main__":
    main()
