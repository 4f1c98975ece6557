// Top-k / top-p / min-p on the GPU: the thresholds of LogitRow::apply_filters (kernels/
// distributions.h) and the normaliser of the kept entries, for every row unit. Torch-free.
//
// Every filter keeps the entries whose logit is >= some threshold (ties kept together), so the
// result is one number per unit, `keep` (PosState): top-k's k-th largest logit, top-p's
// smallest logit whose strictly-larger kept mass is below top_p * (kept mass), and min-p's
// smallest logit with fast_exp((l - max) / T) >= float(min_p), combined by max.
//
//   filter_merge_kernel   one block per unit. Merges the chunk lists of the stats kernel:
//       K = every listed entry > N, N = the largest unlisted entry of any chunk. K holds EVERY
//       entry of the row above N (each chunk lists all its entries above its own `next`), so
//       whatever is decided from K alone is exact:
//         top-k: the k-th largest of K when |K| >= k (or -inf when N = -inf and |K| < k);
//         top-p: walk K's entries in descending order with their exact masses; exact when the
//                walk stops inside K or K holds every kept entry; the total kept mass comes
//                from K (top-k on, or N = -inf) or from the exact masked sum (top-p alone);
//         min-p: exact from the max alone (min_p_logit_threshold);
//         normaliser: exact sum over K when every kept entry is in K (keep > N).
//       Otherwise the unit is marked pending: the fallback computes the thresholds and / or the
//       masked sum computes the normaliser.
//   filter_fallback_kernel  one block per pending unit: top-k by radix select over the whole
//       row (4 passes, integer counts), top-p by radix search with masses summed as 128-bit
//       fixed-point integers (exact, order-independent, hence deterministic).
//   masked_sum_kernel     one block per (unit, chunk): sum of e over kept entries, either exact
//       (the top-p total) or with the fast exp (a normaliser).
#pragma once

#include "kernels/cuda/pipeline.cuh"
#include "kernels/cuda/radix_select.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// ------------------------------------------------------------------------------ masked sum
// Sum of e over the kept entries (logit >= keep) of each chunk of the units some state marks
// pending, into masked_sums[unit, chunk]; one block per unit, looping over its chunks (most
// units have nothing pending: the grid stays small). Two uses:
//   kTotal: units pending kPendingTotal (top-p alone, the approximate kept mass too close to a
//     decision): every entry, e exact as the CPU's top-p total; the merge then runs again;
//   otherwise: units pending kPendingNorm (after the merge / fallback): the normaliser of the
//     entries >= the state's keep, fast exp.
template <int BLOCK, typename T, bool kTotal>
__global__ void __launch_bounds__(BLOCK, kPassMinBlocks) masked_sum_kernel(const Args<T> a) {
  constexpr int kPer = kChunk / BLOCK;
  __shared__ ReduceScratch scratch;
  for (int64_t unit = blockIdx.x; unit < a.units(); unit += gridDim.x) {
    const UnitId u = decode_unit(a, unit);
    if (!unit_needed(a, u)) continue;  // block-uniform
    const PosState st = a.states[unit];
    if (st.status != kOk || !(st.pending & (kTotal ? kPendingTotal : kPendingNorm))) continue;  // block-uniform
    const float keep = kTotal ? -float_inf() : st.keep;
    const FastWeight weight(st.max_logit, a.logit.inv_temp);
    for (int64_t c = 0; c < a.chunks; ++c) {
      const int64_t start = c * kChunk;
      const int len = static_cast<int>(a.V - start < kChunk ? a.V - start : kChunk);
      StridedChunk<BLOCK, kPer, T> ch;
      ch.load(unit_row(a, u) + start, len);
      double sum;
      if (kTotal) {
        double thread_sum = 0.0;  // the CPU adds these float e's in float64 too
#pragma unroll
        for (int s = 0; s < kPer; ++s)
          if (ch.index(s) < len && ch.logit(s) >= keep)
            thread_sum += static_cast<double>(scaled_exp(ch.logit(s), st.max_logit, a.logit.inv_temp));
        sum = block_reduce<BLOCK>(thread_sum, OpSum(), scratch);
      } else {
        float thread_sum = 0.0f;
#pragma unroll
        for (int s = 0; s < kPer; ++s)
          if (ch.index(s) < len && ch.logit(s) >= keep) thread_sum += weight(ch.logit(s));
        sum = block_reduce<BLOCK>(static_cast<double>(thread_sum), OpSum(), scratch);
      }
      if (threadIdx.x == 0) a.masked_sums[unit * a.chunks + c] = sum;
    }
  }
}

// ------------------------------------------------------------------------------ merge
constexpr int kMergeMaxChunks = 1024;  // longer rows (V > 8M) go to the fallback

