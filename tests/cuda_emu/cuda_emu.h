// A CUDA emulator for testing the kernels of csrc/kernels/cuda on a machine without a GPU.
//
// With SPECDECODE_CUDA_EMULATION defined, compat.cuh includes this header instead of the CUDA
// runtime, and the unchanged kernel sources compile as host C++ (g++). A launch runs the grid's
// blocks one after the other; inside a block every CUDA thread is a coroutine (ucontext) on its
// own stack, and the scheduler switches threads only at synchronisation points:
//   __syncthreads()       all live threads of the block must arrive (a thread that exits while
//                         others wait, or a barrier nobody can complete, is reported as an error:
//                         divergent barriers are bugs);
//   warp collectives      (__shfl*_sync, __ballot_sync, __match_any_sync) all 32 lanes must
//                         arrive with the full mask, values are exchanged exactly as on the GPU.
// Between synchronisation points a thread runs alone, so shared-memory traffic behaves like a
// race-free program; `__shared__` variables are function statics (one block runs at a time).
// Floating point: compile with -ffp-contract=off so the explicitly rounded intrinsics below are
// exact; ex2.approx is emulated with exp2f (the kernels only use it for sums whose rounding no
// decision depends on).
//
// Test infrastructure only: it throws std::runtime_error on misuse (from the scheduler, never
// from inside a coroutine).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>

// ------------------------------------------------------------------------------ qualifiers
#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace specdecode_emu {

// ------------------------------------------------------------------------------ scheduler API
uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();
void sync_threads();
// Collective over the calling thread's warp: deposits `value` (8 bytes), waits for all lanes,
// and returns every lane's deposit in lanes[0..32).
void warp_exchange(unsigned mask, uint64_t value, uint64_t lanes[32]);
// Reports a kernel-side error (the launch then fails) and never returns to the kernel.
[[noreturn]] void kernel_fail(const char* what);

using BlockBody = std::function<void()>;
// Runs `body` for every thread of every block of the grid; throws std::runtime_error on
// deadlock, divergence or a kernel_fail.
void run_grid(dim3 grid, dim3 block, const BlockBody& body);
cudaError_t last_error();

template <typename V>
inline uint64_t to_bits(V v) {
  static_assert(sizeof(V) <= 8, "warp exchange of values up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(V));
  return bits;
}
template <typename V>
inline V from_bits(uint64_t bits) {
  V v;
  std::memcpy(&v, &bits, sizeof(V));
  return v;
}
inline unsigned lane_id() { return thread_idx().x & 31u; }

struct Launch {
  dim3 grid, block;
  Launch(dim3 g, dim3 b, size_t shared_bytes, cudaStream_t) : grid(g), block(b) {
    if (shared_bytes != 0) kernel_fail("dynamic shared memory is not emulated");
  }
  template <typename Kernel>
  auto run(Kernel kernel) const {
    const dim3 g = grid, b = block;
    return [kernel, g, b](auto&&... args) { run_grid(g, b, [&] { kernel(args...); }); };
  }
};

inline float ex2_approx_ftz(float t) {
  const float r = std::exp2(t);
  return r < FLT_MIN ? 0.0f : r;
}

}  // namespace specdecode_emu

#define threadIdx (::specdecode_emu::thread_idx())
#define blockIdx (::specdecode_emu::block_idx())
#define blockDim (::specdecode_emu::block_dim())
#define gridDim (::specdecode_emu::grid_dim())

inline void __syncthreads() { ::specdecode_emu::sync_threads(); }

// ------------------------------------------------------------------------------ warp intrinsics
template <typename V>
inline V __shfl_sync(unsigned mask, V v, int src) {
  uint64_t lanes[32];
  ::specdecode_emu::warp_exchange(mask, ::specdecode_emu::to_bits(v), lanes);
  return ::specdecode_emu::from_bits<V>(lanes[src & 31]);
}
template <typename V>
inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask) {
  uint64_t lanes[32];
  ::specdecode_emu::warp_exchange(mask, ::specdecode_emu::to_bits(v), lanes);
  return ::specdecode_emu::from_bits<V>(lanes[(::specdecode_emu::lane_id() ^ static_cast<unsigned>(lane_mask)) & 31u]);
}
template <typename V>
inline V __shfl_up_sync(unsigned mask, V v, unsigned delta) {
  uint64_t lanes[32];
  ::specdecode_emu::warp_exchange(mask, ::specdecode_emu::to_bits(v), lanes);
  const unsigned lane = ::specdecode_emu::lane_id();
  return ::specdecode_emu::from_bits<V>(lanes[lane >= delta ? lane - delta : lane]);
}
template <typename V>
inline V __shfl_down_sync(unsigned mask, V v, unsigned delta) {
  uint64_t lanes[32];
  ::specdecode_emu::warp_exchange(mask, ::specdecode_emu::to_bits(v), lanes);
  const unsigned lane = ::specdecode_emu::lane_id();
  return ::specdecode_emu::from_bits<V>(lanes[lane + delta < 32 ? lane + delta : lane]);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  uint64_t lanes[32];
  ::specdecode_emu::warp_exchange(mask, predicate ? 1u : 0u, lanes);
  unsigned out = 0;
  for (int l = 0; l < 32; ++l) out |= (lanes[l] ? 1u : 0u) << l;
  return out;
}
template <typename V>
inline unsigned __match_any_sync(unsigned mask, V v) {
  uint64_t lanes[32];
  ::specdecode_emu::warp_exchange(mask, ::specdecode_emu::to_bits(v), lanes);
  const uint64_t mine = lanes[::specdecode_emu::lane_id()];
  unsigned out = 0;
  for (int l = 0; l < 32; ++l) out |= (lanes[l] == mine ? 1u : 0u) << l;
  return out;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(unsigned v) { return __builtin_ffs(static_cast<int>(v)); }
inline int __clz(unsigned v) { return v == 0 ? 32 : __builtin_clz(v); }

// Atomics: a thread is never interrupted between synchronisation points.
inline int atomicAdd(int* address, int value) {
  const int old = *address;
  *address = old + value;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  const unsigned long long old = *address;
  *address = old + value;
  return old;
}

// ------------------------------------------------------------------------------ memory, bits
inline uint4 __ldg(const uint4* p) {
  if (reinterpret_cast<uintptr_t>(p) & 15u) ::specdecode_emu::kernel_fail("misaligned 16-byte load");
  return *p;
}
inline float __int_as_float(int v) { return ::specdecode_emu::from_bits<float>(static_cast<uint32_t>(v)); }
inline float __uint_as_float(unsigned v) { return ::specdecode_emu::from_bits<float>(v); }
inline unsigned __float_as_uint(float v) { return static_cast<unsigned>(::specdecode_emu::to_bits(v)); }
inline double __longlong_as_double(long long v) { return ::specdecode_emu::from_bits<double>(static_cast<uint64_t>(v)); }
inline double __hiloint2double(int hi, int lo) {
  return ::specdecode_emu::from_bits<double>((static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32) |
                                             static_cast<uint32_t>(lo));
}

// ------------------------------------------------------------------------------ arithmetic
// Each is one IEEE operation with round-to-nearest (needs -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
