// The entry points declared in tree_verify.cuh: the scratch layout and the launches of
// verify_tree on the GPU. Torch-free, no messages.
//
// A call runs, on one stream:
//   1. the state kernels of the verification pipeline (launch.cuh launch_state_kernels) over
//      the target's node rows, viewed as a verify_logits problem with gamma = N - 1 whose row b
//      needs units 0..num_nodes[b]-1 (Args::unit_counts): every node's max, argmax, status,
//      filter threshold and normaliser, exactly as for the chain ops;
//   2. the same over the draft's node rows (the rules that read q);
//   3. tree_walk_kernel (tree_walk.cuh), one block per batch row.
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/tree_verify.cuh"
#include "kernels/cuda/tree_walk.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {
namespace {

bool tree_shape_is_valid(const TreeVerifyProblem& p) {
  if (p.batch < 0 || p.batch > (int64_t{1} << 40)) return false;
  if (p.max_nodes < 1 || p.max_nodes > kMaxTreeNodes) return false;
  if (p.vocab < 1 || p.vocab > (int64_t{1} << 40)) return false;
  return p.sampling.temperature > 0.0;
}

// The state problem of the target (draft = false) or draft node rows.
VerifyProblem state_problem(const TreeVerifyProblem& t, bool draft) {
  VerifyProblem p;
  p.task = Task::kVerifyLogits;
  p.elem = t.elem;
  p.target = draft ? t.draft : t.target;
  p.batch = t.batch;
  p.gamma = t.max_nodes - 1;
  p.vocab = t.vocab;
  // greedy: max, argmax and status only; every other rule: the processed distribution
  p.rule = t.rule == TreeRule::kGreedy ? Rule::kGreedy : Rule::kToken;
  p.sampling = t.sampling;
  return p;
}

struct TreePlan {
  PipelinePlan target, draft;
  size_t target_at = 0, draft_at = 0, links = 0, r = 0, d = 0, e = 0, frames = 0, gbv_doubles = 0, gbv_ints = 0;
  size_t bytes = 0;
  bool reads_draft = false;
};

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

TreePlan plan_tree(const TreeVerifyProblem& p) {
  TreePlan plan;
  plan.reads_draft = tree_rule_needs_draft(p.rule);
  plan.target = plan_pipeline(state_problem(p, false));
  size_t offset = aligned(plan.target.bytes);
  if (plan.reads_draft) {
    plan.draft = plan_pipeline(state_problem(p, true));
    plan.draft_at = offset;
    offset += aligned(plan.draft.bytes);
  }
  const size_t B = static_cast<size_t>(p.batch), N = static_cast<size_t>(p.max_nodes), V = static_cast<size_t>(p.vocab);
  plan.links = offset;
  offset += aligned(3 * B * N * sizeof(int64_t));
  plan.r = offset;
  offset += aligned(B * V * sizeof(double));
  const bool traversal = tree_rule_is_traversal(p.rule);
  const bool gbv = p.rule == TreeRule::kGbv;
  if (p.rule == TreeRule::kRecursiveRejection || tree_rule_is_transport(p.rule) || traversal || gbv) {
    plan.d = offset;
    offset += aligned(B * V * sizeof(double));
  } else {
    plan.d = plan.r;  // never read
  }
  if (p.rule == TreeRule::kSpecHub || traversal || gbv) {
    plan.e = offset;
    offset += aligned(B * V * sizeof(double));
  } else {
    plan.e = plan.r;  // never read
  }
  plan.frames = offset;
  if (traversal) offset += aligned(B * N * sizeof(TraversalFrame));
  plan.gbv_doubles = offset;
  if (gbv) offset += aligned(B * (V + 6 * N + 4) * sizeof(double));
  plan.gbv_ints = offset;
  if (gbv) offset += aligned(B * (V + static_cast<size_t>(gbv_sort_size(p.vocab)) + 4 * N + 4) * sizeof(int64_t));
  plan.bytes = p.batch > 0 ? offset : 0;
  return plan;
}

template <typename T>
cudaError_t run_tree(const TreeVerifyProblem& p, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  const TreePlan plan = plan_tree(p);
  if (scratch == nullptr || scratch_bytes < plan.bytes) return cudaErrorInvalidValue;
  unsigned char* base = static_cast<unsigned char*>(scratch);
  TreeArgs<T> a;
  a.target = pipeline_args<T>(state_problem(p, false), plan.target, base + plan.target_at);
  a.target.unit_counts = p.num_nodes;
  a.draft = a.target;
  if (plan.reads_draft) {
    a.draft = pipeline_args<T>(state_problem(p, true), plan.draft, base + plan.draft_at);
    a.draft.unit_counts = p.num_nodes;
  }
  a.tokens = p.tree_tokens;
  a.parents = p.parents;
  a.num_nodes = p.num_nodes;
  a.coins = p.coins;
  a.B = p.batch;
  a.N = p.max_nodes;
  a.V = p.vocab;
  a.rule = p.rule;
  a.params = p.params;
  a.reads_draft = plan.reads_draft;
  a.out_tokens = p.out_tokens;
  a.out_accepted_len = p.out_accepted_len;
  a.out_nodes = p.out_accepted_nodes;
  a.out_status = p.out_status;
  int64_t* links = reinterpret_cast<int64_t*>(base + plan.links);
  a.depth = links;
  a.first_child = links + p.batch * p.max_nodes;
  a.next_sibling = links + 2 * p.batch * p.max_nodes;
  a.r = reinterpret_cast<double*>(base + plan.r);
  a.d = reinterpret_cast<double*>(base + plan.d);
  a.e = reinterpret_cast<double*>(base + plan.e);
  a.frames = reinterpret_cast<TraversalFrame*>(base + plan.frames);
  a.gbv_doubles = reinterpret_cast<double*>(base + plan.gbv_doubles);
  a.gbv_ints = reinterpret_cast<int64_t*>(base + plan.gbv_ints);

  cudaError_t err = launch_state_kernels(a.target, plan.target, stream);
  if (err != cudaSuccess) return err;
  if (plan.reads_draft && (err = launch_state_kernels(a.draft, plan.draft, stream)) != cudaSuccess) return err;
  auto walk = tree_walk_kernel<kTreeWalkThreads, T>;
  return launch_items(walk, p.batch, kTreeWalkThreads, a, stream);
}

}  // namespace

size_t tree_verify_scratch_bytes(const TreeVerifyProblem& problem) {
  if (!tree_shape_is_valid(problem) || problem.batch == 0) return 0;
  return plan_tree(problem).bytes;
}

cudaError_t launch_verify_tree(const TreeVerifyProblem& p, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (!tree_shape_is_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  if (p.target == nullptr || p.tree_tokens == nullptr || p.parents == nullptr || p.num_nodes == nullptr ||
      p.out_tokens == nullptr || p.out_accepted_len == nullptr || p.out_accepted_nodes == nullptr ||
      p.out_status == nullptr)
    return cudaErrorInvalidValue;
  if (p.coins.uniforms == nullptr && (p.coins.philox_seed == nullptr || p.coins.philox_offset == nullptr))
    return cudaErrorInvalidValue;
  if (tree_rule_needs_draft(p.rule) && p.draft == nullptr) return cudaErrorInvalidValue;
  return dispatch_elem(p.elem, [&](auto* tag) {
    return run_tree<std::remove_pointer_t<decltype(tag)>>(p, scratch, scratch_bytes, stream);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
