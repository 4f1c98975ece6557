#!/usr/bin/env bash
# The README's test command: set up (scripts/setup.sh; skipped when the installed build already
# matches this checkout), then run the whole test suite in a random order (the seed is printed).
# The test files are shared among one pytest worker per core (pytest-xdist, whole files per
# worker so that a module's fixtures load once; SPECDECODE_TEST_WORKERS=N sets the number, 1 runs
# in this process). Extra arguments go to pytest.
# pytest's exit code 5 ("no tests collected") counts as failure unless
# SPECDECODE_ALLOW_NO_TESTS=1, so a broken collection can never look green.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
bash scripts/setup.sh --if-needed || exit 1
# The suite runs in a random order (pytest-randomly); the seed is printed so that a failure can
# be replayed in the same order: SPECDECODE_TEST_SEED=<seed> bash scripts/run_tests.sh
seed="${SPECDECODE_TEST_SEED:-$("$PYTHON" -c 'import random; print(random.randrange(1, 2**31))')}"
echo "test order: random, seed $seed (replay with SPECDECODE_TEST_SEED=$seed bash scripts/run_tests.sh)"
workers="${SPECDECODE_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadfile)
  echo "test workers: $workers (SPECDECODE_TEST_WORKERS=1 runs them in one process)"
fi
"$PYTHON" -m pytest -q -ra --randomly-seed="$seed" "${parallel[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests"
  if [ "${SPECDECODE_ALLOW_NO_TESTS:-0}" = "1" ]; then exit 0; fi
fi
exit "$status"
