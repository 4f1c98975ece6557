// Greedy multi-path block verification (gbv) in the GPU tree walk (tree_walk.cuh): the device
// counterpart of kernels/tree_gbv.h, one block per batch row. Torch-free, no messages.
//
// The same steps in the same order. The priority of a position's tokens (p/q descending,
// lowest id on ties) is a block-wide bitonic sort of the token ids; G(b) is a suffix sum over
// the sorted order, and the law, the overlaps, Z and the residual are elementwise passes with
// block-wide reductions. The small per-row state (paths, the distribution of |S| per position,
// the picked nodes) lives in global scratch, written by thread 0 between barriers; every other
// value the control flow branches on is a block-wide result. Rounding differs from the CPU
// only in sums, so a decision can differ from the CPU's only when its coin lies within rounding
// of its threshold (the agreement tests' margin). `Row` is tree_walk.cuh's TreeRow.
#pragma once

#include "kernels/cuda/tree_transport.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Per-row scratch of gbv (global memory).
struct GbvRowScratch {
  double* below;       // [V] G
  int64_t* rank;       // [V] the priority rank (the drawable count for q = 0)
  int64_t* order;      // [P] token ids, P = the power of two >= V
  int64_t P;
  double* small;       // [6 N + 4]
  int64_t* small_int;  // [4 N + 2]
};

// The smallest power of two >= V.
SPECDECODE_TREE_HD int64_t gbv_sort_size(int64_t V) {
  int64_t P = 1;
  while (P < V) P *= 2;
  return P;
}

// Collective: p (row.r), q (row.d) of `node` processed, the priority (sort, G, ranks) and the
// law of `mode` for `state` in row.e. Returns the status of the rows read.
template <int BLOCK, class Row>
__device__ int32_t gbv_load_dev(const Row& row, const GbvRowScratch& g, int64_t node, const double* state, int64_t K,
                                int64_t mode) {
  const int64_t V = row.a.V;
  const PosState sp = row.p_state(node);
  if (sp.status != kOk) return sp.status;
  const PosState sq = row.q_state(node);
  if (sq.status != kOk) return sq.status | kStatusInDraft;
  fill_node_rows<BLOCK>(row, sp, sq, node);
  const double* p = row.r;
  const double* q = row.d;
  // Sort key of slot i: drawable tokens by (-(p/q), id), then the others, then the padding.
  const auto before = [&](int64_t a, int64_t b) {
    const bool da = a < V && q[a] > 0.0, db = b < V && q[b] > 0.0;
    if (da != db) return da;
    if (da) {
      const double ka = -(p[a] / q[a]), kb = -(p[b] / q[b]);
      if (ka != kb) return ka < kb;
    }
    return a < b;
  };
  for (int64_t i = threadIdx.x; i < g.P; i += BLOCK) g.order[i] = i;
  for (int64_t k = 2; k <= g.P; k *= 2) {
    for (int64_t j = k / 2; j > 0; j /= 2) {
      __syncthreads();  // the previous step is written
      for (int64_t i = threadIdx.x; i < g.P; i += BLOCK) {
        const int64_t l = i ^ j;
        if (l <= i) continue;
        const int64_t a = g.order[i], b = g.order[l];
        const bool ascending = (i & k) == 0;
        if (before(b, a) == ascending) {
          g.order[i] = b;
          g.order[l] = a;
        }
      }
    }
  }
  __syncthreads();  // the order is written
  // G(x) = the q-mass of x and every token after it: suffix sums over contiguous slices.
  const int64_t per = (V + BLOCK - 1) / BLOCK;
  const int64_t begin = static_cast<int64_t>(threadIdx.x) * per < V ? static_cast<int64_t>(threadIdx.x) * per : V;
  const int64_t end = begin + per < V ? begin + per : V;
  double mine = 0.0;
  int64_t drawable = 0;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t x = g.order[r];
    if (q[x] > 0.0) {
      mine += q[x];
      ++drawable;
    }
  }
  double total = 0.0;
  const double prefix = block_exclusive_scan<BLOCK>(mine, row.scratch, &total);
  const int64_t count = static_cast<int64_t>(row.sum(static_cast<double>(drawable)));
  double running = total - prefix;  // the mass from `begin` on
  for (int64_t r = begin; r < end; ++r) {
    const int64_t x = g.order[r];
    if (q[x] > 0.0) {
      g.below[x] = running;
      g.rank[x] = r;
      running -= q[x];
    } else {
      g.below[x] = 0.0;
      g.rank[x] = count;
    }
  }
  __syncthreads();  // G and the ranks are written
  double* law = row.e;
  for (int64_t b = threadIdx.x; b < V; b += BLOCK) {
    double value = q[b];
    if (mode == 1) {
      value = 0.0;
      if (q[b] > 0.0) {
        const double gb = g.below[b], rest = g.below[b] - q[b];
        for (int64_t m = 1; m <= K; ++m)
          if (state[m] != 0.0)
            value += state[m] * (pow(gb, static_cast<double>(m)) - pow(rest, static_cast<double>(m)));
      }
    }
    law[b] = value;
  }
  __syncthreads();  // the law is written
  return kOk;
}

