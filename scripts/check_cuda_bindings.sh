#!/usr/bin/env bash
# Compile check of the host CUDA bindings without a GPU or a CUDA build of torch: every
# csrc/ops/*_cuda.cpp is compiled with the host compiler (-fsyntax-only: parsed and its
# templates instantiated, nothing emitted) against the installed torch's headers (a CPU wheel
# ships c10/cuda and ATen/cuda too) and the CUDA toolkit's headers, as the real CUDA build
# would compile it. Torch and CUDA headers are -isystem, so their own warnings stay quiet.
#
# -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE: CPU wheels lack the CMake-generated
# c10/cuda/impl/cuda_cmake_macros.h (it only carries export macros); the macro skips it.
#
# Exit status: 0 when every file compiles, or when torch or the CUDA headers are missing (a skip
# message is printed); 1 on any error. Environment: PYTHON (the interpreter with torch, default
# python3), CXX (default g++), CUDA_HOME (default /usr/local/cuda).
set -u -o pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

python_bin="${PYTHON:-python3}"
cxx="${CXX:-g++}"
cuda_home="${CUDA_HOME:-/usr/local/cuda}"

torch_include="$("$python_bin" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' 2>/dev/null || true)"
if [ -z "$torch_include" ] || ! [ -d "$torch_include/c10/cuda" ]; then
  echo "check_cuda_bindings: SKIPPED - no torch with c10/cuda headers importable by $python_bin"
  exit 0
fi
if ! [ -f "$cuda_home/include/cuda_runtime.h" ]; then
  echo "check_cuda_bindings: SKIPPED - no CUDA headers in $cuda_home/include (set CUDA_HOME)"
  exit 0
fi
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "check_cuda_bindings: SKIPPED - no host compiler $cxx"
  exit 0
fi

shopt -s nullglob
sources=(csrc/ops/*_cuda.cpp)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "check_cuda_bindings: no csrc/ops/*_cuda.cpp files: nothing to check"
  exit 0
fi
abi="$("$python_bin" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"
echo "check_cuda_bindings: $("$cxx" --version | head -n 1); torch headers from $torch_include"

status=0
for src in "${sources[@]}"; do
  start=$SECONDS
  if log="$("$cxx" -std=c++17 -fsyntax-only -Wall -fopenmp-simd -D_GLIBCXX_USE_CXX11_ABI="$abi" \
      -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE -DSPECDECODE_WITH_CUDA=1 -I csrc \
      -isystem "$torch_include" -isystem "$torch_include/torch/csrc/api/include" \
      -isystem "$cuda_home/include" "$src" 2>&1)"; then
    echo "  ok    $src ($((SECONDS - start)) s)"
    if [ -n "$log" ]; then sed 's/^/        /' <<<"$log"; fi
  else
    echo "  FAIL  $src"
    sed 's/^/        /' <<<"$log"
    status=1
  fi
done
if [ "$status" -ne 0 ]; then
  echo "check_cuda_bindings: FAILED"
  exit 1
fi
echo "check_cuda_bindings: every host CUDA binding compiles"
