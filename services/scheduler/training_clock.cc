#include "services/scheduler/training_clock.h"

#include <algorithm>

namespace loom {

namespace {

absl::Time FromUnixSeconds(double s) { return absl::UnixEpoch() + absl::Seconds(s); }
double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

bool Counts(control::v1::JobState state) {
  switch (state) {
    case control::v1::JOB_STATE_PAUSED:
    case control::v1::JOB_STATE_SUCCEEDED:
    case control::v1::JOB_STATE_CANCELLED:
    case control::v1::JOB_STATE_FAILED:
      return false;
    default:
      return true;
  }
}

}  // namespace

void TrainingClock::Continue(const control::v1::TrainingTime& kept, int64_t step,
                             double productive_seconds) {
  if (kept.started_seconds() > 0) {
    started_ = FromUnixSeconds(kept.started_seconds());
    stopped_ = absl::Seconds(std::max(0.0, kept.stopped_seconds()));
  }
  stopped_since_.reset();  // the time until this attempt took over counts
  checkpoint_step_ = step;
  checkpointed_ = std::max(0.0, productive_seconds);
  after_.clear();
}

void TrainingClock::SetState(control::v1::JobState state, absl::Time now) {
  if (!started_) {
    if (state == control::v1::JOB_STATE_RUNNING) started_ = now;
    return;
  }
  if (Counts(state)) {
    if (stopped_since_) stopped_ += std::max(absl::ZeroDuration(), now - *stopped_since_);
    stopped_since_.reset();
  } else if (!stopped_since_) {
    stopped_since_ = now;
  }
}

void TrainingClock::AddIteration(int64_t iteration, double seconds) {
  seconds = std::max(0.0, seconds);
  if (iteration < checkpoint_step_) {
    checkpointed_ += seconds;  // reported after the checkpoint that follows it
  } else {
    after_[iteration] = seconds;
  }
}

double TrainingClock::ProductiveBefore(int64_t step) const {
  double s = checkpointed_;
  for (auto it = after_.begin(); it != after_.end() && it->first < step; ++it) s += it->second;
  return s;
}

void TrainingClock::CheckpointComplete(int64_t step) {
  if (step <= checkpoint_step_) return;
  checkpointed_ = ProductiveBefore(step);
  after_.erase(after_.begin(), after_.lower_bound(step));
  checkpoint_step_ = step;
}

void TrainingClock::RollBack() { after_.clear(); }

control::v1::TrainingTime TrainingClock::Read(absl::Time now) const {
  control::v1::TrainingTime t;
  if (!started_) return t;
  const absl::Duration stopped =
      stopped_ + (stopped_since_ ? std::max(absl::ZeroDuration(), now - *stopped_since_)
                                 : absl::ZeroDuration());
  t.set_started_seconds(UnixSeconds(*started_));
  t.set_stopped_seconds(absl::ToDoubleSeconds(stopped));
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - *started_ - stopped));
  const double productive = ProductiveBefore(INT64_MAX);
  t.set_elapsed_seconds(elapsed);
  t.set_productive_seconds(productive);
  // A worker times its first iteration from before the job ran (it waits
  // for the assignment inside it): the ratio is capped at 1.
  t.set_effective_ratio(elapsed > 0 ? std::min(1.0, productive / elapsed) : 0);
  return t;
}

}  // namespace loom
