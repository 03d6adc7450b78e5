// SchedulerServiceImpl's job lifecycle (behind loom.control.v1): the job's
// state and its transitions, the event log WatchJob reads, and the
// pause / checkpoint / cancel requests that GetAssignment acts on
// (scheduler_service.cc holds the workers' RPCs).
#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/grpc_status.h"
#include "services/scheduler/job_state.h"
#include "services/scheduler/scheduler_service.h"

namespace loom {

namespace {

constexpr size_t kRetainedEvents = 10000;

}  // namespace

control::v1::Job SchedulerServiceImpl::JobLocked() const {
  control::v1::Job j;
  j.set_job_id(options_.job.name());
  j.set_state(state_);
  *j.mutable_config() = options_.job;
  j.set_start_iteration(start_iteration_);
  j.set_end_iteration(options_.job.train().steps());
  j.set_completed_iterations(steps_.empty() ? start_iteration_ : steps_.back().iteration() + 1);
  j.set_last_checkpoint(last_checkpoint_);
  j.set_pending_checkpoint(checkpoint_steps_.empty() ? 0 : *checkpoint_steps_.begin());
  j.set_workers_registered(static_cast<int>(workers_.size()));
  j.set_workers_expected(sched::PlanWorkerRanks(options_.plan));
  if (!steps_.empty()) *j.mutable_last_step() = steps_.back();
  j.set_message(job_message_);
  j.set_submit_time_seconds(submit_time_);
  j.set_assigned_iterations(std::max(newest_ + 1, start_iteration_));
  j.set_paused_requests(state_ == control::v1::JOB_STATE_PAUSED ? paused_requests_ : 0);
  j.set_restarts(RestartsLocked());
  j.set_generation(generation_);
  *j.mutable_training_time() = clock_.Read(absl::Now());
  j.set_tokens_seen(tokens_seen_);
  const int64_t left = options_.job.train().steps() - j.completed_iterations();
  if (options_.job.train().steps() > 0 && left > 0 && step_interval_ > 0 &&
      state_ == control::v1::JOB_STATE_RUNNING) {
    j.set_eta_seconds(static_cast<double>(left) * step_interval_);
  }
  if (state_ == control::v1::JOB_STATE_RECOVERING || generation_ > 0) {
    *j.mutable_recovery() = recovery_;
  } else if (options_.recovered_from.declared_seconds() > 0) {
    *j.mutable_recovery() = options_.recovered_from;
  }
  return j;
}

int SchedulerServiceImpl::RestartsLocked() const {
  return options_.restarts + static_cast<int>(generation_ - options_.generation);
}

void SchedulerServiceImpl::AddEventLocked(control::v1::JobEvent::Kind kind,
                                          const scheduler::v1::StepReport* step,
                                          int64_t checkpoint_step) {
  control::v1::JobEvent e;
  e.set_kind(kind);
  *e.mutable_job() = JobLocked();
  if (step != nullptr) *e.mutable_step() = *step;
  e.set_checkpoint_step(checkpoint_step);
  events_.emplace_back(++event_seq_, std::move(e));
  if (events_.size() > kRetainedEvents) events_.pop_front();
  changed_.SignalAll();
}

void SchedulerServiceImpl::SetStateLocked(control::v1::JobState state) {
  if (state_ == state) return;
  LOOM_LOG(INFO).With("job", options_.job.name()).With("from", JobStateName(state_))
      << "job " << JobStateName(state);
  state_ = state;
  clock_.SetState(state, absl::Now());
  KeepJobLocked();  // the clock started or stopped
  AddEventLocked(control::v1::JobEvent::KIND_STATE, nullptr, 0);
}

void SchedulerServiceImpl::MaybeSucceedLocked() {
  const int64_t end = options_.job.train().steps();
  if (end <= 0 || IsFinalJobState(state_) || steps_.empty() || steps_.back().iteration() + 1 < end)
    return;
  // The last checkpoint is still being written or completed.
  if (!checkpoint_steps_.empty() || !completing_.empty()) return;
  SetStateLocked(control::v1::JOB_STATE_SUCCEEDED);
}

bool SchedulerServiceImpl::IsCheckpointStep(int64_t step) const {
  const int every = options_.job.checkpoint().every();
  return step > 0 && ((every > 0 && step % every == 0) || checkpoint_steps_.count(step) > 0);
}

absl::Status SchedulerServiceImpl::FindJobLocked(const std::string& job_id) const {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: empty");
  if (!configured_.load() || options_.job.name() != job_id) {
    return absl::NotFoundError(absl::StrCat("job_id: no job \"", job_id, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<control::v1::Job> SchedulerServiceImpl::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindJobLocked(job_id); !s.ok()) return s;
  return JobLocked();
}

SchedulerServiceImpl::JobEnd SchedulerServiceImpl::JobEndProgress() const {
  JobEnd e;
  if (!configured_.load()) return e;
  absl::MutexLock lock(&mu_);
  e.final = IsFinalJobState(state_);
  e.failed = state_ == control::v1::JOB_STATE_FAILED;
  e.job_id = options_.job.name();
  e.state = JobStateName(state_);
  e.ranks = sched::PlanWorkerRanks(options_.plan);
  e.done = static_cast<int>(done_.size());
  return e;
}

grpc::Status SchedulerServiceImpl::ReportDone(grpc::ServerContext*,
                                              const scheduler::v1::ReportDoneRequest* request,
                                              scheduler::v1::ReportDoneResponse*) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  // After job_ended; the job may turn final a moment later (the last
  // checkpoint's other parts): counted either way.
  absl::MutexLock lock(&mu_);
  done_.insert({request->role(), request->rank()});
  return grpc::Status::OK;
}

absl::Status SchedulerServiceImpl::EndPreprocess(const JobEnd& end) {
  if (preprocess_ == nullptr) return absl::OkStatus();
  data::v1::EndJobRequest request;
  request.set_job_id(end.job_id);
  request.set_state(end.state);
  data::v1::EndJobResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  if (grpc::Status s = preprocess_->EndJob(&ctx, request, &response); !s.ok()) {
    return FromGrpcStatus(s, "loom-preprocess EndJob");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, control::v1::Job>> SchedulerServiceImpl::Snapshot(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindJobLocked(job_id); !s.ok()) return s;
  return std::make_pair(event_seq_, JobLocked());
}

absl::StatusOr<control::v1::Job> SchedulerServiceImpl::PauseJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindJobLocked(job_id); !s.ok()) return s;
  if (state_ != control::v1::JOB_STATE_RUNNING && state_ != control::v1::JOB_STATE_PENDING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is ", JobStateName(state_),
                     "; only a RUNNING or PENDING job can be paused"));
  }
  SetStateLocked(control::v1::JOB_STATE_PAUSED);
  return JobLocked();
}

