// Device helpers shared by every CUDA verification kernel: element loads for the four dtypes,
// the CPU's float32 exp reproduced bit for bit (and a fast approximation of it for sums),
// warp/block reductions and scans with a fixed combination order (deterministic results), a
// warp bitonic sort, and loaders that put one chunk of a vocabulary row into registers.
// Functions marked "collective" must be called by every thread of the block (or warp) with
// the same arguments. Torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/compat.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// The kernel's dynamic shared memory (a macro so that the emulator can supply it).
#ifndef SPECDECODE_DYNAMIC_SHARED
#define SPECDECODE_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;
constexpr int64_t kNoIndex = INT64_MAX;

__device__ __forceinline__ float float_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double double_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
// Neither NaN nor +-inf.
__device__ __forceinline__ bool is_finite(double x) { return x - x == 0.0; }

// ------------------------------------------------------------------------------ loads
// Conversions spelt out with intrinsics so the code also builds with torch's
// __CUDA_NO_HALF_CONVERSIONS__ / __CUDA_NO_BFLOAT16_CONVERSIONS__.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(double v) { return __double2float_rn(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// A probability as the CPU's ProbRow reads it: through float, except float64 stays exact.
template <typename T>
__device__ __forceinline__ double to_double(T v) {
  return static_cast<double>(to_float(v));
}
template <>
__device__ __forceinline__ double to_double<double>(double v) {
  return v;
}

// ------------------------------------------------------------------------------ numerics
// kernels::fast_exp_nonpositive (common.h) step for step. Every operation is an explicitly
// rounded intrinsic, so nvcc cannot contract a multiply-add into an FMA and the result equals
// the CPU's (built with -ffp-contract=off) bit for bit. About 30 instruction slots.
__device__ __forceinline__ float fast_exp_nonpositive_dev(float z) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f;
  const float kLn2Lo = -2.12194440e-4f;
  const float kRoundMagic = 12582912.0f;
  const bool underflow = !(z >= -87.0f);
  const float zc = underflow ? -87.0f : z;
  const float n = __fsub_rn(__fadd_rn(__fmul_rn(zc, kLog2e), kRoundMagic), kRoundMagic);
  const float r = __fsub_rn(__fsub_rn(zc, __fmul_rn(n, kLn2Hi)), __fmul_rn(n, kLn2Lo));
  float poly = 1.9875691500e-4f;
  poly = __fadd_rn(__fmul_rn(poly, r), 1.3981999507e-3f);
  poly = __fadd_rn(__fmul_rn(poly, r), 8.3334519073e-3f);
  poly = __fadd_rn(__fmul_rn(poly, r), 4.1665795894e-2f);
  poly = __fadd_rn(__fmul_rn(poly, r), 1.6666665459e-1f);
  poly = __fadd_rn(__fmul_rn(poly, r), 5.0000001201e-1f);
  poly = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(poly, r), r), r), 1.0f);
  const int32_t exponent = static_cast<int32_t>(n) + 127;
  const float scale = __int_as_float(exponent << 23);
  const float result = __fmul_rn(poly, scale);
  return underflow ? 0.0f : result;
}

// The argument of the exp as LogitRow computes it: z = (l - max) * inv_temp, rounded twice.
__device__ __forceinline__ float scaled_arg(float logit, float max_logit, float inv_temp) {
  return __fmul_rn(__fsub_rn(logit, max_logit), inv_temp);
}

// exp((l - max) / T) as LogitRow::exp_at computes it (bit for bit).
__device__ __forceinline__ float scaled_exp(float logit, float max_logit, float inv_temp) {
  return fast_exp_nonpositive_dev(scaled_arg(logit, max_logit, inv_temp));
}

// 2^t with the hardware approximation (relative error about 2^-22), denormals flushed to 0.
__device__ __forceinline__ float exp2_approx(float t) {
#if defined(SPECDECODE_CUDA_EMULATION)
  return ::specdecode_emu::ex2_approx_ftz(t);
#else
  float result;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(result) : "f"(t));
  return result;
#endif
}

