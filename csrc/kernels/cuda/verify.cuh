// Host entry points of the CUDA verification kernels: raw device pointers and a stream, no
// torch. One CUDA block per batch row. Explicitly instantiated (verify_probs.cu,
// verify_logits.cu) for T = float, __half, __nv_bfloat16 and double.
//
// Layouts (contiguous, row-major, all on the current device):
//   target [B, gamma+1, V]; draft [B, gamma, V] (may be null for greedy, typical, top_beta);
//   draft_tokens [B, gamma] int64; num_draft_tokens [B] int64;
//   uniforms [B, gamma+1] float64: column i < num_draft_tokens[b] is draft i's acceptance coin,
//   column gamma the emitted token's inverse-CDF coin (the layout of the CPU ops);
//   out_tokens [B, gamma+1] int64: accepted drafts, the emitted token, then -1;
//   out_accepted_len [B] int64; out_status [B] int32: kernels::RowStatus (kOk = 0), with
//   kStatusInDraft OR-ed in when the bad distribution is the draft's (as the CPU ops).
// Every output element is written, so the outputs may be uninitialised memory. A row whose
// status is not kOk gets out_tokens all -1 and out_accepted_len -1.
//
// The *_philox variants draw the coins in the kernel instead: coin (b, i) is
// philox_uniform(*seed, *offset, b, i) (philox.cuh), with seed and offset read from DEVICE
// memory when the kernel runs, so a CUDA graph that captured the launch picks up new values
// (advance *offset by one per call, e.g. with a captured offset.add_(1)).
//
// Every launcher returns cudaSuccess, the launch error, or cudaErrorInvalidValue when gamma
// needs more shared memory than the device allows (about 88 bytes per draft position for
// logits, 24 for probabilities: gamma up to ~2000 on A100/H100).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.h"
#include "kernels/distributions.h"

namespace specdecode {
namespace kernels {
namespace cuda {

// Integer inputs and outputs shared by every launcher.
struct VerifyRowsIO {
  const int64_t* draft_tokens;      // [B, gamma]
  const int64_t* num_draft_tokens;  // [B]
  int64_t* out_tokens;              // [B, gamma+1]
  int64_t* out_accepted_len;        // [B]
  int32_t* out_status;              // [B]
  int64_t batch;                    // B
  int64_t gamma;
  int64_t vocab_size;               // V
};

// Device pointers to one int64 each (graph-safe randomness).
struct PhiloxSeedOffset {
  const int64_t* seed;
  const int64_t* offset;
};

template <typename T>
cudaError_t launch_verify_probs(const T* target_probs, const T* draft_probs, const double* uniforms,
                                const VerifyRowsIO& io, Rule rule, const RuleParams& params, cudaStream_t stream);

// sampling.temperature must be > 0 (temperature 0 is greedy: the op layer switches the rule).
template <typename T>
cudaError_t launch_verify_logits(const T* target_logits, const T* draft_logits, const double* uniforms,
                                 const VerifyRowsIO& io, const SamplingParams& sampling, Rule rule,
                                 const RuleParams& params, cudaStream_t stream);

template <typename T>
cudaError_t launch_verify_probs_philox(const T* target_probs, const T* draft_probs, PhiloxSeedOffset rng,
                                       const VerifyRowsIO& io, Rule rule, const RuleParams& params,
                                       cudaStream_t stream);

template <typename T>
cudaError_t launch_verify_logits_philox(const T* target_logits, const T* draft_logits, PhiloxSeedOffset rng,
                                        const VerifyRowsIO& io, const SamplingParams& sampling, Rule rule,
                                        const RuleParams& params, cudaStream_t stream);

// Writes the coins the *_philox launchers use, [B, gamma+1] float64, for tests and for a CPU
// path that must reproduce a GPU call.
cudaError_t launch_philox_uniforms(PhiloxSeedOffset rng, int64_t batch, int64_t gamma, double* out,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
