#!/usr/bin/env bash
# One command for a session that has a GPU (an H100 through the device tool): build the CUDA
# extension for sm_90, run the CUDA tests (`pytest -m cuda`), compute-sanitizer's memcheck and
# racecheck over scripts/cuda_sanitizer_calls.py, the verify benchmark, the whole test suite and
# the decode-path benchmark (`python -m specdecode bench --device cuda`), with every log and result
# in $OUT.
#
#   device run:   bash scripts/gpu_run.sh            (timeout_s=600)
#
# Better: build the extension here first (bash scripts/build_gpu_extension.sh: an extension built on
# the device with its GCC 13.3 crashed on every C++ exception, and the build took seven of the
# fifteen device minutes), then run with STAGES="cudatests sanitizer verify tests bench" and
# carry=["python/specdecode/_C.cpython-312-x86_64-linux-gnu.so"].
#
# What comes back (8 files, the device tool's limit): run.log (this script's progress, the
# versions, the summaries), build.log (pip build + `specdecode info`), pytest_cuda.log,
# sanitizer.log, verify.log (benchmarks/cuda_verify_bench.py), pytest.log, and bench_gpu.csv /
# bench_gpu.json (every row; the JSON's meta has the greedy check).
#
# The whole run must end inside the device tool's 10 minutes: each stage gets what is left of
# TOTAL_S (default 570 s); the benchmark writes its results after every group, so a benchmark cut
# short still returns the groups it finished (batch 1 first: the issue's goals). Environment:
#   STAGES      stages to run, in this order whatever the order given, default
#               "build cudatests sanitizer verify tests bench", without "build" when a prebuilt
#               extension was carried (e.g. STAGES="build cudatests")
#   TOTAL_S     seconds for the whole script (default 570)
#   CUDA_TESTS_S, SANITIZER_S, VERIFY_S, TESTS_S
#               most seconds for the CUDA tests (default 120), each sanitizer tool (90), the
#               verify benchmark (60, without its torch.compile baseline unless VERIFY_ARGS="")
#               and the whole suite (170)
#   BENCH_ARGS  extra arguments for the benchmark (default: 2 repeats, 3 prompts at batch 1,
#               64 new tokens, 16 prompts for the greedy check)
#   PY          the Python to use (default python3, the device image's PyTorch)
# Optional wheels in .whl/ (carried with the call) are installed first into /tmp/site, e.g.
# transformers==5.24.0 to test the transformers version the CPU CI uses (the image has 5.17).
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -z "${STAGES:-}" ]; then  # a carried prebuilt extension (scripts/build_gpu_extension.sh) needs no build
  STAGES="build cudatests sanitizer verify tests bench"
  ls python/specdecode/_C.cpython-312-*.so >/dev/null 2>&1 && STAGES="cudatests sanitizer verify tests bench"
fi
TOTAL_S=${TOTAL_S:-570}
TESTS_S=${TESTS_S:-170}
CUDA_TESTS_S=${CUDA_TESTS_S:-120}
SANITIZER_S=${SANITIZER_S:-90}  # racecheck needed more than 80 s on an H200
VERIFY_S=${VERIFY_S:-60}
VERIFY_ARGS=${VERIFY_ARGS---no-compile}
BENCH_ARGS=${BENCH_ARGS:---repeats 2 --prompts-batch1 3 --max-new-tokens 64 --check-prompts 16}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
cap() { local b=$(( $(left) - 10 )); [ "$b" -gt "$1" ] && b=$1; [ "$b" -lt 1 ] && b=1; echo "$b"; }
log() { echo "[gpu_run +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/run.log"; }
has() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
log "versions"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO GPU')" 2>&1 | tee -a "$OUT/run.log"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$OUT/run.log"

