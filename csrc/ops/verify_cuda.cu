// CUDA implementations of specdecode::verify_probs and specdecode::verify_logits: the same
// checks as the CPU ops (checks.h), dtype dispatch, and one launch of the torch-free kernels in
// kernels/cuda/ on the current stream. The per-row statuses are copied to the host and raised
// as ValueError exactly as on the CPU; that copy synchronises the stream once per call (the
// price of reporting bad input). The graph-safe Philox variants further down skip the copy
// while a CUDA graph is being captured.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <optional>
#include <string_view>
#include <tuple>

#include "kernels/cuda/verify.cuh"
#include "kernels/rules.h"
#include "ops/checks.h"

namespace specdecode {
namespace ops {
namespace {

using kernels::Rule;
using kernels::RuleParams;
using kernels::SamplingParams;
namespace kc = kernels::cuda;

// c10 scalar types -> the CUDA types the kernels are instantiated for (same layouts).
template <typename scalar_t>
struct CudaType {
  using type = scalar_t;
};
template <>
struct CudaType<c10::Half> {
  using type = __half;
};
template <>
struct CudaType<c10::BFloat16> {
  using type = __nv_bfloat16;
};

template <typename scalar_t>
const typename CudaType<scalar_t>::type* cuda_ptr(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  return reinterpret_cast<const typename CudaType<scalar_t>::type*>(t.data_ptr<scalar_t>());
}

void check_cuda_inputs(const char* target_name, const at::Tensor& target) {
  TORCH_CHECK_VALUE(target.is_cuda(), target_name, ": the CUDA implementation needs CUDA tensors");
}

void check_launch(const char* op, cudaError_t err, int64_t gamma) {
  if (err == cudaErrorInvalidValue)
    TORCH_CHECK_VALUE(false, op, ": gamma = ", gamma,
                      " needs more shared memory per row than this GPU provides for the CUDA kernel");
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

// Outputs for B rows and the integer IO block the launchers take. The kernels write every
// element, so the outputs start uninitialised.
struct RowsOutputs {
  at::Tensor tokens, accepted_len, status;
  at::Tensor draft_tokens, num_draft_tokens;  // contiguous copies kept alive for the launch
  kc::VerifyRowsIO io;
};

RowsOutputs make_outputs(const VerifyDims& d, const at::Tensor& draft_tokens, const at::Tensor& num_draft_tokens) {
  RowsOutputs o;
  o.tokens = at::empty({d.batch, d.gamma + 1}, draft_tokens.options());
  o.accepted_len = at::empty({d.batch}, draft_tokens.options());
  o.status = at::empty({d.batch}, draft_tokens.options().dtype(at::kInt));
  o.draft_tokens = draft_tokens.contiguous();
  o.num_draft_tokens = num_draft_tokens.contiguous();
  o.io = kc::VerifyRowsIO{o.draft_tokens.data_ptr<int64_t>(), o.num_draft_tokens.data_ptr<int64_t>(),
                          o.tokens.data_ptr<int64_t>(),       o.accepted_len.data_ptr<int64_t>(),
                          o.status.data_ptr<int32_t>(),       d.batch,
                          d.gamma,                            d.vocab_size};
  return o;
}

// Copies the statuses to the host (one stream synchronisation) and raises for the first bad row.
void raise_statuses(const char* op, const at::Tensor& status) {
  if (status.numel() == 0) return;
  const at::Tensor host = status.to(at::kCPU);
  const int32_t* s = host.data_ptr<int32_t>();
  for (int64_t b = 0; b < host.numel(); ++b) raise_row_status(op, b, s[b]);
}

// Where a call's coins come from: a [B, gamma+1] float64 tensor, or Philox (seed, offset)
// tensors on the device.
struct CoinSource {
  const double* uniforms = nullptr;
  kc::PhiloxSeedOffset philox{nullptr, nullptr};
  bool is_philox() const { return philox.seed != nullptr; }
};

template <typename scalar_t>
cudaError_t launch_probs(const at::Tensor& target, const at::Tensor& draft, const CoinSource& coins,
                         const kc::VerifyRowsIO& io, Rule rule, const RuleParams& params, cudaStream_t stream) {
  using T = typename CudaType<scalar_t>::type;
  const T* t = cuda_ptr<scalar_t>(target);
  const T* d = cuda_ptr<scalar_t>(draft);
  if (coins.is_philox()) return kc::launch_verify_probs_philox<T>(t, d, coins.philox, io, rule, params, stream);
  return kc::launch_verify_probs<T>(t, d, coins.uniforms, io, rule, params, stream);
}

template <typename scalar_t>
cudaError_t launch_logits(const at::Tensor& target, const at::Tensor& draft, const CoinSource& coins,
                          const kc::VerifyRowsIO& io, const SamplingParams& sampling, Rule rule,
                          const RuleParams& params, cudaStream_t stream) {
  using T = typename CudaType<scalar_t>::type;
  const T* t = cuda_ptr<scalar_t>(target);
  const T* d = cuda_ptr<scalar_t>(draft);
  if (coins.is_philox())
    return kc::launch_verify_logits_philox<T>(t, d, coins.philox, io, sampling, rule, params, stream);
  return kc::launch_verify_logits<T>(t, d, coins.uniforms, io, sampling, rule, params, stream);
}

// The body shared by verify_probs and its Philox variant. `uniforms` is a defined [B, gamma+1]
// float64 tensor, or undefined with coins.philox set.
std::tuple<at::Tensor, at::Tensor> run_probs(const char* op, const at::Tensor& target_probs,
                                             const std::optional<at::Tensor>& draft_probs,
                                             const at::Tensor& draft_tokens, const at::Tensor& num_draft_tokens,
                                             const at::Tensor& uniforms, CoinSource coins, c10::string_view rule_name,
                                             at::ArrayRef<double> rule_params, bool raise_now) {
  const Rule rule = parse_rule(std::string_view(rule_name.data(), rule_name.size()));
  const RuleParams params = parse_rule_params(rule, rule_params);
  const bool needs_draft = kernels::rule_needs_draft(rule);
  const VerifyDims d = check_verify_inputs("target_probs", target_probs, "draft_probs", draft_probs, needs_draft,
                                           draft_tokens, num_draft_tokens, uniforms);
  check_cuda_inputs("target_probs", target_probs);
  const c10::cuda::CUDAGuard guard(target_probs.device());
  const at::Tensor target = target_probs.contiguous();
  const bool has_draft = needs_draft && draft_probs.has_value();
  const at::Tensor draft = has_draft ? draft_probs->contiguous() : at::Tensor();
  at::Tensor u;  // the Philox variants pass a zero-stride placeholder: never materialised
  if (!coins.is_philox()) {
    u = uniforms.contiguous();
    coins.uniforms = u.data_ptr<double>();
  }
  RowsOutputs out = make_outputs(d, draft_tokens, num_draft_tokens);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cudaError_t err = cudaSuccess;
  switch (target.scalar_type()) {
    case at::kFloat: err = launch_probs<float>(target, draft, coins, out.io, rule, params, stream); break;
    case at::kHalf: err = launch_probs<c10::Half>(target, draft, coins, out.io, rule, params, stream); break;
    case at::kBFloat16: err = launch_probs<c10::BFloat16>(target, draft, coins, out.io, rule, params, stream); break;
    case at::kDouble: err = launch_probs<double>(target, draft, coins, out.io, rule, params, stream); break;
    default:
      TORCH_CHECK_TYPE(false, "target_probs: expected float32, float16, bfloat16 or float64, got ",
                       target.scalar_type());
  }
  check_launch(op, err, d.gamma);
  if (raise_now) raise_statuses(op, out.status);
  return {out.tokens, out.accepted_len};
}

std::tuple<at::Tensor, at::Tensor> run_logits(const char* op, const at::Tensor& target_logits,
                                              const std::optional<at::Tensor>& draft_logits,
                                              const at::Tensor& draft_tokens, const at::Tensor& num_draft_tokens,
                                              const at::Tensor& uniforms, CoinSource coins, double temperature,
                                              int64_t top_k, double top_p, double min_p, c10::string_view rule_name,
                                              at::ArrayRef<double> rule_params, bool raise_now) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  Rule rule = parse_rule(std::string_view(rule_name.data(), rule_name.size()));
  const RuleParams params = parse_rule_params(rule, rule_params);
  // Temperature 0: every built-in rule reduces to greedy verification (p is one-hot).
  if (temperature == 0.0) rule = Rule::kGreedy;
  const bool needs_draft = kernels::rule_needs_draft(rule);
  const VerifyDims d = check_verify_inputs("target_logits", target_logits, "draft_logits", draft_logits, needs_draft,
                                           draft_tokens, num_draft_tokens, uniforms);
  check_cuda_inputs("target_logits", target_logits);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const at::Tensor target = target_logits.contiguous();
  const bool has_draft = needs_draft && draft_logits.has_value();
  const at::Tensor draft = has_draft ? draft_logits->contiguous() : at::Tensor();
  at::Tensor u;  // the Philox variants pass a zero-stride placeholder: never materialised
  if (!coins.is_philox()) {
    u = uniforms.contiguous();
    coins.uniforms = u.data_ptr<double>();
  }
  SamplingParams sampling;
  sampling.temperature = temperature > 0.0 ? temperature : 1.0;
  sampling.top_k = top_k;
  sampling.top_p = top_p;
  sampling.min_p = min_p;
  RowsOutputs out = make_outputs(d, draft_tokens, num_draft_tokens);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cudaError_t err = cudaSuccess;
  switch (target.scalar_type()) {
    case at::kFloat: err = launch_logits<float>(target, draft, coins, out.io, sampling, rule, params, stream); break;
    case at::kHalf:
      err = launch_logits<c10::Half>(target, draft, coins, out.io, sampling, rule, params, stream);
      break;
    case at::kBFloat16:
      err = launch_logits<c10::BFloat16>(target, draft, coins, out.io, sampling, rule, params, stream);
      break;
    case at::kDouble: err = launch_logits<double>(target, draft, coins, out.io, sampling, rule, params, stream); break;
    default:
      TORCH_CHECK_TYPE(false, "target_logits: expected float32, float16, bfloat16 or float64, got ",
                       target.scalar_type());
  }
  check_launch(op, err, d.gamma);
  if (raise_now) raise_statuses(op, out.status);
  return {out.tokens, out.accepted_len};
}

std::tuple<at::Tensor, at::Tensor> verify_probs_cuda(const at::Tensor& target_probs,
                                                     const std::optional<at::Tensor>& draft_probs,
                                                     const at::Tensor& draft_tokens,
                                                     const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                     c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  return run_probs("verify_probs", target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms, CoinSource{},
                   rule_name, rule_params, /*raise_now=*/true);
}

std::tuple<at::Tensor, at::Tensor> verify_logits_cuda(const at::Tensor& target_logits,
                                                      const std::optional<at::Tensor>& draft_logits,
                                                      const at::Tensor& draft_tokens,
                                                      const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                      double temperature, int64_t top_k, double top_p, double min_p,
                                                      c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  return run_logits("verify_logits", target_logits, draft_logits, draft_tokens, num_draft_tokens, uniforms,
                    CoinSource{}, temperature, top_k, top_p, min_p, rule_name, rule_params, /*raise_now=*/true);
}

// ---- graph-safe variants: coins from Philox4x32-10 keyed by device tensors -----------------
// Schemas (registration.cpp):
//   verify_probs_philox(Tensor target_probs, Tensor? draft_probs, Tensor draft_tokens,
//       Tensor num_draft_tokens, Tensor philox_seed, Tensor philox_offset, str rule,
//       float[] rule_params) -> (Tensor, Tensor)
//   verify_logits_philox(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens,
//       Tensor num_draft_tokens, Tensor philox_seed, Tensor philox_offset, float temperature,
//       int top_k, float top_p, float min_p, str rule, float[] rule_params) -> (Tensor, Tensor)
// philox_seed and philox_offset are int64 tensors with one element on the inputs' device; the
// coin of row b, column i is kernels::cuda::philox_uniform(seed, offset, b, i). The caller
// advances philox_offset (offset.add_(1)) between calls. Outside graph capture bad rows raise
// as usual; during capture nothing is copied to the host and a bad row comes back with
// accepted_len = -1 and tokens all -1.
bool stream_is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  TORCH_CHECK(err == cudaSuccess, "cudaStreamIsCapturing failed: ", cudaGetErrorString(err));
  return capture != cudaStreamCaptureStatusNone;
}

// Shape/dtype checks of the (seed, offset) pair; returns a dummy uniforms tensor of the right
// shape so the shared checks in checks.h apply unchanged.
at::Tensor philox_coin_placeholder(const char* target_name, const at::Tensor& target, const at::Tensor& draft_tokens,
                                   const at::Tensor& philox_seed, const at::Tensor& philox_offset, CoinSource* coins) {
  check_philox_args(target, philox_seed, philox_offset, target_name);
  coins->philox = kc::PhiloxSeedOffset{philox_seed.data_ptr<int64_t>(), philox_offset.data_ptr<int64_t>()};
  // A zero-stride view of one uninitialised element: no kernel, only what check_verify_inputs
  // reads (shape, dtype, device). The kernels never read it.
  return at::empty({1, 1}, draft_tokens.options().dtype(at::kDouble))
      .expand({draft_tokens.size(0), draft_tokens.size(1) + 1});
}

std::tuple<at::Tensor, at::Tensor> verify_probs_philox_cuda(
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    c10::string_view rule_name, at::ArrayRef<double> rule_params) {
  check_given("draft_tokens", draft_tokens);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, "draft_tokens: expected shape [B, gamma], got ", draft_tokens.sizes());
  CoinSource coins;
  const at::Tensor placeholder =
      philox_coin_placeholder("target_probs", target_probs, draft_tokens, philox_seed, philox_offset, &coins);
  const c10::cuda::CUDAGuard guard(target_probs.device());
  const bool capturing = stream_is_capturing(c10::cuda::getCurrentCUDAStream());
  return run_probs("verify_probs_philox", target_probs, draft_probs, draft_tokens, num_draft_tokens, placeholder,
                   coins, rule_name, rule_params, /*raise_now=*/!capturing);
}

std::tuple<at::Tensor, at::Tensor> verify_logits_philox_cuda(
    const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    double temperature, int64_t top_k, double top_p, double min_p, c10::string_view rule_name,
    at::ArrayRef<double> rule_params) {
  check_given("draft_tokens", draft_tokens);
  TORCH_CHECK_VALUE(draft_tokens.dim() == 2, "draft_tokens: expected shape [B, gamma], got ", draft_tokens.sizes());
  CoinSource coins;
  const at::Tensor placeholder =
      philox_coin_placeholder("target_logits", target_logits, draft_tokens, philox_seed, philox_offset, &coins);
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const bool capturing = stream_is_capturing(c10::cuda::getCurrentCUDAStream());
  return run_logits("verify_logits_philox", target_logits, draft_logits, draft_tokens, num_draft_tokens, placeholder,
                    coins, temperature, top_k, top_p, min_p, rule_name, rule_params, /*raise_now=*/!capturing);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CUDA, m) {
  m.impl("verify_probs", &verify_probs_cuda);
  m.impl("verify_logits", &verify_logits_cuda);
  m.impl("verify_probs_philox", &verify_probs_philox_cuda);
  m.impl("verify_logits_philox", &verify_logits_philox_cuda);
}

}  // namespace ops
}  // namespace specdecode
