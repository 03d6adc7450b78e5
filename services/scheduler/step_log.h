// Every step the job reports, kept for people following the run: one JSON
// line per step in <dir>/metrics.jsonl (started afresh by a new job,
// appended to by a resumed one or a scheduler that takes the job back) and
// TensorBoard scalars in <dir>/tensorboard/<run>/events.out.tfevents.<unix
// seconds>.<host>.<pid>[.N] (a file per scheduler process; TensorBoard reads
// a folder's files together as one run, and shows each <run> folder as a
// run of its own). A step replayed after a recovery appears again.
#ifndef LOOM_SERVICES_SCHEDULER_STEP_LOG_H_
#define LOOM_SERVICES_SCHEDULER_STEP_LOG_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loom/scheduler/v1/scheduler.pb.h"
#include "runtime/base/tfrecord.h"

namespace loom {

class StepLog {
 public:
  // Makes <dir>/tensorboard/<run> and writes the events file's first event
  // (file_version "brain.Event:2"); `fresh` empties metrics.jsonl.
  static absl::StatusOr<std::unique_ptr<StepLog>> Open(const std::string& dir,
                                                       const std::string& run, bool fresh);

  // Thread-safe. The tags: train/loss, train/grad_norm, train/lr,
  // train/step_seconds, train/tokens_per_second, train/samples,
  // train/loss_tokens; each at step iteration + 1.
  absl::Status Append(const scheduler::v1::StepReport& step, absl::Time at);

  const std::string& metrics_path() const { return metrics_path_; }
  const std::string& events_path() const { return events_.path(); }

 private:
  StepLog(std::string metrics_path, TfRecordWriter events)
      : metrics_path_(std::move(metrics_path)), events_(std::move(events)) {}
  const std::string metrics_path_;
  absl::Mutex mu_;
  TfRecordWriter events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_STEP_LOG_H_
