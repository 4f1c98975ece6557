// CUDA kernels of tree_attention_mask (see tree_mask.cuh for the layouts). Torch-free, no
// messages: the launcher returns a cudaError_t and each row a TreeStatus in out_status.
//
// Two launches on one stream:
//   1. tree_structure_kernel, one block per row: validates the row (the checks of
//      kernels/tree_mask.h), then each thread takes nodes i: walks i's ancestor chain to get its
//      depth and its packed ancestor-or-self bits (O(depth) per node, no inter-thread order
//      needed), and links i into its parent's children list by scanning back for its previous
//      sibling (each list slot has exactly one writer, so no atomics).
//   2. tree_expand_kernel, grid-stride over every element of the [B, N, W+N] mask: prefix
//      columns from prefix_mask for real nodes, tree columns from the packed bits (also written
//      to the [B, N, N] tree-only mask).
#include "kernels/cuda/tree_mask.cuh"
#include "kernels/tree_mask.h"

namespace specdecode {
namespace kernels {
namespace cuda {
namespace {

constexpr int kTreeThreads = 256;

template <typename MaskT>
__global__ void tree_structure_kernel(TreeMaskIO io, const MaskT* prefix_mask) {
  const int64_t b = blockIdx.x;
  const int64_t N = io.max_nodes, W = io.prefix_len, words = tree_mask_words(N);
  const int64_t* parents = io.parents + b * N;
  const int64_t n = io.num_nodes[b];
  const int64_t root_position = io.root_positions[b];

  __shared__ int32_t head_status;
  __shared__ int32_t bad_parent;
  __shared__ int32_t bad_prefix;
  if (threadIdx.x == 0) {
    int32_t s = kTreeOk;
    if (!tree_num_nodes_ok(n, N)) s = kTreeNumNodesOutOfRange;
    else if (parents[0] != -1) s = kTreeBadRoot;
    head_status = s;
    bad_parent = 0;
    bad_prefix = 0;
  }
  __syncthreads();
  const int32_t head = head_status;
  if (head == kTreeOk) {
    for (int64_t i = 1 + threadIdx.x; i < n; i += blockDim.x)
      if (!tree_parent_ok(parents[i], i)) bad_parent = 1;  // every writer stores the same value
  }
  for (int64_t c = threadIdx.x; c < W; c += blockDim.x)
    if (!prefix_value_ok(prefix_mask[b * W + c])) bad_prefix = 1;
  __syncthreads();
  // The CPU kernel's order: structure, then root position, then prefix values.
  int32_t status = head;
  if (status == kTreeOk && bad_parent) status = kTreeBadParent;
  if (status == kTreeOk && root_position < 0) status = kTreeBadRootPosition;
  if (status == kTreeOk && bad_prefix) status = kTreeBadPrefixMask;
  const int64_t real_nodes = status == kTreeOk ? n : 0;  // a bad row: every slot as padding

  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    uint32_t* bits = reinterpret_cast<uint32_t*>(io.out_packed + (b * N + i) * words);
    for (int64_t w = 0; w < words; ++w) bits[w] = 0u;
    int64_t depth = 0;
    if (i < real_nodes) {
      for (int64_t k = i; k > 0; k = parents[k], ++depth) bits[k >> 5] |= 1u << (k & 31);
      bits[0] |= 1u;  // the root
    } else {
      bits[i >> 5] |= 1u << (i & 31);
    }
    io.out_depth[b * N + i] = depth;
    io.out_positions[b * N + i] = root_position + depth;
    io.out_first_child[b * N + i] = -1;
    io.out_next_sibling[b * N + i] = -1;
  }
  __syncthreads();  // the -1 fills above precede the links below (same block, global memory)
  for (int64_t j = 1 + threadIdx.x; j < real_nodes; j += blockDim.x) {
    const int64_t p = parents[j];
    int64_t previous = -1;
    for (int64_t k = j - 1; k > p; --k) {
      if (parents[k] == p) {
        previous = k;
        break;
      }
    }
    if (previous >= 0) io.out_next_sibling[b * N + previous] = j;
    else io.out_first_child[b * N + p] = j;
  }
  if (threadIdx.x == 0) io.out_status[b] = status;
}

template <typename MaskT>
__global__ void tree_expand_kernel(TreeMaskIO io, const MaskT* prefix_mask) {
  const int64_t N = io.max_nodes, W = io.prefix_len, columns = W + N, words = tree_mask_words(N);
  const int64_t total = io.batch * N * columns;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t column = e % columns;
    const int64_t row = e / columns;  // b * N + i
    const int64_t i = row % N;
    const int64_t b = row / N;
    bool allowed;
    if (column < W) {
      const bool real = io.out_status[b] == kTreeOk && i < io.num_nodes[b];
      allowed = real && prefix_mask[b * W + column] != static_cast<MaskT>(0);
    } else {
      const int64_t j = column - W;
      const uint32_t word = static_cast<uint32_t>(io.out_packed[row * words + (j >> 5)]);
      allowed = ((word >> (j & 31)) & 1u) != 0u;
      io.out_tree_mask[row * N + j] = allowed;
    }
    io.out_attention[e] = allowed;
  }
}

}  // namespace

template <typename MaskT>
cudaError_t launch_tree_attention_mask(const TreeMaskIO& io, const MaskT* prefix_mask, cudaStream_t stream) {
  if (io.batch < 0 || io.batch > 0x7fffffffLL || io.prefix_len < 0 || io.max_nodes < 1 ||
      io.max_nodes > kMaxTreeNodes)
    return cudaErrorInvalidValue;
  if (io.batch == 0) return cudaSuccess;
  tree_structure_kernel<MaskT><<<static_cast<unsigned>(io.batch), kTreeThreads, 0, stream>>>(io, prefix_mask);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t total = io.batch * io.max_nodes * (io.prefix_len + io.max_nodes);
  int64_t blocks = (total + kTreeThreads - 1) / kTreeThreads;
  if (blocks > 65536) blocks = 65536;  // grid-stride loop covers the rest
  tree_expand_kernel<MaskT><<<static_cast<unsigned>(blocks), kTreeThreads, 0, stream>>>(io, prefix_mask);
  return cudaGetLastError();
}

template cudaError_t launch_tree_attention_mask<bool>(const TreeMaskIO&, const bool*, cudaStream_t);
template cudaError_t launch_tree_attention_mask<uint8_t>(const TreeMaskIO&, const uint8_t*, cudaStream_t);
template cudaError_t launch_tree_attention_mask<int32_t>(const TreeMaskIO&, const int32_t*, cudaStream_t);
template cudaError_t launch_tree_attention_mask<int64_t>(const TreeMaskIO&, const int64_t*, cudaStream_t);

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
