// The CUDA backend: tensors in one GPU's memory (runtime/tensor/backend.h).
// Synchronous copies; Synchronize() waits for the device.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/tensor/backend.h"

namespace loom {

// A backend for CUDA device `device`. UNIMPLEMENTED when built without
// --config=cuda; FAILED_PRECONDITION when that device is not visible.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

}  // namespace loom

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_CUDA_BACKEND_H_
