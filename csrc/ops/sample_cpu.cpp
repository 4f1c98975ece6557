// CPU implementation of specdecode::sample_logits (and its Philox variant): one token per row
// from the processed distribution of a logit row, the same LogitRow the verification ops use.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <memory>
#include <vector>

#include "kernels/philox.h"
#include "kernels/sample.h"
#include "ops/checks.h"

namespace specdecode {
namespace ops {
namespace {

using kernels::LogitRow;
using kernels::SamplingParams;
using kernels::Workspace;

at::Tensor sample_logits_cpu(const at::Tensor& logits, const at::Tensor& uniforms, double temperature, int64_t top_k,
                             double top_p, double min_p) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  check_sample_inputs(logits, uniforms);
  const int64_t B = logits.size(0), V = logits.size(1);
  at::Tensor tokens = at::empty({B}, logits.options().dtype(at::kLong));
  if (B == 0) return tokens;
  const at::Tensor x = logits.contiguous();
  const at::Tensor u = uniforms.contiguous();
  const bool greedy = temperature == 0.0;
  SamplingParams sampling;
  sampling.temperature = greedy ? 1.0 : temperature;
  sampling.top_k = top_k;
  sampling.top_p = top_p;
  sampling.min_p = min_p;
  std::vector<int32_t> status(B, kernels::kOk);
  int64_t* out = tokens.data_ptr<int64_t>();
  const double* u_ptr = u.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "sample_logits_cpu", [&] {
    const scalar_t* base = x.data_ptr<scalar_t>();
    at::parallel_for(0, B, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, V)), [&](int64_t begin, int64_t end) {
      std::unique_ptr<double[]> scratch(new double[V]);
      std::unique_ptr<float[]> select(sampling.filters() && !greedy ? new float[V] : nullptr);
      Workspace ws{scratch.get(), nullptr, select.get()};
      for (int64_t b = begin; b < end; ++b) {
        const LogitRow<scalar_t> row(base + b * V, V, &sampling, &ws);
        const kernels::SampleResult r = kernels::sample_row(row, greedy, u_ptr[b], scratch.get());
        out[b] = r.token;
        status[b] = r.status;
      }
    });
  });
  for (int64_t b = 0; b < B; ++b) raise_row_status("sample_logits", b, status[b], "logits", "logits");
  return tokens;
}

at::Tensor sample_logits_philox_cpu(const at::Tensor& logits, const at::Tensor& philox_seed,
                                    const at::Tensor& philox_offset, double temperature, int64_t top_k, double top_p,
                                    double min_p) {
  check_philox_args(logits, philox_seed, philox_offset, "logits");
  TORCH_CHECK_VALUE(logits.dim() == 2, "logits: expected shape [B, V], got ", logits.sizes());
  const int64_t B = logits.size(0);
  const uint64_t seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
  const uint64_t offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  at::Tensor uniforms = at::empty({B}, logits.options().dtype(at::kDouble));
  double* u = uniforms.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b) u[b] = kernels::cuda::philox_uniform(seed, offset, static_cast<uint64_t>(b), 0);
  return sample_logits_cpu(logits, uniforms, temperature, top_k, top_p, min_p);
}

at::Tensor processed_probs_cpu(const at::Tensor& logits, double temperature, int64_t top_k, double top_p,
                              double min_p) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  check_processed_probs_inputs(logits);
  const int64_t B = logits.size(0), V = logits.size(1);
  at::Tensor probs = at::empty({B, V}, logits.options().dtype(at::kDouble));
  if (B == 0) return probs;
  const at::Tensor x = logits.contiguous();
  const bool greedy = temperature == 0.0;
  SamplingParams sampling;
  sampling.temperature = greedy ? 1.0 : temperature;
  sampling.top_k = top_k;
  sampling.top_p = top_p;
  sampling.min_p = min_p;
  std::vector<int32_t> status(B, kernels::kOk);
  double* out = probs.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "processed_probs_cpu", [&] {
    const scalar_t* base = x.data_ptr<scalar_t>();
    at::parallel_for(0, B, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, V)), [&](int64_t begin, int64_t end) {
      std::unique_ptr<float[]> select(sampling.filters() && !greedy ? new float[V] : nullptr);
      Workspace ws{nullptr, nullptr, select.get()};
      for (int64_t b = begin; b < end; ++b) {
        const LogitRow<scalar_t> row(base + b * V, V, &sampling, &ws);
        double* dst = out + b * V;
        if (greedy) {
          const int64_t best = row.argmax();
          for (int64_t v = 0; v < V; ++v) dst[v] = 0.0;
          dst[best] = 1.0;
        } else {
          const double total = row.fill(dst);
          if (row.status() == kernels::kOk && total > 0.0)
            for (int64_t v = 0; v < V; ++v) dst[v] /= total;
        }
        status[b] = row.status();
      }
    });
  });
  for (int64_t b = 0; b < B; ++b) raise_row_status("processed_probs", b, status[b], "logits", "logits");
  return probs;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CPU, m) {
  m.impl("sample_logits", &sample_logits_cpu);
  m.impl("sample_logits_philox", &sample_logits_philox_cpu);
  m.impl("processed_probs", &processed_probs_cpu);
}

}  // namespace ops
}  // namespace specdecode
