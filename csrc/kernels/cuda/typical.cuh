// Typical acceptance on the GPU (Medusa, Cai et al. 2024). Lossy. As kernels/typical.h:
//   accept x_i while p_i(x_i) > min(epsilon, delta * exp(-H(p_i))), H(p) = -sum p log p;
//   y = argmax p_{tau+1}, or y ~ p_{tau+1} when sample_correction is set.
// H is a block reduction in float64 (CUDA's log/exp: within an ulp of glibc's).
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <int BLOCK, class Src>
__device__ RowOutcome typical_verify_row_cuda(RowCtx<BLOCK, Src>& c) {
  using T = typename Src::Elem;
  using State = typename Src::State;
  const Src& src = c.src;
  int64_t tau = c.n;
  State s{};
  for (int64_t i = 0; i < c.n; ++i) {
    s = c.prepare_target(i);
    double plogp = 0.0;
    row_for_each<BLOCK>(c.target_row(i), c.V, [&](int64_t, T raw) {
      const double p = src.value_prob(s, raw);
      if (p > 0.0) plogp += p * log(p);
    });
    const double entropy = -block_reduce<BLOCK>(plogp, OpSum(), c.sh.reduce);
    const double scaled = c.params.delta * exp(-entropy);
    const double threshold = scaled < c.params.epsilon ? scaled : c.params.epsilon;  // std::min
    if (!(src.prob(s, c.target_row(i), c.tokens[i]) > threshold)) {
      tau = i;
      break;
    }
  }
  if (c.params.sample_correction) {
    if (tau == c.n) s = c.prepare_target(tau);
    return emit_token(tau, c.sample_target(s, tau));
  }
  return emit_token(tau, c.target_argmax(tau));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
