// Shared pieces of the CPU verification kernels: status codes, sampling from non-negative
// weights, argmax, and a vectorisable float32 exp. Pure C++ on raw pointers: no torch here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

// Forces inlining: the hot loops of logit_loops.h call small helpers (fast_exp_nonpositive) that
// must be inlined for the loops to vectorise. In a translation unit as large as a torch op
// binding, GCC's inliner otherwise hits its unit-growth limit and emits an out-of-line scalar
// call in the middle of every loop.
#if defined(__GNUC__)
#define SPECDECODE_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define SPECDECODE_ALWAYS_INLINE inline
#endif

namespace specdecode {
namespace kernels {

// Why a row could not be verified. The op layer turns a non-zero status into a ValueError.
enum RowStatus : int32_t {
  kOk = 0,
  kDraftTokenOutOfRange = 1,    // a used draft token is not in [0, V)
  kNumDraftTokensOutOfRange = 2,  // num_draft_tokens[b] not in [0, gamma]
  kNonFiniteLogit = 3,          // NaN or +inf in a logit row that was read
  kEmptyDistribution = 4,       // a distribution with no positive mass (all -inf logits, all-zero probs)
};
// OR-ed into a status when the bad distribution is the draft's rather than the target's.
constexpr int32_t kStatusInDraft = 1 << 8;

inline const char* row_status_message(int32_t status) {
  switch (status & ~kStatusInDraft) {
    case kDraftTokenOutOfRange: return "draft_tokens holds an id outside [0, V)";
    case kNumDraftTokensOutOfRange: return "num_draft_tokens[b] must lie in [0, gamma]";
    case kNonFiniteLogit: return "a logit row holds NaN or +inf";
    case kEmptyDistribution: return "a distribution has no positive mass (all logits -inf after filtering, or all probabilities 0)";
    default: return "ok";
  }
}

// The numeric options of every built-in rule; unused fields are ignored by a rule.
struct RuleParams {
  double epsilon = 0.09;        // typical: hard threshold
  double delta = 0.3;           // typical: entropy-scaled threshold
  bool sample_correction = false;  // typical: sample y ~ p instead of argmax
  int64_t beta = 1;             // top_beta: x must be among the beta most likely tokens
  double tolerance = 0.0;       // top_beta: log p(argmax) - log p(x) <= tolerance
};

enum class Rule : int32_t { kToken = 0, kBlock = 1, kGreedy = 2, kTypical = 3, kTopBeta = 4 };

// Inverse-CDF sampling from non-negative weights w[0..V) with one uniform u in [0, 1), given
// their total mass: the first x with w[x] > 0 and cumsum[x] > u * total. The cumulative sum runs
// sequentially in double, exactly as torch.cumsum does on the CPU, and stops at the hit. The
// hit test is one rarely-true condition (no data-dependent branch on w[x] > 0), so the walk runs
// at the speed of its chain of adds. A zero-weight token is never returned. Returns -1 when
// there is no positive finite mass.
inline int64_t sample_from_weights(const double* w, int64_t V, double u, double total) {
  if (!(total > 0.0) || !std::isfinite(total)) return -1;
  const double threshold = u * total;
  double cum = 0.0;
  for (int64_t x = 0; x < V; ++x) {
    cum += w[x];
    if ((cum > threshold) & (w[x] > 0.0)) return x;
  }
  for (int64_t x = V - 1; x >= 0; --x)  // rounding put the threshold at the very top: the last token
    if (w[x] > 0.0) return x;
  return -1;
}

// The same with the total computed here, sequentially: then total equals the reference's
// torch.cumsum(w)[-1] bit for bit, and so does every decision.
inline int64_t sample_from_weights(const double* w, int64_t V, double u) {
  double total = 0.0;
  for (int64_t x = 0; x < V; ++x) total += w[x];
  return sample_from_weights(w, V, u, total);
}

// argmax with ties resolved to the lowest index (torch.argmax's behaviour).
template <typename T>
inline int64_t argmax_lowest(const T* v, int64_t V) {
  int64_t best = 0;
  float best_value = static_cast<float>(v[0]);
  for (int64_t x = 1; x < V; ++x) {
    const float value = static_cast<float>(v[x]);
    if (value > best_value || (std::isnan(best_value) && !std::isnan(value))) {
      best_value = value;
      best = x;
    }
  }
  return best;
}

inline int64_t argmax_lowest_double(const double* v, int64_t V) {
  int64_t best = 0;
  for (int64_t x = 1; x < V; ++x)
    if (v[x] > v[best]) best = x;
  return best;
}

// exp(z) for z <= 0 in float32, branch-free so loops over it vectorise. Cody-Waite range
// reduction z = n ln2 + r, |r| <= ln2/2, then a degree-6 polynomial; max relative error about
// 2e-7 against exp in double. Inputs below -87 (and -inf) give exactly 0.
SPECDECODE_ALWAYS_INLINE float fast_exp_nonpositive(float z) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;
  const float kLn2Lo = -2.12194440e-4f;
  const float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const bool underflow = !(z >= -87.0f);  // also true for -inf and NaN
  const float zc = underflow ? -87.0f : z;
  const float n = (zc * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (zc - n * kLn2Hi) - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const int32_t exponent = static_cast<int32_t>(n) + 127;
  const int32_t bits = exponent << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float result = poly * scale;
  return underflow ? 0.0f : result;
}

// The same approximation evaluated with fused multiply-adds (about 30% fewer vector operations;
// |result / exp(z) - 1| about 2e-7 as well, within an ulp or two of fast_exp_nonpositive). ONLY
// for normalisers of unfiltered rows, whose sum may round either way: a weight that decides
// anything (a probability, a filter cut) always comes from fast_exp_nonpositive. Fast only in
// code compiled for an FMA target (otherwise std::fma is a library call).
SPECDECODE_ALWAYS_INLINE float fast_exp_nonpositive_fma(float z) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;
  const float kLn2Lo = -2.12194440e-4f;
  const float kRoundMagic = 12582912.0f;
  const bool underflow = !(z >= -87.0f);
  const float zc = underflow ? -87.0f : z;
  const float n = std::fma(zc, kLog2e, kRoundMagic) - kRoundMagic;
  const float r = std::fma(n, -kLn2Lo, std::fma(n, -kLn2Hi, zc));
  float poly = 1.9875691500e-4f;
  poly = std::fma(poly, r, 1.3981999507e-3f);
  poly = std::fma(poly, r, 8.3334519073e-3f);
  poly = std::fma(poly, r, 4.1665795894e-2f);
  poly = std::fma(poly, r, 1.6666665459e-1f);
  poly = std::fma(poly, r, 5.0000001201e-1f);
  poly = std::fma(poly * r, r, r) + 1.0f;
  const int32_t exponent = static_cast<int32_t>(n) + 127;
  const int32_t bits = exponent << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float result = poly * scale;
  return underflow ? 0.0f : result;
}

}  // namespace kernels
}  // namespace specdecode
