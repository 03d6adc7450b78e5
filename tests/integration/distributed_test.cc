// Disaggregated training end to end: `loom up` (preprocess, scheduler, two
// encoder and two LLM worker processes) against loom-train-local on the same
// shards and seed, loss and gradient norm step by step over 20 steps, for
// the `sequential` and the `loom` assignment (and, for `loom`, every tensor
// of the step-20 checkpoint); encoder DP != LLM DP (fan-in, fan-out); tensor and
// pipeline parallelism in both modules, mixed layouts, and checkpoints
// moving between layouts; a
// run stopped at 10 and resumed to 20, with the same and with other degrees,
// against the uninterrupted one; a fresh run in a reused folder never
// resuming the older run's steps; frozen modules (LLaVA's stages) in
// pipeline and tensor-parallel layouts; a bad job config and a missing
// device named.
// (Hugging Face models: pretrained_test.cc; a lost process:
// recovery_test.cc.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/base/file.h"
#include "runtime/base/json_line.h"
#include "runtime/base/tfrecord.h"
#include "runtime/base/trace.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/model.h"
#include "tests/integration/binaries.h"
#include "tests/integration/training_runs.h"

namespace loom {
namespace {

// tiny-deep's steps beside tiny's.
class DistributedTest : public TrainingRuns {
 protected:
  static void SetUpTestSuite() {
    TrainingRuns::SetUpTestSuite();
    int rc = 0;
    local_deep_ =
        Steps(StepResults(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny-deep",
                                    absl::StrCat("--steps=", kSteps), "--seed=1", "--batch_size=16",
                                    "--shards=" + data_ + "/*.tar"},
                                   "local-deep.log", &rc)),
              1, kSteps, "loom-train-local tiny-deep");
    ASSERT_EQ(rc, 0);
  }
  static std::vector<StepResult> local_deep_;
};

std::vector<StepResult> DistributedTest::local_deep_;

// `loom up --trace`: a track per worker, and per iteration each worker ran
// its forwards and backwards in exactly the order the simulator predicts for
// its (module, replica, stage); a stage that is not the last recomputes
// (with `recomputes`; without, none does: recompute none or selective).
void ExpectTraceMatchesTheSimulator(const std::string& path, int encoder_workers, int llm_workers,
                                    bool recomputes_expected = true) {
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
    if (e.cat() == "recompute" && e.pid() == trace::kMeasuredPid) ++recomputes;
    if (e.cat() != "forward" && e.cat() != "backward") continue;
    auto key = track_key.find({e.pid(), e.tid()});
    ASSERT_NE(key, track_key.end()) << "an unnamed track: " << e.name();
    std::string name = e.name();
    name = name.substr(0, name.find(" (with recompute)"));
    (e.pid() == trace::kMeasuredPid ? measured
                                    : predicted)[{key->second, e.args().at("iteration")}] +=
        name + ", ";
  }
  if (recomputes_expected) {
    EXPECT_GT(recomputes, 0);
  } else {
    EXPECT_EQ(recomputes, 0);
  }
  EXPECT_GE(measured.size(), static_cast<size_t>((encoder_workers + llm_workers) * kSteps));
  for (const auto& [key, order] : measured) {
    const std::string stage = key.first.substr(0, key.first.find(" tp "));
    auto p = predicted.find({stage, key.second});
    ASSERT_NE(p, predicted.end()) << key.first << " iteration " << key.second << ": no prediction";
    EXPECT_EQ(order, p->second) << key.first << " iteration " << key.second;
  }
}

TEST_F(DistributedTest, SequentialAssignmentMatchesTheSingleProcessRun) {
  ExpectSameSteps(Steps(LoomUp("sequential", Job("sequential", 0), kSteps), 1, kSteps, "seq"),
                  local_, "sequential vs loom-train-local");
}

