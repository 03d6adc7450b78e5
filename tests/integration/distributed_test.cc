// Disaggregated training end to end: `loom up` (preprocess, scheduler, two
// encoder and two LLM worker processes) against loom-train-local on the same
// shards and seed, loss by loss over 20 steps, for the `sequential` and the
// `loom` assignment; encoder DP != LLM DP (fan-in, fan-out); tensor and
// pipeline parallelism in both modules, mixed layouts, and checkpoints
// moving between layouts; a
// run stopped at 10 and resumed to 20, with the same and with other degrees,
// against the uninterrupted one; a fresh run in a reused folder never
// resuming the older run's steps; frozen modules (LLaVA's stages) in
// pipeline and tensor-parallel layouts; Hugging Face directories trained
// and exported; a killed worker recovered from by restarting the job from
// its checkpoint; and a bad job config named.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/trace.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/data/tokenizer.h"
#include "runtime/hf/hf_llava.h"
#include "runtime/hf/pretrained.h"
#include "runtime/hf/safetensors.h"
#include "runtime/model/model.h"
#include "runtime/train/train_checkpoint.h"
#include "services/common/subprocess.h"
#include "services/scheduler/control_client.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

constexpr int kSteps = 20;

std::string Runfile(const std::string& path) { return testing::RunfilePath(path); }

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

// Steps first..last of `losses`, which must hold exactly those steps.
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

class DistributedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
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
    local_deep_ =
        Steps(StepLosses(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny-deep",
                                   absl::StrCat("--steps=", kSteps), "--seed=1", "--batch_size=16",
                                   "--shards=" + data_ + "/*.tar"},
                                  "local-deep.log", &rc)),
              1, kSteps, "loom-train-local tiny-deep");
    ASSERT_EQ(rc, 0);
  }

  // `loom up` in run folder `name` with a job written to a file and `extra`
  // flags; its JSON lines' losses by step.
  static std::map<int, double> LoomUp(const std::string& name, const std::string& job, int steps,
                                      const std::vector<std::string>& extra = {},
                                      std::string* out = nullptr) {
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

  static std::string Job(const std::string& algorithm, int checkpoint_every, int encoder_dp = 2,
                         int llm_dp = 2) {
    return JobWith(algorithm, checkpoint_every,
                   absl::StrCat("encoder_dp: ", encoder_dp, " llm_dp: ", llm_dp));
  }
  // `parallel`: the ParallelConfig's fields (microbatches 2 unless given).
  static std::string JobWith(const std::string& algorithm, int checkpoint_every,
                             const std::string& parallel, const std::string& model = "tiny") {
    const bool m = parallel.find("microbatches") != std::string::npos;
    return absl::StrCat("algorithm: '", algorithm, "'\nseed: 1\nmodel: '", model, "'\n",
                        "data { shards: '", data_, "/*.tar' global_batch: 16 }\n", "parallel { ",
                        parallel, m ? "" : " microbatches: 2", " }\n",
                        "checkpoint { every: ", checkpoint_every, " }\n");
  }

  static std::vector<double> Local(int first, int last) {
    return std::vector<double>(local_.begin() + first - 1, local_.begin() + last);
  }

  static std::string data_;
  static std::vector<double> local_, local_deep_;  // models tiny and tiny-deep
  static int runs_;
};

std::string DistributedTest::data_;
std::vector<double> DistributedTest::local_;
std::vector<double> DistributedTest::local_deep_;
int DistributedTest::runs_ = 0;

