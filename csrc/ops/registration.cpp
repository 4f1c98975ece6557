// The one place where every specdecode op schema is declared. Implementations register per
// backend with TORCH_LIBRARY_IMPL (verify_cpu.cpp, verify_cuda.cu, tree_cpu.cpp, ...); fake
// (meta) kernels for torch.compile live in python/specdecode/_meta.py.
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
  // ---- token trees (python/specdecode/trees/) --------------------------------------------
  // Attention inputs of a batch of token trees. parents [B, N] int64 (parents[b, 0] = -1,
  // 0 <= parents[b, i] < i for i < num_nodes[b]; N <= 4096), num_nodes [B] int64 in [1, N],
  // prefix_mask [B, W] bool/uint8/int32/int64 0/1 (the row's real committed cache columns; W may
  // be 0), root_positions [B] int64 >= 0 (position id of the root). Returns positions [B, N]
  // int64 (root_position + depth), the mask [B, 1, N, W+N] bool (True = may attend: real prefix
  // columns + ancestor-or-self tree columns; a padding node attends to its own column only), the
  // tree-only mask [B, N, N] bool, the bit-packed tree-only mask [B, N, ceil(N/32)] int32 (bit
  // j % 32 of word j / 32 of row i set iff j is an ancestor-or-self of i), first_child [B, N]
  // and next_sibling [B, N] int64 (-1 = none, children in index order), depth [B, N] int64.
  m.def(
      "tree_attention_mask(Tensor parents, Tensor num_nodes, Tensor prefix_mask, Tensor root_positions) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Verification of a batch of token trees from raw logits, with the chain ops' standardized
  // sampling (temperature 0 = greedy). target_logits [B, N, V]: p at each node (of the token
  // after it); draft_logits [B, N, V] or None: q at each node (what its children were drafted
  // from); tree_tokens, parents [B, N] int64; num_nodes [B] int64; uniforms [B, N] float64
  // (column c > 0: acceptance coin of node c; column 0: the emitted token's inverse-CDF coin).
  // rule: greedy, specinfer, rrs, deterministic, typical (rule_params [epsilon, delta,
  // sample_correction]). Returns tokens [B, N] int64 (accepted path tokens, then the emitted
  // token, -1 padded), accepted_len [B] int64, accepted_nodes [B, N] int64 (the root 0, then the
  // accepted nodes, -1 padded).
  m.def(
      "verify_tree(Tensor target_logits, Tensor? draft_logits, Tensor tree_tokens, Tensor parents, "
      "Tensor num_nodes, Tensor uniforms, float temperature, int top_k, float top_p, float min_p, str rule, "
      "float[] rule_params) -> (Tensor, Tensor, Tensor)");
  // The same with coin (b, c) = philox_uniform(seed, offset, b, c) drawn in the op (tree layout).
  m.def(
      "verify_tree_philox(Tensor target_logits, Tensor? draft_logits, Tensor tree_tokens, Tensor parents, "
      "Tensor num_nodes, Tensor philox_seed, Tensor philox_offset, float temperature, int top_k, float top_p, "
      "float min_p, str rule, float[] rule_params) -> (Tensor, Tensor, Tensor)");
  // ---- CPU fast path for multi-token forwards (python/specdecode/cpu.py) -------------------
  // y = input @ weight.T + bias for an input with few rows, each weight row read once: input
  // [..., K] float32 (M rows: the product of the leading dimensions), weight [N, K] float32 or
  // bfloat16, bias [N] float32 or None. Returns y [..., N] float32. CPU only; meant for
  // M <= 32 (any M is computed, slower than BLAS above).
  m.def("skinny_linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor");
  // out = softmax(scale * query @ key.T + attn_mask) @ value for few queries per row against a
  // static KV cache: query [B, H, n, D], key and value [B, Hkv, C, D] (H a multiple of Hkv:
  // grouped-query heads share theirs), all float32; attn_mask [B or 1, H or 1, n or 1, C]
  // additive float32 or bool (True = attend). Columns whose mask is the lowest float, -inf or
  // False are skipped (their weight is exactly 0; their value rows are never read). Returns out
  // [B, H, n, D] float32, what scaled_dot_product_attention returns for these inputs (to float
  // rounding). CPU only.
  m.def("skinny_attention(Tensor query, Tensor key, Tensor value, Tensor attn_mask, float scale) -> Tensor");
}
