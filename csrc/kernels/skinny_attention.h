// Attention for few queries per row on the CPU: out = softmax(scale * q k^T + mask) v for the n
// queries of each (batch row, head) of a decode or verification step (n = 1 .. a few dozen),
// against a static cache of C columns. Each key and value row is read once for every query of
// its head group (grouped-query heads share it). Columns the mask rules out (the lowest float,
// -inf or False: their softmax weight is exactly 0) are skipped: no value row of theirs is read,
// nor their key rows where four neighbouring columns are all ruled out for every query of the
// head group (a key read beside attended ones is discarded), so a static cache's padding and
// unwritten columns cost next to nothing.
//
// Shapes: q [B, H, n, D], k and v [B, Hkv, C, D] (H a multiple of Hkv; the last dimension
// contiguous, any other strides), mask [B, H or 1, n, C] (any strides): additive float32, or
// bytes of a boolean mask (nonzero = attend: additive 0; zero = -inf), out [B, H, n, D]
// contiguous. A query row whose every column is masked gets what the additive mask gives:
// uniform weights over the columns at the lowest float, zeros when all are -inf.
//
// The body (skinny_attention_body.inc) is compiled once per instruction set inside
// skinny_linear.h's namespaces, with their vector traits and `#pragma GCC target`, and picked
// at run time with the other CPU kernels' choice, logit_loops_isa(). No torch here.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/skinny_linear.h"

namespace specdecode {
namespace kernels {

struct SkinnyAttentionArgs {
  const float* q;
  int64_t q_sb, q_sh, q_sn;
  const float* k;
  int64_t k_sb, k_sh, k_sc;
  const float* v;
  int64_t v_sb, v_sh, v_sc;
  const float* mask;          // additive float32 mask, or null when mask_bool is given
  const uint8_t* mask_bool;   // boolean mask (one byte per element), or null
  int64_t m_sb, m_sh, m_sn, m_sc;
  float* out;
  int64_t H, Hkv, n, C, D;
  float scale;
};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A mask value whose column gets softmax weight exactly 0 next to any attended column.
SPECDECODE_ALWAYS_INLINE bool is_masked(float m) { return m == kNegInf || m == -FLT_MAX; }

// The R = (H / Hkv) * n query rows of one batch row and key/value head: row r = hh * n + i is
// query i of head kvh * (H / Hkv) + hh.
struct AttentionTask {
  const SkinnyAttentionArgs& a;
  const float* key;
  const float* value;
  const float* query;
  const float* mask;
  const uint8_t* mask_bool;
  float* out;
  int64_t g, n, R, C, D, k_sc, v_sc, m_sc;
  float scale;

  AttentionTask(const SkinnyAttentionArgs& args, int64_t b, int64_t kvh)
      : a(args),
        key(args.k + b * args.k_sb + kvh * args.k_sh),
        value(args.v + b * args.v_sb + kvh * args.v_sh),
        query(args.q + b * args.q_sb + kvh * (args.H / args.Hkv) * args.q_sh),
        mask(args.mask ? args.mask + b * args.m_sb + kvh * (args.H / args.Hkv) * args.m_sh : nullptr),
        mask_bool(args.mask_bool ? args.mask_bool + b * args.m_sb + kvh * (args.H / args.Hkv) * args.m_sh
                                 : nullptr),
        out(args.out + (b * args.H + kvh * (args.H / args.Hkv)) * args.n * args.D),
        g(args.H / args.Hkv),
        n(args.n),
        R(args.H / args.Hkv * args.n),
        C(args.C),
        D(args.D),
        k_sc(args.k_sc),
        v_sc(args.v_sc),
        m_sc(args.m_sc),
        scale(args.scale) {}

  SPECDECODE_ALWAYS_INLINE const float* query_row(int64_t r) const {
    return query + (r / n) * a.q_sh + (r % n) * a.q_sn;
  }
  // The additive mask value of query row r at column c (a boolean mask's: 0 or -inf).
  SPECDECODE_ALWAYS_INLINE float mask_at(int64_t r, int64_t c) const {
    const int64_t at = (r / n) * a.m_sh + (r % n) * a.m_sn + c * m_sc;
    if (mask_bool != nullptr) return mask_bool[at] ? 0.0f : kNegInf;
    return mask[at];
  }
  SPECDECODE_ALWAYS_INLINE float* out_row(int64_t r) const { return out + r * D; }
};

// Scratch floats one task needs.
inline int64_t skinny_attention_scratch(int64_t H, int64_t Hkv, int64_t n, int64_t C, int64_t D) {
  const int64_t rows = H / Hkv * n;
  return rows * C + rows + D;
}

namespace skinny_baseline {
#include "kernels/skinny_attention_body.inc"
}  // namespace skinny_baseline

#ifdef SPECDECODE_HAVE_X86_SKINNY
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace skinny_avx2 {
#include "kernels/skinny_attention_body.inc"
}  // namespace skinny_avx2
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma")
namespace skinny_avx512 {
#include "kernels/skinny_attention_body.inc"
}  // namespace skinny_avx512
#pragma GCC pop_options
#endif

// The query rows of batch row b and key/value head kvh, with the instruction set the verify
// ops run (logit_loops_isa). scratch: skinny_attention_scratch(...) floats.
inline void skinny_attention_task(const SkinnyAttentionArgs& a, int64_t b, int64_t kvh, float* scratch) {
  using Fn = void (*)(const AttentionTask&, float*);
  static const Fn chosen = [] {
#ifdef SPECDECODE_HAVE_X86_SKINNY
    const char* isa = logit_loops_isa();
    if (std::strcmp(isa, "avx512") == 0) return static_cast<Fn>(&skinny_avx512::attend);
    if (std::strcmp(isa, "avx2") == 0) return static_cast<Fn>(&skinny_avx2::attend);
#endif
    return static_cast<Fn>(&skinny_baseline::attend);
  }();
  chosen(AttentionTask(a, b, kvh), scratch);
}

}  // namespace kernels
}  // namespace specdecode
