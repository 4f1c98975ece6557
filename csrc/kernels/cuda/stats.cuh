// The stats kernel: the one pass over every logit row that verify_logits / sample_logits need.
// One block of kPassThreads threads per (row unit, chunk of kChunk entries); the chunk is read
// once into registers (32 entries per thread, 16-byte coalesced loads) and everything below is
// computed from those registers. Torch-free.
//
// Per chunk (ChunkStats): the max over non-NaN logits, whether a NaN or +inf occurs (the CPU's
// max_logit_body check), the lowest index holding the max, and (StatsMode >= kSum) the
// normaliser relative to the chunk's own max, sum exp((l - chunk max) / T), with the fast exp
// (the combine step rescales chunks by exp(chunk max - max); the normaliser's rounding is
// documented in pipeline.cuh).
//
// Lists (filters): a chunk lists some of its largest finite entries, in a deterministic order,
// together with `next`, the largest entry it did NOT list. The merge step relies only on this
// completeness property ("every entry > next is listed"), never on how many were listed:
//   kSumTopList: every finite entry >= t0, where t0 = min over warps of the ceil(list_target /
//     warps)-th largest per-thread maximum of that warp, so the chunk lists at least
//     list_target entries (when it has that many finite ones); with top-p alone also every
//     entry within 2^-14 of the chunk's max (fast exp), so that a top-p walk over a long flat
//     head stays inside the lists; when that is more than kListCap entries (many ties at t0, a
//     chunk of one repeated value), only the entries strictly above t0;
//   kSumMinPList: every finite entry with fast-exp weight >= 0.999 * min_p relative to the
//     chunk's max (what min-p can keep, since the row's max is >= the chunk's; whether the
//     list really holds every kept entry is decided exactly by the merge, from `next`).
// More than kListCap entries: the list is dropped (list_count = -1) and the merge step hands
// the unit to the exact fallback.
#pragma once

#include "kernels/cuda/pipeline.cuh"

namespace specdecode {
namespace kernels {
namespace cuda {

// Resident blocks per SM the kernel is compiled for: 4 (<= 64 registers) for 16-bit logits
// without lists, so that 64 KiB of loads are in flight per SM; wider elements (their raw bits
// take 32 or 64 registers) and the list modes need more registers per thread.
constexpr int stats_min_blocks(int element_bytes, StatsMode mode) {
  return element_bytes == 8 ? 2 : ((element_bytes == 2 && (mode == StatsMode::kArgmax || mode == StatsMode::kSum)) ? 4 : 3);
}

template <int BLOCK, typename T, StatsMode kMode>
__global__ void __launch_bounds__(BLOCK, stats_min_blocks(sizeof(T), kMode)) chunk_stats_kernel(const Args<T> a) {
  constexpr int kWarps = BLOCK / kWarpSize;
  constexpr int kPer = kChunk / BLOCK;
  static_assert(kPer <= 32, "chunk_stats_kernel: one bit per slot in a 32-bit mask");
  __shared__ ReduceScratch scratch;
  const float kInf = float_inf();
  const int64_t items = a.units() * a.chunks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t unit = item / a.chunks;
    const int64_t c = item % a.chunks;
    const UnitId u = decode_unit(a, unit);
    if (!unit_needed(a, u)) continue;  // block-uniform
    const int64_t start = c * kChunk;
    const int len = static_cast<int>(a.V - start < kChunk ? a.V - start : kChunk);
    StridedChunk<BLOCK, kPer, T> ch;
    ch.load(unit_row(a, u) + start, len);

    // Max over non-NaN entries, the lowest index holding it, and the NaN / +inf flag, in one
    // reduction (a thread's slots ascend in index, so ties keep the lowest).
    MaxIndexBad mine{-kInf, INT32_MAX, 0};
#pragma unroll
    for (int s = 0; s < kPer; ++s) {
      if (ch.index(s) < len) {
        const float v = ch.logit(s);
        mine.bad |= !(v < kInf);
        if (v > mine.value || (v == mine.value && mine.index == INT32_MAX)) {  // also takes a first -inf
          mine.value = v;
          mine.index = ch.index(s);
        }
      }
    }
    const float thread_max = mine.value;
    const MaxIndexBad top = block_reduce<BLOCK>(mine, OpMaxIndexBad(), scratch);
    const float m = top.value;
    const int bad = top.bad;
    const int first = top.index;

    const FastWeight weight(m, a.logit.inv_temp);
    double sum = 0.0;
    if (kMode != StatsMode::kArgmax) {
      float thread_sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kPer; ++s)
        if (ch.index(s) < len) thread_sum += weight(ch.logit(s));
      sum = block_reduce<BLOCK>(static_cast<double>(thread_sum), OpSum(), scratch);
    }