// Encoder DP != LLM DP: the bins of one microbatch slot fan in from fewer
// encoder ranks (1 -> 3 LLM ranks) and fan out to fewer LLM ranks (3 -> 2).
TEST_F(DistributedTest, FanInAndFanOutMatchTheSingleProcessRun) {
  ExpectSameSteps(Steps(LoomUp("fan-out", Job("loom", 0, 1, 3), 8), 1, 8, "1+3"), Local(1, 8),
                  "encoder DP 1, LLM DP 3 vs loom-train-local");
  ExpectSameSteps(Steps(LoomUp("fan-in", Job("loom", 0, 3, 2), 8), 1, 8, "3+2"), Local(1, 8),
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
  ExpectSameSteps(Steps(LoomUp("tp", JobWith("loom", 10, tp), kSteps), 1, kSteps, "tp"), local_,
                  "encoder TP2 x DP1, LLM TP2 x DP2 vs loom-train-local");
  const std::vector<StepResult> untp = Steps(
      LoomUp("tp", JobWith("loom", 10, "encoder_dp: 2 llm_dp: 1"), kSteps, {"--resume_step=10"}),
      11, kSteps, "TP checkpoint resumed without TP");
  ExpectSameSteps(untp, Local(11, kSteps), "TP2 checkpoint resumed as DP 2 + 1");

  Steps(LoomUp("dp", Job("loom", 10, 2, 2), 10), 1, 10, "DP-only first 10");
  const std::vector<StepResult> tp4 =
      Steps(LoomUp("dp", JobWith("loom", 10, "encoder_tp: 4 encoder_dp: 1 llm_tp: 4 llm_dp: 1"),
                   kSteps, {"--resume_step=10"}),
            11, kSteps, "DP checkpoint resumed under TP4");
  ExpectSameSteps(tp4, Local(11, kSteps), "DP 2 + 2 checkpoint resumed as TP4 + TP4");
}

// Sequence parallelism in both modules' TP groups (the stream and the
// norms on half the rows, all-gathers and reduce-scatters for the
// all-reduces, the norms' gradients summed over the group), with the LLM
// under selective recompute: equal to the single-process run.
TEST_F(DistributedTest, SequenceParallelMatchesTheSingleProcessRun) {
  const std::string job =
      JobWith("loom", 0,
              "encoder_tp: 2 encoder_dp: 1 llm_tp: 2 llm_dp: 2 sequence_parallel: true") +
      "recompute { llm: 'selective' }\n";
  ExpectSameSteps(Steps(LoomUp("sp", job, kSteps), 1, kSteps, "sp"), local_,
                  "encoder TP2, LLM TP2 x DP2 with sequence parallelism vs loom-train-local");
}

// The LLM in two pipeline stages (1F1B over the combined pipeline, stage
// activations over UCX) with 4 microbatches and with 1 (fewer microbatches
// than stages), then the encoder in two stages too; then the PP run's
// step-10 checkpoint resumed without pipeline stages. Each equals the
// single-process run at every step.
TEST_F(DistributedTest, PipelineStagesMatchTheSingleProcessRun) {
  ExpectSameSteps(
      Steps(LoomUp("pp2", JobWith("loom", 10, "encoder_dp: 1 llm_dp: 1 llm_pp: 2 microbatches: 4"),
                   kSteps),
            1, kSteps, "pp2"),
      local_, "LLM PP2, 4 microbatches vs loom-train-local");
  ExpectSameSteps(
      Steps(LoomUp("pp2-m1",
                   JobWith("loom", 0, "encoder_dp: 1 llm_dp: 1 llm_pp: 2 microbatches: 1"), kSteps),
            1, kSteps, "pp2 m1"),
      local_, "LLM PP2, 1 microbatch vs loom-train-local");
  ExpectSameSteps(
      Steps(LoomUp("pp2-pp2", JobWith("loom", 0, "encoder_pp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1"),
                   kSteps),
            1, kSteps, "encoder pp2 + llm pp2"),
      local_, "encoder PP2 + LLM PP2 vs loom-train-local");
  ExpectSameSteps(Steps(LoomUp("pp2", Job("loom", 10, 2, 2), kSteps, {"--resume_step=10"}), 11,
                        kSteps, "PP checkpoint resumed without PP"),
                  Local(11, kSteps), "LLM PP2 checkpoint resumed as DP 2 + 2");
}

// Three LLM stages of a 6-layer LLM (tiny-deep); and a mixed layout with
// different DP on the two sides, encoder TP2 x DP1 feeding LLM PP2 x DP2,
// with one sample per microbatch (8 per replica), so text-only microbatches
// (a fifth of the onevision samples) pass through both LLM stages while the
// encoder skips them.
TEST_F(DistributedTest, DeeperAndMixedLayoutsMatchTheSingleProcessRun) {
  ExpectSameSteps(
      Steps(LoomUp("pp3", JobWith("loom", 0, "encoder_dp: 1 llm_dp: 1 llm_pp: 3", "tiny-deep"),
                   kSteps),
            1, kSteps, "pp3"),
      local_deep_, "tiny-deep LLM PP3 vs loom-train-local");
  const std::string trace = TempPath("mixed-trace.json");
  ExpectSameSteps(
      Steps(LoomUp("mixed",
                   JobWith("loom", 0,
                           "encoder_tp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 2 microbatches: 8"),
                   kSteps, {"--trace=" + trace}),
            1, kSteps, "mixed"),
      local_, "encoder TP2 x DP1, LLM PP2 x DP2 vs loom-train-local");
  ExpectTraceMatchesTheSimulator(trace, /*encoder_workers=*/2, /*llm_workers=*/4);
  // Colocated (parallel.colocate): encoder rank k on LLM rank k's device,
  // the first of two LLM stages; the embeddings through host memory.
  ExpectSameSteps(
      Steps(LoomUp("colocated",
                   JobWith("loom", 0,
                           "encoder_dp: 2 llm_pp: 2 llm_dp: 2 microbatches: 4 colocate: true"),
                   kSteps),
            1, kSteps, "colocated"),
      local_, "encoder DP2 colocated with LLM PP2 x DP2 vs loom-train-local");
}

// Recompute choices (job.recompute): both modules in two pipeline stages,
// the encoder keeping every bin's activations (none) and the LLM its
// in-flight microbatches' less the element-wise outputs (selective); then
// the reverse with the LLM also TP 2. Each equals the single-process run at
// every step (recompute changes no bit in fp32), and no stage runs a
// forward again.
TEST_F(DistributedTest, RecomputeChoicesMatchTheSingleProcessRun) {
  const std::string trace = TempPath("recompute-trace.json");
  ExpectSameSteps(
      Steps(LoomUp("recompute",
                   JobWith("loom", 0, "encoder_pp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1") +
                       "recompute { encoder: 'none' llm: 'selective' }\n",
                   kSteps, {"--trace=" + trace}),
            1, kSteps, "recompute"),
      local_, "encoder PP2 recompute none + LLM PP2 selective vs loom-train-local");
  ExpectTraceMatchesTheSimulator(trace, /*encoder_workers=*/2, /*llm_workers=*/2,
                                 /*recomputes_expected=*/false);
  ExpectSameSteps(Steps(LoomUp("recompute-tp",
                               JobWith("loom", 0,
                                       "encoder_pp: 2 encoder_dp: 1 llm_tp: 2 llm_pp: 2 llm_dp: 1 "
                                       "microbatches: 4") +
                                   "recompute { encoder: 'selective' llm: 'none' }\n",
                               kSteps),
                        1, kSteps, "recompute tp"),
                  local_, "encoder PP2 selective + LLM TP2 x PP2 none vs loom-train-local");
}

// bf16 mixed precision (job.precision) against loom-train-local --precision
// bf16 on the same data: tensor parallelism in both modules and two LLM
// pipeline stages, with DP on the encoder side, 10 steps; each step within
// kDisaggregatedVsLocalBf16. And its step-5 checkpoint (fp32 masters)
// resumed in fp32 under DP alone continues as loom-train-local's bf16
// step 5 resumed in fp32 does.
TEST_F(DistributedTest, Bf16MatchesTheSingleProcessBf16Run) {
  constexpr int kBf16Steps = 10;
  const std::string ckpt = TempPath("local-bf16-checkpoints");
  // loom-train-local: 5 bf16 steps and a checkpoint, then from it 5 more
  // in bf16 (a resume in its own precision is exact:
  // runtime/train:precision_training_test) and 5 in fp32.
  auto local = [&](const std::string& precision, int steps, bool resume) {
    std::vector<std::string> argv = {Runfile("runtime/train/loom-train-local"),
                                     "--config=tiny",
                                     "--seed=1",
                                     "--batch_size=16",
                                     "--shards=" + data_ + "/*.tar",
                                     "--checkpoint_dir=" + ckpt,
                                     "--precision=" + precision,
                                     absl::StrCat("--steps=", steps),
                                     resume ? "--resume" : "--checkpoint_every=5"};
    int rc = 0;
    const std::string out =
        RunToEnd(argv, absl::StrCat("local-", precision, "-", steps, ".log"), &rc);
    EXPECT_EQ(rc, 0) << out;
    return StepResults(out);
  };
  std::vector<StepResult> want = Steps(local("bf16", 5, false), 1, 5, "local bf16 1-5");
  for (const StepResult& r : Steps(local("bf16", kBf16Steps, true), 6, kBf16Steps, "bf16 6-10")) {
    want.push_back(r);
  }
  const std::vector<StepResult> want32 =
      Steps(local("fp32", kBf16Steps, true), 6, kBf16Steps, "local bf16 step 5 resumed in fp32");
  bool differ = false;
  for (int i = 0; i < kBf16Steps; ++i) differ |= want[i].loss != local_[i].loss;
  EXPECT_TRUE(differ) << "loom-train-local --precision bf16 printed the fp32 losses";

  const std::string job =
      JobWith("loom", 5, "encoder_tp: 2 encoder_dp: 2 llm_tp: 2 llm_pp: 2 llm_dp: 1") +
      "precision: 'bf16'\n";
  ExpectSameSteps(Steps(LoomUp("bf16", job, kBf16Steps), 1, kBf16Steps, "bf16 loom up"), want,
                  "bf16: encoder TP2 x DP2, LLM TP2 x PP2 vs loom-train-local bf16",
                  testing::kDisaggregatedVsLocalBf16, testing::kDisaggregatedVsLocalBf16);
  // Its step 5 (fp32 masters of a bf16 run) resumed in fp32 under DP alone.
  ExpectSameSteps(Steps(LoomUp("bf16", JobWith("loom", 0, "encoder_dp: 2 llm_dp: 2"), kBf16Steps,
                               {"--resume_step=5"}),
                        6, kBf16Steps, "bf16 checkpoint resumed in fp32"),
                  want32, "the bf16 run's step 5 resumed in fp32 under DP 2 + 2",
                  testing::kDisaggregatedVsLocalBf16, testing::kDisaggregatedVsLocalBf16);
}

// Each worker's AdamW bytes as it logged them when it joined
// (optimizer_state_bytes, and unsharded_bytes: what it would hold without
// sharding), by log file name.
std::map<std::string, std::pair<int64_t, int64_t>> OptimizerStateBytes(const std::string& run_dir) {
  std::map<std::string, std::pair<int64_t, int64_t>> out;
  for (const auto& f : std::filesystem::directory_iterator(run_dir + "/logs")) {
    const std::string name = f.path().filename().string();
    if (!absl::EndsWith(name, ".log") || name.find("worker") == std::string::npos) continue;
    absl::StatusOr<std::string> text = ReadFile(f.path().string());
    if (!text.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::StrContains(line, "AdamW state held")) continue;
      auto field = [&](absl::string_view key) -> int64_t {
        const std::string k = absl::StrCat("\"", key, "\":");
        const size_t at = line.find(k);
        if (at == absl::string_view::npos) return -1;
        return std::strtoll(std::string(line.substr(at + k.size())).c_str(), nullptr, 10);
      };
      out[name] = {field("optimizer_state_bytes"), field("unsharded_bytes")};
    }
  }
  return out;
}

