#include "runtime/backends/cuda/device.h"

#include "gtest/gtest.h"
#include "runtime/backends/cuda/gpu_testing.h"

namespace loom::cuda {
namespace {

TEST(CudaDeviceTest, ReportsWhatWasCompiledIn) {
  absl::StatusOr<std::string> v = LibraryVersions();
  if (!CompiledWithCuda()) {
    EXPECT_FALSE(GpuRequired()) << "LOOM_REQUIRE_GPU=1 but built without CUDA";
    EXPECT_EQ(DeviceCount(), 0);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_NE(v->find("NCCL"), std::string::npos) << *v;
}

// CUDA-vs-CPU agreement; runs only where a GPU exists.
TEST(CudaDeviceTest, AxpyAgreesWithTheCpu) {
  LOOM_REQUIRE_GPU_OR_SKIP(DeviceCount() > 0, "no usable CUDA device");
  std::vector<float> x(1000), y(1000), want(1000);
  for (int i = 0; i < 1000; ++i) {
    x[i] = 0.5f * i;
    y[i] = 1.0f - i;
    want[i] = 2.0f * x[i] + y[i];
  }
  ASSERT_TRUE(Axpy(2.0f, x, &y).ok());
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(y[i], want[i]) << i;  // exact: one fma-free op
}

TEST(CudaDeviceTest, AxpyRejectsMismatchedSizes) {
  LOOM_REQUIRE_GPU_OR_SKIP(CompiledWithCuda(), "built without CUDA");
  std::vector<float> x(3), y(4);
  EXPECT_EQ(Axpy(1.0f, x, &y).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom::cuda
