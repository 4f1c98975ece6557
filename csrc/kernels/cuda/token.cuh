// Token verification on the GPU (Leviathan et al. 2022, Alg. 1; Chen et al. 2023). Lossless.
// Same rule and numerics as kernels/token.h:
//   accept x_i while u_i < min(1, p_i(x_i) / q_i(x_i)); stop at the first rejection;
//   y ~ norm((p_{tau+1} - q_{tau+1})_+) after a rejection (zero mass: y ~ p_{tau+1}),
//   y ~ p_{n+1} when all n drafts are accepted.
// Every decision uses only p_i(x_i) and q_i(x_i), so they are all made here, in parallel over
// positions (the first rejection is a block-wide minimum); the emitted token is drawn by the
// sampler kernels. As on the CPU, the row's status only looks at the positions the rule reads:
// targets 0..tau and drafts 0..min(tau, n-1); a NaN after the first rejection is never seen.
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Collective (decide-1 kernel).
template <int BLOCK, typename T>
__device__ RowPlan token_decide(const RowCtx<BLOCK, T>& c) {
  int64_t reject = kNoIndex;
  for (int64_t i = threadIdx.x; i < c.n; i += BLOCK) {
    const int64_t tok = c.x[i];
    if (!accept_token_dev(c.coin(i), c.target_prob(i, tok), c.draft_prob(i, tok)) && i < reject) reject = i;
  }
  reject = block_reduce<BLOCK>(reject, OpMin(), c.scratch);
  const int64_t tau = reject == kNoIndex ? c.n : reject;
  const int32_t status = c.read_status(tau, tau < c.n ? tau : c.n - 1);
  if (tau < c.n) return make_plan(status, tau, -1, kEmitResidual, tau, 1.0);
  return make_plan(status, tau, -1, kEmitTarget, tau, 0.0);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
