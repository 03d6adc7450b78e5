// loom-train-local's --device: a bad value, and a GPU that is not there,
// are refused naming the flag; cpu trains, and cuda trains as cpu does, in
// fp32 and in bf16 (on a GPU, or on the CUDA emulation: bazel test
// --config=cuda_emu).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/train/train_local_testing.h"

namespace loom {
namespace {

using testing::PrintedStep;
using testing::PrintedSteps;
using testing::TrainLocal;

TEST(TrainLocalDeviceTest, BadOrMissingDevicesAreRefusedByName) {
  int rc = 0;
  std::string out = TrainLocal("--device gpu --steps 0", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--device gpu: want cpu, cuda or cuda:N"), std::string::npos) << out;
  out = TrainLocal("--device cuda:x --steps 0", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("got \"cuda:x\""), std::string::npos) << out;
  out = TrainLocal("--device cuda:999 --steps 0", &rc);  // no such GPU, or no CUDA at all
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--device cuda:999: "), std::string::npos) << out;
}

TEST(TrainLocalDeviceTest, CpuTrains) {
  int rc = 0;
  const std::string out = TrainLocal("--device cpu --steps 2 --batch_size 4", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"step\":2"), std::string::npos) << out;
}

// The same job on the GPU (CudaOps, device memory, the optimizer there) and
// on the CPU: step by step the same losses and gradient norms, over 20 steps
// on a GPU and 4 on the CUDA emulation (seconds a step).
#ifdef LOOM_CUDA_EMU
constexpr int kCudaSteps = 4;
#else
constexpr int kCudaSteps = 20;
#endif

class TrainLocalPrecisionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainLocalPrecisionTest, CudaTrainsAsTheCpuDoes) {
  LOOM_REQUIRE_GPU_OR_SKIP(cuda::DeviceCount() > 0, "no usable CUDA device");
  const std::string job = " --steps " + std::to_string(kCudaSteps) +
                          " --batch_size 4 --seed 11 --precision " + GetParam();
  int rc = 0;
  const std::string cpu_out = TrainLocal("--device cpu" + job, &rc);
  ASSERT_EQ(rc, 0) << cpu_out;
  const std::string gpu_out = TrainLocal("--device cuda" + job, &rc);
  ASSERT_EQ(rc, 0) << gpu_out;
  const std::vector<PrintedStep> cpu = PrintedSteps(cpu_out), gpu = PrintedSteps(gpu_out);
  ASSERT_EQ(cpu.size(), static_cast<size_t>(kCudaSteps)) << cpu_out;
  ASSERT_EQ(gpu.size(), static_cast<size_t>(kCudaSteps)) << gpu_out;
  const testing::Tolerance& tol =
      GetParam() == "bf16" ? testing::kCudaTrainingVsCpuBf16 : testing::kCudaTrainingVsCpuF32;
  double worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(gpu[i].loss, cpu[i].loss, tol.atol + tol.rtol * std::abs(cpu[i].loss)) << i + 1;
    EXPECT_NEAR(gpu[i].grad_norm, cpu[i].grad_norm, tol.atol + tol.rtol * cpu[i].grad_norm)
        << i + 1;
    worst_loss = std::max(worst_loss, std::abs(gpu[i].loss - cpu[i].loss) / cpu[i].loss);
    worst_norm =
        std::max(worst_norm, std::abs(gpu[i].grad_norm - cpu[i].grad_norm) / cpu[i].grad_norm);
  }
  std::printf("%s: largest relative difference over %d steps: loss %.2e, grad_norm %.2e\n",
              GetParam().c_str(), kCudaSteps, worst_loss, worst_norm);
}

// The optimizer's state lives on the GPU (weights, AdamW moments): a
// checkpoint brings it to the host (PullState) and a resume takes it back
// (PushState), so a run stopped at step 2 and resumed continues as the
// uninterrupted run did, to the printed digits.
TEST(TrainLocalDeviceTest, ACudaCheckpointResumesAsTheUninterruptedRun) {
  LOOM_REQUIRE_GPU_OR_SKIP(cuda::DeviceCount() > 0, "no usable CUDA device");
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/cuda-resume";
  const std::string job = " --device cuda --batch_size 4 --seed 11";
  int rc = 0;
  const std::string whole = TrainLocal(job + " --steps 4", &rc);
  ASSERT_EQ(rc, 0) << whole;
  std::string out =
      TrainLocal(job + " --steps 2 --checkpoint_every 2 --checkpoint_dir " + dir, &rc);
  ASSERT_EQ(rc, 0) << out;
  out = TrainLocal(job + " --steps 4 --resume --checkpoint_dir " + dir, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::vector<PrintedStep> want = PrintedSteps(whole), got = PrintedSteps(out);
  ASSERT_EQ(want.size(), 4u) << whole;
  ASSERT_EQ(got.size(), 2u) << out;  // steps 3 and 4
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].step, want[i + 2].step);
    EXPECT_EQ(got[i].loss, want[i + 2].loss) << "step " << got[i].step;
    EXPECT_EQ(got[i].grad_norm, want[i + 2].grad_norm) << "step " << got[i].step;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, TrainLocalPrecisionTest, ::testing::Values("fp32", "bf16"));

}  // namespace
}  // namespace loom
