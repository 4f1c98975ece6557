// Typical acceptance on the GPU (Medusa, Cai et al. 2024). Lossy. As kernels/typical.h:
//   accept x_i while p_i(x_i) > min(epsilon, delta * exp(-H(p_i))), H(p) = -sum p log p;
//   y = argmax p_{tau+1}, or y ~ p_{tau+1} when sample_correction is set.
// The position pass computes sum p log p of every position i < n chunk by chunk (float64 logs;
// for logits the p there use the fast exp, documented in pipeline.cuh); decide-2 sums the
// chunks in order and makes the decisions. Status: target positions 0..tau.
#pragma once

#include "kernels/cuda/greedy.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Collective (decide-2 kernel).
template <int BLOCK, typename T>
__device__ RowPlan typical_decide(const RowCtx<BLOCK, T>& c) {
  const Args<T>& a = c.a;
  int64_t reject = kNoIndex;
  for (int64_t i = threadIdx.x; i < c.n; i += BLOCK) {
    const PosAgg* aggs = a.aggs + (c.b * (a.G + 1) + i) * a.chunks;
    double plogp = 0.0;
    for (int64_t k = 0; k < a.chunks; ++k) plogp += aggs[k].sum;
    const double scaled = a.params.delta * exp(plogp);  // exp(-H), H = -sum p log p
    const double threshold = scaled < a.params.epsilon ? scaled : a.params.epsilon;  // std::min
    if (!(c.target_prob(i, c.x[i]) > threshold) && i < reject) reject = i;
  }
  reject = block_reduce<BLOCK>(reject, OpMin(), c.scratch);
  const int64_t tau = reject == kNoIndex ? c.n : reject;
  const int32_t status = c.read_status(tau, -1);
  if (a.params.sample_correction) return make_plan(status, tau, -1, kEmitTarget, tau, 0.0);
  return make_plan(status, tau, target_argmax(c, tau), kEmitNone, tau, 0.0);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