struct MergeShared {
  float cand[kMergeCap];
  int32_t chunk_offset[kMergeMaxChunks];  // where each chunk's entries start in cand
  RadixShared radix;
  ReduceScratch scratch;
  float l_min;         // min-p threshold, from thread 0
  int32_t n_cand;      // gathered entries, from warp 0
  double approx_mass;  // approximate row mass, from thread 0
};

// Collective: bitonic sort of cand[0..n) into descending order (padded with -inf to a power of
// two; n <= kMergeCap). Each compare-exchange pair belongs to one thread; a barrier separates
// the steps.
template <int BLOCK>
__device__ void sort_descending(float* cand, int n) {
  int size = 1;
  while (size < n) size <<= 1;
  for (int i = n + threadIdx.x; i < size; i += BLOCK) cand[i] = -float_inf();
  __syncthreads();  // padding written
  for (int width = 2; width <= size; width <<= 1) {
    for (int stride = width >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < size; i += BLOCK) {
        const int j = i ^ stride;
        if (j > i) {
          const float x = cand[i], y = cand[j];
          const bool descending = (i & width) == 0;
          if (descending ? x < y : x > y) {
            cand[i] = y;
            cand[j] = x;
          }
        }
      }
      __syncthreads();  // this step's exchanges done before the next step reads
    }
  }
}

