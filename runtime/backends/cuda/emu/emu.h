// The CUDA emulation (--config=cuda_emu): Loom's CUDA sources built by the
// host compiler and run on the CPU, so that CI executes every kernel, under
// AddressSanitizer, against the CPU references. The approach of Triton's
// interpreter mode and HIP-CPU.
//
// What is emulated (include/ holds the stand-in headers):
// - Kernels. A launch (LOOM_LAUNCH, runtime/backends/cuda/launch.h) runs the
//   whole grid before it returns. Blocks run one at a time, in an order
//   shuffled per launch; a block's threads are fibers on the launching
//   thread, resumed in a shuffled order, that switch only at __syncthreads,
//   __syncwarp, warp shuffles and votes. So a missing barrier reads stale or
//   unwritten values, float atomics sum in a different order per schedule,
//   and a barrier that not every thread of the block reaches ends the
//   process with the kernel, the block and the counts (a GPU would hang).
//   __shared__ arrays are per host thread; dynamic shared memory starts
//   filled with 0xff bytes (NaN floats) in every block.
// - Launch limits: more than 1,024 threads per block, an empty grid or block,
//   grid.y or .z over 65,535 or over 48 KiB of dynamic shared memory is
//   cudaErrorInvalidConfiguration, as on a GPU.
// - Memory. cudaMalloc is host memory of the exact size (AddressSanitizer
//   catches a kernel reading past it), counted against the device's
//   capacity (LOOM_CUDA_EMU_MEMORY_GIB, default 80). Under AddressSanitizer
//   device memory is poisoned except while device code runs on it: host
//   code that dereferences a device pointer is reported, and so is a kernel
//   touching another device's memory. Copies and memsets check that their
//   device side lies inside one allocation.
// - Devices: LOOM_CUDA_EMU_DEVICES of them (default 1), cudaSetDevice per
//   host thread.
// - cuBLAS calls go to OpenBLAS (cublas.cc); NCCL's communicators connect
//   ranks that are threads of one process or processes of one machine
//   (nccl.cc, nccl_wire.h).
// - Streams and events exist; work runs when it is issued, except NCCL's,
//   which completes when every rank has issued its part (cudaStreamQuery
//   answers cudaErrorNotReady until then).
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_EMU_EMU_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_EMU_EMU_H_

#include <cstddef>
#include <cstdint>

#include "cuda_runtime.h"

namespace loom::cuda_emu {

// What the emulated device did since the process started (for tests that
// count launches, allocations and copies).
struct Counters {
  int64_t launches = 0;  // kernels and cuBLAS calls
  int64_t mallocs = 0;
  int64_t frees = 0;
  int64_t copies_to_host = 0;
  int64_t copies_to_device = 0;
  int64_t copies_on_device = 0;
  int64_t memsets = 0;
};
Counters GetCounters();

// The schedule's seed: the order of blocks and of a block's threads is a
// function of it and of the launch's number. LOOM_CUDA_EMU_SEED sets it at
// start (default 1); 0 runs blocks and threads in index order.
void SetScheduleSeed(uint64_t seed);

// --- Between the emulation's own files. ---

// LOOM_EMU_ASAN: built under AddressSanitizer (GCC's or Clang's flag).
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_EMU_ASAN 1
#endif
#endif

// The calling host thread's device (cudaSetDevice), and the count.
int CurrentDevice();
int Devices();

// Records `e` as the calling thread's last error (cudaGetLastError).
void SetLastError(cudaError_t e);

// True when [p, p + bytes) lies inside one device allocation; its device.
bool InDeviceMemory(const void* p, size_t bytes, int* device = nullptr);

// While it lives, device code runs: one at a time across host threads, with
// the memory of `device` (-1: every device) addressable.
class DeviceAccess {
 public:
  explicit DeviceAccess(int device);
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  int device_;
};

void CountLaunch();

}  // namespace loom::cuda_emu

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_EMU_EMU_H_
