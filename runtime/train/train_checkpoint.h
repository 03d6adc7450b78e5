// Whole-model training checkpoints for the single-process trainer:
//   DIR/step-<N>/{encoder,projector,llm}.ckpt   (runtime/checkpoint format)
//   DIR/step-<N>/COMPLETE                       written last: the step is
//                                               complete only when it exists
// The data cursor needs no file here: batch s is samples [s·B, (s+1)·B).
#ifndef LOOM_RUNTIME_TRAIN_TRAIN_CHECKPOINT_H_
#define LOOM_RUNTIME_TRAIN_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/model.h"

namespace loom {

// DIR/step-<N>
std::string StepDir(const std::string& dir, int64_t step);

absl::Status SaveTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir);

// The highest step with a COMPLETE marker under `dir`; NOT_FOUND if none.
absl::StatusOr<int64_t> LatestCompleteCheckpoint(const std::string& dir);

// Loads step `step` from `dir` into `model`.
absl::Status LoadTrainingCheckpoint(MultimodalModel& model, int64_t step, const std::string& dir);

}  // namespace loom

#endif  // LOOM_RUNTIME_TRAIN_TRAIN_CHECKPOINT_H_
