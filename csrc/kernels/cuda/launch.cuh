// Host side of the pipeline: which kernels one call launches (a function of the task, the
// rule and the sampling settings only, never of the data: graph-safe), the scratch layout,
// and the launches themselves. Included by the per-dtype translation units verify_*.cu.
// Torch-free; no messages (errors are cudaError_t values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/decide.cuh"
#include "kernels/cuda/filters.cuh"
#include "kernels/cuda/passes.cuh"
#include "kernels/cuda/pipeline.cuh"
#include "kernels/cuda/sampler.cuh"
#include "kernels/cuda/stats.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// What one call runs, and where its scratch lives (byte offsets; kNone = not used).
struct PipelinePlan {
  static constexpr size_t kNone = ~size_t{0};
  bool logits = false;        // stats (+ filters) run
  StatsMode stats_mode = StatsMode::kSum;
  bool merged = false;        // filter merge / fallback / masked sums run
  bool total_pass = false;    // top-p without top-k: exact kept mass of ambiguous units, merge again
  bool fallback = false;      // the radix fallback may be needed (top-k or top-p)
  bool position_pass = false;
  bool sampler = false;
  bool has_draft = false;
  LogitConfig logit{};
  int64_t chunks = 0, sample_chunks = 0, units = 0;
  size_t stats = kNone, lists = kNone, masked_sums = kNone, states = kNone, px = kNone, qx = kNone,
         weights = kNone, pass_flags = kNone, aggs = kNone, plans = kNone, sample = kNone;
  size_t bytes = 0;
};

inline bool rule_reads_draft(Rule rule) { return rule == Rule::kToken || rule == Rule::kBlock; }

// Sizes and settings (what the scratch size depends on).
inline bool shape_is_valid(const VerifyProblem& p) {
  if (p.batch < 0 || p.vocab < 1 || p.batch > (int64_t{1} << 40) || p.vocab > (int64_t{1} << 40)) return false;
  if (p.task == Task::kSampleLogits ? p.gamma != 0 : p.gamma < 1) return false;
  if (p.task == Task::kSampleLogits && !p.greedy && !(p.sampling.temperature > 0.0)) return false;
  if (p.task == Task::kVerifyLogits && p.rule != Rule::kGreedy && !(p.sampling.temperature > 0.0)) return false;
  return true;
}

// Sizes, settings and pointers.
inline bool problem_is_valid(const VerifyProblem& p) {
  if (!shape_is_valid(p)) return false;
  if (p.batch == 0) return true;  // nothing is launched (empty tensors may have null data)
  if (p.target == nullptr || p.out_tokens == nullptr || p.out_status == nullptr) return false;
  if (p.coins.uniforms == nullptr && (p.coins.philox_seed == nullptr || p.coins.philox_offset == nullptr)) return false;
  if (p.task != Task::kSampleLogits) {
    if (p.draft_tokens == nullptr || p.num_draft_tokens == nullptr) return false;
    if (rule_reads_draft(p.rule) && p.draft == nullptr) return false;
  }
  return true;
}

