// CUDA implementations of specdecode::verify_probs, verify_logits and their graph-safe Philox
// variants. Host code (g++), built only with CUDA: the op bodies are those of verify_device.h
// (the CPU ops' checks and messages, output and scratch allocation, statuses raised as on the
// CPU); the kernels behind kernels/cuda/verify.cuh run on the current stream.
//
// Raising a bad row's error copies the per-row statuses to the host, which synchronises the
// stream once per call. The Philox variants skip that copy while a CUDA graph is being captured
// (their coins come from device tensors: philox_uniform(seed, offset, b, i), kernels/philox.h),
// so a captured call can be replayed with a new offset (advance it with offset.add_(1)); a bad
// row then comes back with accepted_len = -1 and tokens all -1.
#include <torch/library.h>

#include "ops/cuda_backend.h"
#include "ops/verify_device.h"

namespace specdecode {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor> verify_probs_cuda(const at::Tensor& target_probs,
                                                     const std::optional<at::Tensor>& draft_probs,
                                                     const at::Tensor& draft_tokens,
                                                     const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                     c10::string_view rule, at::ArrayRef<double> rule_params) {
  return verify_probs_device(CudaBackend(), target_probs, draft_probs, draft_tokens, num_draft_tokens, uniforms,
                             CoinTensors(), rule, rule_params);
}

std::tuple<at::Tensor, at::Tensor> verify_logits_cuda(const at::Tensor& target_logits,
                                                      const std::optional<at::Tensor>& draft_logits,
                                                      const at::Tensor& draft_tokens,
                                                      const at::Tensor& num_draft_tokens, const at::Tensor& uniforms,
                                                      double temperature, int64_t top_k, double top_p, double min_p,
                                                      c10::string_view rule, at::ArrayRef<double> rule_params) {
  return verify_logits_device(CudaBackend(), target_logits, draft_logits, draft_tokens, num_draft_tokens, uniforms,
                              CoinTensors(), temperature, top_k, top_p, min_p, rule, rule_params);
}

std::tuple<at::Tensor, at::Tensor> verify_probs_philox_cuda(
    const at::Tensor& target_probs, const std::optional<at::Tensor>& draft_probs, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    c10::string_view rule, at::ArrayRef<double> rule_params) {
  return verify_probs_philox_device(CudaBackend(), target_probs, draft_probs, draft_tokens, num_draft_tokens,
                                    philox_seed, philox_offset, rule, rule_params);
}

std::tuple<at::Tensor, at::Tensor> verify_logits_philox_cuda(
    const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits, const at::Tensor& draft_tokens,
    const at::Tensor& num_draft_tokens, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    double temperature, int64_t top_k, double top_p, double min_p, c10::string_view rule,
    at::ArrayRef<double> rule_params) {
  return verify_logits_philox_device(CudaBackend(), target_logits, draft_logits, draft_tokens, num_draft_tokens,
                                     philox_seed, philox_offset, temperature, top_k, top_p, min_p, rule, rule_params);
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
