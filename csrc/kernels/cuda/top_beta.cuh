// Top-beta acceptance with tolerance on the GPU (Xia et al. 2022, "SpecDec"). Lossy. As
// kernels/top_beta.h: accept x_i while fewer than beta tokens are strictly more likely than x_i
// and log p_i(argmax) - log p_i(x_i) <= tolerance (never a token with p = 0);
// y = argmax p_{tau+1}.
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <int BLOCK, class Src>
__device__ RowOutcome top_beta_verify_row_cuda(RowCtx<BLOCK, Src>& c) {
  using T = typename Src::Elem;
  using State = typename Src::State;
  const Src& src = c.src;
  int64_t tau = c.n;
  for (int64_t i = 0; i < c.n; ++i) {
    const State s = c.prepare_target(i);
    const double px = src.prob(s, c.target_row(i), c.tokens[i]);
    bool accept = px > 0.0;
    if (accept) {
      CountMax cm{0, px};
      row_for_each<BLOCK>(c.target_row(i), c.V, [&](int64_t, T raw) {
        const double p = src.value_prob(s, raw);
        cm.count += p > px ? 1 : 0;
        cm.max = p > cm.max ? p : cm.max;
      });
      cm = block_reduce<BLOCK>(cm, OpCountMax(), c.sh.reduce);
      accept = cm.count < c.params.beta && (log(cm.max) - log(px)) <= c.params.tolerance;
    }
    if (!accept) {
      tau = i;
      break;
    }
  }
  return emit_token(tau, c.target_argmax(tau));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
