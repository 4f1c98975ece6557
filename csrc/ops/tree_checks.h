// Input checks and error messages of the token-tree ops (tree_attention_mask, verify_tree),
// shared by the CPU and CUDA bindings. Host code only: every message is formatted here.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <string>
#include <string_view>

#include "kernels/tree_mask.h"
#include "kernels/tree_verify.h"
#include "ops/checks.h"

namespace specdecode {
namespace ops {

struct TreeDims {
  int64_t batch;      // B
  int64_t max_nodes;  // N
};

// parents [B, N] int64 with 1 <= N <= kMaxTreeNodes; num_nodes [B] int64; same device.
inline TreeDims check_tree_structure_inputs(const at::Tensor& parents, const at::Tensor& num_nodes) {
  TORCH_CHECK_VALUE(parents.dim() == 2, "parents: expected shape [B, N], got ", parents.sizes());
  TORCH_CHECK_TYPE(parents.scalar_type() == at::kLong, "parents: expected int64, got ", parents.scalar_type());
  const int64_t B = parents.size(0), N = parents.size(1);
  TORCH_CHECK_VALUE(N >= 1 && N <= kernels::kMaxTreeNodes, "parents: the number of node slots N must lie in [1, ",
                    kernels::kMaxTreeNodes, "], got shape ", parents.sizes());
  TORCH_CHECK_VALUE(num_nodes.dim() == 1 && num_nodes.size(0) == B, "num_nodes: expected shape [B] = [", B, "], got ",
                    num_nodes.sizes());
  TORCH_CHECK_TYPE(num_nodes.scalar_type() == at::kLong, "num_nodes: expected int64, got ", num_nodes.scalar_type());
  TORCH_CHECK_VALUE(num_nodes.device() == parents.device(), "num_nodes: expected device ", parents.device(), ", got ",
                    num_nodes.device());
  return {B, N};
}

inline bool is_prefix_mask_type(at::ScalarType t) {
  return t == at::kBool || t == at::kByte || t == at::kInt || t == at::kLong;
}

// prefix_mask [B, W] bool / uint8 / int32 / int64 (W may be 0); root_positions [B] int64.
inline int64_t check_tree_mask_inputs(const TreeDims& d, const at::Tensor& parents, const at::Tensor& prefix_mask,
                                      const at::Tensor& root_positions) {
  TORCH_CHECK_VALUE(prefix_mask.dim() == 2 && prefix_mask.size(0) == d.batch, "prefix_mask: expected shape [B, W] = [",
                    d.batch, ", W], got ", prefix_mask.sizes());
  TORCH_CHECK_TYPE(is_prefix_mask_type(prefix_mask.scalar_type()),
                   "prefix_mask: expected bool, uint8, int32 or int64 (0/1 per cache column), got ",
                   prefix_mask.scalar_type());
  TORCH_CHECK_VALUE(root_positions.dim() == 1 && root_positions.size(0) == d.batch,
                    "root_positions: expected shape [B] = [", d.batch, "], got ", root_positions.sizes());
  TORCH_CHECK_TYPE(root_positions.scalar_type() == at::kLong, "root_positions: expected int64, got ",
                   root_positions.scalar_type());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"prefix_mask", &prefix_mask},
                                std::pair<const char*, const at::Tensor*>{"root_positions", &root_positions}})
    TORCH_CHECK_VALUE(t->device() == parents.device(), name, ": expected device ", parents.device(), " (that of parents), got ",
                      t->device());
  return prefix_mask.size(1);
}

