// The two ways a CUDA verification kernel sees one distribution over the vocabulary, the
// device counterparts of kernels/distributions.h:
//   ProbSource   - probabilities in memory (verify_probs);
//   LogitSource  - raw logits turned into the processed distribution on demand: temperature,
//                  then top-k (ties kept), then top-p, then min-p, exactly as LogitRow does.
// plus block-wide argmax and inverse-CDF sampling with one uniform. One CUDA block handles one
// batch row; every function taking BlockShared& is collective (all threads, same arguments).
// Torch-free.
//
// Numerics, relative to the CPU kernels:
//   * a probability read from memory is double(float(value)) (float64 exact), as ProbRow;
//   * a logit's unnormalised weight e = fast_exp((l - max) / T) is the CPU's float32 value bit
//     for bit (same polynomial, no FMA contraction); the normaliser sum(e) is accumulated in
//     float64 per thread (the CPU sums float32 partials of 2048 entries, for an unfiltered row
//     in one online pass relative to each chunk's max), so 1/sum may differ from the CPU's by
//     ~1e-7..1e-6 relative: see tests/test_cuda.py for what that allows;
//   * residuals (w p - q)_+ round exactly as the CPU's residual(): w * p - q for probabilities,
//     e_p * (w * inv_norm_p) - e_q * inv_norm_q for logits, each product and difference
//     rounded on its own (explicit _rn intrinsics: no FMA contraction);
//   * the inverse CDF uses the same rule (first x whose cumulative weight exceeds u * total,
//     never a zero-weight x) with a chunked parallel prefix sum in float64 instead of a
//     sequential one: results agree unless u * total lies within ~1e-13 (relative) of a
//     cumulative-sum boundary;
//   * top-p and top-k select with a 4 x 8-bit radix search over the logits' bits; top-p's
//     per-bin masses are summed with float64 shared-memory atomics (order not deterministic,
//     which matters only when a mass lies within ~1e-15 relative of top_p * total).
#pragma once

#include <cstdint>

#include "kernels/common.h"
#include "kernels/cuda/block_utils.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Chunks of the sampling pass: at most this many per row (their sums live in shared memory).
constexpr int kMaxSampleChunks = 1024;
constexpr int kRadixBins = 256;

// Per-block shared state used by the collective helpers (static shared memory, ~12 KiB).
struct BlockShared {
  ReduceScratch reduce;
  int32_t bin_count[kRadixBins];
  double bin_mass[kRadixBins];
  double chunk_sum[kMaxSampleChunks];
  // values broadcast from warp 0
  uint32_t selected_bin;
  int64_t selected_rank;
  double selected_above;
  double selected_limit;
  int64_t found_chunk;
  double found_carry;
  double found_total;
};

// Result of an argmax: the index, and the status of the row (logits: NaN/+inf, all -inf).
struct ArgMaxResult {
  int64_t index;
  int32_t status;
};

// Collective. argmax over double(value) with ties to the lowest index; NaN entries are skipped,
// and a NaN at index 0 returns 0 (the CPU's sequential scan keeps its first element then).
// `as_logits` reads values through float (LogitRow) and reports NaN/+inf and all -inf rows.
template <int BLOCK, bool kAsLogits, typename T>
__device__ __noinline__ ArgMaxResult block_argmax_row(const T* row, int64_t V, BlockShared& sh) {
  ArgMax best{-double_inf(), kNoIndex};
  int bad = 0;
  row_for_each<BLOCK>(row, V, [&](int64_t x, T raw) {
    const double v = kAsLogits ? static_cast<double>(to_float(raw)) : to_double(raw);
    if (kAsLogits) bad |= (v != v) | (v == double_inf());
    if (v == v && (v > best.value || (v == best.value && x < best.index))) best = ArgMax{v, x};
  });
  best = block_reduce<BLOCK>(best, OpArgMax(), sh.reduce);
  ArgMaxResult result{best.index, kOk};
  const double first = kAsLogits ? static_cast<double>(to_float(row[0])) : to_double(row[0]);
  if (first != first || best.index == kNoIndex) result.index = 0;
  if (kAsLogits) {
    bad = block_reduce<BLOCK>(bad, OpOr(), sh.reduce);
    if (bad) result.status = kNonFiniteLogit;
    else if (best.value == -double_inf()) result.status = kEmptyDistribution;
  }
  return result;
}

