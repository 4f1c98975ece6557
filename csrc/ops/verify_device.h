// The bodies of the device implementations of verify_probs / verify_logits / sample_logits and
// their Philox variants: the CPU ops' checks in the CPU ops' order (checks.h), output and
// scratch allocation, one call of the torch-free launcher (kernels/cuda/verify.cuh), and the
// per-row statuses raised as the CPU raises them. Host code only: every message is formatted
// here or in checks.h, never in a .cu file.
//
// Templates over a Backend that supplies what is specific to the device:
//   void check_device(const char* name, const at::Tensor& t) const;  // raises if t is not on it
//   Guard guard(const at::Tensor& t) const;                          // device guard (RAII)
//   cudaStream_t stream() const;
//   bool capturing() const;                                          // a CUDA graph is being captured
//   void launch(const char* op, const kernels::cuda::VerifyProblem&, void* scratch, size_t bytes) const;
//   void launch_processed_probs(const char* op, const kernels::cuda::ProcessedProbsProblem&, void* scratch,
//                               size_t bytes) const;
//   void launch_tree(const char* op, const kernels::cuda::TreeVerifyProblem&, void* scratch, size_t bytes) const;
//     (the last one only for tree_verify_device.h)
// csrc/ops/verify_cuda.cpp / sample_cuda.cpp instantiate them for CUDA; the test suite's CUDA
// emulator (tests/cuda_emu) for CPU tensors.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>
#include <tuple>

#include "kernels/cuda/verify.cuh"
#include "kernels/rules.h"
#include "ops/checks.h"

namespace specdecode {
namespace ops {

namespace kc = kernels::cuda;

inline kc::ElemType elem_type_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf: return kc::ElemType::kFloat16;
    case at::kBFloat16: return kc::ElemType::kBFloat16;
    case at::kDouble: return kc::ElemType::kFloat64;
    default: return kc::ElemType::kFloat32;  // callers checked is_supported_float
  }
}

// Where a call's coins come from.
struct CoinTensors {
  at::Tensor uniforms;  // [B, gamma+1] float64 (contiguous), or undefined with Philox
  at::Tensor seed;      // one int64 each (Philox)
  at::Tensor offset;
  bool philox() const { return seed.defined(); }
};

// A shape-only stand-in for the uniforms of a Philox call, so that the shared checks apply
// unchanged (the CPU ops check the uniforms they generate the same way). Never read.
inline at::Tensor philox_placeholder(const at::Tensor& like, at::IntArrayRef shape) {
  return at::empty({1}, like.options().dtype(at::kDouble)).expand(shape);
}

// Raises the ValueError of the first bad row, as the CPU op does (copies the statuses to the
// host: one stream synchronisation).
inline void raise_device_statuses(const char* op, const at::Tensor& status, const char* target_name,
                                  const char* draft_name) {
  if (status.numel() == 0) return;
  const at::Tensor host = status.to(at::kCPU);
  const int32_t* s = host.data_ptr<int32_t>();
  for (int64_t b = 0; b < host.numel(); ++b) raise_row_status(op, b, s[b], target_name, draft_name);
}

// The kernels' scratch with the per-row int32 statuses in its tail (one allocation fewer per
// call: host time matters for small batches).
struct ScratchWithStatus {
  at::Tensor scratch;  // bytes, on the device of `like`
  at::Tensor status;   // [B] int32 view of the tail
  void* kernel_scratch;  // the kernels' part (null when they need none)
};

inline ScratchWithStatus allocate_scratch(const at::Tensor& like, size_t kernel_bytes, int64_t B) {
  const int64_t bytes = static_cast<int64_t>(kernel_bytes);
  const int64_t status_at = (bytes + 255) / 256 * 256;
  const int64_t status_bytes = B * static_cast<int64_t>(sizeof(int32_t));
  ScratchWithStatus out;
  out.scratch = at::empty({status_at + status_bytes}, like.options().dtype(at::kByte));
  out.status = out.scratch.narrow(0, status_at, status_bytes).view(at::kInt);
  out.kernel_scratch = bytes > 0 ? out.scratch.data_ptr() : nullptr;
  return out;
}