// `loom up --trace`: a track per worker, and per iteration each worker ran
// its forwards and backwards in exactly the order the simulator predicts for
// its (module, replica, stage); a stage that is not the last recomputes.
void ExpectTraceMatchesTheSimulator(const std::string& path, int encoder_workers, int llm_workers) {
  absl::StatusOr<std::string> json = ReadFile(path);
  ASSERT_TRUE(json.ok()) << json.status();
  trace::v1::TraceFile file;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &file).ok());
  // Track names: "LLM rank 3 (tp 0, stage 1, dp 1)", "LLM dp 1 stage 1 (predicted)".
  std::map<std::pair<int, int>, std::string> track_key;  // (pid, tid) -> "LLM dp 1 stage 1"
  int workers[2] = {0, 0};
  for (const trace::v1::TraceEvent& e : file.trace_events()) {
    if (e.ph() != "M" || e.name() != "thread_name") continue;
    const std::string name = e.args().at("name");
    const bool llm = absl::StartsWith(name, "LLM");
    int rank = 0, tp = 0, stage = 0, dp = 0;
    if (e.pid() == trace::kMeasuredPid &&
        std::sscanf(name.c_str() + (llm ? 3 : 7), " rank %d (tp %d, stage %d, dp %d)", &rank, &tp,
                    &stage, &dp) == 4) {
      ++workers[llm];
      track_key[{e.pid(), e.tid()}] =
          absl::StrCat(llm ? "LLM" : "encoder", " dp ", dp, " stage ", stage, " tp ", tp);
    } else if (e.pid() == trace::kPredictedPid) {
      track_key[{e.pid(), e.tid()}] = name.substr(0, name.find(" (predicted)"));
    }
  }
  EXPECT_EQ(workers[0], encoder_workers);
  EXPECT_EQ(workers[1], llm_workers);
  // (key, iteration) -> "F mb 0 bin 3, B mb 0 bin 3, ..." (recompute aside).
  std::map<std::pair<std::string, std::string>, std::string> measured, predicted;
  int recomputes = 0;
  for (const trace::v1::TraceEvent& e : file.trace_events()) {
    if (e.ph() != "X") continue;
    if (e.cat() == "recompute") ++recomputes;
    if (e.cat() != "forward" && e.cat() != "backward") continue;
    auto key = track_key.find({e.pid(), e.tid()});
    ASSERT_NE(key, track_key.end()) << "an unnamed track: " << e.name();
    std::string name = e.name();
    name = name.substr(0, name.find(" (with recompute)"));
    (e.pid() == trace::kMeasuredPid ? measured
                                    : predicted)[{key->second, e.args().at("iteration")}] +=
        name + ", ";
  }
  EXPECT_GT(recomputes, 0);
  EXPECT_GE(measured.size(), static_cast<size_t>((encoder_workers + llm_workers) * kSteps));
  for (const auto& [key, order] : measured) {
    const std::string stage = key.first.substr(0, key.first.find(" tp "));
    auto p = predicted.find({stage, key.second});
    ASSERT_NE(p, predicted.end()) << key.first << " iteration " << key.second << ": no prediction";
    EXPECT_EQ(order, p->second) << key.first << " iteration " << key.second;
  }
}

// LLaVA's stage 1 after 10 steps (checkpoint `step`): the vision tower and
// the LLM exactly as they started (`start`), the projector trained.
void ExpectOnlyTheProjectorTrained(MultimodalModel& start, const std::string& step) {
  for (Module m : {Module::kEncoder, Module::kProjector, Module::kLlm}) {
    const ParamSet& initial = *start.param_sets()[static_cast<int>(m)];
    ParamSet saved = initial.MasterLayout();
    const char* name = kModuleNames[static_cast<int>(m)];
    ASSERT_TRUE(LoadModuleCheckpoint(absl::StrCat(step, "/", name, ".ckpt"), name, &saved).ok());
    if (m == Module::kProjector) {
      EXPECT_NE(saved.data(), initial.data()) << "the projector did not train";
      EXPECT_EQ(saved.step(), 10);
    } else {
      EXPECT_EQ(saved.data(), initial.data()) << name << " moved while frozen";
      EXPECT_EQ(saved.step(), 0);
    }
  }
}

TEST_F(DistributedTest, SequentialAssignmentMatchesTheSingleProcessRun) {
  ExpectSameLosses(Steps(LoomUp("sequential", Job("sequential", 0), kSteps), 1, kSteps, "seq"),
                   local_, "sequential vs loom-train-local");
}

