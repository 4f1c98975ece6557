// Traversal verification of one tree (one batch row): the rules traversal (children drawn
// without replacement) and traversal_iid (children i.i.d.). Pure C++ on raw pointers: no torch.
//
// python/specdecode/trees/traversal.py (traversal_row) is the reference, and this kernel does
// its float64 arithmetic in its order on the processed distributions (processed_fill), so with
// the same coins it makes the same decisions bit for bit:
//   the tree is walked in post-order (children in index order). Node v carries a measure m_v
//   and a proposal D_v: entering child c (token x) of v sets beta = min(1, m_v(x) / D_v(x)),
//   m_c = beta p_c, D_c = q_c. When v has no child left to try it is a leaf: the root, or a
//   node whose coin u_v < sum(m_v), accepts its whole path and emits y ~ m_v (p_v when m_v has
//   no mass) with the emission coin; otherwise its parent u updates
//   m_u = (m_u - D_u)_+ / sum (D_u - m_u)_+ (norm((m_u - D_u)_+), or p_u, when that sum is 0)
//   and, without replacement, D_u(x) = 0, D_u = norm(D_u).
// Only the node on top of the walk has its (m, D) in memory (three rows of V doubles: m, D and
// p). The stack keeps, per node on the path, its beta and its next child; returning to a node
// after a rejected child replays that node's updates from m = beta p, D = q over its rejected
// children, which gives the same values as having kept them. So memory is O(V + depth) and a
// node with k children costs O(k^2 V) in the worst case (k is small in practice).
#pragma once

#include <cstdint>

#include "kernels/row.h"
#include "kernels/tree_transport.h"

namespace specdecode {
namespace kernels {

// One node on the walk's path.
struct TraversalFrame {
  int64_t node;
  double beta;         // m_node = beta p_node before any rejection
  int64_t next_child;  // the next child to try, -1 when none is left
};

// traversal_row's rejected_update, in place: m = (m - D)_+ / sum (D - m)_+, or norm((m - D)_+),
// or p when that has no mass either.
inline void traversal_rejected_update(double* m, const double* d, const double* p, int64_t V) {
  double deficit = 0.0;
  for (int64_t x = 0; x < V; ++x) deficit += positive_part(d[x] - m[x]);
  for (int64_t x = 0; x < V; ++x) m[x] = positive_part(m[x] - d[x]);
  if (deficit > 0.0) {
    for (int64_t x = 0; x < V; ++x) m[x] /= deficit;
    return;
  }
  normalize_or(m, p, V);
}

// The arrays of the node on top of the walk.
struct TraversalRows {
  double* p;  // p_node, processed
  double* m;  // its measure
  double* d;  // its proposal D (nodes with children only)
};

// Loads frame f into `rows`: m = beta p, D = q, then the updates of every child tried so far
// (all of them rejected). Returns the status of the rows read (kOk, or a RowStatus with
// kStatusInDraft when q was at fault).
template <class Dist>
inline int32_t traversal_load(const TraversalFrame& f, const Dist* target, const Dist* draft, const int64_t* tokens,
                              const int64_t* first_child, const int64_t* next_sibling, int64_t V, bool replacement,
                              const TraversalRows& rows) {
  const Dist& p = target[f.node];
  processed_fill(p, rows.p, V);
  if (p.status() != kOk) return p.status();
  for (int64_t x = 0; x < V; ++x) rows.m[x] = f.beta * rows.p[x];
  const int64_t first = first_child[f.node];
  if (first < 0) return kOk;
  const Dist& q = draft[f.node];
  processed_fill(q, rows.d, V);
  if (q.status() != kOk) return q.status() | kStatusInDraft;
  for (int64_t c = first; c >= 0 && c != f.next_child; c = next_sibling[c]) {
    traversal_rejected_update(rows.m, rows.d, rows.p, V);
    if (!replacement) {
      rows.d[tokens[c]] = 0.0;
      normalize_in_place(rows.d, V);
    }
  }
  return kOk;
}

// Walks one row's tree (valid, tokens in [0, V)). `frames` holds N entries; coins[c] is node
// c's coin, coins[0] the emission coin. Writes the path's tokens then the emitted one to
// out_tokens and the path to out_nodes (both pre-filled with -1).
template <class Dist>
inline RowResult traversal_verify_row(const Dist* target, const Dist* draft, const int64_t* tokens,
                                      const int64_t* first_child, const int64_t* next_sibling, const double* coins,
                                      int64_t V, bool replacement, const TraversalRows& rows, TraversalFrame* frames,
                                      int64_t* out_tokens, int64_t* out_nodes) {
  int64_t top = 0;
  frames[0] = {0, 1.0, first_child[0]};
  int32_t status = traversal_load(frames[0], target, draft, tokens, first_child, next_sibling, V, replacement, rows);
  if (status != kOk) return {0, status};
  for (;;) {
    TraversalFrame& f = frames[top];
    if (f.next_child >= 0) {  // enter the next child
      const int64_t c = f.next_child;
      f.next_child = next_sibling[c];
      const int64_t x = tokens[c];
      double beta = 0.0;
      if (rows.d[x] > 0.0) beta = rows.m[x] / rows.d[x];
      else if (rows.m[x] > 0.0) beta = 1.0;
      if (beta >= 1.0) beta = 1.0;
      frames[++top] = {c, beta, first_child[c]};
      status = traversal_load(frames[top], target, draft, tokens, first_child, next_sibling, V, replacement, rows);
      if (status != kOk) return {top, status};
      continue;
    }
    double mass = 0.0;  // every child rejected: f.node is a leaf now
    for (int64_t x = 0; x < V; ++x) mass += rows.m[x];
    if (top == 0 || coins[f.node] < mass) {
      const int64_t y = sample_from_weights(mass > 0.0 ? rows.m : rows.p, V, coins[0]);
      for (int64_t i = 0; i <= top; ++i) out_nodes[i] = frames[i].node;
      for (int64_t i = 1; i <= top; ++i) out_tokens[i - 1] = tokens[frames[i].node];
      if (y < 0) return {top, kEmptyDistribution};
      out_tokens[top] = y;
      return {top, kOk};
    }
    --top;  // f's subtree rejected: back to its parent, whose updates now include f
    status = traversal_load(frames[top], target, draft, tokens, first_child, next_sibling, V, replacement, rows);
    if (status != kOk) return {top, status};
  }
}

}  // namespace kernels
}  // namespace specdecode
