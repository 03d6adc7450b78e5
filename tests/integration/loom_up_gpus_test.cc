// `loom up` on a machine with several GPUs spreads its workers over them:
// each worker opens the GPU of its local rank (device "cuda"). Built with
// --config=cuda_emu, the emulation fakes the GPUs (LOOM_CUDA_EMU_DEVICES=4,
// set in BUILD); on a GPU machine it needs four. Without CUDA it skips.
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/backends/cuda/device.h"
#include "runtime/backends/cuda/gpu_testing.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

// The "device" of a worker log's "opened its device" record.
std::string OpenedDevice(const std::string& log_path) {
  std::ifstream in(log_path);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"msg\":\"opened its device\"") == std::string::npos) continue;
    const size_t at = line.find("\"device\":\"");
    if (at == std::string::npos) return "";
    const size_t start = at + 10;
    return line.substr(start, line.find('"', start) - start);
  }
  return "";
}

TEST(LoomUpGpusTest, WorkersOnOneMachineOpenDistinctGpus) {
  LOOM_REQUIRE_GPU_OR_SKIP(cuda::CompiledWithCuda() && cuda::DeviceCount() > 0,
                           "no usable CUDA device");
  if (cuda::DeviceCount() < 4) GTEST_SKIP() << "needs 4 GPUs (" << cuda::DeviceCount() << ")";
  const std::string job = TempPath("gpus_job.txtpb");
  std::ofstream(job) << "data { samples: 32 global_batch: 4 }\n"
                        "device { encoder: \"cuda\" llm: \"cuda\" collectives: \"host\" }\n";
  const std::string run_dir = TempPath("gpus_run");
  auto up = Subprocess::Start(
      {testing::RunfilePath("deploy/launcher/loom-up"), "--bin_dir=" + testing::RunfilePath(""),
       "--run_dir=" + run_dir, "--config=" + job, "--encoder_dp=2", "--llm_dp=2", "--steps=1"},
      TempPath("gpus_up.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(600));
  ASSERT_TRUE(st.ok()) << st.status();
  const std::string out = (*up)->ReadLog();
  ASSERT_NE(out.find("job loom SUCCEEDED"), std::string::npos) << out;
  // Every service exits 0 after the job (services/common/thread_stack.cc:
  // the workers' /metrics threads had too little stack in a CUDA build).
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << out;
  EXPECT_NE(out.find("loom up: stopped cleanly"), std::string::npos) << out;
  std::set<std::string> devices;
  for (const char* module : {"encoder", "llm"}) {
    for (int rank = 0; rank < 2; ++rank) {
      const std::string log =
          absl::StrCat(run_dir, "/logs/loom-", module, "-worker-", rank, ".log");
      const std::string device = OpenedDevice(log);
      EXPECT_NE(device, "") << log << " has no \"opened its device\" record";
      devices.insert(device);
    }
  }
  EXPECT_EQ(devices, (std::set<std::string>{"cuda:0", "cuda:1", "cuda:2", "cuda:3"}));
}

}  // namespace
}  // namespace loom
