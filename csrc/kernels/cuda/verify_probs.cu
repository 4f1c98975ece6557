// verify_probs launchers (explicit uniforms and in-kernel Philox), instantiated for float,
// __half, __nv_bfloat16 and double; and the Philox coin writer.
#include "kernels/cuda/launch.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <typename T>
cudaError_t launch_verify_probs(const T* target_probs, const T* draft_probs, const double* uniforms,
                                const VerifyRowsIO& io, Rule rule, const RuleParams& params, cudaStream_t stream) {
  const RowsArgs<T> a{target_probs, draft_probs, io, rule, params};
  return launch_rows(a, ProbSource<T>{}, UniformsInMemory{uniforms}, stream);
}

template <typename T>
cudaError_t launch_verify_probs_philox(const T* target_probs, const T* draft_probs, PhiloxSeedOffset rng,
                                       const VerifyRowsIO& io, Rule rule, const RuleParams& params,
                                       cudaStream_t stream) {
  const RowsArgs<T> a{target_probs, draft_probs, io, rule, params};
  return launch_rows(a, ProbSource<T>{}, UniformsPhilox{rng}, stream);
}

__global__ void philox_uniforms_kernel(PhiloxSeedOffset rng, int64_t batch, int64_t gamma, double* out) {
  const int64_t total = batch * (gamma + 1);
  const uint64_t seed = static_cast<uint64_t>(*rng.seed);
  const uint64_t offset = static_cast<uint64_t>(*rng.offset);
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < total; k += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t row = static_cast<uint64_t>(k / (gamma + 1));
    const uint64_t column = static_cast<uint64_t>(k % (gamma + 1));
    out[k] = philox_uniform(seed, offset, row, column);
  }
}

cudaError_t launch_philox_uniforms(PhiloxSeedOffset rng, int64_t batch, int64_t gamma, double* out,
                                   cudaStream_t stream) {
  const int64_t total = batch * (gamma + 1);
  if (total <= 0) return cudaSuccess;
  const int64_t blocks = (total + 255) / 256 < 4096 ? (total + 255) / 256 : 4096;
  philox_uniforms_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(rng, batch, gamma, out);
  return cudaGetLastError();
}

#define SPECDECODE_INSTANTIATE_PROBS(T)                                                                       \
  template cudaError_t launch_verify_probs<T>(const T*, const T*, const double*, const VerifyRowsIO&, Rule, \
                                              const RuleParams&, cudaStream_t);                             \
  template cudaError_t launch_verify_probs_philox<T>(const T*, const T*, PhiloxSeedOffset, const VerifyRowsIO&, \
                                                     Rule, const RuleParams&, cudaStream_t);

SPECDECODE_INSTANTIATE_PROBS(float)
SPECDECODE_INSTANTIATE_PROBS(__half)
SPECDECODE_INSTANTIATE_PROBS(__nv_bfloat16)
SPECDECODE_INSTANTIATE_PROBS(double)
#undef SPECDECODE_INSTANTIATE_PROBS

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
