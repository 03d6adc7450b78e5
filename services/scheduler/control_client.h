// A client of loom.control.v1 (loomctl, loom up): every call with a
// deadline, errors as absl::Status with gRPC's code and the server's message;
// credentials from the process's ClientSecurity() (security.h).
#ifndef LOOM_SERVICES_SCHEDULER_CONTROL_CLIENT_H_
#define LOOM_SERVICES_SCHEDULER_CONTROL_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "loom/control/v1/control.grpc.pb.h"
#include "services/scheduler/job_state.h"

namespace loom {

class ControlClient {
 public:
  // `deadline` bounds each unary call.
  explicit ControlClient(const std::string& target, absl::Duration deadline = absl::Seconds(10));

  absl::StatusOr<control::v1::Job> Submit(const control::v1::JobSpec& spec);
  absl::StatusOr<control::v1::Job> Get(const std::string& job_id);
  absl::StatusOr<control::v1::Job> Pause(const std::string& job_id);
  absl::StatusOr<control::v1::Job> Resume(const std::string& job_id);
  // *step: where the checkpoint was placed (0: after the next iteration).
  absl::StatusOr<control::v1::Job> Checkpoint(const std::string& job_id, int64_t* step);
  absl::StatusOr<control::v1::Job> Cancel(const std::string& job_id, const std::string& reason);

  // Calls `on_event` for each event of WatchJob until the job reaches a
  // final state (OK), `on_event` returns false (OK), `*stop` turns true
  // (CANCELLED), or `wait` passes (DEADLINE_EXCEEDED). Streams carry a
  // deadline of at most `stream_deadline` and are reopened; what happened
  // between two streams arrives as steps replayed and the snapshot's
  // differences (state, newest checkpoint) as KIND_STATE / KIND_CHECKPOINT.
  absl::Status Watch(const std::string& job_id, int64_t after_iteration,
                     const std::function<bool(const control::v1::JobEvent&)>& on_event,
                     absl::Duration wait, const std::atomic<bool>* stop = nullptr,
                     absl::Duration stream_deadline = absl::Minutes(10));

 private:
  std::unique_ptr<control::v1::ControlService::Stub> stub_;
  absl::Duration deadline_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_CONTROL_CLIENT_H_
