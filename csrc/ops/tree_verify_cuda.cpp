// CUDA implementations of specdecode::verify_tree and the graph-safe verify_tree_philox. Host
// code (g++), built only with CUDA: the op bodies are those of tree_verify_device.h (the CPU
// op's checks and messages, output and scratch allocation, statuses raised as on the CPU); the
// kernels behind kernels/cuda/tree_verify.cuh run on the current stream.
//
// verify_tree_philox skips the status copy while a CUDA graph is being captured (its coins are
// philox_uniform(seed, offset, b, c) from device tensors, kernels/philox.h), so a captured call
// can be replayed with a new offset; a bad row then comes back with accepted_len = -1 and
// tokens / nodes all -1.
#include <torch/library.h>

#include "ops/cuda_backend.h"
#include "ops/tree_verify_device.h"

namespace specdecode {
namespace ops {
namespace {

TreeVerifyOutputs verify_tree_cuda(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                   const at::Tensor& tree_tokens, const at::Tensor& parents,
                                   const at::Tensor& num_nodes, const at::Tensor& uniforms, double temperature,
                                   int64_t top_k, double top_p, double min_p, c10::string_view rule,
                                   at::ArrayRef<double> rule_params) {
  return verify_tree_device(CudaBackend(), target_logits, draft_logits, tree_tokens, parents, num_nodes, uniforms,
                            CoinTensors(), temperature, top_k, top_p, min_p, rule, rule_params);
}

TreeVerifyOutputs verify_tree_philox_cuda(const at::Tensor& target_logits,
                                          const std::optional<at::Tensor>& draft_logits,
                                          const at::Tensor& tree_tokens, const at::Tensor& parents,
                                          const at::Tensor& num_nodes, const at::Tensor& philox_seed,
                                          const at::Tensor& philox_offset, double temperature, int64_t top_k,
                                          double top_p, double min_p, c10::string_view rule,
                                          at::ArrayRef<double> rule_params) {
  return verify_tree_philox_device(CudaBackend(), target_logits, draft_logits, tree_tokens, parents, num_nodes,
                                   philox_seed, philox_offset, temperature, top_k, top_p, min_p, rule, rule_params);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CUDA, m) {
  m.impl("verify_tree", &verify_tree_cuda);
  m.impl("verify_tree_philox", &verify_tree_philox_cuda);
}

}  // namespace ops
}  // namespace specdecode
