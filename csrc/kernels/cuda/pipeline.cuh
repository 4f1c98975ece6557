// The data every kernel of the verification / sampling pipeline shares: sizes, the scratch
// layout, per-chunk and per-position records, and the row helpers (which positions a row
// reads, its coins, the processed probability of one token). Torch-free.
//
// How one call is split over the GPU (every step a separate kernel launch, so each step only
// reads what earlier launches wrote; no grid-wide synchronisation and no atomics across blocks):
//
//   stats     (logits)  one block per (row unit, chunk of kChunk entries): max, NaN/+inf flag,
//                       lowest argmax, the chunk's normaliser relative to its own max, and for
//                       top-k / top-p / min-p a list of its largest entries. A "row unit" is one
//                       target position (b, i <= n) or draft position (b, i < n).
//   filter merge        (filters) one block per unit: global max, the top-k / top-p / min-p
//                       threshold from the chunk lists, exact whenever the lists provably hold
//                       every entry that matters (filters.cuh); otherwise the unit is left
//                       pending for one of the next three steps;
//   exact mass + merge  (top-p alone) for units whose approximate kept mass cannot decide the
//                       top-p group: the exact mass, then the merge again;
//   fallback            (top-k / top-p) one block per unit the lists could not decide: the
//                       thresholds by radix select over the whole row (exact, slower);
//   masked sum          (filters) the normaliser of units whose kept set the lists did not cover;
//   decide 1            one block per batch row: validates the row (num_draft_tokens,
//                       draft_tokens), finishes every position's state (max, threshold,
//                       1/normaliser), reads p_i(x_i) / q_i(x_i), and makes every decision that
//                       needs no further pass over a row;
//   position pass       (block, typical, top-beta, greedy on probabilities) one block per
//                       (row, position, chunk) that the rule still needs: block verification's
//                       residual masses Z_i, entropies, counts, argmax;
//   decide 2            the remaining decisions;
//   sample 1 / sample 2 the emitted token: chunk masses of the one distribution that is sampled
//                       (residual or p), then one block per row finds the chunk and, inside it,
//                       the token by an exact prefix sum in index order (two-level inverse CDF).
// Which kernels run depends on the task, rule and sampling settings only (launch.cuh), so a
// call can be captured in a CUDA graph; a step with nothing to do for a unit exits at once.
//
// Rounding, relative to the CPU ops. The numerical rules hold exactly: comparisons are
// half-open and a zero-probability token is never accepted or sampled.
//   * exact, bit for bit: every logit threshold (top-k, top-p, min-p), every e = exp((l-max)/T)
//     that enters a decision, p_i(x_i) and q_i(x_i) given the normaliser, the block weights
//     w_i, argmax, the top-beta counts, and which tokens have positive weight;
//   * the normaliser sum(e) (the CPU sums float32 partials of 2048 entries, the GPU sums per
//     chunk and rescales chunks by exp(chunk max - max)): about 1e-7..1e-6 relative;
//   * chunk-level sums used only to locate a crossing (block Z_i, entropies, the first level of
//     the inverse CDF) use a fast exp: absolute error below ~1e-6 in probability units;
//     the second level of the inverse CDF is exact inside the chosen chunk.
// A decision can therefore differ from the CPU's only when its coin lies within ~1e-6 of the
// threshold (tests/cuda_agreement.py states the agreement the tests require).
#pragma once

#include <cstdint>

#include "kernels/common.h"
#include "kernels/cuda/block_utils.cuh"
#include "kernels/cuda/verify.cuh"
#include "kernels/philox.h"

