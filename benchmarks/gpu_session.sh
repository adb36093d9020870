#!/usr/bin/env bash
# One GPU session's kernel work in two calls of the device tool (10 minutes each at most):
#
#   1  the GPU kernel test files and the decode-measurement GPU tests (pytest-xdist, 14 workers)
#   2  the launch sweep's module switches only (`--only switch`), every linear family, 2k and 32k:
#      which alternative kernels win (docs/benchmarks/history.md, "Ready to time")
#   3  the full benchmark (`gpu_kernels.py`, fla skipped unless BENCH_FLA=1) with what the checkout has now
#   ncu  (only when named in STEPS) hardware counters of the training kernels (`ncu_kernels.py`)
#   gemm (only when named in STEPS) the decode GEMMs: cuBLAS vs a Triton split-K kernel (`decode_gemm.py`)
#   decode (only when named in STEPS) the compiled decode graphs of gated_deltanet x24, its 3:1 hybrid
#        with softmax and simple_gla x24, each with and without the fused decode layers
#        (`--decode-layers off,on`; the fused decode mixer on)
#   sets (only when named in STEPS) the decode graphs of gated_deltanet x24 and simple_gla x24 (fused layers)
#        once per entry of DECODE_SETS (default "-;PLAIN_CHUNKS=1;PDL=False": simple_gla's decode mixer
#        state at once, the skinny kernels without programmatic dependent launch), into sets/
#   ab   (only when named in STEPS) `train_ab.py --graph` over AB_VARIANTS (required), AB_FAMILIES (default
#        gated_delta_rule,delta_rule), AB_LENGTHS (2048,16384,32768), AB_ROUNDS (3), AB_DTYPE (bf16; fp32
#        times float32 steps, with the `torch` variant as the PyTorch forms to compare), into ab/; after the tests
#        step, so that `STEPS=tests,ab TESTS_K="..."` checks a new kernel's GPU tests and times it in one call
#
# Each step runs under its own wall-clock cap and writes under $OUT (sweep/, bench/ and a log per
# step), so a step that overruns costs only itself. Steps 1-2 take ~5 min on the H200 and step 3
# ~5 min (most of it compiling for its correctness section, which runs after the measurements),
# hence two calls: flip the switches the sweep shows winning in the modules, then run the
# benchmark. (The tests step takes ~250 s on a fresh H200 host since the 99 KB shared-memory test
# of 2026-12-02 04:37; a 230 s cap cut its last tests at 05:53: hence the default of 280.)
#
#   OUT=$OUT bash benchmarks/gpu_session.sh               # from the repository root: tests, sweep
#   OUT=$OUT STEPS=bench bash benchmarks/gpu_session.sh   # then the benchmark
#
# On the project's H200 host the git-ignored wheelhouse must travel along (the device tool's
# carry: [".whl"]; see /work/shared/device/README.md). Exit status: 1 if any step failed or hit
# its cap (each step's status is printed).
#
# Knobs (environment): STEPS (comma list of tests,ab,sweep,ncu,gemm,decode,sets,bench; default tests,sweep),
# TESTS_S (cap, 280), SWEEP_S (cap, 300), NCU_S (cap, 240), BENCH_S (cap, 540), FAMILIES (sweep's,
# all five), ONLY (the sweep's --only entries, default switch; e.g. switch,wy_bwd,wu), WARPS (its
# --warps, 4,8,16), SET (its --set, e.g. BWD_SUB_BK=128), NCU_CASES (ncu_kernels.py --cases),
# TESTS_K (pytest -k expression for the tests step, default all), GEMM_S (cap, 240), DECODE_S (cap, 300), AB_S (cap, 360),
# BENCH_DEADLINE (s into the bench after which its sections, and the correctness check's cases, are
# skipped; default BENCH_S - 200), DECODE_SETS (the sets step's entries), DECODE_ROUNDS (its round-robin
# passes, default 3), TRAIN_ROUNDS (the bench's round-robin passes over the training cells, default 3:
# ~145 s of the bench on the H200, 1: ~75 s), BENCH_FLA (1: the bench runs flash-linear-attention's kernels
# too; FLA_FAMILIES, FLA_LENGTHS, FLA_TIMEOUT), BENCH_SKIP (more gpu_kernels.py --skip sections),
# TRITON_CACHE_OUT (1: pack the compiled kernels, below). A tests + bench call fits the device tool's 600 s as
# TESTS_S=250 BENCH_S=320 BENCH_DEADLINE=260 (2026-12-04: the tests took 206 s on one host and were cut at
# ~98-99% by a 235-250 s cap on others; the bench 282 s at 15:34, while at 16:52 it was killed by its 320 s
# cap inside the correctness check (128-165 s; one case up to ~55 s), which since starts no case past the
# deadline and runs after the compiled decode graphs).
# The tool returns at most 8 files from $OUT: add nothing else under it in the same call.
#
# Compiled kernels travel between calls (benchmarks/triton_cache.py): TRITON_CACHE_OUT=1 packs this call's
# Triton cache into $OUT/triton_cache.tgz (one of the 8 files; 16 MiB at most); copied to the repository
# root as .triton-gpu-cache.tgz (git-ignored) and carried (carry: [".whl", ".triton-gpu-cache.tgz"]), it is
# unpacked before the next call's steps, whose unchanged kernels then load instead of compiling.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench_out/gpu_session}
mkdir -p "$OUT"
STEPS=${STEPS:-tests,sweep}
TESTS_S=${TESTS_S:-280}
SWEEP_S=${SWEEP_S:-300}
BENCH_S=${BENCH_S:-540}
FAMILIES=${FAMILIES:-linear_attn,simple_gla,gla,delta_rule,gated_delta_rule}
ONLY=${ONLY:-switch}
WARPS=${WARPS:-4,8,16}
SET=${SET:-}
NCU_S=${NCU_S:-240}
GEMM_S=${GEMM_S:-240}
DECODE_S=${DECODE_S:-300}
TESTS_K=${TESTS_K:-}
DECODE_SETS=${DECODE_SETS:--;PLAIN_CHUNKS=1;PDL=False}
AB_S=${AB_S:-360}
if [[ ,$STEPS, == *,ab,* && -z ${AB_VARIANTS:-} ]]; then
  echo "gpu_session.sh: STEPS has ab but AB_VARIANTS is empty (e.g. AB_VARIANTS='-;LAUNCH.fwd_o.maxnreg=None')" >&2
  exit 2