// A cheap stand-in for fast_exp_nonpositive_dev((l - max) * inv_temp), used only where no
// decision depends on its rounding (normalisers, chunk masses, entropies, and as a first guess
// that exact code confirms): 2^((l - max) * c), c = inv_temp * log2(e), one hardware exp2.
// Relative error below 2.5e-5 whatever the magnitude of the logits (the argument is rounded
// twice, relative 2.4e-7, and |argument| <= 125.5 where it is not 0; ex2.approx adds 2^-22).
// 0 (never NaN) below the CPU's underflow cut z = -87, up to rounding right at the cut, and
// when max = -inf.
struct FastWeight {
  float c;
  float max_logit;
  __device__ __forceinline__ FastWeight(float max, float inv_temp) {
    c = __fmul_rn(inv_temp, 1.44269504088896341f);
    max_logit = max;
  }
  __device__ __forceinline__ float operator()(float logit) const {
    const float t = __fmul_rn(__fsub_rn(logit, max_logit), c);
    return t >= -125.5f ? exp2_approx(t) : 0.0f;
  }
};

// Order-preserving map float -> uint32 (larger float, larger key); -0 is folded onto +0 so
// that keys are equal exactly when the floats compare equal. NaN never reaches it.
__device__ __forceinline__ uint32_t float_to_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
__device__ __forceinline__ float key_to_float(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return __uint_as_float(bits);
}

// ------------------------------------------------------------------------------ warp level
template <typename V>
__device__ __forceinline__ V shfl_xor(V v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}
template <typename V>
__device__ __forceinline__ V shfl_up(V v, int delta) {
  return __shfl_up_sync(kFullMask, v, delta);
}
template <typename V>
__device__ __forceinline__ V shfl_idx(V v, int lane) {
  return __shfl_sync(kFullMask, v, lane);
}

// (value, index) for argmax: the larger value wins, ties go to the lower index.
struct ArgMax {
  double value;
  int64_t index;
};
template <>
__device__ __forceinline__ ArgMax shfl_xor<ArgMax>(ArgMax v, int mask) {
  return ArgMax{__shfl_xor_sync(kFullMask, v.value, mask), __shfl_xor_sync(kFullMask, v.index, mask)};
}

// (max, lowest index holding it, NaN / +inf seen) of a row of logits, in one reduction.
struct MaxIndexBad {
  float value;
  int32_t index;
  int32_t bad;
};
template <>
__device__ __forceinline__ MaxIndexBad shfl_xor<MaxIndexBad>(MaxIndexBad v, int mask) {
  return MaxIndexBad{__shfl_xor_sync(kFullMask, v.value, mask), __shfl_xor_sync(kFullMask, v.index, mask),
                     __shfl_xor_sync(kFullMask, v.bad, mask)};
}

struct OpSum {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct OpMax {  // a NaN is never chosen over a number
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return (b > a || a != a) ? b : a;
  }
};
struct OpMin {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return b < a ? b : a;
  }
};
struct OpOr {
  __device__ __forceinline__ int operator()(int a, int b) const { return a | b; }
};
// Larger value, ties (and NaN values, which callers never pass) to the lower index.
struct OpArgMax {
  __device__ __forceinline__ ArgMax operator()(ArgMax a, ArgMax b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index < b.index ? a : b;
  }
};

// Larger value, ties to the lower index; the NaN / +inf flags are OR-ed (values are never NaN).
struct OpMaxIndexBad {
  __device__ __forceinline__ MaxIndexBad operator()(MaxIndexBad a, MaxIndexBad b) const {
    MaxIndexBad r = (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
    r.bad = a.bad | b.bad;
    return r;
  }
};

// Collective (warp). Every lane returns the combination of all 32 lanes' values, combined in
// the same butterfly order on every call.
template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask >>= 1) v = op(v, shfl_xor(v, mask));
  return v;
}

// Collective (warp). Inclusive prefix sum over the lanes (lane 0 first).
template <typename V>
__device__ __forceinline__ V warp_inclusive_scan(V v) {
  const int lane = threadIdx.x & (kWarpSize - 1);
#pragma unroll
  for (int delta = 1; delta < kWarpSize; delta <<= 1) {
    const V other = shfl_up(v, delta);
    if (lane >= delta) v += other;
  }
  return v;
}

