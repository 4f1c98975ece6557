#!/usr/bin/env bash
# The oldest end of the supported transformers range: runs a quick subset of the suite (greedy
# identity, an exact sampling test, the custom_generate plug-in, token trees, the static path,
# per-model facts) against the floor that pyproject.toml declares, in its own virtual
# environment (build/venv-floor) that shares torch, the built extension and everything else
# with the current Python. Run scripts/setup.sh (or scripts/run_tests.sh) first. CI runs it
# after the whole suite, which runs on the newest release (requirements-dev.txt).
#
# Usage: bash scripts/run_floor_tests.sh [extra pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
floor="$(sed -n 's/.*"transformers>=\([0-9][0-9.]*\)[,"].*/\1/p' pyproject.toml | head -n 1)"
if [ -z "$floor" ]; then
  echo "run_floor_tests: no 'transformers>=X' floor found in pyproject.toml" >&2
  exit 2
fi
venv=build/venv-floor
if [ ! -x "$venv/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$venv"
fi
# --system-site-packages shares the base interpreter's packages only; when $PYTHON is itself a
# virtual environment, its packages (specdecode's editable install among them) are added
# behind the floor venv's own, so that the floor's transformers still comes first.
parent_site="$("$PYTHON" -c 'import sys, sysconfig; print(sysconfig.get_paths()["purelib"] if sys.prefix != sys.base_prefix else "")')"
floor_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ -n "$parent_site" ]; then
  echo "import site; site.addsitedir('$parent_site')" >"$floor_site/_specdecode_parent_env.pth"
else
  rm -f "$floor_site/_specdecode_parent_env.pth"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if ! "$venv/bin/python" -m pip install --quiet "transformers==$floor" >build/floor-setup.log 2>&1; then
  echo "run_floor_tests: FAILED to install transformers==$floor; the output follows:" >&2
  tail -n 40 build/floor-setup.log >&2
  exit 1
fi
installed="$("$venv/bin/python" -c 'import transformers; print(transformers.__version__)')"
echo "floor tests: transformers $installed (the floor declared in pyproject.toml)"
"$venv/bin/python" -m pytest -q -ra -p no:randomly \
  tests/test_generate.py::test_greedy_equals_target_generate \
  tests/test_generate.py::test_plugin_return_dict_carries_stats \
  tests/test_generate_sampling.py::test_sampling_is_lossless \
  tests/test_static_generate.py::test_greedy_equals_target_generate \
  tests/test_tree_generation.py \
  tests/test_model_lifetimes.py \
  tests/test_transformers_warnings.py \
  "$@"
