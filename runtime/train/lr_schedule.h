// The learning rate of every optimizer step, in one place: a linear
// warm-up, then constant or a cosine or linear decay to a floor at the
// job's last step. Each module has its own peak (the vision tower often
// trains at a fraction of the rest) and follows the same shape.
//
// Steps are 1-based: step s of a warm-up of W steps runs at s / W of the
// peak (the first step is not wasted at 0), step W at the peak. After it,
// with T the job's last step and p = (s - W) / (T - W) clamped to [0, 1]:
//   constant  1
//   cosine    m + (1 - m) (1 + cos(pi p)) / 2
//   linear    m + (1 - m) (1 - p)
// where m = min_lr / lr: the decay reaches the floor at step T. This is
// Hugging Face's get_cosine_schedule_with_warmup / linear schedule with a
// floor, shifted by one step (theirs runs step s at index s - 1, so its
// first step has learning rate 0).
#ifndef LOOM_RUNTIME_TRAIN_LR_SCHEDULE_H_
#define LOOM_RUNTIME_TRAIN_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loom {

enum class LrSchedule : uint8_t { kConstant, kCosine, kLinear };

// "constant" / "cosine" / "linear", and back (flags, logs).
const char* LrScheduleName(LrSchedule schedule);
absl::StatusOr<LrSchedule> ParseLrSchedule(const std::string& name);

struct LrScheduleOptions {
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 10;
  int64_t total_steps = 0;  // the last step; a decay needs it > 0
  double min_ratio = 0;     // min_lr / lr, in [0, 1]
};

// INVALID_ARGUMENT naming what is wrong: a decay without total_steps, a
// floor outside [0, 1], a negative warm-up.
absl::Status ValidateLrSchedule(const LrScheduleOptions& options);

// The share of its peak the learning rate has at `step` (1-based).
double LrFactor(const LrScheduleOptions& options, int64_t step);

// Warm-up steps for a share of the run (Hugging Face's warmup_ratio:
// ceil(ratio x steps)).
int64_t WarmupStepsFromRatio(double ratio, int64_t steps);

}  // namespace loom

#endif  // LOOM_RUNTIME_TRAIN_LR_SCHEDULE_H_
