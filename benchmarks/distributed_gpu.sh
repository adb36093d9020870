#!/usr/bin/env bash
# Distributed study on one 2-GPU host (H200 x2): the same small search run two ways, and one
# architecture trained on 1 and on 2 GPUs.
#
#   A  hybrid_lm_small, 2 slots of 1 GPU      (two trials at a time, one GPU each)
#   B  hybrid_lm_small, 1 slot of 2 GPUs      (one trial at a time, data parallel, ZeRO-2, bf16)
#   C  one spec (A's first trained candidate) on 1 GPU
#   D  the same spec on 2 GPUs, ZeRO-2 bf16, same global batch
#
# Prints trials per hour for A and B, final losses and training times for C and D, and writes
# $OUT/distributed_gpu.json (plus every study, log and record under $OUT). Fits in 8 minutes:
# every phase runs under a wall-clock cap and reports what it completed within it.
#
#   OUT=/tmp/out bash benchmarks/distributed_gpu.sh          # from the repository root
#
# Knobs (environment): TRIALS (per phase, 2), TOKENS (training tokens per run, 1000000),
# PHASE_S (cap per study phase, 140), RUN_S (cap per single run, 70).
# SMOKE_CPU=1 runs the same script on a CPU box (tiny models, gloo process groups standing in for
# GPUs, 32k contexts cut to 256) to check its plumbing before spending GPU time.
set -uo pipefail
cd "$(dirname "$0")/.."
T_START=$(date +%s)
OUT=${OUT:-$PWD/bench_out/distributed_gpu}
mkdir -p "$OUT"
TRIALS=${TRIALS:-2}
TOKENS=${TOKENS:-1000000}
PHASE_S=${PHASE_S:-140}
RUN_S=${RUN_S:-70}
PY=${PYTHON:-python3}

. benchmarks/gpu_host_env.sh   # wheels from .whl/ on the GPU host, PYTHONPATH, arch list
export PYTHONUNBUFFERED=1

SMOKE_CPU=${SMOKE_CPU:-0}
if [ "$SMOKE_CPU" = 1 ]; then
  G1=none G2=none            # CPU slots: "gpus per trial" = gloo processes per trial
  TOKENS=${SMOKE_TOKENS:-2048}
else
  G1=0 G2=0,1
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [ "${NGPU:-0}" -lt 2 ]; then
    echo "needs 2 GPUs, found ${NGPU:-0}" >&2; exit 1
  fi
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$OUT/gpus.txt" 2>/dev/null || true

# The benchmark space: hybrid_lm_small with a short training budget and a random sampler, so
# phases A and B train the same candidates in the same order.
$PY benchmarks/bench_space.py "$OUT" hybrid_lm_small_bench "$TOKENS" "$TRIALS" \
  $([ "$SMOKE_CPU" = 1 ] && echo --smoke) || exit 1

