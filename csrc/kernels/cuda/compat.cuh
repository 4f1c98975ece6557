// What every CUDA kernel file includes first: the CUDA runtime and half/bfloat16 headers, and
// SPECDECODE_LAUNCH, the one way kernels are launched here:
//   SPECDECODE_LAUNCH(kernel, grid, block, shared_bytes, stream)(arguments...);
//   cudaError_t err = SPECDECODE_LAST_ERROR();
//
// With SPECDECODE_CUDA_EMULATION defined, the same kernel sources compile as plain host C++
// (g++) against tests/cuda_emu/cuda_emu.h, which runs every CUDA thread of a block as a
// coroutine with real __syncthreads / warp-shuffle semantics. The test suite uses that to run
// the CUDA kernels on a machine without a GPU (tests/test_cuda_emulation.py). Nothing here
// formats a message or throws: errors travel as status codes and cudaError_t values.
#pragma once

#if defined(SPECDECODE_CUDA_EMULATION)
#include "cuda_emu.h"
#define SPECDECODE_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  ::specdecode_emu::Launch((grid), (block), (shared_bytes), (stream)).run(kernel)
#define SPECDECODE_LAST_ERROR() ::specdecode_emu::last_error()
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define SPECDECODE_LAUNCH(kernel, grid, block, shared_bytes, stream) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>
#define SPECDECODE_LAST_ERROR() cudaGetLastError()
#endif
