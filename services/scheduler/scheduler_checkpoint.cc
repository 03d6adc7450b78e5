// The scheduler's part of a coordinated checkpoint: every worker reports its
// part of step N; the last report completes the step (preprocess cursor,
// cost model, then the rename into place: runtime/checkpoint/steps.h).
#include <chrono>

#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "runtime/base/file.h"
#include "runtime/checkpoint/steps.h"
#include "services/common/grpc_status.h"
#include "services/scheduler/scheduler_service.h"

namespace loom {

grpc::Status SchedulerServiceImpl::ReportCheckpoint(
    grpc::ServerContext*, const scheduler::v1::ReportCheckpointRequest* request,
    scheduler::v1::ReportCheckpointResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = ValidateWorkerId(request->role(), request->rank()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  const int64_t step = request->step();
  const int parts = options_.plan.encoder().gpus() + options_.plan.llm().gpus();
  {
    absl::MutexLock lock(&mu_);
    if (!IsCheckpointStep(step)) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("step: ", step, " is not a checkpoint step of this job (checkpoint.every = ",
                       options_.job.checkpoint().every(), ", none requested there)")));
    }
    if (step <= last_checkpoint_) {
      return ToGrpcStatus(absl::AlreadyExistsError(
          absl::StrCat("step: checkpoint ", step, " is already complete")));
    }
    auto& reported = checkpoint_parts_[step];
    checkpoint_started_.try_emplace(step, absl::Now());
    reported.insert({request->role(), request->rank()});
    if (static_cast<int>(reported.size()) < parts) return grpc::Status::OK;
    checkpoint_parts_.erase(step);
  }
  if (absl::Status s = CompleteCheckpoint(step); !s.ok()) {
    absl::MutexLock lock(&mu_);
    job_message_ = absl::StrCat("checkpoint ", step, " failed: ", s.message());
    stop_at_ = newest_ + 1;
    SetStateLocked(control::v1::JOB_STATE_FAILED);
    return ToGrpcStatus(s);
  }
  checkpoints_->Increment();
  response->set_complete(true);
  absl::MutexLock lock(&mu_);
  if (auto t = checkpoint_started_.find(step); t != checkpoint_started_.end()) {
    checkpoint_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - t->second));
    checkpoint_started_.erase(t);
  }
  last_checkpoint_ = std::max(last_checkpoint_, step);
  checkpoint_steps_.erase(step);
  AddEventLocked(control::v1::JobEvent::KIND_CHECKPOINT, nullptr, step);
  MaybeSucceedLocked();
  return grpc::Status::OK;
}

absl::Status SchedulerServiceImpl::CompleteCheckpoint(int64_t step) {
  // Every worker wrote its part into the partial folder; the scheduler adds
  // its own and renames the folder into place (runtime/checkpoint/steps.h).
  const std::string dir = PartialStepDir(options_.job.checkpoint().dir(), step);
  if (!preprocess_) {
    return absl::FailedPreconditionError("no preprocess service to read the data cursor from");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  data::v1::GetCursorRequest request;
  request.set_iteration(step);  // the cursor before batch `step`: where a resume starts
  data::v1::GetCursorResponse cursor;
  if (grpc::Status s = preprocess_->GetCursor(&ctx, request, &cursor); !s.ok()) {
    return FromGrpcStatus(s, "preprocess GetCursor");
  }
  absl::Status s = WriteFileAtomically(absl::StrCat(dir, "/", kDataCursorFile),
                                       cursor.cursor().SerializeAsString());
  std::string costs;
  {
    absl::MutexLock lock(&mu_);
    costs = costs_->coefficients().SerializeAsString();
  }
  if (s.ok()) s = WriteFileAtomically(absl::StrCat(dir, "/", kSchedulerStateFile), costs);
  // Every part is durable: the step becomes visible, complete.
  if (s.ok()) s = CommitCheckpointStep(options_.job.checkpoint().dir(), step, options_.run);
  return s;
}

}  // namespace loom