// The sampling settings the kernels read; temperature 0 (greedy) becomes 1, as on the CPU.
inline kernels::SamplingParams device_sampling(double temperature, int64_t top_k, double top_p, double min_p) {
  kernels::SamplingParams sampling;
  sampling.temperature = temperature > 0.0 ? temperature : 1.0;
  sampling.top_k = top_k;
  sampling.top_p = top_p;
  sampling.min_p = min_p;
  return sampling;
}

struct DeviceOutputs {
  at::Tensor tokens, accepted_len, status;
};

// Allocates outputs and scratch and runs the kernels. `target` and `draft` are contiguous.
template <class Backend>
DeviceOutputs launch_device(const Backend& backend, const char* op, kc::VerifyProblem problem,
                            const at::Tensor& target, const at::Tensor& draft, const at::Tensor& draft_tokens,
                            const at::Tensor& num_draft_tokens, const CoinTensors& coins, at::IntArrayRef token_shape) {
  const int64_t B = problem.batch;
  const bool with_accepted = problem.task != kc::Task::kSampleLogits;
  const at::TensorOptions long_options = target.options().dtype(at::kLong);
  DeviceOutputs out;
  out.tokens = at::empty(token_shape, long_options);
  if (with_accepted) out.accepted_len = at::empty({B}, long_options);
  problem.elem = elem_type_of(target);
  problem.target = target.data_ptr();
  problem.draft = draft.defined() ? draft.data_ptr() : nullptr;
  problem.draft_tokens = draft_tokens.defined() ? draft_tokens.data_ptr<int64_t>() : nullptr;
  problem.num_draft_tokens = num_draft_tokens.defined() ? num_draft_tokens.data_ptr<int64_t>() : nullptr;
  if (coins.philox()) {
    problem.coins.philox_seed = coins.seed.data_ptr<int64_t>();
    problem.coins.philox_offset = coins.offset.data_ptr<int64_t>();
  } else {
    problem.coins.uniforms = coins.uniforms.data_ptr<double>();
  }
  problem.out_tokens = out.tokens.data_ptr<int64_t>();
  problem.out_accepted_len = with_accepted ? out.accepted_len.data_ptr<int64_t>() : nullptr;
  const size_t kernel_bytes = kc::verify_scratch_bytes(problem);
  const ScratchWithStatus scratch = allocate_scratch(target, kernel_bytes, B);
  out.status = scratch.status;
  problem.out_status = B > 0 ? out.status.data_ptr<int32_t>() : nullptr;
  backend.launch(op, problem, scratch.kernel_scratch, kernel_bytes);
  return out;
}

