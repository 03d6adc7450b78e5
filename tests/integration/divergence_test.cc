// A diverging batch: the job's loss or gradient norm is not finite. Every
// rank skips that optimizer step alike, the step is counted, and past
// train.max_skipped_steps the job ends FAILED "loss diverged at step N" - never
// as a lost process, never replayed into the same NaN until max_restarts.
// The NaN is real: LOOM_FAULTS' nan action turns one LLM rank's gradients NaN
// at one iteration (services/worker/fault_injection.h), every time it runs.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/test_paths.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

class DivergenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = testing::TempPath("data");
    int rc = 0;
    const std::string out = RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=onevision",
                                      "--samples=96", "--out=" + data_},
                                     "datagen.log", &rc);
    ASSERT_EQ(rc, 0) << out;
  }

  // `loom up` for 6 steps with iteration 2's gradients NaN on LLM rank 1;
  // its output, exit code in `rc`.
  static std::string Run(const std::string& name, int max_skipped_steps, int* rc) {
    const std::string config = testing::TempPath(name + ".txtpb"), run = testing::TempPath(name);
    EXPECT_TRUE(WriteFileAtomically(
                    config, absl::StrCat("seed: 1\nmodel: 'tiny'\n", "data { shards: '", data_,
                                         "/*.tar' global_batch: 16 }\n",
                                         "parallel { encoder_dp: 2 llm_dp: 2 microbatches: 2 }\n",
                                         "train { max_skipped_steps: ", max_skipped_steps, " }\n"))
                    .ok());
    EXPECT_TRUE(MakeDirectories(run + "/faults").ok());
    setenv("LOOM_FAULTS", "llm_worker:1:allreduce:2:nan", 1);
    setenv("LOOM_FAULTS_FIRED", (run + "/faults").c_str(), 1);
    const std::string out =
        RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                  "--run_dir=" + run, "--config=" + config, "--steps=6", "--json"},
                 name + ".log", rc);
    unsetenv("LOOM_FAULTS");
    unsetenv("LOOM_FAULTS_FIRED");
    return out;
  }

  static std::string data_;
};

std::string DivergenceTest::data_;

// The JSON line of `step`, or "".
std::string StepLine(const std::string& out, int step) {
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    double s = 0;
    if (absl::StartsWith(line, "{") && JsonNumberField(line, "step", &s) &&
        static_cast<int>(s) == step) {
      return std::string(line);
    }
  }
  return "";
}

TEST_F(DivergenceTest, ANonFiniteStepIsSkippedAndTheJobGoesOn) {
  int rc = 0;
  const std::string out = Run("skip-one", /*max_skipped_steps=*/1, &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::string skipped = StepLine(out, 3);
  EXPECT_TRUE(absl::StrContains(skipped, "\"skipped\":true")) << skipped;
  EXPECT_TRUE(absl::StrContains(skipped, "\"grad_norm\":null")) << skipped;
  for (int step : {1, 2, 4, 5, 6}) {
    const std::string line = StepLine(out, step);
    double loss = 0, norm = 0;
    EXPECT_TRUE(JsonNumberField(line, "loss", &loss) && JsonNumberField(line, "grad_norm", &norm))
        << "step " << step << ": the steps after the skipped one train on finite weights: " << line;
    EXPECT_FALSE(absl::StrContains(line, "skipped")) << line;
  }
  EXPECT_FALSE(absl::StrContains(out, " lost during ")) << out;
}

TEST_F(DivergenceTest, PastTheLimitTheJobFailsAsDivergedNotAsALostProcess) {
  int rc = 0;
  const std::string out = Run("diverged", /*max_skipped_steps=*/0, &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "loss diverged at step 3")) << out;
  EXPECT_FALSE(absl::StrContains(out, " lost during ")) << out;
  EXPECT_EQ(StepLine(out, 5), "") << "the job ended at the divergence";
}

}  // namespace
}  // namespace loom
