// The third module end to end: `loom up` with loom-generator-worker ranks
// trains tiny-gen on the generation preset (text → image mixed with
// understanding samples) and equals loom-train-local step by step in the LM
// loss, the generation loss and the gradient norm of all modules: generator
// DP 2, generator TP 2 (DP 1) under LLM TP 2 × DP 2, generator DP 3 beside LLM
// PP 2, only the generator training (encoder and LLM frozen: no query
// gradient goes back), and a frozen generator under a training LLM; a
// generator worker killed in a forward and another before it sends the
// query gradients back: the job recovers and ends with the same losses.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/plan.h"
#include "tests/integration/binaries.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

constexpr int kGenSteps = 8;

// One step of either program: the LM loss, the generation loss and the norm.
struct GenStep {
  double loss = NAN, generation_loss = NAN, grad_norm = NAN;
  int64_t output_images = 0;
};

// Steps `first`..kGenSteps of a run's output.
std::vector<GenStep> GenSteps(const std::string& out, const std::string& what, int first = 1) {
  std::map<int, GenStep> by_step;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    double step = 0, images = 0;
    GenStep r;
    if (!JsonNumberField(line, "step", &step) || !JsonNumberField(line, "loss", &r.loss)) continue;
    JsonNumberField(line, "generation_loss", &r.generation_loss);
    JsonNumberField(line, "grad_norm", &r.grad_norm);
    if (JsonNumberField(line, "output_images", &images)) r.output_images = std::llround(images);
    by_step[static_cast<int>(step)] = r;
  }
  std::vector<GenStep> steps;
  for (int s = first; s <= kGenSteps; ++s) {
    EXPECT_EQ(by_step.count(s), 1u) << what << ": no step " << s << " in\n" << out;
    steps.push_back(by_step.count(s) ? by_step[s] : GenStep{});
  }
  return steps;
}

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = TempPath("gen-data");
    int rc = 0;
    const std::string out = RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=generation",
                                      "--samples=96", "--out=" + data_},
                                     "gen-datagen.log", &rc);
    ASSERT_EQ(rc, 0) << out;
    local_ = Local("", "gen-local.log",
                   {"--checkpoint_dir=" + TempPath("gen-local-ckpt"),
                    absl::StrCat("--checkpoint_every=", kGenSteps)});
    local_generator_only_ = Local("vision,projector,llm", "gen-local-generator-only.log");
    local_frozen_generator_ = Local("generator", "gen-local-frozen-generator.log");
  }

  static std::vector<GenStep> Local(const std::string& freeze, const std::string& log,
                                    const std::vector<std::string>& flags = {}) {
    int rc = 0;
    std::vector<std::string> argv = {Runfile("runtime/train/loom-train-local"),
                                     "--config=tiny-gen",
                                     absl::StrCat("--steps=", kGenSteps),
                                     "--seed=1",
                                     "--batch_size=16",
                                     "--shards=" + data_ + "/*.tar",
                                     "--freeze=" + freeze};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const std::string out = RunToEnd(argv, log, &rc);
    EXPECT_EQ(rc, 0) << out;
    return GenSteps(out, "loom-train-local --freeze=" + freeze);
  }

  // `loom up` of tiny-gen with `parallel` (and `extra` job text, `data`
  // fields), with `flags` and LOOM_FAULTS `faults`
  // (services/worker/fault_injection.h).
  static std::vector<GenStep> Up(const std::string& name, const std::string& parallel,
                                 const std::string& extra = "", const std::string& faults = "",
                                 const std::vector<std::string>& flags = {}, int first = 1,
                                 const std::string& data = "") {
    const std::string config = TempPath(name + ".txtpb");
    EXPECT_TRUE(WriteFileAtomically(
                    config, absl::StrCat("algorithm: 'loom'\nseed: 1\nmodel: 'tiny-gen'\n",
                                         "data { shards: '", data_, "/*.tar' global_batch: 16 ",
                                         data, " }\n", "parallel { ", parallel, " }\n", extra))
                    .ok());
    std::vector<std::string> argv = {Runfile("deploy/launcher/loom-up"),
                                     "--bin_dir=" + Runfile(""),
                                     "--run_dir=" + TempPath(name),
                                     "--config=" + config,
                                     "--json",
                                     absl::StrCat("--steps=", kGenSteps)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (!faults.empty()) {
      EXPECT_TRUE(MakeDirectories(TempPath(name + "-faults")).ok());
      setenv("LOOM_FAULTS", faults.c_str(), 1);
      setenv("LOOM_FAULTS_FIRED", TempPath(name + "-faults").c_str(), 1);
    }
    int rc = 0;
    const std::string out = RunToEnd(argv, name + ".log", &rc);
    unsetenv("LOOM_FAULTS");
    unsetenv("LOOM_FAULTS_FIRED");
    EXPECT_EQ(rc, 0) << out;
    return GenSteps(out, name, first);
  }

  // Every step's LM loss, generation loss and norm within the disaggregated
  // tolerances of the reference's, and the same output images.
  static void ExpectSame(const std::vector<GenStep>& got, const std::vector<GenStep>& want,
                         const std::string& what, int first = 1) {
    ASSERT_EQ(got.size(), want.size());
    double worst[3] = {0, 0, 0};
    for (size_t i = 0; i < want.size(); ++i) {
      const struct {
        const char* name;
        double g, w;
        const testing::Tolerance& tol;
      } fields[] = {
          {"loss", got[i].loss, want[i].loss, testing::kDisaggregatedVsLocalLoss},
          {"generation_loss", got[i].generation_loss, want[i].generation_loss,
           testing::kDisaggregatedVsLocalLoss},
          {"grad_norm", got[i].grad_norm, want[i].grad_norm,
           testing::kDisaggregatedVsLocalGradNorm},
      };
      for (int f = 0; f < 3; ++f) {
        const auto& x = fields[f];
        ASSERT_TRUE(std::isfinite(x.w))
            << what << ", step " << i + first << ": reference " << x.name;
        EXPECT_LE(std::abs(x.g - x.w), testing::Allowed(x.tol, x.w))
            << what << ", step " << i + first << ": " << x.name << " " << x.g << " vs " << x.w
            << " (" << x.tol.reason << ")";
        worst[f] = std::max(worst[f], std::abs(x.g - x.w) / std::abs(x.w));
      }
      EXPECT_EQ(got[i].output_images, want[i].output_images) << what << ", step " << i + first;
      EXPECT_GT(want[i].output_images, 0) << "step " << i + first << " drew no picture";
    }
    std::printf(
        "%s: largest relative difference over %zu steps: loss %.2e, generation_loss %.2e, "
        "grad_norm %.2e\n",
        what.c_str(), want.size(), worst[0], worst[1], worst[2]);
  }

  static std::string data_;
  static std::vector<GenStep> local_, local_generator_only_, local_frozen_generator_;
};