// Collective inverse-CDF draw from non-negative weights weight(x), x in [0, V), with one
// uniform u in [0, 1): the first x whose cumulative weight exceeds u * total and whose weight
// is positive, the last positive x if rounding leaves the threshold at the very top, -1 when
// the total is not a positive finite number. Reads every weight once plus one chunk twice.
template <int BLOCK, typename W>
__device__ __noinline__ int64_t block_sample_inverse_cdf(const W& weight, int64_t V, double u, BlockShared& sh) {
  constexpr int kWarps = BLOCK / kWarpSize;
  const int lane = threadIdx.x & (kWarpSize - 1);
  const int warp = threadIdx.x / kWarpSize;
  const int64_t per_thread = (V + int64_t{BLOCK} * kMaxSampleChunks - 1) / (int64_t{BLOCK} * kMaxSampleChunks);
  const int64_t chunk = int64_t{BLOCK} * (per_thread > 0 ? per_thread : 1);
  const int64_t num_chunks = (V + chunk - 1) / chunk;

  // Pass 1: one warp per chunk, coalesced; the chunk sums go to shared memory.
  int64_t last_positive = -1;
  for (int64_t c = warp; c < num_chunks; c += kWarps) {
    const int64_t start = c * chunk;
    const int64_t stop = start + chunk < V ? start + chunk : V;
    double sum = 0.0;
    for (int64_t x = start + lane; x < stop; x += kWarpSize) {
      const double w = weight(x);
      sum += w;
      if (w > 0.0) last_positive = x;
    }
    sum = warp_reduce(sum, OpSum());
    if (lane == 0) sh.chunk_sum[c] = sum;
  }
  last_positive = block_reduce<BLOCK>(last_positive, OpMax(), sh.reduce);  // also publishes chunk_sum

  // Warp 0: total, threshold, and the first chunk whose cumulative sum exceeds it.
  if (warp == 0) {
    const int64_t per_lane = (num_chunks + kWarpSize - 1) / kWarpSize;
    const int64_t c0 = lane * per_lane;
    const int64_t c1 = c0 + per_lane < num_chunks ? c0 + per_lane : num_chunks;
    double lane_sum = 0.0;
    for (int64_t c = c0; c < c1; ++c) lane_sum += sh.chunk_sum[c];
    const double inclusive = warp_inclusive_scan(lane_sum);
    const double total = shfl_idx(inclusive, kWarpSize - 1);
    const double threshold = u * total;
    double run = shfl_up(inclusive, 1);
    if (lane == 0) run = 0.0;
    int64_t found = kNoIndex;
    double carry = 0.0;
    for (int64_t c = c0; c < c1; ++c) {
      const double before = run;
      run += sh.chunk_sum[c];
      if (run > threshold) {
        found = c;
        carry = before;
        break;
      }
    }
    found = warp_reduce(found, OpMin());
    if (found != kNoIndex) carry = shfl_idx(carry, static_cast<int>(found / per_lane));
    if (lane == 0) {
      sh.found_chunk = found;
      sh.found_carry = carry;
      sh.found_total = total;
    }
  }
  __syncthreads();
  const double total = sh.found_total;
  const int64_t found = sh.found_chunk;
  const double carry = sh.found_carry;
  if (!(total > 0.0) || !isfinite(total)) return -1;
  if (found == kNoIndex) return last_positive;
  const double threshold = u * total;

  // Pass 2 over the one chunk: per-thread runs of consecutive entries, block scan, first
  // crossing.
  const int64_t start = found * chunk;
  const int64_t stop = start + chunk < V ? start + chunk : V;
  const int64_t per = chunk / BLOCK;
  const int64_t x0 = start + threadIdx.x * per;
  const int64_t x1 = x0 + per < stop ? x0 + per : stop;
  double mine = 0.0;
  for (int64_t x = x0; x < x1; ++x) mine += weight(x);
  double cumulative = carry + block_exclusive_scan<BLOCK>(mine, sh.reduce);
  int64_t hit = kNoIndex;
  int64_t chunk_last_positive = -1;
  for (int64_t x = x0; x < x1; ++x) {
    const double w = weight(x);
    cumulative += w;
    if (w > 0.0) {
      chunk_last_positive = x;
      if (cumulative > threshold && hit == kNoIndex) hit = x;
    }
  }
  hit = block_reduce<BLOCK>(hit, OpMin(), sh.reduce);
  if (hit != kNoIndex) return hit;
  // Rounding put the threshold at the chunk's very top: its last positive entry.
  chunk_last_positive = block_reduce<BLOCK>(chunk_last_positive, OpMax(), sh.reduce);
  return chunk_last_positive;
}

