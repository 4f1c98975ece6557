// CPU implementation of specdecode::skinny_linear: y = input @ weight.T + bias for inputs with
// few rows (the multi-token forwards of speculative decoding), every weight row read from memory
// once (kernels/skinny_linear.h). Checks, allocation and the parallel split over output
// features live here; every error message is formatted here.
//
// This file is compiled with OpenMP (CMakeLists.txt) so that at::parallel_for runs on torch's
// own OpenMP thread pool (torch's libgomp, loaded before this library) rather than serially.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/skinny_linear.h"
#include "ops/linear_cpu.h"

namespace specdecode {
namespace ops {
namespace {

void check_cpu(const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, ": expected a CPU tensor, got device ", t.device(),
                    " (skinny_linear is the CPU fast path; on other devices use torch.nn.functional.linear)");
}

// Work of one block of kSkinnyColumnAlign output features, in multiply-adds plus a memory term
// (reading the block's weights costs about as much as 8 rows of multiply-adds): tasks get at
// least 2M of it (some 16 µs on one AVX-512 core: a 256 x 256 layer at 16 rows, 1.6M, takes
// 13 µs), so small layers (the demo target's 256 x 256 up to 16 rows, its 688 x 256 and
// 256 x 688 at one or two, every layer of its draft model but the head) stay on one thread,
// while SmolLM2's (576 x 576 and up: 3M at one row) and LM heads split: a parallel region costs
// a few µs on an idle machine, and a whole scheduler time slice when another process holds a
// core.
int64_t grain_blocks(int64_t M, int64_t K) {
  const int64_t work = kernels::kSkinnyColumnAlign * std::max<int64_t>(K, 1) * (M + 8);
  return std::max<int64_t>(1, (int64_t{1} << 21) / work);
}

template <typename WT>
void run(const at::Tensor& x, const at::Tensor& w, const float* bias, at::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const kernels::SkinnyLinearArgs<WT> args{x.data_ptr<float>(), K, reinterpret_cast<const WT*>(w.const_data_ptr()),
                                           bias, y.data_ptr<float>(), N, M, K};
  const int64_t align = kernels::kSkinnyColumnAlign;
  const int64_t blocks = (N + align - 1) / align;
  at::parallel_for(0, blocks, grain_blocks(M, K), [&](int64_t begin, int64_t end) {
    kernels::skinny_linear_columns(args, begin * align, std::min(end * align, N));
  });
}

// input [..., K] (any leading dimensions, like F.linear), weight [N, K], bias [N] or None
// -> [..., N] float32.
at::Tensor skinny_linear_cpu(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_TYPE(input.defined(), "input: expected a Tensor, got None");
  TORCH_CHECK_TYPE(weight.defined(), "weight: expected a Tensor, got None");
  check_cpu("input", input);
  check_cpu("weight", weight);
  TORCH_CHECK_TYPE(input.scalar_type() == at::kFloat, "input: expected dtype float32, got ", input.scalar_type());
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kFloat || weight.scalar_type() == at::kBFloat16,
                   "weight: expected dtype float32 or bfloat16, got ", weight.scalar_type());
  TORCH_CHECK_VALUE(input.dim() >= 1, "input: expected shape [..., K] (at least one dimension), got a 0-dimensional tensor");
  TORCH_CHECK_VALUE(weight.dim() == 2, "weight: expected shape [N, K], got ", weight.dim(), " dimensions ",
                    weight.sizes());
  const int64_t K = input.size(-1), N = weight.size(0);
  TORCH_CHECK_VALUE(weight.size(1) == K, "weight: expected shape [N, K] with K = ", K,
                    " (input's last dimension), got ", weight.sizes());
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    check_cpu("bias", *bias);
    TORCH_CHECK_TYPE(bias->scalar_type() == at::kFloat, "bias: expected dtype float32, got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N, "bias: expected shape [N] = [", N, "], got ",
                      bias->sizes());
  }
  std::vector<int64_t> out_sizes(input.sizes().begin(), input.sizes().end());
  out_sizes.back() = N;
  at::Tensor y = at::empty(out_sizes, input.options());
  const int64_t M = K > 0 ? input.numel() / K : c10::multiply_integers(input.sizes().begin(), input.sizes().end() - 1);
  if (M == 0 || N == 0) return y;
  const at::Tensor x = input.reshape({M, K}).contiguous();
  const at::Tensor w = weight.contiguous();
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const float* b_ptr = has_bias ? b.data_ptr<float>() : nullptr;
  at::Tensor y2 = y.view({M, N});
  if (w.scalar_type() == at::kFloat)
    run<float>(x, w, b_ptr, y2);
  else
    run<uint16_t>(x, w, b_ptr, y2);
  return y;
}

}  // namespace

bool skinny_linear_is_parallel() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("skinny_linear", &skinny_linear_cpu); }

}  // namespace ops
}  // namespace specdecode
