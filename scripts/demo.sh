#!/usr/bin/env bash
# The README's first command: set up (scripts/setup.sh), then speculative generation on the
# embedded pair, streamed, with acceptance statistics. Extra arguments go to the demo, e.g.
#   bash scripts/demo.sh --rule block --gamma 6 --temperature 1 --prompt "def parse("
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
bash scripts/setup.sh > /dev/null
exec "$PYTHON" -m specdecode demo "$@"
