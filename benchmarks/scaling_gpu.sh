#!/usr/bin/env bash
# Scaling of a search over the GPUs of one host (issue 7), in one 10-minute device command.
#
#   S1  one spec (the largest feasible of the first 50 random candidates) on 1 GPU, ZeRO-0 bf16
#       (also warms the Triton cache)
#   Lk  hybrid_lm_small, k slots of 1 GPU each, for k in 8, 4, 2, 1 (those <= G GPUs; larger skipped)
#   SG  the S1 spec on all G GPUs in one slot, ZeRO-2 bf16, same global batch and tokens
#
# Every layout gets the same trial budget (TRIALS) and the same random-sampler seed, so all of them
# are offered the same candidates in the same order. Reports per layout: trained trials per hour
# (over the span to the last trained trial, as distributed_gpu.sh), efficiency against linear
# (tph_k / (k * tph_1)) and the hypervolume after the same number of completed trials (the fewest
# any layout completed), all layouts measured against ONE reference point
# (archsearch.pareto.reference_point of every layout's completed trials pooled). For S1 and SG:
# tokens/s (trained tokens / training seconds from the record) and final loss. Prints a markdown
# table; writes $OUT/scaling.json and $OUT/scaling.md (plus every study, log and record).
#
#   OUT=/tmp/out bash benchmarks/scaling_gpu.sh          # from the repository root
#
# Knobs (environment):
#   TRIALS         trials per layout (default 2*G)
#   LAYOUTS        GPUs per layout to run, e.g. "1,2" (default 1,2,4,8 up to G)
#   TOKENS         training tokens per run of a search trial (400000; each trial is two runs, LM and MQAR)
#   SINGLE_TOKENS  training tokens of S1/SG (1000000)
#   PHASE_S        wall-clock cap per layout (default: what fits TOTAL_S, at most 150)
#   RUN_S          wall-clock cap per single run (90)
#   TOTAL_S        the whole script's budget (570); a step that would end past it is shortened or skipped
#   SINGLE=0       skip S1/SG
#   REPORT_ONLY=1  only redo the report from what an earlier run left in $OUT
#   MERGE="D1 D2"  also report the layouts (and S1/SG if $OUT has none) of earlier runs' $OUT dirs,
#                  e.g. LAYOUTS=8,4 in one command and LAYOUTS=2,1 SINGLE=0 in another (same TRIALS)
# SMOKE_CPU=1 runs the same script on a CPU box: G = 2 CPU slots, gloo process groups standing in for
# GPUs, tiny models, 32k contexts cut to 256.
set -uo pipefail
cd "$(dirname "$0")/.."
T_START=$(date +%s)
OUT=${OUT:-$PWD/bench_out/scaling_gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}

. benchmarks/gpu_host_env.sh   # wheels from .whl/ on the GPU host, PYTHONPATH, arch list
export PYTHONUNBUFFERED=1

SMOKE_CPU=${SMOKE_CPU:-0}
REPORT_ONLY=${REPORT_ONLY:-0}
if [ "$REPORT_ONLY" = 1 ]; then  # G, TRIALS and the smoke flag as the earlier run recorded them
  SET=$(for d in "$OUT" ${MERGE:-}; do [ -f "$d/settings.txt" ] && echo "$d/settings.txt" && break; done)
  [ -n "$SET" ] || { echo "REPORT_ONLY: no settings.txt from an earlier run in $OUT ${MERGE:-}" >&2; exit 1; }
  G=$(sed -n 's/^G=\([0-9]*\) .*/\1/p' "$SET")
  TRIALS=$(sed -n 's/.* trials=\([0-9]*\) .*/\1/p' "$SET")
  SMOKE_CPU=$(sed -n 's/.* smoke=\([01]\).*/\1/p' "$SET")
elif [ "$SMOKE_CPU" = 1 ]; then
  G=2 UNIT="CPU slot"
  TOKENS=${TOKENS:-2048}
  SINGLE_TOKENS=${SINGLE_TOKENS:-4096}
  TOTAL_S=${TOTAL_S:-3000}
  RUN_S=${RUN_S:-300}
  PHASE_S_MAX=600
