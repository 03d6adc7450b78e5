// Two hosts and the network between them: loom-preprocess, loom-scheduler
// and the encoder workers on host A, the LLM workers on host B, each host a
// Linux network namespace and the two joined by one veth pair, UCX over TCP
// only (no shared memory between the hosts). The link is taken down in the
// middle of an iteration and brought back: the job recovers by itself (the
// LLM worker declared lost is replaced, the rest stay up) and ends with the
// uninterrupted run's losses.
//
// Needs root (ip netns add); fails, naming it, where that is refused.
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"
#include "tests/integration/netns.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

using MultiHostTest = TwoHostsTest;

TEST_F(MultiHostTest, ALinkDownMidIterationTheJobRecoversWithTheUninterruptedLosses) {
  const std::string config = TempPath("multihost.txtpb"), run = TempPath("multihost");
  ASSERT_TRUE(WriteFileAtomically(
                  config, Job("loom", /*checkpoint_every=*/3) + "recovery { lease_seconds: 3 }\n")
                  .ok());
  // loom up itself on host A, with the services it starts there.
  setenv("UCX_TLS", "tcp", 1);
  absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(
      {IpBinary(), "netns", "exec", host_a_, Runfile("deploy/launcher/loom-up"),
       "--bin_dir=" + Runfile(""), "--run_dir=" + run, "--config=" + config,
       absl::StrCat("--steps=", kSteps), "--json", absl::StrCat("--bind_host=", kAddressA),
       absl::StrCat("--hosts=llm_worker@", host_b_, "/", kAddressB)},
      TempPath("multihost.log"));
  unsetenv("UCX_TLS");
  ASSERT_TRUE(started.ok()) << started.status();
  Subprocess& up = **started;
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  std::string log;
  auto wait_for = [&](const std::string& text) {
    while (absl::Now() < deadline) {
      log = up.ReadLog();
      if (absl::StrContains(log, text)) return true;
      if (!up.running()) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    log = up.ReadLog();
    return absl::StrContains(log, text);
  };
  // The services are where they were put.
  ASSERT_TRUE(wait_for("services healthy")) << log;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "  loom-llm-worker ")) {
      EXPECT_TRUE(absl::StrContains(line, absl::StrCat(" ", kAddressB, ":"))) << line;
    } else if (absl::StrContains(line, "  loom-")) {
      EXPECT_TRUE(absl::StrContains(line, absl::StrCat(" ", kAddressA, ":"))) << line;
    }
  }
  // Down right after step 7 ends, so in iteration 8 (checkpoint 6 is the
  // newest complete one); up again once the loss is declared.
  ASSERT_TRUE(wait_for("checkpoint 6 complete") && wait_for("\"step\":7,")) << log;
  ASSERT_TRUE(Ip({"-n", host_b_, "link", "set", link_b_, "down"}).ok());
  const bool declared = wait_for("loom up: job loom RECOVERING: ");
  ASSERT_TRUE(Ip({"-n", host_b_, "link", "set", link_b_, "up"}).ok());
  ASSERT_TRUE(declared) << log;

  absl::StatusOr<int> status = up.Wait(deadline - absl::Now());
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << up.ReadLog();
  log = up.ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*status), "exit 0") << log;
  // Host A saw host B's LLM workers go silent (the lease), not a crash.
  const size_t loss = log.find("loom up: job loom RECOVERING: ");
  const std::string line = log.substr(loss, log.find('\n', loss) - loss);
  EXPECT_TRUE(absl::StrContains(line, "RECOVERING: llm_worker rank ")) << line;
  EXPECT_TRUE(absl::StrContains(line, "no SERVING health answer")) << line;
  // The lost LLM worker is replaced on host B; everything else stays up.
  EXPECT_TRUE(
      absl::StrContains(log, "restart 1 of 3: replacing llm_worker rank ") &&
      absl::StrContains(log, "the other services stay up; resuming after checkpoint step 6"))
      << log;
  ExpectSameSteps(Steps(StepResults(log), 1, kSteps, "multihost"), local_,
                  "two hosts, link down and up in iteration 8, vs loom-train-local");
}

}  // namespace
}  // namespace loom
