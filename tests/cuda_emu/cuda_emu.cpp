// The scheduler of the CUDA emulator (cuda_emu.h): every CUDA thread of a block is a coroutine;
// the block's threads run one at a time and switch only at barriers and warp collectives.
// Blocks run one after the other. Single OS thread, deterministic.
//
// Coroutine switch: on x86-64 a few instructions that save the callee-saved registers (and the
// SSE / x87 control words) on the old stack and restore them from the new one; elsewhere
// ucontext (correct, but every switch is a system call).
#include "cuda_emu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define SPECDECODE_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

#include <memory>
#include <stdexcept>
#include <vector>

namespace specdecode_emu {
namespace {

constexpr size_t kStackBytes = 512 * 1024;

#if SPECDECODE_EMU_ASM_SWITCH
// switch_stack(&save, next): pushes the callee-saved state, stores the stack pointer in *save,
// continues on `next` (a stack pointer saved the same way, or prepared by new_context).
extern "C" void specdecode_emu_switch_stack(void** save, void* next);
asm(R"(
  .text
  .globl specdecode_emu_switch_stack
  .type specdecode_emu_switch_stack, @function
specdecode_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size specdecode_emu_switch_stack, .-specdecode_emu_switch_stack
)");

struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context* from, Context* to) { specdecode_emu_switch_stack(&from->sp, to->sp); }
// A fresh context that starts in entry() (which never returns) on the given stack.
inline void new_context(Context* c, char* stack, size_t bytes, void (*entry)()) {
  uintptr_t top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t{15};
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                          // entry's "return address": rsp % 16 == 8 on entry
  *--sp = reinterpret_cast<void*>(entry);   // popped by `ret`
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
  uint32_t control[2];
  asm volatile("stmxcsr %0" : "=m"(control[0]));
  asm volatile("fnstcw %0" : "=m"(control[1]));
  *--sp = nullptr;
  std::memcpy(sp, control, sizeof(control));
  c->sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};
inline void switch_context(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
inline void new_context(Context* c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}
#endif

enum class State { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct Thread {
  Context context;
  std::unique_ptr<char[]> stack;
  State state = State::kRunnable;
  uint3 index{0, 0, 0};
};

struct Warp {
  int arrived = 0;
  int phase = 0;          // 0: depositing values, 1: reading them
  uint64_t values[32] = {};
};

struct Block {
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  int arrived = 0;        // at the block barrier
  int live = 0;           // threads not done
  Context scheduler;
  const BlockBody* body = nullptr;
  std::string error;
};

Block g_block;
Thread* g_current = nullptr;
uint3 g_block_idx{0, 0, 0};
dim3 g_block_dim{1, 1, 1};
dim3 g_grid_dim{1, 1, 1};

void yield_to_scheduler() { switch_context(&g_current->context, &g_block.scheduler); }

void entry() {
  (*g_block.body)();
  g_current->state = State::kDone;
  --g_block.live;
  if (g_block.arrived > 0 && g_block.error.empty())
    g_block.error = "a thread exited while others wait at __syncthreads (divergent barrier)";
  for (const Warp& w : g_block.warps)
    if (w.arrived > 0 && g_block.error.empty())
      g_block.error = "a thread exited while its warp waits in a warp collective";
  switch_context(&g_current->context, &g_block.scheduler);  // never resumed
}

void run_block(unsigned threads) {
  Block& b = g_block;
  if (b.threads.size() < threads) {
    b.threads.resize(threads);
    for (Thread& t : b.threads)
      if (!t.stack) t.stack.reset(new char[kStackBytes]);
  }
  b.warps.assign((threads + 31) / 32, Warp{});
  b.arrived = 0;
  b.live = static_cast<int>(threads);
  for (unsigned i = 0; i < threads; ++i) {
    Thread& t = b.threads[i];
    t.state = State::kRunnable;
    t.index = uint3{i % g_block_dim.x, (i / g_block_dim.x) % g_block_dim.y, i / (g_block_dim.x * g_block_dim.y)};
    new_context(&t.context, t.stack.get(), kStackBytes, entry);
  }
  while (b.live > 0) {
    bool ran = false;
    for (unsigned i = 0; i < threads && b.error.empty(); ++i) {
      Thread& t = b.threads[i];
      if (t.state != State::kRunnable) continue;
      g_current = &t;
      switch_context(&b.scheduler, &t.context);
      ran = true;
    }
    if (!b.error.empty()) break;
    if (!ran) {
      b.error = "deadlock: no thread can run (a barrier or warp collective not reached by every thread)";
      break;
    }
  }
  g_current = nullptr;
  if (!b.error.empty()) {
    const std::string message = b.error;
    b.error.clear();
    throw std::runtime_error("CUDA emulator, block (" + std::to_string(g_block_idx.x) + "): " + message);
  }
}

}  // namespace

uint3 thread_idx() { return g_current->index; }
uint3 block_idx() { return g_block_idx; }
dim3 block_dim() { return g_block_dim; }
dim3 grid_dim() { return g_grid_dim; }

void sync_threads() {
  Block& b = g_block;
  g_current->state = State::kBlockBarrier;
  if (++b.arrived == b.live) {
    b.arrived = 0;
    for (Thread& t : b.threads)
      if (t.state == State::kBlockBarrier) t.state = State::kRunnable;
  }
  yield_to_scheduler();
}

void warp_exchange(unsigned mask, uint64_t value, uint64_t lanes[32]) {
  if (mask != 0xffffffffu) kernel_fail("warp collective with a partial mask");
  Block& b = g_block;
  const unsigned flat = g_current->index.x + g_current->index.y * g_block_dim.x +
                        g_current->index.z * g_block_dim.x * g_block_dim.y;
  Warp& w = b.warps[flat / 32];
  const unsigned lane = flat % 32;
  const unsigned base = flat - lane;
  if (base + 32 > b.threads.size() || base + 32 > static_cast<unsigned>(g_block_dim.x * g_block_dim.y * g_block_dim.z))
    kernel_fail("warp collective in a partial warp");
  // Phase 0: deposit and wait for the whole warp.
  w.values[lane] = value;
  g_current->state = State::kWarpBarrier;
  if (++w.arrived == 32) {
    w.arrived = 0;
    for (unsigned l = 0; l < 32; ++l) b.threads[base + l].state = State::kRunnable;
  }
  yield_to_scheduler();
  std::memcpy(lanes, w.values, sizeof(w.values));
  // Phase 1: nobody deposits the next value before every lane has read this one.
  g_current->state = State::kWarpBarrier;
  if (++w.arrived == 32) {
    w.arrived = 0;
    for (unsigned l = 0; l < 32; ++l) b.threads[base + l].state = State::kRunnable;
  }
  yield_to_scheduler();
}

void kernel_fail(const char* what) {
  if (g_block.error.empty()) g_block.error = what;
  if (g_current == nullptr) throw std::runtime_error(std::string("CUDA emulator: ") + what);
  g_current->state = State::kDone;
  --g_block.live;
  switch_context(&g_current->context, &g_block.scheduler);  // never resumed
  __builtin_unreachable();
}

void run_grid(dim3 grid, dim3 block, const BlockBody& body) {
  const unsigned threads = block.x * block.y * block.z;
  if (threads == 0 || threads > 1024) throw std::runtime_error("CUDA emulator: invalid block size");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) throw std::runtime_error("CUDA emulator: empty grid");
  g_block_dim = block;
  g_grid_dim = grid;
  g_block.body = &body;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        g_block_idx = uint3{x, y, z};
        run_block(threads);
      }
  g_block.body = nullptr;
}

cudaError_t last_error() { return cudaSuccess; }

}  // namespace specdecode_emu
