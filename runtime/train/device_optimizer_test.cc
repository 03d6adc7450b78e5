// The optimizer on the device (issue 42 item 4): a parameter set placed on a
// GPU with its optimizer there steps its weights and AdamW moments with the
// CUDA kernels (clipping, AdamW, Σ g² for the norm) as the host does, whole
// or as one rank's shard (ZeRO-1), in fp32 and with the bf16 copy narrowed
// on the device; the host copies stay as they were until PullState. On a
// GPU or the CUDA emulation (bazel test --config=cuda_emu); skips without.
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/matmul/bf16.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"
#include "runtime/backends/cuda/cuda_ops.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/model/model.h"
#include "runtime/train/trainer.h"

namespace loom {
namespace {

// (DP rank, DP ranks, precision)
class DeviceOptimizerTest : public ::testing::TestWithParam<std::tuple<int, int, Precision>> {};

TEST_P(DeviceOptimizerTest, StepsAsTheHostDoes) {
  LOOM_REQUIRE_GPU_OR_SKIP(cuda::DeviceCount() > 0, "no usable CUDA device");
  absl::StatusOr<std::unique_ptr<Ops>> gpu = MakeCudaOps(0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Ops* ops = gpu->get();
  const auto [rank, ranks, precision] = GetParam();
  MultimodalModel model(*ModelConfigByName("tiny"));
  model.Initialize(7);
  ParamSet host = *model.param_sets()[static_cast<int>(Module::kLlm)];
  host.ShardOptimizer(rank, ranks);
  ParamSet device = host;
  device.Place(ops->backend(), precision, /*optimizer_on_device=*/true);
  ASSERT_TRUE(device.optimizer_on_device());
  const std::vector<float> before = device.data();
  TrainOptions o;
  o.adam.weight_decay = 0.1f;
  o.clip_norm = 0.5;  // the gradients below have a larger norm: clipped
  const int64_t ob = host.optimizer_begin(), oe = host.optimizer_end();
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g(host.size());
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = 0.01f * static_cast<float>((i * 31 + step * 7) % 17) - 0.08f;
    }
    host.grads() = g;
    ops->backend()->CopyFromHost(device.placed_grads(), g.data(), g.size() * sizeof(float));
    const double want = host.OwnedGradSumOfSquares(CpuOps(), ob, oe);
    const double got = device.OwnedGradSumOfSquares(ops, ob, oe);
    const testing::Tolerance tol = testing::kCudaVsCpuF32;
    EXPECT_NEAR(got, want, tol.atol + tol.rtol * want) << "step " << step << ": " << tol.reason;
    // The same norm on both sides, as the job's sum would give every rank.
    OptimizerStep({&host}, {Module::kLlm}, o, step, std::sqrt(want));
    OptimizerStep({&device}, {Module::kLlm}, o, step, std::sqrt(want), ops);
    host.WeightsStepped(CpuOps());
    device.WeightsStepped(ops);
  }
  EXPECT_EQ(device.data(), before) << "the host copy moved before PullState";
  device.PullState();
  // The shard's weights and moments (the rest of the weights is the
  // all-gather's to fill, on both sides).
  EXPECT_TRUE(AllClose(device.data().data() + ob, host.data().data() + ob,
                       static_cast<size_t>(oe - ob), testing::kCudaVsCpuF32));
  EXPECT_TRUE(AllClose(device.adam_m().data(), host.adam_m().data(), host.adam_m().size(),
                       testing::kCudaVsCpuF32));
  EXPECT_TRUE(AllClose(device.adam_v().data(), host.adam_v().data(), host.adam_v().size(),
                       testing::kCudaVsCpuF32));
  EXPECT_EQ(device.step(), 3);
  EXPECT_NE(std::vector<float>(device.data().begin() + ob, device.data().begin() + oe),
            std::vector<float>(before.begin() + ob, before.begin() + oe));
  if (precision == Precision::kBf16) {
    // The GEMMs' bf16 copy, narrowed on the device from the stepped weights.
    const int64_t n = device.size();
    std::vector<uint16_t> got(n), want(n);
    ops->backend()->CopyToHost(got.data(), device.weight(0).bf16, n * sizeof(uint16_t));
    kernels::F32ToBf16(want.data(), device.data().data(), n);
    EXPECT_EQ(got, want);
  }
}

INSTANTIATE_TEST_SUITE_P(WholeAndSharded, DeviceOptimizerTest,
                         ::testing::Values(std::make_tuple(0, 1, Precision::kFp32),
                                           std::make_tuple(1, 3, Precision::kFp32),
                                           std::make_tuple(0, 1, Precision::kBf16)));

}  // namespace
}  // namespace loom
