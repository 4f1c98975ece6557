// Radix select on the GPU, for the filters of filters.cuh: the k-th largest of a row's logits
// (integer counts, 8 bits a pass) and LogitRow's exact top-p threshold (masses summed as 128-bit
// fixed-point integers: exact, order-independent, hence deterministic). Block-collective device
// functions over one row; torch-free.
#pragma once

#include "kernels/cuda/pipeline.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

constexpr int kRadixBins = 256;

// ------------------------------------------------------------------------------ radix select
struct RadixShared {
  int32_t count[kRadixBins];
  unsigned long long mass_lo[kRadixBins];  // 128-bit fixed-point masses (units of 2^-88)
  unsigned long long mass_hi[kRadixBins];
  uint32_t chosen_bin;
  int64_t chosen_rank;
  double chosen_above;
  double limit;
};

// e (a float in [0, 1]) as a 128-bit integer in units of 2^-88: hi * 2^64 + lo. Entries below
// 2^-88 (and subnormals) count as 0: together they weigh less than V * 2^-88.
__device__ __forceinline__ void fixed_point_128(float e, unsigned long long* hi, unsigned long long* lo) {
  const uint32_t bits = __float_as_uint(e);
  const int32_t biased = static_cast<int32_t>((bits >> 23) & 0xffu);
  *hi = 0;
  *lo = 0;
  if (biased == 0 || (bits >> 31)) return;  // zero, subnormal (or negative: never passed)
  const unsigned long long mantissa = (bits & 0x7fffffu) | 0x800000u;  // 24 bits
  const int32_t shift = biased - 127 + 65;  // e = mantissa * 2^(biased - 127 - 23); times 2^88
  if (shift <= -64) return;
  if (shift < 0) {
    *lo = mantissa >> (-shift);
  } else if (shift == 0) {
    *lo = mantissa;
  } else if (shift < 64) {
    *lo = mantissa << shift;
    *hi = mantissa >> (64 - shift);
  } else {
    *hi = mantissa << (shift - 64);
  }
}

__device__ __forceinline__ double fixed_point_to_double(unsigned long long hi, unsigned long long lo) {
  return static_cast<double>(hi) * 0x1p-24 + static_cast<double>(lo) * 0x1p-88;
}

// Collective. The k-th largest (1 <= k <= number of entries) of the values get(i), i in
// [0, n) (no NaN): radix select over the ordered float keys, 8 bits a pass, counts only.
template <int BLOCK, typename Get>
__device__ float radix_kth_largest(const Get& get, int64_t n, int64_t k, RadixShared& sh) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  uint32_t prefix = 0, mask = 0;
  int64_t rank = k;  // wanted rank among the entries whose key matches `prefix` on `mask`
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += BLOCK) sh.count[i] = 0;
    __syncthreads();  // counts cleared before anyone adds
    for (int64_t base = 0; base < n; base += BLOCK) {  // uniform trip count: warp intrinsics inside
      const int64_t i = base + threadIdx.x;
      uint32_t bin = kRadixBins;
      if (i < n) {
        const uint32_t key = float_to_key(get(i));
        if ((key & mask) == prefix) bin = (key >> shift) & 0xffu;
      }
      const unsigned peers = __match_any_sync(kFullMask, bin);
      if (bin < kRadixBins && lane == __ffs(peers) - 1) atomicAdd(&sh.count[bin], __popc(peers));
    }
    __syncthreads();  // counts complete
    if (threadIdx.x < kWarpSize) {
      // lane L owns bins 255 - 8L down to 248 - 8L (descending values)
      int64_t counts[8];
      int64_t lane_total = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        counts[j] = sh.count[kRadixBins - 1 - 8 * lane - j];
        lane_total += counts[j];
      }
      int64_t above = warp_inclusive_scan(lane_total) - lane_total;
      uint32_t chosen = kRadixBins;
      int64_t rest = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (above < rank && rank <= above + counts[j]) {
          chosen = kRadixBins - 1 - 8 * lane - j;
          rest = rank - above;
        }
        above += counts[j];
      }
      chosen = warp_reduce(chosen, OpMin());  // exactly one lane found the bin
      rest = shfl_idx(rest, static_cast<int>((kRadixBins - 1 - chosen) / 8));
      if (lane == 0) {
        sh.chosen_bin = chosen;
        sh.chosen_rank = rest;
      }
    }
    __syncthreads();  // chosen bin published
    prefix |= sh.chosen_bin << shift;
    mask |= 0xffu << shift;
    rank = sh.chosen_rank;
    __syncthreads();  // everyone read it before the next pass overwrites
  }
  return key_to_float(prefix);
}

