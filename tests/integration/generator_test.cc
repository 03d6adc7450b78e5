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

std::vector<GenStep> GenSteps(const std::string& out, const std::string& what) {
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
  for (int s = 1; s <= kGenSteps; ++s) {
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
    local_ = Local("", "gen-local.log");
    local_generator_only_ = Local("vision,projector,llm", "gen-local-generator-only.log");
    local_frozen_generator_ = Local("generator", "gen-local-frozen-generator.log");
  }

  static std::vector<GenStep> Local(const std::string& freeze, const std::string& log) {
    int rc = 0;
    const std::string out =
        RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny-gen",
                  absl::StrCat("--steps=", kGenSteps), "--seed=1", "--batch_size=16",
                  "--shards=" + data_ + "/*.tar", "--freeze=" + freeze},
                 log, &rc);
    EXPECT_EQ(rc, 0) << out;
    return GenSteps(out, "loom-train-local --freeze=" + freeze);
  }

  // `loom up` of tiny-gen with `parallel` (and `extra` job text), with
  // `flags` and LOOM_FAULTS `faults` (services/worker/fault_injection.h).
  static std::vector<GenStep> Up(const std::string& name, const std::string& parallel,
                                 const std::string& extra = "", const std::string& faults = "",
                                 const std::vector<std::string>& flags = {}) {
    const std::string config = TempPath(name + ".txtpb");
    EXPECT_TRUE(WriteFileAtomically(
                    config, absl::StrCat("algorithm: 'loom'\nseed: 1\nmodel: 'tiny-gen'\n",
                                         "data { shards: '", data_, "/*.tar' global_batch: 16 }\n",
                                         "parallel { ", parallel, " }\n", extra))
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
    return GenSteps(out, name);
  }

  // Every step's LM loss, generation loss and norm within the disaggregated
  // tolerances of the reference's, and the same output images.
  static void ExpectSame(const std::vector<GenStep>& got, const std::vector<GenStep>& want,
                         const std::string& what) {
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
        ASSERT_TRUE(std::isfinite(x.w)) << what << ", step " << i + 1 << ": reference " << x.name;
        EXPECT_LE(std::abs(x.g - x.w), testing::Allowed(x.tol, x.w))
            << what << ", step " << i + 1 << ": " << x.name << " " << x.g << " vs " << x.w << " ("
            << x.tol.reason << ")";
        worst[f] = std::max(worst[f], std::abs(x.g - x.w) / std::abs(x.w));
      }
      EXPECT_EQ(got[i].output_images, want[i].output_images) << what << ", step " << i + 1;
      EXPECT_GT(want[i].output_images, 0) << "step " << i + 1 << " drew no picture";
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

TEST_F(GeneratorTest, AFrozenGeneratorMatches) {
  ExpectSame(Up("gen-frozen", "encoder_dp: 1 llm_dp: 2 microbatches: 2 generator_dp: 2",
                "freeze { generator: true }\n"),
             local_frozen_generator_, "frozen generator vs loom-train-local");
}

}  // namespace
}  // namespace loom
