// Block verification on the GPU (Sun et al., "Block Verification Accelerates Speculative
// Decoding"). Lossless and optimal. Same rule and numerics as kernels/block.h:
//   w_0 = 1, w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i))
//   h_i = Z_i / (Z_i + 1 - w_i), Z_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+  (h_i = 1 if the
//         denominator is 0), for i < n;  h_n = w_n
//   tau = max{i : u_i < h_i} (0 if none), searched from the top down
//   y ~ p_{n+1} if tau = n, else y ~ norm((w_tau p_{tau+1} - q_{tau+1})_+) (zero mass: p_{tau+1})
//
// Split over three kernels:
//   decide 1: w_i from p_i(x_i), q_i(x_i) (exact, sequential as on the CPU); the top-down search
//     needs no Z for i = n or w_i in {0, 1}; the highest such success ends the search, and only
//     positions above it need Z_i. Of those, a position whose coin cannot pass is skipped:
//     Z_i <= w_i * sum_x p(x) and sum_x p(x) <= 1 + 2e-4 for processed logits (the CPU's
//     normaliser sums float32 partials of 2048 entries), so h_i <= hb = 1.001 w /
//     (1.001 w + 1 - w), and u_i >= hb rejects on the CPU as well. (Probabilities from the
//     caller are not assumed normalised: every candidate gets its Z_i.)
//   position pass: Z_i of the flagged positions, chunk by chunk;
//   decide 2: the top-down search with those Z_i (chunks summed in order).
// Statuses: the CPU reads target and draft positions 0..n-1 (for the weights) and target n only
// when tau = n.
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

// An upper bound of h_i for processed logits (see above).
__device__ __forceinline__ double block_h_bound(double w) {
  const double wc = w * 1.001;
  return wc / (wc + (1.0 - w));
}

// Collective (decide-1 kernel): weights, and the positions whose Z_i the position pass computes.
template <int BLOCK, typename T>
__device__ RowPlan block_prepare(const RowCtx<BLOCK, T>& c) {
  const Args<T>& a = c.a;
  double* px = a.px + c.b * a.G;
  double* qx = a.qx + c.b * a.G;
  for (int64_t i = threadIdx.x; i < c.n; i += BLOCK) {
    px[i] = c.target_prob(i, c.x[i]);
    qx[i] = c.draft_prob(i, c.x[i]);
  }
  __syncthreads();  // px, qx written (global memory, visible to the block after the barrier)
  if (threadIdx.x == 0) {
    double* w = a.weights + c.b * (a.G + 1);
    int32_t* flags = a.pass_flags + c.b * (a.G + 1);
    w[0] = 1.0;
    for (int64_t i = 1; i <= c.n; ++i) w[i] = block_weight_dev(w[i - 1], px[i - 1], qx[i - 1]);
    int64_t sure = 0;  // the highest i whose decision needs no Z and succeeds
    for (int64_t i = c.n; i >= 1; --i) {
      const double wi = w[i];
      if ((i == c.n || wi == 0.0 || wi == 1.0) && c.coin(i - 1) < wi) {
        sure = i;
        break;
      }
    }
    for (int64_t i = 1; i < c.n; ++i) {
      const double wi = w[i];
      bool needs = i > sure && wi != 0.0 && wi != 1.0;
      if (needs && a.is_logits) needs = c.coin(i - 1) < block_h_bound(wi);
      flags[i] = needs ? 1 : 0;
    }
  }
  __syncthreads();  // thread 0's global writes are done before the block moves on
  return make_plan(kOk, 0, -1, kEmitNone, 0, 0.0);  // decide-2 completes it
}

// Collective (decide-2 kernel).
template <int BLOCK, typename T>
__device__ RowPlan block_decide(const RowCtx<BLOCK, T>& c, int64_t* shared_tau) {
  const Args<T>& a = c.a;
  const double* w = a.weights + c.b * (a.G + 1);
  if (threadIdx.x == 0) {
    const int32_t* flags = a.pass_flags + c.b * (a.G + 1);
    int64_t tau = 0;
    for (int64_t i = c.n; i >= 1; --i) {
      const double wi = w[i];
      double h;
      if (i == c.n || wi == 0.0 || wi == 1.0) {
        h = wi;  // h_n = w_n; w = 0 gives Z = 0, h = 0; w = 1 gives h = Z / Z = 1
      } else if (flags[i]) {
        const PosAgg* aggs = a.aggs + (c.b * (a.G + 1) + i) * a.chunks;
        double z = 0.0;
        for (int64_t k = 0; k < a.chunks; ++k) z += aggs[k].sum;
        const double denom = z + (1.0 - wi);
        h = denom > 0.0 ? z / denom : 1.0;
      } else {
        continue;  // u_{i} >= the bound >= h_i: rejected without Z_i
      }
      if (c.coin(i - 1) < h) {
        tau = i;
        break;
      }
    }
    *shared_tau = tau;
  }
  __syncthreads();  // tau published
  const int64_t tau = *shared_tau;
  const int32_t status = c.read_status(tau == c.n ? c.n : c.n - 1, c.n - 1);
  if (tau == c.n) return make_plan(status, tau, -1, kEmitTarget, tau, 0.0);
  return make_plan(status, tau, -1, kEmitResidual, tau, w[tau]);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