// verify_probs and verify_probs_philox (coins.philox()). `uniforms` is the user's tensor, or
// the placeholder of a Philox call.
template <class Backend>
std::tuple<at::Tensor, at::Tensor> verify_probs_device(const Backend& backend, const at::Tensor& target_probs,
                                                       const std::optional<at::Tensor>& draft_probs,
                                                       const at::Tensor& draft_tokens,
                                                       const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                       CoinTensors coins, c10::string_view rule_name,
                                                       at::ArrayRef<double> rule_params) {
  const kernels::Rule rule = parse_rule(std::string_view(rule_name.data(), rule_name.size()));
  const kernels::RuleParams params = parse_rule_params(rule, rule_params);
  const bool needs_draft = kernels::rule_needs_draft(rule);
  const VerifyDims d = check_verify_inputs("target_probs", target_probs, "draft_probs", draft_probs, needs_draft,
                                           draft_tokens, num_draft_tokens, uniforms);
  backend.check_device("target_probs", target_probs);
  const auto guard = backend.guard(target_probs);
  const at::Tensor target = target_probs.contiguous();
  const at::Tensor draft = needs_draft && draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  if (!coins.philox()) coins.uniforms = uniforms.contiguous();
  kc::VerifyProblem problem;
  problem.task = kc::Task::kVerifyProbs;
  problem.batch = d.batch;
  problem.gamma = d.gamma;
  problem.vocab = d.vocab_size;
  problem.rule = rule;
  problem.params = params;
  const DeviceOutputs out = launch_device(backend, "verify_probs", problem, target, draft, draft_tokens.contiguous(),
                                          num_draft_tokens.contiguous(), coins, {d.batch, d.gamma + 1});
  if (!coins.philox() || !backend.capturing())
    raise_device_statuses("verify_probs", out.status, "target_probs", "draft_probs");
  return {out.tokens, out.accepted_len};
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> verify_logits_device(const Backend& backend, const at::Tensor& target_logits,
                                                        const std::optional<at::Tensor>& draft_logits,
                                                        const at::Tensor& draft_tokens,
                                                        const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                        CoinTensors coins, double temperature, int64_t top_k,
                                                        double top_p, double min_p, c10::string_view rule_name,
                                                        at::ArrayRef<double> rule_params) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  kernels::Rule rule = parse_rule(std::string_view(rule_name.data(), rule_name.size()));
  const kernels::RuleParams params = parse_rule_params(rule, rule_params);
  // Temperature 0: every built-in rule reduces to greedy verification (p is one-hot).
  if (temperature == 0.0) rule = kernels::Rule::kGreedy;
  const bool needs_draft = kernels::rule_needs_draft(rule);
  const VerifyDims d = check_verify_inputs("target_logits", target_logits, "draft_logits", draft_logits, needs_draft,
                                           draft_tokens, num_draft_tokens, uniforms);
  backend.check_device("target_logits", target_logits);
  const auto guard = backend.guard(target_logits);
  const at::Tensor target = target_logits.contiguous();
  const at::Tensor draft = needs_draft && draft_logits.has_value() ? draft_logits->contiguous() : at::Tensor();
  if (!coins.philox()) coins.uniforms = uniforms.contiguous();
  kc::VerifyProblem problem;
  problem.task = kc::Task::kVerifyLogits;
  problem.batch = d.batch;
  problem.gamma = d.gamma;
  problem.vocab = d.vocab_size;
  problem.rule = rule;
  problem.params = params;
  problem.sampling = device_sampling(temperature, top_k, top_p, min_p);
  const DeviceOutputs out = launch_device(backend, "verify_logits", problem, target, draft, draft_tokens.contiguous(),
                                          num_draft_tokens.contiguous(), coins, {d.batch, d.gamma + 1});
  if (!coins.philox() || !backend.capturing())
    raise_device_statuses("verify_logits", out.status, "target_logits", "draft_logits");
  return {out.tokens, out.accepted_len};
}

// The Philox variants check (seed, offset) and draft_tokens' rank first, exactly as the CPU
// ops do before they generate their coins (verify_cpu.cpp philox_uniforms).
inline CoinTensors philox_coins(const char* target_name, const at::Tensor& target, const at::Tensor& draft_tokens,
                                const at::Tensor& philox_seed, const at::Tensor& philox_offset) {
  check_philox_args(target, philox_seed, philox_offset, target_name);
  check_given("draft_tokens", draft_tokens);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, "draft_tokens: expected shape [B, gamma], got ", draft_tokens.sizes());
  CoinTensors coins;
  coins.seed = philox_seed;
  coins.offset = philox_offset;
  return coins;
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> verify_probs_philox_device(
    const Backend& backend, const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs,
    const at::Tensor& draft_tokens, const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  const CoinTensors coins = philox_coins("target_probs", target_probs, draft_tokens, philox_seed, philox_offset);
  const at::Tensor placeholder = philox_placeholder(draft_tokens, {draft_tokens.size(0), draft_tokens.size(1) + 1});
  return verify_probs_device(backend, target_probs, draft_probs, draft_tokens, num_draft_tokens, placeholder, coins,
                             rule_name, rule_params);
}