// Encoder DP != LLM DP: the bins of one microbatch slot fan in from fewer
// encoder ranks (1 -> 3 LLM ranks) and fan out to fewer LLM ranks (3 -> 2).
TEST_F(DistributedTest, FanInAndFanOutMatchTheSingleProcessRun) {
  ExpectSameLosses(Steps(LoomUp("fan-out", Job("loom", 0, 1, 3), 8), 1, 8, "1+3"), Local(1, 8),
                   "encoder DP 1, LLM DP 3 vs loom-train-local");
  ExpectSameLosses(Steps(LoomUp("fan-in", Job("loom", 0, 3, 2), 8), 1, 8, "3+2"), Local(1, 8),
                   "encoder DP 3, LLM DP 2 vs loom-train-local");
}

// Tensor parallelism in both modules with different DP on the two sides:
// encoder TP2 x DP1 (2 workers) feeding LLM TP2 x DP2 (4 workers), each bin's
// embeddings going to the whole TP group of its LLM replica. Then the
// layout-independent checkpoint: its step 10 resumed with no TP at all
// (DP 2 + 1), and the step 10 of a DP-only run resumed under TP4 x DP1 in
// both modules, each equal to the single-process run.
TEST_F(DistributedTest, TensorParallelMatchesAndCheckpointsMoveAcrossLayouts) {
  const std::string tp = "encoder_tp: 2 encoder_dp: 1 llm_tp: 2 llm_dp: 2";
  ExpectSameLosses(Steps(LoomUp("tp", JobWith("loom", 10, tp), kSteps), 1, kSteps, "tp"), local_,
                   "encoder TP2 x DP1, LLM TP2 x DP2 vs loom-train-local");
  const std::vector<double> untp = Steps(
      LoomUp("tp", JobWith("loom", 10, "encoder_dp: 2 llm_dp: 1"), kSteps, {"--resume_step=10"}),
      11, kSteps, "TP checkpoint resumed without TP");
  ExpectSameLosses(untp, Local(11, kSteps), "TP2 checkpoint resumed as DP 2 + 1");

  Steps(LoomUp("dp", Job("loom", 10, 2, 2), 10), 1, 10, "DP-only first 10");
  const std::vector<double> tp4 =
      Steps(LoomUp("dp", JobWith("loom", 10, "encoder_tp: 4 encoder_dp: 1 llm_tp: 4 llm_dp: 1"),
                   kSteps, {"--resume_step=10"}),
            11, kSteps, "DP checkpoint resumed under TP4");
  ExpectSameLosses(tp4, Local(11, kSteps), "DP 2 + 2 checkpoint resumed as TP4 + TP4");
}

// The LLM in two pipeline stages (1F1B over the combined pipeline, stage
// activations over UCX) with 4 microbatches and with 1 (fewer microbatches
// than stages), then the encoder in two stages too; then the PP run's
// step-10 checkpoint resumed without pipeline stages. Each equals the
// single-process run at every step.
TEST_F(DistributedTest, PipelineStagesMatchTheSingleProcessRun) {
  ExpectSameLosses(
      Steps(LoomUp("pp2", JobWith("loom", 10, "encoder_dp: 1 llm_dp: 1 llm_pp: 2 microbatches: 4"),
                   kSteps),
            1, kSteps, "pp2"),
      local_, "LLM PP2, 4 microbatches vs loom-train-local");
  ExpectSameLosses(
      Steps(LoomUp("pp2-m1",
                   JobWith("loom", 0, "encoder_dp: 1 llm_dp: 1 llm_pp: 2 microbatches: 1"), kSteps),
            1, kSteps, "pp2 m1"),
      local_, "LLM PP2, 1 microbatch vs loom-train-local");
  ExpectSameLosses(
      Steps(LoomUp("pp2-pp2", JobWith("loom", 0, "encoder_pp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1"),
                   kSteps),
            1, kSteps, "encoder pp2 + llm pp2"),
      local_, "encoder PP2 + LLM PP2 vs loom-train-local");
  ExpectSameLosses(Steps(LoomUp("pp2", Job("loom", 10, 2, 2), kSteps, {"--resume_step=10"}), 11,
                         kSteps, "PP checkpoint resumed without PP"),
                   Local(11, kSteps), "LLM PP2 checkpoint resumed as DP 2 + 2");
}