// Collective. LogitRow's top-p threshold over the entries of `row` with logit >= keep: the
// smallest such logit v whose strictly-larger kept mass is below top_p * (kept mass), masses
// e = fast_exp((l - max) / T) exactly as the CPU, summed exactly (128-bit fixed point). Radix
// search from the top, 8 bits a pass, carrying the mass above the current prefix.
template <int BLOCK, typename T>
__device__ float top_p_threshold_exact(const T* row, int64_t V, float max_logit, float inv_temp, float keep,
                                       double top_p, RadixShared& sh) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  uint32_t prefix = 0, mask = 0;
  double above = 0.0;  // kept mass strictly above every key matching prefix
  double limit = 0.0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += BLOCK) {
      sh.count[i] = 0;
      sh.mass_lo[i] = 0;
      sh.mass_hi[i] = 0;
    }
    __syncthreads();  // bins cleared before anyone adds
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
      const float l = to_float(row[x]);
      if (!(l >= keep)) continue;
      const uint32_t key = float_to_key(l);
      if ((key & mask) != prefix) continue;
      const uint32_t bin = (key >> shift) & 0xffu;
      unsigned long long hi, lo;
      fixed_point_128(scaled_exp(l, max_logit, inv_temp), &hi, &lo);
      atomicAdd(&sh.count[bin], 1);
      const unsigned long long old = atomicAdd(&sh.mass_lo[bin], lo);
      const unsigned long long carry = old + lo < old ? 1ull : 0ull;  // the low word wrapped
      if (hi + carry != 0) atomicAdd(&sh.mass_hi[bin], hi + carry);
    }
    __syncthreads();  // bins complete (integer sums: independent of the order of the adds)
    if (threadIdx.x < kWarpSize) {
      int32_t counts[8];
      double masses[8];
      double lane_mass = 0.0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int bin = kRadixBins - 1 - 8 * lane - j;
        counts[j] = sh.count[bin];
        masses[j] = fixed_point_to_double(sh.mass_hi[bin], sh.mass_lo[bin]);
        lane_mass += masses[j];
      }
      if (shift == 24) limit = top_p * warp_reduce(lane_mass, OpSum());  // kept mass, every lane
      const double inclusive = warp_inclusive_scan(lane_mass);
      double run = above + (inclusive - lane_mass);
      uint32_t chosen = kRadixBins;
      double chosen_above = 0.0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (counts[j] != 0 && run < limit) {
          chosen = kRadixBins - 1 - 8 * lane - j;
          chosen_above = run;
        }
        if (counts[j] != 0) run += masses[j];
      }
      // The wanted bin is the last (lowest) non-empty bin whose mass above is < limit.
      chosen = warp_reduce(chosen, OpMin());
      chosen_above = shfl_idx(chosen_above, static_cast<int>((kRadixBins - 1 - chosen) / 8));
      if (lane == 0) {
        sh.chosen_bin = chosen;
        sh.chosen_above = chosen_above;
        sh.limit = limit;
      }
    }
    __syncthreads();  // chosen bin published
    prefix |= sh.chosen_bin << shift;
    mask |= 0xffu << shift;
    above = sh.chosen_above;
    limit = sh.limit;
    __syncthreads();  // everyone read it before the next pass overwrites
  }
  return key_to_float(prefix);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
