#!/usr/bin/env bash
# A whole GPU session in one script: the CUDA tests of what changed since the last GPU run, the GPU
# benchmark (`python -m specdecode bench --device cuda --preset gpu-session`: the 1B pair and SmolLM2
# with its shipped EAGLE drafter; every method: the target alone through HF generate, HF's static-cache
# compiled generate, specdecode's graphed and compiled paths; HF assisted; eager / graphed / compiled
# chains; eager, graphed static and graphed dynamic trees; prompt lookup (host drafts) eager and graphed; batch 1 and 8, greedy; the time split,
# kernels per step, greedy identity and the cost per call from 64 and 256 tokens; at most 6 minutes
# on an H100, results written after every method: docs/gpu.md, "The decode-path benchmark"), then
# the training run of every drafter kind for SmolLM2 (scripts/gpu_train_drafters.sh).
# The device tool lends 15 minutes in all, the machine's start included, at most 10 a call, 64 MiB
# carried a call, and keeps a machine warm only 30 s after a call: make the calls below one right
# after the other, nothing in between.
#
# Here, first (once per change of csrc/, and once per checkout):
#   bash scripts/build_gpu_extension.sh     # the CUDA extension for the device's Python 3.12 / torch 2.11
#   bash scripts/gguf_parts.sh              # .gguf-parts/: the SmolLM2 GGUF in parts, their manifest, the gguf
#                                           # reader, the gzipped extension; prints the calls with its sizes
#   bash scripts/device_versions_tests.sh   # the CPU tests under the device's torch 2.11 + transformers 5.17
# The device calls (sizes as measured on 2026-11-29: 3 parts, the largest call 57.8 MB of 64 MiB). The second H200 session of 2026-11-28
# ran calls 1-4 below with the earlier probe (float32 first, both attentions): folding SDPA's grouped
# heads took the data stage from 10.7k to 24k generated tokens/s (512 prompts, float32), and the
# float32 GEMMs (no tensor cores) and the labelling forward are what is left; the probe now times
# bfloat16 first, with the fold only:
#   1. run  command='bash scripts/gpu_session.sh stash'  timeout_s=90
#           carry=[".gguf-parts/manifest", ".gguf-parts/part-1", ".gguf-parts/_C.cpython-312-x86_64-linux-gnu.so.gz"]
#   2. run  command='bash scripts/gpu_session.sh stash'  timeout_s=60
#           carry=[".gguf-parts/manifest", ".gguf-parts/part-2"]
#   3. run  command='bash scripts/gpu_session.sh probe'  timeout_s=170   (decode-label tests + the data probe: ~135 s)
#           carry=[".gguf-parts/manifest", ".gguf-parts/part-3", ".gguf-parts/site"]
#   4. run  command='MINUTES=7.5 bash scripts/gpu_session.sh train'  timeout_s=590
#           carry=[".gguf-parts/manifest", ".gguf-parts/part-3", ".gguf-parts/site"]
#      (MINUTES = the device minutes left after call 3, minus 3 for loading, packing and the margin,
#      at most 7.5: 7.5 took 473 s on the H200, 6.5 took 410 s; the script stops the training at
#      TOTAL_S = 560 s; the session of 2026-11-28 used 31 s to start, 5 for the stash calls, 167 for
#      a 150 s probe, 422 for a 6.5-minute train call)
#   5. with 4 or more minutes left:
#      run  command='TESTS_S=40 BENCH_S=150 bash scripts/gpu_session.sh bench'  timeout_s=220
#           carry=[".gguf-parts/manifest", ".gguf-parts/site"]
#   6. with 3 or more minutes left (issue 54: host drafters feeding the graphed target):
#      run  command='HOST_S=100 bash scripts/gpu_session.sh host'  timeout_s=240
#           carry=[".gguf-parts/manifest", ".gguf-parts/site"]
#      (rehearsed here on the CPU by `bash scripts/gpu_session.sh hostdry`: the same calls, eager and static)
#   then give_back, and here: the files of each call (probe: probe.log, data_stage.csv/json and
#   data_stage_profiles.txt; training: KIND.tar per kind, train.log, summary.json, see
#   scripts/gpu_train_drafters.sh; benchmark: bench.log, cuda_tests.log, bench_gpu.csv/json).
#   Each EAGLE record in summary.json holds its greedy acceptance by draft step on the validation
#   examples, before and after (the drafter reading its own features; the train call continues
#   the shipped drafter with --unroll 4): compare them before benchmarking. Then choose settings on
#   the tune prompts and report held-out (benchmarks/bench_drafter_settings.py: chain:K,
#   dynamic:N:D, and sparse:N for Medusa heads with --calibration-data).
#   A variant of call 4, for a session that should try EAGLE-3 features instead of continuing:
#   'MINUTES=7.5 KINDS=eagle INIT_FROM= KIND_ARGS="--draft-vocab 8192 --freeze-head --unroll 4
#   --feature-layers 2,15,-1" bash scripts/gpu_session.sh train' (a new drafter on SmolLM2's layers 2,
#   15 and its last, the whole budget; on the demo target it gained 1.5% tokens per call at equal
#   time, docs/training.md: the default plan continues the shipped drafter).
#   The full benchmark (up to 8 minutes: `bash scripts/gpu_session.sh bench` with its defaults,
#   timeout_s=480, as call 3) and a training run worth having do not both fit one session.
# A call that finds a part missing (the machine went back between calls) says so in one line: start
# again at call 1.
#
# Stages (the first argument):
#   stash   copy the parts this call carried into /tmp (the extension too: restored by later calls)
#   probe   join the GGUF, restore the extension, run the CUDA tests of the data stage's decode labels
#           (PROBE_TESTS, at most PROBE_TESTS_S seconds; a failure leaves $STASH/labels-forward, and the
#           train call then passes --data-labels forward), then time the data stage's continuations on the
#           graphed path alone (benchmarks/bench_data_stage.py PROBE_ARGS: SmolLM2 in bfloat16 and
#           float32, 1024 and 512 prompts per batch, grouped-query attention folded (Transformers'
#           SDPA, which copies the heads, ran at 0.45x of it on the H200), T = 0.7, and a
#           torch.profiler table of one batch of each; bfloat16 first, so a run cut at its limit
#           keeps those), at most PROBE_S seconds
#   bench   join the GGUF (sha256 checked), restore the extension, then run CUDA_TESTS (at most
#           TESTS_S seconds) and the GPU benchmark (at most BENCH_S seconds; it writes its results
#           after every group, so a cut-short run still returns what it finished)
#   train   scripts/gpu_train_drafters.sh train, with this script's OUT
#   host    join the GGUF, restore the extension, then host drafters on SmolLM2's graphed target
#           (benchmarks/bench_host_drafters.py --pair smollm2 --device cuda --paths graphed --drafters
#           lookup,suffix,lookup-trie,suffix-trie: the graphed target alone, then each drafter feeding it;
#           report halves of the records and the code workloads, 4 prompts of 128 new tokens, 2 rounds;
#           at most HOST_S [100] seconds each)
#   hostdry the host stage's calls on the CPU (the demo-sized rehearsal: 1 prompt, 8 tokens, eager and static)
#   dry     everything `bench` does but the CUDA tests, on the CPU: the same preset with --quick (the
#           demo pair, tiny sizes, the compiled methods left out: their compiles take minutes on a
#           CPU; tests/test_bench_gpu_rows.py runs HF's) (the test suite runs it:
#           tests/test_bench_gpu_rows.py)
# Environment: PROBE_S [110], PROBE_ARGS [the probe's arguments above], PROBE_TESTS
# [tests/test_training_decode_labels.py], PROBE_TESTS_S [30], TESTS_S [60], BENCH_S [360], CUDA_TESTS [the CUDA test files named below], BENCH_ARGS
# [--preset gpu-session], DRY_BENCH_ARGS [--preset gpu-session --quick], PY [python3], OUT [./gpu_out],
# and gpu_train_drafters.sh's variables.
set -uo pipefail
STAGE=${1:-}
OUT=${OUT:-$PWD/gpu_out}
PY=${PY:-python3}
TESTS_S=${TESTS_S:-60}
BENCH_S=${BENCH_S:-360}
CUDA_TESTS=${CUDA_TESTS:-tests/test_cuda_static_compiled.py tests/test_cuda_static_recurrent.py tests/test_cuda_static_trees.py tests/test_cuda_windows.py tests/test_cuda_dflash.py tests/test_static_host_drafters.py tests/test_training_cuda.py tests/test_training_data_path.py}
BENCH_ARGS=${BENCH_ARGS:---preset gpu-session}
PROBE_S=${PROBE_S:-110}
PROBE_TESTS=${PROBE_TESTS:-tests/test_training_decode_labels.py}
PROBE_TESTS_S=${PROBE_TESTS_S:-30}
PROBE_ARGS=${PROBE_ARGS:---targets smollm2 --device cuda --dtype bfloat16 float32 --batch-size 1024 512 --attention grouped --temperatures 0.7 --repeats 1 --ours-only --profile}
export OUT PY
mkdir -p "$OUT"
START=$(date +%s)
log() { echo "[gpu_session +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/session.log"; }
here=$(dirname "$0")

