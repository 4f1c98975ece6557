// Counter-based Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC 2011) and the mapping from (seed, offset, row, column) to the float64 coins of one
// verification call. Needs no CUDA header: it compiles as plain C++ (host) and as CUDA
// host+device code, so a CPU implementation can reproduce the GPU's coins bit for bit.
//
// Coin layout (the same [B, gamma+1] layout as the explicit `uniforms` of the ops):
//   key     = (seed & 0xffffffff, seed >> 32)
//   counter = (column / 2, row, offset & 0xffffffff, offset >> 32)
//   the 4 output words w0..w3 give two coins: column even -> (w0, w1), odd -> (w2, w3);
//   coin = ((hi << 32 | lo) >> 11) * 2^-53, a multiple of 2^-53 in [0, 1 - 2^-53].
// A caller advances `offset` by 1 per call; counters never repeat while rows < 2^32 and
// columns < 2^33.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPECDECODE_HD __host__ __device__ __forceinline__
#else
#define SPECDECODE_HD inline
#endif

namespace specdecode {
namespace kernels {
namespace cuda {

struct Philox4x32 {
  uint32_t v[4];
};

SPECDECODE_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Philox4x32 with 10 rounds; the key is bumped by the Weyl constants between rounds.
SPECDECODE_HD Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  const uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  const uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = counter.v[0], c1 = counter.v[1], c2 = counter.v[2], c3 = counter.v[3];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kWeyl0;
      key1 += kWeyl1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, c0, &hi0, &lo0);
    philox_mulhilo(kMul1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ key0;
    const uint32_t n2 = hi0 ^ c3 ^ key1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  Philox4x32 out;
  out.v[0] = c0;
  out.v[1] = c1;
  out.v[2] = c2;
  out.v[3] = c3;
  return out;
}

// 53 random bits from two words, as a double in [0, 1).
SPECDECODE_HD double philox_words_to_unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 32) | static_cast<uint64_t>(lo);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

// The coin uniforms[row, column] of the call identified by (seed, offset); see the layout above.
SPECDECODE_HD double philox_uniform(uint64_t seed, uint64_t offset, uint64_t row, uint64_t column) {
  Philox4x32 counter;
  counter.v[0] = static_cast<uint32_t>(column >> 1);
  counter.v[1] = static_cast<uint32_t>(row);
  counter.v[2] = static_cast<uint32_t>(offset);
  counter.v[3] = static_cast<uint32_t>(offset >> 32);
  const Philox4x32 out = philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return (column & 1) ? philox_words_to_unit_double(out.v[2], out.v[3])
                      : philox_words_to_unit_double(out.v[0], out.v[1]);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace specdecode
