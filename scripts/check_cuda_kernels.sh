#!/usr/bin/env bash
# Checks of the CUDA sources that need no GPU (and no torch):
#
#  1. No .cu / .cuh file formats an error message or includes torch: formatting a TORCH_CHECK
#     message inside an nvcc translation unit crashed the process on the GPU, so kernels and
#     launchers return status codes / cudaError_t and messages are built in host .cpp code
#     (csrc/ops/*_cuda.cpp) only. The check strips // and one-line /* */ comments, then fails
#     on TORCH_CHECK*, TORCH_INTERNAL_ASSERT, TORCH_WARN, AT_ERROR, AT_ASSERT, C10_THROW,
#     c10::str, std::ostream / ostringstream / stringstream / to_string / cout / cerr, `throw`,
#     and #include of <sstream>, <ostream>, <iostream> or any ATen / c10 / torch header.
#  2. Every csrc/kernels/cuda/*.cu compiles with nvcc for sm_80 and sm_90 (nothing is linked or
#     run). The flags follow the real build (C++17, -O3, --expt-relaxed-constexpr) plus the
#     half/bfloat16 macros torch extensions compile with, so code that relies on implicit
#     __half conversions fails here too.
#
# Usage: bash scripts/check_cuda_kernels.sh [--messages-only]
# Exit status: 0 when everything passes (step 2 is skipped, with a message, when nvcc is
# absent), 1 otherwise. Environment: SPECDECODE_CUDA_SOURCE_ROOT (directory searched by step 1,
# default csrc), NVCC (compiler, default: nvcc on PATH or $CUDA_HOME/bin/nvcc),
# SPECDECODE_CUDA_ARCHS (default "80 90"), JOBS (parallel compiles, default: the number of CPUs).
set -u -o pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# ------------------------------------------------------------------ 1. no messages in .cu/.cuh
source_root="${SPECDECODE_CUDA_SOURCE_ROOT:-csrc}"
forbidden='TORCH_CHECK|TORCH_INTERNAL_ASSERT|TORCH_WARN|AT_ERROR|AT_ASSERT|C10_THROW|c10::str|std::(basic_)?(o|i)?stringstream|std::(basic_)?ostream|std::to_string|std::(cout|cerr)|(^|[^A-Za-z0-9_])throw([^A-Za-z0-9_]|$)|#[[:space:]]*include[[:space:]]*[<"](sstream|ostream|iostream|ATen/|c10/|torch/)'
violations=0
while IFS= read -r -d '' file; do
  hits="$(sed -e 's://.*$::' -e ':a' -e 's:/\*[^*]*\*/::' -e 'ta' "$file" | grep -nE "$forbidden" || true)"
  if [ -n "$hits" ]; then
    violations=1
    while IFS= read -r hit; do
      echo "  FAIL  $file:${hit%%:*}: ${hit#*:}"
    done <<<"$hits"
  fi
done < <(find "$source_root" -type f \( -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
if [ "$violations" -ne 0 ]; then
  echo "check_cuda_kernels: FAILED - the lines above format an error message, throw, or include torch in a"
  echo "  .cu/.cuh file. Kernels and launchers must return status codes / cudaError_t; build messages and"
  echo "  raise in the host bindings (csrc/ops/*_cuda.cpp, csrc/ops/verify_device.h) instead."
  exit 1
fi
echo "check_cuda_kernels: no .cu/.cuh file under $source_root formats a message, throws or includes torch"
if [ "${1:-}" = "--messages-only" ]; then
  exit 0
fi

# ------------------------------------------------------------------ 2. nvcc compile
nvcc_bin="${NVCC:-}"
if [ -z "$nvcc_bin" ]; then
  if command -v nvcc >/dev/null 2>&1; then
    nvcc_bin="$(command -v nvcc)"
  elif [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
    nvcc_bin="$CUDA_HOME/bin/nvcc"
  fi
fi
if [ -z "$nvcc_bin" ] || ! [ -x "$nvcc_bin" ]; then
  echo "check_cuda_kernels: nvcc compile SKIPPED - nvcc not found (set NVCC or CUDA_HOME to enable this check)"
  exit 0
fi

shopt -s nullglob
sources=(csrc/kernels/cuda/*.cu)
if [ "${#sources[@]}" -eq 0 ]; then
  echo "check_cuda_kernels: no csrc/kernels/cuda/*.cu files: nothing to compile"
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