// Three LLM stages of a 6-layer LLM (tiny-deep); and a mixed layout with
// different DP on the two sides, encoder TP2 x DP1 feeding LLM PP2 x DP2,
// with one sample per microbatch (8 per replica), so text-only microbatches
// (a fifth of the onevision samples) pass through both LLM stages while the
// encoder skips them.
TEST_F(DistributedTest, DeeperAndMixedLayoutsMatchTheSingleProcessRun) {
  ExpectSameLosses(
      Steps(LoomUp("pp3", JobWith("loom", 0, "encoder_dp: 1 llm_dp: 1 llm_pp: 3", "tiny-deep"),
                   kSteps),
            1, kSteps, "pp3"),
      local_deep_, "tiny-deep LLM PP3 vs loom-train-local");
  const std::string trace = TempPath("mixed-trace.json");
  ExpectSameLosses(
      Steps(LoomUp("mixed",
                   JobWith("loom", 0,
                           "encoder_tp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 2 microbatches: 8"),
                   kSteps, {"--trace=" + trace}),
            1, kSteps, "mixed"),
      local_, "encoder TP2 x DP1, LLM PP2 x DP2 vs loom-train-local");
  ExpectTraceMatchesTheSimulator(trace, /*encoder_workers=*/2, /*llm_workers=*/4);
}

// Frozen modules (job.freeze; LLaVA's stage 1 and 2) against
// loom-train-local --freeze on the same data: stage 1 (vision and LLM
// frozen) with both modules in two pipeline stages (the tower's stages run
// no backward, the projector on the encoder's last stage trains from the
// tower output it kept, the frozen LLM passes gradients through its
// stages); stage 2 (the tower frozen) under encoder TP2; and the whole
// encoder side frozen (no embedding gradient travels). Stage 1's checkpoint
// holds the seed's tower and LLM bit for bit and a trained projector.
TEST_F(DistributedTest, FrozenModulesMatchTheSingleProcessRun) {
  struct Case {
    const char* name;
    const char* freeze;
    const char* parallel;
  };
  for (const Case& c :
       {Case{"stage1", "vision,llm", "encoder_pp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1"},
        Case{"stage2", "vision", "encoder_tp: 2 encoder_dp: 1 llm_dp: 2"},
        Case{"llm-only", "vision,projector", "encoder_dp: 2 llm_dp: 2"}}) {
    SCOPED_TRACE(c.name);
    int rc = 0;
    const std::vector<double> local = Steps(
        StepLosses(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny",
                             absl::StrCat("--steps=", kSteps), "--seed=1", "--batch_size=16",
                             "--shards=" + data_ + "/*.tar", absl::StrCat("--freeze=", c.freeze)},
                            absl::StrCat("local-", c.name, ".log"), &rc)),
        1, kSteps, c.name);
    ASSERT_EQ(rc, 0);
    EXPECT_NE(local, local_) << "freezing changed nothing";
    EXPECT_LT(local.back(), local.front()) << "nothing trained";
    std::string freeze = "freeze {";
    for (absl::string_view m : absl::StrSplit(c.freeze, ','))
      absl::StrAppend(&freeze, " ", m, ": true");
    const std::string job = JobWith("loom", 10, c.parallel) + freeze + " }\n";
    ExpectSameLosses(Steps(LoomUp(c.name, job, kSteps), 1, kSteps, c.name), local,
                     absl::StrCat(c.name, " (", c.freeze, " frozen; ", c.parallel, ")"));
  }
  // Stage 1's step-10 checkpoint: the frozen modules as the seed made them.
  MultimodalModel seed(*ModelConfigByName("tiny"));
  seed.Initialize(1);
  const std::string step = StepDir(TempPath("stage1") + "/checkpoints", 10);
  ExpectOnlyTheProjectorTrained(seed, step);
  // Stage 2 as a new run from stage 1's weights (init.checkpoint), with the
  // LLM in two pipeline stages, against loom-train-local --init_checkpoint.
  int rc = 0;
  const std::vector<double> local = Steps(
      StepLosses(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny", "--steps=10",
                           "--seed=1", "--batch_size=16", "--shards=" + data_ + "/*.tar",
                           "--freeze=vision", "--init_checkpoint=" + step},
                          "local-from-stage1.log", &rc)),
      1, 10, "local stage 2 from stage 1");
  ASSERT_EQ(rc, 0);
  const std::string job =
      JobWith("loom", 0, "encoder_dp: 2 llm_pp: 2 llm_dp: 1") +
      absl::StrCat("freeze { vision: true }\ninit { checkpoint: '", step, "' }\n");
  ExpectSameLosses(Steps(LoomUp("from-stage1", job, 10), 1, 10, "from stage 1"), local,
                   "stage 2 from stage 1's checkpoint (LLM PP2) vs loom-train-local");
  // From the seed's weights the first loss would be the unfrozen run's first.
  EXPECT_NE(local.front(), local_.front()) << "the stage-1 weights were not loaded";
}

