// What every CUDA rule's row function sees (the device counterpart of kernels/row.h): one
// batch row, handled by one CUDA block. RowCtx hands out the row's distributions, remembers
// which rows were read and their status (a logit row with NaN/+inf or no finite entry), and
// samples. Every method is collective unless noted. Torch-free.
#pragma once

#include <cstdint>

#include "kernels/common.h"
#include "kernels/cuda/distributions.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

struct RowOutcome {
  int64_t tau;     // accepted drafts
  int64_t y;       // the emitted token (-1: no distribution to sample from)
  int32_t status;  // RowStatus of the rule itself
};

__device__ __forceinline__ RowOutcome emit_token(int64_t tau, int64_t y) {
  return RowOutcome{tau, y, y < 0 ? static_cast<int32_t>(kEmptyDistribution) : static_cast<int32_t>(kOk)};
}

// accept_token (row.h): u < p / q, half-open, so p = 0 is never accepted; q = 0 means
// "accept iff p > 0".
__device__ __forceinline__ bool accept_token_dev(double u, double p, double q) {
  if (q > 0.0) return u < p / q;
  return p > 0.0;
}

template <int BLOCK, class Src>
struct RowCtx {
  using T = typename Src::Elem;
  using State = typename Src::State;

  const Src& src;
  const T* target;         // this row's [gamma+1, V]
  const T* draft;          // this row's [gamma, V], or null
  const int64_t* tokens;   // shared [gamma]: x_1..x_gamma (the first n checked to lie in [0, V))
  const double* u;         // shared [gamma+1]: coins, u[gamma] is the emitted token's
  double* w;               // shared [gamma+1]: block verification weights
  State* target_states;    // shared [gamma]
  State* draft_states;     // shared [gamma]
  int64_t n, gamma, V;
  RuleParams params;
  BlockShared& sh;
  // The lowest-index bad row read so far, for targets and drafts (the CPU's reporting order).
  int64_t bad_target_index = kNoIndex;
  int32_t bad_target_status = kOk;
  int64_t bad_draft_index = kNoIndex;
  int32_t bad_draft_status = kOk;

  __device__ const T* target_row(int64_t i) const { return target + i * V; }
  __device__ const T* draft_row(int64_t i) const { return draft + i * V; }
  __device__ double emit_uniform() const { return u[gamma]; }

  __device__ void note_target(int64_t i, int32_t status) {
    if (status != kOk && i < bad_target_index) {
      bad_target_index = i;
      bad_target_status = status;
    }
  }
  __device__ void note_draft(int64_t i, int32_t status) {
    if (status != kOk && i < bad_draft_index) {
      bad_draft_index = i;
      bad_draft_status = status;
    }
  }
  __device__ State prepare_target(int64_t i) {
    const State s = src.template prepare<BLOCK>(target_row(i), V, sh);
    note_target(i, s.status);
    return s;
  }
  __device__ State prepare_draft(int64_t i) {
    const State s = src.template prepare<BLOCK>(draft_row(i), V, sh);
    note_draft(i, s.status);
    return s;
  }
  __device__ int64_t target_argmax(int64_t i) {
    const ArgMaxResult r = src.template argmax<BLOCK>(target_row(i), V, sh);
    note_target(i, r.status);
    return r.index;
  }
  // y ~ p_{i+1} (target row i, prepared into s), inverse CDF with the emitted token's coin.
  __device__ int64_t sample_target(const State& s, int64_t i) {
    const SampleWeight<Src> weight{&src, s, target_row(i), s, nullptr, 1.0};
    return block_sample_inverse_cdf<BLOCK>(weight, V, emit_uniform(), sh);
  }
  // y ~ norm((scale * p_{i+1} - q_{i+1})_+), falling back to p_{i+1} when that has no mass.
  __device__ int64_t sample_residual(const State& sp, const State& sq, int64_t i, double scale) {
    const SampleWeight<Src> weight{&src, sp, target_row(i), sq, draft_row(i), scale};
    const int64_t y = block_sample_inverse_cdf<BLOCK>(weight, V, emit_uniform(), sh);
    return y >= 0 ? y : sample_target(sp, i);
  }
  // The row's final status, in verify_cpu.cpp's order: the first bad target row read, else the
  // first bad draft row read (flagged kStatusInDraft), else the rule's own status.
  __device__ int32_t final_status(int32_t rule_status) const {
    if (bad_target_status != kOk) return bad_target_status;
    if (bad_draft_status != kOk) return bad_draft_status | kStatusInDraft;
    return rule_status;
  }
};

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
