"""The study loop: ask Optuna, check the candidate, train it on a free slot, tell Optuna.

    study = open_study(space, storage_url=None)          # ./studies/<name>/journal.log by default
    run_study(space, study, slots=plan_slots([], 1, 1))   # resumes toward space.study.trials

For each candidate (an ``optuna.Trial``):

1. ``search_spaces.suggest`` turns the trial's parameters into an ``ArchSpec``.
2. Constraints checkable from the spec (parameters, decode-state bytes, softmax share) are
   evaluated on the meta device. A violator is told at once as COMPLETE with dominated values and
   positive constraint values (``archsearch.objectives``), user attr ``status=infeasible``: it
   costs no training, and samplers learn to avoid it.
3. A spec whose hash already has a result (user attr ``spec_hash`` on a COMPLETE trial) reuses it
   (``reused_from``); a spec being trained right now by this process waits for that result.
4. Otherwise the candidate trains in its own process group (``launch.process.start_trial``), once
   per task its quality objectives need; a crash, OOM or hang ends only that group.
   ``launch.faults`` classifies the outcome: ok -> COMPLETE with values; infeasible (OOM) ->
   COMPLETE, infeasible; failed -> FAIL with the reason.

The trial budget is shared by every process working on the study (``launch.budget``: exactly
``trials`` COMPLETE trials; FAILed ones are retried with new candidates). Ctrl-C kills the running
trials, marks them FAIL with reason ``interrupted`` and stops; running the same command again
resumes (the candidates of interrupted trials are asked again by the sampler as it sees fit).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from archsearch import objectives as obj
from archsearch.errors import UserError
from search_spaces.sampling import suggest
from search_spaces.schema import Space

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path("studies")
JOURNAL_NAME = "journal.log"
MAX_CONSECUTIVE_FAILURES = 5  # then stop: something is wrong with every candidate, not one

# user attrs of every trial
STATUS, REASON, SPEC, SPEC_HASH, STACK = "status", "reason", "spec", "spec_hash", "stack"
REUSED_FROM, RUN_DIR, FACTS, RECORDS, VIOLATED = "reused_from", "run_dir", "facts", "records", "violated"
SPACE_ATTR = "space"
# parts of a space that may change between runs of one study without changing what it searches
_RESUMABLE = {("study", "trials"), ("study", "name"), ("study", "storage")}


# ---- storage -------------------------------------------------------------------------------
def check_study_name(name: Any, field: str = "study name") -> None:
    """A study name becomes the directory ``root/NAME``: ``../x`` or ``a/b`` would leave the root."""
    from search_spaces.validate import name_error

    why = name_error(name)
    if why:
        raise UserError(f"{field}: {why}, got {name!r}")


def journal_path(study_name: str, root: Path = DEFAULT_ROOT) -> Path:
    check_study_name(study_name)
    return Path(root) / study_name / JOURNAL_NAME


def open_storage(url: str | None, study_name: str, root: Path = DEFAULT_ROOT, create: bool = True):
    """An Optuna storage for ``url``: None (a journal file under ``root/NAME/``), a journal path
    ending ``.log``/``.journal``, or an RDB URL (``sqlite:///...``, ``postgresql://...``,
    ``mysql://...``, opened with heartbeats so dead workers' trials can be reaped).
    Anything else, or a storage that cannot be opened, is a one-line UserError."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    if url is None or ("://" not in url and url.endswith((".log", ".journal"))):
        path = journal_path(study_name, root) if url is None else Path(url)
        if not create and not path.exists():
            raise UserError(f"no study {study_name!r}: {path} does not exist"
                            + (f" (studies here: {', '.join(list_local_studies(root)) or 'none'})" if url is None else ""))
        if create and url is None:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            raise UserError(f"--storage {url}: cannot open the journal file: directory {path.parent} does not exist")
        _check_journal_file(path)
        try:
            return JournalStorage(JournalFileBackend(str(path)))
        except OSError as exc:
            raise UserError(f"--storage {path}: cannot open the journal file: {exc.strerror or exc}") from None
        except (ValueError, KeyError) as exc:  # a later line is not a journal entry (JSONDecodeError, no op_code)
            raise UserError(f"--storage {path}: not an Optuna journal file ({type(exc).__name__}: {exc})") from None
    if url.split("://", 1)[0].split("+", 1)[0] in ("sqlite", "postgresql", "postgres", "mysql"):
        from launch.reaper import make_heartbeat_storage

        try:
            return make_heartbeat_storage(url)
        except ImportError as exc:
            raise UserError(f"--storage {url}: database driver missing ({exc.name}); "
                            "pip install 'archsearch[postgres]' for PostgreSQL") from None
        except Exception as exc:  # SQLAlchemy/driver errors: connection refused, bad path, auth
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"--storage {url}: cannot open: {first}") from None
    raise UserError(f"--storage: must be sqlite:///FILE, postgresql://..., mysql://... or a journal "
                    f"file path ending .log or .journal, got {url!r}")