// ------------------------------------------------------------------------------ ProbSource
struct ProbState {
  int32_t status;
};

template <typename T>
struct ProbSource {
  using Elem = T;
  using State = ProbState;

  template <int BLOCK>
  __device__ State prepare(const T*, int64_t, BlockShared&) const {
    return State{kOk};
  }
  __device__ __forceinline__ double value_prob(const State&, T raw) const { return to_double(raw); }
  __device__ __forceinline__ double prob(const State&, const T* row, int64_t x) const { return to_double(row[x]); }
  // ProbRow::residual for one element: max(w p - q, 0), product and difference rounded apart.
  __device__ __forceinline__ double residual_value(const State&, T p_raw, const State&, T q_raw, double w) const {
    const double r = __dsub_rn(__dmul_rn(w, to_double(p_raw)), to_double(q_raw));
    return r > 0.0 ? r : 0.0;
  }
  template <int BLOCK>
  __device__ ArgMaxResult argmax(const T* row, int64_t V, BlockShared& sh) const {
    return block_argmax_row<BLOCK, false>(row, V, sh);
  }
};

// ------------------------------------------------------------------------------ LogitSource
// Sampling settings, prepared on the host (temperature > 0 here: temperature 0 is greedy and
// handled by the op layer).
struct LogitParams {
  float inv_temp;    // float(1.0 / temperature), as LogitRow
  int64_t top_k;     // 0 = off
  double top_p;      // 1 = off
  float min_e;       // float(min_p): keep x iff its e >= min_e (e of the max is 1); 0 = off
  bool filters;      // any of top-k / top-p / min-p on
};

struct LogitState {
  float max_logit;
  float keep_logit;  // keep x iff logit(x) >= keep_logit (top-k and top-p)
  float min_e;       // and e(x) >= min_e (min-p)
  int32_t status;
  double inv_norm;   // 1 / sum of the kept e
};

// Collective. The logit of the k-th largest entry (1 <= k < V): radix select, 8 bits a pass.
template <int BLOCK, typename T>
__device__ __noinline__ float radix_kth_largest(const T* row, int64_t V, int64_t k, BlockShared& sh) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  uint32_t prefix = 0, mask = 0;
  int64_t rank = k;  // wanted rank among the entries whose key matches prefix on mask
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += BLOCK) sh.bin_count[i] = 0;
    __syncthreads();
    for (int64_t base = 0; base < V; base += BLOCK) {  // uniform trip count: warp intrinsics inside
      const int64_t x = base + threadIdx.x;
      uint32_t bin = kRadixBins;
      if (x < V) {
        const uint32_t key = float_to_key(to_float(row[x]));
        if ((key & mask) == prefix) bin = (key >> shift) & 0xffu;
      }
      const unsigned peers = __match_any_sync(kFullMask, bin);
      if (bin < kRadixBins && lane == __ffs(peers) - 1) atomicAdd(&sh.bin_count[bin], __popc(peers));
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {
      // lane L owns bins 255 - 8L down to 248 - 8L
      int64_t counts[8];
      int64_t lane_total = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        counts[j] = sh.bin_count[kRadixBins - 1 - 8 * lane - j];
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
      chosen = __reduce_min_sync(kFullMask, chosen);
      rest = shfl_idx(rest, static_cast<int>((kRadixBins - 1 - chosen) / 8));
      if (lane == 0) {
        sh.selected_bin = chosen;
        sh.selected_rank = rest;
      }
    }
    __syncthreads();
    prefix |= sh.selected_bin << shift;
    mask |= 0xffu << shift;
    rank = sh.selected_rank;
  }
  return key_to_float(prefix);
}

