#!/usr/bin/env bash
# One command for a session that has a GPU (an H100 through the device tool): build the CUDA
# extension for sm_90, run the whole test suite (the CUDA tests included) and the decode-path
# benchmark (`python -m specdecode bench --device cuda`), with every log and result in $OUT.
#
#   device run:   bash scripts/gpu_run.sh            (timeout_s=600)
#
# What comes back (8 files, the device tool's limit): run.log (this script's progress, the
# versions, the benchmark's tables), build.log (pip build + `specdecode info`), pytest.log,
# bench_gpu.csv / bench_gpu.json (every row; the JSON's meta has the greedy check), 
# bench_gpu_greedy_check.csv, bench_gpu_demo.png and bench_gpu_1b.png.
#
# The whole run must end inside the device tool's 10 minutes: each stage gets what is left of
# TOTAL_S (default 570 s); the benchmark writes its results after every group, so a benchmark cut
# short still returns the groups it finished (batch 1 first: the goals). Environment:
#   STAGES      stages to run, default "build tests bench" (e.g. STAGES="build bench")
#   TOTAL_S     seconds for the whole script (default 570)
#   TESTS_S     most seconds for the tests (default 170)
#   BENCH_ARGS  extra arguments for the benchmark (default: 2 repeats, 3 prompts at batch 1,
#               64 new tokens, 16 prompts for the greedy check)
#   PY          the Python to use (default python3, the device image's PyTorch)
# Optional wheels in .whl/ (carried with the call) are installed first into /tmp/site, e.g.
# transformers==5.24.0 to test the transformers version the CPU CI uses (the image has 5.17).
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PY:-python3}
STAGES=${STAGES:-build tests bench}
TOTAL_S=${TOTAL_S:-570}
TESTS_S=${TESTS_S:-170}
BENCH_ARGS=${BENCH_ARGS:---repeats 2 --prompts-batch1 3 --max-new-tokens 64 --check-prompts 16}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
log() { echo "[gpu_run +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/run.log"; }
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
log "versions"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO GPU')" 2>&1 | tee -a "$OUT/run.log"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$OUT/run.log"

rc_build=0; rc_tests=-; rc_bench=-
if has build; then
  log "build (sm_90)"
  SKBUILD_CMAKE_DEFINE="CMAKE_CUDA_ARCHITECTURES=90" CMAKE_BUILD_PARALLEL_LEVEL=16 \
    timeout "$(left)" $PY -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
  rc_build=$?
  $PY -m specdecode info >> "$OUT/build.log" 2>&1
  log "build rc=$rc_build"
  grep -E "CUDA kernels|philox|CUDA device" "$OUT/build.log" | tee -a "$OUT/run.log"
  if [ "$rc_build" -ne 0 ]; then tail -40 "$OUT/build.log"; log "build failed: stopping"; exit 1; fi
fi

if has tests; then
  budget=$(( $(left) - 200 )); [ "$budget" -gt "$TESTS_S" ] && budget=$TESTS_S
  log "tests (pytest -n 8, at most ${budget}s)"
  timeout "$budget" $PY -m pytest -q -n 8 -p no:cacheprovider -rs --durations=20 tests/ > "$OUT/pytest.log" 2>&1
  rc_tests=$?
  log "tests rc=$rc_tests (124 = cut at the time limit)"
  grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3 | tee -a "$OUT/run.log"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -30 | tee -a "$OUT/run.log"
fi

if has bench; then
  budget=$(( $(left) - 5 ))
  log "benchmark (at most ${budget}s): python -m specdecode bench --device cuda $BENCH_ARGS"
  # shellcheck disable=SC2086
  timeout "$budget" $PY -m specdecode bench --device cuda --out "$OUT/bench" $BENCH_ARGS 2>&1 \
    | grep -v "Loading weights" | tee -a "$OUT/run.log"
  rc_bench=${PIPESTATUS[0]}
  log "benchmark rc=$rc_bench (124 = cut at the time limit; the finished groups are in bench_gpu.csv)"
  for f in bench_gpu.csv bench_gpu.json bench_gpu_greedy_check.csv bench_gpu_demo.png bench_gpu_1b.png; do
    [ -f "$OUT/bench/$f" ] && mv "$OUT/bench/$f" "$OUT/$f"
  done
  rm -rf "$OUT/bench"
fi
log "done: build=$rc_build tests=$rc_tests bench=$rc_bench"
