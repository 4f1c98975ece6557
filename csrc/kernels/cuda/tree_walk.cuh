// The tree walk kernel of verify_tree on the GPU: one block of kTreeWalkThreads threads per
// batch row, after the state kernels (launch.cuh launch_state_kernels) have summarised every
// node's target (and draft) logit row. Torch-free.
//
// Per row, as kernels/tree_verify.h verify_tree_row:
//   1. the tree checks of the CPU op in its order: structure (check_tree_row, the same
//      host+device function), then every real non-root token in [0, V), then (rrs,
//      deterministic) distinct siblings; the children lists come from tree_links_row (one
//      thread: O(N));
//   2. the node states (finish_state) of the row's real nodes;
//   3. the walk from the root. At node v the rule looks at v's children in index order. All
//      threads run the same scalar control flow (every value it branches on is either read by
//      all threads after a barrier or the result of a block-wide reduction); the O(V) steps
//      are block-strided loops:
//        * a rejected child updates the running target R (and for rrs the running proposal D)
//          elementwise with exactly the CPU's roundings (logit_residual for the fused first
//          residual, r / m - d / m_d clipped at 0 afterwards) and sums it with a block
//          reduction;
//        * the emitted token is a block-parallel inverse CDF over the weights (thread t owns a
//          contiguous slice; an exclusive scan of the slices' sums gives each thread its
//          starting cumulative weight; the first positive weight whose cumulative sum exceeds
//          u * mass wins, the last positive weight when rounding put u * mass at the top) --
//          kernels::sample_from_weights' rule.
//      The row's status is checked at each visited node before its decision: the target's,
//      then (rules reading q, nodes with children) the draft's -- the CPU reports the same
//      status for the same node (it decides first, but a bad row's decision is discarded).
// R and D live in per-row float64 scratch rows r, d (and for spechub e) of V entries (global
// memory). spectr and spechub are in tree_transport.cuh, traversal in tree_traversal.cuh, gbv in
// tree_gbv.cuh.
#pragma once

#include "kernels/cuda/decide.cuh"
#include "kernels/cuda/tree_transport.cuh"
#include "kernels/cuda/tree_gbv.cuh"
#include "kernels/cuda/tree_traversal.cuh"
#include "kernels/cuda/tree_verify.cuh"
#include "kernels/tree_mask.h"

namespace specdecode {
namespace kernels {
namespace cuda {

constexpr int kTreeWalkThreads = 256;

template <typename T>
struct TreeArgs {
  Args<T> target;  // the states of the target rows: unit b * N + v is node v of row b
  Args<T> draft;   // the same for the draft rows (specinfer, rrs); unused otherwise
  const int64_t* tokens;
  const int64_t* parents;
  const int64_t* num_nodes;
  Coins coins;
  int64_t B, N, V;
  TreeRule rule;
  RuleParams params;
  bool reads_draft;
  int64_t* out_tokens;
  int64_t* out_accepted_len;
  int64_t* out_nodes;
  int32_t* out_status;
  // scratch
  int64_t* depth;         // [B, N]
  int64_t* first_child;   // [B, N]
  int64_t* next_sibling;  // [B, N]
  double* r;              // [B, V] the running target's weights
  double* d;              // [B, V] the running proposal's weights (rrs); q (spectr, spechub)
  double* e;              // [B, V] spechub's running target after the hub pair; p (traversal)
  TraversalFrame* frames;  // [B, N] the walk's stack (traversal)
  double* gbv_doubles;     // [B, V + 6 N + 4] gbv: G, then the small state
  int64_t* gbv_ints;       // [B, V + P + 4 N + 4] gbv: ranks, the sort order (P: gbv_sort_size(V)), paths
};

// What a node decided: child >= 0 accepted, else token is emitted.
using TreeDecision = NodeDecision;

// One row's view of the arguments (the device counterpart of kernels::TreeRowArgs).
template <int BLOCK, typename T>
struct TreeRow {
  const TreeArgs<T>& a;
  int64_t b;
  const int64_t* tokens;
  const int64_t* first_child;
  const int64_t* next_sibling;
  double* r;
  double* d;
  double* e;
  ReduceScratch& scratch;

