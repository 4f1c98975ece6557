// What the decision kernels see of one batch row (the device counterpart of kernels/row.h):
// its drafts, coins, the states of its positions, exact p_i(x_i) / q_i(x_i), and the helpers
// that turn "which rows did the CPU kernel read" into the row's status. One block of BLOCK
// threads per batch row; methods marked collective are called by every thread. Torch-free.
#pragma once

#include "kernels/cuda/pipeline.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// accept_token (row.h): u < p / q, half-open, so p = 0 is never accepted; q = 0 means
// "accept iff p > 0".
__device__ __forceinline__ bool accept_token_dev(double u, double p, double q) {
  if (q > 0.0) return u < p / q;
  return p > 0.0;
}

template <int BLOCK, typename T>
struct RowCtx {
  const Args<T>& a;
  int64_t b;
  int64_t n;               // number of drafts, 0 <= n <= gamma (validated)
  const int64_t* x;        // draft_tokens[b] (null for sampling), x[i] in [0, V) for i < n
  ReduceScratch& scratch;

  __device__ int64_t target_unit(int64_t i) const { return a.target_unit(b, i); }
  __device__ int64_t draft_unit(int64_t i) const { return a.draft_unit(b, i); }
  __device__ const T* target_row(int64_t i) const { return a.target + (b * (a.G + 1) + i) * a.V; }
  __device__ const T* draft_row(int64_t i) const { return a.draft + (b * a.G + i) * a.V; }
  __device__ double coin(int64_t column) const { return row_coin(a, b, column); }

  // Status of target / draft position i (always kOk for probabilities).
  __device__ int32_t target_status(int64_t i) const { return a.is_logits ? a.states[target_unit(i)].status : kOk; }
  __device__ int32_t draft_status(int64_t i) const { return a.is_logits ? a.states[draft_unit(i)].status : kOk; }

  // Exact p of token `tok` at target position i / q at draft position i (ProbRow::prob,
  // LogitRow::prob: 0 when the row is bad).
  __device__ double target_prob(int64_t i, int64_t tok) const {
    if (!a.is_logits) return to_double(target_row(i)[tok]);
    return logit_prob(a.states[target_unit(i)], a.logit.inv_temp, to_float(target_row(i)[tok]));
  }
  __device__ double draft_prob(int64_t i, int64_t tok) const {
    if (!a.is_logits) return to_double(draft_row(i)[tok]);
    return logit_prob(a.states[draft_unit(i)], a.logit.inv_temp, to_float(draft_row(i)[tok]));
  }

  // Collective. The lowest i in [0, last] whose target (or draft) position is bad, kNoIndex if
  // none (last < 0: none).
  __device__ int64_t first_bad(bool draft, int64_t last) const {
    int64_t found = kNoIndex;
    if (a.is_logits)
      for (int64_t i = threadIdx.x; i <= last; i += BLOCK)
        if ((draft ? draft_status(i) : target_status(i)) != kOk && i < found) found = i;
    return block_reduce<BLOCK>(found, OpMin(), scratch);
  }

  // Collective. The row's status once the CPU kernel would have read target positions
  // [0, last_target] and draft positions [0, last_draft]: the first bad target position, else
  // the first bad draft position (flagged kStatusInDraft), else kOk (verify_cpu.cpp's order).
  __device__ int32_t read_status(int64_t last_target, int64_t last_draft) const {
    if (!a.is_logits) return kOk;
    const int64_t t = first_bad(false, last_target);
    const int64_t d = first_bad(true, last_draft);
    if (t != kNoIndex) return target_status(t);
    if (d != kNoIndex) return draft_status(d) | kStatusInDraft;
    return kOk;
  }
};

__device__ __forceinline__ RowPlan make_plan(int32_t status, int64_t tau, int64_t y, int32_t emit, int64_t pos,
                                             double weight) {
  RowPlan p;
  p.weight = weight;
  p.tau = tau;
  p.y = y;
  p.pos = pos;
  p.status = status;
  p.emit = status == kOk ? emit : static_cast<int32_t>(kEmitNone);
  return p;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