# One single-run helper for C and D: run the spec/config of a trained candidate on a slot.
single_run() {  # $1 tag, $2 gpu list, $3 gpus per trial, $4 ds config name
  timeout -s INT -k 15 "$RUN_S" $PY - "$OUT" "$1" "$2" "$3" "$4" <<'EOF'
import glob, json, sys, time
from launch.dsconfig import load_ds_config
from launch.process import start_trial
from launch.slots import parse_gpu_list, plan_slots
out, tag, gpus, k, ds = sys.argv[1], sys.argv[2], parse_gpu_list(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
src = json.load(open(f"{out}/single_spec.json"))
cfg = json.load(open(src["config"]))
cfg["ds_config"] = load_ds_config(ds)
cfg["out_dir"] = f"{out}/single/{tag}"
cfg["measure"]["throughput"] = False   # C/D compare training, not decoding
cfg_path = f"{out}/single/{tag}.config.json"
import os; os.makedirs(cfg["out_dir"], exist_ok=True)
json.dump(cfg, open(cfg_path, "w"), indent=2)
(slot,) = plan_slots(gpus, k, 1)
t = time.time()
p = start_trial(src["spec"], cfg_path, f"{out}/single/{tag}.record.json", slot, f"{out}/single/{tag}.log")
try:
    p.wait()
except KeyboardInterrupt:
    p.kill()
status, reason, rec = p.outcome()
wall = time.time() - t
tr = (rec or {}).get("train", {})
res = {"tag": tag, "gpus": list(slot.gpus), "ds_config": ds, "status": status, "reason": reason, "wall_s": wall,
       "final_loss": tr.get("final_loss"), "train_s": tr.get("seconds"), "tokens": tr.get("tokens"),
       "world_size": tr.get("world_size"), "zero_stage": tr.get("zero_stage"), "precision": tr.get("precision"),
       "micro_batch": tr.get("micro_batch"), "global_batch": tr.get("global_batch"),
       "process_total_s": (rec or {}).get("timings", {}).get("process_total"),
       "via_launcher": p.via_launcher}
res["launch_overhead_s"] = (wall - res["process_total_s"]) if res["process_total_s"] else None
json.dump(res, open(f"{out}/single/{tag}.json", "w"), indent=2)
print(json.dumps(res))
EOF
}

run_phase() {  # $1 study name, $2 gpus, $3 gpus per trial, then extra launch flags
  local t0=$(date +%s) name=$1 gpus=$2 k=$3
  shift 3
  date +%s.%N > "$OUT/$name.start"
  timeout -s INT -k 30 "$PHASE_S" $PY -m archsearch launch "$OUT/space.yaml" --study "$name" \
      --storage "$OUT/$name.journal" --root "$OUT/studies" --trials "$TRIALS" \
      --gpus "$gpus" --gpus-per-trial "$k" --no-progress --no-report "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - t0 ))" | tee -a "$OUT/phases.txt"
  echo $(( $(date +%s) - t0 )) > "$OUT/$name.wall"
}

# C first: it picks the spec (the first candidate the random sampler proposes that passes the
# constraints) and warms the Triton kernel cache, so A and B compare layouts, not compile time.
$PY - "$OUT" <<'EOF' || exit 1
import json, os, sys, copy
import optuna, search_spaces
from archsearch import objectives as obj
from archsearch.study import StudyRunner, make_sampler
from search_spaces.sampling import suggest
out = sys.argv[1]
space = search_spaces.load(f"{out}/space.yaml")
study = optuna.create_study(directions=obj.directions(space), sampler=make_sampler(space))
for _ in range(50):
    t = study.ask()
    spec = suggest(space, t).validate()
    facts = obj.static_facts(space, spec)
    if not obj.violated(obj.constraint_values(space, facts)):
        break
    study.tell(t, state=optuna.trial.TrialState.FAIL)
os.makedirs(f"{out}/single", exist_ok=True)
open(f"{out}/single/spec.json", "w").write(spec.to_json(indent=2))
from launch.slots import plan_slots
(slot,) = plan_slots([0] if space.budget.device != "cpu" else [], 1, 1)
runner = StudyRunner(space, study, [slot], 1, root=f"{out}/single_root", progress=False)
class R: pass
run = R(); run.slot = slot
task, params = obj.quality_tasks(space)[0]
cfg = runner.trial_config(run, task, params, __import__("pathlib").Path(f"{out}/single/c"), first=True)
json.dump(cfg, open(f"{out}/single/base.config.json", "w"), indent=2)
json.dump({"spec": f"{out}/single/spec.json", "config": f"{out}/single/base.config.json",
           "stack": spec.stack_string(), "params": facts.params}, open(f"{out}/single_spec.json", "w"))
print("spec", spec.stack_string(), facts.params, "params")
EOF
single_run c_1gpu "$G1" 1 zero0_bf16
if [ "$SMOKE_CPU" = 1 ]; then
  run_phase a_2slots_x_1gpu none 1 --slots 2
else
  run_phase a_2slots_x_1gpu "$G2" 1
fi
run_phase b_1slot_x_2gpu "$G2" 2
single_run d_2gpu "$G2" 2 zero2_bf16

$PY - "$OUT" "$T_START" <<'EOF'
import json, os, sys, time
import optuna
from optuna.trial import TrialState
out, t_start = sys.argv[1], int(sys.argv[2])
optuna.logging.set_verbosity(optuna.logging.WARNING)
res = {"gpus": open(f"{out}/gpus.txt").read().strip().splitlines() if os.path.exists(f"{out}/gpus.txt") else [],
       "phases": {}, "single": {}}
for name in ("a_2slots_x_1gpu", "b_1slot_x_2gpu"):
    try:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend
        st = optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(f"{out}/{name}.journal")))
        trials = st.get_trials()
    except Exception as exc:  # the phase never created its study
        res["phases"][name] = {"error": str(exc)}
        continue
    wall = float(open(f"{out}/{name}.wall").read())
    start = float(open(f"{out}/{name}.start").read())
    trained = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
               and "reused_from" not in t.user_attrs]
    told = [t for t in trials if t.state == TrialState.COMPLETE]
    # Rate over the time until the last trained trial completed: a phase cut by its cap does not
    # count the unfinished trial's time against the finished ones.
    last = max((t.datetime_complete.timestamp() for t in trained), default=None)
    span = (last - start) if last else wall
    res["phases"][name] = {
        "wall_s": wall, "span_to_last_trained_s": span, "complete": len(told), "trained_ok": len(trained),
        "failed": sum(t.state == TrialState.FAIL for t in trials),
        "fail_reasons": sorted({t.user_attrs.get("reason", "") for t in trials if t.state == TrialState.FAIL}),
        "trained_trials_per_hour": 3600.0 * len(trained) / span if trained and span > 0 else 0.0,
        "trial_seconds": [(t.datetime_complete - t.datetime_start).total_seconds() for t in trained],
        "stacks": [t.user_attrs.get("stack") for t in trained],
    }
