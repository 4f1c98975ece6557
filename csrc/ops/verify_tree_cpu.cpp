// CPU implementations of specdecode::verify_tree and specdecode::verify_tree_philox: checks,
// dtype dispatch, and a parallel loop over rows. Each row's tree is checked and linked
// (kernels/tree_mask.h), then walked by the per-node rules of kernels/tree_verify.h on the
// same LogitRow distributions verify_logits uses.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/philox.h"
#include "kernels/tree_verify.h"
#include "ops/tree_checks.h"

namespace specdecode {
namespace ops {
namespace {

using kernels::LogitRow;
using kernels::SamplingParams;
using kernels::TreeRule;

using TreeVerifyOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

TreeVerifyOutputs verify_tree_cpu(const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
                                  const at::Tensor& tree_tokens, const at::Tensor& parents,
                                  const at::Tensor& num_nodes, const at::Tensor& uniforms, double temperature,
                                  int64_t top_k, double top_p, double min_p, c10::string_view rule_name,
                                  at::ArrayRef<double> rule_params) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  TreeRule rule = parse_tree_rule(std::string_view(rule_name.data(), rule_name.size()));
  const kernels::RuleParams params = parse_tree_rule_params(rule, rule_params);
  // Temperature 0: p is one-hot on the argmax and every tree rule becomes the greedy walk.
  if (temperature == 0.0) rule = TreeRule::kGreedy;
  const bool needs_draft = kernels::tree_rule_needs_draft(rule);
  const TreeVerifyDims d =
      check_verify_tree_inputs(target_logits, draft_logits, needs_draft, tree_tokens, parents, num_nodes, uniforms);
  const int64_t B = d.batch, N = d.max_nodes, V = d.vocab_size;
  at::Tensor out_tokens = at::full({B, N}, -1, tree_tokens.options());
  at::Tensor accepted_len = at::zeros({B}, tree_tokens.options());
  at::Tensor accepted_nodes = at::full({B, N}, -1, tree_tokens.options());
  if (B == 0) return {out_tokens, accepted_len, accepted_nodes};