// Collective: kernels::gbv_verify_row (valid row: tokens in [0, V)). Writes the path and the
// tokens (thread 0), sets *accepted; returns the status.
template <int BLOCK, class Row>
__device__ int32_t gbv_walk_dev(const Row& row, const GbvRowScratch& g, int64_t* out_tokens, int64_t* out_nodes,
                                int64_t* accepted) {
  const int64_t V = row.a.V;
  const int64_t N = row.a.N;
  *accepted = 0;
  int64_t* shape = g.small_int + 4 * N;  // [2]: K, L (or -1: not K paths)
  if (threadIdx.x == 0) {
    int64_t K = 0, L = 0;
    shape[0] = gbv_paths(row.first_child, row.next_sibling, g.small_int, &K, &L) ? K : -1;
    shape[1] = L;
  }
  __syncthreads();  // the paths are written
  const int64_t K = shape[0], L = shape[1];
  if (K < 0) return kTreeNotPaths;
  if (K == 0) {
    const PosState sp = row.p_state(0);
    if (sp.status != kOk) return sp.status;
    const int64_t y = row.sample_p(sp, 0);
    if (threadIdx.x == 0 && y >= 0) out_tokens[0] = y;
    return y >= 0 ? kOk : kEmptyDistribution;
  }
  const int64_t* paths = g.small_int;
  int64_t* alive = g.small_int + K * L;
  int64_t* picked = alive + K;
  int64_t* modes = picked + L;
  double* states = g.small;
  double* weights = states + (L + 1) * (K + 1);
  double* chosen_p = weights + L + 1;
  double* chosen_law = chosen_p + L;
  if (threadIdx.x == 0) {
    for (int64_t m = 0; m <= K; ++m) states[m] = m == K ? 1.0 : 0.0;
    for (int64_t j = 0; j < K; ++j) alive[j] = j;
  }
  int64_t num_alive = K;
  int64_t context = 0;
  for (int64_t i = 0; i < L; ++i) {
    __syncthreads();  // thread 0's writes are visible
    const double* state = states + i * (K + 1);
    const int32_t status = gbv_load_dev<BLOCK>(row, g, context, state, K, 1);
    if (status != kOk) return status;
    const double* p = row.r;
    const double* q = row.d;
    const double* law = row.e;
    double best_part = 0.0, first_part = 0.0;
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
      best_part += min_first(p[x], law[x]);
      first_part += min_first(p[x], q[x]);
    }
    const double overlap_best = row.sum(best_part);
    const double overlap_first = row.sum(first_part);
    const int64_t mode = overlap_best > overlap_first ? 1 : 0;
    int64_t b = row.tokens[paths[alive[0] * L + i]];
    if (mode == 1) {
      for (int64_t j = 1; j < num_alive; ++j) {
        const int64_t x = row.tokens[paths[alive[j] * L + i]];
        if (g.rank[x] < g.rank[b]) b = x;
      }
    }
    int64_t kept = 0;
    for (int64_t j = 0; j < num_alive; ++j)
      if (row.tokens[paths[alive[j] * L + i]] == b) ++kept;
    const int64_t first_kept = [&] {
      for (int64_t j = 0; j < num_alive; ++j)
        if (row.tokens[paths[alive[j] * L + i]] == b) return alive[j];
      return alive[0];
    }();
    __syncthreads();  // every thread has read alive, the ranks and the rows
    if (threadIdx.x == 0) {
      modes[i] = mode;
      chosen_p[i] = p[b];
      chosen_law[i] = mode == 1 ? law[b] : q[b];
      int64_t n = 0;
      for (int64_t j = 0; j < num_alive; ++j)
        if (row.tokens[paths[alive[j] * L + i]] == b) alive[n++] = alive[j];
      // Bayes over |S| (kernels::gbv_advance) with G from this position's priority
      gbv_advance(q, g.below, state, K, mode, b, states + (i + 1) * (K + 1));
    }
    num_alive = kept;
    context = paths[first_kept * L + i];
    if (threadIdx.x == 0) picked[i] = context;
  }
  __syncthreads();  // thread 0's writes are visible
  if (threadIdx.x == 0) {
    weights[0] = 1.0;
    for (int64_t i = 0; i < L; ++i) {
      const double px = chosen_p[i], qx = chosen_law[i];
      const double w = qx > 0.0 ? weights[i] * px / qx : (px > 0.0 ? 1.0 : 0.0);
      weights[i + 1] = w < 1.0 ? w : 1.0;
    }
  }
  __syncthreads();  // the weights are written
  int64_t tau = 0;
  for (int64_t i = L; i >= 1; --i) {
    double h = weights[L];
    if (i < L) {
      const int32_t status = gbv_load_dev<BLOCK>(row, g, picked[i - 1], states + i * (K + 1), K, modes[i]);
      if (status != kOk) return status;
      double part = 0.0;
      for (int64_t x = threadIdx.x; x < V; x += BLOCK) part += positive_part(weights[i] * row.r[x] - row.e[x]);
      const double z = row.sum(part);
      const double denominator = z + 1.0 - weights[i];
      h = denominator > 0.0 ? z / denominator : 1.0;
    }
    if (row.coin(picked[i - 1]) < h) {
      tau = i;
      break;
    }
  }
  *accepted = tau;
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < tau; ++i) {
      out_nodes[i + 1] = picked[i];
      out_tokens[i] = row.tokens[picked[i]];
    }
  }
  int64_t y = -1;
  if (tau == L) {
    const PosState sp = row.p_state(picked[L - 1]);
    if (sp.status != kOk) return sp.status;
    y = row.sample_p(sp, picked[L - 1]);
  } else {
    const int64_t node = tau == 0 ? 0 : picked[tau - 1];
    const int32_t status = gbv_load_dev<BLOCK>(row, g, node, states + tau * (K + 1), K, modes[tau]);
    if (status != kOk) return status;
    double part = 0.0;
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
      row.e[x] = positive_part(weights[tau] * row.r[x] - row.e[x]);
      part += row.e[x];
    }
    const double mass = row.sum(part);
    y = usable_mass(mass) ? row.search(row.e, row.coin(0), mass) : -1;
    if (y < 0) y = row.sample_p(row.p_state(node), node);
  }
  if (threadIdx.x == 0 && y >= 0) out_tokens[tau] = y;
  return y >= 0 ? kOk : kEmptyDistribution;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
