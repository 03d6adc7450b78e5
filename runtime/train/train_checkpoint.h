// Whole-model training checkpoints for the single-process trainer:
//   DIR/step-<N>/{encoder,projector,llm}.ckpt   (runtime/checkpoint format)
// in the step folders of runtime/checkpoint/steps.h: written aside, then
// renamed into place whole, and tied to their run.
#ifndef LOOM_RUNTIME_TRAIN_TRAIN_CHECKPOINT_H_
#define LOOM_RUNTIME_TRAIN_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/model.h"

namespace loom {

// Writes step `step` of `run`: `extra` files (name, bytes) and the modules
// into the partial folder, then commits it.
absl::Status SaveTrainingCheckpoint(
    MultimodalModel& model, int64_t step, const std::string& dir, const CheckpointRun& run,
    const std::vector<std::pair<std::string, std::string>>& extra = {});

// Loads step `step` from `dir` into `model`.
absl::Status LoadTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir);

// The weights alone of step folder `step_dir` (another run's DIR/step-N),
// with fresh AdamW state (runtime/checkpoint LoadModuleWeights).
absl::Status LoadTrainingWeights(MultimodalModel& model, const std::string& step_dir);

}  // namespace loom

#endif  // LOOM_RUNTIME_TRAIN_TRAIN_CHECKPOINT_H_