std::string GeneratorTest::data_;
std::vector<GenStep> GeneratorTest::local_, GeneratorTest::local_generator_only_,
    GeneratorTest::local_frozen_generator_;

TEST_F(GeneratorTest, TheReferenceLearnsToDraw) {
  ASSERT_EQ(local_.size(), static_cast<size_t>(kGenSteps));
  // Not a frozen-loss agreement: both losses move.
  EXPECT_LT(local_.back().generation_loss, local_.front().generation_loss);
  EXPECT_LT(local_.back().loss, local_.front().loss);
  // The freezes change what trains: the same batches, other losses.
  EXPECT_NE(local_frozen_generator_.back().generation_loss, local_.back().generation_loss);
  EXPECT_NE(local_generator_only_.back().loss, local_.back().loss);
}

TEST_F(GeneratorTest, GeneratorDataParallelMatchesTheSingleProcessRun) {
  ExpectSame(Up("gen-dp2", "encoder_dp: 2 llm_dp: 2 microbatches: 2 generator_dp: 2"), local_,
             "generator DP 2 vs loom-train-local");
}

// Every tensor of the step-8 checkpoint (the generator's two sets with the
// rest, written by its two pipeline stages) equals loom-train-local's, and
// its step 4 resumed under another generator layout (PP 2 x DP 2 -> TP 2)
// trains steps 5-8 as the reference does.
TEST_F(GeneratorTest, CheckpointsMatchAndResumeUnderAnotherLayout) {
  const std::string layout =
      "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_dp: 2 generator_pp: 2";
  ExpectSame(Up("gen-ckpt", layout, "checkpoint { every: 4 }\n"), local_,
             "generator PP 2 x DP 2, checkpointing, vs loom-train-local");
  ExpectSameCheckpoints("tiny-gen", StepDir(TempPath("gen-ckpt") + "/checkpoints", kGenSteps),
                        StepDir(TempPath("gen-local-ckpt"), kGenSteps),
                        "generator PP 2 x DP 2 vs loom-train-local, step 8");
  // The generator ranks' timings refit its cost per output image: the
  // scheduler's costs kept with the checkpoint moved off the plan's prior
  // (an H100's analytic time: this CPU takes far longer).
  absl::StatusOr<std::string> costs = ReadFile(
      StepDir(TempPath("gen-ckpt") + "/checkpoints", kGenSteps) + "/scheduler_costs.binpb");
  ASSERT_TRUE(costs.ok()) << costs.status();
  scheduler::v1::CostCoefficients refit;
  ASSERT_TRUE(refit.ParseFromString(*costs));
  absl::StatusOr<ModelConfig> model = ModelConfigByName("tiny-gen");
  ASSERT_TRUE(model.ok());
  const double prior =
      sched::CoefficientsOnOneGpu(*model, sched::ClusterSpec()).generator_per_image();
  EXPECT_GT(prior, 0);
  EXPECT_GT(refit.generator_per_image(), 10 * prior) << "no generator timing refit its cost";
  const std::vector<GenStep> resumed =
      Up("gen-ckpt", "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_tp: 2",
         "checkpoint { every: 4 }\n", "", {"--resume_step=4"}, /*first=*/5);
  ExpectSame(resumed, std::vector<GenStep>(local_.begin() + 4, local_.end()),
             "step 4 resumed as generator TP 2 vs loom-train-local", /*first=*/5);
}