// Collective. LogitRow's top-p threshold: the smallest kept logit v (kept: logit >= keep) such
// that the mass of kept entries with a logit strictly above v is below top_p * (kept mass),
// masses being e = fast_exp((l - max) / T) in float64. Radix search from the top, 8 bits a
// pass, carrying the mass of everything above the current prefix.
template <int BLOCK, typename T>
__device__ __noinline__ float top_p_threshold(const T* row, int64_t V, float max_logit, float inv_temp, float keep,
                                              double top_p, BlockShared& sh) {
  const int lane = threadIdx.x & (kWarpSize - 1);
  uint32_t prefix = 0, mask = 0;
  double above = 0.0;  // kept mass strictly above every key matching prefix
  double limit = 0.0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kRadixBins; i += BLOCK) {
      sh.bin_count[i] = 0;
      sh.bin_mass[i] = 0.0;
    }
    __syncthreads();
    for (int64_t base = 0; base < V; base += BLOCK) {  // uniform trip count: warp intrinsics inside
      const int64_t x = base + threadIdx.x;
      uint32_t bin = kRadixBins;
      double e = 0.0;
      if (x < V) {
        const float l = to_float(row[x]);
        if (l >= keep) {
          const uint32_t key = float_to_key(l);
          if ((key & mask) == prefix) {
            bin = (key >> shift) & 0xffu;
            e = static_cast<double>(scaled_exp(l, max_logit, inv_temp));
          }
        }
      }
      const unsigned peers = __match_any_sync(kFullMask, bin);
      const bool leader = bin < kRadixBins && lane == __ffs(peers) - 1;
      const unsigned groups = __ballot_sync(kFullMask, leader);
      if (__popc(groups) == 1) {
        // one bin for the whole warp (common: logits share exponent bits): one atomic
        const double sum = warp_reduce(e, OpSum());
        if (leader) {
          atomicAdd(&sh.bin_mass[bin], sum);
          atomicAdd(&sh.bin_count[bin], __popc(peers));
        }
      } else if (groups != 0) {
        if (bin < kRadixBins) atomicAdd(&sh.bin_mass[bin], e);
        if (leader) atomicAdd(&sh.bin_count[bin], __popc(peers));
      }
    }
    __syncthreads();
    if (threadIdx.x < kWarpSize) {
      int32_t counts[8];
      double masses[8];
      double lane_mass = 0.0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        counts[j] = sh.bin_count[kRadixBins - 1 - 8 * lane - j];
        masses[j] = sh.bin_mass[kRadixBins - 1 - 8 * lane - j];
        lane_mass += masses[j];
      }
      if (shift == 24) limit = top_p * warp_reduce(lane_mass, OpSum());  // kept mass, every lane
      const double inclusive = warp_inclusive_scan(lane_mass);
      double run = shfl_up(inclusive, 1);
      if (lane == 0) run = 0.0;
      run += above;
      uint32_t chosen = kRadixBins;
      double chosen_above = 0.0;
      for (int j = 0; j < 8; ++j) {
        if (counts[j] == 0) continue;
        if (!(run < limit)) break;
        chosen = kRadixBins - 1 - 8 * lane - j;
        chosen_above = run;
        run += masses[j];
      }
      chosen = __reduce_min_sync(kFullMask, chosen);
      chosen_above = shfl_idx(chosen_above, static_cast<int>((kRadixBins - 1 - chosen) / 8));
      if (lane == 0) {
        sh.selected_bin = chosen;
        sh.selected_above = chosen_above;
        sh.selected_limit = limit;
      }
    }
    __syncthreads();
    prefix |= sh.selected_bin << shift;
    mask |= 0xffu << shift;
    above = sh.selected_above;
    limit = sh.selected_limit;
  }
  return key_to_float(prefix);
}

template <typename T>
struct LogitSource {
  using Elem = T;
  using State = LogitState;
  LogitParams params;

