// Traversal verification in the GPU tree walk (tree_walk.cuh): the device counterpart of
// kernels/tree_traversal.h, one block per batch row. Torch-free, no messages.
//
// The same post-order walk with the same stack of frames (node, beta, next child; in global
// scratch, written by thread 0, every thread keeping the top frame in registers) and the same
// replay of a node's updates when the walk returns to it. The top node's rows live in the
// row's scratch: m in row.r, D in row.d, p in row.e (processed: the logit probabilities divided
// by their block-summed mass). Sums are block-wide reductions where the CPU sums sequentially,
// so a decision can differ from the CPU's only when its coin lies within rounding of its
// threshold (the agreement tests' margin). `Row` is tree_walk.cuh's TreeRow.
#pragma once

#include "kernels/cuda/tree_transport.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Collective: kernels::traversal_load. Returns the status of the rows it reads.
template <int BLOCK, class Row>
__device__ int32_t traversal_load_dev(const Row& row, const TraversalFrame& f, bool replacement) {
  const int64_t V = row.a.V;
  double* m = row.r;
  double* d = row.d;
  double* p = row.e;
  const PosState sp = row.p_state(f.node);
  if (sp.status != kOk) return sp.status;
  fill_processed<BLOCK>(row, sp, row.p_row(f.node), p);
  for (int64_t x = threadIdx.x; x < V; x += BLOCK) m[x] = f.beta * p[x];
  const int64_t first = row.first_child[f.node];
  if (first >= 0) {
    const PosState sq = row.q_state(f.node);
    if (sq.status != kOk) return sq.status | kStatusInDraft;
    fill_processed<BLOCK>(row, sq, row.q_row(f.node), d);
  }
  for (int64_t c = first; c >= 0 && c != f.next_child; c = row.next_sibling[c]) {
    // m = (m - D)_+ / sum (D - m)_+, or norm((m - D)_+), or p
    double deficit_part = 0.0, excess_part = 0.0;
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
      deficit_part += positive_part(d[x] - m[x]);
      m[x] = positive_part(m[x] - d[x]);
      excess_part += m[x];
    }
    const double deficit = row.sum(deficit_part);
    const double excess = row.sum(excess_part);
    const int64_t x_c = row.tokens[c];
    double d_part = 0.0;
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
      m[x] = deficit > 0.0 ? m[x] / deficit : (excess > 0.0 ? m[x] / excess : p[x]);
      if (!replacement && x == x_c) d[x] = 0.0;
      d_part += d[x];
    }
    if (!replacement) {  // D = norm(D) without x_c
      const double d_mass = row.sum(d_part);
      if (d_mass > 0.0)
        for (int64_t x = threadIdx.x; x < V; x += BLOCK) d[x] /= d_mass;
    }
  }
  __syncthreads();  // m, D and p are written
  return kOk;
}

// Collective: kernels::traversal_verify_row on one row (frames: its N frames). Writes the path
// and the tokens (thread 0), sets *accepted; returns the status.
template <int BLOCK, class Row>
__device__ int32_t traversal_walk_dev(const Row& row, bool replacement, TraversalFrame* frames, int64_t* out_tokens,
                                      int64_t* out_nodes, int64_t* accepted) {
  const int64_t V = row.a.V;
  int64_t top = 0;
  TraversalFrame cur{0, 1.0, row.first_child[0]};
  if (threadIdx.x == 0) frames[0] = cur;
  int32_t status = traversal_load_dev<BLOCK>(row, cur, replacement);
  *accepted = 0;
  if (status != kOk) return status;
  for (;;) {
    if (cur.next_child >= 0) {  // enter the next child
      const int64_t c = cur.next_child;
      cur.next_child = row.next_sibling[c];
      const int64_t x = row.tokens[c];
      double beta = 0.0;
      if (row.d[x] > 0.0) beta = row.r[x] / row.d[x];
      else if (row.r[x] > 0.0) beta = 1.0;
      if (beta >= 1.0) beta = 1.0;
      if (threadIdx.x == 0) frames[top] = cur;
      cur = TraversalFrame{c, beta, row.first_child[c]};
      ++top;
      if (threadIdx.x == 0) frames[top] = cur;
      status = traversal_load_dev<BLOCK>(row, cur, replacement);  // its first barrier: every thread has read m[x], D[x]
      *accepted = top;
      if (status != kOk) return status;
      continue;
    }
    double part = 0.0;  // every child rejected: cur.node is a leaf now
    for (int64_t x = threadIdx.x; x < V; x += BLOCK) part += row.r[x];
    const double mass = row.sum(part);
    if (top == 0 || row.coin(cur.node) < mass) {
      int64_t y = -1;
      if (mass > 0.0) {
        y = row.search(row.r, row.coin(0), mass);
      } else {
        part = 0.0;
        for (int64_t x = threadIdx.x; x < V; x += BLOCK) part += row.e[x];
        y = row.search(row.e, row.coin(0), row.sum(part));
      }
      __syncthreads();  // frames written by thread 0 are visible
      if (threadIdx.x == 0) {
        for (int64_t i = 0; i <= top; ++i) out_nodes[i] = frames[i].node;
        for (int64_t i = 1; i <= top; ++i) out_tokens[i - 1] = row.tokens[frames[i].node];
        if (y >= 0) out_tokens[top] = y;
      }
      *accepted = top;
      return y >= 0 ? kOk : kEmptyDistribution;
    }
    --top;  // cur's subtree rejected: back to its parent, whose updates now include cur
    __syncthreads();  // thread 0's frame writes are visible
    cur = frames[top];
    *accepted = top;
    status = traversal_load_dev<BLOCK>(row, cur, replacement);
    if (status != kOk) return status;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