TEST_F(GeneratorTest, GeneratorTensorParallelMatchesTheSingleProcessRun) {
  // Its one replica takes the bins of both LLM replicas (fan-in and out),
  // each of those a TP 2 group (every rank holds the query states).
  ExpectSame(Up("gen-tp2", "encoder_dp: 1 llm_dp: 2 llm_tp: 2 microbatches: 2 generator_tp: 2"),
             local_, "generator TP 2 (DP 1) under LLM TP 2 x DP 2 vs loom-train-local");
}

TEST_F(GeneratorTest, LlmPipelineWithThreeGeneratorReplicasMatches) {
  ExpectSame(Up("gen-pp", "encoder_dp: 1 llm_dp: 2 llm_pp: 2 microbatches: 2 generator_dp: 3"),
             local_, "LLM PP 2 + generator DP 3 vs loom-train-local");
}

// The layout: LLM PP 2 beside generator PP 2 (each bin's rows down
// the generator's stages and back before the gradient reaches the LLM),
// two generator replicas of them.
TEST_F(GeneratorTest, LlmPipelineBesideAGeneratorPipelineMatches) {
  ExpectSame(
      Up("gen-pp2",
         "encoder_dp: 1 llm_dp: 2 llm_pp: 2 microbatches: 2 generator_dp: 2 generator_pp: 2"),
      local_, "LLM PP 2 + generator PP 2 x DP 2 vs loom-train-local");
}

TEST_F(GeneratorTest, OnlyTheGeneratorTrainingMatches) {
  ExpectSame(Up("gen-only", "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_dp: 2",
                "freeze { vision: true projector: true llm: true }\n"),
             local_generator_only_, "frozen encoder and LLM vs loom-train-local");
}

