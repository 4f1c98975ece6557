// SpecTr and SpecHub at one node of the tree walk (kernels/tree_verify.h), on the node's
// processed distributions as arrays. Pure C++ on raw pointers: no torch.
//
// These two rules are the optimal-transport multi-draft rules of python/specdecode/trees/
// transport.py (spectr_node, spechub_node), which stays their reference: every step here is
// that code's float64 arithmetic in its order (sequential sums, the same divisions, the same
// normalisations), so with the same coins the kernel makes the same decisions bit for bit.
// p and q are the processed distributions of specdecode.sampling.processed_probs: the row as
// LogitRow::fill writes it, divided by the sum fill returns (processed_fill below).
//
//   spectr   k children i.i.d. from q. rho = the smallest rho in [1, k] (40 bisection steps)
//            with rho beta(rho) >= 1 - (1 - beta(rho))^k, beta(rho) = sum_x min(q(x), p(x)/rho)
//            (beta from prefix sums over the tokens sorted by p/q); child x: accept iff
//            u < p(x) / (rho q(x)); emit from norm(p - c min(q, p/rho))_+,
//            c = (1 - (1 - beta)^k) / beta.
//   spechub  a = argmax q (lowest id). With fewer than two children or q(a) = 1: specinfer on
//            the first child. Else the first two children are the hub pair: with y the non-hub
//            one (the first child unless its token is a), r = q / (1 - q(a)) off a and 0 at a,
//            accept y iff u < p(y) / r(y); else the hub child iff u < p(a) / A,
//            A = sum_{x != a} (r(x) - p(x))_+; else R = (p - r)_+ with R(a) = (p(a) - A)_+,
//            normalised. Later children: recursive rejection sampling from R against
//            D = norm(q without the pair's two tokens).
// Every comparison is the half-open u < ratio, a zero denominator means "accept iff the
// numerator is > 0" (accept_token), and a residual of zero mass falls back to p (to R in
// SpecHub's later children). The emitted token is the sequential inverse CDF
// (sample_from_weights with its own total), as the reference's CoinChooser draws it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/row.h"
#include "kernels/tree_mask.h"