// A distributed optimizer (job.optimizer.shard, ZeRO-1) against
// loom-train-local step by step: DP 2 on the encoder side and LLM TP2 x DP2
// for 20 steps with a checkpoint at 10 (each rank writes its own chunk, the
// LLM's ranks of their TP slices, with no gather: four LLM parts of about a
// quarter of the module each); that checkpoint resumed under
// DP 4 on the encoder side and LLM PP2 x DP2, sharded again; and resumed
// unsharded. Each worker holds 1/DP of its set's AdamW moments (the chunks
// of a group differ by at most one element).
TEST_F(DistributedTest, AShardedOptimizerMatchesTheSingleProcessRun) {
  const std::string shard = "optimizer { shard: true }\n";
  ExpectSameSteps(
      Steps(
          LoomUp("zero", JobWith("loom", 10, "encoder_dp: 2 llm_tp: 2 llm_dp: 2") + shard, kSteps),
          1, kSteps, "zero"),
      local_, "sharded optimizer: encoder DP2, LLM TP2 x DP2 vs loom-train-local");
  const auto dp2 = OptimizerStateBytes(TempPath("zero"));
  ASSERT_EQ(dp2.size(), 6u) << "a worker did not log its AdamW state";
  for (const auto& [log, bytes] : dp2) {
    const auto [held, whole] = bytes;
    ASSERT_GT(whole, 0) << log;
    // ChunkRange: a chunk of n / 2 elements, rounded either way (8 bytes each).
    EXPECT_LE(std::abs(2 * held - whole), 16) << log << ": holds " << held << " of " << whole;
  }
  {
    const std::string step = StepDir(TempPath("zero") + "/checkpoints", 10);
    std::vector<double> bytes;
    for (int k = 0; k < 4; ++k) {
      bytes.push_back(
          static_cast<double>(std::filesystem::file_size(step + "/" + ModulePartName("llm", k))));
    }
    const double mean = (bytes[0] + bytes[1] + bytes[2] + bytes[3]) / 4;
    for (int k = 0; k < 4; ++k) {
      EXPECT_NEAR(bytes[k], mean, 0.02 * mean) << "llm part " << k << " of TP2 x DP2";
    }
    EXPECT_NE(ReadFile(ModuleManifestPath(step, "llm")).value_or("").find("\"stride\""),
              std::string::npos)
        << "the LLM's row-parallel slices as strided entries";
  }
  const std::vector<StepResult> dp4 =
      Steps(LoomUp("zero", JobWith("loom", 0, "encoder_dp: 4 llm_pp: 2 llm_dp: 2") + shard, kSteps,
                   {"--resume_step=10"}),
            11, kSteps, "zero resumed under encoder DP4, LLM PP2 x DP2");
  ExpectSameSteps(dp4, Local(11, kSteps),
                  "sharded checkpoint resumed sharded under encoder DP4, LLM PP2 x DP2");
  int quarter = 0;
  for (const auto& [log, bytes] : OptimizerStateBytes(TempPath("zero"))) {
    const auto [held, whole] = bytes;
    if (!absl::StartsWith(log, "loom-encoder")) continue;
    ++quarter;
    EXPECT_LE(std::abs(4 * held - whole), 4 * 16) << log << ": holds " << held << " of " << whole;
  }
  EXPECT_EQ(quarter, 4) << "encoder workers' AdamW state under DP 4";
  ExpectSameSteps(Steps(LoomUp("zero", JobWith("loom", 0, "encoder_dp: 1 llm_dp: 1"), kSteps,
                               {"--resume_step=10"}),
                        11, kSteps, "zero resumed unsharded"),
                  Local(11, kSteps), "sharded checkpoint resumed unsharded under DP 1 + 1");
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
    const std::vector<StepResult> local = Steps(
        StepResults(RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny",
                              absl::StrCat("--steps=", kSteps), "--seed=1", "--batch_size=16",
                              "--shards=" + data_ + "/*.tar", absl::StrCat("--freeze=", c.freeze)},
                             absl::StrCat("local-", c.name, ".log"), &rc)),
        1, kSteps, c.name);
    ASSERT_EQ(rc, 0);
    EXPECT_NE(local, local_) << "freezing changed nothing";
    EXPECT_LT(local.back().loss, local.front().loss) << "nothing trained";
    std::string freeze = "freeze {";
    for (absl::string_view m : absl::StrSplit(c.freeze, ','))
      absl::StrAppend(&freeze, " ", m, ": true");
    const std::string job = JobWith("loom", 10, c.parallel) + freeze + " }\n";
    ExpectSameSteps(Steps(LoomUp(c.name, job, kSteps), 1, kSteps, c.name), local,
                    absl::StrCat(c.name, " (", c.freeze, " frozen; ", c.parallel, ")"));
  }
  // Stage 1's step-10 checkpoint: the frozen modules as the seed made them.
  MultimodalModel seed(*ModelConfigByName("tiny"));
  seed.Initialize(1);
  const std::string step = StepDir(TempPath("stage1") + "/checkpoints", 10);
  ExpectOnlyTheProjectorTrained(seed, step);
  // Stage 2 as a new run from stage 1's weights (init.checkpoint), with the
  // LLM in two pipeline stages, against loom-train-local --init_checkpoint,
  // under a stage-2 recipe: a cosine decay to a floor after a warm-up, the
  // projector and the LLM each at their own peak, AdamW's eps set; on
  // conversations (loom-datagen's chat preset) through the vicuna_v1 chat
  // template, so only the answers carry loss.
  int rc = 0;
  const std::string chat = TempPath("chat");
  RunToEnd(
      {Runfile("runtime/data/loom-datagen"), "--preset=chat", "--samples=160", "--out=" + chat},
      "datagen-chat.log", &rc);
  ASSERT_EQ(rc, 0);
  const std::vector<StepResult> local =
      Steps(StepResults(RunToEnd(
                {Runfile("runtime/train/loom-train-local"), "--config=tiny", "--steps=10",
                 "--seed=1", "--batch_size=16", "--shards=" + chat + "/*.tar",
                 "--chat_template=vicuna_v1", "--freeze=vision", "--init_checkpoint=" + step,
                 "--lr_schedule=cosine", "--warmup_steps=2", "--min_lr=1e-4", "--projector_lr=5e-4",
                 "--llm_lr=2e-3", "--adam_eps=1e-6"},
                "local-from-stage1.log", &rc)),
            1, 10, "local stage 2 from stage 1");
  ASSERT_EQ(rc, 0);
  const std::string job = absl::StrReplaceAll(
      JobWith("loom", 0, "encoder_dp: 2 llm_pp: 2 llm_dp: 1") +
          absl::StrCat("freeze { vision: true }\ninit { checkpoint: '", step, "' }\n") +
          "train { steps: 10 lr_schedule: LR_SCHEDULE_COSINE warmup_steps: 2 min_lr: 1e-4 "
          "projector_lr: 5e-4 llm_lr: 2e-3 eps: 1e-6 }\n",
      {{"data { shards: '" + data_ + "/*.tar'",
        "data { shards: '" + chat + "/*.tar' chat_template: 'vicuna_v1'"}});
  std::string out;
  ExpectSameSteps(Steps(LoomUp("from-stage1", job, 10, {}, &out), 1, 10, "from stage 1"), local,
                  "stage 2 from stage 1's checkpoint (LLM PP2) on conversations vs "
                  "loom-train-local");
  // The answers alone carry loss: a small share of the text.
  double tokens = 0, loss_tokens = 0;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    double t = 0, l = 0;
    if (JsonNumberField(line, "tokens", &t) && JsonNumberField(line, "loss_tokens", &l)) {
      tokens += t;
      loss_tokens += l;
    }
  }
  EXPECT_GT(loss_tokens, 0);
  EXPECT_LT(loss_tokens, 0.25 * tokens) << "loss on more than the answers";
  // From the seed's weights the first loss would be the unfrozen run's first.
  EXPECT_NE(local.front().loss, local_.front().loss) << "the stage-1 weights were not loaded";
}