for tag in ("c_1gpu", "d_2gpu"):
    p = f"{out}/single/{tag}.json"
    res["single"][tag] = json.load(open(p)) if os.path.exists(p) else {"error": "did not finish"}
res["single_spec"] = json.load(open(f"{out}/single_spec.json")) if os.path.exists(f"{out}/single_spec.json") else None
res["total_wall_s"] = time.time() - t_start
json.dump(res, open(f"{out}/distributed_gpu.json", "w"), indent=2)

print()
print(f"{'layout':<22}{'trained ok':>11}{'span s':>9}{'trials/hour':>13}  failures")
for name, r in res["phases"].items():
    if "error" in r:
        print(f"{name:<22}  error: {r['error']}")
        continue
    tph = r["trained_trials_per_hour"]
    print(f"{name:<22}{r['trained_ok']:>11}{r['span_to_last_trained_s']:>9.0f}{(tph or 0):>13.1f}  {r['failed']} {r['fail_reasons'] or ''}")
spec = res["single_spec"] or {}
print(f"\nsame spec {spec.get('stack')} ({spec.get('params')} params), same global batch:")
print(f"{'run':<10}{'gpus':>6}{'ZeRO':>6}{'final loss':>12}{'train s':>9}{'wall s':>8}{'launch s':>10}  status")
for tag, r in res["single"].items():
    if "error" in r:
        print(f"{tag:<10}  {r['error']}")
        continue
    f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) else "-"
    print(f"{tag:<10}{len(r['gpus']):>6}{f(r['zero_stage'], 'd'):>6}{f(r['final_loss'], '.4f'):>12}"
          f"{f(r['train_s'], '.1f'):>9}{f(r['wall_s'], '.1f'):>8}{f(r['launch_overhead_s'], '.1f'):>10}  {r['status']} {r['reason']}")
print(f"\ntotal {res['total_wall_s']:.0f} s; JSON: {out}/distributed_gpu.json")
EOF
