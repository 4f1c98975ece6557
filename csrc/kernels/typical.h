// Typical acceptance (Medusa, Cai et al. 2024). Lossy: it does not preserve the target's
// distribution. Draft probabilities are not used.
//   accept x_i while p_i(x_i) > min(epsilon, delta * exp(-H(p_i))), H(p) = -sum p log p;
//   y = argmax p_{tau+1}, or y ~ p_{tau+1} when sample_correction is set.
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/row.h"

namespace specdecode {
namespace kernels {

inline double entropy(const double* p, int64_t V) {
  double h = 0.0;
  for (int64_t x = 0; x < V; ++x)
    if (p[x] > 0.0) h -= p[x] * std::log(p[x]);
  return h;
}

template <class Dist>
inline RowResult typical_verify_row(const RowArgs<Dist>& a) {
  const int64_t n = a.num_draft;
  double* p = a.ws->a;
  int64_t tau = n;
  for (int64_t i = 0; i < n; ++i) {
    a.target[i].fill(p);
    const double threshold = std::min(a.params.epsilon, a.params.delta * std::exp(-entropy(p, a.vocab_size)));
    const int64_t x = a.draft_tokens[i];
    if (!(p[x] > threshold)) {
      tau = i;
      break;
    }
    a.out_tokens[i] = x;
  }
  if (a.params.sample_correction)
    return emit(a.out_tokens, tau, sample_distribution(a.target[tau], a.emit_uniform, p));
  return emit(a.out_tokens, tau, a.target[tau].argmax());
}

}  // namespace kernels
}  // namespace specdecode