absl::StatusOr<control::v1::Job> SchedulerServiceImpl::ResumeJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindJobLocked(job_id); !s.ok()) return s;
  if (state_ != control::v1::JOB_STATE_PAUSED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_id, "\" is ", JobStateName(state_), "; only a PAUSED job can be resumed"));
  }
  const bool all = static_cast<int>(workers_.size()) == sched::PlanWorkerRanks(options_.plan);
  SetStateLocked(all ? control::v1::JOB_STATE_RUNNING : control::v1::JOB_STATE_PENDING);
  return JobLocked();
}

absl::StatusOr<control::v1::Job> SchedulerServiceImpl::CancelJob(const std::string& job_id,
                                                                 const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindJobLocked(job_id); !s.ok()) return s;
  if (IsFinalJobState(state_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" is already ", JobStateName(state_)));
  }
  job_message_ = reason.empty() ? "cancelled by CancelJob" : reason;
  stop_at_ = std::max(newest_ + 1, start_iteration_);
  SetStateLocked(control::v1::JOB_STATE_CANCELLED);
  return JobLocked();
}

absl::StatusOr<control::v1::Job> SchedulerServiceImpl::CheckpointJob(const std::string& job_id,
                                                                     int64_t* step) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = FindJobLocked(job_id); !s.ok()) return s;
  if (state_ != control::v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", job_id, "\" is ", JobStateName(state_), "; only a RUNNING job can checkpoint"));
  }
  if (marking_step_ > 0) {  // a mark is being placed right now: it serves this request
    *step = marking_step_;
    return JobLocked();
  }
  // The mark goes on the next iteration handed out; the checkpoint follows it.
  const int64_t next = std::max({newest_ + 1, start_iteration_, handing_out_ + 1});
  const int64_t end = options_.job.train().steps();
  if (end > 0 && next >= end) {
    return absl::FailedPreconditionError(
        absl::StrCat("job \"", job_id, "\" has handed out its last iteration (", end,
                     "); its final checkpoint, if any, is already on its way"));
  }
  checkpoint_requested_ = true;
  *step = next + 1;
  return JobLocked();
}

std::vector<std::pair<int64_t, control::v1::JobEvent>> SchedulerServiceImpl::EventsAfter(
    int64_t after_seq, absl::Duration wait) const {
  absl::MutexLock lock(&mu_);
  const absl::Time until = absl::Now() + wait;
  while (event_seq_ <= after_seq && absl::Now() < until) changed_.WaitWithDeadline(&mu_, until);
  std::vector<std::pair<int64_t, control::v1::JobEvent>> out;
  for (const auto& e : events_) {
    if (e.first > after_seq) out.push_back(e);
  }
  return out;
}

}  // namespace loom