  // Collective: LogitRow::prepare. Reads the row 2 times (max, normaliser), plus 4 times for
  // top-k and 4 times for top-p when those are on.
  template <int BLOCK>
  __device__ __noinline__ State prepare(const T* row, int64_t V, BlockShared& sh) const {
    const float kInf = float_inf();
    State s{0.0f, -kInf, 0.0f, kOk, 0.0};
    float m = -kInf;
    int bad = 0;
    row_for_each<BLOCK>(row, V, [&](int64_t, T raw) {
      const float l = to_float(raw);
      bad |= (l != l) | (l == kInf);
      m = l > m ? l : m;
    });
    bad = block_reduce<BLOCK>(bad, OpOr(), sh.reduce);
    if (bad) {
      s.status = kNonFiniteLogit;
      return s;
    }
    m = block_reduce<BLOCK>(m, OpMax(), sh.reduce);
    if (m == -kInf) {
      s.status = kEmptyDistribution;
      return s;
    }
    s.max_logit = m;
    if (params.filters) {
      if (params.top_k > 0 && params.top_k < V) s.keep_logit = radix_kth_largest<BLOCK>(row, V, params.top_k, sh);
      if (params.top_p < 1.0) {
        const float t = top_p_threshold<BLOCK>(row, V, m, params.inv_temp, s.keep_logit, params.top_p, sh);
        s.keep_logit = s.keep_logit < t ? t : s.keep_logit;  // std::max(keep, t)
      }
      s.min_e = params.min_e;
    }
    const float it = params.inv_temp, keep = s.keep_logit, min_e = s.min_e;
    double total = 0.0;
    row_for_each<BLOCK>(row, V, [&](int64_t, T raw) {
      const float l = to_float(raw);
      const float e = scaled_exp(l, m, it);
      total += (l >= keep && e >= min_e) ? static_cast<double>(e) : 0.0;
    });
    total = block_reduce<BLOCK>(total, OpSum(), sh.reduce);
    s.inv_norm = 1.0 / total;  // total >= 1: the max is always kept and has e = 1
    return s;
  }

  // LogitRow::prob / fill for one element.
  __device__ __forceinline__ double value_prob(const State& s, T raw) const {
    if (s.status != kOk) return 0.0;
    const float l = to_float(raw);
    if (!(l >= s.keep_logit)) return 0.0;
    const float e = scaled_exp(l, s.max_logit, params.inv_temp);
    if (e < s.min_e) return 0.0;
    return __dmul_rn(static_cast<double>(e), s.inv_norm);
  }
  __device__ __forceinline__ double prob(const State& s, const T* row, int64_t x) const {
    return value_prob(s, row[x]);
  }
  // LogitRow::residual (logit_loops.h residual_body) for one element:
  //   max(e_p * (w * inv_norm_p) - e_q * inv_norm_q, 0), 0 when either row is bad.
  __device__ __forceinline__ double residual_value(const State& sp, T p_raw, const State& sq, T q_raw,
                                                   double w) const {
    if (sp.status != kOk || sq.status != kOk) return 0.0;
    const float lp = to_float(p_raw);
    const float lq = to_float(q_raw);
    const float ep = scaled_exp(lp, sp.max_logit, params.inv_temp);
    const float eq = scaled_exp(lq, sq.max_logit, params.inv_temp);
    const double wp_norm = __dmul_rn(w, sp.inv_norm);
    const double p = (lp >= sp.keep_logit && ep >= sp.min_e) ? __dmul_rn(static_cast<double>(ep), wp_norm) : 0.0;
    const double q = (lq >= sq.keep_logit && eq >= sq.min_e) ? __dmul_rn(static_cast<double>(eq), sq.inv_norm) : 0.0;
    const double r = __dsub_rn(p, q);
    return r > 0.0 ? r : 0.0;
  }
  // argmax of the processed distribution = argmax of the raw logits; sets the row's status.
  template <int BLOCK>
  __device__ ArgMaxResult argmax(const T* row, int64_t V, BlockShared& sh) const {
    return block_argmax_row<BLOCK, true>(row, V, sh);
  }
};

// The weights every rule samples from, as one type so that the sampler is compiled once per
// source: p(x) when q_row is null, else the residual (scale * p(x) - q(x))_+ exactly as the
// CPU's residual() rounds it (scale = 1 for token verification, w_tau for block).
template <class Src>
struct SampleWeight {
  using T = typename Src::Elem;
  const Src* src;
  typename Src::State p_state;
  const T* p_row;
  typename Src::State q_state;
  const T* q_row;
  double scale;
  __device__ __forceinline__ double operator()(int64_t x) const {
    if (q_row == nullptr) return src->prob(p_state, p_row, x);
    return src->residual_value(p_state, p_row[x], q_state, q_row[x], scale);
  }
};

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