inline PipelinePlan plan_pipeline(const VerifyProblem& p) {
  PipelinePlan plan;
  const bool sample_task = p.task == Task::kSampleLogits;
  const bool greedy_like = sample_task ? p.greedy : p.rule == Rule::kGreedy;
  plan.logits = p.task != Task::kVerifyProbs;
  plan.has_draft = !sample_task && rule_reads_draft(p.rule) && p.draft != nullptr;
  plan.chunks = (p.vocab + kChunk - 1) / kChunk;
  plan.sample_chunks = (p.vocab + kSampleChunk - 1) / kSampleChunk;
  plan.units = p.batch * (p.gamma + 1) + (plan.has_draft ? p.batch * p.gamma : 0);

  LogitConfig& cfg = plan.logit;
  // 1/T clamped to the largest float exactly as the CPU's LogitRow does (tiny temperatures)
  cfg.inv_temp = p.sampling.temperature > 0.0 ? p.sampling.inv_temp() : 1.0f;
  cfg.min_e = p.sampling.min_p > 0.0 ? static_cast<float>(p.sampling.min_p) : 0.0f;
  cfg.top_k = (p.sampling.top_k > 0 && p.sampling.top_k < p.vocab) ? p.sampling.top_k : 0;
  cfg.top_p = p.sampling.top_p;
  cfg.list_target = static_cast<int32_t>(cfg.top_k > 0 ? (cfg.top_k < kTopKFromLists ? cfg.top_k : kTopKFromLists)
                                                       : kListTargetTopP);
  cfg.list_depth = (cfg.top_k == 0 && cfg.top_p < 1.0) ? -kTopPListDepthBits : -std::numeric_limits<float>::infinity();
  if (plan.logits) {
    if (greedy_like) {
      plan.stats_mode = StatsMode::kArgmax;
    } else if (cfg.filters()) {
      plan.merged = true;
      plan.stats_mode = (cfg.top_k > 0 || cfg.top_p < 1.0) ? StatsMode::kSumTopList : StatsMode::kSumMinPList;
      plan.total_pass = cfg.top_p < 1.0 && cfg.top_k == 0;
      plan.fallback = cfg.top_k > 0 || cfg.top_p < 1.0;
    } else {
      plan.stats_mode = StatsMode::kSum;
    }
  }
  if (!sample_task) {
    switch (p.rule) {
      case Rule::kToken: plan.sampler = true; break;
      case Rule::kBlock: plan.position_pass = plan.sampler = true; break;
      case Rule::kGreedy: plan.position_pass = !plan.logits; break;
      case Rule::kTypical: plan.position_pass = true; plan.sampler = p.params.sample_correction; break;
      case Rule::kTopBeta: plan.position_pass = true; break;
    }
  } else {
    plan.sampler = !p.greedy;
  }

  // Scratch: every region 256-byte aligned.
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += (bytes + 255) / 256 * 256;
    return at;
  };
  const size_t B = static_cast<size_t>(p.batch), G = static_cast<size_t>(p.gamma);
  const size_t units = static_cast<size_t>(plan.units), chunks = static_cast<size_t>(plan.chunks);
  if (plan.logits) {
    plan.stats = take(units * chunks * sizeof(ChunkStats));
    plan.states = take(units * sizeof(PosState));
  }
  if (plan.merged) {
    plan.lists = take(units * chunks * kListCap * sizeof(float));
    plan.masked_sums = take(units * chunks * sizeof(double));
  }
  if (!sample_task && p.rule == Rule::kBlock) {
    plan.px = take(B * G * sizeof(double));
    plan.qx = take(B * G * sizeof(double));
    plan.weights = take(B * (G + 1) * sizeof(double));
    plan.pass_flags = take(B * (G + 1) * sizeof(int32_t));
  }
  if (plan.position_pass) plan.aggs = take(B * (G + 1) * chunks * sizeof(PosAgg));
  plan.plans = take(B * sizeof(RowPlan));
  if (plan.sampler) plan.sample = take(B * static_cast<size_t>(plan.sample_chunks) * sizeof(SampleChunkSums));
  plan.bytes = p.batch > 0 ? offset : 0;
  return plan;
}

