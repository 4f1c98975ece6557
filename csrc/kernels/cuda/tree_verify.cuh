// Host entry points of the CUDA token-tree verification kernels (verify_tree and
// verify_tree_philox): raw device pointers, a scratch buffer and a stream; no torch, no
// messages. Plain declarations, so host code compiled by g++ (csrc/ops/tree_verify_device.h)
// includes this header and calls the launcher defined in tree_verify.cu.
//
// One call launches a fixed sequence of kernels chosen from the rule and the sampling settings
// only (never from the data), never synchronises, allocates or copies to the host, so it can
// be captured in a CUDA graph. The caller allocates the outputs and
// `tree_verify_scratch_bytes(problem)` bytes of device scratch, and raises on the per-row
// statuses itself (on the host, after the call).
//
// Layouts (contiguous, row-major, all on the current device), as the CPU op documents them
// (kernels/tree_verify.h, kernels/tree_mask.h):
//   target [B, N, V] logits; draft [B, N, V] or null (only the rules that read q use it:
//   specinfer, rrs, spectr, spechub, traversal, traversal_iid, gbv);
//   tree_tokens, parents [B, N] int64; num_nodes [B] int64;
//   coins: uniforms [B, N] float64 (column c > 0 is node c's acceptance coin, column 0 the
//   emitted token's), or Philox: coin (b, c) = philox_uniform(*seed, *offset, b, c) read from
//   DEVICE memory when the kernels run;
//   out_tokens [B, N], out_accepted_nodes [B, N], out_accepted_len [B] int64; out_status [B]
//   int32: kOk, a kernels::TreeStatus of the tree / its tokens, or a RowStatus of the
//   distribution the walk read (kStatusInDraft OR-ed in for the draft's).
// Every output element is written (outputs may be uninitialised memory). A row whose status is
// not kOk gets out_tokens and out_accepted_nodes all -1 and out_accepted_len -1.
//
// Semantics are the CPU op's: the same structure and token checks in the same order, the same
// per-node rules (greedy, specinfer, rrs, deterministic, typical, spectr, spechub) and
// traversal verification (traversal, traversal_iid) and gbv, the same statuses. The state
// kernels summarise the rows of every real node (slots < num_nodes[b]) up front, but only the
// nodes the walk enters are consulted, so a bad row elsewhere raises on neither side. Rounding differs from the CPU only in sums: the
// normaliser of each node's processed distribution (as the chain ops, pipeline.cuh) and the
// float64 masses of residuals / entropies (block-wide reductions instead of sequential sums),
// so a decision can differ only when its coin lies within ~1e-6 of its threshold.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/verify.cuh"
#include "kernels/tree_verify.h"

namespace specdecode {
namespace kernels {
namespace cuda {

struct TreeVerifyProblem {
  ElemType elem = ElemType::kFloat32;
  const void* target = nullptr;
  const void* draft = nullptr;  // null unless the rule reads q
  const int64_t* tree_tokens = nullptr;
  const int64_t* parents = nullptr;
  const int64_t* num_nodes = nullptr;
  Coins coins;  // uniforms [B, N], or Philox
  int64_t batch = 0;      // B >= 0
  int64_t max_nodes = 1;  // N in [1, kMaxTreeNodes]
  int64_t vocab = 1;      // V >= 1
  TreeRule rule = TreeRule::kGreedy;  // temperature 0: kGreedy
  RuleParams params;
  SamplingParams sampling;  // temperature > 0 (1 for the greedy walk at temperature 0)
  int64_t* out_tokens = nullptr;
  int64_t* out_accepted_len = nullptr;
  int64_t* out_accepted_nodes = nullptr;
  int32_t* out_status = nullptr;
};

// Device scratch the call needs, in bytes (0 when B = 0). Pure host arithmetic on the sizes,
// rule and sampling settings.
size_t tree_verify_scratch_bytes(const TreeVerifyProblem& problem);

// Launches the kernels on `stream`. Returns cudaSuccess, the first launch error, or
// cudaErrorInvalidValue for an inconsistent problem (sizes, null pointers, scratch too small).
cudaError_t launch_verify_tree(const TreeVerifyProblem& problem, void* scratch, size_t scratch_bytes,
                               cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
