// The loops over a logit row that dominate verify_logits / sample_logits on the CPU, compiled
// once per instruction set (AVX-512, AVX2, baseline x86-64 / other CPUs) and picked at run time.
//
// Each loop body is written once as an always-inline template; the per-ISA entry points only
// add a target attribute, so the compiler vectorises the same source with wider registers.
// Every step that produces a weight e = exp((l - max) * inv_temp) is a plain IEEE operation (the
// build disables FMA contraction), so all variants give bit-identical weights; only the order of
// the partial sums (normaliser, residual mass, sampling search) differs, by a few ulps, and the
// FMA variants sum the normaliser of an unfiltered row with fused multiply-adds.
// No torch here.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernels/common.h"

namespace specdecode {
namespace kernels {

// Processing constants of one row: p(x) = kept(x) ? exp((l(x) - max) * inv_temp) * inv_norm : 0,
// kept(x) = l(x) >= keep_logit && exp(...) >= min_e.
struct RowTransform {
  float max_logit;
  float inv_temp;
  float keep_logit;
  float min_e;
};

// What one online pass over a row finds: its largest logit, sum_x exp((l(x) - max) * inv_temp),
// and whether a NaN or +inf was seen (then max and sum are meaningless).
struct RowStats {
  float max_logit;
  double sum_exp;
  int32_t non_finite;
};

// ------------------------------------------------------------------------ element loads
// A logit as float32. The 16-bit formats are converted with branch-free bit operations (exact,
// like every float16/bfloat16 -> float32 conversion), so loops over them vectorise too. The
// formats are told apart without torch: c10::BFloat16 and c10::Half specialise
// std::numeric_limits with 8 and 11 significand digits.

SPECDECODE_ALWAYS_INLINE float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

SPECDECODE_ALWAYS_INLINE float bfloat16_bits_to_float(uint16_t bits) {
  return float_from_bits(static_cast<uint32_t>(bits) << 16);
}

SPECDECODE_ALWAYS_INLINE float float16_bits_to_float(uint16_t bits) {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  const uint32_t magnitude = static_cast<uint32_t>(bits) & 0x7fffu;
  // normal numbers: rebias the exponent (15 -> 127); inf / NaN: exponent all ones
  const float normal = float_from_bits((magnitude << 13) + 0x38000000u);
  const float inf_nan = float_from_bits((magnitude << 13) | 0x7f800000u);
  // zero and subnormals: magnitude * 2^-24, exact in float32
  const float small = static_cast<float>(static_cast<int32_t>(magnitude)) * 5.9604644775390625e-08f;
  const float value = magnitude < 0x0400u ? small : (magnitude >= 0x7c00u ? inf_nan : normal);
  uint32_t value_bits;
  std::memcpy(&value_bits, &value, sizeof(value_bits));
  return float_from_bits(value_bits | sign);
}

template <typename T>
SPECDECODE_ALWAYS_INLINE float load_float(const T* p) {
  using limits = std::numeric_limits<T>;
  if constexpr (sizeof(T) == 2 && limits::is_specialized && !limits::is_integer && limits::digits == 8) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return bfloat16_bits_to_float(bits);
  } else if constexpr (sizeof(T) == 2 && limits::is_specialized && !limits::is_integer && limits::digits == 11) {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return float16_bits_to_float(bits);
  } else {
    return static_cast<float>(*p);
  }
}

// ------------------------------------------------------------------------------- bodies

// Largest logit; *non_finite = 1 if a NaN or +inf was seen.
template <typename T>
SPECDECODE_ALWAYS_INLINE float max_logit_body(const T* logits, int64_t V, int32_t* non_finite) {
  const float inf = std::numeric_limits<float>::infinity();
  float m = -inf;
  int32_t bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
  for (int64_t x = 0; x < V; ++x) {
    const float l = load_float(logits + x);
    bad |= static_cast<int32_t>(!(l < inf));  // NaN or +inf
    m = l > m ? l : m;
  }
  *non_finite = bad;
  return m;
}

// argmax with ties to the lowest id (torch.argmax's rule): the max in one vectorised pass, then
// the first chunk holding it. *non_finite as max_logit_body; *max_out = the max.
constexpr int64_t kFindChunk = 256;

template <typename T>
SPECDECODE_ALWAYS_INLINE int64_t argmax_body(const T* logits, int64_t V, int32_t* non_finite, float* max_out) {
  const float m = max_logit_body(logits, V, non_finite);
  *max_out = m;
  for (int64_t start = 0; start < V; start += kFindChunk) {
    const int64_t stop = V < start + kFindChunk ? V : start + kFindChunk;
    int32_t hit = 0;
#pragma omp simd reduction(| : hit)
    for (int64_t x = start; x < stop; ++x) hit |= static_cast<int32_t>(load_float(logits + x) == m);
    if (!hit) continue;
    for (int64_t x = start; x < stop; ++x)
      if (load_float(logits + x) == m) return x;
  }
  return 0;  // only when no value equals the max: the row holds NaN and is rejected
}

// Rows are processed in chunks that stay in L1 between the two loops of max_sum_exp_body.
// Normalisers are summed in float32 vector lanes over short blocks (each lane adds at most
// kSumBlock / lanes terms, 64 on the 4-lane baseline), and the blocks' sums in double: the
// float rounding stays near 1e-7 relative whatever the instruction set.
constexpr int64_t kLogitChunk = 2048;
constexpr int64_t kSumBlock = 256;

// The normaliser of a filtered row: sum of the kept weights (t.max_logit is the row's max).
template <typename T>
SPECDECODE_ALWAYS_INLINE double sum_exp_body(const T* logits, int64_t V, RowTransform t) {
  double total = 0.0;
  for (int64_t start = 0; start < V; start += kSumBlock) {
    const int64_t stop = V < start + kSumBlock ? V : start + kSumBlock;
    float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
    for (int64_t x = start; x < stop; ++x) {
      const float l = load_float(logits + x);
      const float e = fast_exp_nonpositive((l - t.max_logit) * t.inv_temp);
      partial += ((l >= t.keep_logit) & (e >= t.min_e)) ? e : 0.0f;
    }
    total += partial;
  }
  return total;
}

// Max and normaliser of an unfiltered row in ONE pass over memory (the online softmax
// normaliser, chunked): each chunk's max m_c is found, then s_c = sum exp((l - m_c) * inv_temp)
// over the chunk while it is still in L1, and the running (max, sum) pair is rescaled in
// double whenever a chunk raises the max: sum = sum_c s_c exp((m_c - max) * inv_temp).
// Each weight is the same float32 fast_exp as everywhere else, taken relative to its chunk's
// max instead of the row's, so the sum differs from sum_x exp((l - max) * inv_temp) by at most
// ~2 fast_exp errors (~4e-7 relative); see LogitRow's numerics note. kFma: the variants built
// for an FMA target sum fast_exp_nonpositive_fma (the same approximation, fewer operations).
template <bool kFma, typename T>
SPECDECODE_ALWAYS_INLINE RowStats max_sum_exp_body(const T* logits, int64_t V, float inv_temp) {
  const float inf = std::numeric_limits<float>::infinity();
  float row_max = -inf;
  double sum = 0.0;
  int32_t bad = 0;
  for (int64_t start = 0; start < V; start += kLogitChunk) {
    const int64_t stop = V < start + kLogitChunk ? V : start + kLogitChunk;
    float m = -inf;
    int32_t chunk_bad = 0;
#pragma omp simd reduction(max : m) reduction(| : chunk_bad)
    for (int64_t x = start; x < stop; ++x) {
      const float l = load_float(logits + x);
      chunk_bad |= static_cast<int32_t>(!(l < inf));  // NaN or +inf
      m = l > m ? l : m;
    }
    bad |= chunk_bad;
    if (m == -inf || chunk_bad) continue;  // all -inf: no mass; NaN/+inf: the row is rejected anyway
    double partial = 0.0;
    for (int64_t block = start; block < stop; block += kSumBlock) {
      const int64_t block_stop = stop < block + kSumBlock ? stop : block + kSumBlock;
      float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
      for (int64_t x = block; x < block_stop; ++x) {
        const float l = load_float(logits + x);
        const float z = (l - m) * inv_temp;
        block_sum += kFma ? fast_exp_nonpositive_fma(z) : fast_exp_nonpositive(z);  // -inf gives exactly 0
      }
      partial += block_sum;
    }
    if (m > row_max) {
      if (row_max != -inf) sum *= std::exp((static_cast<double>(row_max) - m) * inv_temp);
      row_max = m;
      sum += partial;
    } else {
      sum += partial * std::exp((static_cast<double>(m) - row_max) * inv_temp);
    }
  }
  return RowStats{row_max, sum, bad};
}

// Writes the probabilities and returns their sum.
template <typename T>
SPECDECODE_ALWAYS_INLINE double fill_probs_body(const T* logits, int64_t V, RowTransform t, double inv_norm,
                                               double* out) {
  double total = 0.0;
#pragma omp simd reduction(+ : total)
  for (int64_t x = 0; x < V; ++x) {
    const float l = load_float(logits + x);
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
    const float lp = load_float(p_logits + x);
    const float lq = load_float(q_logits + x);
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

// Inverse-CDF search over non-negative weights w[0..V) (written by fill_probs / residual) with
// coin u and their mass `total`: the first x with w[x] > 0 whose cumulative weight exceeds
// u * total, as sample_from_weights (common.h), but blocked: a block's sum is taken with vector
// adds and only the block where the cumulative weight crosses the threshold is walked
// sequentially. The cumulative sums therefore round differently from one sequential sum,
// which moves a decision only when u * total lies within ~1e-15 (relative) of a boundary.
// Returns -1 when there is no positive finite mass.
constexpr int64_t kSearchBlock = 256;

SPECDECODE_ALWAYS_INLINE int64_t search_weights_body(const double* w, int64_t V, double u, double total) {
  if (!(total > 0.0) || !(total < std::numeric_limits<double>::infinity())) return -1;
  const double threshold = u * total;
  double cum = 0.0;
  for (int64_t start = 0; start < V; start += kSearchBlock) {
    const int64_t stop = V < start + kSearchBlock ? V : start + kSearchBlock;
    double block = 0.0;
#pragma omp simd reduction(+ : block)
    for (int64_t x = start; x < stop; ++x) block += w[x];
    if (!(cum + block > threshold)) {
      cum += block;
      continue;
    }
    for (int64_t x = start; x < stop; ++x) {
      cum += w[x];
      if ((cum > threshold) & (w[x] > 0.0)) return x;
    }
    // rounding kept the sequential walk below the threshold: go on from its cumulative sum
  }
  for (int64_t x = V - 1; x >= 0; --x)  // the threshold sits at the very top: the last token
    if (w[x] > 0.0) return x;
  return -1;
}

// ---------------------------------------------------------------- per-ISA entry points

template <typename T>
struct LogitLoops {
  float (*max_logit)(const T*, int64_t, int32_t*);
  int64_t (*argmax)(const T*, int64_t, int32_t*, float*);
  double (*sum_exp)(const T*, int64_t, RowTransform);
  RowStats (*max_sum_exp)(const T*, int64_t, float);
  double (*fill_probs)(const T*, int64_t, RowTransform, double, double*);
  double (*residual)(const T*, RowTransform, double, const T*, RowTransform, double, double, int64_t, double*);
  int64_t (*search_weights)(const double*, int64_t, double, double);
  const char* isa;
};

#define SPECDECODE_DEFINE_LOOPS(SUFFIX, ATTRIBUTE, FMA)                                                         \
  template <typename T>                                                                                        \
  ATTRIBUTE float max_logit_##SUFFIX(const T* logits, int64_t V, int32_t* non_finite) {                       \
    return max_logit_body(logits, V, non_finite);                                                              \
  }                                                                                                            \
  template <typename T>                                                                                        \
  ATTRIBUTE int64_t argmax_##SUFFIX(const T* logits, int64_t V, int32_t* non_finite, float* max_out) {        \
    return argmax_body(logits, V, non_finite, max_out);                                                        \
  }                                                                                                            \
  template <typename T>                                                                                        \
  ATTRIBUTE double sum_exp_##SUFFIX(const T* logits, int64_t V, RowTransform t) {                             \
    return sum_exp_body(logits, V, t);                                                                         \
  }                                                                                                            \
  template <typename T>                                                                                        \
  ATTRIBUTE RowStats max_sum_exp_##SUFFIX(const T* logits, int64_t V, float inv_temp) {                       \
    return max_sum_exp_body<FMA>(logits, V, inv_temp);                                                         \
  }                                                                                                            \
  template <typename T>                                                                                        \
  ATTRIBUTE double fill_probs_##SUFFIX(const T* logits, int64_t V, RowTransform t, double inv_norm,           \
                                       double* out) {                                                          \
    return fill_probs_body(logits, V, t, inv_norm, out);                                                       \
  }                                                                                                            \
  template <typename T>                                                                                        \
  ATTRIBUTE double residual_##SUFFIX(const T* p_logits, RowTransform tp, double p_inv_norm, const T* q_logits, \
                                     RowTransform tq, double q_inv_norm, double w, int64_t V, double* out) {   \
    return residual_body(p_logits, tp, p_inv_norm, q_logits, tq, q_inv_norm, w, V, out);                       \
  }                                                                                                            \
  ATTRIBUTE inline int64_t search_weights_##SUFFIX(const double* w, int64_t V, double u, double total) {       \
    return search_weights_body(w, V, u, total);                                                                \
  }                                                                                                            \
  template <typename T>                                                                                        \
  LogitLoops<T> logit_loops_##SUFFIX() {                                                                       \
    return LogitLoops<T>{&max_logit_##SUFFIX<T>, &argmax_##SUFFIX<T>, &sum_exp_##SUFFIX<T>, &max_sum_exp_##SUFFIX<T>, \
                         &fill_probs_##SUFFIX<T>, &residual_##SUFFIX<T>, &search_weights_##SUFFIX,             \
                         #SUFFIX};                                                                             \
  }

