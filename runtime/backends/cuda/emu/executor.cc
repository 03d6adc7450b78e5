// Kernel execution for the CUDA emulation (emu.h): a grid's blocks in a
// shuffled order, a block's threads as fibers that switch at barriers.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "emu.h"

#ifdef LOOM_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace loom::cuda_emu {
namespace {

// --- Context switches. On x86-64 a few instructions (callee-saved
// registers, the SSE and x87 control words, the stack pointer); elsewhere
// ucontext, which also saves the signal mask with a system call.
#if defined(__x86_64__)

extern "C" void loom_emu_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.p2align 4
.globl loom_emu_switch
.hidden loom_emu_switch
.type loom_emu_switch,@function
loom_emu_switch:
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
.size loom_emu_switch,.-loom_emu_switch
.section .note.GNU-stack,"",@progbits
)");

struct Context {
  void* sp = nullptr;
};

// A new fiber's stack: loom_emu_switch's frame whose return goes to entry,
// with the stack aligned as at a call.
void MakeContext(Context* c, char* stack, size_t size, void (*entry)()) {
  uintptr_t top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                  // entry's return address: none
  *--sp = reinterpret_cast<uint64_t>(entry);  // 16-byte aligned slot
  for (int i = 0; i < 6; ++i) *--sp = 0;      // rbp rbx r12 r13 r14 r15
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  *--sp = static_cast<uint64_t>(mxcsr) | (static_cast<uint64_t>(fpucw) << 32);
  c->sp = sp;
}

void Switch(Context* from, Context* to) { loom_emu_switch(&from->sp, to->sp); }

#else

struct Context {
  ucontext_t uc;
};

void MakeContext(Context* c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, entry, 0);
}

void Switch(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }

#endif

// Stacks: kernels use little, but AddressSanitizer's frames are larger. A
// guard page below each catches an overflow.
constexpr size_t kStackBytes = 256 << 10;
constexpr size_t kGuardBytes = 4096;
constexpr int kMaxThreads = 1024;
constexpr size_t kMaxDynamicShared = 48 << 10;

enum class State { kIdle, kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct Fiber {
  Context context;
  char* mapping = nullptr;
  char* stack = nullptr;
  void* fake_stack = nullptr;  // AddressSanitizer's, across switches
  State state = State::kIdle;
  uint3 tid{0, 0, 0};
  int warp = 0, lane = 0;
  uint64_t shuffles = 0;  // this thread's warp operations so far (double buffer)

  Fiber() {
    void* m = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "CUDA emulation: cannot map a thread stack\n");
      std::abort();
    }
    mapping = static_cast<char*>(m);
    mprotect(mapping, kGuardBytes, PROT_NONE);
    stack = mapping + kGuardBytes;
  }
  ~Fiber() { munmap(mapping, kStackBytes + kGuardBytes); }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
};

struct Warp {
  unsigned lanes = 0;    // the lanes this block has in the warp
  unsigned arrived = 0;  // lanes waiting at the current warp operation
  uint64_t slots[2][32] = {};
};

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::atomic<uint64_t>& ScheduleSeed() {
  static std::atomic<uint64_t> seed = [] {
    const char* v = std::getenv("LOOM_CUDA_EMU_SEED");
    return v == nullptr ? uint64_t{1} : std::strtoull(v, nullptr, 10);
  }();
  return seed;
}

std::atomic<uint64_t> launch_number{0};

// The order of n items for this launch: index order under seed 0.
void Order(std::vector<int>* order, int n, uint64_t seed, uint64_t salt) {
  order->resize(n);
  std::iota(order->begin(), order->end(), 0);
  if (seed == 0 || n < 2) return;
  std::mt19937_64 rng(Mix(seed ^ Mix(salt)));
  std::shuffle(order->begin(), order->end(), rng);
}

uint3 Unflatten(uint64_t i, dim3 d) {
  uint3 u;
  u.x = static_cast<unsigned>(i % d.x);
  u.y = static_cast<unsigned>((i / d.x) % d.y);
  u.z = static_cast<unsigned>(i / (static_cast<uint64_t>(d.x) * d.y));
  return u;
}

class Executor {
 public:
  static Executor& ThisThread() {
    thread_local Executor executor;
    return executor;
  }

