// The row kernel behind every launcher in verify.cuh: one CUDA block per batch row. Included
// by launch.cuh. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/block.cuh"
#include "kernels/cuda/greedy.cuh"
#include "kernels/philox.h"
#include "kernels/cuda/token.cuh"
#include "kernels/cuda/top_beta.cuh"
#include "kernels/cuda/typical.cuh"
#include "kernels/cuda/verify.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Coins from a [B, gamma+1] float64 array.
struct UniformsInMemory {
  const double* uniforms;
  template <int BLOCK>
  __device__ void fill(int64_t b, int64_t gamma, double* out) const {
    for (int64_t i = threadIdx.x; i <= gamma; i += BLOCK) out[i] = uniforms[b * (gamma + 1) + i];
  }
};

// Coins from Philox4x32-10 keyed by (seed, offset) read from device memory.
struct UniformsPhilox {
  PhiloxSeedOffset rng;
  template <int BLOCK>
  __device__ void fill(int64_t b, int64_t gamma, double* out) const {
    const uint64_t seed = static_cast<uint64_t>(*rng.seed);
    const uint64_t offset = static_cast<uint64_t>(*rng.offset);
    for (int64_t i = threadIdx.x; i <= gamma; i += BLOCK)
      out[i] = philox_uniform(seed, offset, static_cast<uint64_t>(b), static_cast<uint64_t>(i));
  }
};

template <typename T>
struct RowsArgs {
  const T* target;
  const T* draft;
  VerifyRowsIO io;
  Rule rule;
  RuleParams params;
};

__host__ __device__ constexpr size_t align16(size_t bytes) { return (bytes + 15) / 16 * 16; }

// Dynamic shared memory: tokens [gamma] int64, coins [gamma+1], w [gamma+1], target and draft
// states [gamma] each.
template <class State>
__host__ __device__ constexpr size_t dynamic_smem_bytes(int64_t gamma) {
  return align16(sizeof(int64_t) * gamma) + 2 * align16(sizeof(double) * (gamma + 1)) +
         2 * align16(sizeof(State) * gamma);
}

template <int BLOCK, class Src, class Uniforms>
__global__ void __launch_bounds__(BLOCK) verify_rows_kernel(RowsArgs<typename Src::Elem> a, Src src, Uniforms coins) {
  using State = typename Src::State;
  __shared__ BlockShared sh;
  SPECDECODE_DYNAMIC_SHARED(dynamic_smem);
  const int64_t gamma = a.io.gamma;
  const int64_t V = a.io.vocab_size;
  unsigned char* cursor = dynamic_smem;
  int64_t* tokens = reinterpret_cast<int64_t*>(cursor);
  cursor += align16(sizeof(int64_t) * gamma);
  double* u = reinterpret_cast<double*>(cursor);
  cursor += align16(sizeof(double) * (gamma + 1));
  double* w = reinterpret_cast<double*>(cursor);
  cursor += align16(sizeof(double) * (gamma + 1));
  State* target_states = reinterpret_cast<State*>(cursor);
  cursor += align16(sizeof(State) * gamma);
  State* draft_states = reinterpret_cast<State*>(cursor);

  const int64_t b = blockIdx.x;
  const int64_t* row_tokens = a.io.draft_tokens + b * gamma;
  const int64_t n = a.io.num_draft_tokens[b];
  for (int64_t i = threadIdx.x; i < gamma; i += BLOCK) tokens[i] = row_tokens[i];
  coins.template fill<BLOCK>(b, gamma, u);
  int bad_token = 0;
  const bool n_ok = n >= 0 && n <= gamma;
  if (n_ok)
    for (int64_t i = threadIdx.x; i < n; i += BLOCK) bad_token |= (row_tokens[i] < 0) | (row_tokens[i] >= V);
  bad_token = block_reduce<BLOCK>(bad_token, OpOr(), sh.reduce);  // also publishes tokens and u
  int32_t status = !n_ok ? static_cast<int32_t>(kNumDraftTokensOutOfRange)
                         : (bad_token ? static_cast<int32_t>(kDraftTokenOutOfRange) : static_cast<int32_t>(kOk));

  RowOutcome out{0, -1, kOk};
  if (status == kOk) {
    const typename Src::Elem* target = a.target + b * (gamma + 1) * V;
    const typename Src::Elem* draft = a.draft != nullptr ? a.draft + b * gamma * V : nullptr;
    RowCtx<BLOCK, Src> ctx{src, target, draft, tokens, u, w, target_states, draft_states, n, gamma, V, a.params, sh};
    switch (a.rule) {
      case Rule::kToken: out = token_verify_row_cuda(ctx); break;
      case Rule::kBlock: out = block_verify_row_cuda(ctx); break;
      case Rule::kGreedy: out = greedy_verify_row_cuda(ctx); break;
      case Rule::kTypical: out = typical_verify_row_cuda(ctx); break;
      case Rule::kTopBeta: out = top_beta_verify_row_cuda(ctx); break;
    }
    status = ctx.final_status(out.status);
  }

  const bool ok = status == kOk;
  int64_t* out_tokens = a.io.out_tokens + b * (gamma + 1);
  for (int64_t j = threadIdx.x; j <= gamma; j += BLOCK)
    out_tokens[j] = !ok ? -1 : (j < out.tau ? tokens[j] : (j == out.tau ? out.y : -1));
  if (threadIdx.x == 0) {
    a.io.out_accepted_len[b] = ok ? out.tau : -1;
    a.io.out_status[b] = status;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