// Hugging Face directories trained end to end: LLaVA's stage 1 on a LLaVA
// directory (its tokenizer.json and image processor feed the data), stage 2
// from stage 1's checkpoint, each equal to loom-train-local under tensor and
// pipeline layouts; the trained model exported as a LLaVA directory holding
// the checkpoint's weights in bf16; and a new LLaVA model made of an LLM
// directory and a CLIP directory (projector from the seed).
TEST_F(DistributedTest, HuggingFaceModelsTrainAsTheSingleProcessRunAndExport) {
  const std::string hf_dir = TempPath("hf");
  int rc = 0;
  const std::string made =
      RunToEnd({"/usr/bin/python3", Runfile("runtime/hf/hf_fixture.py"), hf_dir}, "hf.log", &rc);
  ASSERT_EQ(rc, 0) << made;
  const std::string llava = hf_dir + "/llava";
  auto local = [&](const std::string& name, const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {Runfile("runtime/train/loom-train-local"), "--steps=10",
                                     "--seed=1", "--batch_size=16", "--shards=" + data_ + "/*.tar"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    int code = 0;
    const std::vector<double> losses =
        Steps(StepLosses(RunToEnd(argv, name + ".log", &code)), 1, 10, name);
    EXPECT_EQ(code, 0);
    return losses;
  };
  auto job = [&](const std::string& model, const std::string& parallel, const std::string& rest) {
    return absl::StrCat("seed: 1\n", model, "\ndata { shards: '", data_,
                        "/*.tar' global_batch: 16 }\nparallel { ", parallel,
                        " microbatches: 2 }\ncheckpoint { every: 10 }\n", rest);
  };
  auto start = [](const hf::ModelSource& source) {
    absl::StatusOr<hf::PretrainedModel> m = hf::ResolveModel(source);
    EXPECT_TRUE(m.ok()) << m.status();
    auto model = std::make_unique<MultimodalModel>(m->config);
    model->Initialize(1);
    EXPECT_TRUE(hf::LoadPretrainedWeights(*m, model.get()).ok());
    return model;
  };
  hf::ModelSource llava_source;
  llava_source.llava = llava;

  // Stage 1: the projector alone, encoder PP2 and LLM TP2.
  const std::string llava_job = "hf { llava: '" + llava + "' }";
  const std::vector<double> stage1 =
      local("hf-local-1", {"--llava=" + llava, "--freeze=vision,llm"});
  EXPECT_LT(stage1.back(), stage1.front()) << "nothing trained";
  ExpectSameLosses(Steps(LoomUp("hf-stage1",
                                job(llava_job, "encoder_pp: 2 encoder_dp: 1 llm_tp: 2 llm_dp: 1",
                                    "freeze { vision: true llm: true }\n"),
                                10),
                         1, 10, "hf stage 1"),
                   stage1, "LLaVA directory, stage 1 (encoder PP2, LLM TP2) vs loom-train-local");
  const std::string step1 = StepDir(TempPath("hf-stage1") + "/checkpoints", 10);
  ExpectOnlyTheProjectorTrained(*start(llava_source), step1);

  // Stage 2 from stage 1: encoder TP2, LLM PP2.
  const std::vector<double> stage2 =
      local("hf-local-2", {"--llava=" + llava, "--freeze=vision", "--init_checkpoint=" + step1});
  ExpectSameLosses(
      Steps(LoomUp("hf-stage2",
                   job(llava_job, "encoder_tp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1",
                       "freeze { vision: true }\ninit { checkpoint: '" + step1 + "' }\n"),
                   10),
            1, 10, "hf stage 2"),
      stage2, "LLaVA directory, stage 2 from stage 1 (encoder TP2, LLM PP2) vs loom-train-local");

  // The export: the checkpoint's weights in bf16 under every name LLaVA
  // runs, the tokenizer and the image processor beside them.
  const std::string step2 = StepDir(TempPath("hf-stage2") + "/checkpoints", 10);
  const std::string exported = TempPath("hf-export");
  std::string out = RunToEnd({Runfile("runtime/hf/loom-model"), "export", "--hf=" + llava,
                              "--checkpoint=" + step2, "--out=" + exported},
                             "hf-export.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  MultimodalModel trained(start(llava_source)->config());
  ASSERT_TRUE(LoadTrainingWeights(trained, step2).ok());
  absl::StatusOr<hf::OpenedLlava> back = hf::OpenHfLlava(exported);
  ASSERT_TRUE(back.ok()) << back.status();
  const std::vector<hf::NamedTensor> want =
      hf::LlavaToHf(trained, hf::ClassicLlavaKeys(), /*grads=*/false);
  const std::vector<hf::NamedTensor> got =
      hf::LlavaToHf(*back->model, hf::ClassicLlavaKeys(), /*grads=*/false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].name, want[i].name);
    std::vector<float> rounded = want[i].data;
    for (float& x : rounded) x = hf::Bf16ToF32(hf::F32ToBf16(x));
    EXPECT_EQ(got[i].data, rounded) << got[i].name;
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"}) {
    EXPECT_EQ(ReadFile(exported + "/" + file).value_or("missing"),
              ReadFile(llava + "/" + file).value_or(""))
        << file;
  }

  // A new LLaVA model from an LLM directory and a CLIP directory, DP 2 + 2.
  hf::ModelSource pair;
  pair.llm_from = hf_dir + "/llm";
  pair.vision_from = hf_dir + "/vision";
  const std::vector<double> pair_local = local(
      "hf-local-pair",
      {"--llm_from=" + pair.llm_from, "--vision_from=" + pair.vision_from, "--freeze=vision,llm"});
  ExpectSameLosses(
      Steps(LoomUp("hf-pair",
                   job(absl::StrCat("hf { llm_from: '", pair.llm_from, "' vision_from: '",
                                    pair.vision_from, "' }"),
                       "encoder_dp: 2 llm_dp: 2", "freeze { vision: true llm: true }\n"),
                   10),
            1, 10, "hf llm_from + vision_from"),
      pair_local, "llm_from + vision_from, stage 1 (DP 2 + 2) vs loom-train-local");
  const std::string pair_step = StepDir(TempPath("hf-pair") + "/checkpoints", 10);
  ExpectOnlyTheProjectorTrained(*start(pair), pair_step);
  const std::string pair_export = TempPath("hf-pair-export");
  out = RunToEnd(
      {Runfile("runtime/hf/loom-model"), "export", "--llm_from=" + pair.llm_from,
       "--vision_from=" + pair.vision_from, "--checkpoint=" + pair_step, "--out=" + pair_export},
      "hf-pair-export.log", &rc);
  ASSERT_EQ(rc, 0) << out;
  absl::StatusOr<hf::LlavaConfig> exported_config = hf::ReadLlavaConfig(pair_export);
  ASSERT_TRUE(exported_config.ok()) << exported_config.status();
  absl::StatusOr<std::unique_ptr<data::Tokenizer>> tokenizer = data::Tokenizer::Load(pair.llm_from);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(exported_config->image_token_id, (*tokenizer)->image_id());
  EXPECT_TRUE(hf::OpenHfLlava(pair_export).ok());
}

