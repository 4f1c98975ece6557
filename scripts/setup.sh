#!/usr/bin/env bash
# Installs specdecode and its dependencies into the current Python, compiling the extension
# against the pinned torch. Safe to re-run. pip's output is kept in build/setup.log and shown
# only when a step fails.
#
# Usage: bash scripts/setup.sh [--if-needed] [--quiet]
#   --if-needed  do nothing when the installed build already matches this checkout (sources,
#                requirements, interpreter and torch; checked by scripts/build_stamp.py in well
#                under a second). SPECDECODE_FORCE_SETUP=1 ignores the check.
#   --quiet      no progress lines and no build report at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if_needed=0
quiet=0
for arg in "$@"; do
  case "$arg" in
    --if-needed) if_needed=1 ;;
    --quiet) quiet=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --if-needed, --quiet)" >&2; exit 2 ;;
  esac
done
say() { if [ "$quiet" -eq 0 ]; then echo "$@"; fi; }

if [ "$if_needed" -eq 1 ] && [ "${SPECDECODE_FORCE_SETUP:-0}" != "1" ] \
    && "$PYTHON" scripts/build_stamp.py check; then
  say "setup: the installed build matches this checkout (SPECDECODE_FORCE_SETUP=1 reinstalls)"
  exit 0
fi

mkdir -p build
log=build/setup.log
: > "$log"
step() {  # step DESCRIPTION COMMAND...: run quietly, show pip's output only on failure
  local what="$1"
  shift
  say "setup: $what"
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: FAILED while trying to $what; the output follows (also in $log):" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
step "install torch 2.13.0" "$PYTHON" -m pip install --quiet torch==2.13.0
step "install the dependencies (requirements-dev.txt)" "$PYTHON" -m pip install --quiet -r requirements-dev.txt
step "build the extension against this torch (about a minute)" \
  "$PYTHON" -m pip install --quiet --no-build-isolation -e .
"$PYTHON" scripts/build_stamp.py write
if [ "$quiet" -eq 0 ]; then
  "$PYTHON" -m specdecode.info
fi