TEST_F(GeneratorTest, KilledGeneratorWorkersRecoverWithTheSameLosses) {
  const std::vector<GenStep> got =
      Up("gen-faults", "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_dp: 2",
         "checkpoint { every: 2 }\nrecovery { lease_seconds: 3 }\n",
         "generator_worker:1:forward:3,generator_worker:0:transfer:6", {"--max_restarts=4"});
  // Both faults fired (each leaves its mark), and the run still matches.
  for (const char* entry : {"generator_worker:1:forward:3", "generator_worker:0:transfer:6"}) {
    EXPECT_TRUE(std::filesystem::exists(TempPath("gen-faults-faults") + "/" + entry)) << entry;
  }
  ExpectSame(got, local_, "generator workers killed and replaced vs loom-train-local");
}

// A held-out set every 4 steps: its LM loss and its generation loss (drawn
// at step 0, the same draws each time) equal loom-train-local's.
TEST_F(GeneratorTest, ValidationLossesMatch) {
  int rc = 0;
  const std::string held_out = TempPath("gen-held-out");
  RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=generation", "--samples=32", "--seed=9",
            "--out=" + held_out},
           "gen-datagen-held-out.log", &rc);
  ASSERT_EQ(rc, 0);
  // step -> (validation loss, validation generation loss).
  auto validation = [](const std::string& out) {
    std::map<int, std::pair<double, double>> by_step;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      double step = 0, loss = 0, gen = 0;
      if (JsonNumberField(line, "step", &step) && JsonNumberField(line, "validation_loss", &loss) &&
          JsonNumberField(line, "validation_generation_loss", &gen)) {
        by_step[static_cast<int>(step)] = {loss, gen};
      }
    }
    return by_step;
  };
  const std::string flags[] = {"--validation_shards=" + held_out + "/*.tar",
                               "--validation_samples=32", "--validation_every=4"};
  std::vector<std::string> argv = {Runfile("runtime/train/loom-train-local"),
                                   "--config=tiny-gen",
                                   absl::StrCat("--steps=", kGenSteps),
                                   "--seed=1",
                                   "--batch_size=16",
                                   "--shards=" + data_ + "/*.tar"};
  argv.insert(argv.end(), std::begin(flags), std::end(flags));
  const std::string local_out = RunToEnd(argv, "gen-local-validation.log", &rc);
  ASSERT_EQ(rc, 0) << local_out;
  const auto want = validation(local_out);
  ASSERT_EQ(want.size(), 2u) << local_out;
  const std::string out_name = "gen-validation";
  ExpectSame(Up(out_name, "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_dp: 2", "", "", {}, 1,
                absl::StrCat("validation { shards: '", held_out, "/*.tar' every: 4 samples: 32 }")),
             local_, "generator DP 2 with validation vs loom-train-local without");
  absl::StatusOr<std::string> got_out = ReadFile(TempPath(out_name + ".log"));
  ASSERT_TRUE(got_out.ok());
  const auto got = validation(*got_out);
  ASSERT_EQ(got.size(), 2u) << *got_out;
  for (const auto& [step, w] : want) {
    ASSERT_EQ(got.count(step), 1u) << step;
    const auto& g = got.at(step);
    const testing::Tolerance& tol = testing::kDisaggregatedVsLocalValidationLoss;
    EXPECT_LE(std::abs(g.first - w.first), testing::Allowed(tol, w.first)) << "step " << step;
    EXPECT_LE(std::abs(g.second - w.second), testing::Allowed(tol, w.second)) << "step " << step;
    std::printf("step %d: validation loss %.6f vs %.6f, generation %.6f vs %.6f\n", step, g.first,
                w.first, g.second, w.second);
  }
}

TEST_F(GeneratorTest, AFrozenGeneratorMatches) {
  ExpectSame(Up("gen-frozen", "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_dp: 2",
                "freeze { generator: true }\n"),
             local_frozen_generator_, "frozen generator vs loom-train-local");
}

}  // namespace
}  // namespace loom