inline const char* tree_status_message(int32_t code) {
  switch (code) {
    case kernels::kTreeNumNodesOutOfRange: return "num_nodes[b] must lie in [1, N]";
    case kernels::kTreeBadRoot: return "parents[b, 0] must be -1 (node 0 is the root)";
    case kernels::kTreeBadParent:
      return "every node 0 < i < num_nodes[b] needs a parent before it: 0 <= parents[b, i] < i";
    case kernels::kTreeBadPrefixMask: return "prefix_mask must hold only 0 and 1 (1 = a real cache column)";
    case kernels::kTreeBadRootPosition: return "root_positions must be >= 0";
    case kernels::kTreeTokenOutOfRange: return "tree_tokens holds an id outside [0, V) at a node 0 < i < num_nodes[b]";
    case kernels::kTreeDuplicateSiblings:
      return "two children of one node carry the same token; this rule's drafting scheme makes siblings distinct";
    case kernels::kTreeNotPaths:
      return "the gbv rule needs K disjoint paths of one length below the root (root children, each the head of a "
             "chain)";
    default: return kernels::row_status_message(code);
  }
}

// Raises the ValueError for one row's status, naming the argument that holds the bad value.
inline void raise_tree_status(const char* op, int64_t row, int32_t status, const char* target_name = "target_logits",
                              const char* draft_name = "draft_logits") {
  if (status == kernels::kOk) return;
  const int32_t code = status & ~kernels::kStatusInDraft;
  const char* argument = nullptr;
  switch (code) {
    case kernels::kTreeNumNodesOutOfRange: argument = "num_nodes"; break;
    case kernels::kTreeBadRoot:
    case kernels::kTreeBadParent:
    case kernels::kTreeNotPaths: argument = "parents"; break;
    case kernels::kTreeBadPrefixMask: argument = "prefix_mask"; break;
    case kernels::kTreeBadRootPosition: argument = "root_positions"; break;
    case kernels::kTreeTokenOutOfRange:
    case kernels::kTreeDuplicateSiblings: argument = "tree_tokens"; break;
    default: argument = (status & kernels::kStatusInDraft) ? draft_name : target_name;
  }
  TORCH_CHECK_VALUE(false, argument, ": ", op, ", row ", row, ": ", tree_status_message(code));
}

inline kernels::TreeRule parse_tree_rule(std::string_view rule) {
  if (rule == "greedy") return kernels::TreeRule::kGreedy;
  if (rule == "specinfer") return kernels::TreeRule::kSpecInfer;
  if (rule == "rrs") return kernels::TreeRule::kRecursiveRejection;
  if (rule == "deterministic") return kernels::TreeRule::kDeterministic;
  if (rule == "typical") return kernels::TreeRule::kTypical;
  if (rule == "spectr") return kernels::TreeRule::kSpecTr;
  if (rule == "spechub") return kernels::TreeRule::kSpecHub;
  if (rule == "traversal") return kernels::TreeRule::kTraversal;
  if (rule == "traversal_iid") return kernels::TreeRule::kTraversalIid;
  if (rule == "gbv") return kernels::TreeRule::kGbv;
  TORCH_CHECK_VALUE(false, "rule: unknown tree rule '", std::string(rule),
                    "'; expected one of greedy, specinfer, rrs, deterministic, typical, spectr, spechub, traversal, "
                    "traversal_iid, gbv");
}

// rule_params: typical -> [epsilon, delta, sample_correction (0/1)]; the others -> [].
inline kernels::RuleParams parse_tree_rule_params(kernels::TreeRule rule, at::ArrayRef<double> values) {
  if (rule == kernels::TreeRule::kTypical) return parse_rule_params(kernels::Rule::kTypical, values);
  TORCH_CHECK_VALUE(values.empty(), "rule_params: this tree rule takes no parameters, got ", values.size());
  return kernels::RuleParams{};
}

// verify_tree_philox, before anything else: one int64 seed and offset (check_philox_args),
// parents [B, N] (the shape of the coins).
inline void check_tree_philox_args(const at::Tensor& target_logits, const at::Tensor& parents,
                                   const at::Tensor& philox_seed, const at::Tensor& philox_offset) {
  check_philox_args(target_logits, philox_seed, philox_offset, "target_logits");
  TORCH_CHECK_VALUE(parents.dim() == 2, "parents: expected shape [B, N], got ", parents.sizes());
}

