#include "tests/integration/training_runs.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

bool operator==(const StepResult& a, const StepResult& b) {
  return a.loss == b.loss && a.grad_norm == b.grad_norm;
}

std::ostream& operator<<(std::ostream& os, const StepResult& r) {
  return os << "{loss " << r.loss << ", grad_norm " << r.grad_norm << "}";
}

std::map<int, StepResult> StepResults(const std::string& out) {
  std::map<int, StepResult> results;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    double step = 0;
    StepResult r;
    if (!JsonNumberField(line, "step", &step) || !JsonNumberField(line, "loss", &r.loss)) continue;
    if (!JsonNumberField(line, "grad_norm", &r.grad_norm)) r.grad_norm = NAN;
    results[static_cast<int>(step)] = r;
  }
  return results;
}

std::vector<StepResult> Steps(const std::map<int, StepResult>& results, int first, int last,
                              const std::string& what) {
  std::vector<int> printed;
  for (const auto& [step, r] : results) printed.push_back(step);
  std::vector<int> want;
  for (int s = first; s <= last; ++s) want.push_back(s);
  EXPECT_EQ(printed, want) << what << ": the steps printed";
  std::vector<StepResult> out;
  for (int s = first; s <= last; ++s) {
    out.push_back(results.count(s) ? results.at(s) : StepResult{NAN, NAN});
  }
  return out;
}

namespace {

// Each step's `field` of `got` against `want`'s within `tol`; the largest
// relative difference.
double ExpectSameField(const std::vector<StepResult>& got, const std::vector<StepResult>& want,
                       double StepResult::*field, const char* name, const testing::Tolerance& tol,
                       const std::string& what) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i].*field, w = want[i].*field;
    worst = std::max(worst, std::abs(g - w) / std::abs(w));
    EXPECT_LE(std::abs(g - w), testing::Allowed(tol, w))
        << what << ", step " << i + 1 << ": " << name << " " << g << " vs " << w << " ("
        << tol.reason << ")";
  }
  return worst;
}

}  // namespace

void ExpectSameSteps(const std::vector<StepResult>& got, const std::vector<StepResult>& want,
                     const std::string& what) {
  ExpectSameSteps(got, want, what, testing::kDisaggregatedVsLocalLoss,
                  testing::kDisaggregatedVsLocalGradNorm);
}

void ExpectSameSteps(const std::vector<StepResult>& got, const std::vector<StepResult>& want,
                     const std::string& what, const testing::Tolerance& loss_tol,
                     const testing::Tolerance& norm_tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  const double loss = ExpectSameField(got, want, &StepResult::loss, "loss", loss_tol, what);
  const double norm =
      ExpectSameField(got, want, &StepResult::grad_norm, "grad_norm", norm_tol, what);
  std::printf("%s: largest relative difference over %zu steps: loss %.2e, grad_norm %.2e\n",
              what.c_str(), want.size(), loss, norm);
}

