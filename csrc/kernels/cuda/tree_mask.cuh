// Host entry point of the CUDA tree_attention_mask kernels: raw device pointers and a stream,
// no torch. Plain C++ declarations, so host code compiled by g++ (csrc/ops/tree_cuda.cpp)
// includes this header and calls the launcher defined in tree_mask.cu.
//
// Layouts (contiguous, row-major, all on the current device), as the CPU op
// (kernels/tree_mask.h) documents them:
//   parents [B, N] int64; num_nodes [B] int64; root_positions [B] int64; prefix_mask [B, W]
//   (bool, uint8, int32 or int64 holding 0/1; W may be 0);
//   out_positions [B, N] int64; out_attention [B, 1, N, W+N] bool; out_tree_mask [B, N, N] bool;
//   out_packed [B, N, words] int32 (words = ceil(N/32)); out_first_child, out_next_sibling,
//   out_depth [B, N] int64; out_status [B] int32 (kernels::TreeStatus, kTreeOk = 0).
// Every output element is written, so the outputs may be uninitialised memory. A row whose
// status is not kTreeOk comes back as if every node were padding (each node attends to itself
// only, depth 0, no links, positions = root position); the host raises on it.
//
// The launcher returns cudaSuccess, the launch error, or cudaErrorInvalidValue for sizes out
// of range (N outside [1, kMaxTreeNodes], negative B or W).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specdecode {
namespace kernels {
namespace cuda {

struct TreeMaskIO {
  const int64_t* parents;         // [B, N]
  const int64_t* num_nodes;       // [B]
  const int64_t* root_positions;  // [B]
  int64_t* out_positions;         // [B, N]
  bool* out_attention;            // [B, 1, N, W + N]
  bool* out_tree_mask;            // [B, N, N]
  int32_t* out_packed;            // [B, N, words]
  int64_t* out_first_child;       // [B, N]
  int64_t* out_next_sibling;      // [B, N]
  int64_t* out_depth;             // [B, N]
  int32_t* out_status;            // [B]
  int64_t batch;                  // B
  int64_t max_nodes;              // N
  int64_t prefix_len;             // W
};

// Explicitly instantiated in tree_mask.cu for MaskT = bool, uint8_t, int32_t and int64_t.
template <typename MaskT>
cudaError_t launch_tree_attention_mask(const TreeMaskIO& io, const MaskT* prefix_mask, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
