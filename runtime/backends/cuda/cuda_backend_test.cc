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

// The backend counts what its buffers asked for (in_use_bytes, peak_bytes:
// what the memory model predicts) apart from the blocks that hold them
// (rounded up on a GPU, and a freed larger block reused for a smaller one).
TEST(CudaBackendTest, CountsWhatBuffersAskForApartFromTheBlocksHeld) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
  LOOM_REQUIRE_GPU_OR_SKIP(b.ok(), b.status());
  Backend& be = **b;
  be.ResetPeak();
  const size_t base = be.in_use_bytes();
  void* big = be.Allocate(3000);
  void* small = be.Allocate(1000);
  EXPECT_EQ(be.in_use_bytes() - base, 4000u);
  be.Free(big);
  void* reuse = be.Allocate(2000);  // may take the freed 3000-byte block
  EXPECT_EQ(be.in_use_bytes() - base, 3000u);
  EXPECT_EQ(be.peak_bytes() - base, 4000u);
  const CudaMemoryStats s = GetCudaMemoryStats(&be);
  EXPECT_EQ(s.requested_bytes, be.in_use_bytes());
  EXPECT_GE(s.in_use_bytes, s.requested_bytes);  // the blocks hold at least that
  EXPECT_GE(s.peak_in_use_bytes, s.peak_requested_bytes);
  be.Free(small);
  be.Free(reuse);
  EXPECT_EQ(be.in_use_bytes(), base);
  be.ResetPeak();
  EXPECT_EQ(be.peak_bytes(), base);
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
