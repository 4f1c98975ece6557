// CUDA implementations of specdecode::sample_logits and sample_logits_philox: one token per row
// from the processed distribution of logits [B, V], computed by the same kernels that give the
// verify ops their q (kernels/cuda/verify.cuh, task kSampleLogits); and of processed_probs, that
// distribution itself as float64 [B, V] (kernels/cuda/processed_probs.cu). Host code (g++), built only
// with CUDA; the op bodies, checks and messages are those of verify_device.h (the CPU op's).
// sample_logits_philox is graph-safe like the verify Philox ops (no status copy while a CUDA
// graph is being captured; a bad row then comes back as -1).
#include <torch/library.h>

#include "ops/cuda_backend.h"
#include "ops/verify_device.h"

namespace specdecode {
namespace ops {
namespace {

at::Tensor sample_logits_cuda(const at::Tensor& logits, const at::Tensor& uniforms, double temperature, int64_t top_k,
                              double top_p, double min_p) {
  return sample_logits_device(CudaBackend(), logits, uniforms, CoinTensors(), temperature, top_k, top_p, min_p);
}

at::Tensor sample_logits_philox_cuda(const at::Tensor& logits, const at::Tensor& philox_seed,
                                     const at::Tensor& philox_offset, double temperature, int64_t top_k, double top_p,
                                     double min_p) {
  return sample_logits_philox_device(CudaBackend(), logits, philox_seed, philox_offset, temperature, top_k, top_p,
                                     min_p);
}

at::Tensor processed_probs_cuda(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                               double min_p) {
  return processed_probs_device(CudaBackend(), logits, temperature, top_k, top_p, min_p);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CUDA, m) {
  m.impl("sample_logits", &sample_logits_cuda);
  m.impl("sample_logits_philox", &sample_logits_philox_cuda);
  m.impl("processed_probs", &processed_probs_cuda);
}

}  // namespace ops
}  // namespace specdecode
