// CUDA implementation of specdecode::tree_attention_mask. Host code (g++), built only with
// CUDA: the same checks as the CPU op (tree_checks.h), output allocation, one call of the
// torch-free launcher of kernels/cuda/tree_mask.cu on the current stream, and the per-row
// statuses copied to the host and raised as ValueError exactly as on the CPU. That copy
// synchronises the stream once per call; while a CUDA graph is being captured it is skipped
// (a bad row then comes back as all-padding, see tree_mask.cuh).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <tuple>

#include "kernels/cuda/tree_mask.cuh"
#include "ops/tree_checks.h"

namespace specdecode {
namespace ops {
namespace {

namespace kc = kernels::cuda;

using TreeMaskOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  TORCH_CHECK(err == cudaSuccess, "tree_attention_mask: cudaStreamIsCapturing failed: ", cudaGetErrorString(err));
  return capture != cudaStreamCaptureStatusNone;
}

TreeMaskOutputs tree_attention_mask_cuda(const at::Tensor& parents, const at::Tensor& num_nodes,
                                         const at::Tensor& prefix_mask, const at::Tensor& root_positions) {
  const TreeDims d = check_tree_structure_inputs(parents, num_nodes);
  const int64_t W = check_tree_mask_inputs(d, parents, prefix_mask, root_positions);
  TORCH_CHECK_VALUE(parents.is_cuda(), "parents: the CUDA implementation needs CUDA tensors");
  const c10::cuda::CUDAGuard guard(parents.device());
  const int64_t B = d.batch, N = d.max_nodes;
  const at::TensorOptions long_options = parents.options();
  TreeMaskOutputs out{at::empty({B, N}, long_options),
                      at::empty({B, 1, N, W + N}, long_options.dtype(at::kBool)),
                      at::empty({B, N, N}, long_options.dtype(at::kBool)),
                      at::empty({B, N, kernels::tree_mask_words(N)}, long_options.dtype(at::kInt)),
                      at::empty({B, N}, long_options),
                      at::empty({B, N}, long_options),
                      at::empty({B, N}, long_options)};
  at::Tensor status = at::empty({B}, long_options.dtype(at::kInt));
  const at::Tensor parents_c = parents.contiguous(), n_c = num_nodes.contiguous();
  const at::Tensor prefix_c = prefix_mask.contiguous(), root_c = root_positions.contiguous();
  const kc::TreeMaskIO io{parents_c.data_ptr<int64_t>(),
                          n_c.data_ptr<int64_t>(),
                          root_c.data_ptr<int64_t>(),
                          std::get<0>(out).data_ptr<int64_t>(),
                          std::get<1>(out).data_ptr<bool>(),
                          std::get<2>(out).data_ptr<bool>(),
                          std::get<3>(out).data_ptr<int32_t>(),
                          std::get<4>(out).data_ptr<int64_t>(),
                          std::get<5>(out).data_ptr<int64_t>(),
                          std::get<6>(out).data_ptr<int64_t>(),
                          status.data_ptr<int32_t>(),
                          B,
                          N,
                          W};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  cudaError_t err = cudaSuccess;
  switch (prefix_c.scalar_type()) {
    case at::kBool: err = kc::launch_tree_attention_mask<bool>(io, prefix_c.data_ptr<bool>(), stream); break;
    case at::kByte: err = kc::launch_tree_attention_mask<uint8_t>(io, prefix_c.data_ptr<uint8_t>(), stream); break;
    case at::kInt: err = kc::launch_tree_attention_mask<int32_t>(io, prefix_c.data_ptr<int32_t>(), stream); break;
    case at::kLong: err = kc::launch_tree_attention_mask<int64_t>(io, prefix_c.data_ptr<int64_t>(), stream); break;
    default: TORCH_CHECK_TYPE(false, "prefix_mask: unsupported dtype ", prefix_c.scalar_type());
  }
  TORCH_CHECK(err == cudaSuccess, "tree_attention_mask: CUDA kernel launch failed: ", cudaGetErrorString(err));
  if (B > 0 && !capturing(stream)) {
    const at::Tensor host = status.to(at::kCPU);
    const int32_t* s = host.data_ptr<int32_t>();
    for (int64_t b = 0; b < B; ++b) raise_tree_status("tree_attention_mask", b, s[b]);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CUDA, m) { m.impl("tree_attention_mask", &tree_attention_mask_cuda); }

}  // namespace ops
}  // namespace specdecode
