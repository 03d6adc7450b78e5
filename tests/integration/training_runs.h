// What the end-to-end training tests share: running loom-train-local and
// `loom up` as processes on generated shards, reading their losses step by
// step, and comparing them within kDisaggregatedVsLocalLoss.
#ifndef LOOM_TESTS_INTEGRATION_TRAINING_RUNS_H_
#define LOOM_TESTS_INTEGRATION_TRAINING_RUNS_H_

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/model.h"

namespace loom {

inline constexpr int kSteps = 20;

std::string Runfile(const std::string& path);

// Runs argv to completion; its stdout+stderr.
std::string RunToEnd(const std::vector<std::string>& argv, const std::string& log, int* exit_code);

// The "loss" of every JSON line that has one, by its "step".
std::map<int, double> StepLosses(const std::string& out);

// Steps first..last of `losses`, which must hold exactly those steps.
std::vector<double> Steps(const std::map<int, double>& losses, int first, int last,
                          const std::string& what);

void ExpectSameLosses(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what);

// LLaVA's stage 1 after 10 steps (checkpoint `step`): the vision tower and
// the LLM exactly as they started (`start`), the projector trained.
void ExpectOnlyTheProjectorTrained(MultimodalModel& start, const std::string& step);

// 160 generated onevision samples and loom-train-local's 20 losses on them
// (model tiny, seed 1, batch 16), made once per test suite.
class TrainingRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite();

  // `loom up` in run folder `name` with a job written to a file and `extra`
  // flags; its JSON lines' losses by step.
  static std::map<int, double> LoomUp(const std::string& name, const std::string& job, int steps,
                                      const std::vector<std::string>& extra = {},
                                      std::string* out = nullptr);

  static std::string Job(const std::string& algorithm, int checkpoint_every, int encoder_dp = 2,
                         int llm_dp = 2);
  // `parallel`: the ParallelConfig's fields (microbatches 2 unless given).
  static std::string JobWith(const std::string& algorithm, int checkpoint_every,
                             const std::string& parallel, const std::string& model = "tiny");

  static std::vector<double> Local(int first, int last) {
    return std::vector<double>(local_.begin() + first - 1, local_.begin() + last);
  }

  static std::string data_;
  static std::vector<double> local_;  // model tiny
  static int runs_;
};

}  // namespace loom

#endif  // LOOM_TESTS_INTEGRATION_TRAINING_RUNS_H_
