// The two ways a verification kernel sees one distribution over the vocabulary:
//   ProbRow   - probabilities already in memory (the `verify` op);
//   LogitRow  - raw logits plus sampling settings (the `verify_logits` op), turned into the
//               processed distribution on demand: temperature, then top-k, then top-p, then
//               min-p, each renormalising, exactly as the PyTorch reference documents.
// Rules are templates over these, so one rule file serves both ops. Pure C++: no torch.
//
// Interface every distribution offers (the rules, sample.h and the tree kernels use only this):
//   prob(x), fill(out), argmax(), residual(draft, w, out), status(), vocab_size(), and the
//   static sample_weights(w, V, u, total): the inverse-CDF draw over weights this kind of row
//   wrote with fill() / residual().
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

#include "kernels/common.h"
#include "kernels/logit_loops.h"

namespace specdecode {
namespace kernels {

template <typename T>
inline double to_double(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double to_double<double>(double v) {
  return v;
}

// Per-thread scratch buffers, each of V elements.
struct Workspace {
  double* a = nullptr;
  double* b = nullptr;
  float* select = nullptr;  // only LogitRow with top-k / top-p uses it
};

template <typename T>
class ProbRow {
 public:
  ProbRow() = default;
  ProbRow(const T* data, int64_t vocab_size) : data_(data), V_(vocab_size) {}

  double prob(int64_t x) const { return to_double(data_[x]); }
  // Writes the row as doubles; returns its sequential sum (= torch.cumsum(row)[-1]).
  double fill(double* out) const {
    double total = 0.0;
    for (int64_t x = 0; x < V_; ++x) {
      out[x] = to_double(data_[x]);
      total += out[x];
    }
    return total;
  }
  int64_t argmax() const {
    int64_t best = 0;
    double best_value = to_double(data_[0]);
    for (int64_t x = 1; x < V_; ++x) {
      const double value = to_double(data_[x]);
      if (value > best_value) {
        best_value = value;
        best = x;
      }
    }
    return best;
  }
  int32_t status() const { return kOk; }
  int64_t vocab_size() const { return V_; }

  // Sequential search: the decision equals the reference's torch.cumsum-based one bit for bit.
  static int64_t sample_weights(const double* w, int64_t V, double u, double total) {
    return sample_from_weights(w, V, u, total);
  }

  // out[x] = max(w p(x) - q(x), 0), p = this row, q = `draft`; returns the sequential sum.
  double residual(const ProbRow& draft, double w, double* out) const {
    double total = 0.0;
    for (int64_t x = 0; x < V_; ++x) {
      const double r = w * to_double(data_[x]) - to_double(draft.data_[x]);
      out[x] = r > 0.0 ? r : 0.0;
      total += out[x];
    }
    return total;
  }

 private:
  const T* data_ = nullptr;
  int64_t V_ = 0;
};

struct SamplingParams {
  double temperature = 1.0;  // > 0 here; temperature 0 is routed to the greedy rule
  int64_t top_k = 0;         // 0 = off
  double top_p = 1.0;        // 1 = off
  double min_p = 0.0;        // 0 = off
  bool filters() const { return top_k > 0 || top_p < 1.0 || min_p > 0.0; }
  // 1 / temperature as the float32 factor the kernels scale logits with. A temperature so small
  // that 1/T overflows float32 (T < ~3e-39) is clamped to the largest float: still greedy in
  // effect (every token below the max gets weight 0, ties at the max share the mass, as in the
  // reference), where an infinite factor would turn (max - max) * inf into NaN and leave the
  // row without mass.
  float inv_temp() const {
    const double inv = 1.0 / temperature;
    const double largest = static_cast<double>(std::numeric_limits<float>::max());
    return static_cast<float>(inv < largest ? inv : largest);
  }
};

// Numerics of LogitRow: a kept token's weight is e = fast_exp((l - max) * inv_temp) in float32,
// bit for bit the same in every loop, on every instruction set and on the GPU; p = e * inv_norm
// in double. Only the normaliser is a sum whose rounding depends on the evaluation order: an
// unfiltered row gets it from one online pass (max_sum_exp_body: chunk-relative weights,
// rescaled in double, evaluated with FMAs on AVX2 / AVX-512), a filtered row from a pass after
// the filters. Either way it lies within ~4e-7 (relative; measured worst 3.4e-7 on every
// instruction set) of the exact sum of the weights, inside the documented agreement with the
// float64 reference (a decision moves only when a coin lies within ~1e-6 of its boundary).
template <typename T>
class LogitRow {
 public:
  LogitRow() = default;
  LogitRow(const T* logits, int64_t vocab_size, const SamplingParams* params, Workspace* ws)
      : logits_(logits), V_(vocab_size), params_(params), ws_(ws) {}

  double prob(int64_t x) const {
    prepare();
    if (status_ != kOk) return 0.0;
    const float l = load_float(logits_ + x);
    if (!(l >= keep_logit_)) return 0.0;
    const float e = fast_exp_nonpositive((l - max_logit_) * inv_temp_);
    if (e < min_e_) return 0.0;
    return static_cast<double>(e) * inv_norm_;
  }

  // Writes the processed probabilities; returns their sum (about 1).
  double fill(double* out) const {
    prepare();
    if (status_ != kOk) {
      for (int64_t x = 0; x < V_; ++x) out[x] = 0.0;
      return 0.0;
    }
    return logit_loops<T>().fill_probs(logits_, V_, transform(), inv_norm_, out);
  }

  // argmax of the processed distribution = argmax of the raw logits (ties: lowest id).
  int64_t argmax() const {
    int32_t non_finite = 0;
    float best_value = 0.0f;
    const int64_t best = logit_loops<T>().argmax(logits_, V_, &non_finite, &best_value);
    if (non_finite) status_ = kNonFiniteLogit;
    else if (best_value == -std::numeric_limits<float>::infinity()) status_ = kEmptyDistribution;
    return best;
  }

  int32_t status() const { return status_; }
  int64_t vocab_size() const { return V_; }

  // Blocked vectorised search (logit_loops.h): the weights are float32-derived anyway, so the
  // ~1e-15 rounding difference from a sequential cumulative sum is far inside their error.
  static int64_t sample_weights(const double* w, int64_t V, double u, double total) {
    return logit_loops<T>().search_weights(w, V, u, total);
  }

  // out[x] = max(w p(x) - q(x), 0), p = this row, q = `draft`, in one fused pass; returns its mass.
  double residual(const LogitRow& draft, double w, double* out) const {
    prepare();
    draft.prepare();
    if (status_ != kOk || draft.status_ != kOk) {
      for (int64_t x = 0; x < V_; ++x) out[x] = 0.0;
      return 0.0;
    }
    return logit_loops<T>().residual(logits_, transform(), inv_norm_, draft.logits_, draft.transform(), draft.inv_norm_, w,
                              V_, out);
  }

 private:
  float exp_at(float l) const { return fast_exp_nonpositive((l - max_logit_) * inv_temp_); }

  void prepare() const {
    if (prepared_) return;
    prepared_ = true;
    inv_temp_ = params_->inv_temp();
    const LogitLoops<T>& loops = logit_loops<T>();
    keep_logit_ = -std::numeric_limits<float>::infinity();
    min_e_ = 0.0f;
    if (!params_->filters()) {
      // One pass: max and normaliser together, NaN / +inf caught on the way.
      const RowStats stats = loops.max_sum_exp(logits_, V_, inv_temp_);
      if (stats.non_finite) {
        status_ = kNonFiniteLogit;
      } else if (stats.max_logit == -std::numeric_limits<float>::infinity()) {
        status_ = kEmptyDistribution;
      } else {
        max_logit_ = stats.max_logit;
        inv_norm_ = 1.0 / stats.sum_exp;  // sum >= 1: the max's chunk contributes e = 1
      }
      return;
    }
    // Filtered: pass 1 finds the max (and catches NaN / +inf), the filters set their
    // thresholds, pass 2 sums the kept weights.
    int32_t non_finite = 0;
    const float m = loops.max_logit(logits_, V_, &non_finite);
    if (non_finite) {
      status_ = kNonFiniteLogit;
      return;
    }
    if (m == -std::numeric_limits<float>::infinity()) {
      status_ = kEmptyDistribution;
      return;
    }
    max_logit_ = m;
    apply_filters();
    // The normaliser of the kept tokens (>= 1: the max logit is kept and has e = 1).
    inv_norm_ = 1.0 / loops.sum_exp(logits_, V_, transform());
  }

  RowTransform transform() const { return RowTransform{max_logit_, inv_temp_, keep_logit_, min_e_}; }

  // Sets keep_logit_ (top-k, then top-p) and min_e_ (min-p). Each filter keeps a set of the
  // form {x : logit(x) >= threshold}, ties kept together, so thresholds compose.
  void apply_filters() const {
    const int64_t k = params_->top_k;
    float* buf = ws_->select;
    if (k > 0 && k < V_) {
      for (int64_t x = 0; x < V_; ++x) buf[x] = load_float(logits_ + x);
      std::nth_element(buf, buf + (k - 1), buf + V_, std::greater<float>());
      keep_logit_ = buf[k - 1];  // keep every token whose logit ties the k-th largest
    }
    if (params_->top_p < 1.0) {
      // Keep token x iff the mass (after top-k) of tokens strictly more likely than x is
      // below top_p. Sort only a growing head of the kept logits: LLM rows are peaked.
      int64_t n_kept = 0;
      double total = 0.0;
      for (int64_t x = 0; x < V_; ++x) {
        const float l = load_float(logits_ + x);
        if (l >= keep_logit_) {
          buf[n_kept++] = l;
          total += static_cast<double>(exp_at(l));
        }
      }
      const double mass_limit = params_->top_p * total;
      int64_t head = std::min<int64_t>(n_kept, 256);
      float threshold = buf[0];
      while (true) {
        std::nth_element(buf, buf + (head - 1), buf + n_kept, std::greater<float>());
        std::sort(buf, buf + head, std::greater<float>());
        double mass_above = 0.0;
        bool need_more = false;
        int64_t i = 0;
        threshold = buf[0];
        while (i < head) {
          const float v = buf[i];
          if (!(mass_above < mass_limit)) break;
          int64_t j = i;
          while (j < head && buf[j] == v) ++j;
          if (j == head && head < n_kept) {  // this group may continue past the head
            need_more = true;
            break;
          }
          threshold = v;
          mass_above += static_cast<double>(exp_at(v)) * static_cast<double>(j - i);
          i = j;
        }
        if (!need_more) break;
        head = std::min<int64_t>(n_kept, head * 4);
      }
      keep_logit_ = std::max(keep_logit_, threshold);
    }
    if (params_->min_p > 0.0) min_e_ = static_cast<float>(params_->min_p);
  }

  const T* logits_ = nullptr;
  int64_t V_ = 0;
  const SamplingParams* params_ = nullptr;
  Workspace* ws_ = nullptr;
  mutable bool prepared_ = false;
  mutable int32_t status_ = kOk;
  mutable float max_logit_ = 0.0f;
  mutable float inv_temp_ = 1.0f;
  mutable float keep_logit_ = 0.0f;
  mutable float min_e_ = 0.0f;
  mutable double inv_norm_ = 0.0;
};

// Draw from a distribution with one uniform (inverse CDF over the processed probabilities).
template <class Dist>
inline int64_t sample_distribution(const Dist& dist, double u, double* scratch) {
  const double total = dist.fill(scratch);
  return Dist::sample_weights(scratch, dist.vocab_size(), u, total);
}

}  // namespace kernels
}  // namespace specdecode
