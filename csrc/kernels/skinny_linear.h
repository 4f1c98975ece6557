// A skinny matrix multiply for the CPU: y = x @ w.T + b with few rows in x (a verification
// forward over a handful of tokens, a drafter's few rows). A memory-bound model's linear layer
// costs what reading its weight costs, so each weight row is read from memory once and every
// row of x is multiplied with it while it sits in L1: NB weight rows at a time against MB rows
// of x, NB * MB accumulators held in vector registers, one horizontal sum per output.
//
// Shapes: x [M, K] (row stride ldx), w [N, K] (rows contiguous), b [N] or null, y [M, N]
// (row stride ldy). Each output is sum_k x[m, k] * w[n, k] in vector lanes (fused multiply-
// adds on AVX2 / AVX-512), the lanes summed pairwise, then + b[n]: the same products as a
// BLAS call, summed in another order, so results agree with torch to float rounding.
//
// The body (skinny_linear_body.inc) is compiled once per instruction set inside a
// `#pragma GCC target` region, with that set's vector traits; the set is picked at run time
// with the verify ops' choice, logit_loops_isa() (SPECDECODE_CPU_ISA narrows it). Weights may
// be float32 or bfloat16 (raw uint16 bits, widened exactly in registers). No torch here.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/logit_loops.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

