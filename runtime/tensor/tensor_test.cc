#include "runtime/tensor/tensor.h"

#include "gtest/gtest.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/backend.h"
#include "runtime/tensor/buffer.h"

namespace loom {
namespace {

TEST(TensorTest, EmptyHasShapeDtypeDeviceAndAlignedStorage) {
  Tensor t = Tensor::Empty({2, 3, 4}, DType::kF32, CpuBackend::Get());
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.bytes(), 96u);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(t.device().ToString(), "cpu");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % Backend::kAlignment, 0u);
  EXPECT_EQ(ShapeString(t.shape()), "(2, 3, 4)");
}

TEST(TensorTest, ZerosAreZeroAndCopiesShareStorage) {
  Tensor t = Tensor::Zeros({5}, DType::kI32, CpuBackend::Get());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.i32()[i], 0);
  Tensor u = t;
  u.i32()[2] = 7;
  EXPECT_EQ(t.i32()[2], 7);
}

TEST(TensorTest, ReshapeAndSliceViewTheSameMemory) {
  Tensor t = Tensor::Empty({4, 3}, DType::kF32, CpuBackend::Get());
  for (int i = 0; i < 12; ++i) t.f32()[i] = static_cast<float>(i);
  Tensor rows = t.Slice0(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.f32()[0], 3.0f);
  EXPECT_EQ(t.Reshape({12}).f32()[11], 11.0f);
}

TEST(TensorDeathTest, MisuseCrashesLoudly) {
  Tensor t = Tensor::Empty({4, 3}, DType::kF32, CpuBackend::Get());
  EXPECT_DEATH(t.Reshape({5, 2}), "cannot reshape \\(4, 3\\) to \\(5, 2\\)");
  EXPECT_DEATH(t.i32(), "i32\\(\\) on a f32 tensor");
  EXPECT_DEATH(t.Slice0(2, 5), "Slice0");
}

TEST(ArenaTest, ResetReusesTheSameMemory) {
  Arena arena(CpuBackend::Get(), /*block_bytes=*/1024);
  Tensor a = arena.Alloc({10}, DType::kF32);
  Tensor b = arena.Alloc({10}, DType::kF32);
  EXPECT_NE(a.raw(), b.raw());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) % Backend::kAlignment, 0u);
  const size_t reserved = arena.bytes_reserved();
  arena.Reset();
  EXPECT_EQ(arena.bytes_in_use(), 0u);
  Tensor c = arena.Alloc({10}, DType::kF32);
  EXPECT_EQ(c.raw(), a.raw());
  EXPECT_EQ(arena.bytes_reserved(), reserved);
}

TEST(ArenaTest, LargeRequestsGetTheirOwnBlockAndAreTracked) {
  Arena arena(CpuBackend::Get(), /*block_bytes=*/256);
  Tensor big = arena.AllocZeros({1000}, DType::kF32);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(big.f32()[i], 0.0f);
  Tensor small = arena.Alloc({4}, DType::kF32);
  EXPECT_GE(arena.bytes_reserved(), 4000u + 256u);
  EXPECT_GE(arena.high_water(), 4016u);
  arena.Reset();
  // After a reset the big block is found again for a big request.
  Tensor again = arena.Alloc({1000}, DType::kF32);
  EXPECT_EQ(again.raw(), big.raw());
  (void)small;
}

TEST(BufferTest, SizesCopiesAndMovesThroughItsBackend) {
  Buffer<float> a(CpuBackend::Get());
  EXPECT_TRUE(a.empty());
  a.Zeros(5);
  EXPECT_EQ(a.ToHost(), std::vector<float>(5, 0.0f));
  const std::vector<float> host = {1, 2, 3, 4, 5, 6, 7};
  a.CopyFromHost(host.data(), host.size());  // grows
  EXPECT_EQ(a.ToHost(), host);
  const float* before = a.data();
  a.resize(3);  // fits: the same memory, the first elements kept
  EXPECT_EQ(a.data(), before);
  EXPECT_EQ(a.ToHost(), std::vector<float>({1, 2, 3}));
  Buffer<float> b(CpuBackend::Get());
  b.CopyFrom(a);
  EXPECT_EQ(b.ToHost(), std::vector<float>({1, 2, 3}));
  EXPECT_NE(b.data(), a.data());
  Buffer<float> c(std::move(b));
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(c.ToHost(), std::vector<float>({1, 2, 3}));
  a.Zeros(2);
  c.swap(a);
  EXPECT_EQ(c.ToHost(), std::vector<float>({0, 0}));
  EXPECT_EQ(a.ToHost(), std::vector<float>({1, 2, 3}));
}

}  // namespace
}  // namespace loom
