// Top-beta acceptance with tolerance on the GPU (Xia et al. 2022, "SpecDec"). Lossy. As
// kernels/top_beta.h: accept x_i while fewer than beta tokens are strictly more likely than x_i
// and log p_i(argmax) - log p_i(x_i) <= tolerance (never a token with p = 0);
// y = argmax p_{tau+1}.
// The position pass counts, chunk by chunk and exactly, the entries with p > p_i(x_i) (for
// logits: kept entries with e > e(x_i), which needs e only where the logit exceeds x_i's, since
// e is non-decreasing in the logit) and, for probabilities, the max p; for logits max p is the
// max logit's p = 1 * inv_norm. Status: target positions 0..tau.
#pragma once

#include "kernels/cuda/greedy.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Collective (decide-2 kernel).
template <int BLOCK, typename T>
__device__ RowPlan top_beta_decide(const RowCtx<BLOCK, T>& c) {
  const Args<T>& a = c.a;
  int64_t reject = kNoIndex;
  for (int64_t i = threadIdx.x; i < c.n; i += BLOCK) {
    const double px = c.target_prob(i, c.x[i]);
    bool accept = px > 0.0;
    if (accept) {
      const PosAgg* aggs = a.aggs + (c.b * (a.G + 1) + i) * a.chunks;
      int64_t more_likely = 0;
      double p_max = px;
      for (int64_t k = 0; k < a.chunks; ++k) {
        more_likely += aggs[k].count;
        if (!a.is_logits && aggs[k].best_index != kNoIndex && aggs[k].best_value > p_max) p_max = aggs[k].best_value;
      }
      if (a.is_logits) {
        const double top = a.states[c.target_unit(i)].inv_norm;  // p of the max logit (e = 1)
        p_max = top > p_max ? top : p_max;
      }
      accept = more_likely < a.params.beta && (log(p_max) - log(px)) <= a.params.tolerance;
    }
    if (!accept && i < reject) reject = i;
  }
  reject = block_reduce<BLOCK>(reject, OpMin(), c.scratch);
  const int64_t tau = reject == kNoIndex ? c.n : reject;
  const int32_t status = c.read_status(tau, -1);
  return make_plan(status, tau, target_argmax(c, tau), kEmitNone, tau, 0.0);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