// The validation loss (data.validation): a held-out set every 3 steps,
// computed on the job's ranks (encoder TP2, LLM PP2), equals
// loom-train-local's, and neither run's training losses change with it.
TEST_F(DistributedTest, ValidationLossMatchesAndLeavesTrainingUnchanged) {
  int rc = 0;
  const std::string held_out = TempPath("held-out");
  RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=onevision", "--samples=40", "--seed=9",
            "--out=" + held_out},
           "datagen-held-out.log", &rc);
  ASSERT_EQ(rc, 0);
  // step -> validation loss, from JSON lines.
  auto validation = [](const std::string& out) {
    std::map<int, double> by_step;
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      double step = 0, loss = 0;
      if (JsonNumberField(line, "step", &step) && JsonNumberField(line, "validation_loss", &loss)) {
        by_step[static_cast<int>(step)] = loss;
      }
    }
    return by_step;
  };
  const std::string local_out =
      RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny", "--steps=6", "--seed=1",
                "--batch_size=16", "--shards=" + data_ + "/*.tar",
                "--validation_shards=" + held_out + "/*.tar", "--validation_samples=32",
                "--validation_every=3"},
               "local-validation.log", &rc);
  ASSERT_EQ(rc, 0) << local_out;
  EXPECT_EQ(Steps(StepResults(local_out), 1, 6, "local with validation"), Local(1, 6))
      << "validating changed loom-train-local's training";
  const std::map<int, double> want = validation(local_out);
  ASSERT_EQ(want.size(), 2u) << local_out;
  ASSERT_EQ(want.count(3) + want.count(6), 2u);

  const std::string job = absl::StrReplaceAll(
      JobWith("loom", 0, "encoder_tp: 2 encoder_dp: 1 llm_pp: 2 llm_dp: 1") +
          "train { steps: 6 }\n",
      {{"global_batch: 16 }", absl::StrCat("global_batch: 16 validation { shards: '", held_out,
                                           "/*.tar' every: 3 samples: 32 } }")}});
  std::string out;
  ExpectSameSteps(Steps(LoomUp("validation", job, 6, {}, &out), 1, 6, "with validation"),
                  Local(1, 6),
                  "encoder TP2 + LLM PP2 with validation every 3 steps vs "
                  "loom-train-local without");
  const std::map<int, double> got = validation(out);
  ASSERT_EQ(got.size(), want.size()) << out;
  for (const auto& [step, loss] : want) {
    EXPECT_NEAR(got.at(step), loss,
                testing::Allowed(testing::kDisaggregatedVsLocalValidationLoss, loss))
        << "validation loss after step " << step;
  }
  EXPECT_NE(want.at(3), want.at(6)) << "the held-out loss did not follow the training";
  // metrics.jsonl and the dashboard's gauge carry it too.
  const std::string metrics = ReadFile(TempPath("validation") + "/metrics.jsonl").value_or("");
  EXPECT_TRUE(absl::StrContains(metrics, "\"validation_loss\":")) << metrics;
}