case "$STAGE" in
  stash) exec bash "$here/gpu_train_drafters.sh" stash ;;
  train) exec bash "$here/gpu_train_drafters.sh" train ;;
  probe|bench|dry|host|hostdry) ;;
  *) echo "usage: bash scripts/gpu_session.sh stash|probe|train|bench|dry|host|hostdry" >&2; exit 2 ;;
esac

if [ "$STAGE" = bench ] || [ "$STAGE" = probe ] || [ "$STAGE" = host ]; then
  bash "$here/gpu_train_drafters.sh" join || exit 2
  bash "$here/gpu_train_drafters.sh" ext || exit 2
  SITE=${SITE:-/tmp/specdecode-site}
  [ -d "${PARTS_DIR:-.gguf-parts}/site" ] && cp -r "${PARTS_DIR:-.gguf-parts}/site/." "$SITE/"
  export PYTHONPATH="$SITE:$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  DEVICE=cuda
else
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  DEVICE=cpu
  BENCH_ARGS=${DRY_BENCH_ARGS:---preset gpu-session --quick}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')" 2>&1 | tee -a "$OUT/session.log"

if [ "$STAGE" = probe ]; then
  # The data stage's decode labels on the graphed path, first (a few seconds): when they fail, the
  # train call labels with the second forward instead (gpu_train_drafters.sh reads the marker)
  log "CUDA tests of the decode labels (at most ${PROBE_TESTS_S}s): $PROBE_TESTS"
  # shellcheck disable=SC2086  # PROBE_TESTS is a word list
  timeout "$PROBE_TESTS_S" $PY -m pytest -q -x -p no:randomly -m cuda $PROBE_TESTS > "$OUT/probe_tests.log" 2>&1
  rc=$?
  log "CUDA tests of the decode labels rc=$rc: $(tail -n 1 "$OUT/probe_tests.log")"
  mkdir -p "${STASH:-/tmp/specdecode-gguf}"
  if [ "$rc" != 0 ]; then touch "${STASH:-/tmp/specdecode-gguf}/labels-forward"
  else rm -f "${STASH:-/tmp/specdecode-gguf}/labels-forward"; fi
  log "data probe (at most ${PROBE_S}s): python benchmarks/bench_data_stage.py $PROBE_ARGS"
  # shellcheck disable=SC2086  # PROBE_ARGS is a word list
  timeout "$PROBE_S" $PY benchmarks/bench_data_stage.py $PROBE_ARGS --out "$OUT" > "$OUT/probe.log" 2>&1
  rc=$?
  log "data probe rc=$rc (124: stopped at the limit): $(grep -c 'profile of one batch' "$OUT/probe.log") profiles"
  # the train call reads it from the machine's /tmp (gpu_train_drafters.sh PROBE_PICK)
  [ -f "$OUT/data_stage.csv" ] && cp "$OUT/data_stage.csv" "${STASH:-/tmp/specdecode-gguf}/probe.csv"
  log "$OUT holds $(ls "$OUT" | tr '\n' ' ')"
  exit "$rc"
