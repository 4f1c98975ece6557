// CPU implementation of specdecode::tree_attention_mask: checks, the prefix-mask dtype
// dispatch, and a parallel loop over rows calling the torch-free row kernel (kernels/tree_mask.h).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "kernels/tree_mask.h"
#include "ops/tree_checks.h"

namespace specdecode {
namespace ops {
namespace {

using TreeMaskOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

template <typename MaskT>
void masks_rows(const TreeDims& d, int64_t W, const at::Tensor& parents, const at::Tensor& num_nodes,
                const at::Tensor& prefix_mask, const at::Tensor& root_positions, TreeMaskOutputs& out,
                std::vector<int32_t>& status) {
  const int64_t N = d.max_nodes, words = kernels::tree_mask_words(N);
  const int64_t* parents_ptr = parents.data_ptr<int64_t>();
  const int64_t* n_ptr = num_nodes.data_ptr<int64_t>();
  const int64_t* root_ptr = root_positions.data_ptr<int64_t>();
  const MaskT* prefix_ptr = prefix_mask.data_ptr<MaskT>();
  int64_t* positions = std::get<0>(out).data_ptr<int64_t>();
  bool* attention = std::get<1>(out).data_ptr<bool>();
  bool* tree_mask = std::get<2>(out).data_ptr<bool>();
  int32_t* packed = std::get<3>(out).data_ptr<int32_t>();
  int64_t* first_child = std::get<4>(out).data_ptr<int64_t>();
  int64_t* next_sibling = std::get<5>(out).data_ptr<int64_t>();
  int64_t* depth = std::get<6>(out).data_ptr<int64_t>();
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * (W + N)));
  at::parallel_for(0, d.batch, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const kernels::TreeMaskRowOut row{positions + b * N,    attention + b * N * (W + N), tree_mask + b * N * N,
                                        packed + b * N * words, first_child + b * N,       next_sibling + b * N,
                                        depth + b * N};
      status[b] = kernels::tree_masks_row(parents_ptr + b * N, n_ptr[b], N, prefix_ptr + b * W, W, root_ptr[b], row);
    }
  });
}

TreeMaskOutputs tree_attention_mask_cpu(const at::Tensor& parents, const at::Tensor& num_nodes,
                                        const at::Tensor& prefix_mask, const at::Tensor& root_positions) {
  const TreeDims d = check_tree_structure_inputs(parents, num_nodes);
  const int64_t W = check_tree_mask_inputs(d, parents, prefix_mask, root_positions);
  const int64_t B = d.batch, N = d.max_nodes;
  const at::TensorOptions long_options = parents.options();
  TreeMaskOutputs out{at::empty({B, N}, long_options),
                      at::empty({B, 1, N, W + N}, long_options.dtype(at::kBool)),
                      at::empty({B, N, N}, long_options.dtype(at::kBool)),
                      at::empty({B, N, kernels::tree_mask_words(N)}, long_options.dtype(at::kInt)),
                      at::empty({B, N}, long_options),
                      at::empty({B, N}, long_options),
                      at::empty({B, N}, long_options)};
  const at::Tensor parents_c = parents.contiguous(), n_c = num_nodes.contiguous();
  const at::Tensor prefix_c = prefix_mask.contiguous(), root_c = root_positions.contiguous();
  std::vector<int32_t> status(B, kernels::kTreeOk);
  switch (prefix_c.scalar_type()) {
    case at::kBool: masks_rows<bool>(d, W, parents_c, n_c, prefix_c, root_c, out, status); break;
    case at::kByte: masks_rows<uint8_t>(d, W, parents_c, n_c, prefix_c, root_c, out, status); break;
    case at::kInt: masks_rows<int32_t>(d, W, parents_c, n_c, prefix_c, root_c, out, status); break;
    case at::kLong: masks_rows<int64_t>(d, W, parents_c, n_c, prefix_c, root_c, out, status); break;
    default: TORCH_CHECK_TYPE(false, "prefix_mask: unsupported dtype ", prefix_c.scalar_type());
  }
  for (int64_t b = 0; b < B; ++b) raise_tree_status("tree_attention_mask", b, status[b]);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(specdecode, CPU, m) { m.impl("tree_attention_mask", &tree_attention_mask_cpu); }

}  // namespace ops
}  // namespace specdecode