// Collective (warp). Bitonic sort of one float per lane into descending order: afterwards
// lane L holds the L-th largest value. NaN must not be passed.
__device__ __forceinline__ float warp_sort_descending(float v) {
  const int lane = threadIdx.x & (kWarpSize - 1);
#pragma unroll
  for (int size = 2; size <= kWarpSize; size <<= 1) {
#pragma unroll
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const float other = shfl_xor(v, stride);
      const bool lower = (lane & stride) == 0;      // this lane holds the lower index of its pair
      const bool descending = (lane & size) == 0;   // direction of this lane's subsequence
      const bool keep_larger = lower == descending;
      v = keep_larger ? (other > v ? other : v) : (other < v ? other : v);
    }
  }
  return v;
}

// ------------------------------------------------------------------------------ block level
// Scratch for one block-wide reduction or scan: one 16-byte slot per warp.
struct alignas(16) ReduceScratch {
  unsigned char bytes[kWarpSize * 16];
};

// Collective. Every thread returns the same value; the combination order is fixed (butterfly
// within warps, then warp 0, 1, 2, ... in order), so the result is deterministic for a given
// block size. Starts with a barrier, so the scratch may be reused by consecutive calls.
template <int BLOCK, typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, Op op, ReduceScratch& scratch) {
  static_assert(sizeof(V) <= 16, "block_reduce: value too large for the scratch slots");
  static_assert(BLOCK % kWarpSize == 0, "block_reduce: BLOCK must be a multiple of 32");
  constexpr int kWarps = BLOCK / kWarpSize;
  v = warp_reduce(v, op);
  V* slots = reinterpret_cast<V*>(scratch.bytes);
  __syncthreads();  // the previous user of the scratch has read its result
  if ((threadIdx.x & (kWarpSize - 1)) == 0) slots[threadIdx.x / kWarpSize] = v;
  __syncthreads();  // every warp's slot is written
  V result = slots[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) result = op(result, slots[w]);
  return result;
}

// Collective. Exclusive prefix sum of one value per thread (thread 0 first); *total receives
// the sum over the block. Deterministic for a given block size.
template <int BLOCK, typename V>
__device__ __forceinline__ V block_exclusive_scan(V v, ReduceScratch& scratch, V* total = nullptr) {
  static_assert(sizeof(V) <= 16, "block_exclusive_scan: value too large for the scratch slots");
  constexpr int kWarps = BLOCK / kWarpSize;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int warp = threadIdx.x / kWarpSize;
  const V inclusive = warp_inclusive_scan(v);
  V* slots = reinterpret_cast<V*>(scratch.bytes);
  __syncthreads();  // the previous user of the scratch has read its result
  if (lane == kWarpSize - 1) slots[warp] = inclusive;
  __syncthreads();  // every warp's total is written
  V before = V(0);
  V all = V(0);
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += slots[w];
    all += slots[w];
  }
  if (total != nullptr) *total = all;
  return before + (inclusive - v);
}

// ------------------------------------------------------------------------------ chunk loads
// A chunk is a run of `len` consecutive elements of one vocabulary row. Its elements stay in
// registers as raw bits (two 16-bit values per 32-bit register) and are converted when used.
// Two layouts:
//  * StridedChunk (coalesced; sums, maxima, lists): thread t holds N elements; slot s =
//    r * kVec + k is chunk index (r * BLOCK + t) * kVec + k, kVec = 16 / sizeof(T), so every
//    warp-wide load reads 512 consecutive bytes;
//  * ContiguousChunk (prefix sums in index order): thread t holds chunk indices
//    [t * N, (t + 1) * N).
// 16-byte vector loads when the chunk start is 16-byte aligned and the vector lies inside the
// chunk, scalar loads otherwise; slots past `len` hold 0 and must be masked with index(s).
template <typename T>
struct VecWidth {
  static constexpr int value = 16 / static_cast<int>(sizeof(T));
};

