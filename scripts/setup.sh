#!/usr/bin/env bash
# Installs specdecode and its dependencies into the current Python, compiling the extension
# against the pinned torch. Safe to re-run. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install --quiet --disable-pip-version-check torch==2.13.0
"$PYTHON" -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e .
"$PYTHON" -m specdecode.info