  __device__ float inv_temp() const { return a.target.logit.inv_temp; }
  __device__ const T* p_row(int64_t v) const { return a.target.target + (b * a.N + v) * a.V; }
  __device__ const T* q_row(int64_t v) const { return a.draft.target + (b * a.N + v) * a.V; }
  __device__ PosState p_state(int64_t v) const { return a.target.states[b * a.N + v]; }
  __device__ PosState q_state(int64_t v) const { return a.draft.states[b * a.N + v]; }
  // Column c of the row's coins.
  __device__ double coin(int64_t c) const {
    if (a.coins.uniforms != nullptr) return a.coins.uniforms[b * a.N + c];
    return philox_uniform(static_cast<uint64_t>(*a.coins.philox_seed), static_cast<uint64_t>(*a.coins.philox_offset),
                          static_cast<uint64_t>(b), static_cast<uint64_t>(c));
  }
  // LogitRow::prob of token x.
  __device__ double prob(const PosState& s, const T* row, int64_t x) const {
    return logit_prob(s, inv_temp(), to_float(row[x]));
  }

  // Collective: sum over the block (every thread gets it).
  __device__ double sum(double part) const { return block_reduce<BLOCK>(part, OpSum(), scratch); }

  // Collective: w[x] = p(x) for the whole row (LogitRow::fill); returns the mass.
  __device__ double fill_p(const PosState& sp, const T* row, double* w) const {
    double part = 0.0;
    for (int64_t x = threadIdx.x; x < a.V; x += BLOCK) {
      w[x] = logit_prob(sp, inv_temp(), to_float(row[x]));
      part += w[x];
    }
    return sum(part);
  }

  // Collective: kernels::sample_from_weights(w, V, u, total) over the row w (block-parallel).
  __device__ int64_t search(const double* w, double u, double total) const {
    if (!(total > 0.0) || !is_finite(total)) return -1;
    const double threshold = u * total;
    const int64_t per = (a.V + BLOCK - 1) / BLOCK;
    const int64_t begin = static_cast<int64_t>(threadIdx.x) * per < a.V ? static_cast<int64_t>(threadIdx.x) * per : a.V;
    const int64_t end = begin + per < a.V ? begin + per : a.V;
    double mine = 0.0;
    for (int64_t x = begin; x < end; ++x) mine += w[x];
    double cumulative = block_exclusive_scan<BLOCK>(mine, scratch);
    int64_t hit = kNoIndex;
    int64_t last = -1;
    for (int64_t x = begin; x < end; ++x) {
      cumulative += w[x];
      if (w[x] > 0.0) {
        last = x;
        if (cumulative > threshold && hit == kNoIndex) hit = x;
      }
    }
    hit = block_reduce<BLOCK>(hit, OpMin(), scratch);
    last = block_reduce<BLOCK>(last, OpMax(), scratch);
    return hit != kNoIndex ? hit : last;
  }

  // Collective: y ~ p at node v with the emission coin (kernels::sample_distribution).
  __device__ int64_t sample_p(const PosState& sp, int64_t v) const {
    __syncthreads();  // every thread is done reading r
    const double total = fill_p(sp, p_row(v), r);
    return search(r, coin(0), total);
  }

  // Collective: y ~ R (weights r of mass `mass`), falling back to p (kernels::emit_from).
  __device__ int64_t emit(const PosState& sp, int64_t v, bool r_is_p, double mass) const {
    if (!r_is_p) {
      const int64_t y = search(r, coin(0), mass);
      if (y >= 0) return y;
    }
    return sample_p(sp, v);
  }

  __device__ TreeDecision greedy_node(const PosState& sp, int64_t first) const {
    const int64_t best = sp.argmax;
    for (int64_t c = first; c >= 0; c = next_sibling[c])
      if (tokens[c] == best) return {c, best};
    return {-1, best};
  }

