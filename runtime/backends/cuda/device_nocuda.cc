// device.h for builds without --config=cuda: CUDA is not compiled in.
#ifndef LOOM_WITH_CUDA

#include "runtime/backends/cuda/device.h"

namespace loom::cuda {

bool CompiledWithCuda() { return false; }
int DeviceCount() { return 0; }

absl::StatusOr<std::string> LibraryVersions() {
  return absl::UnimplementedError("built without CUDA (build with --config=cuda)");
}

absl::Status Axpy(float, const std::vector<float>&, std::vector<float>*) {
  return absl::UnimplementedError("built without CUDA (build with --config=cuda)");
}

}  // namespace loom::cuda

#endif  // LOOM_WITH_CUDA
