// Input checks shared by the CPU and CUDA implementations of the verification ops. Every
// message names the argument and the expected shape, so a direct torch.ops.specdecode.* call
// with bad input raises (ValueError / TypeError in Python) instead of crashing.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/common.h"

namespace specdecode {
namespace ops {

struct VerifyDims {
  int64_t batch;       // B
  int64_t gamma;       // number of draft positions
  int64_t vocab_size;  // V
};

inline kernels::Rule parse_rule(std::string_view rule) {
  if (rule == "token") return kernels::Rule::kToken;
  if (rule == "block") return kernels::Rule::kBlock;
  if (rule == "greedy") return kernels::Rule::kGreedy;
  if (rule == "typical") return kernels::Rule::kTypical;
  if (rule == "top_beta") return kernels::Rule::kTopBeta;
  TORCH_CHECK_VALUE(false, "rule: unknown built-in rule '", std::string(rule),
                    "'; expected one of token, block, greedy, typical, top_beta");
}

// rule_params layout: typical -> [epsilon, delta, sample_correction (0/1)];
// top_beta -> [beta, tolerance]; token, block, greedy -> [].
inline kernels::RuleParams parse_rule_params(kernels::Rule rule, at::ArrayRef<double> values) {
  kernels::RuleParams params;
  if (rule == kernels::Rule::kTypical) {
    TORCH_CHECK_VALUE(values.size() == 3, "rule_params: typical expects [epsilon, delta, sample_correction], got ",
                      values.size(), " values");
    params.epsilon = values[0];
    params.delta = values[1];
    params.sample_correction = values[2] != 0.0;
    TORCH_CHECK_VALUE(params.epsilon >= 0.0 && params.delta >= 0.0,
                      "rule_params: typical needs epsilon >= 0 and delta >= 0");
  } else if (rule == kernels::Rule::kTopBeta) {
    TORCH_CHECK_VALUE(values.size() == 2, "rule_params: top_beta expects [beta, tolerance], got ", values.size(),
                      " values");
    // range first: converting a double outside int64 to int64 is undefined behaviour
    TORCH_CHECK_VALUE(values[0] >= 1.0 && values[0] < 9.2233720368547758e18 &&
                          values[0] == static_cast<double>(static_cast<int64_t>(values[0])),
                      "rule_params: top_beta needs an integer beta in [1, 2^63), got ", values[0]);
    TORCH_CHECK_VALUE(values[1] >= 0.0, "rule_params: top_beta needs tolerance >= 0, got ", values[1]);
    params.beta = static_cast<int64_t>(values[0]);
    params.tolerance = values[1];
  } else {
    TORCH_CHECK_VALUE(values.empty(), "rule_params: this rule takes no parameters, got ", values.size());
  }
  return params;
}

// A required Tensor argument passed as None reaches the kernel as an undefined tensor.
inline void check_given(const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.defined(), name, ": expected a Tensor, got None");
}

inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

// target [B, gamma+1, V]; draft [B, gamma, V] (optional); draft_tokens [B, gamma] int64;
// num_draft_tokens [B] int64; uniforms [B, gamma+1] float64; all on one device.
inline VerifyDims check_verify_inputs(const char* target_name, const at::Tensor& target,
                                      const char* draft_name, const std::optional<at::Tensor>& draft,
                                      bool draft_required, const at::Tensor& draft_tokens,
                                      const at::Tensor& num_draft_tokens, const at::Tensor& uniforms) {
  check_given(target_name, target);
  if (draft.has_value()) check_given(draft_name, *draft);
  check_given("draft_tokens", draft_tokens);
  check_given("num_draft_tokens", num_draft_tokens);
  check_given("uniforms", uniforms);
  TORCH_CHECK_VALUE(target.dim() == 3, target_name, ": expected shape [B, gamma+1, V], got a ", target.dim(),
                    "-d tensor of shape ", target.sizes());
  TORCH_CHECK_TYPE(is_supported_float(target.scalar_type()), target_name,
                   ": expected float32, float16, bfloat16 or float64, got ", target.scalar_type());
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, "draft_tokens: expected shape [B, gamma], got ", draft_tokens.sizes());
  TORCH_CHECK_TYPE(draft_tokens.scalar_type() == at::kLong, "draft_tokens: expected int64, got ",
                   draft_tokens.scalar_type());
  const int64_t B = target.size(0);
  const int64_t gamma = draft_tokens.size(1);
  const int64_t V = target.size(2);
  TORCH_CHECK_VALUE(gamma >= 1, "draft_tokens: gamma (its second dimension) must be >= 1, got shape ",
                    draft_tokens.sizes());
  TORCH_CHECK_VALUE(V >= 1, target_name, ": the vocabulary dimension V must be >= 1");
  TORCH_CHECK_VALUE(draft_tokens.size(0) == B, "draft_tokens: expected shape [B, gamma] = [", B, ", gamma], got ",
                    draft_tokens.sizes());
  TORCH_CHECK_VALUE(target.size(1) == gamma + 1, target_name, ": expected shape [B, gamma+1, V] = [", B, ", ",
                    gamma + 1, ", V], got ", target.sizes());
  if (draft.has_value()) {
    const at::Tensor& d = *draft;
    TORCH_CHECK_VALUE(d.dim() == 3 && d.size(0) == B && d.size(1) == gamma && d.size(2) == V, draft_name,
                      ": expected shape [B, gamma, V] = [", B, ", ", gamma, ", ", V, "], got ", d.sizes());
    TORCH_CHECK_TYPE(d.scalar_type() == target.scalar_type(), draft_name, ": expected dtype ", target.scalar_type(),
                     " (the same as ", target_name, "), got ", d.scalar_type());
    TORCH_CHECK_VALUE(d.device() == target.device(), draft_name, ": expected device ", target.device(), ", got ",
                      d.device());
  } else {
    TORCH_CHECK_VALUE(!draft_required, draft_name, ": this rule needs the draft's distributions, shape [B, gamma, V]");
  }
  TORCH_CHECK_VALUE(num_draft_tokens.dim() == 1 && num_draft_tokens.size(0) == B,
                    "num_draft_tokens: expected shape [B] = [", B, "], got ", num_draft_tokens.sizes());
  TORCH_CHECK_TYPE(num_draft_tokens.scalar_type() == at::kLong, "num_draft_tokens: expected int64, got ",
                   num_draft_tokens.scalar_type());
  TORCH_CHECK_VALUE(uniforms.dim() == 2 && uniforms.size(0) == B && uniforms.size(1) == gamma + 1,
                    "uniforms: expected shape [B, gamma+1] = [", B, ", ", gamma + 1, "], got ", uniforms.sizes());
  TORCH_CHECK_TYPE(uniforms.scalar_type() == at::kDouble, "uniforms: expected float64, got ", uniforms.scalar_type());
  for (const at::Tensor* t : {&draft_tokens, &num_draft_tokens, &uniforms})
    TORCH_CHECK_VALUE(t->device() == target.device(), "all inputs must be on ", target_name, "'s device ",
                      target.device(), ", got one on ", t->device());
  return {B, gamma, V};
}

