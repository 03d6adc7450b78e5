// The model's ops (runtime/model/ops.h) on one GPU: kernels/cuda on device
// memory, for the same layer code that runs the CPU kernels. The calls are
// asynchronous on the default stream except those that return a value to
// the host (the cross-entropy's loss sum) or group tokens on the host (the
// embedding's backward), which wait for it.
//
// Thread-safety: one thread at a time (the ops keep scratch memory), whose
// current CUDA device is this one: MakeCudaOps makes it the calling
// thread's; another thread calls cudaSetDevice first.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_CUDA_OPS_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_CUDA_OPS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/ops.h"

namespace loom {

// Ops on CUDA device `device` (its backend allocates there). UNIMPLEMENTED
// without --config=cuda; FAILED_PRECONDITION when the device is not visible.
absl::StatusOr<std::unique_ptr<Ops>> MakeCudaOps(int device);

// The ops for a device name (ParseDevice's: cpu, cuda, cuda:N): CpuOps()
// for the CPU, else MakeCudaOps's, kept in `*owned`. Their errors.
absl::StatusOr<Ops*> OpsForDevice(const std::string& device, std::unique_ptr<Ops>* owned);

}  // namespace loom

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_CUDA_OPS_H_