  void Run(const char* name, dim3 grid, dim3 block, size_t shared_bytes, void (*run)(void*),
           void* ctx) {
    if (running_) Fail("a launch from inside a kernel (dynamic parallelism is not emulated)");
    running_ = true;
    name_ = name;
    run_ = run;
    ctx_ = ctx;
    threads_ = static_cast<int>(block.x * block.y * block.z);
    while (static_cast<int>(fibers_.size()) < threads_) {
      fibers_.push_back(std::make_unique<Fiber>());
      MakeContext(&fibers_.back()->context, fibers_.back()->stack, kStackBytes, &FiberMain);
    }
    const uint64_t seed = ScheduleSeed().load(std::memory_order_relaxed);
    const uint64_t launch = launch_number.fetch_add(1, std::memory_order_relaxed);
    const uint64_t blocks = static_cast<uint64_t>(grid.x) * grid.y * grid.z;
    gridDim = grid;
    blockDim = block;
    shared_.resize(shared_bytes);  // filled per block (RunBlock)
    Order(&thread_order_, threads_, seed, launch * 2 + 1);
    // Blocks in a shuffled order: a permutation of the first 2^20 (larger
    // grids run in strides of a shuffled start, to keep the table small).
    const int table = static_cast<int>(std::min<uint64_t>(blocks, 1 << 20));
    Order(&block_order_, table, seed, launch * 2);
    for (int start : block_order_) {
      for (uint64_t b = static_cast<uint64_t>(start); b < blocks; b += table) {
        blockIdx = Unflatten(b, grid);
        RunBlock();
      }
    }
    running_ = false;
  }

  // --- Called on a fiber. ---

  void SyncThreads() {
    Fiber* f = Current("__syncthreads");
    if (++block_arrived_ == threads_) {
      block_arrived_ = 0;
      for (int t = 0; t < threads_; ++t) {
        if (fibers_[t]->state == State::kBlockBarrier) fibers_[t]->state = State::kRunnable;
      }
      return;
    }
    f->state = State::kBlockBarrier;
    Yield(f);
  }

  // Waits until every lane of `mask` that the block has is here.
  void WarpArrive(Fiber* f, unsigned mask, const char* what) {
    Warp& w = warps_[f->warp];
    const unsigned bit = 1u << f->lane;
    if ((mask & bit) == 0) Fail(std::string(what) + " by a lane outside its own mask");
    const unsigned want = mask & w.lanes;
    w.arrived |= bit;
    if ((w.arrived & want) == want) {
      w.arrived &= ~want;
      for (int l = 0; l < 32; ++l) {
        if ((want >> l & 1) && l != f->lane) {
          Fiber* g = fibers_[f->warp * 32 + l].get();
          if (g->state == State::kWarpBarrier) g->state = State::kRunnable;
        }
      }
      return;
    }
    f->state = State::kWarpBarrier;
    Yield(f);
  }

