// Greedy verification (temperature 0). Exact: output equals the target's own greedy decoding.
//   accept x_i while x_i == argmax p_i; y = argmax p_{tau+1}; ties go to the lowest id.
#pragma once

#include "kernels/row.h"

namespace specdecode {
namespace kernels {

template <class Dist>
inline RowResult greedy_verify_row(const RowArgs<Dist>& a) {
  const int64_t n = a.num_draft;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t best = a.target[i].argmax();
    if (a.draft_tokens[i] != best) return emit(a.out_tokens, i, best);
    a.out_tokens[i] = best;
  }
  return emit(a.out_tokens, n, a.target[n].argmax());
}

}  // namespace kernels
}  // namespace specdecode
