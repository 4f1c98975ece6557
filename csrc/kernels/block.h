// Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding").
// Lossless and optimal among draft-verify schemes with the same drafts.
//   w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
//   h_i = Z_i / (Z_i + 1 - w_i), Z_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+  (h_i = 1 if the
//         denominator is 0), for i < n;  h_n = w_n
//   tau = max{i : u_i < h_i} (0 if none)
//   y ~ p_{n+1} if tau = n, else y ~ norm((w_tau p_{tau+1} - q_{tau+1})_+) (zero mass: p_{tau+1})
// tau is searched from the top down, so a fully accepted block reads no full row, and
// h_i needs no pass over V when w_i is 0 (h = 0) or 1 (h = 1).
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "kernels/row.h"

namespace specdecode {
namespace kernels {

// w_{i-1} * p / q clipped to 1, with q = 0 read as an infinite ratio when p > 0.
inline double block_weight(double w_prev, double p, double q) {
  if (w_prev == 0.0 || p == 0.0) return 0.0;
  if (!(q > 0.0)) return 1.0;
  return std::min(1.0, w_prev * (p / q));
}

template <class Dist>
inline RowResult block_verify_row(const RowArgs<Dist>& a) {
  const int64_t n = a.num_draft;
  const int64_t V = a.vocab_size;
  double w_small[65];
  std::vector<double> w_large;
  double* w = w_small;
  if (n + 1 > 65) {
    w_large.resize(n + 1);
    w = w_large.data();
  }
  w[0] = 1.0;
  for (int64_t i = 1; i <= n; ++i) {
    const int64_t x = a.draft_tokens[i - 1];
    w[i] = block_weight(w[i - 1], a.target[i - 1].prob(x), a.draft[i - 1].prob(x));
  }

  double* residual = a.ws->b;
  int64_t tau = 0;
  for (int64_t i = n; i >= 1; --i) {
    double h;
    if (i == n || w[i] == 0.0 || w[i] == 1.0) {
      h = w[i];  // h_n = w_n; and w = 0 gives Z = 0, h = 0; w = 1 gives h = Z / Z = 1
    } else {
      const double z = a.target[i].residual(a.draft[i], w[i], residual);  // sum (w_i p_{i+1} - q_{i+1})_+
      const double denom = z + (1.0 - w[i]);
      h = denom > 0.0 ? z / denom : 1.0;
    }
    if (a.accept_uniforms[i - 1] < h) {
      tau = i;
      break;
    }
  }
  for (int64_t i = 0; i < tau; ++i) a.out_tokens[i] = a.draft_tokens[i];
  if (tau == n) return emit(a.out_tokens, tau, sample_distribution(a.target[n], a.emit_uniform, a.ws->a));

  const double mass = a.target[tau].residual(a.draft[tau], w[tau], residual);
  int64_t y = Dist::sample_weights(residual, V, a.emit_uniform, mass);
  if (y < 0) y = sample_distribution(a.target[tau], a.emit_uniform, a.ws->a);  // zero-mass residual: p
  return emit(a.out_tokens, tau, y);
}

}  // namespace kernels
}  // namespace specdecode
