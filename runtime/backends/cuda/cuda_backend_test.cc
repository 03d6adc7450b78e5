#include "runtime/backends/cuda/cuda_backend.h"

#include <vector>

#include "gtest/gtest.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/tensor/tensor.h"

namespace loom {
namespace {

TEST(CudaBackendTest, RoundTripsATensorThroughTheDevice) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(b.ok(), b.status());
  Tensor t = Tensor::Zeros({3, 5}, DType::kF32, b->get());
  EXPECT_EQ(t.device().ToString(), "cuda:0");
  std::vector<float> host(15), back(15, -1.0f);
  for (int i = 0; i < 15; ++i) host[i] = 0.5f * i;
  (*b)->CopyToHost(back.data(), t.raw(), t.bytes());
  for (float x : back) EXPECT_EQ(x, 0.0f);
  (*b)->CopyFromHost(t.raw(), host.data(), t.bytes());
  (*b)->CopyToHost(back.data(), t.raw(), t.bytes());
  EXPECT_EQ(back, host);
}

TEST(CudaBackendTest, ReportsWhyItIsUnavailable) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(1000);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(b.status().code() == absl::StatusCode::kUnimplemented ||
              b.status().code() == absl::StatusCode::kFailedPrecondition)
      << b.status();
}

}  // namespace
}  // namespace loom