template <class Backend>
std::tuple<at::Tensor, at::Tensor> verify_logits_philox_device(
    const Backend& backend, const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
    const at::Tensor& draft_tokens, const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, double temperature, int64_t top_k, double top_p, double min_p,
    c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  const CoinTensors coins = philox_coins("target_logits", target_logits, draft_tokens, philox_seed, philox_offset);
  const at::Tensor placeholder = philox_placeholder(draft_tokens, {draft_tokens.size(0), draft_tokens.size(1) + 1});
  return verify_logits_device(backend, target_logits, draft_logits, draft_tokens, num_draft_tokens, placeholder, coins,
                              temperature, top_k, top_p, min_p, rule_name, rule_params);
}

// sample_logits / sample_logits_philox: one token per row of logits [B, V].
template <class Backend>
at::Tensor sample_logits_device(const Backend& backend, const at::Tensor& logits, const at::Tensor& uniforms,
                                CoinTensors coins, double temperature, int64_t top_k, double top_p, double min_p) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  check_sample_inputs(logits, uniforms);
  const int64_t B = logits.size(0), V = logits.size(1);
  if (B == 0) return at::empty({0}, logits.options().dtype(at::kLong));
  backend.check_device("logits", logits);
  const auto guard = backend.guard(logits);
  const at::Tensor x = logits.contiguous();
  if (!coins.philox()) coins.uniforms = uniforms.contiguous();
  kc::VerifyProblem problem;
  problem.task = kc::Task::kSampleLogits;
  problem.batch = B;
  problem.gamma = 0;
  problem.vocab = V;
  problem.greedy = temperature == 0.0;
  problem.sampling = device_sampling(temperature, top_k, top_p, min_p);
  const DeviceOutputs out =
      launch_device(backend, "sample_logits", problem, x, at::Tensor(), at::Tensor(), at::Tensor(), coins, {B});
  if (!coins.philox() || !backend.capturing()) raise_device_statuses("sample_logits", out.status, "logits", "logits");
  return out.tokens;
}

template <class Backend>
at::Tensor sample_logits_philox_device(const Backend& backend, const at::Tensor& logits,
                                       const at::Tensor& philox_seed, const at::Tensor& philox_offset,
                                       double temperature, int64_t top_k, double top_p, double min_p) {
  check_philox_args(logits, philox_seed, philox_offset, "logits");
  TORCH_CHECK_VALUE(logits.dim() == 2, "logits: expected shape [B, V], got ", logits.sizes());
  CoinTensors coins;
  coins.seed = philox_seed;
  coins.offset = philox_offset;
  const at::Tensor placeholder = philox_placeholder(logits, {logits.size(0)});
  return sample_logits_device(backend, logits, placeholder, coins, temperature, top_k, top_p, min_p);
}

// processed_probs: float64 [B, V], the CPU op's checks and messages.
template <class Backend>
at::Tensor processed_probs_device(const Backend& backend, const at::Tensor& logits, double temperature, int64_t top_k,
                                  double top_p, double min_p) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  check_processed_probs_inputs(logits);
  const int64_t B = logits.size(0), V = logits.size(1);
  if (B == 0) return at::empty({B, V}, logits.options().dtype(at::kDouble));
  backend.check_device("logits", logits);
  const auto guard = backend.guard(logits);
  const at::Tensor x = logits.contiguous();
  at::Tensor probs = at::empty({B, V}, x.options().dtype(at::kDouble));
  kc::ProcessedProbsProblem problem;
  problem.elem = elem_type_of(x);
  problem.logits = x.data_ptr();
  problem.batch = B;
  problem.vocab = V;
  problem.greedy = temperature == 0.0;
  problem.sampling = device_sampling(temperature, top_k, top_p, min_p);
  problem.out_probs = probs.data_ptr<double>();
  const size_t kernel_bytes = kc::processed_probs_scratch_bytes(problem);
  const ScratchWithStatus scratch = allocate_scratch(x, kernel_bytes, B);
  problem.out_status = scratch.status.data_ptr<int32_t>();
  backend.launch_processed_probs("processed_probs", problem, scratch.kernel_scratch, kernel_bytes);
  raise_device_statuses("processed_probs", scratch.status, "logits", "logits");
  return probs;
}

}  // namespace ops
}  // namespace specdecode
