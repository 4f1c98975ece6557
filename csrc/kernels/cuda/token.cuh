// Token verification on the GPU (Leviathan et al. 2022, Alg. 1; Chen et al. 2023). Lossless.
// Same rule and numerics as kernels/token.h:
//   accept x_i while u_i < min(1, p_i(x_i) / q_i(x_i)); stop at the first rejection;
//   y ~ norm((p_{tau+1} - q_{tau+1})_+) after a rejection (zero mass: y ~ p_{tau+1}),
//   y ~ p_{n+1} when all n drafts are accepted.
// Positions after the first rejection are never read.
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <int BLOCK, class Src>
__device__ RowOutcome token_verify_row_cuda(RowCtx<BLOCK, Src>& c) {
  using State = typename Src::State;
  const Src& src = c.src;
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t x = c.tokens[i];
    const State sp = c.prepare_target(i);
    const State sq = c.prepare_draft(i);
    const double p = src.prob(sp, c.target_row(i), x);
    const double q = src.prob(sq, c.draft_row(i), x);
    if (!accept_token_dev(c.u[i], p, q)) return emit_token(i, c.sample_residual(sp, sq, i, 1.0));
  }
  const State sp = c.prepare_target(c.n);
  return emit_token(c.n, c.sample_target(sp, c.n));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