namespace specdecode {
namespace kernels {
namespace cuda {

// ------------------------------------------------------------------------------ sizes
constexpr int kPassThreads = 256;                          // threads of every per-chunk kernel
constexpr int kPassMinBlocks = 3;                          // resident blocks per SM they are compiled for
constexpr int kChunk = 8192;                               // entries per chunk (stats, passes)
constexpr int kSampleChunk = 2048;                         // entries per chunk (sampling)
constexpr int kRowThreads = 128;                           // threads of the per-row kernels
constexpr int kMergeThreads = 256;                         // filter merge / fallback
constexpr int kListCap = 512;                              // listed entries per chunk at most
constexpr int kMergeCap = 8192;                            // entries one unit's merge can hold
constexpr int kListTargetTopP = 64;                        // list depth for top-p without top-k
constexpr int64_t kTopKFromLists = 128;                    // top-k up to this resolves from lists
constexpr float kTopPListDepthBits = 14.0f;                // top-p alone: list entries >= 2^-14 max
// Relative bound on |approximate row mass - the CPU's exact one| (fast-exp error 2.5e-5, float
// partial sums of 32 entries 2e-6, fast_exp vs exp 2e-7), with a safety factor of three.
constexpr double kApproxMassTolerance = 1e-4;
constexpr unsigned kMaxGridBlocks = 1u << 30;              // grid-stride loops beyond this

// ------------------------------------------------------------------------------ records
// What the stats kernel learns about one chunk of one row unit (logits).
struct ChunkStats {
  double sum;          // sum over the chunk of exp((l - max) / T), max = this chunk's max (fast exp)
  int64_t argmax;      // lowest row index with l == max; kNoIndex if the chunk is all NaN
  float max;           // largest non-NaN logit (-inf if none)
  float next;          // lists: the largest entry NOT listed (-inf if every finite entry is)
  int32_t bad;         // a NaN or +inf was seen
  int32_t list_count;  // lists: entries listed, -1 when they did not fit (kListCap)
};

// The processed distribution of one row unit: p(x) = l(x) >= keep ? e(x) * inv_norm : 0, e(x) =
// fast_exp((l(x) - max) * inv_temp). Every filter is folded into `keep` (min-p through the
// monotonicity of fast_exp: e >= min_p <=> l >= the smallest such logit).
struct PosState {
  double inv_norm;
  int64_t argmax;      // lowest index of the max logit
  float max_logit;
  float keep;          // -inf = keep everything
  int32_t status;      // RowStatus of the row itself (kNonFiniteLogit, kEmptyDistribution)
  int32_t pending;     // kPending*: later kernels finish the state
};
constexpr int32_t kPendingThresholds = 1;  // the fallback computes `keep`
constexpr int32_t kPendingNorm = 2;        // the masked sum computes the normaliser
constexpr int32_t kPendingTotal = 4;       // top-p needs the exact kept mass (masked sum, then merge again)

// One position-pass chunk result.
struct PosAgg {
  double sum;          // block: residual mass; typical: sum of p log p
  double best_value;   // probabilities: argmax value (non-NaN)
  int64_t best_index;  // its lowest index, kNoIndex if none
  int64_t count;       // top-beta: entries with p > p(x)
};

enum EmitKind : int32_t {
  kEmitNone = 0,      // y is decided (or the row failed)
  kEmitTarget = 1,    // y ~ p at `pos`
  kEmitResidual = 2,  // y ~ norm((weight * p - q)_+) at `pos`, p at `pos` when that has no mass
};

// The outcome of the decisions for one batch row.
struct RowPlan {
  double weight;
  int64_t tau;     // accepted drafts
  int64_t y;       // the emitted token when kEmitNone, else -1
  int64_t pos;     // the position the emitted token is drawn at
  int32_t status;  // kOk or the row's error
  int32_t emit;    // EmitKind
};

// First level of the inverse CDF: one sampling chunk of the emitted distribution.
struct SampleChunkSums {
  double residual;       // chunk mass of the residual (fast exp for logits)
  double target;         // chunk mass of p (fast exp for logits)
  int64_t last_residual; // last index whose exact residual weight is > 0, -1 if none
  int64_t last_target;   // last index whose exact p is > 0, -1 if none
};

// Sampling settings as the kernels use them (prepared on the host).
struct LogitConfig {
  float inv_temp;    // float(1 / temperature), as LogitRow
  float min_e;       // float(min_p); 0 = min-p off
  int64_t top_k;     // 0 = off (also when >= V)
  double top_p;      // 1 = off
  int32_t list_target;  // how many of its largest entries a chunk lists (top list mode)
  float list_depth;     // top list mode also lists entries with (l - max) / T * log2(e) >= this
                        // (top-p without top-k: -kTopPListDepthBits; -inf = off)
  bool filters() const { return top_k > 0 || top_p < 1.0 || min_e > 0.0f; }
};

enum class StatsMode : int32_t {
  kArgmax = 0,     // greedy: max, argmax, status only
  kSum = 1,        // plus the normaliser
  kSumTopList = 2, // plus a list of the chunk's largest entries (top-k / top-p)
  kSumMinPList = 3 // plus a list of the entries min-p may keep (min-p only)
};

// ------------------------------------------------------------------------------ arguments
template <typename T>
struct Args {
  const T* target;
  const T* draft;
  const int64_t* draft_tokens;
  const int64_t* num_draft_tokens;
  Coins coins;
  int64_t B, G, V;
  int64_t chunks;         // ceil(V / kChunk)
  int64_t sample_chunks;  // ceil(V / kSampleChunk)
  Task task;
  Rule rule;
  RuleParams params;
  LogitConfig logit;
  StatsMode stats_mode;   // what the stats kernel computed (logits)
  bool merged;            // the filter kernels wrote the states (logits with filters)
  bool greedy;
  bool has_draft;
  bool is_logits;
  int64_t* out_tokens;
  int64_t* out_accepted_len;
  int32_t* out_status;
  // scratch
  ChunkStats* stats;        // [units, chunks]
  float* lists;             // [units, chunks, kListCap]
  double* masked_sums;      // [units, chunks]
  PosState* states;         // [units]
  double* px;               // [B, G] p_i(x_i)
  double* qx;               // [B, G] q_i(x_i)
  double* weights;          // [B, G+1] block verification w_i
  int32_t* pass_flags;      // [B, G+1] positions the position pass computes
  PosAgg* aggs;             // [B, G+1, chunks]
  RowPlan* plans;           // [B]
  SampleChunkSums* sample;  // [B, sample_chunks]
  // Set by the tree kernels (tree_walk.cuh) only: row b then needs target units
  // 0..unit_counts[b]-1 (a tree's node slots; none when the count is outside [1, G+1]) and
  // num_draft_tokens is not read.
  const int64_t* unit_counts = nullptr;

