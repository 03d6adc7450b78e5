// The CUDA backend: tensors in one GPU's memory (runtime/tensor/backend.h).
// Synchronous copies; Synchronize() waits for the device.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/tensor/backend.h"

namespace loom {

// A backend for CUDA device `device`. UNIMPLEMENTED when built without
// --config=cuda; FAILED_PRECONDITION when that device is not visible.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

// What a CUDA backend took from the device and holds.
struct CudaMemoryStats {
  int64_t device_allocations = 0;  // cudaMalloc calls
  int64_t device_frees = 0;        // cudaFree calls
  size_t in_use_bytes = 0;         // blocks allocated and not freed
  size_t cached_bytes = 0;         // freed by its user, kept for reuse
  size_t peak_in_use_bytes = 0;    // the most in use since the last ResetPeak()
  // What the buffers asked for (in_use_bytes less the blocks' rounding and
  // the slack of a reused larger block): Backend::in_use_bytes and
  // peak_bytes, what the memory model predicts.
  size_t requested_bytes = 0;
  size_t peak_requested_bytes = 0;
};
// Of a backend from MakeCudaBackend; zeros for any other.
CudaMemoryStats GetCudaMemoryStats(const Backend* backend);

}  // namespace loom

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_