fi
export PY=${PYTHON:-python3} PYTHONUNBUFFERED=1
# sourced: a set-up failure exits here, with gpu_host_env.sh's message on stderr
. benchmarks/gpu_host_env.sh >/dev/null
failed=0
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
# autotuners' timings into that cache too (flash-linear-attention's kernels autotune for minutes on first
# use; ours do not autotune), so that they travel with it
export TRITON_CACHE_AUTOTUNING=1
if [ -f .triton-gpu-cache.tgz ]; then
  $PY benchmarks/triton_cache.py unpack .triton-gpu-cache.tgz --cache "$TRITON_CACHE_DIR"
fi

step() {  # name, cap (s), command...: run it capped, log to $OUT/<name>.log, say how it ended
  local name=$1 cap=$2; shift 2
  local t0=$SECONDS
  echo "[$(date -u +%H:%M:%S)] $name (cap ${cap} s)"
  timeout "$cap" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "[$(date -u +%H:%M:%S)] $name: exit $rc after $((SECONDS - t0)) s$([ $rc -eq 124 ] && echo ' (cap reached)')"
  tail -3 "$OUT/$name.log"
  return $rc
}

if [[ ,$STEPS, == *,tests,* ]]; then
  if ! $PY -c "import xdist" >/dev/null 2>&1 && ls .whl/pytest_xdist*.whl >/dev/null 2>&1; then
    pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl .whl/execnet*.whl >/dev/null 2>&1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  workers=()  # one process if pytest-xdist is missing (slower: compiling dominates)
  $PY -c "import xdist" >/dev/null 2>&1 && workers=(-n 14)
  # work stealing (pytest-xdist >= 3.2): an idle worker takes queued tests from a busy one, so the
  # step's wall is not one worker's queue of slow fp32 compiles behind a long test (245 s of a 250 s
  # cap on 2026-12-04 with the default scheduling, whose longest test took 95 s)
  $PY -c "import sys, xdist; sys.exit(tuple(map(int, xdist.__version__.split('.')[:2])) < (3, 2))" >/dev/null 2>&1 &&
    workers+=(--dist worksteal)
  select=()
  [ -n "$TESTS_K" ] && select=(-k "$TESTS_K")
  # --durations: the slowest tests in the log, for keeping the step under its cap
  step tests "$TESTS_S" $PY -m pytest -p no:cacheprovider -q --durations=25 "${workers[@]}" "${select[@]}" tests/blocks/test_kernels_gpu.py \
    tests/blocks/test_kernels_gpu_gla_delta.py tests/blocks/test_kernels_skinny.py tests/blocks/test_kernels_decode_attention.py \
    tests/archsearch/test_measure.py || failed=1
