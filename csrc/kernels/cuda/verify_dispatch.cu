// The entry points declared in verify.cuh: scratch size and the dtype switch over the
// per-dtype instantiations of run_pipeline (verify_f32.cu, verify_f16.cu, verify_bf16.cu,
// verify_f64.cu). Torch-free.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/verify.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

extern template cudaError_t run_pipeline<float>(const VerifyProblem&, void*, size_t, cudaStream_t);
extern template cudaError_t run_pipeline<__half>(const VerifyProblem&, void*, size_t, cudaStream_t);
extern template cudaError_t run_pipeline<__nv_bfloat16>(const VerifyProblem&, void*, size_t, cudaStream_t);
extern template cudaError_t run_pipeline<double>(const VerifyProblem&, void*, size_t, cudaStream_t);

size_t verify_scratch_bytes(const VerifyProblem& problem) {
  if (!shape_is_valid(problem) || problem.batch == 0) return 0;
  return plan_pipeline(problem).bytes;
}

cudaError_t launch_verify(const VerifyProblem& problem, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  return dispatch_elem(problem.elem, [&](auto* tag) {
    return run_pipeline<std::remove_pointer_t<decltype(tag)>>(problem, scratch, scratch_bytes, stream);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
