#!/usr/bin/env bash
# Compile check of the torch-free CUDA kernels: every csrc/kernels/cuda/*.cu is compiled with
# nvcc for sm_80 and sm_90 into a temporary directory (nothing is linked or run, so no GPU
# and no CUDA-enabled torch are needed). The flags follow the real build (C++17, -O3,
# --expt-relaxed-constexpr) plus the half/bfloat16 macros torch extensions compile with, so
# code that relies on implicit __half conversions fails here too.
#
# Exit status: 0 when everything compiles or when nvcc is absent (a skip message is printed),
# 1 on any compile error. Environment: NVCC (compiler, default: nvcc on PATH or
# $CUDA_HOME/bin/nvcc), SPECDECODE_CUDA_ARCHS (default "80 90"), JOBS (parallel compiles,
# default: the number of CPUs).
set -u -o pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

nvcc_bin="${NVCC:-}"
if [ -z "$nvcc_bin" ]; then
  if command -v nvcc >/dev/null 2>&1; then
    nvcc_bin="$(command -v nvcc)"
  elif [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
    nvcc_bin="$CUDA_HOME/bin/nvcc"
  fi
fi
if [ -z "$nvcc_bin" ] || ! [ -x "$nvcc_bin" ]; then
  echo "check_cuda_kernels: SKIPPED - nvcc not found (set NVCC or CUDA_HOME to enable this check)"
  exit 0
fi

shopt -s nullglob
sources=(csrc/kernels/cuda/*.cu)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "check_cuda_kernels: no csrc/kernels/cuda/*.cu files: nothing to check"
  exit 0
fi

archs="${SPECDECODE_CUDA_ARCHS:-80 90}"
gencode=()
for arch in $archs; do
  gencode+=(-gencode "arch=compute_${arch},code=sm_${arch}")
done
jobs="${JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/specdecode-cuda-check.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "check_cuda_kernels: $("$nvcc_bin" --version | tail -n 2 | head -n 1)"
echo "check_cuda_kernels: ${#sources[@]} file(s), sm_${archs// /, sm_}, up to $jobs in parallel"

compile_one() {
  local src="$1" obj log
  obj="$tmp/$(basename "$src" .cu).o"
  log="$tmp/$(basename "$src" .cu).log"
  local start=$SECONDS
  if "$nvcc_bin" -std=c++17 -I csrc -O3 --expt-relaxed-constexpr \
      -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
      -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
      --Werror cross-execution-space-call \
      "${gencode[@]}" -c "$src" -o "$obj" >"$log" 2>&1; then
    echo "  ok    $src ($((SECONDS - start)) s)"
    if [ -s "$log" ]; then sed 's/^/        /' "$log"; fi
    return 0
  fi
  echo "  FAIL  $src"
  sed 's/^/        /' "$log"
  return 1
}

status=0
pids=()
names=()
for src in "${sources[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  compile_one "$src" >"$tmp/$(basename "$src" .cu).out" &
  pids+=($!)
  names+=("$src")
done
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then status=1; fi
  cat "$tmp/$(basename "${names[$i]}" .cu).out"
done

if [ "$status" -ne 0 ]; then
  echo "check_cuda_kernels: FAILED"
  exit 1
fi
echo "check_cuda_kernels: all CUDA kernel sources compile"
exit 0