fi
if [[ ,$STEPS, == *,ab,* ]]; then
  step ab "$AB_S" $PY benchmarks/train_ab.py --families "${AB_FAMILIES:-gated_delta_rule,delta_rule}" \
    --lengths "${AB_LENGTHS:-2048,16384,32768}" --rounds "${AB_ROUNDS:-3}" --graph --variants="$AB_VARIANTS" \
    --dtype "${AB_DTYPE:-bf16}" --out "$OUT/ab" || failed=1
fi
if [[ ,$STEPS, == *,sweep,* ]]; then
  step sweep "$SWEEP_S" $PY benchmarks/kernel_launch_sweep.py --families "$FAMILIES" --lengths 2048,32768 \
    --workers 14 --only "$ONLY" --warps "$WARPS" ${SET:+--set "$SET"} --out "$OUT/sweep" || failed=1
fi
if [[ ,$STEPS, == *,ncu,* ]]; then
  step ncu "$NCU_S" $PY benchmarks/ncu_kernels.py --out "$OUT/ncu" ${NCU_CASES:+--cases "$NCU_CASES"} || failed=1
fi
if [[ ,$STEPS, == *,gemm,* ]]; then
  step gemm "$GEMM_S" $PY benchmarks/decode_gemm.py --out "$OUT/gemm" || failed=1
fi
if [[ ,$STEPS, == *,decode,* ]]; then
  step decode "$DECODE_S" $PY benchmarks/gpu_kernels.py --out "$OUT/decode" \
    --skip correctness,train,step,softmax,kernel_breakdown,model,fla \
    --decode-mixers on --decode-layers off,on \
    || failed=1
fi
if [[ ,$STEPS, == *,sets,* ]]; then
  step sets "$DECODE_S" $PY benchmarks/gpu_kernels.py --out "$OUT/sets" \
    --skip correctness,train,step,softmax,kernel_breakdown,model,fla \
    --compiled-cases "gated_deltanet x24,simple_gla x24" --rounds "${DECODE_ROUNDS:-3}" \
    --compiled-sets="$DECODE_SETS" || failed=1
fi
if [[ ,$STEPS, == *,bench,* ]]; then
  deadline=${BENCH_DEADLINE:-$((BENCH_S > 260 ? BENCH_S - 200 : 60))}  # sections starting later are skipped
  # BENCH_FLA=1: flash-linear-attention's kernels too, the last section (FLA_FAMILIES, default linear_attn,delta_rule,
  # the ones that run on the host's Triton; FLA_LENGTHS, default 2048,32768; FLA_TIMEOUT, default 300 s): its
  # autotuning took ~130 s a family on a bare host (2026-12-02). BENCH_SKIP: more sections to skip (e.g.
  # correctness, which the tests step covers), comma list as gpu_kernels.py --skip.
  skip=${BENCH_SKIP:-}
  fla=()
  if [ "${BENCH_FLA:-0}" = 1 ]; then
    fla=(--fla-families "${FLA_FAMILIES:-linear_attn,delta_rule}" --fla-lengths "${FLA_LENGTHS:-2048,32768}"
         --fla-timeout "${FLA_TIMEOUT:-300}")
  else
    skip=fla${skip:+,$skip}
  fi
  step bench "$BENCH_S" $PY benchmarks/gpu_kernels.py --out "$OUT/bench" ${skip:+--skip "$skip"} "${fla[@]}" \
    --deadline $deadline --train-rounds "${TRAIN_ROUNDS:-3}" || failed=1
fi
if [ "${TRITON_CACHE_OUT:-0}" = 1 ]; then
  $PY benchmarks/triton_cache.py pack "$OUT/triton_cache.tgz" --cache "$TRITON_CACHE_DIR"
fi
exit $failed
