// The verification / sampling pipeline instantiated for double inputs (one translation unit per
// dtype so that they compile in parallel). Torch-free.
#include "kernels/cuda/launch.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

template cudaError_t run_pipeline<double>(const VerifyProblem&, void*, size_t, cudaStream_t);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
