// Device helpers shared by every CUDA verification kernel: element loads for the four
// dtypes, the CPU's float32 exp reproduced bit for bit, warp/block reductions and scans, and
// coalesced (16-byte vectorised where aligned) passes over one vocabulary row.
// One CUDA block works on one batch row; every function here marked "collective" must be
// called by all threads of the block with the same arguments. Torch-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace specdecode {
namespace kernels {
namespace cuda {

// The kernel's dynamic shared memory (a macro so that a host-side test harness can supply it).
#ifndef SPECDECODE_DYNAMIC_SHARED
#define SPECDECODE_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;
constexpr int64_t kNoIndex = INT64_MAX;

__device__ __forceinline__ float float_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double double_inf() { return __longlong_as_double(0x7ff0000000000000LL); }

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
// the CPU's (built with -ffp-contract=off) bit for bit.
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

// exp((l - max) / T) as LogitRow::exp_at computes it.
__device__ __forceinline__ float scaled_exp(float logit, float max_logit, float inv_temp) {
  return fast_exp_nonpositive_dev(__fmul_rn(__fsub_rn(logit, max_logit), inv_temp));
}

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

// (count, max) for top-beta.
struct CountMax {
  int64_t count;
  double max;
};
template <>
__device__ __forceinline__ CountMax shfl_xor<CountMax>(CountMax v, int mask) {
  return CountMax{__shfl_xor_sync(kFullMask, v.count, mask), __shfl_xor_sync(kFullMask, v.max, mask)};
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
    return a < b ? a : b;
  }
};
struct OpOr {
  __device__ __forceinline__ int operator()(int a, int b) const { return a | b; }
};
struct OpArgMax {
  __device__ __forceinline__ ArgMax operator()(ArgMax a, ArgMax b) const {
    if (a.value > b.value) return a;
    if (b.value > a.value) return b;
    return a.index < b.index ? a : b;  // equal values (or NaN on one side: see callers)
  }
};
struct OpCountMax {
  __device__ __forceinline__ CountMax operator()(CountMax a, CountMax b) const {
    return CountMax{a.count + b.count, b.max > a.max ? b.max : a.max};
  }
};

template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask >>= 1) v = op(v, shfl_xor(v, mask));
  return v;
}

// Inclusive prefix sum over the lanes of a warp (lane 0 first).
__device__ __forceinline__ double warp_inclusive_scan(double v) {
  const int lane = threadIdx.x & (kWarpSize - 1);
#pragma unroll
  for (int delta = 1; delta < kWarpSize; delta <<= 1) {
    const double other = shfl_up(v, delta);
    if (lane >= delta) v += other;
  }
  return v;
}
__device__ __forceinline__ int64_t warp_inclusive_scan(int64_t v) {
  const int lane = threadIdx.x & (kWarpSize - 1);
#pragma unroll
  for (int delta = 1; delta < kWarpSize; delta <<= 1) {
    const int64_t other = shfl_up(v, delta);
    if (lane >= delta) v += other;
  }
  return v;
}

// ------------------------------------------------------------------------------ block level
// Scratch for one block-wide reduction or scan: one 16-byte slot per warp.
struct alignas(16) ReduceScratch {
  unsigned char bytes[kWarpSize * 16];
};

// Collective. Every thread returns the same value; the combination order is fixed, so the
// result is deterministic for a given block size.
template <int BLOCK, typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, Op op, ReduceScratch& scratch) {
  static_assert(sizeof(V) <= 16, "block_reduce: value too large for the scratch slots");
  constexpr int kWarps = BLOCK / kWarpSize;
  v = warp_reduce(v, op);
  V* slots = reinterpret_cast<V*>(scratch.bytes);
  __syncthreads();  // the previous user of the scratch is done
  if ((threadIdx.x & (kWarpSize - 1)) == 0) slots[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  V result = slots[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) result = op(result, slots[w]);
  return result;
}

// Collective exclusive prefix sum of one double per thread (thread 0 first).
template <int BLOCK>
__device__ __forceinline__ double block_exclusive_scan(double v, ReduceScratch& scratch) {
  constexpr int kWarps = BLOCK / kWarpSize;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int warp = threadIdx.x / kWarpSize;
  const double inclusive = warp_inclusive_scan(v);
  double* slots = reinterpret_cast<double*>(scratch.bytes);
  __syncthreads();
  if (lane == kWarpSize - 1) slots[warp] = inclusive;
  __syncthreads();
  double before = 0.0;
  for (int w = 0; w < warp; ++w) before += slots[w];
  (void)kWarps;
  return before + (inclusive - v);
}

// ------------------------------------------------------------------------------ row passes
// f(index, element) for every element of row[0..V), each visited by exactly one thread.
// 16-byte loads when the row is 16-byte aligned (a warp reads 512 consecutive bytes), issued
// kUnroll at a time before any is used so that enough bytes are in flight, then a scalar tail.
// Not for code that needs warp-synchronous intrinsics inside f.
constexpr int kUnroll = 4;
template <int BLOCK, typename T, typename F>
__device__ __forceinline__ void row_for_each(const T* row, int64_t V, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    const int64_t num_vec = V / kVec;
    const uint4* vrow = reinterpret_cast<const uint4*>(row);
    for (int64_t j0 = threadIdx.x; j0 < num_vec; j0 += int64_t{BLOCK} * kUnroll) {
      uint4 raw[kUnroll];
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        const int64_t j = j0 + int64_t{r} * BLOCK;
        if (j < num_vec) raw[r] = __ldg(vrow + j);
      }
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        const int64_t j = j0 + int64_t{r} * BLOCK;
        if (j < num_vec) {
          T vals[kVec];
          memcpy(vals, &raw[r], sizeof(uint4));
#pragma unroll
          for (int k = 0; k < kVec; ++k) f(j * kVec + k, vals[k]);
        }
      }
    }
    done = num_vec * kVec;
  }
  for (int64_t x = done + threadIdx.x; x < V; x += BLOCK) f(x, row[x]);
}

// f(index, a[index], b[index]) over two rows of the same length.
template <int BLOCK, typename T, typename F>
__device__ __forceinline__ void row_pair_for_each(const T* a, const T* b, int64_t V, F&& f) {
  constexpr int kVec = 16 / sizeof(T);
  int64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15u) == 0) {
    const int64_t num_vec = V / kVec;
    const uint4* va = reinterpret_cast<const uint4*>(a);
    const uint4* vb = reinterpret_cast<const uint4*>(b);
    for (int64_t j = threadIdx.x; j < num_vec; j += BLOCK) {
      const uint4 raw_a = __ldg(va + j);
      const uint4 raw_b = __ldg(vb + j);
      T vals_a[kVec], vals_b[kVec];
      memcpy(vals_a, &raw_a, sizeof(raw_a));
      memcpy(vals_b, &raw_b, sizeof(raw_b));
#pragma unroll
      for (int k = 0; k < kVec; ++k) f(j * kVec + k, vals_a[k], vals_b[k]);
    }
    done = num_vec * kVec;
  }
  for (int64_t x = done + threadIdx.x; x < V; x += BLOCK) f(x, a[x], b[x]);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
