// The verification / sampling pipeline instantiated for __half inputs (one translation unit per
// dtype so that they compile in parallel). Torch-free.
#include "kernels/cuda/launch.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template cudaError_t run_pipeline<__half>(const VerifyProblem&, void*, size_t, cudaStream_t);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