// philox_seed / philox_offset: one-element int64 tensors on the inputs' device.
inline void check_philox_args(const at::Tensor& target, const at::Tensor& philox_seed,
                              const at::Tensor& philox_offset, const char* target_name) {
  check_given(target_name, target);
  check_given("philox_seed", philox_seed);
  check_given("philox_offset", philox_offset);
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"philox_seed", &philox_seed},
                                std::pair<const char*, const at::Tensor*>{"philox_offset", &philox_offset}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kLong, name, ": expected int64, got ", t->scalar_type());
    TORCH_CHECK_VALUE(t->numel() == 1, name, ": expected exactly one element, got shape ", t->sizes());
    TORCH_CHECK_VALUE(t->device() == target.device(), name, ": expected device ", target.device(), ", got ",
                      t->device());
  }
}

inline void check_sampling_params(double temperature, int64_t top_k, double top_p, double min_p) {
  TORCH_CHECK_VALUE(temperature >= 0.0 && temperature < std::numeric_limits<double>::infinity(),
                    "temperature: expected a finite value >= 0 (0 = greedy), got ", temperature);
  TORCH_CHECK_VALUE(top_k >= 0, "top_k: expected >= 0 (0 = off), got ", top_k);
  TORCH_CHECK_VALUE(top_p > 0.0 && top_p <= 1.0, "top_p: expected a value in (0, 1] (1 = off), got ", top_p);
  TORCH_CHECK_VALUE(min_p >= 0.0 && min_p <= 1.0, "min_p: expected a value in [0, 1] (0 = off), got ", min_p);
}

// logits [B, V] floating; uniforms [B] float64; same device (sample_logits).
// processed_probs: logits [B, V] floating with V >= 1 (after check_sampling_params).
inline void check_processed_probs_inputs(const at::Tensor& logits) {
  TORCH_CHECK_VALUE(logits.dim() == 2, "logits: expected shape [B, V], got ", logits.sizes());
  TORCH_CHECK_TYPE(is_supported_float(logits.scalar_type()),
                   "logits: expected float32, float16, bfloat16 or float64, got ", logits.scalar_type());
  TORCH_CHECK_VALUE(logits.size(1) >= 1, "logits: the vocabulary dimension V must be >= 1, got shape ",
                    logits.sizes());
}

inline void check_sample_inputs(const at::Tensor& logits, const at::Tensor& uniforms) {
  check_given("logits", logits);
  check_given("uniforms", uniforms);
  TORCH_CHECK_VALUE(logits.dim() == 2, "logits: expected shape [B, V], got ", logits.sizes());
  TORCH_CHECK_TYPE(is_supported_float(logits.scalar_type()),
                   "logits: expected float32, float16, bfloat16 or float64, got ", logits.scalar_type());
  TORCH_CHECK_VALUE(logits.size(1) >= 1, "logits: the vocabulary dimension V must be >= 1, got shape ",
                    logits.sizes());
  TORCH_CHECK_VALUE(uniforms.dim() == 1 && uniforms.size(0) == logits.size(0), "uniforms: expected shape [B] = [",
                    logits.size(0), "], got ", uniforms.sizes());
  TORCH_CHECK_TYPE(uniforms.scalar_type() == at::kDouble, "uniforms: expected float64, got ", uniforms.scalar_type());
  TORCH_CHECK_VALUE(uniforms.device() == logits.device(), "uniforms: expected device ", logits.device(), ", got ",
                    uniforms.device());
}

// Raises the ValueError for a row's status, naming the argument that holds the bad value.
inline void raise_row_status(const char* op, int64_t row, int32_t status, const char* target_name = "target",
                             const char* draft_name = "draft") {
  if (status == kernels::kOk) return;
  const int32_t code = status & ~kernels::kStatusInDraft;
  const char* argument = code == kernels::kDraftTokenOutOfRange       ? "draft_tokens"
                         : code == kernels::kNumDraftTokensOutOfRange ? "num_draft_tokens"
                         : (status & kernels::kStatusInDraft)         ? draft_name
                                                                      : target_name;
  TORCH_CHECK_VALUE(false, argument, ": ", op, ", row ", row, ": ", kernels::row_status_message(code));
}

}  // namespace ops
}  // namespace specdecode
