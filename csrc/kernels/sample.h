// Sampling one token from one processed distribution: the draft side of standardized sampling.
// The processed distribution is the very Dist object the verification kernels use (LogitRow
// with the same temperature / top-k / top-p / min-p), so a token drafted here was drawn from
// exactly the q that verification later reads. Pure C++: no torch.
#pragma once

#include <cstdint>

#include "kernels/distributions.h"

namespace specdecode {
namespace kernels {

struct SampleResult {
  int64_t token;
  int32_t status;
};

// greedy: argmax (ties to the lowest id); otherwise the inverse CDF of `dist` at coin u.
template <class Dist>
inline SampleResult sample_row(const Dist& dist, bool greedy, double u, double* scratch) {
  const int64_t token = greedy ? dist.argmax() : sample_distribution(dist, u, scratch);
  if (dist.status() != kOk) return {-1, dist.status()};
  if (token < 0) return {-1, kEmptyDistribution};
  return {token, kOk};
}

}  // namespace kernels
}  // namespace specdecode
