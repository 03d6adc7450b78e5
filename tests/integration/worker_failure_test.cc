// A worker that fails on its own error fails visibly and at once: here
// loom-preprocess runs with another model config (vit300m-llm1b, 336 px
// tiles) than the job's workers (tiny, 32 px tiles). The workers must refuse
// the samples, naming the mismatch, and exit 1 within seconds, not train on
// them (reading past their buffers) nor linger on their peers' deadlines.
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

std::unique_ptr<Subprocess> StartService(const std::vector<std::string>& argv,
                                         const std::string& log, ServingPorts* ports) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, TempPath(log));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  absl::StatusOr<ServingPorts> serving = WaitForServing(**p, absl::Seconds(60));
  EXPECT_TRUE(serving.ok()) << serving.status() << "\n" << (*p)->ReadLog();
  if (serving.ok()) *ports = *serving;
  return std::move(*p);
}

TEST(WorkerFailureTest, WorkersRefuseSamplesOfAnotherModelAndExitOne) {
  const std::string data = TempPath("data");
  auto gen = Subprocess::Start({testing::RunfilePath("runtime/data/loom-datagen"),
                                "--preset=onevision", "--samples=24", "--out=" + data},
                               TempPath("datagen.log"));
  ASSERT_TRUE(gen.ok());
  ASSERT_EQ(DescribeWaitStatus(*(*gen)->Wait(absl::Minutes(2))), "exit 0") << (*gen)->ReadLog();

  const std::vector<std::string> base_flags = {"--host=127.0.0.1", "--grpc_port=0",
                                               "--metrics_port=0", "--shutdown_deadline=2s"};
  auto with = [&](std::vector<std::string> argv) {
    argv.insert(argv.end(), base_flags.begin(), base_flags.end());
    const std::string& binary = argv.front();
    const common::v1::Role role =
        absl::StrContains(binary, "loom-scheduler")    ? common::v1::ROLE_SCHEDULER
        : absl::StrContains(binary, "loom-preprocess") ? common::v1::ROLE_PREPROCESS
                                                       : common::v1::ROLE_LLM_WORKER;
    for (const std::string& flag : SecurityFlags(role)) argv.push_back(flag);
    return argv;
  };
  ServingPorts pre_ports, sched_ports, ignored;
  std::unique_ptr<Subprocess> pre = StartService(
      with({testing::RunfilePath("services/preprocess/loom-preprocess"),
            "--shards=" + data + "/*.tar", "--config=vit300m-llm1b", "--global_batch=8"}),
      "preprocess.log", &pre_ports);
  ASSERT_NE(pre, nullptr);
  const std::string job = TempPath("job.txtpb");
  ASSERT_TRUE(WriteFileAtomically(
                  job, absl::StrCat("name: 'mismatch'\nmodel: 'tiny'\n", "data { shards: '", data,
                                    "/*.tar' global_batch: 8 }\n",
                                    "parallel { encoder_dp: 1 llm_dp: 1 microbatches: 1 }\n",
                                    "train { steps: 3 }\n"))
                  .ok());
  std::unique_ptr<Subprocess> sched =
      StartService(with({testing::RunfilePath("services/scheduler/loom-scheduler"), "--job=" + job,
                         absl::StrCat("--preprocess=127.0.0.1:", pre_ports.grpc_port),
                         "--run_dir=" + TempPath("run")}),
                   "scheduler.log", &sched_ports);
  ASSERT_NE(sched, nullptr);
  const std::string scheduler = absl::StrCat("--scheduler=127.0.0.1:", sched_ports.grpc_port);
  std::unique_ptr<Subprocess> encoder =
      StartService(with({testing::RunfilePath("services/encoder_worker/loom-encoder-worker"),
                         scheduler, "--rank=0", "--advertise_host=127.0.0.1"}),
                   "encoder.log", &ignored);
  std::unique_ptr<Subprocess> llm =
      StartService(with({testing::RunfilePath("services/llm_worker/loom-llm-worker"), scheduler,
                         "--rank=0", "--advertise_host=127.0.0.1"}),
                   "llm.log", &ignored);
  ASSERT_NE(encoder, nullptr);
  ASSERT_NE(llm, nullptr);

  // Both refuse their first image samples (tiles of 336 px where their model
  // takes 32 px) and exit 1 by themselves.
  for (Subprocess* w : {encoder.get(), llm.get()}) {
    absl::StatusOr<int> st = w->Wait(absl::Seconds(60));
    ASSERT_TRUE(st.ok()) << "a failed worker lingers: " << st.status() << "\n" << w->ReadLog();
    EXPECT_EQ(DescribeWaitStatus(*st), "exit 1") << w->ReadLog();
    EXPECT_NE(w->ReadLog().find("does not fit model tiny"), std::string::npos) << w->ReadLog();
  }
  EXPECT_NE(encoder->ReadLog().find("tiles of 336 px; the model takes 32 px tiles"),
            std::string::npos)
      << encoder->ReadLog();
  for (Subprocess* s : {sched.get(), pre.get()}) {
    ::kill(s->pid(), SIGTERM);
    (void)s->Wait(absl::Seconds(30));
  }
}

}  // namespace
}  // namespace loom