struct TreeVerifyDims {
  int64_t batch;       // B
  int64_t max_nodes;   // N
  int64_t vocab_size;  // V
};

// target [B, N, V] floating; draft [B, N, V] same dtype/device (optional); tree_tokens and
// parents [B, N] int64; num_nodes [B] int64; uniforms [B, N] float64; one device.
inline TreeVerifyDims check_verify_tree_inputs(const at::Tensor& target, const std::optional<at::Tensor>& draft,
                                               bool draft_required, const at::Tensor& tree_tokens,
                                               const at::Tensor& parents, const at::Tensor& num_nodes,
                                               const at::Tensor& uniforms) {
  TORCH_CHECK_VALUE(target.dim() == 3, "target_logits: expected shape [B, N, V], got a ", target.dim(),
                    "-d tensor of shape ", target.sizes());
  TORCH_CHECK_TYPE(is_supported_float(target.scalar_type()),
                   "target_logits: expected float32, float16, bfloat16 or float64, got ", target.scalar_type());
  const TreeDims d = check_tree_structure_inputs(parents, num_nodes);
  const int64_t V = target.size(2);
  TORCH_CHECK_VALUE(target.size(0) == d.batch && target.size(1) == d.max_nodes,
                    "target_logits: expected shape [B, N, V] = [", d.batch, ", ", d.max_nodes, ", V] (from parents), got ",
                    target.sizes());
  TORCH_CHECK_VALUE(V >= 1, "target_logits: the vocabulary dimension V must be >= 1");
  TORCH_CHECK_VALUE(tree_tokens.dim() == 2 && tree_tokens.size(0) == d.batch && tree_tokens.size(1) == d.max_nodes,
                    "tree_tokens: expected shape [B, N] = [", d.batch, ", ", d.max_nodes, "], got ", tree_tokens.sizes());
  TORCH_CHECK_TYPE(tree_tokens.scalar_type() == at::kLong, "tree_tokens: expected int64, got ",
                   tree_tokens.scalar_type());
  if (draft.has_value()) {
    const at::Tensor& q = *draft;
    TORCH_CHECK_VALUE(q.dim() == 3 && q.size(0) == d.batch && q.size(1) == d.max_nodes && q.size(2) == V,
                      "draft_logits: expected shape [B, N, V] = [", d.batch, ", ", d.max_nodes, ", ", V, "], got ",
                      q.sizes());
    TORCH_CHECK_TYPE(q.scalar_type() == target.scalar_type(), "draft_logits: expected dtype ", target.scalar_type(),
                     " (that of target_logits), got ", q.scalar_type());
    TORCH_CHECK_VALUE(q.device() == target.device(), "draft_logits: expected device ", target.device(), ", got ",
                      q.device());
  } else {
    TORCH_CHECK_VALUE(!draft_required,
                      "draft_logits: this tree rule needs the draft's logits at every node, shape [B, N, V]");
  }
  TORCH_CHECK_VALUE(uniforms.dim() == 2 && uniforms.size(0) == d.batch && uniforms.size(1) == d.max_nodes,
                    "uniforms: expected shape [B, N] = [", d.batch, ", ", d.max_nodes, "], got ", uniforms.sizes());
  TORCH_CHECK_TYPE(uniforms.scalar_type() == at::kDouble, "uniforms: expected float64, got ", uniforms.scalar_type());
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"tree_tokens", &tree_tokens},
                                std::pair<const char*, const at::Tensor*>{"parents", &parents},
                                std::pair<const char*, const at::Tensor*>{"uniforms", &uniforms}})
    TORCH_CHECK_VALUE(t->device() == target.device(), name, ": expected device ", target.device(),
                      " (that of target_logits), got ", t->device());
  return {d.batch, d.max_nodes, V};
}

}  // namespace ops
}  // namespace specdecode
