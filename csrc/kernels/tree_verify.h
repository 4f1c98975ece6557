// Verification of one token tree (one batch row). Pure C++ on raw pointers: no torch.
//
// Walk from the root. At the current node v, p = the target's processed distribution at v (of
// the token that follows v) and q = the distribution v's children were drafted from. The node
// rule looks at v's children in index order and either accepts one child c (the walk moves to
// c) or emits one token y and the walk stops; a leaf emits at once. Output: the accepted nodes'
// tokens then y, and the path of node indices starting with the root.
//
// Per-node rules. R is the running target, D the running proposal; every comparison is the
// half-open u < ratio (so a token with R = 0 is never accepted, even by u = 0), a ratio with a
// zero denominator means "accept iff the numerator is > 0", and a residual of zero mass falls
// back to p.
//   greedy        a = argmax p (lowest id on ties): accept the first child whose token is a;
//                 else emit a. Children: any.
//   specinfer     R = p. Child x: accept iff u < R(x) / q(x); else R = norm((R - q)_+).
//                 Emit y ~ R. Children: drawn i.i.d. from q.
//   rrs           R = p, D = q. Child x: accept iff u < R(x) / D(x); else R = norm((R - D)_+),
//                 D(x) = 0, D = norm(D). Emit y ~ R. Children: drawn without replacement from q
//                 (distinct; duplicates are bad input).
//   deterministic R = p. Child x: accept iff u < R(x); else R(x) = 0, R = norm(R). Emit y ~ R.
//                 Children: any deterministic function of the context, distinct siblings.
//   typical       accept the first child with p(x) > min(epsilon, delta exp(-H(p))); emit
//                 argmax p (y ~ p with sample_correction). Lossy.
//   spectr,       the optimal-transport rules of kernels/tree_transport.h, on the node's
//   spechub       processed distributions as arrays, with the Python reference's arithmetic.
//   traversal,    traversal verification (kernels/tree_traversal.h): decided from the leaves
//   traversal_iid up over whole paths, with the Python reference's arithmetic.
//   gbv           greedy multi-path block verification (kernels/tree_gbv.h) on K i.i.d. paths,
//                 with the Python reference's arithmetic.
// R and D are kept unnormalised (weights r with their mass m, R(x) = r[x] / m) and p, q are
// read straight from their rows until a rejection needs them as arrays, so a rejected child
// costs one O(V) pass and a node whose first child is accepted reads only the entries it needs.
// With one child per node these are exactly the chain rules (token.h, greedy.h, typical.h):
// specinfer and rrs compute the same ratio and the same fused residual as token verification.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/row.h"
#include "kernels/tree_mask.h"
#include "kernels/tree_transport.h"
#include "kernels/tree_gbv.h"
#include "kernels/tree_traversal.h"
#include "kernels/typical.h"

