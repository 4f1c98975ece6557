// CPU implementations of specdecode::verify_probs and specdecode::verify_logits: checks,
// dtype dispatch, and a parallel loop over rows that calls the torch-free row kernels.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

#include "kernels/philox.h"
#include "kernels/rules.h"
#include "ops/checks.h"

namespace specdecode {
namespace ops {
namespace {

using kernels::LogitRow;
using kernels::ProbRow;
using kernels::Rule;
using kernels::RuleParams;
using kernels::SamplingParams;
using kernels::Workspace;

// How many workers to use: about 64k vocabulary entries of work each, so tiny problems stay on
// one thread and large ones spread over every core.
int64_t max_workers(int64_t rows, int64_t gamma, int64_t V) {
  const int64_t work_per_row = std::max<int64_t>(1, (gamma + 1) * V);
  const int64_t rows_per_worker = std::max<int64_t>(1, 65536 / work_per_row);
  return (rows + rows_per_worker - 1) / rows_per_worker;
}

// Runs `rule` over every row. make_dist(row, position, is_target, workspace) builds a row's
// distributions; statuses are collected and raised after the parallel region.
template <class Dist, class MakeDist>
std::tuple<at::Tensor, at::Tensor> run_rows(const char* op, const char* target_name, const char* draft_name, Rule rule, const RuleParams& params, const VerifyDims& d,
                                            bool has_draft, const at::Tensor& draft_tokens,
                                            const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                            bool needs_select_buffer, MakeDist make_dist) {
  const int64_t B = d.batch, gamma = d.gamma, V = d.vocab_size;
  at::Tensor tokens = at::full({B, gamma + 1}, -1, draft_tokens.options());
  at::Tensor accepted_len = at::zeros({B}, draft_tokens.options());
  const at::Tensor tokens_in = draft_tokens.contiguous();
  const at::Tensor n_in = num_draft_tokens.contiguous();
  const at::Tensor u_in = uniforms.contiguous();
  const int64_t* token_ptr = tokens_in.data_ptr<int64_t>();
  const int64_t* n_ptr = n_in.data_ptr<int64_t>();
  const double* u_ptr = u_in.data_ptr<double>();
  int64_t* out_tokens = tokens.data_ptr<int64_t>();
  int64_t* out_len = accepted_len.data_ptr<int64_t>();
  std::vector<int32_t> status(B, kernels::kOk);

  // Rows differ in cost (a rule stops reading at the first rejection), so workers take rows
  // one at a time from a shared counter instead of fixed contiguous ranges. Each worker
  // allocates its scratch rows once; results do not depend on which worker takes a row.
  std::atomic<int64_t> next_row{0};
  at::parallel_for(0, max_workers(B, gamma, V), 1, [&](int64_t, int64_t) {
    if (next_row.load() >= B) return;
    // Scratch rows, left uninitialised: every use writes before it reads.
    std::unique_ptr<double[]> buf_a(new double[V]), buf_b(new double[V]);
    std::unique_ptr<float[]> buf_select(needs_select_buffer ? new float[V] : nullptr);
    Workspace ws{buf_a.get(), buf_b.get(), buf_select.get()};
    std::vector<Dist> target(gamma + 1), draft(has_draft ? gamma : 0);
    for (int64_t b = next_row.fetch_add(1); b < B; b = next_row.fetch_add(1)) {
      const int64_t n = n_ptr[b];
      if (n < 0 || n > gamma) {
        status[b] = kernels::kNumDraftTokensOutOfRange;
        continue;
      }
      const int64_t* row_tokens = token_ptr + b * gamma;
      bool tokens_ok = true;
      for (int64_t i = 0; i < n; ++i) tokens_ok &= row_tokens[i] >= 0 && row_tokens[i] < V;
      if (!tokens_ok) {
        status[b] = kernels::kDraftTokenOutOfRange;
        continue;
      }
      for (int64_t i = 0; i <= gamma; ++i) target[i] = make_dist(b, i, true, &ws);
      for (int64_t i = 0; i < static_cast<int64_t>(draft.size()); ++i) draft[i] = make_dist(b, i, false, &ws);
      kernels::RowArgs<Dist> args{target.data(), has_draft ? draft.data() : nullptr, row_tokens, n,
                                  u_ptr + b * (gamma + 1), u_ptr[b * (gamma + 1) + gamma], V, &ws,
                                  out_tokens + b * (gamma + 1), params};
      const kernels::RowResult result = kernels::verify_row(rule, args);
      out_len[b] = result.accepted_len;
      // A bad value in a distribution explains a rule's failure, so it is reported first.
      int32_t row_status = kernels::kOk;
      for (int64_t i = 0; i <= n && row_status == kernels::kOk; ++i) row_status = target[i].status();
      for (int64_t i = 0; i < static_cast<int64_t>(draft.size()) && i < n && row_status == kernels::kOk; ++i)
        if (draft[i].status() != kernels::kOk) row_status = draft[i].status() | kernels::kStatusInDraft;
      status[b] = row_status != kernels::kOk ? row_status : result.status;
    }
  });
  for (int64_t b = 0; b < B; ++b) raise_row_status(op, b, status[b], target_name, draft_name);
  return {tokens, accepted_len};
}

std::tuple<at::Tensor, at::Tensor> verify_probs_cpu(const at::Tensor& target_probs,
                                                    const std::optional<at::Tensor>& draft_probs,
                                                    const at::Tensor& draft_tokens, const at::Tensor& num_draft_tokens,
                                                    const at::Tensor& uniforms, c10::string_view rule_name,
                                                    at::ArrayRef<double> rule_params) {
  const Rule rule = parse_rule(std::string_view(rule_name.data(), rule_name.size()));
  const RuleParams params = parse_rule_params(rule, rule_params);
  const bool needs_draft = kernels::rule_needs_draft(rule);
  const VerifyDims d = check_verify_inputs("target_probs", target_probs, "draft_probs", draft_probs, needs_draft,
                                           draft_tokens, num_draft_tokens, uniforms);
  const at::Tensor target = target_probs.contiguous();
  const bool has_draft = needs_draft && draft_probs.has_value();
  const at::Tensor draft = has_draft ? draft_probs->contiguous() : at::Tensor();
  std::tuple<at::Tensor, at::Tensor> result;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, target.scalar_type(), "verify_probs_cpu", [&] {
    const scalar_t* t_ptr = target.data_ptr<scalar_t>();
    const scalar_t* d_ptr = has_draft ? draft.data_ptr<scalar_t>() : nullptr;
    const int64_t V = d.vocab_size, gamma = d.gamma;
    auto make = [&](int64_t b, int64_t i, bool is_target, Workspace*) {
      const scalar_t* base = is_target ? t_ptr + (b * (gamma + 1) + i) * V : d_ptr + (b * gamma + i) * V;
      return ProbRow<scalar_t>(base, V);
    };
    result = run_rows<ProbRow<scalar_t>>("verify_probs", "target_probs", "draft_probs", rule, params, d, has_draft, draft_tokens, num_draft_tokens,
                                         uniforms, false, make);
  });
  return result;
}

std::tuple<at::Tensor, at::Tensor> verify_logits_cpu(const at::Tensor& target_logits,
                                                     const std::optional<at::Tensor>& draft_logits,
                                                     const at::Tensor& draft_tokens,
                                                     const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                     double temperature, int64_t top_k, double top_p, double min_p,
                                                     c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  Rule rule = parse_rule(std::string_view(rule_name.data(), rule_name.size()));
  const RuleParams params = parse_rule_params(rule, rule_params);
  // Temperature 0: every built-in rule reduces to greedy verification (p is one-hot).
  if (temperature == 0.0) rule = Rule::kGreedy;
  const bool needs_draft = kernels::rule_needs_draft(rule);
  const VerifyDims d = check_verify_inputs("target_logits", target_logits, "draft_logits", draft_logits, needs_draft,
                                           draft_tokens, num_draft_tokens, uniforms);
  const at::Tensor target = target_logits.contiguous();
  const bool has_draft = needs_draft && draft_logits.has_value();
  const at::Tensor draft = has_draft ? draft_logits->contiguous() : at::Tensor();
  SamplingParams sampling;
  sampling.temperature = temperature > 0.0 ? temperature : 1.0;
  sampling.top_k = top_k;
  sampling.top_p = top_p;
  sampling.min_p = min_p;
  std::tuple<at::Tensor, at::Tensor> result;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, target.scalar_type(), "verify_logits_cpu", [&] {
    const scalar_t* t_ptr = target.data_ptr<scalar_t>();
    const scalar_t* d_ptr = has_draft ? draft.data_ptr<scalar_t>() : nullptr;
    const int64_t V = d.vocab_size, gamma = d.gamma;
    auto make = [&](int64_t b, int64_t i, bool is_target, Workspace* ws) {
      const scalar_t* base = is_target ? t_ptr + (b * (gamma + 1) + i) * V : d_ptr + (b * gamma + i) * V;
      return LogitRow<scalar_t>(base, V, &sampling, ws);
    };
    result = run_rows<LogitRow<scalar_t>>("verify_logits", "target_logits", "draft_logits", rule, params, d, has_draft, draft_tokens,
                                          num_draft_tokens, uniforms, sampling.filters(), make);
  });
  return result;
}

// The [B, gamma+1] coins of one Philox call, computed on the host exactly as the CUDA kernels
// compute them on the device.
at::Tensor philox_uniforms(const char* target_name, const at::Tensor& target, const at::Tensor& draft_tokens,
                           const at::Tensor& philox_seed, const at::Tensor& philox_offset) {
  check_philox_args(target, philox_seed, philox_offset, target_name);
  check_given("draft_tokens", draft_tokens);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, "draft_tokens: expected shape [B, gamma], got ", draft_tokens.sizes());
  const int64_t B = draft_tokens.size(0), columns = draft_tokens.size(1) + 1;
  const uint64_t seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
  const uint64_t offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  at::Tensor uniforms = at::empty({B, columns}, draft_tokens.options().dtype(at::kDouble));
  double* u = uniforms.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < columns; ++i)
      u[b * columns + i] = kernels::cuda::philox_uniform(seed, offset, static_cast<uint64_t>(b), static_cast<uint64_t>(i));
  return uniforms;
}

std::tuple<at::Tensor, at::Tensor> verify_probs_philox_cpu(
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  return verify_probs_cpu(target_probs, draft_probs, draft_tokens, num_draft_tokens,
                          philox_uniforms("target_probs", target_probs, draft_tokens, philox_seed, philox_offset), rule_name,
                          rule_params);
}

std::tuple<at::Tensor, at::Tensor> verify_logits_philox_cpu(
    const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    double temperature, int64_t top_k, double top_p, double min_p, c10::string_view rule_name,
    at::ArrayRef<double> rule_params) {
  return verify_logits_cpu(target_logits, draft_logits, draft_tokens, num_draft_tokens,
                           philox_uniforms("target_logits", target_logits, draft_tokens, philox_seed, philox_offset), temperature,
                           top_k, top_p, min_p, rule_name, rule_params);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CPU, m) {
  m.impl("verify_probs", &verify_probs_cpu);
  m.impl("verify_logits", &verify_logits_cpu);
  m.impl("verify_probs_philox", &verify_probs_philox_cpu);
  m.impl("verify_logits_philox", &verify_logits_philox_cpu);
}

}  // namespace ops
}  // namespace specdecode
