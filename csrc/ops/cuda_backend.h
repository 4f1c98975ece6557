// The CUDA backend of the device op bodies (verify_device.h, tree_verify_device.h): device
// check and guard, the current stream, graph-capture detection and the launchers' errors as
// messages. Host code (g++), built only with CUDA.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include "kernels/cuda/tree_verify.cuh"
#include "kernels/cuda/verify.cuh"

namespace specdecode {
namespace ops {

struct CudaBackend {
  void check_device(const char* name, const at::Tensor& t) const {
    TORCH_CHECK_VALUE(t.is_cuda(), name, ": the CUDA implementation needs CUDA tensors, got a tensor on ", t.device());
  }
  c10::cuda::CUDAGuard guard(const at::Tensor& t) const { return c10::cuda::CUDAGuard(t.device()); }
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(); }
  // True while the current stream is being captured into a CUDA graph: the graph-safe ops then
  // skip the status copy (a bad row comes back as accepted_len = -1 and tokens all -1).
  bool capturing() const {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    const cudaError_t err = cudaStreamIsCapturing(stream(), &capture);
    TORCH_CHECK(err == cudaSuccess, "cudaStreamIsCapturing failed: ", cudaGetErrorString(err));
    return capture != cudaStreamCaptureStatusNone;
  }
  void launch(const char* op, const kernels::cuda::VerifyProblem& problem, void* scratch, size_t bytes) const {
    check_launch(op, kernels::cuda::launch_verify(problem, scratch, bytes, stream()));
  }
  void launch_processed_probs(const char* op, const kernels::cuda::ProcessedProbsProblem& problem, void* scratch,
                              size_t bytes) const {
    check_launch(op, kernels::cuda::launch_processed_probs(problem, scratch, bytes, stream()));
  }
  void launch_tree(const char* op, const kernels::cuda::TreeVerifyProblem& problem, void* scratch,
                   size_t bytes) const {
    check_launch(op, kernels::cuda::launch_verify_tree(problem, scratch, bytes, stream()));
  }
  // A launcher's error as a message.
  static void check_launch(const char* op, cudaError_t err) {
    TORCH_CHECK(err != cudaErrorInvalidValue, op,
                ": the CUDA kernels rejected the problem description (an internal error: please report it)");
    TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
  }
};

}  // namespace ops
}  // namespace specdecode