else
  G=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [ "${G:-0}" -lt 1 ]; then
    echo "needs a GPU, found none (SMOKE_CPU=1 checks the plumbing on CPU)" >&2; exit 1
  fi
  UNIT=GPU
  TOKENS=${TOKENS:-400000}
  SINGLE_TOKENS=${SINGLE_TOKENS:-1000000}
  TOTAL_S=${TOTAL_S:-570}
  RUN_S=${RUN_S:-90}
  PHASE_S_MAX=150
fi
TRIALS=${TRIALS:-$(( 2 * G ))}
SINGLE=${SINGLE:-1}
if [ "$REPORT_ONLY" != 1 ]; then
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > "$OUT/gpus.txt" 2>/dev/null || true

# Layouts that fit G; larger ones are skipped and said so.
LAYOUTS=${LAYOUTS:-1,2,4,8}
RUN_LAYOUTS=() ; : > "$OUT/skipped.txt"
for k in $(echo "$LAYOUTS" | tr ',' ' ' | tr ' ' '\n' | sort -rn); do
  if [ "$k" -le "$G" ]; then RUN_LAYOUTS+=("$k")
  else echo "layout ${k}x1: skipped, the host has $G $UNIT(s)" | tee -a "$OUT/skipped.txt"; fi
done
N_SINGLE=0; [ "$SINGLE" = 1 ] && N_SINGLE=2; [ "$SINGLE" = 1 ] && [ "$G" -lt 2 ] && N_SINGLE=1
if [ -z "${PHASE_S:-}" ]; then  # split what the single runs and the report leave among the layouts
  PHASE_S=$(( (TOTAL_S - N_SINGLE * RUN_S - 60) / (${#RUN_LAYOUTS[@]} > 0 ? ${#RUN_LAYOUTS[@]} : 1) ))
  [ "$PHASE_S" -gt "$PHASE_S_MAX" ] && PHASE_S=$PHASE_S_MAX
fi
echo "G=$G layouts=${RUN_LAYOUTS[*]} trials=$TRIALS tokens=$TOKENS phase_s=$PHASE_S run_s=$RUN_S" \
     "single_tokens=$SINGLE_TOKENS total_s=$TOTAL_S smoke=$SMOKE_CPU" | tee "$OUT/settings.txt"
fi

# cap_for WANT RESERVE: WANT, shortened so that RESERVE seconds stay before TOTAL_S; 0 = skip.
cap_for() {
  local left=$(( TOTAL_S - ($(date +%s) - T_START) - $2 ))
  local c=$1; [ "$left" -lt "$c" ] && c=$left
  [ "$c" -lt 20 ] && c=0
  echo "$c"
}

if [ "$REPORT_ONLY" != 1 ]; then
# The benchmark space: hybrid_lm_small, short training budget, random sampler with one seed, so
# every layout is offered the same candidates in the same order.
$PY benchmarks/bench_space.py "$OUT" hybrid_lm_small_scaling "$TOKENS" "$TRIALS" \
  $([ "$SMOKE_CPU" = 1 ] && echo --smoke) || exit 1

# The single-run spec: the largest (params) of the first 50 random candidates that pass the
# constraints, with the trial config the study would give it, its token budget raised.
if [ "$SINGLE" = 1 ]; then
$PY - "$OUT" "$SINGLE_TOKENS" "$RUN_S" <<'EOF' || exit 1
import json, os, sys, pathlib
import optuna, search_spaces
from archsearch import objectives as obj
from archsearch.study import StudyRunner, make_sampler
from search_spaces.sampling import suggest
from launch.slots import plan_slots
out, tokens, run_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
optuna.logging.set_verbosity(optuna.logging.WARNING)
space = search_spaces.load(f"{out}/space.yaml")
study = optuna.create_study(directions=obj.directions(space), sampler=make_sampler(space))
best = None
for _ in range(50):
    t = study.ask()
    spec = suggest(space, t).validate()
    facts = obj.static_facts(space, spec)
    if not obj.violated(obj.constraint_values(space, facts)) and (best is None or facts.params > best[1].params):
        best = (spec, facts)
    study.tell(t, state=optuna.trial.TrialState.FAIL)
spec, facts = best
os.makedirs(f"{out}/single", exist_ok=True)
open(f"{out}/single/spec.json", "w").write(spec.to_json(indent=2))
(slot,) = plan_slots([0] if space.budget.device != "cpu" else [], 1, 1)
runner = StudyRunner(space, study, [slot], 1, root=f"{out}/single_root", progress=False)
class R: pass
run = R(); run.slot = slot
task, params = obj.quality_tasks(space)[0]
cfg = runner.trial_config(run, task, params, pathlib.Path(f"{out}/single/base"), first=True)
cfg["train"]["tokens"] = tokens
cfg["train"]["max_seconds"] = max(10.0, run_s - 40)  # leave the cap room for start-up and the record
cfg["measure"]["throughput"] = False  # S1/SG compare training, not decoding
json.dump(cfg, open(f"{out}/single/base.config.json", "w"), indent=2)
json.dump({"spec": f"{out}/single/spec.json", "config": f"{out}/single/base.config.json",
           "stack": spec.stack_string(), "params": facts.params, "tokens": tokens},
          open(f"{out}/single_spec.json", "w"))
print("single spec", spec.stack_string(), facts.params, "params,", tokens, "tokens")
EOF
fi

single_run() {  # $1 tag, $2 gpu list, $3 gpus per trial, $4 ds config name, $5 cap s
  $PY - "$OUT" "$1" "$2" "$3" "$4" "$5" <<'EOF'
import json, os, sys, time
from launch.dsconfig import load_ds_config
from launch.process import start_trial
from launch.slots import parse_gpu_list, plan_slots
out, tag, gpus, k, ds, cap = sys.argv[1], sys.argv[2], parse_gpu_list(sys.argv[3]), int(sys.argv[4]), sys.argv[5], float(sys.argv[6])
src = json.load(open(f"{out}/single_spec.json"))
cfg = json.load(open(src["config"]))
cfg["ds_config"] = load_ds_config(ds)
cfg["out_dir"] = f"{out}/single/{tag}"
os.makedirs(cfg["out_dir"], exist_ok=True)
cfg_path = f"{out}/single/{tag}.config.json"
json.dump(cfg, open(cfg_path, "w"), indent=2)
(slot,) = plan_slots(gpus, k, 1)
t = time.time()
# timeout_s: the trial process group is killed (status failed/timeout) if it outlives the cap
p = start_trial(src["spec"], cfg_path, f"{out}/single/{tag}.record.json", slot, f"{out}/single/{tag}.log",
                timeout_s=cap)
p.wait()
status, reason, rec = p.outcome()
wall = time.time() - t
tr = (rec or {}).get("train", {})
tok, secs = tr.get("tokens"), tr.get("seconds")
res = {"tag": tag, "gpus": list(slot.gpus) or [f"cpu{i}" for i in range(slot.num_procs)], "ds_config": ds,
       "status": status, "reason": reason, "wall_s": wall, "final_loss": tr.get("final_loss"), "train_s": secs,
       "tokens": tok, "tokens_per_s": tok / secs if tok and secs else None, "steps": tr.get("steps"),
       "world_size": tr.get("world_size"), "zero_stage": tr.get("zero_stage"), "precision": tr.get("precision"),
       "micro_batch": tr.get("micro_batch"), "global_batch": tr.get("global_batch"),
       "process_total_s": (rec or {}).get("timings", {}).get("process_total")}
json.dump(res, open(f"{out}/single/{tag}.json", "w"), indent=2)
print(json.dumps(res))
EOF
}

run_phase() {  # $1 k: k slots of 1 GPU (smoke: k single-process CPU slots); $2 cap s
  local k=$1 cap=$2 name="layout_${1}x1" t0=$(date +%s)
  date +%s.%N > "$OUT/$name.start"
  if [ "$SMOKE_CPU" = 1 ]; then
    set -- --gpus none --slots "$k"
  else
    set -- --gpus "$(seq -s, 0 $(( k - 1 )))" --gpus-per-trial 1
  fi
  timeout -s INT -k 30 "$cap" $PY -m archsearch launch "$OUT/space.yaml" --study "$name" \
      --storage "$OUT/$name.journal" --root "$OUT/studies" --trials "$TRIALS" \
      --no-progress --no-report "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? cap=$cap wall=$(( $(date +%s) - t0 ))" | tee -a "$OUT/phases.txt"
  echo $(( $(date +%s) - t0 )) > "$OUT/$name.wall"
}

RESERVE_END=30  # the report
RESERVE_SG=0; [ "$N_SINGLE" = 2 ] && RESERVE_SG=$RUN_S
# SG uses the largest power of two <= G GPUs: the global batch (64) must split evenly over the ranks.
GS=1; while [ $(( GS * 2 )) -le "$G" ]; do GS=$(( GS * 2 )); done
[ "$GS" -lt "$G" ] && echo "sG: on $GS of the $G GPUs (the global batch splits over a power of two)" | tee -a "$OUT/skipped.txt"
[ "$SMOKE_CPU" = 1 ] && GLIST1=none GLISTG=none || { GLIST1=0; GLISTG=$(seq -s, 0 $(( GS - 1 ))); }
: > "$OUT/phases.txt"

# S1 first: it also compiles the chosen spec's kernels into the Triton cache.
if [ "$SINGLE" = 1 ]; then
  cap=$(cap_for "$RUN_S" $(( RESERVE_SG + RESERVE_END )))
  if [ "$cap" -gt 0 ]; then single_run s1_1gpu "$GLIST1" 1 zero0_bf16 "$cap"
  else echo "s1_1gpu: skipped, no time left" | tee -a "$OUT/skipped.txt"; fi
fi
# Largest layout first: it pays the cold Triton compiles of the candidates, and the smaller layouts
# (1 GPU last) find those kernels cached. Efficiency against linear is therefore, if anything,
# understated.
for k in "${RUN_LAYOUTS[@]}"; do
  cap=$(cap_for "$PHASE_S" $(( RESERVE_SG + RESERVE_END )))
  if [ "$cap" -gt 0 ]; then run_phase "$k" "$cap"
  else echo "layout ${k}x1: skipped, no time left" | tee -a "$OUT/skipped.txt"; fi
done
if [ "$N_SINGLE" = 2 ]; then
  cap=$(cap_for "$RUN_S" "$RESERVE_END")
  if [ "$cap" -gt 0 ]; then single_run "sG_${GS}gpu" "$GLISTG" "$GS" zero2_bf16 "$cap"
  else echo "sG_${GS}gpu: skipped, no time left" | tee -a "$OUT/skipped.txt"; fi
elif [ "$SINGLE" = 1 ]; then
  echo "sG: skipped, one GPU only" | tee -a "$OUT/skipped.txt"
fi

fi  # REPORT_ONLY

# The report covers the layouts that started here (a .start file each) and, with MERGE="DIR ...",
# those of earlier runs' $OUT directories (same TRIALS and space) that this one lacks.
$PY - "$OUT" "$T_START" "$G" "$TRIALS" "$SMOKE_CPU" ${MERGE:-} <<'EOF'
import glob, json, os, re, sys, time
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from archsearch.pareto import hypervolume, reference_point

out, t_start, G, n_trials, smoke = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
dirs = [out] + sys.argv[6:]
where = {}  # layout k -> the directory whose run of it is reported (this run's first)
for d in dirs:
    for p in glob.glob(f"{d}/layout_*x1.start"):
        where.setdefault(int(os.path.basename(p)[len("layout_"):-len("x1.start")]), d)
layouts = sorted(where)
optuna.logging.set_verbosity(optuna.logging.WARNING)
rd = lambda p: open(p).read().strip() if os.path.exists(p) else ""
res = {"gpus": rd(f"{out}/gpus.txt").splitlines(), "G": G, "smoke_cpu": smoke, "trials_per_layout": n_trials,
       "settings": {d: rd(f"{d}/settings.txt") for d in dirs},
       "skipped": [line for d in dirs for line in rd(f"{d}/skipped.txt").splitlines()
                   if not any(line.startswith(f"layout {k}x1:") for k in layouts)],
       "layouts": {}, "single": {}}

studies = {}
for k in layouts:
    name, d = f"layout_{k}x1", where[k]
    try:
        st = optuna.load_study(study_name=name, storage=JournalStorage(JournalFileBackend(f"{d}/{name}.journal")))
        trials = st.get_trials()
    except Exception as exc:  # the phase never created its study
        res["layouts"][k] = {"error": str(exc)}
        continue
    wall = float(rd(f"{d}/{name}.wall") or 0)
    start = float(rd(f"{d}/{name}.start") or 0)
    complete = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.datetime_complete)
    trained = [t for t in complete if t.user_attrs.get("status") == "ok" and "reused_from" not in t.user_attrs]
    # Rate over the time until the last trained trial completed: a phase cut by its cap does not
    # count the unfinished trials' time against the finished ones.
    last = max((t.datetime_complete.timestamp() for t in trained), default=None)
    span = (last - start) if last else wall
    studies[k] = (st, complete)
    res["layouts"][k] = {
        "slots": k, "out_dir": d, "wall_s": wall, "span_to_last_trained_s": span, "complete": len(complete),
        "trained_ok": len(trained),
        # cut off by the phase's cap (the driver records them "interrupted") vs real failures
        "cut_by_cap": sum(t.state == TrialState.FAIL and t.user_attrs.get("status") == "interrupted" for t in trials),
        "failed": sum(t.state == TrialState.FAIL and t.user_attrs.get("status") != "interrupted" for t in trials),
        "fail_reasons": sorted({t.user_attrs.get("reason", "") for t in trials if t.state == TrialState.FAIL}),
        "trained_trials_per_hour": 3600.0 * len(trained) / span if trained and span > 0 else 0.0,
        "trial_seconds": [(t.datetime_complete - t.datetime_start).total_seconds() for t in trained],
        "completed_stacks": [t.user_attrs.get("stack") for t in complete],
        # per trial number: the same candidate's objective values in every layout (measured
        # throughput also depends on what else ran on the host at the time)
        "values_by_trial": {t.number: t.values for t in complete},
    }

# Efficiency against linear: tph_k / (k * tph_1).
tph1 = res["layouts"].get(1, {}).get("trained_trials_per_hour") or 0.0
for k, r in res["layouts"].items():
    if "error" not in r:
        r["efficiency_vs_linear"] = r["trained_trials_per_hour"] / (k * tph1) if tph1 > 0 else None


def sub_study(directions, trials):
    s = optuna.create_study(directions=directions)
    s.add_trials(trials)
    return s


# Hypervolume: one reference point for all layouts (pareto.reference_point of every layout's
# completed trials pooled), each layout's front after its first n completed trials (completion
# order), n = the fewest any layout completed; also after all its completed trials.
if studies:
    directions = next(iter(studies.values()))[0].directions
    ref = reference_point(sub_study(directions, [t for _, c in studies.values() for t in c]))
    n_common = min(len(c) for _, c in studies.values())
    res["hypervolume"] = {"reference_point": ref, "metrics": next(iter(studies.values()))[0].metric_names,
                          "n_common": n_common}
    for k, (st, complete) in studies.items():
        r = res["layouts"][k]
        r["hypervolume_at_n_common"] = hypervolume(sub_study(directions, complete[:n_common]), ref) if ref else 0.0
        r["hypervolume_all_complete"] = hypervolume(sub_study(directions, complete), ref) if ref else 0.0
        r["trials_at_n_common"] = [t.number for t in complete[:n_common]]

# S1/SG come from the first directory that has a single-run spec (both runs of one spec).
sdir = next((d for d in dirs if os.path.exists(f"{d}/single_spec.json")), None)
res["single_spec"] = json.load(open(f"{sdir}/single_spec.json")) if sdir else None
for p in sorted(glob.glob(f"{sdir}/single/*.json") if sdir else []):
    tag = os.path.basename(p)[:-5]
    if tag.startswith(("s1_", "sG_")) and "." not in tag:  # not the .config/.record JSONs
        res["single"][tag] = json.load(open(p))
res["total_wall_s"] = time.time() - t_start
json.dump(res, open(f"{out}/scaling.json", "w"), indent=2, default=str)

f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) and v is not None else "-"
unit = "CPU slot" if smoke else "GPU"
lines = [f"## Search scaling, {G} {unit}s{' (SMOKE_CPU: gloo/CPU stand-ins, tiny models)' if smoke else ''}", "",
         f"{n_trials} trials per layout, one {unit} per trial, random sampler seed 0; trials/hour over the span to "
         "the last trained trial; hypervolume against one reference point"
         + (f" {[round(x, 6) for x in res['hypervolume']['reference_point']]} ({', '.join(res['hypervolume']['metrics'] or [])})"
            f" after the first {res['hypervolume']['n_common']} completed trials of each layout"
            if studies and res['hypervolume']['reference_point'] else " (none: no feasible completed trial)"),
         "",
         f"| layout | completed | trained | cut by cap | failed | span s | trials/hour | efficiency vs linear | HV @ n common | HV all |",
         "|---|---|---|---|---|---|---|---|---|---|"]
for k in layouts:
    r = res["layouts"].get(k, {})
    if not r or "error" in r:
        lines.append(f"| {k} x 1 {unit} | error: {r.get('error', 'did not run')} ||||||||| ")
        continue
    lines.append(f"| {k} x 1 {unit} | {r['complete']} | {r['trained_ok']} | {r['cut_by_cap']} | {r['failed']} | {r['span_to_last_trained_s']:.0f} | "
                 f"{r['trained_trials_per_hour']:.1f} | {f(r['efficiency_vs_linear'], '.2f')} | "
                 f"{f(r.get('hypervolume_at_n_common'), '.4g')} | {f(r.get('hypervolume_all_complete'), '.4g')} |")
budgets = {d: m.group(1) for d, t in res["settings"].items() for m in [re.search(r" trials=(\d+)", t)] if m}
if len(set(budgets.values())) > 1:
    lines.append(f"\nWARNING: the merged runs had different trial budgets: {budgets}")
for s in res["skipped"]:
    lines.append(f"\n{s}")
spec = res["single_spec"] or {}
if res["single"]:
    lines += ["", f"Single larger trial: spec `{spec.get('stack')}` ({spec.get('params')} params), "
                  f"{spec.get('tokens')} tokens planned, same global batch:", "",
              "| run | devices | ZeRO | precision | micro batch | tokens | train s | tokens/s | final loss | status |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for tag, r in res["single"].items():
        lines.append(f"| {tag} | {len(r['gpus'])} | {f(r['zero_stage'], 'd')} | {r.get('precision') or '-'} | "
                     f"{f(r['micro_batch'], 'd')} | {f(r['tokens'], 'd')} | {f(r['train_s'], '.1f')} | "
                     f"{f(r['tokens_per_s'], '.0f')} | {f(r['final_loss'], '.4f')} | {r['status']} {r['reason'] or ''} |")
    s1 = next((r for t, r in res["single"].items() if t.startswith("s1_")), None)
    sg = next((r for t, r in res["single"].items() if t.startswith("sG_")), None)
    if s1 and sg and s1.get("tokens_per_s") and sg.get("tokens_per_s"):
        sp = sg["tokens_per_s"] / s1["tokens_per_s"]
        res["single_speedup"] = sp
        if s1.get("tokens") != sg.get("tokens"):
            lines.append(f"\nS1 and SG trained different token counts ({s1.get('tokens')} vs {sg.get('tokens')}: "
                         "the training time limit); their final losses are not comparable")
        lines.append(f"\ntokens/s speed-up on {len(sg['gpus'])} {unit}s: {sp:.2f}x ({sp / len(sg['gpus']):.2f} of linear)")
lines.append(f"\ntotal {res['total_wall_s']:.0f} s; JSON: scaling.json")
md = "\n".join(lines) + "\n"
open(f"{out}/scaling.md", "w").write(md)
json.dump(res, open(f"{out}/scaling.json", "w"), indent=2, default=str)
print()
print(md)
EOF