namespace specdecode {
namespace kernels {

// What a node rule decided: child >= 0 was accepted (token = its token); otherwise token is the
// emitted token (-1: the distribution to emit from had no mass).
struct NodeDecision {
  int64_t child;
  int64_t token;
};

// A node's children: first, then next_sibling[c] until -1; coins[c] is child c's coin and
// coins[0] the emission coin.
struct NodeChildren {
  const int64_t* tokens;
  const int64_t* next_sibling;
  const double* coins;
  int64_t first;
};

// Scratch of one node: p and q as arrays, and rows the rules work in (each of V doubles unless
// said otherwise), plus V indices.
struct TransportScratch {
  double* p;
  double* q;
  double* r;       // a residual (V)
  double* extra;   // 3 V + 2
  int64_t* order;  // V
};

// The processed distribution as specdecode.sampling.processed_probs returns it: fill, then
// divide by fill's sum (a row with a bad status comes back all zero).
template <class Dist>
inline void processed_fill(const Dist& dist, double* out, int64_t V) {
  const double total = dist.fill(out);
  if (dist.status() == kOk && total > 0.0)
    for (int64_t x = 0; x < V; ++x) out[x] /= total;
}

// Python's max(v, 0) and min(a, b) on floats (the first argument unless the second is
// strictly better). Host and device (cuda/tree_transport.cuh). Host and device (cuda/tree_transport.cuh).
SPECDECODE_TREE_HD double positive_part(double v) { return 0.0 > v ? 0.0 : v; }
SPECDECODE_TREE_HD double min_first(double a, double b) { return b < a ? b : a; }

// normalized_or of the reference: w / sum(w) in place; returns false (w untouched) when the
// sequential sum is not > 0, so the caller falls back.
inline bool normalize_in_place(double* w, int64_t V) {
  double total = 0.0;
  for (int64_t x = 0; x < V; ++x) total += w[x];
  if (!(total > 0.0)) return false;
  for (int64_t x = 0; x < V; ++x) w[x] /= total;
  return true;
}

// w = norm(w), or a copy of `fallback` when w has no mass.
inline void normalize_or(double* w, const double* fallback, int64_t V) {
  if (!normalize_in_place(w, V)) std::copy(fallback, fallback + V, w);
}

// beta(rho) = sum_x min(q(x), p(x) / rho) from prefix sums over the tokens with q > 0 sorted by
// (p/q, p, q): those with p/q < rho contribute p / rho, the others q. `s.extra` holds the
// sorted ratios [V], low_p [V + 1] and high_q [V + 1].
class SpecTrBeta {
 public:
  SpecTrBeta(const TransportScratch& s, int64_t V) : ratios_(s.extra), low_p_(s.extra + V), high_q_(s.extra + 2 * V + 1) {
    const double* p = s.p;
    const double* q = s.q;
    int64_t* order = s.order;
    double* key = low_p_;  // p/q by token id until the prefix sums overwrite it
    n_ = 0;
    for (int64_t x = 0; x < V; ++x) {
      if (q[x] > 0.0) {
        order[n_++] = x;
        key[x] = p[x] / q[x];
      }
    }
    std::sort(order, order + n_, [&](int64_t i, int64_t j) {
      if (key[i] != key[j]) return key[i] < key[j];
      if (p[i] != p[j]) return p[i] < p[j];
      return q[i] < q[j];
    });
    for (int64_t i = 0; i < n_; ++i) ratios_[i] = key[order[i]];
    low_p_[0] = 0.0;
    for (int64_t i = 0; i < n_; ++i) low_p_[i + 1] = low_p_[i] + p[order[i]];
    high_q_[n_] = 0.0;
    for (int64_t i = n_ - 1; i >= 0; --i) high_q_[i] = high_q_[i + 1] + q[order[i]];
  }

  double operator()(double rho) const {
    const int64_t i = std::lower_bound(ratios_, ratios_ + n_, rho) - ratios_;
    return low_p_[i] / rho + high_q_[i];
  }

