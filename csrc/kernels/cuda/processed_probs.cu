// processed_probs on the GPU (declared in verify.cuh): the state kernels of the verification
// pipeline (launch.cuh launch_state_kernels) over the rows, viewed as a sample_logits problem,
// then one block per row writes p(x) = LogitRow::prob exactly (logit_prob with the row's
// finished state) and divides by the row's sum (a block-wide reduction; the CPU sums
// sequentially, so the result differs by float64 rounding only). Torch-free, no messages.
#include "kernels/cuda/launch.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {
namespace {

constexpr int kProbsThreads = 256;

template <typename T>
struct ProbsArgs {
  Args<T> rows;  // unit b = row b
  bool greedy;
  double* out_probs;
  int32_t* out_status;
};

template <int BLOCK, typename T>
__global__ void __launch_bounds__(BLOCK) processed_probs_kernel(const ProbsArgs<T> a) {
  __shared__ ReduceScratch scratch;
  const int64_t V = a.rows.V;
  const float it = a.rows.logit.inv_temp;
  for (int64_t b = blockIdx.x; b < a.rows.B; b += gridDim.x) {
    const PosState s = finish_state(a.rows, b);  // every thread computes the same state
    const T* row = a.rows.target + b * V;
    double* out = a.out_probs + b * V;
    if (a.greedy) {
      for (int64_t x = threadIdx.x; x < V; x += BLOCK) out[x] = x == s.argmax ? 1.0 : 0.0;
    } else {
      double part = 0.0;
      for (int64_t x = threadIdx.x; x < V; x += BLOCK) {
        out[x] = logit_prob(s, it, to_float(row[x]));
        part += out[x];
      }
      const double total = block_reduce<BLOCK>(part, OpSum(), scratch);
      if (s.status == kOk && total > 0.0)
        for (int64_t x = threadIdx.x; x < V; x += BLOCK) out[x] /= total;  // each thread its own entries
    }
    if (threadIdx.x == 0) a.out_status[b] = s.status;
    __syncthreads();  // `scratch` is reused by the next row
  }
}

bool probs_shape_is_valid(const ProcessedProbsProblem& p) {
  if (p.batch < 0 || p.batch > (int64_t{1} << 40) || p.vocab < 1 || p.vocab > (int64_t{1} << 40)) return false;
  return p.greedy || p.sampling.temperature > 0.0;
}

VerifyProblem state_problem(const ProcessedProbsProblem& p) {
  VerifyProblem v;
  v.task = Task::kSampleLogits;
  v.elem = p.elem;
  v.target = p.logits;
  v.batch = p.batch;
  v.gamma = 0;
  v.vocab = p.vocab;
  v.greedy = p.greedy;
  v.sampling = p.sampling;
  if (p.greedy) v.sampling.temperature = 1.0;
  return v;
}

template <typename T>
cudaError_t run_processed_probs(const ProcessedProbsProblem& p, void* scratch, size_t scratch_bytes,
                                cudaStream_t stream) {
  const VerifyProblem v = state_problem(p);
  const PipelinePlan plan = plan_pipeline(v);
  if (scratch == nullptr || scratch_bytes < plan.bytes) return cudaErrorInvalidValue;
  ProbsArgs<T> a;
  a.rows = pipeline_args<T>(v, plan, scratch);
  a.greedy = p.greedy;
  a.out_probs = p.out_probs;
  a.out_status = p.out_status;
  const cudaError_t err = launch_state_kernels(a.rows, plan, stream);
  if (err != cudaSuccess) return err;
  auto kernel = processed_probs_kernel<kProbsThreads, T>;
  return launch_items(kernel, p.batch, kProbsThreads, a, stream);
}

}  // namespace

size_t processed_probs_scratch_bytes(const ProcessedProbsProblem& problem) {
  if (!probs_shape_is_valid(problem) || problem.batch == 0) return 0;
  return plan_pipeline(state_problem(problem)).bytes;
}

cudaError_t launch_processed_probs(const ProcessedProbsProblem& p, void* scratch, size_t scratch_bytes,
                                   cudaStream_t stream) {
  if (!probs_shape_is_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  if (p.logits == nullptr || p.out_probs == nullptr || p.out_status == nullptr) return cudaErrorInvalidValue;
  return dispatch_elem(p.elem, [&](auto* tag) {
    return run_processed_probs<std::remove_pointer_t<decltype(tag)>>(p, scratch, scratch_bytes, stream);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
