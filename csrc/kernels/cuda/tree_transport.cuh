// SpecTr and SpecHub in the GPU tree walk (tree_walk.cuh): the device counterparts of
// kernels/tree_transport.h, one block per batch row. Torch-free, no messages.
//
// The steps are the CPU's in its order, on the node's processed distributions as scratch rows
// (the logit probabilities divided by their block-summed mass), with block-wide reductions
// where the CPU sums sequentially:
//   * spectr: beta(rho) = sum_x min(q(x), p(x) / rho) is one reduction over the vocabulary per
//     evaluation (the CPU sums the same terms over tokens sorted by p/q), the bisection for rho
//     runs the same 40 steps, and the residual norm(p - c min(q, p / rho))_+ is written over p;
//   * spechub: the hub a = argmax q (lowest id on ties) by a block reduction, then the pair's
//     two coin tests, the hub residual over p, and recursive rejection sampling for later
//     children on three rows (R, the running R' and D).
// So a decision can differ from the CPU's only when its coin lies within rounding of its
// threshold (the agreement tests' margin). `Row` is tree_walk.cuh's TreeRow.
#pragma once

#include "kernels/cuda/decide.cuh"
#include "kernels/tree_verify.h"

namespace specdecode {
namespace kernels {
namespace cuda {

// Collective: w = the processed distribution of a node row (state s, logits `row_logits`):
// LogitRow::prob(x) divided by the block sum, as processed_fill divides by fill's sum.
template <int BLOCK, class Row, typename T>
__device__ void fill_processed(const Row& row, const PosState& s, const T* row_logits, double* w) {
  __syncthreads();  // every thread is done reading w
  const double total = row.fill_p(s, row_logits, w);
  if (total > 0.0)
    for (int64_t x = threadIdx.x; x < row.a.V; x += BLOCK) w[x] /= total;
  __syncthreads();  // w is written
}

// Collective: node v's p in row.r and q in row.d, processed.
template <int BLOCK, class Row>
__device__ void fill_node_rows(const Row& row, const PosState& sp, const PosState& sq, int64_t v) {
  fill_processed<BLOCK>(row, sp, row.p_row(v), row.r);
  fill_processed<BLOCK>(row, sq, row.q_row(v), row.d);
}

// Collective: y ~ w (mass `mass`), falling back to y ~ p when w has no usable mass.
template <int BLOCK, class Row>
__device__ int64_t emit_weights(const Row& row, const PosState& sp, int64_t v, const double* w, double mass) {
  if (usable_mass(mass)) {
    const int64_t y = row.search(w, row.coin(0), mass);
    if (y >= 0) return y;
  }
  return row.sample_p(sp, v);
}

// Collective: kernels::spectr_node. p in row.r, q in row.d; the residual is written over p.
template <int BLOCK, class Row>
__device__ NodeDecision spectr_node_dev(const Row& row, const PosState& sp, const PosState& sq, int64_t v,
                                        int64_t first) {
  fill_node_rows<BLOCK>(row, sp, sq, v);
  const int64_t V = row.a.V;
  double* p = row.r;
  double* q = row.d;
  int64_t k = 0;
  for (int64_t c = first; c >= 0; c = row.next_sibling[c]) ++k;
  const double power = static_cast<double>(k);
  const auto beta = [&](double rho) {
    double part = 0.0;
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) part += min_first(q[x], p[x] / rho);
    return row.sum(part);
  };
  const auto feasible = [&](double rho) {
    const double b = beta(rho);
    return rho * b >= 1.0 - pow(1.0 - b, power);
  };
  double rho = 1.0;
  if (k > 1 && !feasible(1.0)) {
    double lo = 1.0, hi = power;
    for (int step = 0; step < kSpecTrRhoSteps; ++step) {
      const double mid = (lo + hi) / 2.0;
      if (feasible(mid)) hi = mid;
      else lo = mid;
    }
    rho = hi;
  }
  for (int64_t c = first; c >= 0; c = row.next_sibling[c]) {
    const int64_t x = row.tokens[c];
    if (accept_token_dev(row.coin(c), p[x], rho * q[x])) return {c, x};
  }
  const double b = beta(rho);
  const double scale = b > 0.0 ? (1.0 - pow(1.0 - b, power)) / b : 0.0;
  __syncthreads();  // every thread has read p and q
  double part = 0.0;
  for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
    p[x] = positive_part(p[x] - scale * min_first(q[x], p[x] / rho));
    part += p[x];
  }
  return {-1, emit_weights<BLOCK>(row, sp, v, p, row.sum(part))};
}

// Collective: kernels::spechub_rest, from the third child on. R (normalised) in row.r, D in
// row.d; the running R' in row.e.
template <int BLOCK, class Row>
__device__ NodeDecision spechub_rest_dev(const Row& row, const PosState& sp, int64_t v, int64_t third) {
  const int64_t V = row.a.V;
  const double* hub_residual = row.r;
  double* running = row.e;
  double* d = row.d;
  double mass = 0.0;
  {
    double part = 0.0;
    for (int64_t y = threadIdx.x; y < V; y += BLOCK) {
      running[y] = hub_residual[y];
      part += running[y];
    }
    mass = row.sum(part);
  }
  for (int64_t c = third; c >= 0; c = row.next_sibling[c]) {
    const int64_t x = row.tokens[c];
    if (accept_token_dev(row.coin(c), running[x], d[x])) return {c, x};
    __syncthreads();  // every thread has read running[x] and d[x]
    double part = 0.0;
    for (int64_t y = threadIdx.x; y < V; y += BLOCK) {
      running[y] = positive_part(running[y] - d[y]);
      part += running[y];
    }
    const double excess = row.sum(part);
    double r_part = 0.0, d_part = 0.0;
    for (int64_t y = threadIdx.x; y < V; y += BLOCK) {
      running[y] = excess > 0.0 ? running[y] / excess : hub_residual[y];  // norm, or R when empty
      r_part += running[y];
      if (y == x) d[y] = 0.0;
      d_part += d[y];
    }
    mass = row.sum(r_part);
    const double d_mass = row.sum(d_part);
    if (d_mass > 0.0)
      for (int64_t y = threadIdx.x; y < V; y += BLOCK) d[y] /= d_mass;
  }
  return {-1, emit_weights<BLOCK>(row, sp, v, running, mass)};
}

// Collective: kernels::spechub_node. p in row.r, q in row.d.
template <int BLOCK, class Row>
__device__ NodeDecision spechub_node_dev(const Row& row, const PosState& sp, const PosState& sq, int64_t v,
                                         int64_t first) {
  fill_node_rows<BLOCK>(row, sp, sq, v);
  const int64_t V = row.a.V;
  double* p = row.r;
  double* q = row.d;
  ArgMax best{-1.0, kNoIndex};
  for (int64_t x = threadIdx.x; x < V; x += BLOCK) best = OpArgMax()(best, ArgMax{q[x], x});
  const int64_t a = block_reduce<BLOCK>(best, OpArgMax(), row.scratch).index;
  const double q_hub = q[a];
  const int64_t second = row.next_sibling[first];
  if (second < 0 || !(q_hub < 1.0)) {  // specinfer on the first child
    const int64_t x = row.tokens[first];
    if (accept_token_dev(row.coin(first), p[x], q[x])) return {first, x};
    __syncthreads();  // every thread has read p[x] and q[x]
    double part = 0.0;
    for (int64_t y = threadIdx.x; y < V; y += BLOCK) {
      p[y] = positive_part(p[y] - q[y]);
      part += p[y];
    }
    return {-1, emit_weights<BLOCK>(row, sp, v, p, row.sum(part))};
  }
  const int64_t x1 = row.tokens[first], x2 = row.tokens[second];
  const bool first_is_hub = x1 == a;
  const int64_t hub_child = first_is_hub ? first : second;
  const int64_t other_child = first_is_hub ? second : first;
  const int64_t y = row.tokens[other_child];
  const double rest = 1.0 - q_hub;
  const auto r = [&](int64_t x) { return x != a ? q[x] / rest : 0.0; };
  if (accept_token_dev(row.coin(other_child), p[y], r(y))) return {other_child, y};
  double part = 0.0;
  for (int64_t x = threadIdx.x; x < V; x += BLOCK)
    if (x != a) part += positive_part(r(x) - p[x]);
  const double excess = row.sum(part);  // A
  const double p_hub = p[a];
  if (accept_token_dev(row.coin(hub_child), p_hub, excess)) return {hub_child, row.tokens[hub_child]};
  __syncthreads();  // every thread has read p[a]
  part = 0.0;
  for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
    p[x] = x == a ? positive_part(p_hub - excess) : positive_part(p[x] - r(x));
    part += p[x];
  }
  const double mass = row.sum(part);
  const int64_t third = row.next_sibling[second];
  if (third < 0) return {-1, emit_weights<BLOCK>(row, sp, v, p, mass)};
  // R = norm(R), or p when it has no mass; D = norm(q without x1, x2), or q when that is empty.
  if (mass > 0.0) {
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) p[x] /= mass;
  } else {
    fill_processed<BLOCK>(row, sp, row.p_row(v), p);
  }
  part = 0.0;
  for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
    if (x == x1 || x == x2) q[x] = 0.0;
    part += q[x];
  }
  const double d_mass = row.sum(part);
  if (d_mass > 0.0) {
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) q[x] /= d_mass;
  } else {
    fill_processed<BLOCK>(row, sq, row.q_row(v), q);
  }
  __syncthreads();  // R and D are written
  return spechub_rest_dev<BLOCK>(row, sp, v, third);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
