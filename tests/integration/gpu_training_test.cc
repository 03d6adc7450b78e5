// Workers sharing one GPU train as the single process does: `loom up` with
// the encoder and two LLM data-parallel workers, three processes on the one
// device "cuda:0" (host collectives: NCCL wants a GPU per rank), the
// optimizer sharded over the LLM's two ranks (ZeRO-1: the device gradients
// reduce-scattered, the stepped weights all-gathered and pushed), against
// loom-train-local on the CPU, the same shards and seed, loss and gradient
// norm step by step (kCudaTrainingVsCpuF32), and the last step's
// checkpoint tensor by tensor. 20 steps on a GPU; on the CUDA
// emulation (bazel test --config=cuda_emu, ./loom test), where a step takes
// a minute, the first 2. Without CUDA it skips (fails under
// LOOM_REQUIRE_GPU=1).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/base/test_paths.h"
#include "runtime/checkpoint/steps.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

#ifdef LOOM_CUDA_EMU
constexpr int kGpuSteps = 2;  // ~1 minute a step there
#else
constexpr int kGpuSteps = kSteps;
#endif

bool HaveGpu() { return cuda::CompiledWithCuda() && cuda::DeviceCount() > 0; }

class GpuTrainingTest : public TrainingRuns {
 protected:
  // The single-process reference only where the test will run.
  static void SetUpTestSuite() {
    if (HaveGpu()) SetUpReference(kGpuSteps);
  }
};

TEST_F(GpuTrainingTest, WorkersSharingOneGpuTrainAsTheSingleProcess) {
  LOOM_REQUIRE_GPU_OR_SKIP(HaveGpu(), "no usable CUDA device");
  const std::string job = JobWith("loom", kGpuSteps, "encoder_dp: 1 llm_dp: 2") +
                          "device { encoder: 'cuda:0' llm: 'cuda:0' collectives: 'host' }\n"
                          "optimizer { shard: true }\n";
  ExpectSameSteps(Steps(LoomUp("shared-gpu", job, kGpuSteps), 1, kGpuSteps, "shared GPU"),
                  Local(1, kGpuSteps),
                  "encoder DP 1 + LLM DP 2 (sharded optimizer) on one GPU vs loom-train-local",
                  testing::kCudaTrainingVsCpuF32, testing::kCudaTrainingVsCpuF32);
  // The checkpoint of the last step: the encoder's optimizer state came
  // from its GPU (DP 1: the optimizer steps there), the LLM's from the
  // host (host collectives: it steps there), both as loom-train-local's.
  ExpectSameCheckpoints("tiny",
                        StepDir(testing::TempPath("shared-gpu") + "/checkpoints", kGpuSteps),
                        StepDir(local_checkpoints_, kGpuSteps), "shared GPU vs loom-train-local");
}

}  // namespace
}  // namespace loom
