// The CUDA device layer's first pieces: what is visible, and one kernel that
// proves the nvcc → cc_library → cudart/cuBLAS/NCCL chain end to end.
//
// Built without --config=cuda, these report that CUDA is not compiled in
// (no devices, UNIMPLEMENTED) so that CPU-only code and tests can ask.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_DEVICE_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_DEVICE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom::cuda {

// True when this binary was built with --config=cuda.
bool CompiledWithCuda();

// Visible CUDA devices; 0 without CUDA, without a driver or without a GPU.
int DeviceCount();

// "cudart 13000, cuBLAS 130000, NCCL 22703" (runtime, cuBLAS and NCCL
// versions), readable with no GPU present. UNIMPLEMENTED without CUDA.
absl::StatusOr<std::string> LibraryVersions();

// y[i] = a * x[i] + y[i] on device 0 (copies in and out).
// UNIMPLEMENTED without CUDA; FAILED_PRECONDITION with no device;
// INVALID_ARGUMENT if the sizes differ.
absl::Status Axpy(float a, const std::vector<float>& x, std::vector<float>* y);

}  // namespace loom::cuda

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_DEVICE_H_