  // Collective: the children loop of specinfer and deterministic. Child c with token x is
  // accepted iff u_c < R(x) / proposal(x); a rejection replaces R by update(y, x, r_is_p, mass)
  // = the new unnormalised weight of every token y (R is p while r_is_p, else r / mass), and
  // its mass is summed. After the last rejection y ~ R (kernels::emit_from).
  template <class Proposal, class Update>
  __device__ TreeDecision reject_walk(const PosState& sp, int64_t v, int64_t first, Proposal proposal,
                                      Update update) const {
    bool r_is_p = true;
    double mass = 1.0;
    for (int64_t c = first; c >= 0; c = next_sibling[c]) {
      const int64_t x = tokens[c];
      const double rx = r_is_p ? prob(sp, p_row(v), x) : r[x] / mass;
      if (accept_token_dev(coin(c), rx, proposal(x))) return {c, x};
      __syncthreads();  // every thread has read r[x]
      double part = 0.0;
      for (int64_t y = threadIdx.x; y < a.V; y += BLOCK) {
        const double value = update(y, x, r_is_p, mass);
        r[y] = value;
        part += value;
      }
      mass = sum(part);
      r_is_p = !usable_mass(mass);
    }
    return {-1, emit(sp, v, r_is_p, mass)};
  }

  // kernels::specinfer_node: R = norm((R - q)_+) after each rejection.
  __device__ TreeDecision specinfer_node(const PosState& sp, const PosState& sq, int64_t v, int64_t first) const {
    const T* prow = p_row(v);
    const T* qrow = q_row(v);
    const float it = inv_temp();
    const auto proposal = [&](int64_t x) { return prob(sq, qrow, x); };
    const auto update = [&](int64_t y, int64_t, bool r_is_p, double mass) {
      const float lq = to_float(qrow[y]);
      if (r_is_p) return logit_residual(sp, sq, it, 1.0, to_float(prow[y]), lq);  // the fused pass of token verification
      return clipped_difference(r[y], mass, logit_prob(sq, it, lq), 1.0);  // q as an array of mass 1
    };
    return reject_walk(sp, v, first, proposal, update);
  }

  // kernels::rrs_node.
  __device__ TreeDecision rrs_node(const PosState& sp, const PosState& sq, int64_t v, int64_t first) const {
    const T* prow = p_row(v);
    const T* qrow = q_row(v);
    const float it = inv_temp();
    bool r_is_p = true, d_is_q = true;
    double mass = 1.0, d_mass = 1.0;
    for (int64_t c = first; c >= 0; c = next_sibling[c]) {
      const int64_t x = tokens[c];
      const double dx = d_is_q ? prob(sq, qrow, x) : (d_mass > 0.0 ? d[x] / d_mass : 0.0);
      const double rx = r_is_p ? prob(sp, prow, x) : r[x] / mass;
      if (accept_token_dev(coin(c), rx, dx)) return {c, x};
      __syncthreads();  // every thread has read r[x] and d[x]
      const bool fused = r_is_p && d_is_q;
      const bool later = next_sibling[c] >= 0;  // only a later sibling reads D
      // Masses the subtraction divides by: p and q as arrays have mass 1 (CPU: p.fill(r), q.fill(d)).
      const double r_div = r_is_p ? 1.0 : mass;
      const double d_div = d_is_q ? 1.0 : d_mass;
      double r_part = 0.0, d_part = 0.0;
      for (int64_t y = threadIdx.x; y < a.V; y += BLOCK) {
        const float lp = to_float(prow[y]), lq = to_float(qrow[y]);
        const double d_old = d_is_q ? logit_prob(sq, it, lq) : d[y];
        double value;
        if (fused) {
          value = logit_residual(sp, sq, it, 1.0, lp, lq);  // R = norm((p - q)_+), one pass
        } else {
          value = clipped_difference(r_is_p ? logit_prob(sp, it, lp) : r[y], r_div, d_old, d_div);
        }
        r[y] = value;
        r_part += value;
        if (later) {
          const double d_new = y == x ? 0.0 : d_old;  // D(x) = 0
          d[y] = d_new;
          d_part += d_new;
        }
      }
      mass = sum(r_part);
      r_is_p = !usable_mass(mass);
      if (later) {
        d_mass = sum(d_part);  // D = norm(D)
        d_is_q = false;
      } else if (!fused) {
        d_is_q = false;
      }
    }
    return {-1, emit(sp, v, r_is_p, mass)};
  }

