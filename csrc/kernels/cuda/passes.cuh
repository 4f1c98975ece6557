// The position pass: the per-position sums a rule needs beyond p_i(x_i), one block of
// kPassThreads threads per (batch row, position, chunk of kChunk entries), each chunk read once
// (coalesced, into registers). Only positions the rule still needs do any work:
//   block:     Z_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+ for the flagged positions 1 <= i < n
//              (0 when either row is bad, as LogitRow::residual);
//   typical:   sum_x p log p for i < n, and (probabilities) the argmax for i <= n;
//   top-beta:  the number of entries with p > p(x_i) for i < n (exact), and (probabilities)
//              the argmax and max for i <= n;
//   greedy:    (probabilities) the argmax for i <= n.
// Results go to Args::aggs[b, i, chunk]; decide-2 combines the chunks in order. Torch-free.
#pragma once

#include "kernels/cuda/pipeline.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <typename T>
__device__ __forceinline__ bool position_needed(const Args<T>& a, int64_t b, int64_t i, int64_t n) {
  switch (a.rule) {
    case Rule::kBlock: return i >= 1 && i < n && a.pass_flags[b * (a.G + 1) + i] != 0;
    case Rule::kGreedy: return !a.is_logits && i <= n;
    case Rule::kTypical:
    case Rule::kTopBeta: return a.is_logits ? i < n : i <= n;
    case Rule::kToken: return false;
  }
  return false;
}

template <int BLOCK, typename T, bool kLogits>
__global__ void __launch_bounds__(BLOCK, kLogits ? kPassMinBlocks : 2) position_pass_kernel(const Args<T> a) {
  constexpr int kPer = kChunk / BLOCK;
  __shared__ ReduceScratch scratch;
  const float it = a.logit.inv_temp;
  const int64_t per_row = (a.G + 1) * a.chunks;
  const int64_t items = a.B * per_row;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t b = item / per_row;
    const int64_t i = (item % per_row) / a.chunks;
    const int64_t c = item % a.chunks;
    if (a.plans[b].status != kOk) continue;  // block-uniform
    const int64_t n = row_num_draft(a, b);
    if (!position_needed(a, b, i, n)) continue;  // block-uniform
    const int64_t start = c * kChunk;
    const int len = static_cast<int>(a.V - start < kChunk ? a.V - start : kChunk);
    const T* target = a.target + (b * (a.G + 1) + i) * a.V;
    PosAgg agg;
    agg.sum = 0.0;
    agg.best_value = -double_inf();
    agg.best_index = kNoIndex;
    agg.count = 0;

    if (a.rule == Rule::kBlock) {
      const double w = a.weights[b * (a.G + 1) + i];
      const T* draft = a.draft + (b * a.G + i) * a.V;
      StridedChunk<BLOCK, kPer, T> cp, cq;
      if (kLogits) {
        const PosState sp = a.states[a.target_unit(b, i)];
        const PosState sq = a.states[a.draft_unit(b, i)];
        if (sp.status == kOk && sq.status == kOk) {  // block-uniform (else Z = 0, as the CPU)
          cp.load(target + start, len);
          cq.load(draft + start, len);
          const float p_norm = static_cast<float>(w * sp.inv_norm);
          const float q_norm = static_cast<float>(sq.inv_norm);
          const FastWeight p_weight(sp.max_logit, it), q_weight(sq.max_logit, it);
          float s = 0.0f;
#pragma unroll
          for (int k = 0; k < kPer; ++k) {
            if (cp.index(k) >= len) continue;
            const float lp = cp.logit(k), lq = cq.logit(k);
            const float ep = lp >= sp.keep ? p_weight(lp) : 0.0f;
            const float eq = lq >= sq.keep ? q_weight(lq) : 0.0f;
            const float r = ep * p_norm - eq * q_norm;
            s += r > 0.0f ? r : 0.0f;
          }
          agg.sum = block_reduce<BLOCK>(static_cast<double>(s), OpSum(), scratch);
        }
      } else {
        cp.load(target + start, len);
        cq.load(draft + start, len);
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < kPer; ++k)
          if (cp.index(k) < len) s += prob_residual(w, cp.prob(k), cq.prob(k));
        agg.sum = block_reduce<BLOCK>(s, OpSum(), scratch);
      }
    } else if (kLogits) {
      // typical / top-beta on logits, i < n.
      const PosState st = a.states[a.target_unit(b, i)];
      if (st.status == kOk) {  // block-uniform
        StridedChunk<BLOCK, kPer, T> ch;
        ch.load(target + start, len);
        if (a.rule == Rule::kTypical) {
          const FastWeight weight(st.max_logit, it);
          double s = 0.0;
#pragma unroll
          for (int k = 0; k < kPer; ++k) {
            if (ch.index(k) >= len || !(ch.logit(k) >= st.keep)) continue;
            const double p = static_cast<double>(weight(ch.logit(k))) * st.inv_norm;
            if (p > 0.0) s += p * log(p);
          }
          agg.sum = block_reduce<BLOCK>(s, OpSum(), scratch);
        } else {
          const float lx = to_float(target[a.draft_tokens[b * a.G + i]]);
          const float ex = scaled_exp(lx, st.max_logit, it);
          int64_t count = 0;
          if (lx >= st.keep && ex > 0.0f) {  // otherwise p(x) = 0: rejected without counting
#pragma unroll
            for (int k = 0; k < kPer; ++k) {
              // p(y) > p(x) <=> y kept and e(y) > e(x); e is non-decreasing in the logit, so
              // only entries with a larger logit can qualify.
              const float ly = ch.logit(k);
              if (ch.index(k) < len && ly > lx && ly >= st.keep && scaled_exp(ly, st.max_logit, it) > ex) ++count;
            }
          }
          agg.count = block_reduce<BLOCK>(count, OpSum(), scratch);
        }
      }
    } else {
      // probabilities: greedy / typical / top-beta, i <= n.
      StridedChunk<BLOCK, kPer, T> ch;
      ch.load(target + start, len);
      // argmax: the largest non-NaN value, lowest index (a thread's slots ascend in index).
      // Values equal to -inf never replace the initial one; decide-2 maps "none" to index 0,
      // the CPU's answer for a row without a larger entry.
      ArgMax best{-double_inf(), kNoIndex};
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const double v = ch.prob(k);
        if (ch.index(k) < len && v > best.value) best = ArgMax{v, start + ch.index(k)};
      }
      best = block_reduce<BLOCK>(best, OpArgMax(), scratch);
      agg.best_value = best.value;
      agg.best_index = best.index;
      if (i < n && a.rule == Rule::kTypical) {
        double s = 0.0;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          const double v = ch.prob(k);
          if (ch.index(k) < len && v > 0.0) s += v * log(v);
        }
        agg.sum = block_reduce<BLOCK>(s, OpSum(), scratch);
      }
      if (i < n && a.rule == Rule::kTopBeta) {
        const double px = to_double(target[a.draft_tokens[b * a.G + i]]);
        int64_t count = 0;
#pragma unroll
        for (int k = 0; k < kPer; ++k)
          if (ch.index(k) < len && ch.prob(k) > px) ++count;
        agg.count = block_reduce<BLOCK>(count, OpSum(), scratch);
      }
    }
    if (threadIdx.x == 0) a.aggs[(b * (a.G + 1) + i) * a.chunks + c] = agg;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
