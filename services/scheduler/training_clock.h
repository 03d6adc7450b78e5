// The job's effective-training-time clock (control::v1::TrainingTime): how
// long the job has run and how much of that went into iterations it kept.
// A recovery rolls back to the newest complete checkpoint, so the
// iterations after it stop counting (they are trained again), while the
// time they took, and the recovery's, stays in the elapsed time.
#ifndef LOOM_SERVICES_SCHEDULER_TRAINING_CLOCK_H_
#define LOOM_SERVICES_SCHEDULER_TRAINING_CLOCK_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/time/time.h"
#include "loom/control/v1/control.pb.h"

namespace loom {

// Not thread-safe: the scheduler holds its mutex around every call.
class TrainingClock {
 public:
  // Goes on with an earlier attempt's clock (`kept`, whose started_seconds
  // and stopped_seconds count) from checkpoint `step` (0: the start), before
  // which the job had trained `productive_seconds`.
  void Continue(const control::v1::TrainingTime& kept, int64_t step, double productive_seconds);
  // The job turned `state` at `now`: the clock starts at the first RUNNING
  // and stands still while the job is PAUSED or has ended.
  void SetState(control::v1::JobState state, absl::Time now);
  // Iteration `iteration` (counted from 0) took `seconds`.
  void AddIteration(int64_t iteration, double seconds);
  // The productive seconds of the iterations before `step`, as far as
  // reported (what checkpoint `step` records).
  double ProductiveBefore(int64_t step) const;
  // Checkpoint `step` is complete: what a rollback returns to.
  void CheckpointComplete(int64_t step);
  // A recovery rolls back to the newest complete checkpoint (or to where
  // this attempt started): the iterations after it are lost.
  void RollBack();
  control::v1::TrainingTime Read(absl::Time now) const;

 private:
  std::optional<absl::Time> started_;
  absl::Duration stopped_;
  std::optional<absl::Time> stopped_since_;  // standing still from then on
  int64_t checkpoint_step_ = 0;
  double checkpointed_ = 0;          // productive seconds before checkpoint_step_
  std::map<int64_t, double> after_;  // iteration -> seconds, from checkpoint_step_ on
};

// Where a checkpoint records the productive seconds before it:
// DIR/step-N/<kTrainingTimeFile>, a control::v1::TrainingTime.
inline constexpr char kTrainingTimeFile[] = "scheduler_training_time.binpb";

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_TRAINING_CLOCK_H_