fi
if [ "$STAGE" = host ] || [ "$STAGE" = hostdry ]; then
  if [ "$STAGE" = host ]; then HOST_ARGS="--device cuda --paths graphed --num-prompts 4 --max-new-tokens 128 --repeats 2"
  else HOST_ARGS="--device cpu --paths eager,static --num-prompts 1 --max-new-tokens 8 --repeats 1"; fi
  HOST_S=${HOST_S:-$([ "$STAGE" = host ] && echo 100 || echo 600)}
  rc=0
  for workload in records code; do
    log "host drafters, $workload (at most ${HOST_S}s): python benchmarks/bench_host_drafters.py --pair smollm2 --workload $workload $HOST_ARGS"
    # shellcheck disable=SC2086  # HOST_ARGS is a word list
    timeout "$HOST_S" $PY benchmarks/bench_host_drafters.py --pair smollm2 --workload "$workload" \
      --prompt-set report --drafters lookup,suffix,lookup-trie,suffix-trie $HOST_ARGS --out "$OUT" \
      > "$OUT/host_$workload.log" 2>&1 || rc=$?
    log "host drafters, $workload: rc=$rc; $(grep -v Converting "$OUT/host_$workload.log" | tail -n 12)"
  done
  exit "$rc"
fi
if [ "$STAGE" = bench ]; then
  log "CUDA tests (at most ${TESTS_S}s): $CUDA_TESTS"
  # shellcheck disable=SC2086  # CUDA_TESTS is a word list
  timeout "$TESTS_S" $PY -m pytest -q -x -p no:randomly -m cuda $CUDA_TESTS > "$OUT/cuda_tests.log" 2>&1
  log "CUDA tests rc=$? (124: stopped at the limit): $(tail -n 1 "$OUT/cuda_tests.log")"
fi
log "bench (at most ${BENCH_S}s): python -m specdecode bench --device $DEVICE $BENCH_ARGS"
# shellcheck disable=SC2086  # BENCH_ARGS is a word list
timeout "$BENCH_S" $PY -m specdecode bench --device "$DEVICE" $BENCH_ARGS --out "$OUT" > "$OUT/bench.log" 2>&1
rc=$?
log "bench rc=$rc (124: stopped at the limit; the groups it finished are in $OUT)"
log "$OUT holds $(ls "$OUT" | tr '\n' ' ')"
exit "$rc"