namespace specdecode {
namespace kernels {

enum class TreeRule : int32_t {
  kGreedy = 0,
  kSpecInfer = 1,
  kRecursiveRejection = 2,
  kDeterministic = 3,
  kTypical = 4,
  kSpecTr = 5,
  kSpecHub = 6,
  kTraversal = 7,     // children without replacement
  kTraversalIid = 8,  // children i.i.d.
  kGbv = 9,           // K i.i.d. paths (kernels/tree_gbv.h)
};

// Traversal verification (kernels/tree_traversal.h): decided from the leaves up, not node by node.
SPECDECODE_TREE_HD bool tree_rule_is_traversal(TreeRule rule) {
  return rule == TreeRule::kTraversal || rule == TreeRule::kTraversalIid;
}

// Rules that work on the processed distributions as arrays (kernels/tree_transport.h).
SPECDECODE_TREE_HD bool tree_rule_is_transport(TreeRule rule) {
  return rule == TreeRule::kSpecTr || rule == TreeRule::kSpecHub;
}

// Rules that read q (the draft's distribution at each node).
SPECDECODE_TREE_HD bool tree_rule_needs_draft(TreeRule rule) {
  return rule == TreeRule::kSpecInfer || rule == TreeRule::kRecursiveRejection || tree_rule_is_transport(rule) ||
         tree_rule_is_traversal(rule) || rule == TreeRule::kGbv;
}

// Rules whose drafting scheme makes siblings distinct, so a repeated sibling token is bad input.
SPECDECODE_TREE_HD bool tree_rule_needs_distinct_siblings(TreeRule rule) {
  return rule == TreeRule::kRecursiveRejection || rule == TreeRule::kDeterministic || rule == TreeRule::kTraversal;
}

// Scratch of one thread: three rows of V doubles and LogitRow's select buffer (in `dist`).
struct TreeWorkspace {
  Workspace dist;   // a: sampling scratch, b: the residual weights r, select: top-k / top-p
  double* proposal; // the proposal weights d (rrs) or q as an array (specinfer)
  double* extra = nullptr;   // 3 V + 2 doubles (transport rules, gbv)
  int64_t* order = nullptr;  // V indices (transport rules, gbv)
  TraversalFrame* frames = nullptr;  // N frames (traversal rules only)
  double* small = nullptr;        // 6 N + 4 doubles (gbv only)
  int64_t* small_int = nullptr;   // 4 N + 2 indices (gbv only)
};

template <class Dist>
struct TreeRowArgs {
  const Dist* target;           // [N] distributions p at every node slot
  const Dist* draft;            // [N] q at every node slot; null for rules without q
  const int64_t* tokens;        // [N] node tokens (slot 0, the root, is not read)
  const int64_t* first_child;   // [N] (tree_links_row)
  const int64_t* next_sibling;  // [N]
  const double* uniforms;       // [N]: column c > 0 is node c's acceptance coin, column 0 the emission coin
  int64_t vocab_size;
  TreeWorkspace* ws;
  int64_t* out_tokens;          // [N], pre-filled with -1
  int64_t* out_nodes;           // [N], pre-filled with -1
  RuleParams params;
};

// The running target R: p itself while is_p, else r[x] / mass.
struct RunningTarget {
  bool is_p = true;
  double mass = 1.0;
};

// mass > 0 and finite (m - m is 0 exactly for a finite m, NaN for inf and NaN). Host and
// device (the CUDA tree walk, cuda/tree_walk.cuh, uses the same functions).
SPECDECODE_TREE_HD bool usable_mass(double mass) { return mass > 0.0 && mass - mass == 0.0; }

// One entry of norm(R) - norm(D) clipped at 0: max(r / r_mass - d / d_mass, 0), or r / r_mass
// when D is empty (d_mass 0: it only rescales R).
SPECDECODE_TREE_HD double clipped_difference(double r, double r_mass, double d, double d_mass) {
  if (!(d_mass > 0.0)) return r / r_mass;
  const double v = r / r_mass - d / d_mass;
  return v > 0.0 ? v : 0.0;
}

// r[x] = clipped_difference(r[x], r_mass, d[x], d_mass) for every x; returns the new sequential
// mass. One O(V) pass.
inline double subtract_clip(double* r, double r_mass, const double* d, double d_mass, int64_t V) {
  double total = 0.0;
  for (int64_t x = 0; x < V; ++x) {
    r[x] = clipped_difference(r[x], r_mass, d[x], d_mass);
    total += r[x];
  }
  return total;
}

inline double sequential_sum(const double* w, int64_t V) {
  double total = 0.0;
  for (int64_t x = 0; x < V; ++x) total += w[x];
  return total;
}

// y ~ R with the emission coin; R of unusable mass falls back to p (as token.h does).
template <class Dist>
inline int64_t emit_from(const Dist& p, const RunningTarget& R, const double* r, double u, TreeWorkspace* ws,
                         int64_t V) {
  if (!R.is_p) {
    const int64_t y = sample_from_weights(r, V, u, R.mass);
    if (y >= 0) return y;
  }
  return sample_distribution(p, u, ws->dist.a);
}

template <class Dist>
inline double running_prob(const Dist& p, const RunningTarget& R, const double* r, int64_t x) {
  return R.is_p ? p.prob(x) : r[x] / R.mass;
}

template <class Dist>
inline NodeDecision greedy_node(const TreeRowArgs<Dist>& a, const Dist& p, int64_t first) {
  const int64_t best = p.argmax();
  for (int64_t c = first; c >= 0; c = a.next_sibling[c])
    if (a.tokens[c] == best) return {c, best};
  return {-1, best};
}

template <class Dist>
inline NodeDecision specinfer_node(const TreeRowArgs<Dist>& a, const Dist& p, const Dist& q, int64_t first) {
  const int64_t V = a.vocab_size;
  double* r = a.ws->dist.b;
  double* q_array = a.ws->proposal;
  bool q_filled = false;
  RunningTarget R;
  for (int64_t c = first; c >= 0; c = a.next_sibling[c]) {
    const int64_t x = a.tokens[c];
    if (accept_token(a.uniforms[c], running_prob(p, R, r, x), q.prob(x))) return {c, x};
    if (R.is_p) {
      R.mass = p.residual(q, 1.0, r);  // the fused pass of token verification
    } else {
      if (!q_filled) {
        q.fill(q_array);
        q_filled = true;
      }
      R.mass = subtract_clip(r, R.mass, q_array, 1.0, V);
    }
    R.is_p = !usable_mass(R.mass);
  }
  return {-1, emit_from(p, R, r, a.uniforms[0], a.ws, V)};
}

template <class Dist>
inline NodeDecision rrs_node(const TreeRowArgs<Dist>& a, const Dist& p, const Dist& q, int64_t first) {
  const int64_t V = a.vocab_size;
  double* r = a.ws->dist.b;
  double* d = a.ws->proposal;
  RunningTarget R;
  bool d_is_q = true;  // D = q, not materialised yet
  double d_mass = 1.0;
  for (int64_t c = first; c >= 0; c = a.next_sibling[c]) {
    const int64_t x = a.tokens[c];
    const double d_x = d_is_q ? q.prob(x) : (d_mass > 0.0 ? d[x] / d_mass : 0.0);
    if (accept_token(a.uniforms[c], running_prob(p, R, r, x), d_x)) return {c, x};
    // R = norm((R - D)_+)
    if (R.is_p && d_is_q) {
      R.mass = p.residual(q, 1.0, r);  // the fused pass of token verification
    } else {
      if (R.is_p) {
        p.fill(r);  // the values of p.prob, so R(x) = r[x] / 1 is still p(x)
        R.mass = 1.0;
      }
      if (d_is_q) {
        q.fill(d);
        d_mass = 1.0;
        d_is_q = false;
      }
      R.mass = subtract_clip(r, R.mass, d, d_mass, V);
    }
    R.is_p = !usable_mass(R.mass);
    // D(x) = 0, D = norm(D): only a later sibling reads D.
    if (a.next_sibling[c] >= 0) {
      if (d_is_q) {
        q.fill(d);
        d_is_q = false;
      }
      d[x] = 0.0;
      d_mass = sequential_sum(d, V);
    }
  }
  return {-1, emit_from(p, R, r, a.uniforms[0], a.ws, V)};
}

template <class Dist>
inline NodeDecision deterministic_node(const TreeRowArgs<Dist>& a, const Dist& p, int64_t first) {
  const int64_t V = a.vocab_size;
  double* r = a.ws->dist.b;
  RunningTarget R;
  for (int64_t c = first; c >= 0; c = a.next_sibling[c]) {
    const int64_t x = a.tokens[c];
    if (accept_token(a.uniforms[c], running_prob(p, R, r, x), 1.0)) return {c, x};  // D one-hot on x
    if (R.is_p) p.fill(r);  // R(x) = r[x] / mass with any positive mass: the mass is recomputed below
    r[x] = 0.0;
    R.mass = sequential_sum(r, V);
    R.is_p = !usable_mass(R.mass);
  }
  return {-1, emit_from(p, R, r, a.uniforms[0], a.ws, V)};
}

template <class Dist>
inline NodeDecision typical_node(const TreeRowArgs<Dist>& a, const Dist& p, int64_t first) {
  double* probs = a.ws->dist.a;
  if (first >= 0) {
    p.fill(probs);
    const double threshold = std::min(a.params.epsilon, a.params.delta * std::exp(-entropy(probs, a.vocab_size)));
    for (int64_t c = first; c >= 0; c = a.next_sibling[c]) {
      const int64_t x = a.tokens[c];
      if (probs[x] > threshold) return {c, x};
    }
  }
  if (a.params.sample_correction) return {-1, sample_distribution(p, a.uniforms[0], probs)};
  return {-1, p.argmax()};
}

// spectr / spechub at one node: p (and at a node with children q) as processed arrays.
template <class Dist>
inline NodeDecision transport_node(TreeRule rule, const TreeRowArgs<Dist>& a, const Dist& p, const Dist* q,
                                   int64_t first) {
  const int64_t V = a.vocab_size;
  const TransportScratch s{a.ws->dist.a, a.ws->proposal, a.ws->dist.b, a.ws->extra, a.ws->order};
  const NodeChildren kids{a.tokens, a.next_sibling, a.uniforms, first};
  processed_fill(p, s.p, V);
  if (first < 0) return {-1, sample_from_weights(s.p, V, a.uniforms[0])};
  processed_fill(*q, s.q, V);
  return rule == TreeRule::kSpecTr ? spectr_node(kids, s, V) : spechub_node(kids, s, V);
}

template <class Dist>
inline NodeDecision lossless_leaf(const TreeRowArgs<Dist>& a, const Dist& p) {
  return {-1, sample_distribution(p, a.uniforms[0], a.ws->dist.a)};
}

// Walks one row's tree. Returns the number of accepted nodes and a status (kOk, or a
// distribution status with kStatusInDraft when q was at fault). The tree must be valid and its
// used tokens in [0, V) (checked by the caller).
template <class Dist>
inline RowResult verify_tree_row(TreeRule rule, const TreeRowArgs<Dist>& a) {
  if (tree_rule_is_traversal(rule)) {
    const TraversalRows rows{a.ws->dist.a, a.ws->dist.b, a.ws->proposal};
    return traversal_verify_row(a.target, a.draft, a.tokens, a.first_child, a.next_sibling, a.uniforms, a.vocab_size,
                                rule == TreeRule::kTraversalIid, rows, a.ws->frames, a.out_tokens, a.out_nodes);
  }
  if (rule == TreeRule::kGbv) {
    const GbvScratch s{a.ws->dist.a, a.ws->proposal, a.ws->dist.b, a.ws->extra, a.ws->extra + a.vocab_size,
                       a.ws->order, a.ws->small, a.ws->small_int};
    int64_t K = 0, L = 0;
    if (!gbv_paths(a.first_child, a.next_sibling, s.small_int, &K, &L)) return {0, kTreeNotPaths};
    return gbv_verify_row(a.target, a.draft, a.tokens, a.uniforms, K, L, a.vocab_size, s, a.out_tokens, a.out_nodes);
  }
  const bool uses_draft = tree_rule_needs_draft(rule);
  int64_t v = 0, accepted = 0;
  a.out_nodes[0] = 0;
  for (;;) {
    const Dist& p = a.target[v];
    const int64_t first = a.first_child[v];
    NodeDecision decision{-1, -1};
    switch (rule) {
      case TreeRule::kGreedy: decision = greedy_node(a, p, first); break;
      case TreeRule::kTypical: decision = typical_node(a, p, first); break;
      case TreeRule::kSpecInfer:
        decision = first >= 0 ? specinfer_node(a, p, a.draft[v], first) : lossless_leaf(a, p);
        break;
      case TreeRule::kRecursiveRejection:
        decision = first >= 0 ? rrs_node(a, p, a.draft[v], first) : lossless_leaf(a, p);
        break;
      case TreeRule::kDeterministic:
        decision = first >= 0 ? deterministic_node(a, p, first) : lossless_leaf(a, p);
        break;
      case TreeRule::kSpecTr:
      case TreeRule::kSpecHub:
        decision = transport_node(rule, a, p, first >= 0 ? &a.draft[v] : nullptr, first);
        break;
      case TreeRule::kTraversal:
      case TreeRule::kTraversalIid:
      case TreeRule::kGbv: break;  // whole-row rules, walked above
    }
    // A bad value in a distribution explains a decision, so it is reported first.
    if (p.status() != kOk) return {accepted, p.status()};
    if (uses_draft && a.draft[v].status() != kOk) return {accepted, a.draft[v].status() | kStatusInDraft};
    if (decision.child >= 0) {
      a.out_tokens[accepted] = decision.token;
      ++accepted;
      a.out_nodes[accepted] = decision.child;
      v = decision.child;
      continue;
    }
    if (decision.token < 0) return {accepted, kEmptyDistribution};
    a.out_tokens[accepted] = decision.token;
    return {accepted, kOk};
  }
}

// Status of a row's tokens and siblings for `rule`, given valid links: every real non-root
// token in [0, V), and distinct siblings where the rule needs them. `stamp` is V int64 of
// scratch whose entries must all be below `stamp_base` on entry (fill it with -1 once per
// thread and pass row * N as the base): it records, per token, the last node whose children
// list had a child with that token. Each children list is walked on its own, O(N) in all.
inline int32_t check_tree_tokens(TreeRule rule, const int64_t* tokens, int64_t num_nodes, const int64_t* first_child,
                                 const int64_t* next_sibling, int64_t V, int64_t* stamp, int64_t stamp_base) {
  for (int64_t i = 1; i < num_nodes; ++i)
    if (tokens[i] < 0 || tokens[i] >= V) return kTreeTokenOutOfRange;
  if (!tree_rule_needs_distinct_siblings(rule)) return kTreeOk;
  for (int64_t v = 0; v < num_nodes; ++v) {
    const int64_t key = stamp_base + v;
    for (int64_t c = first_child[v]; c >= 0; c = next_sibling[c]) {
      if (stamp[tokens[c]] == key) return kTreeDuplicateSiblings;
      stamp[tokens[c]] = key;
    }
  }
  return kTreeOk;
}

}  // namespace kernels
}  // namespace specdecode
