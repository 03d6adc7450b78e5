// How the CUDA tests treat a missing GPU. Without one they skip, so CPU-only
// machines and CI pass; but where a GPU is expected (LOOM_REQUIRE_GPU=1, which
// `./loom test` sets when nvidia-smi lists a GPU) a missing or unusable device
// is a failure: a broken driver must never read as PASSED.
#ifndef LOOM_RUNTIME_BACKENDS_CUDA_GPU_TESTING_H_
#define LOOM_RUNTIME_BACKENDS_CUDA_GPU_TESTING_H_

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace loom::cuda {

inline bool GpuRequired() {
  const char* v = std::getenv("LOOM_REQUIRE_GPU");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace loom::cuda

// In a TEST body or SetUp: returns from it, skipping (no GPU expected) or
// failing (LOOM_REQUIRE_GPU=1), when `usable` is false.
#define LOOM_REQUIRE_GPU_OR_SKIP(usable, why)                                         \
  do {                                                                                \
    if (!(usable)) {                                                                  \
      if (::loom::cuda::GpuRequired()) GTEST_FAIL() << "LOOM_REQUIRE_GPU=1: " << why; \
      GTEST_SKIP() << why;                                                            \
    }                                                                                 \
  } while (0)

#endif  // LOOM_RUNTIME_BACKENDS_CUDA_GPU_TESTING_H_