// A worker killed (SIGKILL) mid-run: loom up stops the other services,
// starts every one again from the run's newest complete checkpoint, and the
// run ends with the uninterrupted run's losses (the steps after the
// checkpoint trained again, on the same samples).
TEST_F(DistributedTest, AKilledWorkerRestartsTheJobFromItsCheckpointExactly) {
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

TEST_F(DistributedTest, LoomAssignmentMatchesAndResumeContinuesExactly) {
  std::string out;
  const std::vector<double> full =
      Steps(LoomUp("loom", Job("loom", 10), kSteps, {}, &out), 1, kSteps, "loom");
  ExpectSameLosses(full, local_, "loom vs loom-train-local");
  EXPECT_NE(out.find("checkpoint complete"), std::string::npos) << out;

  // Stop after 10 (checkpoint 10 complete), then resume to 20: the resumed
  // run must train exactly steps 11..20 (a run that ignored --resume would
  // print steps 1..20) and equal the uninterrupted run there.
  Steps(LoomUp("resumed", Job("loom", 10), 10), 1, 10, "first 10");
  const std::vector<double> rest =
      Steps(LoomUp("resumed", Job("loom", 10), kSteps, {"--resume"}), 11, kSteps, "resumed");
  ExpectSameLosses(rest, Local(11, kSteps), "resumed 11..20 vs loom-train-local");
  ExpectSameLosses(rest, std::vector<double>(full.begin() + 10, full.end()),
                   "resumed 11..20 vs uninterrupted");

  // The same checkpoint (2 + 2 workers) resumed with other degrees (1 + 1).
  const std::vector<double> other = Steps(
      LoomUp("resumed", Job("loom", 10, 1, 1), kSteps, {"--resume_step=10"}), 11, kSteps, "1+1");
  ExpectSameLosses(other, Local(11, kSteps), "resumed with DP 1 + 1 vs loom-train-local");

  // A fresh run in the reused folder (its step 5), then --resume: it must
  // continue that run at 5, never the older run's 10 or 20.
  Steps(LoomUp("resumed", Job("loom", 5), 5), 1, 5, "fresh run in a reused folder");
  std::string again;
  const std::vector<double> six =
      Steps(LoomUp("resumed", Job("loom", 5), 6, {"--resume"}, &again), 6, 6, "resumed fresh run");
  EXPECT_NE(again.find("resuming after step 5"), std::string::npos) << again;
  ExpectSameLosses(six, Local(6, 6), "the fresh run's step 6");
  // The older run's step 20 is not this run's: named, refused.
  int rc = 0;
  const std::string refused =
      RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                "--run_dir=" + TempPath("resumed"), "--config=" + TempPath("resumed.txtpb"),
                "--resume_step=20"},
               "refused.log", &rc);
  EXPECT_EQ(rc, 1) << refused;
  EXPECT_NE(refused.find("belongs to run"), std::string::npos) << refused;
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
  EXPECT_NE(out.find("--resume: no run in checkpoint folder"), std::string::npos) << out;
}

}  // namespace
}  // namespace loom
