// What the end-to-end training tests share: running loom-train-local and
// `loom up` as processes on generated shards, reading their losses and
// gradient norms step by step, and comparing them within
// kDisaggregatedVsLocalLoss and kDisaggregatedVsLocalGradNorm; and their
// checkpoints tensor by tensor within kDisaggregatedVsLocalCheckpoint.
#ifndef LOOM_TESTS_INTEGRATION_TRAINING_RUNS_H_
#define LOOM_TESTS_INTEGRATION_TRAINING_RUNS_H_

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/tolerances.h"
#include "runtime/model/model.h"

namespace loom {

inline constexpr int kSteps = 20;

std::string Runfile(const std::string& path);

// Runs argv to completion; its stdout+stderr.
std::string RunToEnd(const std::vector<std::string>& argv, const std::string& log, int* exit_code);

// What loom-train-local and `loom up --json` print of one training step.
// The loss alone cannot see a constant scale of one module's gradients
// (AdamW's update is invariant to it while the clip is inactive); the norm
// of all gradients, taken before clipping, can.
struct StepResult {
  double loss = 0;
  double grad_norm = 0;
};
bool operator==(const StepResult& a, const StepResult& b);
inline bool operator!=(const StepResult& a, const StepResult& b) { return !(a == b); }
std::ostream& operator<<(std::ostream& os, const StepResult& r);

// The "loss" and "grad_norm" of every JSON line that has a "step" and a
// "loss", by that step (a line without "grad_norm" gives NaN there).
std::map<int, StepResult> StepResults(const std::string& out);

// Steps first..last of `results`, which must hold exactly those steps.
std::vector<StepResult> Steps(const std::map<int, StepResult>& results, int first, int last,
                              const std::string& what);

// Every step's loss within kDisaggregatedVsLocalLoss and its grad_norm
// within kDisaggregatedVsLocalGradNorm of `want`'s; prints the largest
// relative difference of each.
void ExpectSameSteps(const std::vector<StepResult>& got, const std::vector<StepResult>& want,
                     const std::string& what);
// The same within other bounds (a GPU's run against the CPU's).
void ExpectSameSteps(const std::vector<StepResult>& got, const std::vector<StepResult>& want,
                     const std::string& what, const testing::Tolerance& loss_tol,
                     const testing::Tolerance& norm_tol);

// Every tensor of every parameter set of two step folders (weights, AdamW's
// m and v, and the optimizer step) of a `config` model (a generator's two
// sets too) equal within
// kDisaggregatedVsLocalCheckpoint; prints the largest difference of each.
void ExpectSameCheckpoints(const std::string& config, const std::string& got_step,
                           const std::string& want_step, const std::string& what);

// LLaVA's stage 1 after 10 steps (checkpoint `step`): the vision tower and
// the LLM exactly as they started (`start`), the projector trained.
void ExpectOnlyTheProjectorTrained(MultimodalModel& start, const std::string& step);

// 160 generated onevision samples and loom-train-local's 20 steps on them
// (model tiny, seed 1, batch 16) with a checkpoint of its step 20, made once
// per test suite (fewer steps where a suite asks).
class TrainingRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { SetUpReference(kSteps); }
  // The data, and the reference's first `steps` steps (its checkpoint at the
  // last).
  static void SetUpReference(int steps);

  // `loom up` in run folder `name` with a job written to a file and `extra`
  // flags (and --steps unless `steps` < 0: the job's own); its JSON lines'
  // results by step.
  static std::map<int, StepResult> LoomUp(const std::string& name, const std::string& job,
                                          int steps, const std::vector<std::string>& extra = {},
                                          std::string* out = nullptr);

  static std::string Job(const std::string& algorithm, int checkpoint_every, int encoder_dp = 2,
                         int llm_dp = 2);
  // `parallel`: the ParallelConfig's fields (microbatches 2 unless given).
  static std::string JobWith(const std::string& algorithm, int checkpoint_every,
                             const std::string& parallel, const std::string& model = "tiny");

  static std::vector<StepResult> Local(int first, int last) {
    return std::vector<StepResult>(local_.begin() + first - 1, local_.begin() + last);
  }

  static std::string data_;
  static std::vector<StepResult> local_;  // model tiny
  static std::string local_checkpoints_;  // its checkpoint folder, holding step 20
  static int runs_;
};

}  // namespace loom

#endif  // LOOM_TESTS_INTEGRATION_TRAINING_RUNS_H_
