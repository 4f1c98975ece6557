// Block verification on the GPU (Sun et al., "Block Verification Accelerates Speculative
// Decoding"). Lossless and optimal. Same rule and numerics as kernels/block.h:
//   w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
//   h_i = Z_i / (Z_i + 1 - w_i), Z_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+  (h_i = 1 if the
//         denominator is 0), for i < n;  h_n = w_n
//   tau = max{i : u_i < h_i} (0 if none), searched from the top down
//   y ~ p_{n+1} if tau = n, else y ~ norm((w_tau p_{tau+1} - q_{tau+1})_+) (zero mass: p_{tau+1})
// The residual (w_i p - q)_+ is rounded exactly as the CPU's residual() (no FMA).
#pragma once

#include "kernels/cuda/row.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

__device__ __forceinline__ double block_weight_dev(double w_prev, double p, double q) {
  if (w_prev == 0.0 || p == 0.0) return 0.0;
  if (!(q > 0.0)) return 1.0;
  const double v = w_prev * (p / q);
  return v < 1.0 ? v : 1.0;  // std::min(1.0, v)
}

template <int BLOCK, class Src>
__device__ RowOutcome block_verify_row_cuda(RowCtx<BLOCK, Src>& c) {
  using T = typename Src::Elem;
  using State = typename Src::State;
  const Src& src = c.src;
  const int64_t n = c.n;
  // Every w_i reads p_i(x_i) and q_i(x_i), so every target/draft row below n is prepared once;
  // their states are kept for the Z_i passes and the residual.
  double w_prev = 1.0;
  if (threadIdx.x == 0) c.w[0] = 1.0;
  for (int64_t i = 1; i <= n; ++i) {
    const int64_t x = c.tokens[i - 1];
    const State st = c.prepare_target(i - 1);
    const State sd = c.prepare_draft(i - 1);
    w_prev = block_weight_dev(w_prev, src.prob(st, c.target_row(i - 1), x), src.prob(sd, c.draft_row(i - 1), x));
    if (threadIdx.x == 0) {
      c.w[i] = w_prev;
      c.target_states[i - 1] = st;
      c.draft_states[i - 1] = sd;
    }
  }
  __syncthreads();

  int64_t tau = 0;
  for (int64_t i = n; i >= 1; --i) {
    const double wi = c.w[i];
    double h;
    if (i == n || wi == 0.0 || wi == 1.0) {
      h = wi;  // h_n = w_n; w = 0 gives Z = 0, h = 0; w = 1 gives h = Z / Z = 1
    } else {
      const State st = c.target_states[i];  // p_{i+1}
      const State sd = c.draft_states[i];   // q_{i+1}
      double z = 0.0;
      row_pair_for_each<BLOCK>(c.target_row(i), c.draft_row(i), c.V, [&](int64_t, T p_raw, T q_raw) {
        z += src.residual_value(st, p_raw, sd, q_raw, wi);
      });
      z = block_reduce<BLOCK>(z, OpSum(), c.sh.reduce);
      const double denom = z + (1.0 - wi);
      h = denom > 0.0 ? z / denom : 1.0;
    }
    if (c.u[i - 1] < h) {
      tau = i;
      break;
    }
  }
  if (tau == n) {
    const State sp = c.prepare_target(n);
    return emit_token(n, c.sample_target(sp, n));
  }
  return emit_token(tau, c.sample_residual(c.target_states[tau], c.draft_states[tau], tau, c.w[tau]));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
