// A lost process: `loom up` restarts every service from the run's newest
// complete checkpoint and the run ends as the uninterrupted one.
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "services/common/subprocess.h"
#include "services/scheduler/control_client.h"
#include "tests/integration/binaries.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

using RecoveryTest = TrainingRuns;

// A worker killed (SIGKILL) mid-run: loom up stops the other services,
// starts every one again from the run's newest complete checkpoint, and the
// run ends with the uninterrupted run's losses (the steps after the
// checkpoint trained again, on the same samples).
TEST_F(RecoveryTest, AKilledWorkerRestartsTheJobFromItsCheckpointExactly) {
  const std::string config = TempPath("killed.txtpb"), run = TempPath("killed");
  ASSERT_TRUE(WriteFileAtomically(config, Job("loom", 5)).ok());
  absl::StatusOr<std::unique_ptr<Subprocess>> up = Subprocess::Start(
      {Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""), "--run_dir=" + run,
       "--config=" + config, absl::StrCat("--steps=", kSteps), "--json"},
      TempPath("killed.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  // Past step 8 with checkpoint 5 complete, the job paused (so that it cannot
  // finish before the kill): then LLM worker rank 1 is killed.
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  std::string log;
  auto wait_for = [&](const std::string& text) {
    while (absl::Now() < deadline && (log = (*up)->ReadLog()).find(text) == std::string::npos) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    return log.find(text) != std::string::npos;
  };
  ASSERT_TRUE(wait_for("checkpoint 5 complete") && wait_for("\"step\":8,")) << log;
  absl::StatusOr<std::string> address = ReadFile(run + "/scheduler_address");
  ASSERT_TRUE(address.ok()) << address.status();
  ControlClient control(std::string(absl::StripAsciiWhitespace(*address)));
  ASSERT_TRUE(control.Pause("loom").ok());
  absl::StatusOr<control::v1::Job> job = control.Get("loom");
  while (absl::Now() < deadline && job.ok() && job->state() != control::v1::JOB_STATE_PAUSED) {
    absl::SleepFor(absl::Milliseconds(50));
    job = control.Get("loom");
  }
  ASSERT_TRUE(job.ok() && job->state() == control::v1::JOB_STATE_PAUSED) << job.status();
  int pid = 0;  // from the service table: "  loom-llm-worker  1  PID  ..."
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() > 3 && f[0] == "loom-llm-worker" && f[1] == "1" && absl::SimpleAtoi(f[2], &pid)) {
      break;
    }
  }
  ASSERT_GT(pid, 0) << log;
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  absl::StatusOr<int> status = (*up)->Wait(absl::Minutes(5));
  ASSERT_TRUE(status.ok()) << status.status();
  log = (*up)->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 0") << log;
  EXPECT_NE(log.find("loom-llm-worker rank 1 exited (signal 9"), std::string::npos) << log;
  EXPECT_NE(log.find("restart 1 of 3: resuming after checkpoint step 5"), std::string::npos) << log;
  // The steps trained twice (after the checkpoint, up to the kill) gave the
  // same losses both times.
  std::map<int, double> first;
  int again = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    double step = 0, loss = 0;
    if (!JsonNumberField(line, "step", &step) || !JsonNumberField(line, "loss", &loss)) continue;
    auto [it, fresh] = first.emplace(static_cast<int>(step), loss);
    if (!fresh) {
      ++again;
      EXPECT_EQ(it->second, loss) << "step " << step << " trained again";
    }
  }
  EXPECT_GE(again, 3) << "steps 6..8 were not trained again";
  ExpectSameLosses(Steps(StepLosses(log), 1, kSteps, "killed"), local_,
                   "LLM worker 1 killed after step 8, every service restarted from checkpoint 5, "
                   "vs loom-train-local");
}

}  // namespace
}  // namespace loom