// A mixture of two datasets by weight (data.sources), the run given in
// epochs (train.epochs: the scheduler asks loom-preprocess for the sample
// count), equals loom-train-local with the same mixture and --epochs.
TEST_F(DistributedTest, AMixtureInEpochsMatchesTheSingleProcessRun) {
  int rc = 0;
  const std::string chat = TempPath("mixture-chat");
  RunToEnd({Runfile("runtime/data/loom-datagen"), "--preset=chat", "--samples=32", "--seed=5",
            "--out=" + chat},
           "datagen-mixture.log", &rc);
  ASSERT_EQ(rc, 0);
  // 160 + 32 samples: half an epoch in batches of 16 is 6 steps.
  const std::string spec = absl::StrCat(data_, "/*.tar=3,", chat, "/*.tar=1");
  const std::string local_out =
      RunToEnd({Runfile("runtime/train/loom-train-local"), "--config=tiny", "--epochs=0.5",
                "--seed=1", "--batch_size=16", "--shards=" + spec},
               "local-mixture.log", &rc);
  ASSERT_EQ(rc, 0) << local_out;
  const std::vector<StepResult> local = Steps(StepResults(local_out), 1, 6, "local mixture");
  EXPECT_NE(local, Local(1, 6)) << "the mixture changed nothing";
  const std::string job = absl::StrReplaceAll(
      JobWith("loom", 0, "encoder_dp: 1 llm_dp: 2") + "train { epochs: 0.5 }\n",
      {{absl::StrCat("data { shards: '", data_, "/*.tar' "),
        absl::StrCat("data { sources { shards: '", data_, "/*.tar' weight: 3 } sources { shards: '",
                     chat, "/*.tar' } ")}});
  ExpectSameSteps(Steps(LoomUp("mixture", job, /*steps=*/-1), 1, 6, "mixture in epochs"), local,
                  "a 3:1 mixture, half an epoch (DP 1 + 2) vs loom-train-local");
}