void ExpectSameCheckpoints(const std::string& config, const std::string& got_step,
                           const std::string& want_step, const std::string& what) {
  const testing::Tolerance tol = testing::kDisaggregatedVsLocalCheckpoint;
  absl::StatusOr<ModelConfig> c = ModelConfigByName(config);
  ASSERT_TRUE(c.ok()) << c.status();
  MultimodalModel model(*c);
  int64_t compared = 0;
  const std::vector<std::string> names = model.param_set_names();  // a generator's two too
  for (size_t k = 0; k < names.size(); ++k) {
    const std::string& name = names[k];
    ParamSet got = model.param_sets()[k]->MasterLayout();
    ParamSet want = model.param_sets()[k]->MasterLayout();
    absl::Status g = LoadModuleCheckpoint(got_step, name, &got);
    absl::Status w = LoadModuleCheckpoint(want_step, name, &want);
    ASSERT_TRUE(g.ok()) << what << ": " << g;
    ASSERT_TRUE(w.ok()) << what << ": " << w;
    EXPECT_EQ(got.step(), want.step()) << what << ": " << name << "'s optimizer step";
    // Each of the three arrays is compared tensor by tensor, relative to
    // that tensor's largest magnitude (AdamW's v is ~g², far below the
    // weights; m and v of a rarely used row are near 0).
    const struct {
      const char* kind;
      const std::vector<float>& got;
      const std::vector<float>& want;
    } arrays[] = {{"weights", got.data(), want.data()},
                  {"adam_m", got.adam_m(), want.adam_m()},
                  {"adam_v", got.adam_v(), want.adam_v()}};
    for (const auto& a : arrays) {
      double worst = 0;  // of a tensor's largest difference / its largest magnitude
      std::string worst_tensor;
      std::vector<std::string> over;  // the tensors past the tolerance
      for (const ParamSpec& spec : want.specs()) {
        double scale = 0, diff = 0;
        for (int64_t i = spec.offset; i < spec.offset + spec.numel; ++i) {
          scale = std::max(scale, std::abs(static_cast<double>(a.want[i])));
          diff = std::max(diff, std::abs(static_cast<double>(a.got[i]) - a.want[i]));
        }
        compared += spec.numel;
        if (diff > testing::Allowed(tol, scale)) over.push_back(spec.name);
        const double relative = scale > 0 ? diff / scale : diff;
        if (relative >= worst) {
          worst = relative;
          worst_tensor = spec.name;
        }
      }
      std::printf("%s: %s %s: largest difference %.2e of its tensor's largest magnitude (%s)\n",
                  what.c_str(), name.c_str(), a.kind, worst, worst_tensor.c_str());
      EXPECT_TRUE(over.empty()) << what << ": " << name << " " << a.kind << " of "
                                << absl::StrJoin(over, ", ") << " differ by more than " << tol.rtol
                                << " of their largest magnitude, " << worst_tensor << " by "
                                << worst << " (" << tol.reason << ")";
    }
  }
  std::printf("%s: %lld elements compared\n", what.c_str(), static_cast<long long>(compared));
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
std::vector<StepResult> TrainingRuns::local_;
std::string TrainingRuns::local_checkpoints_;
int TrainingRuns::runs_ = 0;

void TrainingRuns::SetUpReference(int steps) {
  data_ = TempPath("data");
  int rc = 0;
  const std::string out = RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=onevision",
                                    "--samples=160", "--out=" + data_},
                                   "datagen.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  local_checkpoints_ = TempPath("local-checkpoints");
  local_ = Steps(StepResults(RunToEnd(
                     {Runfile("runtime/train/loom-train-local"), "--config=tiny",
                      absl::StrCat("--steps=", steps), "--seed=1", "--batch_size=16",
                      "--shards=" + data_ + "/*.tar", "--checkpoint_dir=" + local_checkpoints_,
                      absl::StrCat("--checkpoint_every=", steps)},
                     "local.log", &rc)),
                 1, steps, "loom-train-local");
  ASSERT_EQ(rc, 0);
  // The model learns: this is no frozen-loss agreement.
  if (steps == kSteps) {
    ASSERT_LT(local_.back().loss, local_.front().loss - 1.0);
  }
}

std::map<int, StepResult> TrainingRuns::LoomUp(const std::string& name, const std::string& job,
                                               int steps, const std::vector<std::string>& extra,
                                               std::string* out) {
  const std::string config = TempPath(name + ".txtpb");
  EXPECT_TRUE(WriteFileAtomically(config, job).ok());
  std::vector<std::string> argv = {Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                                   "--run_dir=" + TempPath(name), "--config=" + config, "--json"};
  if (steps >= 0) argv.push_back(absl::StrCat("--steps=", steps));
  argv.insert(argv.end(), extra.begin(), extra.end());
  int rc = 0;
  const std::string text = RunToEnd(argv, absl::StrCat(name, "-", ++runs_, ".log"), &rc);
  EXPECT_EQ(rc, 0) << text;
  if (out != nullptr) *out = text;
  return StepResults(text);
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
