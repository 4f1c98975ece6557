// Launch logic shared by the launchers in verify_probs.cu and verify_logits.cu. Torch-free.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/verify_kernel.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Threads per row (one block per row). 512 keeps every kernel within 128 registers; with
// kUnroll 16-byte loads in flight per thread that is 32 KiB of loads in flight per row.
constexpr int kThreads = 512;

template <int BLOCK, class Src, class Uniforms>
cudaError_t launch_rows_with(const RowsArgs<typename Src::Elem>& a, const Src& src, const Uniforms& coins,
                             cudaStream_t stream) {
  auto kernel = verify_rows_kernel<BLOCK, Src, Uniforms>;
  const size_t smem = dynamic_smem_bytes<typename Src::State>(a.io.gamma);
  if (smem > 48 * 1024) {
    int device = 0, optin = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    if (smem + sizeof(BlockShared) > static_cast<size_t>(optin)) return cudaErrorInvalidValue;
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  kernel<<<static_cast<unsigned>(a.io.batch), BLOCK, smem, stream>>>(a, src, coins);
  return cudaGetLastError();
}

template <class Src, class Uniforms>
cudaError_t launch_rows(const RowsArgs<typename Src::Elem>& a, const Src& src, const Uniforms& coins,
                        cudaStream_t stream) {
  const VerifyRowsIO& io = a.io;
  if (io.batch < 0 || io.gamma < 1 || io.vocab_size < 1 || io.batch > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (io.batch == 0) return cudaSuccess;
  return launch_rows_with<kThreads>(a, src, coins, stream);
}

inline LogitParams make_logit_params(const SamplingParams& sampling) {
  LogitParams p;
  p.inv_temp = sampling.temperature > 0.0 ? sampling.inv_temp() : 1.0f;
  p.top_k = sampling.top_k;
  p.top_p = sampling.top_p;
  p.min_e = sampling.min_p > 0.0 ? static_cast<float>(sampling.min_p) : 0.0f;
  p.filters = sampling.filters();
  return p;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
