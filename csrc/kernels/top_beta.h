// Top-beta acceptance with tolerance (Xia et al. 2022, "SpecDec"). Lossy.
//   accept x_i while x_i is among the beta most likely tokens of p_i (fewer than beta tokens
//   are strictly more likely) and log p_i(argmax) - log p_i(x_i) <= tolerance;
//   y = argmax p_{tau+1}. beta = 1 with tolerance 0 is greedy verification.
// A token with p = 0 is never accepted.
#pragma once

#include <cmath>

#include "kernels/row.h"

namespace specdecode {
namespace kernels {

template <class Dist>
inline RowResult top_beta_verify_row(const RowArgs<Dist>& a) {
  const int64_t n = a.num_draft;
  const int64_t V = a.vocab_size;
  double* p = a.ws->a;
  int64_t tau = n;
  for (int64_t i = 0; i < n; ++i) {
    a.target[i].fill(p);
    const int64_t x = a.draft_tokens[i];
    const double px = p[x];
    bool accept = px > 0.0;
    if (accept) {
      int64_t more_likely = 0;
      double p_max = px;
      for (int64_t y = 0; y < V; ++y) {
        more_likely += p[y] > px ? 1 : 0;
        p_max = p[y] > p_max ? p[y] : p_max;
      }
      accept = more_likely < a.params.beta && (std::log(p_max) - std::log(px)) <= a.params.tolerance;
    }
    if (!accept) {
      tau = i;
      break;
    }
    a.out_tokens[i] = x;
  }
  return emit(a.out_tokens, tau, a.target[tau].argmax());
}

}  // namespace kernels
}  // namespace specdecode
