#include "tests/integration/training_runs.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/checkpoint/checkpoint.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {

std::string Runfile(const std::string& path) { return testing::RunfilePath(path); }

std::string RunToEnd(const std::vector<std::string>& argv, const std::string& log, int* exit_code) {
  absl::StatusOr<std::unique_ptr<Subprocess>> p = Subprocess::Start(argv, TempPath(log));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return "";
  absl::StatusOr<int> st = (*p)->Wait(absl::Minutes(5));
  EXPECT_TRUE(st.ok()) << st.status();
  *exit_code = st.ok() && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  return (*p)->ReadLog();
}

std::map<int, double> StepLosses(const std::string& out) {
  std::map<int, double> losses;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    double step = 0, loss = 0;
    if (JsonNumberField(line, "step", &step) && JsonNumberField(line, "loss", &loss)) {
      losses[static_cast<int>(step)] = loss;
    }
  }
  return losses;
}

std::vector<double> Steps(const std::map<int, double>& losses, int first, int last,
                          const std::string& what) {
  std::vector<int> printed;
  for (const auto& [step, loss] : losses) printed.push_back(step);
  std::vector<int> want;
  for (int s = first; s <= last; ++s) want.push_back(s);
  EXPECT_EQ(printed, want) << what << ": the steps printed";
  std::vector<double> out;
  for (int s = first; s <= last; ++s) out.push_back(losses.count(s) ? losses.at(s) : NAN);
  return out;
}

void ExpectSameLosses(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what) {
  const testing::Tolerance tol = testing::kDisaggregatedVsLocalLoss;
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  std::printf("%s: largest relative loss difference %.2e over %zu steps\n", what.c_str(), worst,
              want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), tol.atol + tol.rtol * std::abs(want[i]))
        << what << ", step " << i + 1 << ": " << got[i] << " vs " << want[i] << " (" << tol.reason
        << ")";
  }
}

void ExpectOnlyTheProjectorTrained(MultimodalModel& start, const std::string& step) {
  for (Module m : {Module::kEncoder, Module::kProjector, Module::kLlm}) {
    const ParamSet& initial = *start.param_sets()[static_cast<int>(m)];
    ParamSet saved = initial.MasterLayout();
    const char* name = kModuleNames[static_cast<int>(m)];
    ASSERT_TRUE(LoadModuleCheckpoint(step, name, &saved).ok());
    if (m == Module::kProjector) {
      EXPECT_NE(saved.data(), initial.data()) << "the projector did not train";
      EXPECT_EQ(saved.step(), 10);
    } else {
      EXPECT_EQ(saved.data(), initial.data()) << name << " moved while frozen";
      EXPECT_EQ(saved.step(), 0);
    }
  }
}

std::string TrainingRuns::data_;
std::vector<double> TrainingRuns::local_;
int TrainingRuns::runs_ = 0;

void TrainingRuns::SetUpTestSuite() {
  data_ = TempPath("data");
  int rc = 0;
  const std::string out = RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=onevision",
                                    "--samples=160", "--out=" + data_},
                                   "datagen.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  local_ = Steps(StepLosses(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny",
                                      absl::StrCat("--steps=", kSteps), "--seed=1",
                                      "--batch_size=16", "--shards=" + data_ + "/*.tar"},
                                     "local.log", &rc)),
                 1, kSteps, "loom-train-local");
  ASSERT_EQ(rc, 0);
  // The model learns: this is no frozen-loss agreement.
  ASSERT_LT(local_.back(), local_.front() - 1.0);
}

std::map<int, double> TrainingRuns::LoomUp(const std::string& name, const std::string& job,
                                           int steps, const std::vector<std::string>& extra,
                                           std::string* out) {
  const std::string config = TempPath(name + ".txtpb");
  EXPECT_TRUE(WriteFileAtomically(config, job).ok());
  std::vector<std::string> argv = {Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                                   "--run_dir=" + TempPath(name),      "--config=" + config,
                                   absl::StrCat("--steps=", steps),    "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  int rc = 0;
  const std::string text = RunToEnd(argv, absl::StrCat(name, "-", ++runs_, ".log"), &rc);
  EXPECT_EQ(rc, 0) << text;
  if (out != nullptr) *out = text;
  return StepLosses(text);
}

std::string TrainingRuns::Job(const std::string& algorithm, int checkpoint_every, int encoder_dp,
                              int llm_dp) {
  return JobWith(algorithm, checkpoint_every,
                 absl::StrCat("encoder_dp: ", encoder_dp, " llm_dp: ", llm_dp));
}

std::string TrainingRuns::JobWith(const std::string& algorithm, int checkpoint_every,
                                  const std::string& parallel, const std::string& model) {
  const bool m = parallel.find("microbatches") != std::string::npos;
  return absl::StrCat("algorithm: '", algorithm, "'\nseed: 1\nmodel: '", model, "'\n",
                      "data { shards: '", data_, "/*.tar' global_batch: 16 }\n", "parallel { ",
                      parallel, m ? "" : " microbatches: 2", " }\n",
                      "checkpoint { every: ", checkpoint_every, " }\n");
}

}  // namespace loom
