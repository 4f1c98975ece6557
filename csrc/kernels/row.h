// What every rule's row function receives and returns. One row of the batch at a time.
#pragma once

#include <cstdint>

#include "kernels/distributions.h"

namespace specdecode {
namespace kernels {

template <class Dist>
struct RowArgs {
  const Dist* target;            // positions 0..n (n + 1 distributions p_1..p_{n+1})
  const Dist* draft;             // positions 0..n-1 (q_1..q_n); null for rules without q
  const int64_t* draft_tokens;   // x_1..x_n, already checked to lie in [0, V)
  int64_t num_draft;             // n, 0 <= n <= gamma
  const double* accept_uniforms; // u_1..u_n (uniforms[b, 0..n-1])
  double emit_uniform;           // uniforms[b, gamma]: the coin for the emitted token
  int64_t vocab_size;
  Workspace* ws;
  int64_t* out_tokens;           // [gamma + 1], pre-filled with -1
  RuleParams params;
};

struct RowResult {
  int64_t accepted_len;
  int32_t status;
};

// u < min(1, p / q) on a half-open interval, so a token with p = 0 is never accepted, even for
// u = 0. q = 0 (cannot happen for a token the draft really sampled) is defined as "accept iff
// p > 0", the limit of the ratio.
inline bool accept_token(double u, double p, double q) {
  if (q > 0.0) return u < p / q;
  return p > 0.0;
}

// Finish a row: write the emitted token y after the tau accepted drafts.
inline RowResult emit(int64_t* out_tokens, int64_t tau, int64_t y) {
  if (y < 0) return {tau, kEmptyDistribution};
  out_tokens[tau] = y;
  return {tau, kOk};
}

}  // namespace kernels
}  // namespace specdecode
