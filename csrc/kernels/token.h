// Token verification (Leviathan et al. 2022, Alg. 1; Chen et al. 2023). Lossless.
//   accept x_i while u_i < min(1, p_i(x_i) / q_i(x_i)); stop at the first rejection;
//   y ~ norm((p_{tau+1} - q_{tau+1})_+) after a rejection (zero mass: y ~ p_{tau+1}),
//   y ~ p_{n+1} when all n drafts are accepted.
// Rows after the first rejection are never read.
#pragma once

#include <algorithm>

#include "kernels/row.h"

namespace specdecode {
namespace kernels {

template <class Dist>
inline RowResult token_verify_row(const RowArgs<Dist>& a) {
  const int64_t n = a.num_draft;
  int64_t tau = n;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x = a.draft_tokens[i];
    const double p = a.target[i].prob(x);
    const double q = a.draft[i].prob(x);
    if (!accept_token(a.accept_uniforms[i], p, q)) {
      tau = i;
      break;
    }
    a.out_tokens[i] = x;
  }
  if (tau == n) return emit(a.out_tokens, tau, sample_distribution(a.target[n], a.emit_uniform, a.ws->a));

  double* residual = a.ws->b;
  const double mass = a.target[tau].residual(a.draft[tau], 1.0, residual);
  int64_t y = Dist::sample_weights(residual, a.vocab_size, a.emit_uniform, mass);
  if (y < 0) y = sample_distribution(a.target[tau], a.emit_uniform, a.ws->a);  // zero-mass residual: p
  return emit(a.out_tokens, tau, y);
}

}  // namespace kernels
}  // namespace specdecode