  uint64_t Shuffle(unsigned mask, uint64_t bits, int mode, int arg, int width) {
    Fiber* f = Current("a warp shuffle");
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
      Fail("a warp shuffle of width " + std::to_string(width) + " (a power of 2 up to 32)");
    }
    Warp& w = warps_[f->warp];
    const int buf = static_cast<int>(f->shuffles++ & 1);
    w.slots[buf][f->lane] = bits;
    WarpArrive(f, mask, "a warp shuffle");
    const int lane = f->lane, base = lane / width * width;
    int src = lane;
    switch (mode) {
      case 0:
        src = base + ((arg % width) + width) % width;
        break;
      case 1:
        src = lane ^ arg;
        if (src / width != lane / width) src = lane;
        break;
      case 2:
        src = lane + arg;
        if (src / width != lane / width) src = lane;
        break;
      default:
        src = lane - arg;
        if (src < base) src = lane;
        break;
    }
    if (src < 0 || src > 31 || ((mask & w.lanes) >> src & 1) == 0) return bits;
    return w.slots[buf][src];
  }

  unsigned Ballot(unsigned mask, bool predicate) {
    Fiber* f = Current("a warp vote");
    Warp& w = warps_[f->warp];
    const int buf = static_cast<int>(f->shuffles++ & 1);
    w.slots[buf][f->lane] = predicate ? 1 : 0;
    WarpArrive(f, mask, "a warp vote");
    unsigned out = 0;
    for (int l = 0; l < 32; ++l) {
      if ((mask & w.lanes) >> l & 1) out |= static_cast<unsigned>(w.slots[buf][l] != 0) << l;
    }
    return out;
  }

  void SyncWarp(unsigned mask) { WarpArrive(Current("__syncwarp"), mask, "__syncwarp"); }

  void* DynamicShared() {
    Current("dynamic shared memory");
    return shared_.data();
  }

 private:
  Executor() = default;

  static void FiberMain() {
    Executor& e = ThisThread();
    for (;;) {
      Fiber* f = e.current_;
      e.Entered(f);
      e.run_(e.ctx_);
      f->state = State::kDone;
      ++e.done_;
      e.Leave(f);
    }
  }

  Fiber* Current(const char* what) {
    if (current_ == nullptr) Fail(std::string(what) + " outside a kernel");
    return current_;
  }

  void RunBlock() {
    for (int t = 0; t < threads_; ++t) {
      Fiber* f = fibers_[t].get();
      f->state = State::kRunnable;
      f->tid = Unflatten(static_cast<uint64_t>(t), blockDim);
      f->warp = t / 32;
      f->lane = t % 32;
      f->shuffles = 0;
    }
    for (int w = 0; w * 32 < threads_; ++w) {
      const int n = std::min(32, threads_ - w * 32);
      warps_[w].lanes = n == 32 ? 0xffffffffu : (1u << n) - 1;
      warps_[w].arrived = 0;
    }
    std::fill(shared_.begin(), shared_.end(), static_cast<char>(0xff));
    block_arrived_ = 0;
    done_ = 0;
    while (done_ < threads_) {
      bool progressed = false;
      for (int t : thread_order_) {
        Fiber* f = fibers_[t].get();
        if (f->state != State::kRunnable) continue;
        progressed = true;
        Resume(f);
      }
      if (!progressed) Deadlock();
    }
  }

  void Resume(Fiber* f) {
    current_ = f;
    threadIdx = f->tid;
#ifdef LOOM_EMU_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack_, f->stack, kStackBytes);
#endif
    Switch(&scheduler_, &f->context);
#ifdef LOOM_EMU_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack_, nullptr, nullptr);
#endif
    current_ = nullptr;
  }

  // On the fiber: back to the scheduler until resumed.
  void Yield(Fiber* f) {
    Leave(f);
    Entered(f);
  }

  void Leave(Fiber* f) {
#ifdef LOOM_EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake_stack, scheduler_bottom_, scheduler_size_);
#endif
    Switch(&f->context, &scheduler_);
  }

  void Entered(Fiber* f) {
#ifdef LOOM_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, &scheduler_bottom_, &scheduler_size_);
#else
    (void)f;
#endif
  }

  std::string Where() const {
    char b[160];
    std::snprintf(b, sizeof(b), "kernel %s, block (%u,%u,%u) of (%u,%u,%u), %d threads", name_,
                  blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, threads_);
    return b;
  }

  [[noreturn]] void Fail(const std::string& what) const {
    std::fprintf(stderr, "CUDA emulation: %s: %s\n", Where().c_str(), what.c_str());
    std::abort();
  }

  [[noreturn]] void Deadlock() const {
    int at_block = 0, at_warp = 0, done = 0;
    for (int t = 0; t < threads_; ++t) {
      const State s = fibers_[t]->state;
      at_block += s == State::kBlockBarrier;
      at_warp += s == State::kWarpBarrier;
      done += s == State::kDone;
    }
    Fail("a barrier that not every thread reaches: " + std::to_string(at_block) +
         " threads wait at __syncthreads, " + std::to_string(at_warp) + " at a warp operation, " +
         std::to_string(done) + " have returned (a GPU would hang or corrupt)");
  }

  std::vector<std::unique_ptr<Fiber>> fibers_;
  Warp warps_[kMaxThreads / 32];
  std::vector<char> shared_;
  std::vector<int> thread_order_, block_order_;
  Context scheduler_;
  void* scheduler_fake_stack_ = nullptr;
  const void* scheduler_bottom_ = nullptr;
  size_t scheduler_size_ = 0;
  Fiber* current_ = nullptr;
  const char* name_ = "";
  void (*run_)(void*) = nullptr;
  void* ctx_ = nullptr;
  int threads_ = 0;
  int block_arrived_ = 0;
  int done_ = 0;
  bool running_ = false;
};

cudaError_t CheckConfiguration(dim3 grid, dim3 block, size_t shared_bytes) {
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0) {
    return cudaErrorInvalidConfiguration;
  }
  if (threads > kMaxThreads || block.x > 1024 || block.y > 1024 || block.z > 64) {
    return cudaErrorInvalidConfiguration;
  }
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  if (shared_bytes > kMaxDynamicShared) return cudaErrorInvalidConfiguration;
  return cudaSuccess;
}

}  // namespace

void SetScheduleSeed(uint64_t seed) { ScheduleSeed().store(seed, std::memory_order_relaxed); }

void RunKernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t,
               void (*run)(void*), void* ctx) {
  if (Devices() == 0) {
    SetLastError(cudaErrorNoDevice);
    return;
  }
  if (cudaError_t e = CheckConfiguration(grid, block, shared_bytes); e != cudaSuccess) {
    SetLastError(e);
    return;
  }
  CountLaunch();
  DeviceAccess access(CurrentDevice());
  Executor::ThisThread().Run(name, grid, block, shared_bytes, run, ctx);
}

void SyncThreads() { Executor::ThisThread().SyncThreads(); }
void SyncWarp(unsigned mask) { Executor::ThisThread().SyncWarp(mask); }
uint64_t Shuffle(unsigned mask, uint64_t bits, int mode, int arg, int width) {
  return Executor::ThisThread().Shuffle(mask, bits, mode, arg, width);
}
unsigned Ballot(unsigned mask, bool predicate) {
  return Executor::ThisThread().Ballot(mask, predicate);
}
void* DynamicShared() { return Executor::ThisThread().DynamicShared(); }

}  // namespace loom::cuda_emu
