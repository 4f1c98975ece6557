#!/usr/bin/env bash
# The README's first command: set up (scripts/setup.sh; skipped when the installed build already
# matches this checkout), then speculative generation on the embedded pair, streamed, with
# acceptance statistics. Extra arguments go to the demo, e.g.
#   bash scripts/demo.sh --rule block --gamma 6 --temperature 1 --prompt "def parse("
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" scripts/build_stamp.py check 2>/dev/null || [ "${SPECDECODE_FORCE_SETUP:-0}" = "1" ]; then
  echo "First run: installing the dependencies and building the extension (a few minutes, once)..."
  bash scripts/setup.sh --quiet
fi
exec "$PYTHON" -m specdecode demo "$@"
