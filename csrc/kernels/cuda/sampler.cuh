// The emitted token: inverse-CDF sampling with one coin from the distribution the row's plan
// names, y ~ p at `pos` or y ~ norm((w p - q)_+) at `pos` (falling back to p at `pos` when
// the residual has no positive entry), in two levels:
//
//   sample1_kernel  one block per (row, sampling chunk of kSampleChunk entries): the chunk's
//     mass under both distributions, and the last entry with an exactly positive weight.
//     Probabilities: exact float64 (ProbRow's values, residuals rounded as the CPU's). Logits:
//     the masses use the fast exp (absolute error below ~1e-6 in probability units); whether a
//     weight is positive is decided exactly (the fast and exact exp are zero for the same
//     entries; a residual whose fast value is within 1e-4 relative of 0 is recomputed exactly).
//   sample2_kernel  one block per row: the total, u * total, the first chunk whose running sum
//     exceeds it (chunks in order), then inside that chunk the exact weights (LogitRow::fill /
//     residual rounding) in index order: thread t owns 8 consecutive entries, a block scan
//     gives each thread its start, and the first entry with a positive weight whose cumulative
//     sum exceeds u * total is y (kernels::sample_from_weights' rule). Rounding at a chunk
//     boundary: the chunk's last positive entry; u * total at the very top: the last positive
//     entry of the row. A weight that is exactly 0 is never returned.
// sample2 is the last kernel of a call: it writes every row's outputs. Torch-free.
#pragma once

#include "kernels/cuda/pipeline.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Fast-exp residual value of one logit pair, and whether its exact value is positive.
struct ResidualProbe {
  float approx;   // max(w p - q, 0) with the fast exp, float
  bool positive;  // the exact residual (logit_residual) is > 0
};

// ep / eq: the fast-exp weights (FastWeight) of lp / lq.
__device__ __forceinline__ ResidualProbe probe_logit_residual(const PosState& sp, const PosState& sq, float inv_temp,
                                                              double w, float p_norm, float q_norm, float lp,
                                                              float lq, float ep, float eq) {
  // Exactly zero weights: not kept, or exp underflow (decided with the exact z).
  const bool p_zero = !(lp >= sp.keep) || !(scaled_arg(lp, sp.max_logit, inv_temp) >= -87.0f) || !(w > 0.0);
  const bool q_zero = !(lq >= sq.keep) || !(scaled_arg(lq, sq.max_logit, inv_temp) >= -87.0f);
  ResidualProbe out{0.0f, false};
  if (p_zero) return out;  // r = max(0 - q, 0) = 0 exactly
  const float pa = ep * p_norm;
  const float qa = q_zero ? 0.0f : eq * q_norm;
  const float ra = pa - qa;
  out.approx = ra > 0.0f ? ra : 0.0f;
  const float scale = pa + qa;
  if (scale > 1e-30f && (ra > 1e-4f * scale || ra < -1e-4f * scale)) {
    out.positive = ra > 0.0f;  // the fast values are within ~1e-5 relative of the exact ones
  } else {
    out.positive = logit_residual(sp, sq, inv_temp, w, lp, lq) > 0.0;
  }
  return out;
}