def _check_journal_file(path: Path) -> None:
    """Refuse an existing non-empty file whose first line is not an Optuna journal entry before
    Optuna appends to it (``--storage train.log`` pointing at someone's log)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        first = f.readline(1 << 16)
    try:
        entry = json.loads(first)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        entry = None
    if not (isinstance(entry, dict) and "op_code" in entry):
        raise UserError(f"--storage {path}: not an Optuna journal file (its first line is not a journal entry)")


def list_local_studies(root: Path = DEFAULT_ROOT) -> list[str]:
    root = Path(root)
    return sorted(p.parent.name for p in root.glob(f"*/{JOURNAL_NAME}")) if root.is_dir() else []


def load_study(study_name: str | None, storage_url: str | None, root: Path = DEFAULT_ROOT) -> optuna.Study:
    """An existing study: a name under ``root`` (its journal), or ``--storage URL --study NAME``."""
    if study_name is None:
        if storage_url is None:
            raise UserError("name a study (STUDY, or --storage URL --study NAME)")
        names = optuna.study.get_all_study_names(open_storage(storage_url, "", root, create=False))
        if len(names) != 1:
            raise UserError(f"--study: the storage holds {len(names)} studies ({', '.join(names) or 'none'}); name one")
        study_name = names[0]
    storage = open_storage(storage_url, study_name, root, create=False)
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        names = optuna.study.get_all_study_names(storage)
        raise UserError(f"no study {study_name!r} in the storage (it holds: {', '.join(names) or 'none'})") from None


def stored_space(study: optuna.Study) -> Space | None:
    d = study.user_attrs.get(SPACE_ATTR)
    return None if d is None else Space.from_dict(d)


# ---- study creation and resume --------------------------------------------------------------
def make_sampler(space: Space) -> optuna.samplers.BaseSampler:
    from search_spaces.validate import sampler_class

    cls = sampler_class(space.sampler.name)
    opts = dict(space.sampler.options)
    if space.sampler.name == "grid":
        return _AskTellGridSampler(search_space=grid_search_space(space), seed=space.study.seed, **opts)
    return cls(seed=space.study.seed, **opts)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler for an ask/tell loop. Optuna's calls ``study.stop()`` once the grid is
    exhausted, which raises outside ``study.optimize``; here the trial budget ends the study, and
    trials past the grid repeat grid points whose results the spec-hash lookup reuses for free."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def grid_search_space(space: Space) -> dict[str, list[Any]]:
    """Every Optuna parameter the space can ask, with all its values (the grid sampler needs them up front)."""
    from search_spaces.sampling import _Replay, spec_dict

    class _Collect(_Replay):
        def __init__(self):
            super().__init__([])
            self.grid: dict[str, list[Any]] = {}

        def suggest_categorical(self, name, choices):
            self.grid[name] = list(choices)
            return super().suggest_categorical(name, choices)

        def suggest_int(self, name, low, high, step=1, log=False):
            self.grid[name] = list(range(low, high + 1, step))
            return super().suggest_int(name, low, high, step, log)

        def suggest_float(self, name, low, high, step=None, log=False):
            self.grid[name] = [low + i * step for i in range(int(round((high - low) / step)) + 1)]
            return super().suggest_float(name, low, high, step, log)

    grid: dict[str, list[Any]] = {}
    depths = space.model.depth.values()
    for i, _ in enumerate(depths):  # the deepest stacks ask the most layer_i parameters
        c = _Collect()
        c.path = [i] if len(depths) > 1 else []
        spec_dict(space, c)
        grid.update(c.grid)
    return grid


def _flat(d: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    if isinstance(d, dict):
        out: dict[tuple, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, prefix + (k,)))
        return out or {prefix: {}}
    return {prefix: d}


def space_changes(old: dict, new: dict) -> list[str]:
    """Paths whose value differs between two space dicts (ignoring trials, name, storage)."""
    a, b = _flat(old), _flat(new)
    out = []
    for key in sorted(set(a) | set(b), key=str):
        if key in _RESUMABLE or a.get(key, "<unset>") == b.get(key, "<unset>"):
            continue
        path = ".".join(map(str, key))
        out.append(f"{path}: {a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r}")
    return out


def open_study(space: Space, storage_url: str | None = None, study_name: str | None = None,
               root: Path = DEFAULT_ROOT) -> optuna.Study:
    """Create the study, or load it to resume; a study made from a different space is an error."""
    name = study_name or space.study_name
    check_study_name(name)
    storage = open_storage(storage_url or space.study.storage, name, root)
    directions = obj.directions(space)
    space_d = json.loads(json.dumps(space.to_dict()))
    existing = name in optuna.study.get_all_study_names(storage)
    if existing:
        study = optuna.load_study(study_name=name, storage=storage, sampler=make_sampler(space))
        old = study.user_attrs.get(SPACE_ATTR)
        if old is not None:
            changes = space_changes(old, space_d)
            if changes:
                raise UserError(f"study {name!r} was created from a different space ({'; '.join(changes[:5])}"
                                f"{'; ...' if len(changes) > 5 else ''}); use another --study name")
        return study
    study = optuna.create_study(study_name=name, storage=storage, directions=directions,
                                sampler=make_sampler(space), load_if_exists=True)
    with warnings.catch_warnings():  # experimental since 3.2 but the way to name objectives
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(obj.metric_names(space))
    study.set_user_attr(SPACE_ATTR, space_d)
    return study


# ---- the loop --------------------------------------------------------------------------------
@dataclasses.dataclass
class _Run:
    """A candidate being trained: its Optuna trial, the runs still to do, the records so far."""

    trial: optuna.Trial
    spec: Any
    facts: obj.StaticFacts
    slot: Any
    trial_dir: Path
    pending: list[tuple[str, dict]]
    records: list[dict] = dataclasses.field(default_factory=list)
    proc: Any = None
    heartbeat: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)
    waiters: list[tuple[optuna.Trial, obj.StaticFacts, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Summary:
    study_name: str
    complete: int
    failed: int
    infeasible: int
    front: int
    trained: int
    seconds: float


def check_slots_fit(space: Space, slots: list) -> None:
    """A space that trains on CUDA cannot run on CPU slots: every trial would fail ("no CUDA GPU
    is visible") until the study stops after 5 in a row. Hostfile slots may have GPUs elsewhere."""
    if space.budget.device == "cuda" and slots and all(s.device == "cpu" and not s.hostfile for s in slots):
        raise UserError("budget.device: cuda, but every slot is a CPU slot (no GPU visible, or --gpus none); "
                        "run where GPUs are, or set budget.device to auto or cpu")


class StudyRunner:
    """Runs one study's loop in this process over ``slots`` (see the module docstring)."""

    def __init__(self, space: Space, study: optuna.Study, slots: list, n_trials: int | None = None,
                 root: Path = DEFAULT_ROOT, progress: bool = True, entry: tuple[str, ...] | None = None,
                 console=None) -> None:
        check_slots_fit(space, slots)
        self.space, self.study, self.slots = space, study, list(slots)
        self.n_trials = n_trials or space.study.trials
        self.dir = Path(root) / study.study_name
        self.progress_on = progress
        self.entry = entry  # the trial program; tests substitute fault-injecting ones
        from search_spaces.sampling import vocab_size

        self.vocab = vocab_size(space)
        self.runs = obj.quality_tasks(space)
        self.running: dict[int, _Run] = {}
        self.trained = 0
        self.failures_in_a_row = 0
        self.last_failure = ""
        self.console = console
        self.stop_requested = False

    # -- telling Optuna ----------------------------------------------------------------------
    def _set_attrs(self, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
        for k, v in attrs.items():
            trial.set_user_attr(k, v)

    def _tell_complete(self, trial, facts, values, status, constraints, extra=None) -> None:
        for k, v in constraints.items():
            trial.set_constraint(k, v)
        self._set_attrs(trial, {STATUS: status, VIOLATED: obj.violated(constraints), **(extra or {})})
        self.study.tell(trial, values=values)

    def _tell_fail(self, trial, status: str, reason: str, extra=None) -> None:
        self._set_attrs(trial, {STATUS: status, REASON: reason, **(extra or {})})
        self.study.tell(trial, state=TrialState.FAIL)

    def _log(self, msg: str) -> None:
        if self.console is not None:
            self.console.print(f"{time.strftime('%H:%M:%S')} {msg}", markup=False, highlight=False)
        else:
            log.info(msg)

    # -- one candidate -------------------------------------------------------------------------
    def _completed_by_hash(self, spec_hash: str):
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get(SPEC_HASH) == spec_hash:
                return t
        return None

    def _prepare(self, trial: optuna.Trial, slot) -> _Run | None:
        """Sample and pre-check a claimed trial; returns a run to start, or None if it was told."""
        from launch.reaper import mark_owner

        mark_owner(self.study, trial)
        from blocks.base import ConfigError

        try:
            spec = suggest(self.space, trial).validate()
            facts = obj.static_facts(self.space, spec)
        except (UserError, ConfigError, ValueError) as exc:  # a combination the blocks reject
            self._tell_fail(trial, "failed", f"invalid spec: {exc}")
            self._failure(trial.number, f"invalid spec: {exc}")
            return None
        self._set_attrs(trial, {SPEC: spec.to_dict(), SPEC_HASH: spec.hash, STACK: spec.stack_string(),
                                FACTS: facts.to_attrs()})
        cons = obj.constraint_values(self.space, facts)
        if obj.violated(cons):
            self._tell_complete(trial, facts, obj.worst_values(self.space, facts, self.vocab), "infeasible", cons,
                                {REASON: "violates " + ", ".join(obj.violated(cons))})
            self._log(f"trial {trial.number}: {spec.stack_string()} infeasible ({', '.join(obj.violated(cons))}); not trained")
            return None
        for r in self.running.values():
            if r.spec.hash == spec.hash:
                r.waiters.append((trial, facts, spec))
                return None
        prev = self._completed_by_hash(spec.hash)
        if prev is not None:
            self._reuse(trial, prev)
            return None
        tdir = self.dir / "trials" / f"{trial.number:05d}"
        tdir.mkdir(parents=True, exist_ok=True)
        (tdir / "spec.json").write_text(spec.to_json(indent=2))
        trial.set_user_attr(RUN_DIR, str(tdir.resolve()))
        return _Run(trial=trial, spec=spec, facts=facts, slot=slot, trial_dir=tdir, pending=list(self.runs))

    def _reuse(self, trial: optuna.Trial, prev) -> None:
        cons = {k: v for k, v in prev.constraints.items()}
        status = prev.user_attrs.get(STATUS, "ok")
        for k, v in cons.items():
            trial.set_constraint(k, v)
        self._set_attrs(trial, {STATUS: status, REUSED_FROM: prev.number, VIOLATED: prev.user_attrs.get(VIOLATED, []),
                                RECORDS: prev.user_attrs.get(RECORDS), RUN_DIR: prev.user_attrs.get(RUN_DIR),
                                REASON: prev.user_attrs.get(REASON, "")})
        self.study.tell(trial, values=list(prev.values))
        self._log(f"trial {trial.number}: same spec as trial {prev.number}; result reused")

    def trial_config(self, run: _Run, task: str, params: dict, out_dir: Path, first: bool) -> dict[str, Any]:
        """The ``--config`` JSON of one trial process (``archsearch.trial.TrialConfig``)."""
        b = self.space.budget
        measure = obj.measure_settings(self.space)
        if not first:
            measure["throughput"] = False  # a second task only adds its quality metric
        device = b.device if b.device != "auto" else run.slot.device
        from launch.dsconfig import ds_config_for_slot

        return {
            "task": task,
            "task_params": params,
            "train": {"tokens": b.tokens, "max_seconds": b.max_seconds, "batch_size": b.batch_size, "lr": b.lr,
                      "warmup_frac": b.warmup_frac, "weight_decay": b.weight_decay, "grad_clip": b.grad_clip,
                      "eval_every": b.eval_every, "precision": b.precision},
            "measure": measure,
            "seed": b.seed,
            "device": device,
            "out_dir": str(out_dir.resolve()),
            "ds_config": ds_config_for_slot(run.slot) if run.slot.num_procs > 1 or run.slot.gpus else None,
        }

    def _start_next(self, run: _Run) -> None:
        from launch.process import start_trial
        from launch.reaper import heartbeat, mark_owner

        i = len(run.records)
        task, params = run.pending[i]
        out = run.trial_dir / f"run{i}-{task}"
        out.mkdir(parents=True, exist_ok=True)
        cfg = self.trial_config(run, task, params, out, first=(i == 0))
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        kw = {"entry": self.entry} if self.entry else {}
        if not run.slot.gpus and os.environ.get("OMP_NUM_THREADS"):
            # launch sizes CPU threads to the cores; a user who set OMP_NUM_THREADS (e.g. 1 on a
            # shared machine, where 2 spinning threads per tiny trial ran ~10x slower) wins.
            kw["env"] = {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}
        b = self.space.budget
        run.proc = start_trial(run.trial_dir / "spec.json", out / "config.json", out / "record.json", run.slot,
                               out / "trial.log", timeout_s=b.max_seconds * 1.5 + 120, **kw)
        mark_owner(self.study, run.trial, run.proc)
        if i == 0:
            run.heartbeat.enter_context(heartbeat(self.study, run.trial))
        self.trained += 1

    def _finish(self, run: _Run) -> bool:
        """Handle a finished process; True when the whole candidate is done (told)."""
        status, reason, rec = run.proc.outcome()
        if rec is not None:
            rec = {k: v for k, v in rec.items() if k not in ("spec", "versions")}
        if status == "ok":
            run.records.append(rec)
            if len(run.records) < len(run.pending):
                self._start_next(run)
                return False
            try:
                values = obj.values(self.space, run.facts, run.records)
            except KeyError as exc:
                status, reason = "failed", f"record incomplete: {exc}"
            else:
                cons = obj.constraint_values(self.space, run.facts)
                self._tell_complete(run.trial, run.facts, values, "ok", cons, {RECORDS: run.records})
                self.failures_in_a_row = 0
                self._log(f"trial {run.trial.number}: {run.spec.stack_string()} " + ", ".join(
                    f"{n}={_fmt(v)}" for n, v in zip(obj.metric_names(self.space), values)))
                self._release(run, "ok")
                return True
        if status == "infeasible":  # ran out of memory: the candidate does not fit this hardware
            cons = obj.constraint_values(self.space, run.facts, runtime_ok=False)
            self._tell_complete(run.trial, run.facts, obj.worst_values(self.space, run.facts, self.vocab),
                                "infeasible", cons, {REASON: reason or "oom", RECORDS: run.records + [rec]})
            self._log(f"trial {run.trial.number}: {run.spec.stack_string()} infeasible ({reason or 'oom'})")
            self._release(run, "infeasible")
            return True
        records = run.records + ([rec] if rec is not None and rec not in run.records else [])
        self._tell_fail(run.trial, "failed", reason, {RECORDS: records, "log": str(run.proc.log_path)})
        self._failure(run.trial.number, f"{reason} (log: {run.proc.log_path})")
        self._release(run, "failed")
        return True

    def _failure(self, number: int, reason: str) -> None:
        self.failures_in_a_row += 1
        self.last_failure = f"trial {number}: {reason}"
        self._log(f"trial {number} failed: {reason}")

    def _release(self, run: _Run, outcome: str) -> None:
        run.heartbeat.close()
        self.running.pop(run.trial.number, None)
        done = self.study._storage.get_trial(run.trial._trial_id)
        for trial, facts, spec in run.waiters:
            if outcome == "failed":
                self._tell_fail(trial, "failed", f"same spec as trial {run.trial.number}, which failed")
            else:
                self._reuse(trial, done)

    def _interrupt(self) -> None:
        for run in list(self.running.values()):
            if run.proc is not None:
                run.proc.kill(grace_s=2.0)
            for t, _, _ in [(run.trial, None, None)] + run.waiters:
                with contextlib.suppress(Exception):
                    self._tell_fail(t, "interrupted", "interrupted")
            run.heartbeat.close()
        self.running.clear()

    # -- driving -----------------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        trials = self.study.get_trials(deepcopy=False)
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        return {
            "complete": len(complete),
            "failed": sum(t.state == TrialState.FAIL for t in trials),
            "infeasible": sum(t.user_attrs.get(STATUS) == "infeasible" for t in complete),
            "front": len(self.study.best_trials) if complete else 0,
        }

    def run(self) -> Summary:
        # Ctrl-C and SIGTERM (a job scheduler, `kill`) only set a flag that the loop checks
        # between steps: an interrupt raised inside a storage write (the journal file's lock)
        # would corrupt that write. A second signal interrupts at once.
        with _deferred_stop(self):
            return self._run()

    def _check_stop(self) -> None:
        if self.stop_requested:
            raise KeyboardInterrupt

    def _run(self) -> Summary:
        from launch.budget import claim_trial
        from launch.reaper import reap_stale_trials

        reap_stale_trials(self.study)
        t0 = time.monotonic()
        with _progress(self.progress_on, self.n_trials, self.console) as bar:
            bar.update(self.counts(), t0)
            free = list(self.slots)
            done_asking = False
            last_reap = time.monotonic()
            try:
                while True:
                    self._check_stop()
                    while free and not done_asking:
                        self._check_stop()
                        if self.failures_in_a_row >= MAX_CONSECUTIVE_FAILURES:
                            done_asking = True
                            break
                        trial, finished = claim_trial(self.study, self.n_trials)
                        if finished:
                            done_asking = True
                        if trial is None:
                            break
                        run = self._prepare(trial, free[0])
                        if run is not None:
                            self.running[trial.number] = run
                            self._start_next(run)
                            free.pop(0)
                        bar.update(self.counts(), t0)
                    if done_asking and not self.running:
                        break
                    changed = False
                    for run in list(self.running.values()):
                        self._check_stop()
                        if run.proc.poll() is not None:
                            if self._finish(run):
                                free.append(run.slot)
                            changed = True
                    if changed:
                        bar.update(self.counts(), t0)
                        continue
                    if not self.running and not done_asking:
                        # budget held by other workers' RUNNING trials: wait, and reap dead ones
                        if time.monotonic() - last_reap > 30:
                            reap_stale_trials(self.study)
                            last_reap = time.monotonic()
                    time.sleep(0.1)
            except KeyboardInterrupt:
                self._interrupt()
                bar.update(self.counts(), t0)
                raise
        c = self.counts()
        if self.failures_in_a_row >= MAX_CONSECUTIVE_FAILURES:
            raise UserError(f"stopped after {self.failures_in_a_row} failed trials in a row; "
                            f"last: {self.last_failure}")
        return Summary(self.study.study_name, c["complete"], c["failed"], c["infeasible"], c["front"],
                       self.trained, time.monotonic() - t0)


@contextlib.contextmanager
def _deferred_stop(runner: "StudyRunner"):
    def handler(signum, frame):
        if runner.stop_requested:
            raise KeyboardInterrupt
        runner.stop_requested = True

    runner.stop_requested = False
    try:
        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


class _progress:
    """A rich progress bar: trials done / failed / infeasible, elapsed time, current front size."""

    def __init__(self, on: bool, total: int, console) -> None:
        self.on, self.total, self.console = on, total, console

    def __enter__(self):
        if self.on:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.p = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), console=self.console,
                              transient=False)
            self.p.__enter__()
            self.task = self.p.add_task("trials", total=self.total, stats="")
        return self

    def update(self, c: dict[str, int], t0: float) -> None:
        if self.on:
            self.p.update(self.task, completed=min(c["complete"], self.total),
                          stats=f"failed {c['failed']}  infeasible {c['infeasible']}  front {c['front']}")

    def __exit__(self, *exc):
        if self.on:
            self.p.__exit__(*exc)
        return False


def run_study(space: Space, *, study_name: str | None = None, storage: str | None = None,
              n_trials: int | None = None, slots: list | None = None, root: Path = DEFAULT_ROOT,
              progress: bool = True, entry: tuple[str, ...] | None = None, console=None) -> Summary:
    """Create or resume the study of ``space`` and run it to ``n_trials`` COMPLETE trials."""
    if slots is None:
        from launch.slots import plan_slots

        slots = plan_slots([], 1, 1)
    check_slots_fit(space, slots)  # before the study is created
    study = open_study(space, storage, study_name, root)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if n_trials:
        # `archsearch worker` without --trials joins toward the count the launch asked for.
        study.set_user_attr("n_trials", int(n_trials))
    return StudyRunner(space, study, slots, n_trials, root, progress, entry, console).run()
