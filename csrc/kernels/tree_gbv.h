// Greedy multi-path block verification (the tree rule gbv) of one row. Pure C++ on raw
// pointers: no torch.
//
// python/specdecode/trees/multipath.py (gbv_row) is the reference, and this kernel does its
// float64 arithmetic in its order on the processed distributions (processed_fill), so with the
// same coins it makes the same decisions bit for bit. The tree must be K chains of one length L
// below the root (gbv_paths checks it). Going down the positions i = 0..L-1 with the set S of
// paths that agree with the picked prefix and the distribution `state` of |S|:
//   * the context node's p, q; the priority of the tokens with q > 0 (p/q descending, lowest id
//     on ties) and G(b), the q-mass of b and every token ranked below it;
//   * the law of the "best present token" pick, law(b) = sum_m state[m] (G(b)^m - (G(b) - q(b))^m),
//     against the "first path" pick, law = q: the one whose overlap sum_x min(p(x), law(x)) is
//     larger (ties: first) picks b, S keeps the paths that carry b, state is updated by Bayes;
// then block verification of the picked path against the laws: w_i = min(1, w_{i-1} p_i(x_i) /
// law_i(x_i)), accept the longest prefix i whose coin (the picked node's) is below h_i
// (h_L = w_L, h_i = Z_i / (Z_i + 1 - w_i), Z_i = sum (w_i p_{i+1} - law_{i+1})_+), emit from
// norm((w_tau p_{tau+1} - law_{tau+1})_+) (p_{tau+1} when it has no mass), or from p after the
// whole path. A position's law is recomputed from its state when the verification needs it
// again, so memory is O(V + N).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/row.h"
#include "kernels/tree_transport.h"

