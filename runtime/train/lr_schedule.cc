#include "runtime/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace loom {

const char* LrScheduleName(LrSchedule schedule) {
  switch (schedule) {
    case LrSchedule::kCosine:
      return "cosine";
    case LrSchedule::kLinear:
      return "linear";
    case LrSchedule::kConstant:
      break;
  }
  return "constant";
}

absl::StatusOr<LrSchedule> ParseLrSchedule(const std::string& name) {
  for (LrSchedule s : {LrSchedule::kConstant, LrSchedule::kCosine, LrSchedule::kLinear}) {
    if (name == LrScheduleName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule \"", name, "\" (known: constant, cosine, linear)"));
}

absl::Status ValidateLrSchedule(const LrScheduleOptions& o) {
  if (o.warmup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("warm-up: ", o.warmup_steps, " steps"));
  }
  if (!(o.min_ratio >= 0 && o.min_ratio <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_lr: ", o.min_ratio, " of the peak; must be between 0 and the peak"));
  }
  if (o.schedule != LrSchedule::kConstant && o.total_steps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a ", LrScheduleName(o.schedule),
        " decay ends at the last step: it needs a step count (train.steps > 0, or train.epochs)"));
  }
  return absl::OkStatus();
}

double LrFactor(const LrScheduleOptions& o, int64_t step) {
  const int64_t w = o.warmup_steps;
  if (w > 0 && step <= w) return static_cast<double>(step) / static_cast<double>(w);
  if (o.schedule == LrSchedule::kConstant || o.total_steps <= w) return 1.0;
  const double p =
      std::clamp(static_cast<double>(step - w) / static_cast<double>(o.total_steps - w), 0.0, 1.0);
  const double m = o.min_ratio;
  if (o.schedule == LrSchedule::kCosine) return m + (1 - m) * 0.5 * (1 + std::cos(M_PI * p));
  return m + (1 - m) * (1 - p);
}

int64_t WarmupStepsFromRatio(double ratio, int64_t steps) {
  return static_cast<int64_t>(std::ceil(ratio * static_cast<double>(steps)));
}

}  // namespace loom
