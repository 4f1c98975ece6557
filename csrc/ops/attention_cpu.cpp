// CPU implementation of specdecode::skinny_attention: softmax(scale * q k^T + mask) v for few
// queries per row against a static KV cache, masked columns skipped
// (kernels/skinny_attention.h). Checks, allocation and the parallel split over (batch row,
// key/value head) live here; every error message is formatted here.
//
// Compiled with OpenMP like linear_cpu.cpp (CMakeLists.txt), so that at::parallel_for runs on
// torch's own thread pool.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/skinny_attention.h"

namespace specdecode {
namespace ops {
namespace {

void check_tensor(const char* name, const at::Tensor& t, int64_t dims, const char* shape, bool bool_ok = false) {
  TORCH_CHECK_TYPE(t.defined(), name, ": expected a Tensor, got None");
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, ": expected a CPU tensor, got device ", t.device(),
                    " (skinny_attention is the CPU fast path; elsewhere use "
                    "torch.nn.functional.scaled_dot_product_attention)");
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || (bool_ok && t.scalar_type() == at::kBool), name,
                   ": expected dtype float32", bool_ok ? " or bool" : "", ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == dims, name, ": expected shape ", shape, ", got ", t.dim(), " dimensions ", t.sizes());
}

// Rows whose last dimension is not contiguous are copied once (the kernel reads rows of D).
at::Tensor rows_contiguous(const at::Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous(); }

// Tasks per parallel chunk: about 64k multiply-adds of keys and values each (some 10-20 µs),
// so that a small call (one row, a short cache) stays on one thread.
int64_t grain_tasks(int64_t rows, int64_t C, int64_t D) {
  const int64_t work = std::max<int64_t>(1, 2 * rows * C * D);
  return std::max<int64_t>(1, (int64_t{1} << 16) / work);
}

// query [B, H, n, D], key / value [B, Hkv, C, D], attn_mask [B or 1, H or 1, n or 1, C]
// additive float32 or bool (True = attend) -> [B, H, n, D] float32.
at::Tensor skinny_attention_cpu(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                const at::Tensor& attn_mask, double scale) {
  check_tensor("query", query, 4, "[B, H, n, D]");
  check_tensor("key", key, 4, "[B, Hkv, C, D]");
  check_tensor("value", value, 4, "[B, Hkv, C, D]");
  check_tensor("attn_mask", attn_mask, 4, "[B, H or 1, n, C]", /*bool_ok=*/true);
  const int64_t B = query.size(0), H = query.size(1), n = query.size(2), D = query.size(3);
  const int64_t Hkv = key.size(1), C = key.size(2);
  TORCH_CHECK_VALUE(key.size(0) == B && key.size(3) == D, "key: expected shape [B, Hkv, C, D] with B = ", B,
                    " and D = ", D, " (query's), got ", key.sizes());
  TORCH_CHECK_VALUE(value.sizes() == key.sizes(), "value: expected key's shape ", key.sizes(), ", got ",
                    value.sizes());
  TORCH_CHECK_VALUE(Hkv > 0 ? H % Hkv == 0 : H == 0, "key: expected a number of heads Hkv that divides query's H = ",
                    H, ", got Hkv = ", Hkv);
  const int64_t mb = attn_mask.size(0), mh = attn_mask.size(1), mn = attn_mask.size(2), mc = attn_mask.size(3);
  TORCH_CHECK_VALUE((mb == B || mb == 1) && (mh == H || mh == 1) && (mn == n || mn == 1) && mc == C,
                    "attn_mask: expected shape [B or 1, H or 1, n or 1, C] = [", B, ", ", H, ", ", n, ", ", C,
                    "] (query's B, H, n and key's C), got ", attn_mask.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale: expected a finite number, got ", scale);
  at::Tensor out = at::empty({B, H, n, D}, query.options());
  if (out.numel() == 0) return out;
  if (C == 0) return out.zero_();  // no column to attend: zeros, as with every column at -inf
  const at::Tensor q = rows_contiguous(query), k = rows_contiguous(key), v = rows_contiguous(value);
  const at::Tensor& m = attn_mask;
  const bool is_bool = m.scalar_type() == at::kBool;
  kernels::SkinnyAttentionArgs args{q.data_ptr<float>(),
                                    q.stride(0), q.stride(1), q.stride(2),
                                    k.data_ptr<float>(),
                                    k.stride(0), k.stride(1), k.stride(2),
                                    v.data_ptr<float>(),
                                    v.stride(0), v.stride(1), v.stride(2),
                                    is_bool ? nullptr : m.data_ptr<float>(),
                                    is_bool ? reinterpret_cast<const uint8_t*>(m.data_ptr<bool>()) : nullptr,
                                    mb == 1 ? 0 : m.stride(0), mh == 1 ? 0 : m.stride(1), mn == 1 ? 0 : m.stride(2),
                                    m.stride(3),
                                    out.data_ptr<float>(),
                                    H, Hkv, n, C, D,
                                    static_cast<float>(scale)};
  const int64_t rows = H / Hkv * n;
  const int64_t scratch = kernels::skinny_attention_scratch(H, Hkv, n, C, D);
  at::parallel_for(0, B * Hkv, grain_tasks(rows, C, D), [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(static_cast<size_t>(scratch));
    for (int64_t task = begin; task < end; ++task)
      kernels::skinny_attention_task(args, task / Hkv, task % Hkv, buffer.data());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("skinny_attention", &skinny_attention_cpu); }

}  // namespace ops
}  // namespace specdecode