// kSecondPass: only the units the first pass left pending kPendingTotal, now with the exact
// kept mass (masked_sum_kernel<kTotal>).
template <int BLOCK, typename T, bool kSecondPass>
__global__ void __launch_bounds__(BLOCK) filter_merge_kernel(const Args<T> a) {
  __shared__ MergeShared sh;
  const float kInf = float_inf();
  const LogitConfig& cfg = a.logit;
  const bool top_k_on = cfg.top_k > 0;
  const bool top_p_on = cfg.top_p < 1.0;
  const bool min_p_on = cfg.min_e > 0.0f;
  for (int64_t unit = blockIdx.x; unit < a.units(); unit += gridDim.x) {
    const UnitId u = decode_unit(a, unit);
    if (!unit_needed(a, u)) continue;  // block-uniform
    if (kSecondPass && !(a.states[unit].pending & kPendingTotal)) continue;  // block-uniform
    const ChunkStats* stats = a.stats + unit * a.chunks;

    // Combine the chunks: max, status, argmax, N (largest unlisted entry), list overflow.
    float m = -kInf, next = -kInf;
    int bad = 0, overflow = 0;
    for (int64_t c = threadIdx.x; c < a.chunks; c += BLOCK) {
      const ChunkStats st = stats[c];
      m = st.max > m ? st.max : m;
      next = st.next > next ? st.next : next;
      bad |= st.bad;
      overflow |= st.list_count < 0;
    }
    m = block_reduce<BLOCK>(m, OpMax(), sh.scratch);
    next = block_reduce<BLOCK>(next, OpMax(), sh.scratch);
    bad = block_reduce<BLOCK>(bad, OpOr(), sh.scratch);
    overflow = block_reduce<BLOCK>(overflow, OpOr(), sh.scratch);
    int64_t argmax = kNoIndex;
    for (int64_t c = threadIdx.x; c < a.chunks; c += BLOCK)
      if (stats[c].max == m && stats[c].argmax < argmax) argmax = stats[c].argmax;
    argmax = block_reduce<BLOCK>(argmax, OpMin(), sh.scratch);

    PosState state;
    state.inv_norm = 0.0;
    state.argmax = argmax == kNoIndex ? 0 : argmax;
    state.max_logit = m;
    state.keep = -kInf;
    state.status = bad ? static_cast<int32_t>(kNonFiniteLogit)
                       : (m == -kInf ? static_cast<int32_t>(kEmptyDistribution) : static_cast<int32_t>(kOk));
    state.pending = 0;
    if (state.status != kOk) {
      if (threadIdx.x == 0) a.states[unit] = state;
      continue;  // block-uniform
    }

    // min-p: exact threshold from the max (thread 0, broadcast).
    float l_min = -kInf;
    if (min_p_on) {
      if (threadIdx.x == 0) sh.l_min = min_p_logit_threshold(m, cfg.inv_temp, cfg.min_e);
      __syncthreads();  // published
      l_min = sh.l_min;
    }

    // Gather K = listed entries > next, in chunk order and list order. Warp w compacts chunks
    // w, w + warps, ...: pass 1 counts each chunk's entries, a scan turns the counts into
    // offsets, pass 2 writes them (ballot ranks keep the list order).
    constexpr int kWarps = BLOCK / kWarpSize;
    const int lane = threadIdx.x & (kWarpSize - 1);
    const int warp = threadIdx.x / kWarpSize;
    int n_cand = 0;
    const bool gatherable = !overflow && a.chunks <= kMergeMaxChunks;  // block-uniform
    if (gatherable) {
      for (int64_t c = warp; c < a.chunks; c += kWarps) {
        const int count = stats[c].list_count;
        const float* list = a.lists + (unit * a.chunks + c) * kListCap;
        int kept = 0;
        for (int j = lane; j < count; j += kWarpSize) kept += list[j] > next ? 1 : 0;
        kept = warp_reduce(kept, OpSum());
        if (lane == 0) sh.chunk_offset[c] = kept;
      }
      __syncthreads();  // every chunk's count is written
      if (warp == 0) {
        int running = 0;
        for (int64_t base = 0; base < a.chunks; base += kWarpSize) {
          const int64_t c = base + lane;
          const int count = c < a.chunks ? sh.chunk_offset[c] : 0;
          const int inclusive = warp_inclusive_scan(count);
          if (c < a.chunks) sh.chunk_offset[c] = running + inclusive - count;
          running += shfl_idx(inclusive, kWarpSize - 1);
        }
        if (lane == 0) sh.n_cand = running;
      }
      __syncthreads();  // offsets and the total are written
      n_cand = sh.n_cand;
      if (n_cand <= kMergeCap) {
        for (int64_t c = warp; c < a.chunks; c += kWarps) {
          const int count = stats[c].list_count;
          const float* list = a.lists + (unit * a.chunks + c) * kListCap;
          int at = sh.chunk_offset[c];
          for (int base = 0; base < count; base += kWarpSize) {  // uniform within the warp
            const int j = base + lane;
            const float x = j < count ? list[j] : -float_inf();
            const bool take = j < count && x > next;
            const unsigned taken = __ballot_sync(kFullMask, take);
            if (take) sh.cand[at + __popc(taken & ((1u << lane) - 1u))] = x;
            at += __popc(taken);
          }
        }
      }
    }
    const bool usable = gatherable && n_cand <= kMergeCap;
    __syncthreads();  // sh.cand complete

    bool fallback = false;
    bool complete = usable && next == -kInf;  // K holds every finite entry
    float keep_k = -kInf;
    if (top_k_on) {
      if (usable && n_cand >= cfg.top_k) {
        const float* cand = sh.cand;
        keep_k = radix_kth_largest<BLOCK>([cand](int64_t i) { return cand[i]; }, n_cand, cfg.top_k, sh.radix);
        complete = true;  // keep_k is in K, so every kept entry (>= keep_k > next) is in K
      } else if (usable && next == -kInf) {
        keep_k = -kInf;  // fewer than k finite entries: the k-th largest is -inf
      } else {
        fallback = true;
      }
    }

    float keep_p = -kInf;
    bool pending_total = false;
    int n_kept = n_cand;  // entries of sh.cand[0..n_kept) that can be kept
    if (!fallback && top_p_on) {
      if (!usable) {
        fallback = true;
      } else {
        // Compact K' = {x in K : x >= keep_k}, in order, then sort it in descending order.
        int flags = 0;
        float mine[kMergeCap / BLOCK];
#pragma unroll
        for (int r = 0; r < kMergeCap / BLOCK; ++r) {
          const int j = r * BLOCK + threadIdx.x;
          if (j < n_cand && sh.cand[j] >= keep_k) mine[flags++] = sh.cand[j];
        }
        int total = 0;
        const int offset = block_exclusive_scan<BLOCK>(flags, sh.scratch, &total);  // barrier: reads done
        for (int r = 0; r < flags; ++r) sh.cand[offset + r] = mine[r];
        n_kept = total;
        __syncthreads();  // compacted
        sort_descending<BLOCK>(sh.cand, n_kept);

        // Exclusive prefix masses in descending order: thread t owns [t * per, (t + 1) * per).
        const int per = (n_kept + BLOCK - 1) / BLOCK;
        const int lo = threadIdx.x * per;
        const int hi = lo + per < n_kept ? lo + per : n_kept;
        double seg = 0.0;
        for (int j = lo; j < hi; ++j) seg += static_cast<double>(scaled_exp(sh.cand[j], m, cfg.inv_temp));
        double k_mass = 0.0;
        const double before = block_exclusive_scan<BLOCK>(seg, sh.scratch, &k_mass);
        // The kept mass: exact from K when K holds every kept entry; else (top-p alone) exact
        // from the masked sum in the second pass, or, in the first pass, approximated from the
        // chunk stats within a relative kApproxMassTolerance: the threshold is exact whenever
        // every limit in that band gives the same group; otherwise the unit waits for the
        // exact mass (kPendingTotal).
        double total_lo, total_hi;
        if (complete) {
          total_lo = total_hi = k_mass;
        } else if (kSecondPass) {
          double exact = 0.0;
          for (int64_t c = 0; c < a.chunks; ++c) exact += a.masked_sums[unit * a.chunks + c];
          total_lo = total_hi = exact;
        } else {
          if (threadIdx.x == 0) sh.approx_mass = approx_row_mass(a, unit, m);
          __syncthreads();  // published
          total_lo = sh.approx_mass * (1.0 - kApproxMassTolerance);
          total_hi = sh.approx_mass * (1.0 + kApproxMassTolerance);
        }
        const double limit_lo = cfg.top_p * total_lo;
        const double limit_hi = cfg.top_p * total_hi;
        int last_lo = -1, last_hi = -1;  // the last entry whose mass above is < the limit
        double run = before;
        for (int j = lo; j < hi; ++j) {
          if (run < limit_lo) last_lo = j;
          if (run < limit_hi) last_hi = j;
          run += static_cast<double>(scaled_exp(sh.cand[j], m, cfg.inv_temp));
        }
        last_lo = block_reduce<BLOCK>(last_lo, OpMax(), sh.scratch);
        last_hi = block_reduce<BLOCK>(last_hi, OpMax(), sh.scratch);
        if (!complete && !(k_mass >= limit_hi)) {
          // Some limit in the band walks past the listed entries.
          if (kSecondPass || !(k_mass >= limit_lo)) fallback = true;
          else pending_total = true;
        } else if (sh.cand[last_lo < 0 ? 0 : last_lo] != sh.cand[last_hi < 0 ? 0 : last_hi]) {
          pending_total = true;  // a group boundary lies in the band (never when the mass is exact)
        } else {
          keep_p = sh.cand[last_hi < 0 ? 0 : last_hi];
        }
      }
    }

    float keep = keep_k > keep_p ? keep_k : keep_p;
    keep = keep > l_min ? keep : l_min;
    if (pending_total) {
      state.keep = l_min;
      state.pending = kPendingTotal;  // masked_sum_kernel<kTotal>, then the second merge pass
    } else if (fallback) {
      state.keep = l_min;  // the fallback combines it with the thresholds it computes
      state.pending = kPendingThresholds | kPendingNorm;
    } else if (usable && (complete || keep > next)) {
      // Every kept entry is in sh.cand[0..n_kept): the normaliser exactly.
      double mass = 0.0;
      for (int j = threadIdx.x; j < n_kept; j += BLOCK)
        if (sh.cand[j] >= keep) mass += static_cast<double>(scaled_exp(sh.cand[j], m, cfg.inv_temp));
      mass = block_reduce<BLOCK>(mass, OpSum(), sh.scratch);
      state.keep = keep;
      state.inv_norm = 1.0 / mass;  // >= 1: the max is kept with e = 1
    } else {
      state.keep = keep;
      state.pending = kPendingNorm;
    }
    if (threadIdx.x == 0) a.states[unit] = state;
    __syncthreads();  // sh is reused by the next unit
  }
}