namespace specdecode {
namespace kernels {

// One call's operands (see the shapes above).
template <typename WT>
struct SkinnyLinearArgs {
  const float* x;
  int64_t ldx;
  const WT* w;
  const float* bias;  // null: no bias
  float* y;
  int64_t ldy;
  int64_t M;
  int64_t K;
};

// A weight element as float32: float32 as is, bfloat16 bits shifted into the high half.
SPECDECODE_ALWAYS_INLINE float weight_to_float(const float* p) { return *p; }
SPECDECODE_ALWAYS_INLINE float weight_to_float(const uint16_t* p) { return bfloat16_bits_to_float(*p); }

// Parallel tasks get multiples of this many output columns: a multiple of every register
// block's width (kNB, kFewRowsNB below).
constexpr int64_t kSkinnyColumnAlign = 12;

// ------------------------------------------------------------------------------ baseline
// GCC/Clang vector extension of 4 floats (SSE2 on x86-64, NEON elsewhere); a separate multiply
// and add (no FMA is assumed).
namespace skinny_baseline {
struct Isa {
  typedef float V __attribute__((vector_size(16)));
  static constexpr int kLanes = 4;
  static constexpr int kNB = 2;
  static constexpr int kMB = 4;
  static constexpr int kFewRowsNB = 4;
  static constexpr bool kPrefetchOneRow = true;
  static SPECDECODE_ALWAYS_INLINE V zero() { return V{0.0f, 0.0f, 0.0f, 0.0f}; }
  template <typename T>
  static SPECDECODE_ALWAYS_INLINE V load(const T* p) {
    V v;
    for (int i = 0; i < kLanes; ++i) v[i] = weight_to_float(p + i);
    return v;
  }
  template <typename T>
  static SPECDECODE_ALWAYS_INLINE V load_partial(const T* p, int64_t count) {
    V v = zero();
    for (int64_t i = 0; i < count; ++i) v[i] = weight_to_float(p + i);
    return v;
  }
  static SPECDECODE_ALWAYS_INLINE V madd(V a, V b, V acc) { return acc + a * b; }
  static SPECDECODE_ALWAYS_INLINE float sum(V v) { return (v[0] + v[2]) + (v[1] + v[3]); }
  static SPECDECODE_ALWAYS_INLINE void sum4(V v0, V v1, V v2, V v3, float* out) {
    out[0] = sum(v0), out[1] = sum(v1), out[2] = sum(v2), out[3] = sum(v3);
  }
};
#include "kernels/skinny_linear_body.inc"
}  // namespace skinny_baseline

#if defined(__GNUC__) && defined(__x86_64__)
#define SPECDECODE_HAVE_X86_SKINNY 1
// ---------------------------------------------------------------------------------- AVX2
// 16 ymm registers: 3 x 4 accumulators and 3 weight vectors; x is read from memory (for one or
// two rows of x: 6 x 2 accumulators).
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace skinny_avx2 {
struct Isa {
  typedef __m256 V;
  static constexpr int kLanes = 8;
  static constexpr int kNB = 3;
  static constexpr int kMB = 4;
  static constexpr int kFewRowsNB = 6;
  static constexpr bool kPrefetchOneRow = true;
  static SPECDECODE_ALWAYS_INLINE V zero() { return _mm256_setzero_ps(); }
  static SPECDECODE_ALWAYS_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  static SPECDECODE_ALWAYS_INLINE V load(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  template <typename T>
  static SPECDECODE_ALWAYS_INLINE V load_partial(const T* p, int64_t count) {
    alignas(32) float buf[kLanes] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = 0; i < count; ++i) buf[i] = weight_to_float(p + i);
    return _mm256_load_ps(buf);
  }
  static SPECDECODE_ALWAYS_INLINE V madd(V a, V b, V acc) { return _mm256_fmadd_ps(a, b, acc); }
  static SPECDECODE_ALWAYS_INLINE float sum(V v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
  }
  static SPECDECODE_ALWAYS_INLINE void sum4(V v0, V v1, V v2, V v3, float* out) {
    out[0] = sum(v0), out[1] = sum(v1), out[2] = sum(v2), out[3] = sum(v3);
  }
};
#include "kernels/skinny_linear_body.inc"
}  // namespace skinny_avx2
#pragma GCC pop_options

// ------------------------------------------------------------------------------- AVX-512
// 32 zmm registers: 4 x 6 accumulators, 4 weight vectors and one x vector (for one or two rows
// of x: 12 x 2 accumulators).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace skinny_avx512 {
struct Isa {
  typedef __m512 V;
  static constexpr int kLanes = 16;
  static constexpr int kNB = 4;
  static constexpr int kMB = 6;
  static constexpr int kFewRowsNB = 12;
  // One row of x: twelve weight rows stream faster on the hardware prefetchers alone (SmolLM2's
  // layers on one core: 0.79x the time with the software prefetch; with AVX2, 1.1x: it keeps it).
  static constexpr bool kPrefetchOneRow = false;
  static SPECDECODE_ALWAYS_INLINE V zero() { return _mm512_setzero_ps(); }
  static SPECDECODE_ALWAYS_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  // bfloat16 bits widened to float32 (the maskz forms: GCC 12 warns on the plain ones' undefined
  // pass-through vector)
  static SPECDECODE_ALWAYS_INLINE V widen(__m256i bits) {
    const __m512i wide = _mm512_maskz_cvtepu16_epi32(0xFFFF, bits);
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, wide, 16));
  }
  static SPECDECODE_ALWAYS_INLINE V load(const uint16_t* p) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static SPECDECODE_ALWAYS_INLINE V load_partial(const float* p, int64_t count) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1u), p);
  }
  static SPECDECODE_ALWAYS_INLINE V load_partial(const uint16_t* p, int64_t count) {
    return widen(_mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << count) - 1u), p));
  }
  static SPECDECODE_ALWAYS_INLINE V madd(V a, V b, V acc) { return _mm512_fmadd_ps(a, b, acc); }
  static SPECDECODE_ALWAYS_INLINE float sum(V v) {
    // (GCC 12's cast/extract intrinsics read an "undefined" vector and warn: shuffle instead)
    const __m256 low = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 high = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m256 half = _mm256_add_ps(low, high);
    const __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    const __m128 pairs = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
  }
  // The lane sums of four vectors at once, out[i] = sum(v_i): a transpose folded into the adds
  // (13 operations where four sum() calls take about 32).
  static SPECDECODE_ALWAYS_INLINE void sum4(V v0, V v1, V v2, V v3, float* out) {
    // (vector shuffles for unpcklps / unpckhps / shufps: GCC 12's intrinsics warn, as above)
    // per 128-bit lane: [v0 0+2, v1 0+2, v0 1+3, v1 1+3], the same for v2, v3
    const __m512 t01 = __builtin_shufflevector(v0, v1, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29) +
                       __builtin_shufflevector(v0, v1, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    const __m512 t23 = __builtin_shufflevector(v2, v3, 0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29) +
                       __builtin_shufflevector(v2, v3, 2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31);
    // per 128-bit lane: [v0, v1, v2, v3] partial sums
    const __m512 lanes =
        __builtin_shufflevector(t01, t23, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
        __builtin_shufflevector(t01, t23, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const __m256 low = __builtin_shufflevector(lanes, lanes, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 high = __builtin_shufflevector(lanes, lanes, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m256 half = _mm256_add_ps(low, high);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1)));
  }
};
#include "kernels/skinny_linear_body.inc"
}  // namespace skinny_avx512
#pragma GCC pop_options
#endif

// ------------------------------------------------------------------------------ dispatch

// Columns [n_begin, n_end) of y with the instruction set the verify ops run (logit_loops_isa).
template <typename WT>
inline void skinny_linear_columns(const SkinnyLinearArgs<WT>& a, int64_t n_begin, int64_t n_end) {
  using Fn = void (*)(const SkinnyLinearArgs<WT>&, int64_t, int64_t);
  static const Fn chosen = [] {
#ifdef SPECDECODE_HAVE_X86_SKINNY
    const char* isa = logit_loops_isa();
    if (std::strcmp(isa, "avx512") == 0) return static_cast<Fn>(&skinny_avx512::columns<WT>);
    if (std::strcmp(isa, "avx2") == 0) return static_cast<Fn>(&skinny_avx2::columns<WT>);
#endif
    return static_cast<Fn>(&skinny_baseline::columns<WT>);
  }();
  chosen(a, n_begin, n_end);
}

}  // namespace kernels
}  // namespace specdecode
