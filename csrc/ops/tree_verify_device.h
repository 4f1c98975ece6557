// The bodies of the device implementations of verify_tree and verify_tree_philox: the CPU
// op's checks in the CPU op's order (tree_checks.h, checks.h), output and scratch allocation,
// one call of the torch-free launcher (kernels/cuda/tree_verify.cuh), and the per-row statuses
// raised as the CPU raises them. Host code only: every message is formatted here or in the
// check headers, never in a .cu file.
//
// Templates over the Backend of verify_device.h (with its launch_tree); csrc/ops/
// tree_verify_cuda.cpp instantiates them for CUDA, the test suite's CUDA emulator
// (tests/cuda_emu) for CPU tensors.
//
// Raising a bad row's error copies the statuses to the host (one stream synchronisation). The
// Philox variant skips that copy while a CUDA graph is being captured (its coins come from the
// device tensors seed and offset), so a captured call can be replayed with a new offset; a bad
// row then comes back with accepted_len = -1 and tokens / nodes all -1.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>
#include <tuple>

#include "kernels/cuda/tree_verify.cuh"
#include "ops/tree_checks.h"
#include "ops/verify_device.h"

namespace specdecode {
namespace ops {

using TreeVerifyOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// verify_tree, and verify_tree_philox when coins.philox() (`uniforms` is then the placeholder).
template <class Backend>
TreeVerifyOutputs verify_tree_device(const Backend& backend, const at::Tensor& target_logits,
                                     const std::optional<at::Tensor>& draft_logits, const at::Tensor& tree_tokens,
                                     const at::Tensor& parents, const at::Tensor& num_nodes,
                                     const at::Tensor& uniforms, CoinTensors coins, double temperature,
                                     int64_t top_k, double top_p, double min_p, c10::string_view rule_name,
                                     at::ArrayRef<double> rule_params) {
  check_sampling_params(temperature, top_k, top_p, min_p);
  kernels::TreeRule rule = parse_tree_rule(std::string_view(rule_name.data(), rule_name.size()));
  const kernels::RuleParams params = parse_tree_rule_params(rule, rule_params);
  // Temperature 0: p is one-hot on the argmax and every tree rule becomes the greedy walk.
  if (temperature == 0.0) rule = kernels::TreeRule::kGreedy;
  const bool needs_draft = kernels::tree_rule_needs_draft(rule);
  const TreeVerifyDims d =
      check_verify_tree_inputs(target_logits, draft_logits, needs_draft, tree_tokens, parents, num_nodes, uniforms);
  const int64_t B = d.batch, N = d.max_nodes, V = d.vocab_size;
  const at::TensorOptions long_options = target_logits.options().dtype(at::kLong);
  if (B == 0)
    return {at::empty({0, N}, long_options), at::empty({0}, long_options), at::empty({0, N}, long_options)};
  backend.check_device("target_logits", target_logits);
  const auto guard = backend.guard(target_logits);
  const at::Tensor target = target_logits.contiguous();
  const at::Tensor draft = needs_draft && draft_logits.has_value() ? draft_logits->contiguous() : at::Tensor();
  const at::Tensor tokens_c = tree_tokens.contiguous(), parents_c = parents.contiguous();
  const at::Tensor n_c = num_nodes.contiguous();
  if (!coins.philox()) coins.uniforms = uniforms.contiguous();
  TreeVerifyOutputs out{at::empty({B, N}, long_options), at::empty({B}, long_options),
                        at::empty({B, N}, long_options)};

  kc::TreeVerifyProblem problem;
  problem.elem = elem_type_of(target);
  problem.target = target.data_ptr();
  problem.draft = draft.defined() ? draft.data_ptr() : nullptr;
  problem.tree_tokens = tokens_c.data_ptr<int64_t>();
  problem.parents = parents_c.data_ptr<int64_t>();
  problem.num_nodes = n_c.data_ptr<int64_t>();
  if (coins.philox()) {
    problem.coins.philox_seed = coins.seed.data_ptr<int64_t>();
    problem.coins.philox_offset = coins.offset.data_ptr<int64_t>();
  } else {
    problem.coins.uniforms = coins.uniforms.data_ptr<double>();
  }
  problem.batch = B;
  problem.max_nodes = N;
  problem.vocab = V;
  problem.rule = rule;
  problem.params = params;
  problem.sampling = device_sampling(temperature, top_k, top_p, min_p);
  problem.out_tokens = std::get<0>(out).data_ptr<int64_t>();
  problem.out_accepted_len = std::get<1>(out).data_ptr<int64_t>();
  problem.out_accepted_nodes = std::get<2>(out).data_ptr<int64_t>();
  const size_t kernel_bytes = kc::tree_verify_scratch_bytes(problem);
  const ScratchWithStatus scratch = allocate_scratch(target, kernel_bytes, B);
  problem.out_status = scratch.status.data_ptr<int32_t>();
  backend.launch_tree("verify_tree", problem, scratch.kernel_scratch, kernel_bytes);
  if (!coins.philox() || !backend.capturing()) {
    const at::Tensor host = scratch.status.to(at::kCPU);
    const int32_t* s = host.data_ptr<int32_t>();
    for (int64_t b = 0; b < B; ++b) raise_tree_status("verify_tree", b, s[b]);
  }
  return out;
}

// The Philox variant checks (seed, offset) and parents' rank first, as the CPU op does before
// it generates its coins (check_tree_philox_args).
template <class Backend>
TreeVerifyOutputs verify_tree_philox_device(const Backend& backend, const at::Tensor& target_logits,
                                            const std::optional<at::Tensor>& draft_logits,
                                            const at::Tensor& tree_tokens, const at::Tensor& parents,
                                            const at::Tensor& num_nodes, const at::Tensor& philox_seed,
                                            const at::Tensor& philox_offset, double temperature, int64_t top_k,
                                            double top_p, double min_p, c10::string_view rule_name,
                                            at::ArrayRef<double> rule_params) {
  check_tree_philox_args(target_logits, parents, philox_seed, philox_offset);
  CoinTensors coins;
  coins.seed = philox_seed;
  coins.offset = philox_offset;
  const at::Tensor placeholder = philox_placeholder(parents, {parents.size(0), parents.size(1)});
  return verify_tree_device(backend, target_logits, draft_logits, tree_tokens, parents, num_nodes, placeholder, coins,
                            temperature, top_k, top_p, min_p, rule_name, rule_params);
}

}  // namespace ops
}  // namespace specdecode