    int32_t list_count = 0;
    float next = -kInf;
    if (kMode == StatsMode::kSumTopList || kMode == StatsMode::kSumMinPList) {
      float t0 = -kInf;
      if (kMode == StatsMode::kSumTopList) {
        const int per_warp = (a.logit.list_target + kWarps - 1) / kWarps;  // 1..32
        const float sorted = warp_sort_descending(thread_max);
        t0 = block_reduce<BLOCK>(shfl_idx(sorted, per_warp - 1), OpMin(), scratch);
      }
      const float min_e_cut = 0.999f * a.logit.min_e;
      // Which slots a rule lists (a bit per slot), and how many.
      auto select = [&](bool strict, uint32_t* mask) {
        int listed_here = 0;
        *mask = 0;
#pragma unroll
        for (int s = 0; s < kPer; ++s) {
          if (ch.index(s) >= len) continue;
          const float x = ch.logit(s);
          bool listed = x > -kInf && x < kInf;  // finite (NaN fails too)
          if (kMode == StatsMode::kSumTopList)
            listed = listed && ((strict ? x > t0 : x >= t0) ||
                                (!strict && __fmul_rn(__fsub_rn(x, m), weight.c) >= a.logit.list_depth));
          else
            listed = listed && weight(x) >= min_e_cut;
          if (listed) {
            *mask |= 1u << s;
            ++listed_here;
          }
        }
        return listed_here;
      };
      uint32_t listed_mask;
      int total = 0;
      int offset = block_exclusive_scan<BLOCK>(select(false, &listed_mask), scratch, &total);
      if (kMode == StatsMode::kSumTopList && total > kListCap)  // block-uniform
        // Too many ties at (or entries near) t0, e.g. a chunk of one repeated value: list only
        // the entries strictly above t0; the chunk's `next` then says where completeness ends.
        offset = block_exclusive_scan<BLOCK>(select(true, &listed_mask), scratch, &total);
#pragma unroll
      for (int s = 0; s < kPer; ++s) {
        const float x = ch.logit(s);
        if (ch.index(s) < len && !(listed_mask & (1u << s)) && x > next) next = x;  // NaN never compares greater
      }
      next = block_reduce<BLOCK>(next, OpMax(), scratch);
      if (total > kListCap) {
        list_count = -1;
      } else {
        list_count = total;
        float* out = a.lists + (unit * a.chunks + c) * kListCap + offset;
        int k = 0;
#pragma unroll
        for (int s = 0; s < kPer; ++s)
          if (listed_mask & (1u << s)) out[k++] = ch.logit(s);
      }
    }

    if (threadIdx.x == 0) {
      ChunkStats st;
      st.sum = sum;
      st.argmax = first == INT32_MAX ? kNoIndex : start + first;
      st.max = m;
      st.next = next;
      st.bad = bad;
      st.list_count = list_count;
      a.stats[unit * a.chunks + c] = st;
    }
    // The next item's first block_reduce starts with a barrier, so `scratch` is free again.
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
