// The CUDA emulation's cuda_runtime.h (runtime/backends/cuda/emu): the part
// of the CUDA runtime API and of the kernel language that Loom's CUDA
// sources use, for building them with the host C++ compiler under
// --config=cuda_emu. Device memory is host memory, a kernel's blocks run one
// after another and a block's threads run as fibers that switch at
// __syncthreads, warp shuffles and warp votes (emu.h says how). Timings mean
// nothing here; results, bounds and synchronisation do.
#ifndef LOOM_CUDA_EMU_CUDA_RUNTIME_H_
#define LOOM_CUDA_EMU_CUDA_RUNTIME_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define LOOM_CUDA_EMU_RUNTIME 1
#define CUDART_VERSION 13000

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchOutOfResources = 701,
} cudaError_t;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

struct CUstream_st;
typedef CUstream_st* cudaStream_t;
struct CUevent_st;
typedef CUevent_st* cudaEvent_t;

#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

extern "C" {
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
}

// The C++ API's typed allocation, as in CUDA's header.
template <class T>
inline cudaError_t cudaMalloc(T** ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}

// The kernel language, for the host compiler.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time on a host thread, so a block's shared memory is
// a static per host thread (dynamic shared memory: loom::cuda_emu::DynamicShared()).
#define __shared__ static thread_local

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
inline constexpr int warpSize = 32;

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

namespace loom::cuda_emu {

// The kernel-side primitives, for the current fiber (emu.cc).
void SyncThreads();
void SyncWarp(unsigned mask);
// Exchanges `bits` among the lanes of `mask`; returns lane src's (own value
// for a source outside the warp or the mask). mode: 0 idx, 1 xor, 2 down, 3 up.
uint64_t Shuffle(unsigned mask, uint64_t bits, int mode, int arg, int width);
unsigned Ballot(unsigned mask, bool predicate);
void* DynamicShared();

// A kernel's grid, run to its end on the calling thread. `run(ctx)` is one
// thread's body.
void RunKernel(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
               void (*run)(void*), void* ctx);

template <typename T>
T ShuffleAs(unsigned mask, T v, int mode, int arg, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = Shuffle(mask, bits, mode, arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// A launch: the kernel's parameters copied once, as a launch does, and
// passed by value to every thread.
template <typename... P, typename... A>
void Launch(const char* name, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            void (*kernel)(P...), A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "a kernel launch with the wrong argument count");
  struct Context {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> params;
  };
  Context ctx{kernel, std::tuple<std::decay_t<P>...>(
                          static_cast<std::decay_t<P>>(std::forward<A>(args))...)};
  RunKernel(
      name, grid, block, shared_bytes, stream,
      [](void* c) {
        Context* x = static_cast<Context*>(c);
        std::apply(x->kernel, x->params);
      },
      &ctx);
}

template <typename T>
T AtomicAdd(T* address, T v) {
  if constexpr (std::is_floating_point_v<T>) {
    T old;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    T sum = old + v;
    while (!__atomic_compare_exchange(address, &old, &sum, false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
      sum = old + v;
    }
    return old;
  } else {
    return __atomic_fetch_add(address, v, __ATOMIC_RELAXED);
  }
}

}  // namespace loom::cuda_emu

inline void __syncthreads() { ::loom::cuda_emu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::loom::cuda_emu::SyncWarp(mask); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
  return ::loom::cuda_emu::ShuffleAs(mask, v, 0, src, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  return ::loom::cuda_emu::ShuffleAs(mask, v, 1, lane_mask, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return ::loom::cuda_emu::ShuffleAs(mask, v, 2, static_cast<int>(delta), width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return ::loom::cuda_emu::ShuffleAs(mask, v, 3, static_cast<int>(delta), width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::loom::cuda_emu::Ballot(mask, predicate != 0);
}

inline float atomicAdd(float* a, float v) { return ::loom::cuda_emu::AtomicAdd(a, v); }
inline double atomicAdd(double* a, double v) { return ::loom::cuda_emu::AtomicAdd(a, v); }
inline int atomicAdd(int* a, int v) { return ::loom::cuda_emu::AtomicAdd(a, v); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return ::loom::cuda_emu::AtomicAdd(a, v); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return ::loom::cuda_emu::AtomicAdd(a, v);
}

#endif  // LOOM_CUDA_EMU_CUDA_RUNTIME_H_
