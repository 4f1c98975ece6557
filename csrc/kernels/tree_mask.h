// Token trees on raw pointers: validation of one row's tree, depths, children lists and the
// attention masks a target forward over the tree needs. Pure C++, no torch.
//
// One row of a batch of trees holds N node slots in topological order:
//   parents[i]  : parents[0] = -1 (the root); 0 <= parents[i] < i for 0 < i < num_nodes;
//   num_nodes   : 1 <= num_nodes <= N; slots i >= num_nodes are padding and are ignored.
// Derived per node (padding slots: depth 0, no links):
//   depth[i]          0 for the root, depth[parents[i]] + 1 otherwise;
//   first_child[i]    the lowest-index child of i, -1 when i is a leaf;
//   next_sibling[i]   the next-higher-index child of parents[i], -1 when i is the last one;
//   tree mask row i   the ancestor-or-self set of i (padding: itself only);
//   positions[i]      root_position + depth[i];
//   attention row i   [W prefix columns | N tree columns]: the row's real prefix columns and the
//                     tree mask row for a real node; for a padding node its own tree column only
//                     (an all-masked query row would give NaN attention outputs).
//
// The validation and link helpers are host+device so the CUDA kernels (cuda/tree_mask.cu,
// cuda/tree_walk.cuh) check and link exactly as the CPU ops do.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SPECDECODE_TREE_HD __host__ __device__ __forceinline__
#else
#define SPECDECODE_TREE_HD inline
#endif

