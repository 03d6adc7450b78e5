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
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "runtime/base/file.h"
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

// Pipeline and encoder<->LLM tensors between GPUs over NCCL (issue 41 item
// 5): the encoder and the LLM each in two stages of two replicas (the
// bridge fans in and out), every worker on its own GPU (device "cuda": its
// local rank's), device.collectives nccl, against loom-train-local on the
// CPU step by step. Each worker's log says which tensors it sends and
// receives over NCCL (none goes through host memory between GPUs). Eight
// GPUs: on the emulation LOOM_CUDA_EMU_DEVICES=8 (BUILD).
TEST_F(GpuTrainingTest, PipelineAndModuleTensorsOverNcclTrainAsTheSingleProcess) {
  LOOM_REQUIRE_GPU_OR_SKIP(HaveGpu(), "no usable CUDA device");
  if (cuda::DeviceCount() < 8) GTEST_SKIP() << "needs 8 GPUs (" << cuda::DeviceCount() << ")";
  const std::string job =
      JobWith("loom", kGpuSteps, "encoder_dp: 2 encoder_pp: 2 llm_dp: 2 llm_pp: 2") +
      "device { encoder: 'cuda' llm: 'cuda' collectives: 'nccl' }\n";
  ExpectSameSteps(Steps(LoomUp("nccl-p2p", job, kGpuSteps), 1, kGpuSteps, "NCCL p2p"),
                  Local(1, kGpuSteps),
                  "encoder and LLM DP 2 x PP 2 over NCCL on eight GPUs vs loom-train-local",
                  testing::kCudaTrainingVsCpuF32, testing::kCudaTrainingVsCpuF32);
  // Ranks 0 and 1 of a module are its first stage, 2 and 3 its second.
  // A first stage sends activations and receives their gradients; the
  // encoder's last stage sends embeddings, the LLM's first receives them.
  const std::pair<std::string, std::string> encoder_first = {"activations", "activation grads"},
                                            encoder_last = {"embeddings, activation grads",
                                                            "embedding grads, activations"},
                                            llm_first = {"embedding grads, activations",
                                                         "embeddings, activation grads"},
                                            llm_last = {"activation grads", "activations"};
  const std::map<std::string, std::pair<std::string, std::string>> want = {
      {"encoder-worker-0", encoder_first}, {"encoder-worker-1", encoder_first},
      {"encoder-worker-2", encoder_last},  {"encoder-worker-3", encoder_last},
      {"llm-worker-0", llm_first},         {"llm-worker-1", llm_first},
      {"llm-worker-2", llm_last},          {"llm-worker-3", llm_last},
  };
  for (const auto& [worker, kinds] : want) {
    absl::StatusOr<std::string> log =
        ReadFile(absl::StrCat(testing::TempPath("nccl-p2p"), "/logs/loom-", worker, ".log"));
    ASSERT_TRUE(log.ok()) << log.status();
    for (const std::string& field : {absl::StrCat("\"sends\":\"", kinds.first, "\""),
                                     absl::StrCat("\"receives\":\"", kinds.second, "\"")}) {
      EXPECT_NE(log->find(field), std::string::npos) << worker << " logged no " << field;
    }
  }
}

}  // namespace
}  // namespace loom
