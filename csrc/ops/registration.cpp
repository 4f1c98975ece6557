// The one place where every specdecode op schema is declared. Implementations register per
// backend with TORCH_LIBRARY_IMPL (verify_cpu.cpp, verify_cuda.cu); fake (meta) kernels for
// torch.compile live in python/specdecode/_meta.py.
#include <torch/library.h>

TORCH_LIBRARY(specdecode, m) {
  // Verification from probabilities. Shapes: target_probs [B, gamma+1, V], draft_probs
  // [B, gamma, V] or None, draft_tokens [B, gamma] int64, num_draft_tokens [B] int64,
  // uniforms [B, gamma+1] float64 (column i < gamma: coin of draft i; column gamma: the
  // emitted token's inverse-CDF coin). Returns tokens [B, gamma+1] int64 (-1 padded) and
  // accepted_len [B] int64.
  m.def(
      "verify_probs(Tensor target_probs, Tensor? draft_probs, Tensor draft_tokens, "
      "Tensor num_draft_tokens, Tensor uniforms, str rule, float[] rule_params) -> (Tensor, Tensor)");
  // Verification from raw logits with standardized sampling (temperature, top-k, top-p,
  // min-p applied to target and draft alike inside the op). temperature 0 = greedy.
  m.def(
      "verify_logits(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, "
      "Tensor num_draft_tokens, Tensor uniforms, float temperature, int top_k, float top_p, "
      "float min_p, str rule, float[] rule_params) -> (Tensor, Tensor)");
  // The same two ops with their coins drawn inside the op from Philox4x32-10, keyed by
  // (philox_seed, philox_offset): one-element int64 tensors on the inputs' device that the
  // op only reads, so on CUDA the call can be captured in a graph and replayed (advance the
  // offset between calls, e.g. offset.add_(1), itself captured). Coin of row b, column i:
  // philox_uniform(seed, offset, b, i) (csrc/kernels/philox.h), in the uniforms layout above.
  m.def(
      "verify_probs_philox(Tensor target_probs, Tensor? draft_probs, Tensor draft_tokens, "
      "Tensor num_draft_tokens, Tensor philox_seed, Tensor philox_offset, str rule, float[] rule_params) "
      "-> (Tensor, Tensor)");
  m.def(
      "verify_logits_philox(Tensor target_logits, Tensor? draft_logits, Tensor draft_tokens, "
      "Tensor num_draft_tokens, Tensor philox_seed, Tensor philox_offset, float temperature, int top_k, "
      "float top_p, float min_p, str rule, float[] rule_params) -> (Tensor, Tensor)");
  // One token per row from the processed distribution of logits [B, V] (temperature, then
  // top-k, top-p, min-p; temperature 0 = argmax), with one inverse-CDF coin per row: uniforms
  // [B] float64 in [0, 1). The distribution is computed by the same code the verify ops use,
  // so a drafted token is drawn from exactly the q that verification reads. Returns [B] int64.
  m.def(
      "sample_logits(Tensor logits, Tensor uniforms, float temperature, int top_k, float top_p, float min_p) "
      "-> Tensor");
  // The same with the coin of row b drawn in the op: philox_uniform(seed, offset, b, 0).
  m.def(
      "sample_logits_philox(Tensor logits, Tensor philox_seed, Tensor philox_offset, float temperature, "
      "int top_k, float top_p, float min_p) -> Tensor");
  // The processed distribution itself: probs [B, V] float64, each row the normalised weights
  // that sample_logits draws from and the verify ops read (temperature 0: one-hot on the
  // argmax). For draws a kernel does not cover (e.g. children without replacement).
  m.def("processed_probs(Tensor logits, float temperature, int top_k, float top_p, float min_p) -> Tensor");
}
