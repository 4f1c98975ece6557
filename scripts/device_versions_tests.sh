#!/usr/bin/env bash
# CPU tests under the device machine's versions (Python 3.12, torch 2.11, transformers 5.17),
# HERE, before a GPU session: what runs on the lent GPU is imported there with those versions, and
# a failure found on the device costs its minutes (the H200 session of 2026-11-28 lost its CUDA
# tests to a Dynamo difference of torch 2.11 that these tests reproduce on the CPU).
#
#   bash scripts/build_gpu_extension.sh     # first: build/venv-gpu (torch 2.11) and the cp312 extension
#   bash scripts/device_versions_tests.sh   # then this (~3 minutes on 2 cores)
#
# It adds what the tests need to build/venv-gpu (transformers DEVICE_TRANSFORMERS, pytest, scipy,
# hypothesis; the device itself has no pip: nothing of this travels) and runs DEVICE_TESTS from
# the working tree (PYTHONPATH=python, the extension python/specdecode/_C.cpython-312-*.so).
# Extra arguments go to pytest.
#
# Environment: DEVICE_TRANSFORMERS [5.17.0], DEVICE_TESTS [the compiled, static, training-data and
# attention test files named below].
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv-gpu
DEVICE_TRANSFORMERS=${DEVICE_TRANSFORMERS:-5.17.0}
DEVICE_TESTS=${DEVICE_TESTS:-tests/test_static_compiled.py tests/test_tree_compiled_rules.py tests/test_static_generate.py \
tests/test_static_features.py tests/test_grouped_attention.py tests/test_training_data_path.py tests/test_training.py \
tests/test_training_decode_labels.py tests/test_training_eagle.py tests/test_training_eagle_unroll.py}
[ -x "$venv/bin/python" ] || { echo "device_versions_tests: no $venv: run scripts/build_gpu_extension.sh first" >&2; exit 2; }
ls python/specdecode/_C.cpython-312-*.so >/dev/null 2>&1 \
  || { echo "device_versions_tests: no Python 3.12 extension: run scripts/build_gpu_extension.sh first" >&2; exit 2; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
if ! "$venv/bin/python" -c "import transformers, pytest, scipy, hypothesis, sys; \
sys.exit(transformers.__version__ != '$DEVICE_TRANSFORMERS')" 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet "transformers==$DEVICE_TRANSFORMERS" pytest scipy hypothesis \
    > build/device-versions-setup.log 2>&1 \
    || { echo "device_versions_tests: pip failed; see build/device-versions-setup.log" >&2; exit 1; }
fi
"$venv/bin/python" -c "import sys, torch, transformers; print('device versions: Python', sys.version.split()[0], \
'torch', torch.__version__, 'transformers', transformers.__version__)"
# shellcheck disable=SC2086  # DEVICE_TESTS is a word list
PYTHONPATH=python "$venv/bin/python" -m pytest -q -p no:randomly -p no:cacheprovider $DEVICE_TESTS "$@"