template <int BLOCK, typename T, bool kLogits>
__global__ void __launch_bounds__(BLOCK, kPassMinBlocks) sample1_kernel(const Args<T> a) {
  constexpr int kPer = kSampleChunk / BLOCK;
  __shared__ SampleChunkSums part[BLOCK / kWarpSize];
  const float it = a.logit.inv_temp;
  const int64_t items = a.B * a.sample_chunks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t b = item / a.sample_chunks;
    const int64_t c = item % a.sample_chunks;
    const RowPlan plan = a.plans[b];
    if (plan.status != kOk || plan.emit == kEmitNone) continue;  // block-uniform
    const bool residual = plan.emit == kEmitResidual;
    const int64_t start = c * kSampleChunk;
    const int len = static_cast<int>(a.V - start < kSampleChunk ? a.V - start : kSampleChunk);
    const T* target = a.target + (b * (a.G + 1) + plan.pos) * a.V + start;
    const T* draft = residual ? a.draft + (b * a.G + plan.pos) * a.V + start : nullptr;
    double sum_r = 0.0, sum_p = 0.0;
    int64_t last_r = -1, last_p = -1;
    StridedChunk<BLOCK, kPer, T> cp, cq;
    cp.load(target, len);
    if (residual) cq.load(draft, len);
    if (kLogits) {
      const PosState sp = a.states[a.target_unit(b, plan.pos)];
      const PosState sq = residual ? a.states[a.draft_unit(b, plan.pos)] : sp;
      const float p_norm_target = static_cast<float>(sp.inv_norm);
      const float p_norm = static_cast<float>(plan.weight * sp.inv_norm);
      const float q_norm = static_cast<float>(sq.inv_norm);
      const FastWeight p_weight(sp.max_logit, it), q_weight(sq.max_logit, it);
      float thread_r = 0.0f, thread_p = 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (cp.index(k) >= len) continue;
        const float lp = cp.logit(k);
        const float ep = p_weight(lp);
        // p > 0 exactly when kept and the exact exp does not underflow (z >= -87).
        if (lp >= sp.keep && scaled_arg(lp, sp.max_logit, it) >= -87.0f) {
          thread_p += ep * p_norm_target;
          last_p = start + cp.index(k);  // a thread's slots ascend in index
        }
        if (residual) {
          const float lq = cq.logit(k);
          const ResidualProbe r = probe_logit_residual(sp, sq, it, plan.weight, p_norm, q_norm, lp, lq, ep,
                                                       q_weight(lq));
          thread_r += r.approx;
          if (r.positive) last_r = start + cp.index(k);
        }
      }
      sum_r = static_cast<double>(thread_r);
      sum_p = static_cast<double>(thread_p);
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (cp.index(k) >= len) continue;
        const double p = cp.prob(k);
        sum_p += p;
        if (p > 0.0) last_p = start + cp.index(k);
        if (residual) {
          const double r = prob_residual(plan.weight, p, cq.prob(k));
          sum_r += r;
          if (r > 0.0) last_r = start + cp.index(k);
        }
      }
    }
    // Warp sums, then warp 0's lane 0 combines the warps in order: one barrier per chunk.
    sum_r = warp_reduce(sum_r, OpSum());
    sum_p = warp_reduce(sum_p, OpSum());
    last_r = warp_reduce(last_r, OpMax());
    last_p = warp_reduce(last_p, OpMax());
    if ((threadIdx.x & (kWarpSize - 1)) == 0) part[threadIdx.x / kWarpSize] = SampleChunkSums{sum_r, sum_p, last_r, last_p};
    __syncthreads();  // every warp's part is written
    if (threadIdx.x == 0) {
      SampleChunkSums out = part[0];
      for (int w = 1; w < BLOCK / kWarpSize; ++w) {
        out.residual += part[w].residual;
        out.target += part[w].target;
        out.last_residual = part[w].last_residual > out.last_residual ? part[w].last_residual : out.last_residual;
        out.last_target = part[w].last_target > out.last_target ? part[w].last_target : out.last_target;
      }
      a.sample[b * a.sample_chunks + c] = out;
    }
    __syncthreads();  // `part` is rewritten by the next item
  }
}

struct SampleShared {
  ReduceScratch scratch;
  int64_t chunk;       // the chunk holding the crossing, -1 if none
  int64_t last;        // last positive entry of the chosen distribution, -1 if none
  double carry;        // mass of the chunks before it
  double threshold;    // u * total
  int32_t use_residual;
  int32_t has_mass;
};

