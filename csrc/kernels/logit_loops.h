// The three loops over a logit row that dominate verify_logits on the CPU, compiled once per
// instruction set (AVX-512, AVX2, baseline x86-64 / other CPUs) and picked at run time.
//
// Each loop body is written once as an always-inline template; the per-ISA entry points only
// add a target attribute, so the compiler vectorises the same source with wider registers.
// Every step is a plain IEEE operation (the build disables FMA contraction), so all variants
// give bit-identical probabilities; only the order of the float partial sums differs.
// No torch here.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/common.h"

namespace specdecode {
namespace kernels {

#if defined(__GNUC__)
#define SPECDECODE_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define SPECDECODE_ALWAYS_INLINE inline
#endif

// Processing constants of one row: p(x) = kept(x) ? exp((l(x) - max) * inv_temp) * inv_norm : 0,
// kept(x) = l(x) >= keep_logit && exp(...) >= min_e.
struct RowTransform {
  float max_logit;
  float inv_temp;
  float keep_logit;
  float min_e;
};

template <typename T>
SPECDECODE_ALWAYS_INLINE float max_logit_body(const T* logits, int64_t V, int32_t* non_finite) {
  const float inf = std::numeric_limits<float>::infinity();
  float m = -inf;
  int32_t bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
  for (int64_t x = 0; x < V; ++x) {
    const float l = static_cast<float>(logits[x]);
    bad |= static_cast<int32_t>(!(l < inf));  // NaN or +inf
    m = l > m ? l : m;
  }
  *non_finite = bad;
  return m;
}

template <typename T>
SPECDECODE_ALWAYS_INLINE double sum_exp_body(const T* logits, int64_t V, RowTransform t) {
  double total = 0.0;
  const int64_t kChunk = 2048;  // float partial sums over short chunks, accumulated in double
  for (int64_t start = 0; start < V; start += kChunk) {
    const int64_t stop = V < start + kChunk ? V : start + kChunk;
    float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
    for (int64_t x = start; x < stop; ++x) {
      const float l = static_cast<float>(logits[x]);
      const float e = fast_exp_nonpositive((l - t.max_logit) * t.inv_temp);
      partial += ((l >= t.keep_logit) & (e >= t.min_e)) ? e : 0.0f;
    }
    total += partial;
  }
  return total;
}

// Writes the probabilities and returns their sum.
template <typename T>
SPECDECODE_ALWAYS_INLINE double fill_probs_body(const T* logits, int64_t V, RowTransform t, double inv_norm,
                                               double* out) {
  double total = 0.0;
#pragma omp simd reduction(+ : total)
  for (int64_t x = 0; x < V; ++x) {
    const float l = static_cast<float>(logits[x]);
    const float e = fast_exp_nonpositive((l - t.max_logit) * t.inv_temp);
    const double p = ((l >= t.keep_logit) & (e >= t.min_e)) ? static_cast<double>(e) * inv_norm : 0.0;
    out[x] = p;
    total += p;
  }
  return total;
}

// out[x] = max(w * p(x) - q(x), 0) with p and q computed from their logit rows on the fly:
// the (weighted) residual of token and block verification in one pass over both rows.
// Returns its total mass.
template <typename T>
SPECDECODE_ALWAYS_INLINE double residual_body(const T* p_logits, RowTransform tp, double p_inv_norm, const T* q_logits,
                                           RowTransform tq, double q_inv_norm, double w, int64_t V, double* out) {
  const double wp_norm = w * p_inv_norm;
  double total = 0.0;
#pragma omp simd reduction(+ : total)
  for (int64_t x = 0; x < V; ++x) {
    const float lp = static_cast<float>(p_logits[x]);
    const float lq = static_cast<float>(q_logits[x]);
    const float ep = fast_exp_nonpositive((lp - tp.max_logit) * tp.inv_temp);
    const float eq = fast_exp_nonpositive((lq - tq.max_logit) * tq.inv_temp);
    const double p = ((lp >= tp.keep_logit) & (ep >= tp.min_e)) ? static_cast<double>(ep) * wp_norm : 0.0;
    const double q = ((lq >= tq.keep_logit) & (eq >= tq.min_e)) ? static_cast<double>(eq) * q_inv_norm : 0.0;
    const double r = p - q > 0.0 ? p - q : 0.0;
    out[x] = r;
    total += r;
  }
  return total;
}

template <typename T>
struct LogitLoops {
  float (*max_logit)(const T*, int64_t, int32_t*);
  double (*sum_exp)(const T*, int64_t, RowTransform);
  double (*fill_probs)(const T*, int64_t, RowTransform, double, double*);
  double (*residual)(const T*, RowTransform, double, const T*, RowTransform, double, double, int64_t, double*);
  const char* isa;
};

#define SPECDECODE_DEFINE_LOOPS(SUFFIX, ATTRIBUTE)                                                    \
  template <typename T>                                                                               \
  ATTRIBUTE float max_logit_##SUFFIX(const T* logits, int64_t V, int32_t* non_finite) {              \
    return max_logit_body(logits, V, non_finite);                                                     \
  }                                                                                                   \
  template <typename T>                                                                               \
  ATTRIBUTE double sum_exp_##SUFFIX(const T* logits, int64_t V, RowTransform t) {                    \
    return sum_exp_body(logits, V, t);                                                                \
  }                                                                                                   \
  template <typename T>                                                                               \
  ATTRIBUTE double fill_probs_##SUFFIX(const T* logits, int64_t V, RowTransform t, double inv_norm,  \
                                       double* out) {                                                 \
    return fill_probs_body(logits, V, t, inv_norm, out);                                              \
  }                                                                                                   \
  template <typename T>                                                                               \
  ATTRIBUTE double residual_##SUFFIX(const T* p_logits, RowTransform tp, double p_inv_norm, const T* q_logits, \
                                     RowTransform tq, double q_inv_norm, double w, int64_t V, double* out) {  \
    return residual_body(p_logits, tp, p_inv_norm, q_logits, tq, q_inv_norm, w, V, out);              \
  }

SPECDECODE_DEFINE_LOOPS(baseline, )
#if defined(__GNUC__) && defined(__x86_64__)
#define SPECDECODE_HAVE_X86_LOOPS 1
SPECDECODE_DEFINE_LOOPS(avx2, __attribute__((target("avx2"))))
SPECDECODE_DEFINE_LOOPS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"))))
#endif
#undef SPECDECODE_DEFINE_LOOPS

// The widest variant this CPU runs, chosen once per element type.
template <typename T>
inline const LogitLoops<T>& logit_loops() {
  static const LogitLoops<T> chosen = [] {
#ifdef SPECDECODE_HAVE_X86_LOOPS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return LogitLoops<T>{&max_logit_avx512<T>, &sum_exp_avx512<T>, &fill_probs_avx512<T>, &residual_avx512<T>, "avx512"};
    if (__builtin_cpu_supports("avx2"))
      return LogitLoops<T>{&max_logit_avx2<T>, &sum_exp_avx2<T>, &fill_probs_avx2<T>, &residual_avx2<T>, "avx2"};
#endif
    return LogitLoops<T>{&max_logit_baseline<T>, &sum_exp_baseline<T>, &fill_probs_baseline<T>, &residual_baseline<T>, "baseline"};
  }();
  return chosen;
}

}  // namespace kernels
}  // namespace specdecode
