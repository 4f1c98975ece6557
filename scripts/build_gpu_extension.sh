#!/usr/bin/env bash
# Builds the CUDA extension for the device machine (an H100/H200 lent through the device tool) HERE,
# on the CPU machine, so that a device call spends no time compiling:
#
#   bash scripts/build_gpu_extension.sh          # about 6 minutes on 2 cores, the first time
#   device run:  STAGES="cudatests sanitizer verify tests bench" bash scripts/gpu_run.sh
#                with carry=["python/specdecode/_C.cpython-312-x86_64-linux-gnu.so"]
#
# Why: built on the device (GCC 13.3 there), every C++ exception the extension throws killed the
# process (SIGSEGV while raising, CPU ops included), while the same sources built with GCC 12 ran the
# whole CUDA test suite there with no crash (H200, 2026-11-26). A build on the device also took
# seven minutes of its fifteen. The device image has Python 3.12 and torch 2.11.0+cu130; this
# script makes the same pair in build/venv-gpu (torch's CUDA wheel from PyPI, about 3 GB with its
# CUDA libraries), compiles for sm_90 with the CUDA toolkit here, and writes
# python/specdecode/_C.cpython-312-x86_64-linux-gnu.so (git ignores it; gpu_run.sh uses it when
# its STAGES leave out "build").
#
# Environment: GPU_TORCH (default 2.11.0), GPU_PYTHON (a Python 3.12, default: python3.12 on PATH
# or pyenv's), CUDA_HOME (default /usr/local/cuda), GPU_ARCHS (default 90).
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_TORCH=${GPU_TORCH:-2.11.0}
GPU_ARCHS=${GPU_ARCHS:-90}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CUDA_HOME=$(readlink -f "$CUDA_HOME")
if [ -z "${GPU_PYTHON:-}" ]; then  # the first Python 3.12 that runs (a pyenv shim may exist and fail)
  for candidate in $(command -v python3.12) $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python 2>/dev/null); do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      GPU_PYTHON=$candidate
      break
    fi
  done
fi
[ -n "$GPU_PYTHON" ] && [ -x "$GPU_PYTHON" ] || { echo "build_gpu_extension: no Python 3.12 found (set GPU_PYTHON)" >&2; exit 2; }
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "build_gpu_extension: no nvcc in $CUDA_HOME/bin (set CUDA_HOME)" >&2; exit 2; }

venv=$PWD/build/venv-gpu
if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$GPU_TORCH' or not torch.version.cuda)" 2>/dev/null; then
  echo "build_gpu_extension: torch $GPU_TORCH (CUDA wheel) for $("$GPU_PYTHON" --version) in $venv"
  "$GPU_PYTHON" -m venv "$venv"
  # --isolated: the CPU wheel index and the constraints of this machine's pip configuration stay out.
  "$venv/bin/pip" install --isolated -q "torch==$GPU_TORCH" pybind11 cmake ninja numpy
fi
nvidia_lib=$("$venv/bin/python" -c "import os, nvidia; print(os.path.join(nvidia.__path__[0], 'cu13', 'lib'))")
[ -e "$nvidia_lib/libnvrtc.so" ] || ln -sf "$nvidia_lib/libnvrtc.so.13" "$nvidia_lib/libnvrtc.so"  # torch's CMake wants the unversioned name

out=build/gpu-ext
echo "build_gpu_extension: configure and build in $out (sm_$GPU_ARCHS)"
CUDA_HOME=$CUDA_HOME "$venv/bin/cmake" -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" -DPython_EXECUTABLE="$venv/bin/python" \
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc" -DCMAKE_CUDA_ARCHITECTURES="$GPU_ARCHS" \
  -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCUDA_INCLUDE_DIRS="$CUDA_HOME/include" \
  -DCUDA_CUDART_LIBRARY="$(ls "$CUDA_HOME"/lib*/libcudart.so | head -1)" \
  -DCUDA_nvrtc_LIBRARY="$nvidia_lib/libnvrtc.so" > build/gpu-ext.log 2>&1 \
  || { tail -30 build/gpu-ext.log; exit 1; }
"$venv/bin/cmake" --build "$out" -j "$(nproc)" >> build/gpu-ext.log 2>&1 || { tail -30 build/gpu-ext.log; exit 1; }
cp "$out"/_C.cpython-312-x86_64-linux-gnu.so python/specdecode/
echo "build_gpu_extension: wrote python/specdecode/_C.cpython-312-x86_64-linux-gnu.so (carry it to the device)"
