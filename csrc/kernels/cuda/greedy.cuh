// Greedy verification on the GPU (temperature 0), as kernels/greedy.h: accept x_i while
// x_i == argmax p_i; y = argmax p_{tau+1}; ties go to the lowest id (torch.argmax).
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <int BLOCK, class Src>
__device__ RowOutcome greedy_verify_row_cuda(RowCtx<BLOCK, Src>& c) {
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t best = c.target_argmax(i);
    if (c.tokens[i] != best) return emit_token(i, best);
  }
  return emit_token(c.n, c.target_argmax(c.n));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
