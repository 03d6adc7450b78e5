#include "runtime/train/train_checkpoint.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/file.h"
#include "runtime/checkpoint/checkpoint.h"

namespace loom {
absl::Status SaveTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir,
                                    const CheckpointRun& run,
                                    const std::vector<std::pair<std::string, std::string>>& extra) {
  if (absl::Status s = BeginCheckpointStep(dir, step); !s.ok()) return s;
  const std::string sd = PartialStepDir(dir, step);
  for (const auto& [name, bytes] : extra) {
    if (absl::Status s = WriteFileAtomically(absl::StrCat(sd, "/", name), bytes); !s.ok()) return s;
  }
  model.PullState();  // the optimizer's state from where it steps
  auto sets = model.param_sets();
  const std::vector<std::string> names = model.param_set_names();
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::Status s = SaveModuleCheckpoint(*sets[i], names[i], sd);
    if (!s.ok()) return s;
  }
  return CommitCheckpointStep(dir, step, run);
}

absl::Status LoadTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir) {
  const std::string sd = StepDir(dir, step);
  auto sets = model.param_sets();
  const std::vector<std::string> names = model.param_set_names();
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::Status s = LoadModuleCheckpoint(sd, names[i], sets[i]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status LoadTrainingWeights(MultimodalModel& model, const std::string& step_dir) {
  auto sets = model.param_sets();
  const std::vector<std::string> names = model.param_set_names();
  for (size_t i = 0; i < sets.size(); ++i) {
    absl::Status s = LoadModuleWeights(step_dir, names[i], sets[i]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace loom
