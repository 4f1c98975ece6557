// Greedy verification on the GPU (temperature 0), as kernels/greedy.h: accept x_i while
// x_i == argmax p_i; y = argmax p_{tau+1}; ties go to the lowest id (torch.argmax). The status
// looks at target positions 0..tau only (the CPU reads them in order and stops at the first
// mismatch).
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// argmax of target position i of a probability row from the position pass: ProbRow::argmax's
// sequential scan keeps element 0 when it is NaN, and otherwise skips NaN entries.
template <int BLOCK, typename T>
__device__ int64_t probs_argmax(const RowCtx<BLOCK, T>& c, int64_t i) {
  const T* row = c.target_row(i);
  const double first = to_double(row[0]);
  if (first != first) return 0;
  const PosAgg* aggs = c.a.aggs + (c.b * (c.a.G + 1) + i) * c.a.chunks;
  ArgMax best{-double_inf(), kNoIndex};
  for (int64_t k = 0; k < c.a.chunks; ++k) {
    const PosAgg g = aggs[k];
    if (g.best_index != kNoIndex) best = OpArgMax()(best, ArgMax{g.best_value, g.best_index});
  }
  return best.index == kNoIndex ? 0 : best.index;
}

// The argmax of target position i: from its state (logits) or the position pass (probabilities).
template <int BLOCK, typename T>
__device__ int64_t target_argmax(const RowCtx<BLOCK, T>& c, int64_t i) {
  if (c.a.is_logits) return c.a.states[c.target_unit(i)].argmax;
  return probs_argmax(c, i);
}

// Collective (decide-1 for logits; decide-2 after the argmax pass for probabilities).
template <int BLOCK, typename T>
__device__ RowPlan greedy_decide(const RowCtx<BLOCK, T>& c) {
  int64_t mismatch = kNoIndex;
  for (int64_t i = threadIdx.x; i < c.n; i += BLOCK)
    if (c.x[i] != target_argmax(c, i) && i < mismatch) mismatch = i;
  mismatch = block_reduce<BLOCK>(mismatch, OpMin(), c.scratch);
  const int64_t tau = mismatch == kNoIndex ? c.n : mismatch;
  const int32_t status = c.read_status(tau, -1);
  return make_plan(status, tau, target_argmax(c, tau), kEmitNone, tau, 0.0);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
