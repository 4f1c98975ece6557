// verify_logits launchers (explicit uniforms and in-kernel Philox), instantiated for float,
// __half, __nv_bfloat16 and double.
#include "kernels/cuda/launch.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template <typename T>
cudaError_t launch_verify_logits(const T* target_logits, const T* draft_logits, const double* uniforms,
                                 const VerifyRowsIO& io, const SamplingParams& sampling, Rule rule,
                                 const RuleParams& params, cudaStream_t stream) {
  const RowsArgs<T> a{target_logits, draft_logits, io, rule, params};
  return launch_rows(a, LogitSource<T>{make_logit_params(sampling)}, UniformsInMemory{uniforms}, stream);
}

template <typename T>
cudaError_t launch_verify_logits_philox(const T* target_logits, const T* draft_logits, PhiloxSeedOffset rng,
                                        const VerifyRowsIO& io, const SamplingParams& sampling, Rule rule,
                                        const RuleParams& params, cudaStream_t stream) {
  const RowsArgs<T> a{target_logits, draft_logits, io, rule, params};
  return launch_rows(a, LogitSource<T>{make_logit_params(sampling)}, UniformsPhilox{rng}, stream);
}

#define SPECDECODE_INSTANTIATE_LOGITS(T)                                                                          \
  template cudaError_t launch_verify_logits<T>(const T*, const T*, const double*, const VerifyRowsIO&,          \
                                               const SamplingParams&, Rule, const RuleParams&, cudaStream_t);    \
  template cudaError_t launch_verify_logits_philox<T>(const T*, const T*, PhiloxSeedOffset, const VerifyRowsIO&, \
                                                      const SamplingParams&, Rule, const RuleParams&, cudaStream_t);

SPECDECODE_INSTANTIATE_LOGITS(float)
SPECDECODE_INSTANTIATE_LOGITS(__half)
SPECDECODE_INSTANTIATE_LOGITS(__nv_bfloat16)
SPECDECODE_INSTANTIATE_LOGITS(double)
#undef SPECDECODE_INSTANTIATE_LOGITS

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