namespace specdecode {
namespace kernels {

// The K root-to-leaf paths of a row: paths[j * L + i] is path j's node at position i (paths in
// the order of the root's children). Returns false when the row is not K chains of one length.
SPECDECODE_TREE_HD bool gbv_paths(const int64_t* first_child, const int64_t* next_sibling, int64_t* paths, int64_t* num_paths,
                      int64_t* length) {
  int64_t K = 0, L = -1;
  for (int64_t head = first_child[0]; head >= 0; head = next_sibling[head], ++K) {
    int64_t len = 0;
    for (int64_t v = head; v >= 0; v = first_child[v]) {
      if (first_child[v] >= 0 && next_sibling[first_child[v]] >= 0) return false;  // a fork
      if (L >= 0 && len >= L) return false;  // longer than the first path
      paths[K * (L >= 0 ? L : 0) + len] = v;  // the first path is written at offset 0
      ++len;
    }
    if (L < 0) L = len;
    else if (len != L) return false;
  }
  *num_paths = K;
  *length = K > 0 ? L : 0;
  return true;
}

// Scratch of gbv: rows of V and small arrays (sizes in the comments; N = the slots of a row).
struct GbvScratch {
  double* p;      // V
  double* q;      // V
  double* law;    // V (then the residual)
  double* below;  // V: G
  double* rank;   // V: priority rank of each token (the drawable count for q = 0)
  int64_t* order; // V
  double* small;  // 4 N + 4: state rows, weights
  int64_t* small_int;  // 4 N + 2: paths, alive, picked, modes
};

// The priority of the tokens with q > 0 (p/q descending, lowest id on ties): G and the ranks.
inline void gbv_priority(const double* p, const double* q, int64_t V, const GbvScratch& s) {
  double* key = s.rank;  // -(p/q) by token id until the ranks overwrite it
  int64_t n = 0;
  for (int64_t x = 0; x < V; ++x) {
    if (q[x] > 0.0) {
      s.order[n++] = x;
      key[x] = -(p[x] / q[x]);
    }
  }
  std::sort(s.order, s.order + n, [&](int64_t i, int64_t j) {
    if (key[i] != key[j]) return key[i] < key[j];
    return i < j;
  });
  for (int64_t x = 0; x < V; ++x) {
    s.below[x] = 0.0;
    s.rank[x] = static_cast<double>(n);
  }
  double running = 0.0;
  for (int64_t r = n - 1; r >= 0; --r) {
    const int64_t x = s.order[r];
    running = running + q[x];
    s.below[x] = running;
    s.rank[x] = static_cast<double>(r);
  }
}

// law(b) of the "best" pick for |S| distributed as state[0..K] (gbv_priority done).
inline void gbv_best_law(const double* q, const double* state, int64_t K, int64_t V, const GbvScratch& s) {
  for (int64_t b = 0; b < V; ++b) {
    double total = 0.0;
    if (q[b] > 0.0) {
      const double g = s.below[b], rest = s.below[b] - q[b];
      for (int64_t m = 1; m <= K; ++m)
        if (state[m] != 0.0)
          total += state[m] * (std::pow(g, static_cast<double>(m)) - std::pow(rest, static_cast<double>(m)));
    }
    s.law[b] = total;
  }
}

// Loads position i: p, q of `context` (processed), and the law of `mode` (1: best, 0: first)
// for `state`. Returns the status of the rows read.
template <class Dist>
inline int32_t gbv_load(const Dist& p_row, const Dist& q_row, const double* state, int64_t K, int64_t V,
                        int64_t mode, const GbvScratch& s) {
  processed_fill(p_row, s.p, V);
  if (p_row.status() != kOk) return p_row.status();
  processed_fill(q_row, s.q, V);
  if (q_row.status() != kOk) return q_row.status() | kStatusInDraft;
  gbv_priority(s.p, s.q, V, s);
  if (mode == 1) gbv_best_law(s.q, state, K, V, s);
  else std::copy(s.q, s.q + V, s.law);
  return kOk;
}

// comb(m, n) as the double nearest the integer (exact while it fits in 64 bits: m <= 62).
SPECDECODE_TREE_HD double gbv_comb(int64_t m, int64_t n) {
  uint64_t c = 1;
  for (int64_t k = 1; k <= n; ++k) c = c * static_cast<uint64_t>(m - n + k) / static_cast<uint64_t>(k);
  return static_cast<double>(c);
}

// _advance of the reference: the distribution of |S| after token b was picked with `mode`. Host
// and device (pow is the C library's on the host, as Python's float ** int).
SPECDECODE_TREE_HD void gbv_advance(const double* q, const double* below, const double* state, int64_t K, int64_t mode, int64_t b,
                        double* next) {
  for (int64_t n = 0; n <= K; ++n) next[n] = 0.0;
  for (int64_t m = 1; m <= K; ++m) {
    const double st = state[m];
    if (st == 0.0) continue;
    for (int64_t n = 1; n <= m; ++n) {
      double weight;
      if (mode == 1) {
        weight = gbv_comb(m, n) * pow(q[b], static_cast<double>(n)) * pow(below[b] - q[b], static_cast<double>(m - n));
      } else {
        weight = q[b] * gbv_comb(m - 1, n - 1) * pow(q[b], static_cast<double>(n - 1)) *
                 pow(1.0 - q[b], static_cast<double>(m - n));
      }
      next[n] = next[n] + st * weight;
    }
  }
  double total = 0.0;
  for (int64_t n = 0; n <= K; ++n) total += next[n];
  if (total > 0.0)
    for (int64_t n = 0; n <= K; ++n) next[n] /= total;
}

// gbv_row of the reference on one valid row whose shape passed gbv_paths (K paths of length L
// in s.small_int). coins[c] is node c's coin, coins[0] the emission coin. Writes the path's
// tokens then the emitted one to out_tokens and the path to out_nodes (pre-filled with -1).
template <class Dist>
inline RowResult gbv_verify_row(const Dist* target, const Dist* draft, const int64_t* tokens, const double* coins,
                                int64_t K, int64_t L, int64_t V, const GbvScratch& s, int64_t* out_tokens,
                                int64_t* out_nodes) {
  out_nodes[0] = 0;
  if (K == 0) {
    processed_fill(target[0], s.p, V);
    if (target[0].status() != kOk) return {0, target[0].status()};
    return emit(out_tokens, 0, sample_from_weights(s.p, V, coins[0]));
  }
  const int64_t* paths = s.small_int;  // [K, L]
  int64_t* alive = s.small_int + K * L;  // [K]
  int64_t* picked = alive + K;           // [L]
  int64_t* modes = picked + L;           // [L]
  double* states = s.small;              // [L + 1, K + 1]: the state before each position, then the last
  double* weights = states + (L + 1) * (K + 1);  // [L + 1]
  double* chosen_p = weights + L + 1;    // [L]: p_i(x_i)
  double* chosen_law = chosen_p + L;     // [L]: law_i(x_i)
  for (int64_t m = 0; m <= K; ++m) states[m] = m == K ? 1.0 : 0.0;
  int64_t num_alive = K;
  for (int64_t j = 0; j < K; ++j) alive[j] = j;
  int64_t context = 0;
  for (int64_t i = 0; i < L; ++i) {
    const double* state = states + i * (K + 1);
    int32_t status = gbv_load(target[context], draft[context], state, K, V, 1, s);
    if (status != kOk) return {i, status};
    double overlap_best = 0.0, overlap_first = 0.0;
    for (int64_t x = 0; x < V; ++x) overlap_best += min_first(s.p[x], s.law[x]);
    for (int64_t x = 0; x < V; ++x) overlap_first += min_first(s.p[x], s.q[x]);
    const int64_t mode = overlap_best > overlap_first ? 1 : 0;
    modes[i] = mode;
    int64_t b = tokens[paths[alive[0] * L + i]];
    if (mode == 1) {  // the present token of the best rank (the first one on ties)
      for (int64_t j = 1; j < num_alive; ++j) {
        const int64_t x = tokens[paths[alive[j] * L + i]];
        if (s.rank[x] < s.rank[b]) b = x;
      }
    }
    chosen_p[i] = s.p[b];
    chosen_law[i] = mode == 1 ? s.law[b] : s.q[b];
    int64_t kept = 0;
    for (int64_t j = 0; j < num_alive; ++j)
      if (tokens[paths[alive[j] * L + i]] == b) alive[kept++] = alive[j];
    num_alive = kept;
    gbv_advance(s.q, s.below, state, K, mode, b, states + (i + 1) * (K + 1));
    context = paths[alive[0] * L + i];
    picked[i] = context;
  }
  // Block verification of the picked path against the laws.
  weights[0] = 1.0;
  for (int64_t i = 0; i < L; ++i) {
    const double px = chosen_p[i], qx = chosen_law[i];
    const double w = qx > 0.0 ? weights[i] * px / qx : (px > 0.0 ? 1.0 : 0.0);
    weights[i + 1] = w < 1.0 ? w : 1.0;
  }
  // Position i's rows: p of its context (the root, then the picked nodes), its law.
  const auto load = [&](int64_t i) {
    const int64_t node = i == 0 ? 0 : picked[i - 1];
    return gbv_load(target[node], draft[node], states + i * (K + 1), K, V, modes[i], s);
  };
  int64_t tau = 0;
  for (int64_t i = L; i >= 1; --i) {
    double h = weights[L];
    if (i < L) {
      const int32_t status = load(i);
      if (status != kOk) return {0, status};
      double z = 0.0;
      for (int64_t x = 0; x < V; ++x) z += positive_part(weights[i] * s.p[x] - s.law[x]);
      const double denominator = z + 1.0 - weights[i];
      h = denominator > 0.0 ? z / denominator : 1.0;
    }
    if (coins[picked[i - 1]] < h) {
      tau = i;
      break;
    }
  }
  for (int64_t i = 0; i < tau; ++i) {
    out_nodes[i + 1] = picked[i];
    out_tokens[i] = tokens[picked[i]];
  }
  if (tau == L) {
    const Dist& last = target[picked[L - 1]];
    processed_fill(last, s.p, V);
    if (last.status() != kOk) return {tau, last.status()};
    return emit(out_tokens, tau, sample_from_weights(s.p, V, coins[0]));
  }
  const int32_t status = load(tau);
  if (status != kOk) return {tau, status};
  for (int64_t x = 0; x < V; ++x) s.law[x] = positive_part(weights[tau] * s.p[x] - s.law[x]);
  normalize_or(s.law, s.p, V);
  return emit(out_tokens, tau, sample_from_weights(s.law, V, coins[0]));
}

}  // namespace kernels
}  // namespace specdecode