SPECDECODE_DEFINE_LOOPS(baseline, , false)
#if defined(__GNUC__) && defined(__x86_64__)
#define SPECDECODE_HAVE_X86_LOOPS 1
SPECDECODE_DEFINE_LOOPS(avx2, __attribute__((target("avx2,fma"))), true)
SPECDECODE_DEFINE_LOOPS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,prefer-vector-width=512"))), true)
#endif
#undef SPECDECODE_DEFINE_LOOPS

// The instruction set the loops use: the widest this CPU runs, or a narrower one named by the
// environment variable SPECDECODE_CPU_ISA ("avx512", "avx2" or "baseline"; read once per
// process; a name the CPU cannot run, or an unknown one, is ignored). Tests use it to run
// every variant.
inline const char* logit_loops_isa() {
  static const char* chosen = [] {
    const char* widest = "baseline";
#ifdef SPECDECODE_HAVE_X86_LOOPS
    __builtin_cpu_init();
    const bool fma = __builtin_cpu_supports("fma");
    if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      widest = "avx512";
    else if (fma && __builtin_cpu_supports("avx2"))
      widest = "avx2";
#endif
    const char* requested = std::getenv("SPECDECODE_CPU_ISA");
    if (requested == nullptr) return widest;
    const char* order[] = {"baseline", "avx2", "avx512"};
    int widest_rank = 0, requested_rank = -1;
    for (int i = 0; i < 3; ++i) {
      if (std::strcmp(order[i], widest) == 0) widest_rank = i;
      if (std::strcmp(order[i], requested) == 0) requested_rank = i;
    }
    return requested_rank >= 0 && requested_rank <= widest_rank ? order[requested_rank] : widest;
  }();
  return chosen;
}

// The loops of the chosen instruction set, per element type.
template <typename T>
inline const LogitLoops<T>& logit_loops() {
  static const LogitLoops<T> chosen = [] {
#ifdef SPECDECODE_HAVE_X86_LOOPS
    const char* isa = logit_loops_isa();
    if (std::strcmp(isa, "avx512") == 0) return logit_loops_avx512<T>();
    if (std::strcmp(isa, "avx2") == 0) return logit_loops_avx2<T>();
#endif
    return logit_loops_baseline<T>();
  }();
  return chosen;
}

}  // namespace kernels
}  // namespace specdecode