namespace specdecode {
namespace kernels {

// The most nodes a tree may have. The masks grow as N * (W + N) per row and the packed mask as
// N * N / 32 words; verifying a tree walks at most depth + 1 <= N nodes. 4096 is far beyond
// what a target forward can score usefully (trees in the literature have 10 to a few hundred
// nodes) and keeps every per-row index well inside int32.
constexpr int64_t kMaxTreeNodes = 4096;

// Why a row's tree could not be used. Disjoint from RowStatus (common.h), whose distribution
// codes (kNonFiniteLogit, kEmptyDistribution, with kStatusInDraft) verify_tree also reports.
enum TreeStatus : int32_t {
  kTreeOk = 0,
  kTreeNumNodesOutOfRange = 32,  // num_nodes[b] not in [1, N]
  kTreeBadRoot = 33,             // parents[b, 0] != -1
  kTreeBadParent = 34,           // some 0 < i < num_nodes[b] has parents[b, i] outside [0, i)
  kTreeBadPrefixMask = 35,       // prefix_mask[b] holds a value other than 0 and 1
  kTreeBadRootPosition = 36,     // root_positions[b] < 0
  kTreeTokenOutOfRange = 37,     // tree_tokens[b, i] outside [0, V) for some 0 < i < num_nodes[b]
  kTreeDuplicateSiblings = 38,   // two children of one node carry the same token (rules that forbid it)
  kTreeNotPaths = 39,            // gbv: the row is not K chains of one length below the root
};

// Words of the bit-packed mask per node row.
SPECDECODE_TREE_HD int64_t tree_mask_words(int64_t max_nodes) { return (max_nodes + 31) / 32; }

SPECDECODE_TREE_HD bool tree_num_nodes_ok(int64_t num_nodes, int64_t max_nodes) {
  return num_nodes >= 1 && num_nodes <= max_nodes;
}

// The parent of a real non-root node i must come before it.
SPECDECODE_TREE_HD bool tree_parent_ok(int64_t parent, int64_t i) { return parent >= 0 && parent < i; }

// A prefix-mask entry must be 0 or 1 (bool storage always is).
template <typename MaskT>
SPECDECODE_TREE_HD bool prefix_value_ok(MaskT v) {
  return v == static_cast<MaskT>(0) || v == static_cast<MaskT>(1);
}

// Structure check of one row (sequential; the CUDA kernel runs the same tests in parallel).
SPECDECODE_TREE_HD int32_t check_tree_row(const int64_t* parents, int64_t num_nodes, int64_t max_nodes) {
  if (!tree_num_nodes_ok(num_nodes, max_nodes)) return kTreeNumNodesOutOfRange;
  if (parents[0] != -1) return kTreeBadRoot;
  for (int64_t i = 1; i < num_nodes; ++i)
    if (!tree_parent_ok(parents[i], i)) return kTreeBadParent;
  return kTreeOk;
}

// depth, first_child and next_sibling of every slot of a VALID row (check_tree_row == kTreeOk).
// Children lists come out in index order: walking the nodes backwards and pushing each one in
// front of its parent's list leaves the lowest index first. O(N).
SPECDECODE_TREE_HD void tree_links_row(const int64_t* parents, int64_t num_nodes, int64_t max_nodes, int64_t* depth,
                           int64_t* first_child, int64_t* next_sibling) {
  for (int64_t i = 0; i < max_nodes; ++i) {
    depth[i] = 0;
    first_child[i] = -1;
    next_sibling[i] = -1;
  }
  for (int64_t i = 1; i < num_nodes; ++i) depth[i] = depth[parents[i]] + 1;
  for (int64_t i = num_nodes - 1; i >= 1; --i) {
    const int64_t p = parents[i];
    next_sibling[i] = first_child[p];
    first_child[p] = i;
  }
}

// Where one row's outputs go (each pointer at the row's first element).
struct TreeMaskRowOut {
  int64_t* positions;     // [N]
  bool* attention;        // [N, W + N]
  bool* tree_mask;        // [N, N]
  int32_t* packed;        // [N, words]
  int64_t* first_child;   // [N]
  int64_t* next_sibling;  // [N]
  int64_t* depth;         // [N]
};

// Every output of one row. Returns a TreeStatus; on a bad row nothing is written. The tree
// mask row of node i is its parent's row plus bit i (parents come first), so the whole row
// costs O(N * (W + N)).
template <typename MaskT>
inline int32_t tree_masks_row(const int64_t* parents, int64_t num_nodes, int64_t max_nodes, const MaskT* prefix,
                              int64_t prefix_len, int64_t root_position, const TreeMaskRowOut& out) {
  const int32_t status = check_tree_row(parents, num_nodes, max_nodes);
  if (status != kTreeOk) return status;
  if (root_position < 0) return kTreeBadRootPosition;
  for (int64_t c = 0; c < prefix_len; ++c)
    if (!prefix_value_ok(prefix[c])) return kTreeBadPrefixMask;

  const int64_t N = max_nodes, W = prefix_len, words = tree_mask_words(N);
  tree_links_row(parents, num_nodes, N, out.depth, out.first_child, out.next_sibling);
  std::memset(out.packed, 0, sizeof(int32_t) * static_cast<size_t>(N * words));
  std::memset(out.tree_mask, 0, sizeof(bool) * static_cast<size_t>(N * N));
  for (int64_t i = 0; i < N; ++i) {
    out.positions[i] = root_position + out.depth[i];
    uint32_t* packed_row = reinterpret_cast<uint32_t*>(out.packed + i * words);
    bool* mask_row = out.tree_mask + i * N;
    if (i > 0 && i < num_nodes) {
      const int64_t p = parents[i];
      std::memcpy(packed_row, out.packed + p * words, sizeof(int32_t) * static_cast<size_t>(words));
      std::memcpy(mask_row, out.tree_mask + p * N, sizeof(bool) * static_cast<size_t>(p + 1));
    }
    packed_row[i >> 5] |= (1u << (i & 31));
    mask_row[i] = true;
    bool* attention_row = out.attention + i * (W + N);
    const bool real = i < num_nodes;
    for (int64_t c = 0; c < W; ++c) attention_row[c] = real && prefix[c] != static_cast<MaskT>(0);
    std::memcpy(attention_row + W, mask_row, sizeof(bool) * static_cast<size_t>(N));
  }
  return kTreeOk;
}

}  // namespace kernels
}  // namespace specdecode