template <typename T, int N>
struct RawElems {
  static constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
  static_assert(N * sizeof(T) % 16 == 0, "RawElems: whole 16-byte vectors only");
  uint32_t w[kWords];

  // Element s (a compile-time constant after unrolling) as LogitRow reads it (float).
  __device__ __forceinline__ float as_float(int s) const {
    if constexpr (sizeof(T) == 2) {
      const uint32_t word = w[s >> 1];
      const uint32_t bits = (s & 1) ? (word >> 16) : (word & 0xffffu);
      if constexpr (std::is_same<T, __nv_bfloat16>::value) return __uint_as_float(bits << 16);  // exact
      else return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    } else if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[s]);
    } else {
      return __double2float_rn(__hiloint2double(static_cast<int>(w[2 * s + 1]), static_cast<int>(w[2 * s])));
    }
  }
  // Element s as ProbRow reads it: through float, except float64 stays exact.
  __device__ __forceinline__ double as_double(int s) const {
    if constexpr (sizeof(T) == 8) return __hiloint2double(static_cast<int>(w[2 * s + 1]), static_cast<int>(w[2 * s]));
    else return static_cast<double>(as_float(s));
  }

  // The 16-byte vector holding slots [v * kVec, (v + 1) * kVec) from chunk index `first`.
  __device__ __forceinline__ void load_vector(const T* chunk, int len, int first, bool aligned, int v) {
    constexpr int kVec = VecWidth<T>::value;
    uint32_t* out = w + 4 * v;
    if (aligned && first + kVec <= len) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(chunk + first));
      out[0] = raw.x;
      out[1] = raw.y;
      out[2] = raw.z;
      out[3] = raw.w;
      return;
    }
    out[0] = out[1] = out[2] = out[3] = 0u;
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(chunk);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (first + k >= len) break;
      if constexpr (sizeof(T) == 2) {
        unsigned short bits;
        memcpy(&bits, bytes + (first + k) * 2, 2);
        out[k >> 1] |= static_cast<uint32_t>(bits) << (16 * (k & 1));
      } else if constexpr (sizeof(T) == 4) {
        memcpy(&out[k], bytes + (first + k) * 4, 4);
      } else {
        memcpy(&out[2 * k], bytes + (first + k) * 8, 8);
      }
    }
  }
};

template <int BLOCK, int N, typename T>
struct StridedChunk {
  static constexpr int kVec = VecWidth<T>::value;
  static_assert(N % kVec == 0, "StridedChunk: N must be a multiple of the vector width");
  RawElems<T, N> raw;

  __device__ __forceinline__ static int index(int s) { return ((s / kVec) * BLOCK + threadIdx.x) * kVec + s % kVec; }
  __device__ __forceinline__ void load(const T* chunk, int len) {
    const bool aligned = (reinterpret_cast<uintptr_t>(chunk) & 15u) == 0;
#pragma unroll
    for (int v = 0; v < N / kVec; ++v) raw.load_vector(chunk, len, (v * BLOCK + threadIdx.x) * kVec, aligned, v);
  }
  __device__ __forceinline__ float logit(int s) const { return raw.as_float(s); }
  __device__ __forceinline__ double prob(int s) const { return raw.as_double(s); }
};

template <int N, typename T>
struct ContiguousChunk {
  static constexpr int kVec = VecWidth<T>::value;
  static_assert(N % kVec == 0, "ContiguousChunk: N must be a multiple of the vector width");
  RawElems<T, N> raw;

  __device__ __forceinline__ static int index(int s) { return threadIdx.x * N + s; }
  __device__ __forceinline__ void load(const T* chunk, int len) {
    const bool aligned = (reinterpret_cast<uintptr_t>(chunk) & 15u) == 0;
#pragma unroll
    for (int v = 0; v < N / kVec; ++v) raw.load_vector(chunk, len, threadIdx.x * N + v * kVec, aligned, v);
  }
  __device__ __forceinline__ float logit(int s) const { return raw.as_float(s); }
  __device__ __forceinline__ double prob(int s) const { return raw.as_double(s); }
};

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