  const at::Tensor target = target_logits.contiguous();
  const bool has_draft = needs_draft && draft_logits.has_value();
  const at::Tensor draft = has_draft ? draft_logits->contiguous() : at::Tensor();
  const at::Tensor tokens_c = tree_tokens.contiguous(), parents_c = parents.contiguous();
  const at::Tensor n_c = num_nodes.contiguous(), u_c = uniforms.contiguous();
  SamplingParams sampling;
  sampling.temperature = temperature > 0.0 ? temperature : 1.0;
  sampling.top_k = top_k;
  sampling.top_p = top_p;
  sampling.min_p = min_p;
  const int64_t* token_ptr = tokens_c.data_ptr<int64_t>();
  const int64_t* parent_ptr = parents_c.data_ptr<int64_t>();
  const int64_t* n_ptr = n_c.data_ptr<int64_t>();
  const double* u_ptr = u_c.data_ptr<double>();
  int64_t* out_tok = out_tokens.data_ptr<int64_t>();
  int64_t* out_len = accepted_len.data_ptr<int64_t>();
  int64_t* out_nodes = accepted_nodes.data_ptr<int64_t>();
  std::vector<int32_t> status(B, kernels::kOk);
  const bool stamps = kernels::tree_rule_needs_distinct_siblings(rule);
  const bool array_rows = kernels::tree_rule_is_transport(rule) || rule == TreeRule::kGbv;  // extra, order
  const bool gbv = rule == TreeRule::kGbv;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, target.scalar_type(), "verify_tree_cpu", [&] {
    const scalar_t* t_ptr = target.data_ptr<scalar_t>();
    const scalar_t* d_ptr = has_draft ? draft.data_ptr<scalar_t>() : nullptr;
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, 4 * V + N));
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      // Scratch, uninitialised except the stamps: every use writes before it reads.
      std::unique_ptr<double[]> buf_a(new double[V]), buf_b(new double[V]), buf_d(new double[V]);
      std::unique_ptr<float[]> buf_select(sampling.filters() ? new float[V] : nullptr);
      std::unique_ptr<int64_t[]> stamp(stamps ? new int64_t[V] : nullptr);
      if (stamps) std::fill(stamp.get(), stamp.get() + V, int64_t{-1});
      std::unique_ptr<double[]> buf_extra(array_rows ? new double[3 * V + 2] : nullptr);
      std::unique_ptr<int64_t[]> buf_order(array_rows ? new int64_t[V] : nullptr);
      std::vector<int64_t> depth(N), first_child(N), next_sibling(N);
      std::vector<kernels::TraversalFrame> frames(kernels::tree_rule_is_traversal(rule) ? N : 0);
      std::vector<double> small(gbv ? 6 * N + 4 : 0);
      std::vector<int64_t> small_int(gbv ? 4 * N + 2 : 0);
      kernels::TreeWorkspace ws{kernels::Workspace{buf_a.get(), buf_b.get(), buf_select.get()}, buf_d.get(),
                                buf_extra.get(), buf_order.get(), frames.data(), small.data(), small_int.data()};
      std::vector<LogitRow<scalar_t>> target_rows(N), draft_rows(has_draft ? N : 0);
      for (int64_t b = begin; b < end; ++b) {
        const int64_t n = n_ptr[b];
        const int64_t* row_parents = parent_ptr + b * N;
        const int64_t* row_tokens = token_ptr + b * N;
        int32_t row_status = kernels::check_tree_row(row_parents, n, N);
        if (row_status == kernels::kTreeOk) {
          kernels::tree_links_row(row_parents, n, N, depth.data(), first_child.data(), next_sibling.data());
          row_status = kernels::check_tree_tokens(rule, row_tokens, n, first_child.data(), next_sibling.data(), V,
                                                  stamp.get(), b * N);
        }
        if (row_status != kernels::kTreeOk) {
          status[b] = row_status;
          continue;
        }
        for (int64_t v = 0; v < n; ++v) {
          target_rows[v] = LogitRow<scalar_t>(t_ptr + (b * N + v) * V, V, &sampling, &ws.dist);
          if (has_draft) draft_rows[v] = LogitRow<scalar_t>(d_ptr + (b * N + v) * V, V, &sampling, &ws.dist);
        }
        const kernels::TreeRowArgs<LogitRow<scalar_t>> args{target_rows.data(),
                                                            has_draft ? draft_rows.data() : nullptr,
                                                            row_tokens,
                                                            first_child.data(),
                                                            next_sibling.data(),
                                                            u_ptr + b * N,
                                                            V,
                                                            &ws,
                                                            out_tok + b * N,
                                                            out_nodes + b * N,
                                                            params};
        const kernels::RowResult result = kernels::verify_tree_row(rule, args);
        out_len[b] = result.accepted_len;
        status[b] = result.status;
      }
    });
  });
  for (int64_t b = 0; b < B; ++b) raise_tree_status("verify_tree", b, status[b]);
  return {out_tokens, accepted_len, accepted_nodes};
}

// The [B, N] coins of one Philox call in the tree layout: coin (b, c) = philox_uniform(seed,
// offset, b, c), computed on the host exactly as a CUDA kernel would on the device.
TreeVerifyOutputs verify_tree_philox_cpu(const at::Tensor& target_logits,
                                         const std::optional<at::Tensor>& draft_logits,
                                         const at::Tensor& tree_tokens, const at::Tensor& parents,
                                         const at::Tensor& num_nodes, const at::Tensor& philox_seed,
                                         const at::Tensor& philox_offset, double temperature, int64_t top_k,
                                         double top_p, double min_p, c10::string_view rule_name,
                                         at::ArrayRef<double> rule_params) {
  check_tree_philox_args(target_logits, parents, philox_seed, philox_offset);
  const int64_t B = parents.size(0), N = parents.size(1);
  const uint64_t seed = static_cast<uint64_t>(philox_seed.item<int64_t>());
  const uint64_t offset = static_cast<uint64_t>(philox_offset.item<int64_t>());
  at::Tensor uniforms = at::empty({B, N}, parents.options().dtype(at::kDouble));
  double* u = uniforms.data_ptr<double>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < N; ++c)
      u[b * N + c] = kernels::cuda::philox_uniform(seed, offset, static_cast<uint64_t>(b), static_cast<uint64_t>(c));
  return verify_tree_cpu(target_logits, draft_logits, tree_tokens, parents, num_nodes, uniforms, temperature, top_k,
                         top_p, min_p, rule_name, rule_params);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CPU, m) {
  m.impl("verify_tree", &verify_tree_cpu);
  m.impl("verify_tree_philox", &verify_tree_philox_cpu);
}

}  // namespace ops
}  // namespace specdecode
