// Disaggregated training end to end: `loom up` (preprocess, scheduler, two
// encoder and two LLM worker processes) against loom-train-local on the same
// shards and seed, loss by loss over 20 steps, for the `sequential` and the
// `loom` assignment; a run stopped at 10 and resumed to 20 against the
// uninterrupted one; and a bad job config named.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/file.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

constexpr int kSteps = 20;

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

// Runs argv to completion; its stdout+stderr.
std::string RunToEnd(const std::vector<std::string>& argv, const std::string& log, int* exit_code) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, TempPath(log));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return "";
  absl::StatusOr<int> st = (*p)->Wait(absl::Minutes(5));
  EXPECT_TRUE(st.ok()) << st.status();
  *exit_code = st.ok() && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  return (*p)->ReadLog();
}

// The "loss" of every JSON line that has one, by its "step".
std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  size_t at = 0;
  while ((at = out.find("\"step\":", at)) != std::string::npos) {
    const size_t line_end = out.find('\n', at);
    const std::string line = out.substr(at, line_end - at);
    at = line_end;
    const size_t l = line.find("\"loss\":");
    if (l == std::string::npos) continue;
    double step = 0, loss = 0;
    const std::string step_text = line.substr(7, line.find(',') - 7);
    const std::string loss_text = line.substr(l + 7, line.find(',', l) - l - 7);
    if (!absl::SimpleAtod(step_text, &step) || !absl::SimpleAtod(loss_text, &loss)) continue;
    if (static_cast<size_t>(step) != losses.size() + 1)
      losses.resize(static_cast<size_t>(step) - 1);
    losses.push_back(loss);
  }
  return losses;
}

void ExpectSameLosses(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what) {
  const testing::Tolerance tol = testing::kDisaggregatedVsLocalLoss;
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), tol.atol + tol.rtol * std::abs(want[i]))
        << what << ", step " << i + 1 << ": " << got[i] << " vs " << want[i] << " (" << tol.reason
        << ")";
  }
}

class DistributedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = TempPath("data");
    int rc = 0;
    const std::string out = RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=onevision",
                                      "--samples=160", "--out=" + data_},
                                     "datagen.log", &rc);
    ASSERT_EQ(rc, 0) << out;
    local_ = Losses(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny",
                              absl::StrCat("--steps=", kSteps), "--seed=1", "--batch_size=16",
                              "--shards=" + data_ + "/*.tar"},
                             "local.log", &rc));
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(local_.size(), static_cast<size_t>(kSteps));
    // The model learns: this is no frozen-loss agreement.
    ASSERT_LT(local_.back(), local_.front() - 1.0);
  }

  // `loom up` with a job written to a file; its JSON lines' losses.
  static std::vector<double> LoomUp(const std::string& name, const std::string& job, int steps,
                                    bool resume, std::string* out = nullptr) {
    const std::string config = TempPath(name + ".txtpb");
    EXPECT_TRUE(WriteFileAtomically(config, job).ok());
    std::vector<std::string> argv = {Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                                     "--run_dir=" + TempPath(name),      "--config=" + config,
                                     absl::StrCat("--steps=", steps),    "--json"};
    if (resume) argv.push_back("--resume");
    int rc = 0;
    const std::string text = RunToEnd(argv, name + (resume ? "-resume" : "") + ".log", &rc);
    EXPECT_EQ(rc, 0) << text;
    if (out != nullptr) *out = text;
    return Losses(text);
  }

  static std::string Job(const std::string& algorithm, int checkpoint_every) {
    return absl::StrCat("algorithm: '", algorithm, "'\nseed: 1\nmodel: 'tiny'\n",
                        "data { shards: '", data_, "/*.tar' global_batch: 16 }\n",
                        "parallel { encoder_dp: 2 llm_dp: 2 microbatches: 2 }\n",
                        "checkpoint { every: ", checkpoint_every, " }\n");
  }

  static std::string data_;
  static std::vector<double> local_;
};

std::string DistributedTest::data_;
std::vector<double> DistributedTest::local_;

TEST_F(DistributedTest, SequentialAssignmentMatchesTheSingleProcessRun) {
  ExpectSameLosses(LoomUp("sequential", Job("sequential", 0), kSteps, false), local_,
                   "sequential vs loom-train-local");
}

TEST_F(DistributedTest, LoomAssignmentMatchesAndResumeContinuesExactly) {
  std::string out;
  const std::vector<double> full = LoomUp("loom", Job("loom", 10), kSteps, false, &out);
  ExpectSameLosses(full, local_, "loom vs loom-train-local");
  EXPECT_NE(out.find("checkpoint complete"), std::string::npos) << out;

  // Stop after 10 (checkpoint 10 complete), then resume to 20.
  const std::vector<double> first = LoomUp("resumed", Job("loom", 10), 10, false);
  ASSERT_EQ(first.size(), 10u);
  std::string resumed_out;
  std::vector<double> resumed = LoomUp("resumed", Job("loom", 10), kSteps, true, &resumed_out);
  EXPECT_NE(resumed_out.find("resuming after step 10"), std::string::npos) << resumed_out;
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps)) << "steps 11..20 expected";
  for (size_t i = 0; i < 10; ++i) resumed[i] = first[i];
  ExpectSameLosses(resumed, full, "10 + resumed 10 vs uninterrupted 20");
}

TEST_F(DistributedTest, BadJobConfigIsNamedAndNothingStarts) {
  std::string out;
  const std::string config = TempPath("bad.json");
  ASSERT_TRUE(
      WriteFileAtomically(config, R"({"parallel": {"llm_dp": 2, "encoder_ranks": 2}})").ok());
  int rc = 0;
  out = RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                  "--run_dir=" + TempPath("bad"), "--config=" + config},
                 "bad.log", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("encoder_ranks"), std::string::npos) << out;
  EXPECT_EQ(out.find("starting"), std::string::npos) << out;

  ASSERT_TRUE(
      WriteFileAtomically(config, R"({"parallel": {"llm_dp": 0, "microbatches": -1}})").ok());
  out = RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                  "--run_dir=" + TempPath("bad"), "--config=" + config},
                 "bad2.log", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("parallel.microbatches: must be >= 1, got -1"), std::string::npos) << out;
}

TEST_F(DistributedTest, ResumeWithoutACheckpointIsAnError) {
  int rc = 0;
  const std::string config = TempPath("none.txtpb");
  ASSERT_TRUE(WriteFileAtomically(config, Job("loom", 5)).ok());
  const std::string out =
      RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                "--run_dir=" + TempPath("none"), "--config=" + config, "--resume"},
               "none.log", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("--resume: no checkpoint folder"), std::string::npos) << out;
}

}  // namespace
}  // namespace loom