  __host__ __device__ int64_t target_units() const { return B * (G + 1); }
  __host__ __device__ int64_t draft_units() const { return has_draft ? B * G : 0; }
  __host__ __device__ int64_t units() const { return target_units() + draft_units(); }
  __host__ __device__ int64_t target_unit(int64_t b, int64_t i) const { return b * (G + 1) + i; }
  __host__ __device__ int64_t draft_unit(int64_t b, int64_t i) const { return target_units() + b * G + i; }
};

struct UnitId {
  int64_t b;
  int64_t i;
  bool draft;
};

template <typename T>
__device__ __forceinline__ UnitId decode_unit(const Args<T>& a, int64_t unit) {
  if (unit < a.target_units()) return UnitId{unit / (a.G + 1), unit % (a.G + 1), false};
  const int64_t d = unit - a.target_units();
  return UnitId{d / a.G, d % a.G, true};
}

template <typename T>
__device__ __forceinline__ const T* unit_row(const Args<T>& a, const UnitId& u) {
  return u.draft ? a.draft + (u.b * a.G + u.i) * a.V : a.target + (u.b * (a.G + 1) + u.i) * a.V;
}

// n for row b, or -1 when num_draft_tokens[b] is out of [0, gamma] (the row then reads nothing).
template <typename T>
__device__ __forceinline__ int64_t row_num_draft(const Args<T>& a, int64_t b) {
  if (a.unit_counts != nullptr) {
    const int64_t count = a.unit_counts[b];
    return (count >= 1 && count <= a.G + 1) ? count - 1 : -1;
  }
  if (a.num_draft_tokens == nullptr) return 0;
  const int64_t n = a.num_draft_tokens[b];
  return (n >= 0 && n <= a.G) ? n : -1;
}

// Whether any kernel may read this unit: target positions 0..n and draft positions 0..n-1.
template <typename T>
__device__ __forceinline__ bool unit_needed(const Args<T>& a, const UnitId& u) {
  const int64_t n = row_num_draft(a, u.b);
  if (n < 0) return false;
  return u.draft ? u.i < n : u.i <= n;
}

// Coin (b, column), column in [0, gamma]: uniforms[b, column] or Philox.
template <typename T>
__device__ __forceinline__ double row_coin(const Args<T>& a, int64_t b, int64_t column) {
  if (a.coins.uniforms != nullptr) return a.coins.uniforms[b * (a.G + 1) + column];
  return philox_uniform(static_cast<uint64_t>(*a.coins.philox_seed), static_cast<uint64_t>(*a.coins.philox_offset),
                        static_cast<uint64_t>(b), static_cast<uint64_t>(column));
}

// ------------------------------------------------------------------------------ probabilities
// p(x) of one entry exactly as the CPU's LogitRow::prob / fill computes it.
__device__ __forceinline__ double logit_prob(const PosState& s, float inv_temp, float logit) {
  if (s.status != kOk || !(logit >= s.keep)) return 0.0;
  return __dmul_rn(static_cast<double>(scaled_exp(logit, s.max_logit, inv_temp)), s.inv_norm);
}

// The residual max(w p(x) - q(x), 0) of one entry exactly as LogitRow::residual (logit_loops.h
// residual_body) rounds it: e_p * (w * inv_norm_p) - e_q * inv_norm_q; 0 if either row is bad.
__device__ __forceinline__ double logit_residual(const PosState& sp, const PosState& sq, float inv_temp, double w,
                                                 float lp, float lq) {
  if (sp.status != kOk || sq.status != kOk) return 0.0;
  const double wp_norm = __dmul_rn(w, sp.inv_norm);
  const double ep = static_cast<double>(scaled_exp(lp, sp.max_logit, inv_temp));
  const double eq = static_cast<double>(scaled_exp(lq, sq.max_logit, inv_temp));
  const double p = lp >= sp.keep ? __dmul_rn(ep, wp_norm) : 0.0;
  const double q = lq >= sq.keep ? __dmul_rn(eq, sq.inv_norm) : 0.0;
  const double r = __dsub_rn(p, q);
  return r > 0.0 ? r : 0.0;
}

// ProbRow::residual of one entry: max(w p - q, 0), product and difference rounded apart.
__device__ __forceinline__ double prob_residual(double w, double p, double q) {
  const double r = __dsub_rn(__dmul_rn(w, p), q);
  return r > 0.0 ? r : 0.0;
}

// The smallest logit l with fast_exp((l - max) * inv_temp) >= min_e (min_e in (0, 1]): since
// that function of l is non-decreasing (checked exhaustively for every float z in [-88, 0]),
// "e >= min_e" is exactly "l >= this threshold". Search over the ordered float keys between
// -inf (e = 0 < min_e) and max (e = 1 >= min_e), starting at the exact-exp estimate
// max + T log(min_e): an exponential search brackets the answer (a few keys away, since
// fast_exp is within ~2e-7 of exp), then bisection. Every step evaluates fast_exp exactly as
// the CPU does, so the result is exact whatever the estimate. Per thread.
__device__ __forceinline__ float min_p_logit_threshold(float max_logit, float inv_temp, float min_e) {
  const uint32_t floor_key = float_to_key(-float_inf());  // predicate false here
  const uint32_t top_key = float_to_key(max_logit);       // predicate true here
  auto keeps = [&](uint32_t key) { return scaled_exp(key_to_float(key), max_logit, inv_temp) >= min_e; };
  const double estimate = static_cast<double>(max_logit) + log(static_cast<double>(min_e)) / static_cast<double>(inv_temp);
  uint32_t guess = float_to_key(static_cast<float>(estimate));
  guess = guess <= floor_key ? floor_key + 1 : (guess > top_key ? top_key : guess);
  uint32_t lo, hi;
  if (keeps(guess)) {
    hi = guess;
    uint32_t step = 1;
    lo = hi - floor_key > step ? hi - step : floor_key;
    while (lo > floor_key && keeps(lo)) {
      hi = lo;
      step = step < (1u << 30) ? step * 2 : step;
      lo = hi - floor_key > step ? hi - step : floor_key;
    }
  } else {
    lo = guess;
    uint32_t step = 1;
    hi = top_key - lo > step ? lo + step : top_key;
    while (hi < top_key && !keeps(hi)) {
      lo = hi;
      step = step < (1u << 30) ? step * 2 : step;
      hi = top_key - lo > step ? lo + step : top_key;
    }
  }
  // Invariant: the predicate is false at lo (or lo = floor_key) and true at hi.
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (keeps(mid)) hi = mid;
    else lo = mid;
  }
  return key_to_float(hi);
}

// The mass sum_x exp((l(x) - max) / T) of a whole row from its chunk stats: each chunk's sum
// (relative to its own max, fast exp) rescaled by exp((chunk max - max) / T) in float64, chunks
// in order. Within kApproxMassTolerance (relative) of the CPU's sum of its exact float e's.
template <typename T>
__device__ __forceinline__ double approx_row_mass(const Args<T>& a, int64_t unit, float max_logit) {
  const ChunkStats* stats = a.stats + unit * a.chunks;
  double total = 0.0;
  for (int64_t c = 0; c < a.chunks; ++c) {
    const ChunkStats st = stats[c];
    if (st.max > -float_inf()) {
      const double shift = (static_cast<double>(st.max) - static_cast<double>(max_logit)) * a.logit.inv_temp;
      total += st.sum * exp(shift);
    }
  }
  return total;
}

// ------------------------------------------------------------------------------ outputs
// Writes row b's outputs from its plan and the emitted token y (the last kernel of a call).
template <int BLOCK, typename T>
__device__ __forceinline__ void write_row_outputs(const Args<T>& a, int64_t b, const RowPlan& plan, int64_t y) {
  const bool ok = plan.status == kOk && y >= 0;
  const int32_t status = plan.status != kOk ? plan.status : (y >= 0 ? static_cast<int32_t>(kOk)
                                                                    : static_cast<int32_t>(kEmptyDistribution));
  int64_t* tokens = a.out_tokens + b * (a.G + 1);
  const int64_t* drafts = a.draft_tokens != nullptr ? a.draft_tokens + b * a.G : nullptr;
  for (int64_t j = threadIdx.x; j <= a.G; j += BLOCK)
    tokens[j] = !ok ? -1 : (j < plan.tau ? drafts[j] : (j == plan.tau ? y : -1));
  if (threadIdx.x == 0) {
    if (a.out_accepted_len != nullptr) a.out_accepted_len[b] = ok ? plan.tau : -1;
    a.out_status[b] = status;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