 private:
  double* ratios_;
  double* low_p_;
  double* high_q_;
  int64_t n_ = 0;
};

// Bisection steps of spectr_rho (transport.py RHO_STEPS).
constexpr int kSpecTrRhoSteps = 40;

// spectr_rho of the reference: the smallest rho in [1, k] (to k 2^-40) that passes the check.
inline double spectr_rho(const TransportScratch& s, int64_t V, int64_t k) {
  if (k <= 1) return 1.0;
  const SpecTrBeta beta(s, V);
  const double power = static_cast<double>(k);
  const auto feasible = [&](double rho) {
    const double b = beta(rho);
    return rho * b >= 1.0 - std::pow(1.0 - b, power);
  };
  if (feasible(1.0)) return 1.0;
  double lo = 1.0, hi = power;
  for (int step = 0; step < kSpecTrRhoSteps; ++step) {
    const double mid = (lo + hi) / 2.0;
    if (feasible(mid)) hi = mid;
    else lo = mid;
  }
  return hi;
}

// spectr_node of the reference; s.p, s.q filled (processed_fill), a node with children.
inline NodeDecision spectr_node(const NodeChildren& kids, const TransportScratch& s, int64_t V) {
  const double* p = s.p;
  const double* q = s.q;
  int64_t k = 0;
  for (int64_t c = kids.first; c >= 0; c = kids.next_sibling[c]) ++k;
  const double rho = spectr_rho(s, V, k);
  for (int64_t c = kids.first; c >= 0; c = kids.next_sibling[c]) {
    const int64_t x = kids.tokens[c];
    if (accept_token(kids.coins[c], p[x], rho * q[x])) return {c, x};
  }
  double beta = 0.0;
  for (int64_t x = 0; x < V; ++x) beta += min_first(q[x], p[x] / rho);
  const double scale = beta > 0.0 ? (1.0 - std::pow(1.0 - beta, static_cast<double>(k))) / beta : 0.0;
  double* residual = s.r;
  for (int64_t x = 0; x < V; ++x) residual[x] = positive_part(p[x] - scale * min_first(q[x], p[x] / rho));
  normalize_or(residual, p, V);
  return {-1, sample_from_weights(residual, V, kids.coins[0])};
}

// specinfer_node of the reference on the first child only (SpecHub without a pair).
inline NodeDecision spechub_single(const NodeChildren& kids, const TransportScratch& s, int64_t V) {
  const double* p = s.p;
  const double* q = s.q;
  if (kids.first < 0) return {-1, sample_from_weights(p, V, kids.coins[0])};
  const int64_t x = kids.tokens[kids.first];
  if (accept_token(kids.coins[kids.first], p[x], q[x])) return {kids.first, x};
  double* residual = s.r;
  for (int64_t y = 0; y < V; ++y) residual[y] = positive_part(p[y] - q[y]);
  normalize_or(residual, p, V);
  return {-1, sample_from_weights(residual, V, kids.coins[0])};
}

// rrs_node of the reference from the third child on: target R (s.r, normalised; also the
// fallback), proposal D; works in s.extra (R' [V], D [V]).
inline NodeDecision spechub_rest(const NodeChildren& kids, const TransportScratch& s, int64_t V, int64_t third) {
  const double* hub_residual = s.r;
  double* running = s.extra;
  double* d = s.extra + V;
  std::copy(hub_residual, hub_residual + V, running);
  for (int64_t c = third; c >= 0; c = kids.next_sibling[c]) {
    const int64_t x = kids.tokens[c];
    if (accept_token(kids.coins[c], running[x], d[x])) return {c, x};
    for (int64_t y = 0; y < V; ++y) running[y] = positive_part(running[y] - d[y]);
    normalize_or(running, hub_residual, V);
    d[x] = 0.0;
    normalize_in_place(d, V);
  }
  return {-1, sample_from_weights(running, V, kids.coins[0])};
}

// spechub_node of the reference; s.p, s.q filled (processed_fill).
inline NodeDecision spechub_node(const NodeChildren& kids, const TransportScratch& s, int64_t V) {
  const double* p = s.p;
  const double* q = s.q;
  const int64_t a = argmax_lowest_double(q, V);
  const int64_t first = kids.first;
  const int64_t second = first >= 0 ? kids.next_sibling[first] : -1;
  if (second < 0 || !(q[a] < 1.0)) return spechub_single(kids, s, V);
  const int64_t x1 = kids.tokens[first], x2 = kids.tokens[second];
  const bool first_is_hub = x1 == a;
  const int64_t hub_child = first_is_hub ? first : second;
  const int64_t other_child = first_is_hub ? second : first;
  const int64_t y = kids.tokens[other_child];
  const double rest = 1.0 - q[a];
  const auto r = [&](int64_t x) { return x != a ? q[x] / rest : 0.0; };
  if (accept_token(kids.coins[other_child], p[y], r(y))) return {other_child, y};
  double excess = 0.0;  // A
  for (int64_t x = 0; x < V; ++x)
    if (x != a) excess += positive_part(r(x) - p[x]);
  if (accept_token(kids.coins[hub_child], p[a], excess)) return {hub_child, kids.tokens[hub_child]};
  double* residual = s.r;
  for (int64_t x = 0; x < V; ++x) residual[x] = positive_part(p[x] - r(x));
  residual[a] = positive_part(p[a] - excess);
  normalize_or(residual, p, V);
  const int64_t third = kids.next_sibling[second];
  if (third < 0) return {-1, sample_from_weights(residual, V, kids.coins[0])};
  double* d = s.extra + V;
  std::copy(q, q + V, d);
  d[x1] = 0.0;
  d[x2] = 0.0;
  normalize_or(d, q, V);
  return spechub_rest(kids, s, V, third);
}

}  // namespace kernels
}  // namespace specdecode
