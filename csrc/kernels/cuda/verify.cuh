// Host entry points of the CUDA verification and sampling kernels: raw device pointers, a
// scratch buffer and a stream; no torch, no messages. Plain declarations, so host code
// compiled by g++ (csrc/ops/verify_cuda.cpp, csrc/ops/sample_cuda.cpp) includes this header
// and calls the launchers defined in verify_*.cu.
//
// One call runs one fixed sequence of kernel launches chosen from the task, the rule and the
// sampling settings only (never from the data), so it can be captured in a CUDA graph. It
// never synchronises, never allocates and never copies to the host: the caller allocates the
// outputs and `verify_scratch_bytes(problem)` bytes of device scratch, and turns the per-row
// statuses into errors itself (on the host, after the call).
//
// Layouts (contiguous, row-major, all on the current device):
//   target [B, gamma+1, V] (probabilities or logits); draft [B, gamma, V] or null (only token
//   and block verification read it); draft_tokens [B, gamma] int64; num_draft_tokens [B] int64;
//   coins: uniforms [B, gamma+1] float64 (column i < num_draft_tokens[b] is draft i's coin,
//   column gamma the emitted token's inverse-CDF coin), or Philox: coin (b, i) =
//   philox_uniform(*seed, *offset, b, i) (kernels/philox.h), seed and offset read from DEVICE
//   memory when the kernels run, so a captured graph picks up new values on replay;
//   out_tokens [B, gamma+1] int64: accepted drafts, the emitted token, then -1;
//   out_accepted_len [B] int64 (may be null); out_status [B] int32: kernels::RowStatus, with
//   kStatusInDraft OR-ed in when the bad distribution is the draft's (as the CPU ops).
// The sampling task (sample_logits) is the same call with gamma = 0: target = logits [B, 1, V],
// no drafts, coins [B, 1], out_tokens [B, 1].
// Every output element is written, so outputs may be uninitialised memory. A row whose status
// is not kOk gets out_tokens all -1 and out_accepted_len -1.
//
// Semantics are the CPU ops' (kernels/rules.h, kernels/sample.h): the same decisions, the same
// positions read and validated (token verification never validates a position after its
// first rejection), the same statuses in the same order. Rounding differs only where
// documented in pipeline.cuh (normalisers and chunk-level sums).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common.h"
#include "kernels/cuda/compat.cuh"
#include "kernels/distributions.h"

namespace specdecode {
namespace kernels {
namespace cuda {

enum class ElemType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

enum class Task : int32_t {
  kVerifyProbs = 0,   // verify_probs: target / draft hold probabilities
  kVerifyLogits = 1,  // verify_logits: raw logits, processed with `sampling` inside
  kSampleLogits = 2,  // sample_logits: one token per row from the processed logits
};

// Where the coins come from: `uniforms` (device float64) when not null, else Philox4x32-10
// keyed by one int64 seed and one int64 offset in device memory.
struct Coins {
  const double* uniforms = nullptr;
  const int64_t* philox_seed = nullptr;
  const int64_t* philox_offset = nullptr;
};

struct VerifyProblem {
  Task task = Task::kVerifyProbs;
  ElemType elem = ElemType::kFloat32;
  const void* target = nullptr;
  const void* draft = nullptr;
  const int64_t* draft_tokens = nullptr;      // null for kSampleLogits
  const int64_t* num_draft_tokens = nullptr;  // null for kSampleLogits
  Coins coins;
  int64_t batch = 0;   // B >= 0
  int64_t gamma = 0;   // >= 1 for verification, 0 for sampling
  int64_t vocab = 0;   // V >= 1
  Rule rule = Rule::kToken;  // verification rule (kVerifyLogits at temperature 0: kGreedy)
  RuleParams params;
  SamplingParams sampling;   // logits tasks; temperature > 0 unless `greedy`
  bool greedy = false;       // kSampleLogits at temperature 0: argmax (ties to the lowest id)
  int64_t* out_tokens = nullptr;
  int64_t* out_accepted_len = nullptr;
  int32_t* out_status = nullptr;
};

// processed_probs: the processed distribution of logits [B, V] as float64 probabilities
// out_probs [B, V] (every element written): temperature, top-k, top-p, min-p exactly as the
// verification kernels process a row (the same state kernels), each row divided by its sum as
// the CPU op does; `greedy` (temperature 0): one-hot on the argmax (ties to the lowest id).
// out_status [B] int32: kOk, kNonFiniteLogit or kEmptyDistribution (that row's probabilities
// are then unspecified). Defined in processed_probs.cu.
struct ProcessedProbsProblem {
  ElemType elem = ElemType::kFloat32;
  const void* logits = nullptr;
  int64_t batch = 0;  // B >= 0
  int64_t vocab = 1;  // V >= 1
  SamplingParams sampling;  // temperature > 0 unless `greedy`
  bool greedy = false;
  double* out_probs = nullptr;
  int32_t* out_status = nullptr;
};

size_t processed_probs_scratch_bytes(const ProcessedProbsProblem& problem);
cudaError_t launch_processed_probs(const ProcessedProbsProblem& problem, void* scratch, size_t scratch_bytes,
                                   cudaStream_t stream);

// Device scratch the call needs, in bytes (0 when B = 0). Pure host arithmetic on the sizes,
// task, rule and sampling settings (the pointers need not be set yet).
size_t verify_scratch_bytes(const VerifyProblem& problem);

// Launches the kernels on `stream`. Returns cudaSuccess, the first launch error, or
// cudaErrorInvalidValue for an inconsistent problem (sizes, null pointers, scratch too small).
cudaError_t launch_verify(const VerifyProblem& problem, void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