// ------------------------------------------------------------------------------ fallback
template <int BLOCK, typename T>
__global__ void __launch_bounds__(BLOCK) filter_fallback_kernel(const Args<T> a) {
  __shared__ RadixShared radix;
  const LogitConfig& cfg = a.logit;
  for (int64_t unit = blockIdx.x; unit < a.units(); unit += gridDim.x) {
    const UnitId u = decode_unit(a, unit);
    if (!unit_needed(a, u)) continue;  // block-uniform
    const PosState s = a.states[unit];
    if (s.status != kOk || !(s.pending & kPendingThresholds)) continue;  // block-uniform
    const T* row = unit_row(a, u);
    float keep_k = -float_inf();
    if (cfg.top_k > 0)
      keep_k = radix_kth_largest<BLOCK>([row](int64_t x) { return to_float(row[x]); }, a.V, cfg.top_k, radix);
    float keep_p = -float_inf();
    if (cfg.top_p < 1.0)
      keep_p = top_p_threshold_exact<BLOCK>(row, a.V, s.max_logit, cfg.inv_temp, keep_k, cfg.top_p, radix);
    float keep = keep_k > keep_p ? keep_k : keep_p;
    keep = keep > s.keep ? keep : s.keep;  // s.keep holds the min-p threshold
    if (threadIdx.x == 0) {
      PosState out = s;
      out.keep = keep;
      out.pending = kPendingNorm;
      a.states[unit] = out;
    }
    __syncthreads();  // radix scratch reused by the next unit
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
