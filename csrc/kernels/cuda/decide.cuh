// The per-row decision kernels: one block of kRowThreads threads per batch row.
//
//   decide1_kernel: validates the row exactly as verify_cpu.cpp does (num_draft_tokens[b] in
//     [0, gamma] first, then every used draft token in [0, V)), finishes the state of each of
//     its positions (logits), and runs the rule's first step: token verification, greedy on
//     logits and sampling decide everything here; block verification computes its weights
//     and flags the positions whose Z_i the position pass needs.
//   decide2_kernel: after the position pass, the remaining decisions (block, typical,
//     top-beta, greedy on probabilities).
// Each writes the row's RowPlan; the last kernel of a call also writes the outputs.
// Torch-free.
#pragma once

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/greedy.cuh"
#include "kernels/cuda/row.cuh"
#include "kernels/cuda/token.cuh"
#include "kernels/cuda/top_beta.cuh"
#include "kernels/cuda/typical.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// The state of one unit from its chunk stats (no filters): global max, status, argmax, and the
// normaliser sum_c sum_c * exp((max_c - max) / T) (chunks in order).
template <typename T>
__device__ PosState combine_chunk_stats(const Args<T>& a, int64_t unit) {
  const ChunkStats* stats = a.stats + unit * a.chunks;
  const float kInf = float_inf();
  float m = -kInf;
  int bad = 0;
  for (int64_t c = 0; c < a.chunks; ++c) {
    m = stats[c].max > m ? stats[c].max : m;
    bad |= stats[c].bad;
  }
  PosState s;
  s.argmax = 0;
  for (int64_t c = 0; c < a.chunks; ++c) {
    if (stats[c].max == m) {  // the first chunk holding the max has the lowest argmax
      if (stats[c].argmax != kNoIndex) s.argmax = stats[c].argmax;
      break;
    }
  }
  s.max_logit = m;
  s.keep = -kInf;
  s.status = bad ? static_cast<int32_t>(kNonFiniteLogit)
                 : (m == -kInf ? static_cast<int32_t>(kEmptyDistribution) : static_cast<int32_t>(kOk));
  s.pending = 0;
  s.inv_norm = 0.0;
  if (s.status == kOk && a.stats_mode != StatsMode::kArgmax)
    s.inv_norm = 1.0 / approx_row_mass(a, unit, m);  // >= 1: the max entry contributes exp(0) = 1
  return s;
}

// Collective: the final state of every position row b reads (targets 0..n, drafts 0..n-1),
// written to a.states. Ends with a barrier, after which the block may read them.
// The final state of one unit once the stats (and filter) kernels ran: the filter kernels'
// state with its normaliser summed from the masked sums, or the combined chunk stats. Per
// thread; also used by the tree and processed_probs kernels.
template <typename T>
__device__ PosState finish_state(const Args<T>& a, int64_t unit) {
  if (!a.merged) return combine_chunk_stats(a, unit);
  PosState s = a.states[unit];
  if (s.status == kOk && (s.pending & kPendingNorm)) {
    double total = 0.0;
    for (int64_t c = 0; c < a.chunks; ++c) total += a.masked_sums[unit * a.chunks + c];
    s.inv_norm = 1.0 / total;  // >= 1: the max is kept
    s.pending = 0;
  }
  return s;
}

template <int BLOCK, typename T>
__device__ void finish_states(const Args<T>& a, int64_t b, int64_t n) {
  const int64_t count = (n + 1) + (a.has_draft ? n : 0);
  for (int64_t k = threadIdx.x; k < count; k += BLOCK) {
    const int64_t unit = k <= n ? a.target_unit(b, k) : a.draft_unit(b, k - n - 1);
    a.states[unit] = finish_state(a, unit);
  }
  __syncthreads();  // the states are written (global memory, visible to the block after it)
}

// Collective. sample_logits: status of the one row, then argmax (greedy) or y ~ p.
template <int BLOCK, typename T>
__device__ RowPlan sample_decide(const RowCtx<BLOCK, T>& c) {
  const PosState s = c.a.states[c.target_unit(0)];
  if (c.a.greedy) return make_plan(s.status, 0, s.argmax, kEmitNone, 0, 0.0);
  return make_plan(s.status, 0, -1, kEmitTarget, 0, 0.0);
}

template <int BLOCK, typename T, bool kFinal>
__global__ void __launch_bounds__(BLOCK) decide1_kernel(const Args<T> a) {
  __shared__ ReduceScratch scratch;
  for (int64_t b = blockIdx.x; b < a.B; b += gridDim.x) {
    const int64_t n = row_num_draft(a, b);
    const int64_t* x = a.draft_tokens != nullptr ? a.draft_tokens + b * a.G : nullptr;
    int32_t status = n < 0 ? static_cast<int32_t>(kNumDraftTokensOutOfRange) : static_cast<int32_t>(kOk);
    if (n > 0) {  // block-uniform
      int bad = 0;
      for (int64_t i = threadIdx.x; i < n; i += BLOCK) bad |= (x[i] < 0) | (x[i] >= a.V);
      bad = block_reduce<BLOCK>(bad, OpOr(), scratch);
      if (bad) status = kDraftTokenOutOfRange;
    }
    RowPlan plan = make_plan(status, 0, -1, kEmitNone, 0, 0.0);
    if (status == kOk) {  // block-uniform
      if (a.is_logits) finish_states<BLOCK>(a, b, n);
      const RowCtx<BLOCK, T> ctx{a, b, n, x, scratch};
      if (a.task == Task::kSampleLogits) {
        plan = sample_decide(ctx);
      } else {
        switch (a.rule) {
          case Rule::kToken: plan = token_decide(ctx); break;
          case Rule::kBlock: plan = block_prepare(ctx); break;
          case Rule::kGreedy:
            if (a.is_logits) plan = greedy_decide(ctx);  // probabilities: after the argmax pass
            break;
          case Rule::kTypical:
          case Rule::kTopBeta: break;  // after the position pass
        }
      }
    }
    if (threadIdx.x == 0) a.plans[b] = plan;
    if (kFinal) write_row_outputs<BLOCK>(a, b, plan, plan.y);
  }
}

template <int BLOCK, typename T, bool kFinal>
__global__ void __launch_bounds__(BLOCK) decide2_kernel(const Args<T> a) {
  __shared__ ReduceScratch scratch;
  __shared__ int64_t shared_tau;
  for (int64_t b = blockIdx.x; b < a.B; b += gridDim.x) {
    RowPlan plan = a.plans[b];
    if (plan.status == kOk) {  // block-uniform
      const int64_t n = row_num_draft(a, b);
      const RowCtx<BLOCK, T> ctx{a, b, n, a.draft_tokens + b * a.G, scratch};
      switch (a.rule) {
        case Rule::kBlock: plan = block_decide(ctx, &shared_tau); break;
        case Rule::kGreedy: plan = greedy_decide(ctx); break;
        case Rule::kTypical: plan = typical_decide(ctx); break;
        case Rule::kTopBeta: plan = top_beta_decide(ctx); break;
        case Rule::kToken: break;  // never launched for token verification
      }
      if (threadIdx.x == 0) a.plans[b] = plan;  // every thread read the old plan before the rule's barriers
    }
    if (kFinal) write_row_outputs<BLOCK>(a, b, plan, plan.y);
    __syncthreads();  // shared_tau / scratch reuse by the next row
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