// run(static_cast<T*>(nullptr)) with T the element type `elem` names: the one dtype switch of
// every launcher (verify_dispatch.cu, tree_verify.cu, processed_probs.cu).
template <class Run>
inline cudaError_t dispatch_elem(ElemType elem, Run run) {
  switch (elem) {
    case ElemType::kFloat32: return run(static_cast<float*>(nullptr));
    case ElemType::kFloat16: return run(static_cast<__half*>(nullptr));
    case ElemType::kBFloat16: return run(static_cast<__nv_bfloat16*>(nullptr));
    case ElemType::kFloat64: return run(static_cast<double*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

template <typename R>
inline R* scratch_at(void* scratch, size_t offset) {
  return offset == PipelinePlan::kNone ? nullptr
                                       : reinterpret_cast<R*>(static_cast<unsigned char*>(scratch) + offset);
}

inline unsigned grid_for(int64_t items) {
  return static_cast<unsigned>(items < static_cast<int64_t>(kMaxGridBlocks) ? items : kMaxGridBlocks);
}

// Launches `kernel` with `items` blocks of `threads` threads (none when items is 0) and returns
// the launch error.
template <typename Kernel, typename A>
inline cudaError_t launch_items(Kernel kernel, int64_t items, int threads, const A& args, cudaStream_t stream) {
  if (items <= 0) return cudaSuccess;
  SPECDECODE_LAUNCH(kernel, grid_for(items), threads, 0, stream)(args);
  return SPECDECODE_LAST_ERROR();
}

template <typename T, StatsMode kMode>
inline cudaError_t launch_stats(const Args<T>& a, const PipelinePlan& plan, cudaStream_t stream) {
  auto kernel = chunk_stats_kernel<kPassThreads, T, kMode>;
  return launch_items(kernel, plan.units * plan.chunks, kPassThreads, a, stream);
}

template <typename T, bool kLogits>
inline cudaError_t launch_sampler(const Args<T>& a, const PipelinePlan& plan, cudaStream_t stream) {
  auto sample1 = sample1_kernel<kPassThreads, T, kLogits>;
  const cudaError_t err = launch_items(sample1, a.B * plan.sample_chunks, kPassThreads, a, stream);
  if (err != cudaSuccess) return err;
  auto sample2 = sample2_kernel<kPassThreads, T, kLogits>;
  return launch_items(sample2, a.B, kPassThreads, a, stream);
}

// The kernels' arguments of a problem whose scratch follows `plan`.
template <typename T>
inline Args<T> pipeline_args(const VerifyProblem& p, const PipelinePlan& plan, void* scratch) {
  Args<T> a;
  a.target = static_cast<const T*>(p.target);
  a.draft = plan.has_draft ? static_cast<const T*>(p.draft) : nullptr;
  a.draft_tokens = p.draft_tokens;
  a.num_draft_tokens = p.num_draft_tokens;
  a.coins = p.coins;
  a.B = p.batch;
  a.G = p.gamma;
  a.V = p.vocab;
  a.chunks = plan.chunks;
  a.sample_chunks = plan.sample_chunks;
  a.task = p.task;
  a.rule = p.task == Task::kSampleLogits ? Rule::kToken : p.rule;
  a.params = p.params;
  a.logit = plan.logit;
  a.stats_mode = plan.stats_mode;
  a.merged = plan.merged;
  a.greedy = p.greedy;
  a.has_draft = plan.has_draft;
  a.is_logits = plan.logits;
  a.out_tokens = p.out_tokens;
  a.out_accepted_len = p.out_accepted_len;
  a.out_status = p.out_status;
  a.stats = scratch_at<ChunkStats>(scratch, plan.stats);
  a.lists = scratch_at<float>(scratch, plan.lists);
  a.masked_sums = scratch_at<double>(scratch, plan.masked_sums);
  a.states = scratch_at<PosState>(scratch, plan.states);
  a.px = scratch_at<double>(scratch, plan.px);
  a.qx = scratch_at<double>(scratch, plan.qx);
  a.weights = scratch_at<double>(scratch, plan.weights);
  a.pass_flags = scratch_at<int32_t>(scratch, plan.pass_flags);
  a.aggs = scratch_at<PosAgg>(scratch, plan.aggs);
  a.plans = scratch_at<RowPlan>(scratch, plan.plans);
  a.sample = scratch_at<SampleChunkSums>(scratch, plan.sample);
  return a;
}

// The processed-distribution state of every unit the call reads (logits): the stats kernel,
// then with filters the merge / exact-mass / fallback / masked-sum kernels. finish_state
// (decide.cuh) completes a unit's state from what they wrote. Shared by the verification
// pipeline, the tree kernels (tree_verify.cu) and processed_probs (processed_probs.cu).
template <typename T>
cudaError_t launch_state_kernels(const Args<T>& a, const PipelinePlan& plan, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (plan.logits) {
    switch (plan.stats_mode) {
      case StatsMode::kArgmax: err = launch_stats<T, StatsMode::kArgmax>(a, plan, stream); break;
      case StatsMode::kSum: err = launch_stats<T, StatsMode::kSum>(a, plan, stream); break;
      case StatsMode::kSumTopList: err = launch_stats<T, StatsMode::kSumTopList>(a, plan, stream); break;
      case StatsMode::kSumMinPList: err = launch_stats<T, StatsMode::kSumMinPList>(a, plan, stream); break;
    }
    if (err != cudaSuccess) return err;
  }
  if (plan.merged) {
    auto merge_kernel = filter_merge_kernel<kMergeThreads, T, false>;
    if ((err = launch_items(merge_kernel, plan.units, kMergeThreads, a, stream)) != cudaSuccess) return err;
    if (plan.total_pass) {
      auto total_kernel = masked_sum_kernel<kPassThreads, T, true>;
      if ((err = launch_items(total_kernel, plan.units, kPassThreads, a, stream)) != cudaSuccess) return err;
      auto merge_again = filter_merge_kernel<kMergeThreads, T, true>;
      if ((err = launch_items(merge_again, plan.units, kMergeThreads, a, stream)) != cudaSuccess) return err;
    }
    if (plan.fallback) {
      auto fallback_kernel = filter_fallback_kernel<kMergeThreads, T>;
      if ((err = launch_items(fallback_kernel, plan.units, kMergeThreads, a, stream)) != cudaSuccess) return err;
    }
    auto norm_kernel = masked_sum_kernel<kPassThreads, T, false>;
    if ((err = launch_items(norm_kernel, plan.units, kPassThreads, a, stream)) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t run_pipeline(const VerifyProblem& p, void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (!problem_is_valid(p)) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const PipelinePlan plan = plan_pipeline(p);
  if (scratch == nullptr || scratch_bytes < plan.bytes) return cudaErrorInvalidValue;

  const Args<T> a = pipeline_args<T>(p, plan, scratch);
  cudaError_t err = launch_state_kernels(a, plan, stream);
  if (err != cudaSuccess) return err;
  const bool decide1_final = !plan.position_pass && !plan.sampler;
  if (decide1_final) {
    auto kernel = decide1_kernel<kRowThreads, T, true>;
    err = launch_items(kernel, p.batch, kRowThreads, a, stream);
  } else {
    auto kernel = decide1_kernel<kRowThreads, T, false>;
    err = launch_items(kernel, p.batch, kRowThreads, a, stream);
  }
  if (err != cudaSuccess) return err;
  if (plan.position_pass) {
    const int64_t items = p.batch * (p.gamma + 1) * plan.chunks;
    if (plan.logits) {
      auto pass_kernel = position_pass_kernel<kPassThreads, T, true>;
      err = launch_items(pass_kernel, items, kPassThreads, a, stream);
    } else {
      auto pass_kernel = position_pass_kernel<kPassThreads, T, false>;
      err = launch_items(pass_kernel, items, kPassThreads, a, stream);
    }
    if (err != cudaSuccess) return err;
    if (plan.sampler) {
      auto kernel = decide2_kernel<kRowThreads, T, false>;
      err = launch_items(kernel, p.batch, kRowThreads, a, stream);
    } else {
      auto kernel = decide2_kernel<kRowThreads, T, true>;
      err = launch_items(kernel, p.batch, kRowThreads, a, stream);
    }
    if (err != cudaSuccess) return err;
  }
  if (plan.sampler) {
    if (plan.logits) err = launch_sampler<T, true>(a, plan, stream);
    else err = launch_sampler<T, false>(a, plan, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