# Without the build stage, an extension built on the CPU machine by scripts/build_gpu_extension.sh
# (carried in python/specdecode/) is used from the source tree.
if ! has build && ls python/specdecode/_C.cpython-312-*.so >/dev/null 2>&1; then
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  log "prebuilt extension: $(ls python/specdecode/_C.cpython-312-*.so)"
fi
rc_build=0; rc_cuda=-; rc_san=-; rc_verify=-; rc_tests=-; rc_bench=-
if has build; then
  log "build (sm_90)"
  SKBUILD_CMAKE_DEFINE="CMAKE_CUDA_ARCHITECTURES=90" TORCH_CUDA_ARCH_LIST=9.0 CMAKE_BUILD_PARALLEL_LEVEL=16 \
    timeout "$(left)" $PY -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1
  rc_build=$?
  $PY -m specdecode info >> "$OUT/build.log" 2>&1
  log "build rc=$rc_build"
  grep -E "CUDA kernels|philox|CUDA device" "$OUT/build.log" | tee -a "$OUT/run.log"
  if [ "$rc_build" -ne 0 ]; then tail -40 "$OUT/build.log"; log "build failed: stopping"; exit 1; fi
fi

# run_pytest NAME LOG SECONDS [PYTEST ARGS...]: pytest -n 8 over tests/, its summary into run.log;
# sets rc_pytest.
run_pytest() {
  local name=$1 logfile=$2 budget=$3; shift 3
  log "$name (pytest -n 8 $*, at most ${budget}s)"
  timeout "$budget" $PY -m pytest -q -n 8 -p no:cacheprovider -p no:randomly -rs --durations=15 "$@" tests/ \
    > "$OUT/$logfile" 2>&1
  rc_pytest=$?
  log "$name rc=$rc_pytest (124 = cut at the time limit)"
  grep -E "passed|failed|error" "$OUT/$logfile" | tail -3 | tee -a "$OUT/run.log"
  grep -E "^(FAILED|ERROR)|crashed" "$OUT/$logfile" | head -40 | tee -a "$OUT/run.log"
}

if has cudatests; then
  run_pytest "CUDA tests" pytest_cuda.log "$(cap "$CUDA_TESTS_S")" -m cuda
  rc_cuda=$rc_pytest
fi

if has sanitizer; then
  rc_san=""
  for tool in memcheck racecheck; do
    budget=$(cap "$SANITIZER_S")
    log "compute-sanitizer --tool $tool (at most ${budget}s)"
    echo "===== $tool" >> "$OUT/sanitizer.log"
    timeout "$budget" compute-sanitizer --tool "$tool" --error-exitcode 1 $PY scripts/cuda_sanitizer_calls.py \
      >> "$OUT/sanitizer.log" 2>&1
    rc=$?; rc_san="$rc_san$tool=$rc "
    log "$tool rc=$rc (124 = cut at the time limit)"
    grep -E "ERROR SUMMARY|calls|Error" "$OUT/sanitizer.log" | tail -4 | tee -a "$OUT/run.log"
  done
fi

if has verify; then
  budget=$(cap "$VERIFY_S")
  log "verify benchmark (at most ${budget}s): benchmarks/cuda_verify_bench.py $VERIFY_ARGS"
  # shellcheck disable=SC2086
  timeout "$budget" $PY benchmarks/cuda_verify_bench.py $VERIFY_ARGS > "$OUT/verify.log" 2>&1
  rc_verify=$?
  log "verify benchmark rc=$rc_verify"
fi

if has tests; then
  reserve=10; has bench && reserve=200  # the benchmark's batch-1 groups need about 200 s
  budget=$(( $(left) - reserve )); [ "$budget" -gt "$TESTS_S" ] && budget=$TESTS_S
  run_pytest "tests" pytest.log "$budget"
  rc_tests=$rc_pytest
fi

if has bench; then
  budget=$(( $(left) - 5 ))
  log "benchmark (at most ${budget}s): python -m specdecode bench --device cuda $BENCH_ARGS"
  # shellcheck disable=SC2086
  timeout "$budget" $PY -m specdecode bench --device cuda --out "$OUT/bench" $BENCH_ARGS 2>&1 \
    | grep -v "Loading weights" | tee -a "$OUT/run.log"
  rc_bench=${PIPESTATUS[0]}
  log "benchmark rc=$rc_bench (124 = cut at the time limit; the finished groups are in bench_gpu.csv)"
  for f in bench_gpu.csv bench_gpu.json; do
    [ -f "$OUT/bench/$f" ] && mv "$OUT/bench/$f" "$OUT/$f"
  done
  rm -rf "$OUT/bench"
fi
log "done: build=$rc_build cudatests=$rc_cuda sanitizer=[$rc_san] verify=$rc_verify tests=$rc_tests bench=$rc_bench"