template <int BLOCK, typename T, bool kLogits>
__global__ void __launch_bounds__(BLOCK) sample2_kernel(const Args<T> a) {
  constexpr int kPer = kSampleChunk / BLOCK;
  __shared__ SampleShared sh;
  const float it = a.logit.inv_temp;
  for (int64_t b = blockIdx.x; b < a.B; b += gridDim.x) {
    const RowPlan plan = a.plans[b];
    if (plan.status != kOk || plan.emit == kEmitNone) {  // block-uniform
      write_row_outputs<BLOCK>(a, b, plan, plan.y);
      continue;
    }
    const bool residual = plan.emit == kEmitResidual;
    const SampleChunkSums* sums = a.sample + b * a.sample_chunks;
    if (threadIdx.x < kWarpSize) {  // warp 0: level 1, lanes over chunks
      const int lane = threadIdx.x;
      const int64_t C = a.sample_chunks;
      // Residual or p? The CPU samples the residual when its mass is > 0 and finite, i.e. (no
      // NaN can enter a clamped residual) when some entry has a positive residual.
      bool use_r = false;
      if (residual) {
        int64_t last = -1;
        double total = 0.0;
        for (int64_t c = lane; c < C; c += kWarpSize) {
          last = sums[c].last_residual > last ? sums[c].last_residual : last;
          total += sums[c].residual;
        }
        last = warp_reduce(last, OpMax());
        total = warp_reduce(total, OpSum());
        use_r = kLogits ? last >= 0 : (total > 0.0 && is_finite(total));
      }
      double total = 0.0;
      int64_t last = -1;
      for (int64_t c = lane; c < C; c += kWarpSize) {
        total += use_r ? sums[c].residual : sums[c].target;
        const int64_t l = use_r ? sums[c].last_residual : sums[c].last_target;
        last = l > last ? l : last;
      }
      total = warp_reduce(total, OpSum());
      last = warp_reduce(last, OpMax());
      const bool has_mass = kLogits ? last >= 0 : (total > 0.0 && is_finite(total));
      const double threshold = row_coin(a, b, a.G) * total;
      // The first chunk whose running sum exceeds the threshold: 32 chunks at a time, a warp
      // scan inside each group, the running sum carried from group to group.
      int64_t chunk = -1;
      double carry = 0.0;
      double running = 0.0;
      if (has_mass) {
        for (int64_t base = 0; base < C; base += kWarpSize) {
          const int64_t c = base + lane;
          const double s_c = c < C ? (use_r ? sums[c].residual : sums[c].target) : 0.0;
          const double inclusive = warp_inclusive_scan(s_c);
          const unsigned crossed = __ballot_sync(kFullMask, c < C && running + inclusive > threshold);
          if (crossed) {
            const int first_lane = __ffs(crossed) - 1;
            chunk = base + first_lane;
            carry = running + shfl_idx(inclusive - s_c, first_lane);
            break;
          }
          running += shfl_idx(inclusive, kWarpSize - 1);
        }
      }
      if (lane == 0) {
        sh.chunk = chunk;
        sh.last = last;
        sh.carry = carry;
        sh.threshold = threshold;
        sh.use_residual = use_r ? 1 : 0;
        sh.has_mass = has_mass ? 1 : 0;
      }
    }
    __syncthreads();  // level-1 result published
    const int64_t chunk = sh.chunk;
    const int64_t last = sh.last;
    const double carry = sh.carry;
    const double threshold = sh.threshold;
    const bool use_r = sh.use_residual != 0;
    int64_t y = -1;
    if (sh.has_mass && chunk < 0) {
      y = last;  // u * total rounded to the very top
    } else if (sh.has_mass) {  // block-uniform
      const int64_t start = chunk * kSampleChunk;
      const int len = static_cast<int>(a.V - start < kSampleChunk ? a.V - start : kSampleChunk);
      const T* target = a.target + (b * (a.G + 1) + plan.pos) * a.V + start;
      const T* draft = use_r ? a.draft + (b * a.G + plan.pos) * a.V + start : nullptr;
      ContiguousChunk<kPer, T> cp, cq;
      cp.load(target, len);
      if (use_r) cq.load(draft, len);
      double wts[kPer];
      if (kLogits) {
        const PosState sp = a.states[a.target_unit(b, plan.pos)];
        const PosState sq = use_r ? a.states[a.draft_unit(b, plan.pos)] : sp;
#pragma unroll
        for (int k = 0; k < kPer; ++k)
          wts[k] = cp.index(k) >= len ? 0.0
                   : (use_r ? logit_residual(sp, sq, it, plan.weight, cp.logit(k), cq.logit(k))
                            : logit_prob(sp, it, cp.logit(k)));
      } else {
#pragma unroll
        for (int k = 0; k < kPer; ++k)
          wts[k] = cp.index(k) >= len ? 0.0 : (use_r ? prob_residual(plan.weight, cp.prob(k), cq.prob(k)) : cp.prob(k));
      }
      double mine = 0.0;
#pragma unroll
      for (int k = 0; k < kPer; ++k) mine += wts[k];
      double cumulative = carry + block_exclusive_scan<BLOCK>(mine, sh.scratch);
      int64_t hit = kNoIndex;
      int64_t last_positive = -1;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        cumulative += wts[k];
        if (wts[k] > 0.0) {
          const int64_t x = start + cp.index(k);
          last_positive = x;
          if (cumulative > threshold && x < hit) hit = x;
        }
      }
      hit = block_reduce<BLOCK>(hit, OpMin(), sh.scratch);
      last_positive = block_reduce<BLOCK>(last_positive, OpMax(), sh.scratch);
      // No crossing inside the chunk (the chunk sums and this scan round differently): its last
      // positive entry, else the row's.
      y = hit != kNoIndex ? hit : (last_positive >= 0 ? last_positive : last);
    }
    write_row_outputs<BLOCK>(a, b, plan, y);
    __syncthreads();  // `sh` is rewritten for the next row
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