TEST_F(DistributedTest, LoomAssignmentMatchesAndResumeContinuesExactly) {
  std::string out;
  const std::vector<StepResult> full =
      Steps(LoomUp("loom", Job("loom", 10), kSteps, {}, &out), 1, kSteps, "loom");
  ExpectSameSteps(full, local_, "loom vs loom-train-local");
  EXPECT_NE(out.find("checkpoint complete"), std::string::npos) << out;
  // loom-scheduler kept every step in the run folder: metrics.jsonl (the
  // same 6-decimal numbers loom up printed) and TensorBoard's events, read
  // back with their CRCs.
  absl::StatusOr<std::string> metrics = ReadFile(TempPath("loom") + "/metrics.jsonl");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const std::vector<std::string> lines = absl::StrSplit(*metrics, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), static_cast<size_t>(kSteps)) << *metrics;
  for (int i = 0; i < kSteps; ++i) {
    double step = 0, loss = 0, grad_norm = 0;
    ASSERT_TRUE(JsonNumberField(lines[i], "step", &step) &&
                JsonNumberField(lines[i], "loss", &loss) &&
                JsonNumberField(lines[i], "grad_norm", &grad_norm))
        << lines[i];
    EXPECT_EQ(step, i + 1);
    EXPECT_EQ(loss, full[i].loss) << lines[i];
    EXPECT_EQ(grad_norm, full[i].grad_norm) << lines[i];
  }
  std::vector<std::string> boards;
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(TempPath("loom") + "/tensorboard")) {
    if (e.is_regular_file()) boards.push_back(e.path().string());
  }
  ASSERT_EQ(boards.size(), 1u);
  absl::StatusOr<std::vector<std::string>> events = ReadTfRecords(boards[0]);
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(events->size(), static_cast<size_t>(kSteps) + 1) << "file_version, then a step each";
  // Both runs' step-20 checkpoints, tensor by tensor: what the losses and
  // norms summarise, whole.
  ExpectSameCheckpoints("tiny", StepDir(TempPath("loom") + "/checkpoints", kSteps),
                        StepDir(local_checkpoints_, kSteps), "loom vs loom-train-local, step 20");

  // Stop after 10 (checkpoint 10 complete), then resume to 20: the resumed
  // run must train exactly steps 11..20 (a run that ignored --resume would
  // print steps 1..20) and equal the uninterrupted run there.
  Steps(LoomUp("resumed", Job("loom", 10), 10), 1, 10, "first 10");
  const std::vector<StepResult> rest =
      Steps(LoomUp("resumed", Job("loom", 10), kSteps, {"--resume"}), 11, kSteps, "resumed");
  ExpectSameSteps(rest, Local(11, kSteps), "resumed 11..20 vs loom-train-local");
  ExpectSameSteps(rest, std::vector<StepResult>(full.begin() + 10, full.end()),
                  "resumed 11..20 vs uninterrupted");

  // The same checkpoint (2 + 2 workers) resumed with other degrees (1 + 1).
  const std::vector<StepResult> other = Steps(
      LoomUp("resumed", Job("loom", 10, 1, 1), kSteps, {"--resume_step=10"}), 11, kSteps, "1+1");
  ExpectSameSteps(other, Local(11, kSteps), "resumed with DP 1 + 1 vs loom-train-local");

  // A fresh run in the reused folder (its step 5), then --resume: it must
  // continue that run at 5, never the older run's 10 or 20.
  Steps(LoomUp("resumed", Job("loom", 5), 5), 1, 5, "fresh run in a reused folder");
  std::string again;
  const std::vector<StepResult> six =
      Steps(LoomUp("resumed", Job("loom", 5), 6, {"--resume"}, &again), 6, 6, "resumed fresh run");
  EXPECT_NE(again.find("resuming after step 5"), std::string::npos) << again;
  ExpectSameSteps(six, Local(6, 6), "the fresh run's step 6");
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

  ASSERT_TRUE(WriteFileAtomically(
                  config, R"({"parallel": {"encoder_dp": 1, "llm_dp": 2, "colocate": true}})")
                  .ok());
  out = RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                  "--run_dir=" + TempPath("bad"), "--config=" + config},
                 "bad3.log", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("parallel.colocate: the encoder's 1 ranks"), std::string::npos) << out;
  EXPECT_EQ(out.find("starting"), std::string::npos) << out;
}

// A module's device that this machine lacks (no CUDA in the build, or no
// GPU 7): the job fails and loom up says which field and why, from the
// worker's own last words (without a GPU this is what CI can check of
// `device`; CPU jobs run through the same staging code in every test above).
TEST_F(DistributedTest, AMissingDeviceIsNamed) {
  int rc = 0;
  const std::string config = TempPath("device.txtpb");
  ASSERT_TRUE(WriteFileAtomically(config, Job("sequential", 0, 1, 1) +
                                              "train { steps: 2 }\ndevice { llm: 'cuda:7' }\n")
                  .ok());
  const std::string out =
      RunToEnd({Runfile("deploy/launcher/loom-up"), "--bin_dir=" + Runfile(""),
                "--run_dir=" + TempPath("device"), "--config=" + config, "--max_restarts=0"},
               "device.log", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("llm_worker rank 0 exited: cannot join the job: device.llm cuda:7: "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("FAILED"), std::string::npos) << out;
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