  // kernels::deterministic_node: D is one-hot on the child's token; R(x) = 0, R = norm(R).
  __device__ TreeDecision deterministic_node(const PosState& sp, int64_t v, int64_t first) const {
    const T* prow = p_row(v);
    const float it = inv_temp();
    const auto proposal = [](int64_t) { return 1.0; };
    const auto update = [&](int64_t y, int64_t x, bool r_is_p, double) {
      return y == x ? 0.0 : (r_is_p ? logit_prob(sp, it, to_float(prow[y])) : r[y]);
    };
    return reject_walk(sp, v, first, proposal, update);
  }

  // kernels::typical_node (lossy): threshold min(epsilon, delta exp(-H(p))).
  __device__ TreeDecision typical_node(const PosState& sp, int64_t v, int64_t first) const {
    if (first >= 0) {
      const T* prow = p_row(v);
      __syncthreads();  // every thread is done reading r at the previous node
      double part = 0.0;
      for (int64_t y = threadIdx.x; y < a.V; y += BLOCK) {
        const double p = logit_prob(sp, inv_temp(), to_float(prow[y]));
        r[y] = p;
        if (p > 0.0) part -= p * log(p);
      }
      const double entropy = sum(part);
      const double scaled = a.params.delta * exp(-entropy);
      const double threshold = scaled < a.params.epsilon ? scaled : a.params.epsilon;  // std::min(epsilon, scaled)
      for (int64_t c = first; c >= 0; c = next_sibling[c])
        if (r[tokens[c]] > threshold) return {c, tokens[c]};
    }
    if (a.params.sample_correction) return {-1, sample_p(sp, v)};
    return {-1, sp.argmax};
  }
};

struct TreeWalkShared {
  ReduceScratch scratch;
  int32_t status;
};

template <int BLOCK, typename T>
__global__ void __launch_bounds__(BLOCK) tree_walk_kernel(const TreeArgs<T> a) {
  __shared__ TreeWalkShared sh;
  for (int64_t b = blockIdx.x; b < a.B; b += gridDim.x) {
    const int64_t N = a.N;
    const int64_t* tokens = a.tokens + b * N;
    const int64_t* parents = a.parents + b * N;
    int64_t* first_child = a.first_child + b * N;
    int64_t* next_sibling = a.next_sibling + b * N;
    int64_t* out_tokens = a.out_tokens + b * N;
    int64_t* out_nodes = a.out_nodes + b * N;
    const int64_t n = a.num_nodes[b];
    for (int64_t i = threadIdx.x; i < N; i += BLOCK) {
      out_tokens[i] = -1;
      out_nodes[i] = -1;
    }
    // 1. The tree: structure and links (one thread), then its tokens (block-parallel).
    if (threadIdx.x == 0) {
      sh.status = check_tree_row(parents, n, N);
      if (sh.status == kTreeOk) tree_links_row(parents, n, N, a.depth + b * N, first_child, next_sibling);
    }
    __syncthreads();  // status and links published
    int32_t status = sh.status;
    if (status == kTreeOk) {  // block-uniform
      int bad = 0;
      for (int64_t i = 1 + threadIdx.x; i < n; i += BLOCK) bad |= (tokens[i] < 0) | (tokens[i] >= a.V);
      if (block_reduce<BLOCK>(bad, OpOr(), sh.scratch)) status = kTreeTokenOutOfRange;
    }
    if (status == kTreeOk && tree_rule_needs_distinct_siblings(a.rule)) {  // block-uniform
      int duplicate = 0;
      for (int64_t i = 1 + threadIdx.x; i < n; i += BLOCK)
        for (int64_t s = first_child[parents[i]]; s != i; s = next_sibling[s]) duplicate |= tokens[s] == tokens[i];
      if (block_reduce<BLOCK>(duplicate, OpOr(), sh.scratch)) status = kTreeDuplicateSiblings;
    }
    int64_t accepted = 0;
    if (status == kTreeOk) {  // block-uniform
      // 2. The states of the row's real nodes.
      for (int64_t v = threadIdx.x; v < n; v += BLOCK) {
        a.target.states[b * N + v] = finish_state(a.target, b * N + v);
        if (a.reads_draft) a.draft.states[b * N + v] = finish_state(a.draft, b * N + v);
      }
      __syncthreads();  // the states are written
      // 3. The walk.
      const TreeRow<BLOCK, T> row{a, b, tokens, first_child, next_sibling, a.r + b * a.V, a.d + b * a.V,
                                    a.e + b * a.V, sh.scratch};
      if (threadIdx.x == 0) out_nodes[0] = 0;
      const bool traversal = tree_rule_is_traversal(a.rule);  // decided over whole paths (tree_traversal.cuh)
      const bool gbv = a.rule == TreeRule::kGbv;                // one picked path (tree_gbv.cuh)
      if (traversal)
        status = traversal_walk_dev<BLOCK>(row, a.rule == TreeRule::kTraversalIid, a.frames + b * N, out_tokens,
                                           out_nodes, &accepted);
      if (gbv) {
        const int64_t P = gbv_sort_size(a.V);
        double* doubles = a.gbv_doubles + b * (a.V + 6 * N + 4);
        int64_t* ints = a.gbv_ints + b * (a.V + P + 4 * N + 4);
        const GbvRowScratch g{doubles, ints, ints + a.V, P, doubles + a.V, ints + a.V + P};
        status = gbv_walk_dev<BLOCK>(row, g, out_tokens, out_nodes, &accepted);
      }
      int64_t v = 0;
      while (!traversal && !gbv) {  // the node rules
        const PosState sp = row.p_state(v);
        const int64_t first = first_child[v];
        if (sp.status != kOk) {
          status = sp.status;
          break;
        }
        PosState sq = sp;
        if (a.reads_draft && first >= 0) {
          sq = row.q_state(v);
          if (sq.status != kOk) {
            status = sq.status | kStatusInDraft;
            break;
          }
        }
        TreeDecision decision{-1, -1};
        switch (a.rule) {
          case TreeRule::kGreedy: decision = row.greedy_node(sp, first); break;
          case TreeRule::kTypical: decision = row.typical_node(sp, v, first); break;
          case TreeRule::kSpecInfer:
            decision = first >= 0 ? row.specinfer_node(sp, sq, v, first) : TreeDecision{-1, row.sample_p(sp, v)};
            break;
          case TreeRule::kRecursiveRejection:
            decision = first >= 0 ? row.rrs_node(sp, sq, v, first) : TreeDecision{-1, row.sample_p(sp, v)};
            break;
          case TreeRule::kDeterministic:
            decision = first >= 0 ? row.deterministic_node(sp, v, first) : TreeDecision{-1, row.sample_p(sp, v)};
            break;
          case TreeRule::kSpecTr:
            decision = first >= 0 ? spectr_node_dev<BLOCK>(row, sp, sq, v, first) : TreeDecision{-1, row.sample_p(sp, v)};
            break;
          case TreeRule::kSpecHub:
            decision = first >= 0 ? spechub_node_dev<BLOCK>(row, sp, sq, v, first) : TreeDecision{-1, row.sample_p(sp, v)};
            break;
          case TreeRule::kTraversal:
          case TreeRule::kTraversalIid:
          case TreeRule::kGbv: break;  // not node rules
        }
        if (decision.child >= 0) {
          if (threadIdx.x == 0) {
            out_tokens[accepted] = decision.token;
            out_nodes[accepted + 1] = decision.child;
          }
          ++accepted;
          v = decision.child;
          continue;
        }
        if (decision.token < 0) {
          status = kEmptyDistribution;
          break;
        }
        if (threadIdx.x == 0) out_tokens[accepted] = decision.token;
        break;
      }
    }
    __syncthreads();  // thread 0's output writes are done; `sh` may be reused
    if (status != kOk) {  // block-uniform: a bad row comes back as -1 everywhere
      for (int64_t i = threadIdx.x; i < N; i += BLOCK) {
        out_tokens[i] = -1;
        out_nodes[i] = -1;
      }
    }
    if (threadIdx.x == 0) {
      a.out_accepted_len[b] = status == kOk ? accepted : -1;
      a.out_status[b] = status;
    }
    __syncthreads();  // the next row rewrites `sh`
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
