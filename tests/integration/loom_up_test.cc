#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

std::string LoomUp() { return testing::RunfilePath("deploy/launcher/loom-up"); }

std::string BinDir() { return testing::RunfilePath(""); }

// The default job with a small generated dataset (first-run generation of
// the default 512 samples is for people, not for every test).
std::string SmallJob() {
  const std::string path = TempPath("small_job.txtpb");
  std::ofstream(path) << "data { samples: 64 }\n";
  return path;
}

// The text of the file at `path` ("" when there is none).
std::string FileText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int CountOf(const std::string& text, const std::string& word) {
  int n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

TEST(LoomUpTest, StartsEveryServiceHealthyAndStopsThemCleanly) {
  auto up = Subprocess::Start(
      {LoomUp(), "--bin_dir=" + BinDir(), "--run_dir=" + TempPath("run1"), "--config=" + SmallJob(),
       "--encoder_dp=2", "--llm_dp=2", "--exit_when_healthy"},
      TempPath("up1.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(90));
  ASSERT_TRUE(st.ok()) << st.status();
  const std::string out = (*up)->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << out;
  EXPECT_NE(out.find("all 6 services healthy"), std::string::npos) << out;
  EXPECT_EQ(CountOf(out, "SERVING"), 6) << out;
  EXPECT_EQ(CountOf(out, "exit 0"), 6) << out;
  EXPECT_NE(out.find("stopped cleanly"), std::string::npos) << out;
}

// Token caps (parallel.encoder_max_tokens, llm_max_tokens), end to end:
// loom-preprocess skips the samples over a cap, naming them, and training
// goes on; a cap the batches cannot fit in their microbatches ends the job
// FAILED at once, saying so, with no worker replaced.
TEST(LoomUpTest, TokenCapsSkipSamplesAndRefuseABatchThatCannotFit) {
  struct Case {
    const char* name;
    const char* parallel;
    bool succeeds;
  };
  for (const Case& c :
       {Case{"caps", "microbatches: 8 llm_max_tokens: 320 encoder_max_tokens: 1200", true},
        Case{"tight", "microbatches: 2 llm_max_tokens: 600", false}}) {
    const std::string job = TempPath(absl::StrCat(c.name, "_job.txtpb"));
    // The memory check passes the job with both caps (1 GiB a device: tiny
    // fits at them).
    std::ofstream(job) << "data { samples: 64 global_batch: 16 }\n"
                       << (c.succeeds ? "device { memory_gib: 1 }\n" : "")
                       << "parallel { encoder_dp: 2 llm_dp: 2 " << c.parallel << " }\n";
    const std::string run = TempPath(c.name);
    auto up = Subprocess::Start(
        {LoomUp(), "--bin_dir=" + BinDir(), "--run_dir=" + run, "--config=" + job, "--steps=2"},
        TempPath(absl::StrCat(c.name, ".log")));
    ASSERT_TRUE(up.ok()) << up.status();
    absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(300));
    ASSERT_TRUE(st.ok()) << st.status();
    const std::string out = (*up)->ReadLog();
    EXPECT_EQ(DescribeWaitStatus(*st), c.succeeds ? "exit 0" : "exit 1") << out;
    EXPECT_NE(out.find("stopped cleanly"), std::string::npos) << out;
    EXPECT_EQ(out.find("replacing"), std::string::npos) << "a worker was replaced\n" << out;
    if (c.succeeds) {
      EXPECT_NE(out.find("job loom SUCCEEDED"), std::string::npos) << out;
      const std::string log = FileText(run + "/logs/loom-preprocess.log");
      EXPECT_GT(CountOf(log, "\"reason\":\"over_token_cap\""), 0) << "no sample was over the cap";
      EXPECT_NE(log.find("LLM tokens, above parallel.llm_max_tokens 320"), std::string::npos);
      // Each worker logs the memory model's prediction and its measurement.
      for (const char* worker : {"loom-llm-worker-0", "loom-encoder-worker-1"}) {
        const std::string wlog = FileText(run + "/logs/" + worker + ".log");
        EXPECT_GE(CountOf(wlog, "\"msg\":\"memory\",\"src\""), 1) << worker;
        EXPECT_EQ(wlog.find("\"measured_bytes\":-1"), std::string::npos) << worker;
        EXPECT_EQ(wlog.find("\"predicted_bytes\":0,"), std::string::npos) << worker;
      }
    } else {
      EXPECT_NE(out.find("job loom FAILED (step 1 has no assignment: the batch's"),
                std::string::npos)
          << out;
      EXPECT_NE(out.find("microbatches of parallel.llm_max_tokens 600"), std::string::npos) << out;
    }
  }
}

// device.memory_gib: a job whose predicted peak does not fit is refused
// before any process starts, naming the module, the stage and the figures.
TEST(LoomUpTest, RefusesAJobThatDoesNotFitItsDevices) {
  const std::string job = TempPath("oom_job.txtpb");
  std::ofstream(job) << "data { samples: 64 }\ndevice { memory_gib: 0.001 }\n"
                        "parallel { llm_max_tokens: 512 encoder_max_tokens: 256 }\n";
  auto up = Subprocess::Start({LoomUp(), "--bin_dir=" + BinDir(), "--run_dir=" + TempPath("oom"),
                               "--config=" + job, "--steps=1"},
                              TempPath("oom.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(60));
  ASSERT_TRUE(st.ok()) << st.status();
  const std::string out = (*up)->ReadLog();
  EXPECT_NE(DescribeWaitStatus(*st), "exit 0") << out;
  EXPECT_NE(out.find("device.memory_gib: the "), std::string::npos) << out;
  EXPECT_NE(out.find("AdamW moments"), std::string::npos) << out;
  EXPECT_EQ(CountOf(out, "SERVING"), 0) << out;
}

// --profile auto: the job's modules are timed on its device before it
// starts (in a child loom-up, whose log says what it measured), the profile
// is written into the run folder, and loom-scheduler prices the job by it
// (fixed costs).
TEST(LoomUpTest, ProfilesTheJobFirstWhenAsked) {
  const std::string run = TempPath("profiled");
  auto up = Subprocess::Start({LoomUp(), "--bin_dir=" + BinDir(), "--run_dir=" + run,
                               "--config=" + SmallJob(), "--steps=2", "--profile=auto"},
                              TempPath("profiled.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(240));
  ASSERT_TRUE(st.ok()) << st.status();
  const std::string out = (*up)->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << out;
  EXPECT_NE(out.find("loom up: profile of tiny on cpu in fp32 at TP 1 written to "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("job loom SUCCEEDED"), std::string::npos) << out;
  const std::string profile = FileText(run + "/profile.json");
  EXPECT_NE(profile.find("\"points\""), std::string::npos) << profile;
  // The LLM's fitted cost: per token and per token² (a coefficient the
  // non-negative fit puts at 0, as on a loaded machine, is left out of the
  // JSON; both never are).
  EXPECT_TRUE(profile.find("\"llm_per_token\"") != std::string::npos ||
              profile.find("\"llm_per_token_sq\"") != std::string::npos)
      << profile;
  const std::string slog = FileText(run + "/logs/loom-scheduler.log");
  EXPECT_NE(slog.find("costs from the profile, fixed"), std::string::npos) << slog;
  EXPECT_NE(slog.find("profile.json"), std::string::npos) << slog;
  const std::string clog = FileText(run + "/logs/loom-up-profile.log");
  EXPECT_NE(clog.find("loom up: profiling tiny on cpu in fp32 at TP 1"), std::string::npos) << clog;
}

TEST(LoomUpTest, StopsEverythingOnSigterm) {
  auto up = Subprocess::Start({LoomUp(), "--bin_dir=" + BinDir(), "--run_dir=" + TempPath("run2"),
                               "--config=" + SmallJob(), "--encoder_dp=1", "--llm_dp=1"},
                              TempPath("up2.log"));
  ASSERT_TRUE(up.ok()) << up.status();
  absl::Time end = absl::Now() + absl::Seconds(60);
  while ((*up)->ReadLog().find("services healthy") == std::string::npos && absl::Now() < end &&
         (*up)->running()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_NE((*up)->ReadLog().find("all 4 services healthy"), std::string::npos) << (*up)->ReadLog();
  // Stop in the middle of training: an iteration has been reported.
  while ((*up)->ReadLog().find("iter ") == std::string::npos && absl::Now() < end &&
         (*up)->running()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_NE((*up)->ReadLog().find("loss "), std::string::npos) << (*up)->ReadLog();
  (*up)->Signal(SIGTERM);
  absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(60));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << (*up)->ReadLog();
  EXPECT_EQ(CountOf((*up)->ReadLog(), "exit 0"), 4) << (*up)->ReadLog();
}

TEST(LoomUpTest, ReportsAMissingBinaryAndExitsNonZero) {
  auto up = Subprocess::Start(
      {LoomUp(), "--bin_dir=" + TempPath("nowhere"), "--run_dir=" + TempPath("run3")},
      TempPath("up3.log"));
  ASSERT_TRUE(up.ok());
  absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(60));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 1") << (*up)->ReadLog();
  EXPECT_NE((*up)->ReadLog().find("cannot start"), std::string::npos) << (*up)->ReadLog();
  EXPECT_NE((*up)->ReadLog().find("nowhere/"), std::string::npos) << (*up)->ReadLog();
}

// Each wrong --hosts placement is refused before anything starts, naming
// the placement and what is wrong with it.
TEST(LoomUpTest, RefusesABadPlacementNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"llm_worker", "placement \"llm_worker\": no @NETNS/ADDRESS"},
      {"gpu_worker@x/10.0.0.2", "unknown role \"gpu_worker\""},
      {"llm_worker:one@x/10.0.0.2", "the rank is not a number >= 0"},
      {"llm_worker@/10.0.0.2", "no NETNS"},
      {"llm_worker@no-such-namespace-here/10.0.0.2",
       "no network namespace \"no-such-namespace-here\""},
  };
  for (const auto& [spec, error] : cases) {
    auto up = Subprocess::Start(
        {LoomUp(), "--bin_dir=" + BinDir(), "--run_dir=" + TempPath("run4"), "--hosts=" + spec},
        TempPath("up4.log"));
    ASSERT_TRUE(up.ok());
    absl::StatusOr<int> st = (*up)->Wait(absl::Seconds(60));
    ASSERT_TRUE(st.ok());
    const std::string out = (*up)->ReadLog();
    EXPECT_EQ(DescribeWaitStatus(*st), "exit 1") << out;
    EXPECT_NE(out.find("loom up: --hosts: "), std::string::npos) << out;
    EXPECT_NE(out.find(error), std::string::npos) << spec << ": " << out;
    EXPECT_EQ(out.find("starting"), std::string::npos) << out;
  }
}

}  // namespace
}  // namespace loom
