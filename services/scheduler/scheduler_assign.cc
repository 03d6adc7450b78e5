// Iteration assignments: computed ahead on the scheduler's own thread (the
// batch's metadata from loom-preprocess, then the solve) and handed out by
// GetAssignment, which never waits on loom-preprocess or a solver: it answers
// with the assignment, or UNAVAILABLE "...; retry" when the iteration is not
// computed yet.
#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "runtime/base/log.h"
#include "runtime/base/trace.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/scheduling/assign.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/grpc_status.h"
#include "services/common/job.h"
#include "services/scheduler/job_state.h"
#include "services/scheduler/scheduler_service.h"

namespace loom {

int64_t SchedulerServiceImpl::NextToComputeLocked() const {
  if (closing_ || wanted_ < 0 || state_ == control::v1::JOB_STATE_RECOVERING ||
      IsFinalJobState(state_)) {
    return -1;
  }
  int64_t next = std::max(newest_, start_iteration_ - 1);
  if (!ahead_.empty()) next = std::max(next, ahead_.rbegin()->first);
  ++next;
  const int64_t end = options_.job.train().steps();
  if ((end > 0 && next >= end) || (stop_at_ >= 0 && next >= stop_at_) ||
      compute_failed_.count(next) > 0) {
    return -1;
  }
  const int64_t limit = std::max(wanted_, std::max(newest_, start_iteration_ - 1) +
                                              static_cast<int64_t>(options_.assign_ahead));
  return next <= limit ? next : -1;
}

void SchedulerServiceImpl::AssignThread() {
  for (;;) {
    int64_t iteration = -1;
    int64_t generation = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!closing_ && (iteration = NextToComputeLocked()) < 0) changed_.Wait(&mu_);
      if (closing_) return;
      generation = generation_;
      computing_ = iteration;
    }
    bool retry = false;  // loom-preprocess had no batch yet: ask again
    absl::StatusOr<std::shared_ptr<Computed>> c = ComputeAssignment(iteration, generation, &retry);
    absl::MutexLock lock(&mu_);
    computing_ = -1;
    waiting_for_batch_ = false;
    changed_.SignalAll();
    if (generation != generation_ || retry) continue;  // a recovery abandoned it
    if (!c.ok()) {
      // A batch that no assignment can take (its tokens over the caps for
      // the microbatches, a sample over a cap, an ILP too large) gets the
      // same answer on every try: the job ends, saying why, instead of its
      // workers failing and being replaced.
      const absl::StatusCode code = c.status().code();
      if ((code == absl::StatusCode::kResourceExhausted ||
           code == absl::StatusCode::kInvalidArgument) &&
          !IsFinalJobState(state_)) {
        job_message_ =
            absl::StrCat("step ", iteration + 1, " has no assignment: ", c.status().message());
        LOOM_LOG(ERROR).With("step", iteration + 1) << job_message_;
        // Nothing from this iteration on (it is past every handed-out one).
        stop_at_ = stop_at_ < 0 ? iteration : std::min(stop_at_, iteration);
        SetStateLocked(control::v1::JOB_STATE_FAILED);
        continue;
      }
      LOOM_LOG(WARNING)
              .With("iteration", iteration)
              .With("error", std::string(c.status().message()))
          << "assignment not computed";
      compute_failed_[iteration] = c.status();  // the next caller hears it, then it is tried again
      continue;
    }
    ahead_[iteration] = *std::move(c);
  }
}

void SchedulerServiceImpl::LoadsOf(const data::v1::GetBatchResponse& batch, Computed* computed,
                                   std::vector<std::string>* keys,
                                   std::vector<sched::SampleLoad>* loads,
                                   scheduler::v1::Plan* plan) {
  for (const data::v1::SampleMetadata& m : batch.samples()) {
    sched::SampleShape s;
    for (int t : m.record().images()) s.tiles += t;
    s.image_tokens = m.record().image_tokens();
    s.text_tokens = m.record().text_tokens();
    s.output_images = m.record().output_images_size();
    s.query_tokens = m.record().query_tokens();
    computed->shapes.push_back(s);
    keys->push_back(m.record().key());
  }
  *plan = options_.plan;  // with the costs as refitted now, and the job's token caps
  plan->set_encoder_max_tokens(options_.job.parallel().encoder_max_tokens());
  plan->set_llm_max_tokens(options_.job.parallel().llm_max_tokens());
  plan->set_encoder_recompute(options_.job.recompute().encoder());
  plan->set_llm_recompute(options_.job.recompute().llm());
  absl::MutexLock lock(&mu_);
  *loads = costs_->Loads(computed->shapes, costs_->coefficients().transfer_per_image_token());
  *plan->mutable_costs() = costs_->coefficients();
  for (size_t i = 0; i < loads->size(); ++i) {
    (*loads)[i].encoder_tokens = int64_t{computed->shapes[i].tiles} * patches_per_tile_;
    (*loads)[i].llm_tokens = computed->shapes[i].length();
  }
}

absl::StatusOr<std::shared_ptr<SchedulerServiceImpl::Computed>>
SchedulerServiceImpl::ComputeAssignment(int64_t iteration, int64_t generation, bool* retry) {
  if (absl::Status s = RewindPreprocess(); !s.ok()) return s;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kComputeHold));
  ctx.set_wait_for_ready(true);  // loom-preprocess may be restarting at its address
  {
    absl::MutexLock lock(&mu_);
    if (closing_ || generation != generation_) {
      *retry = true;
      return absl::CancelledError("abandoned");
    }
    batch_call_ = &ctx;  // cancelled by a recovery or the service's end
    waiting_for_batch_ = true;
  }
  data::v1::GetBatchRequest request;
  request.set_iteration(iteration);
  data::v1::GetBatchResponse batch;
  grpc::Status got = preprocess_->GetBatch(&ctx, request, &batch);
  {
    absl::MutexLock lock(&mu_);
    batch_call_ = nullptr;
    waiting_for_batch_ = false;
    if (closing_ || generation != generation_) {
      *retry = true;
      return absl::CancelledError("abandoned");
    }
  }
  if (!got.ok()) {
    if (got.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {  // not prepared yet
      LOOM_LOG(INFO).With("iteration", iteration)
          << "loom-preprocess has not prepared the batch yet; asking again";
      *retry = true;
    }
    return FromGrpcStatus(got, "preprocess GetBatch");
  }
  auto computed = std::make_shared<Computed>();
  if (batch.has_next_cursor()) computed->next_cursor = batch.next_cursor().SerializeAsString();
  std::vector<std::string> keys;
  std::vector<sched::SampleLoad> loads;
  scheduler::v1::Plan plan;
  LoadsOf(batch, computed.get(), &keys, &loads, &plan);
  sched::PredictedIteration predicted;
  // An iteration this run assigned before (a restart or resume repeats it):
  // the same bins again, so it trains exactly as it did. Else a new one,
  // recorded before any worker sees it.
  absl::StatusOr<scheduler::v1::Assignment> a = RecordedAssignment(iteration, keys);
  const bool replayed = a.ok();
  if (!replayed) {
    a = sched::AssignForPlan(plan, keys, loads, options_.algorithm, options_.ilp_seconds,
                             options_.trace_dir.empty() ? nullptr : &predicted);
    if (!a.ok()) return a.status();
    a->set_iteration(iteration);
    if (absl::Status s = RecordAssignment(*a); !s.ok()) return s;
  }
  if (!options_.trace_dir.empty() && !replayed) {
    const bool first = !trace_named_.exchange(true);
    absl::Status s = trace::AppendLine(options_.trace_dir + "/predicted.jsonl",
                                       sched::PredictedTrace(predicted, iteration, first));
    if (!s.ok()) LOOM_LOG(WARNING).With("error", std::string(s.message())) << "trace";
  }
  a->set_iteration(iteration);
  computed->assignment = *std::move(a);
  assignments_->Increment();
  llm_imbalance_->Set(computed->assignment.summary().llm().max_over_lower_bound());
  encoder_imbalance_->Set(computed->assignment.summary().encoder().max_over_lower_bound());
  return computed;
}

absl::Status SchedulerServiceImpl::HandOutLocked(int64_t iteration) {
  auto a = ahead_.find(iteration);
  std::shared_ptr<Computed> computed = std::move(a->second);
  ahead_.erase(a);
  const int64_t generation = generation_;
  const int every = options_.job.checkpoint().every();
  const bool mark = checkpoint_requested_ || (every > 0 && (iteration + 1) % every == 0);
  checkpoint_requested_ = false;
  handing_out_ = iteration;
  absl::Cleanup handed = [this] {
    handing_out_ = -1;
    marking_step_ = 0;
    changed_.SignalAll();
  };
  if (mark) {
    // Before any worker can see the mark, outside the main lock
    // (handing_out_ keeps other callers of this iteration waiting): an empty
    // partial folder for the step, dropping whatever an interrupted earlier
    // write of it left.
    marking_step_ = iteration + 1;  // a CheckpointJob now gets this step
    mu_.Unlock();
    absl::Status s;
    {
      absl::MutexLock io(&step_io_mu_);
      s = BeginCheckpointStep(options_.job.checkpoint().dir(), iteration + 1);
    }
    mu_.Lock();
    if (!s.ok()) {
      if (generation == generation_ && !IsFinalJobState(state_)) {
        job_message_ = absl::StrCat("checkpoint ", iteration + 1, " cannot start: ", s.message());
        stop_at_ = newest_ + 1;
        SetStateLocked(control::v1::JOB_STATE_FAILED);
      }
      return s;
    }
  }
  // A recovery or a stop while the folder was made: the caller sees the
  // regroup or the end.
  if (generation != generation_ || (stop_at_ >= 0 && iteration >= stop_at_)) {
    return absl::OkStatus();
  }
  if (mark) {
    computed->assignment.set_checkpoint(true);
    checkpoint_steps_.insert(iteration + 1);
    // The step's data cursor, kept now: the workers may take any number of
    // iterations to write their parts, and by then the batch has left
    // loom-preprocess's window.
    if (!computed->next_cursor.empty()) {
      checkpoint_cursors_[iteration + 1] = computed->next_cursor;
    }
  }
  assignments_by_iteration_[iteration] = std::move(computed);
  newest_ = std::max(newest_, iteration);
  auto prune = [&](auto& by_iteration) {
    while (!by_iteration.empty() &&
           by_iteration.begin()->first <= newest_ - options_.retained_iterations) {
      by_iteration.erase(by_iteration.begin());
    }
  };
  prune(assignments_by_iteration_);
  prune(ahead_);  // computed, then skipped by the callers
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const SchedulerServiceImpl::Computed>>
SchedulerServiceImpl::AssignmentFor(int64_t iteration, int64_t generation, absl::Time deadline,
                                    absl::Time compute_deadline, std::string* ended,
                                    scheduler::v1::Regroup* regroup) {
  if (iteration < 0) {
    return absl::InvalidArgumentError(absl::StrCat("iteration: ", iteration, " is negative"));
  }
  const int64_t end = options_.job.train().steps();
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (generation < generation_) {  // that generation is over: where the next one starts
      *regroup = RegroupLocked();
      return std::shared_ptr<const Computed>();
    }
    if (absl::Status s = CheckGenerationLocked(generation); !s.ok()) return s;
    if (iteration < start_iteration_) {
      return absl::OutOfRangeError(absl::StrCat("iteration ", iteration, " is before iteration ",
                                                start_iteration_, ", where this job ",
                                                generation_ > 0 ? "recovered" : "resumed"));
    }
    if (end > 0 && iteration >= end) {
      *ended = absl::StrCat("the job ends after ", end, " iterations");
      return std::shared_ptr<const Computed>();
    }
    // Iterations already handed out are served whatever the state (every
    // worker of an iteration gets it); a new one waits out a pause and is
    // refused once the job was stopped.
    if (auto it = assignments_by_iteration_.find(iteration);
        it != assignments_by_iteration_.end()) {
      return std::shared_ptr<const Computed>(it->second);
    }
    if (iteration <= newest_ - options_.retained_iterations) {
      return absl::OutOfRangeError(absl::StrCat("iteration ", iteration,
                                                " left the window of the last ",
                                                options_.retained_iterations, " assignments"));
    }
    const int64_t newest = std::max(newest_, start_iteration_ - 1);
    if (iteration > newest + options_.retained_iterations) {
      return absl::OutOfRangeError(
          absl::StrCat("iteration ", iteration, " is more than ", options_.retained_iterations,
                       " iterations ahead of the newest assignment (", newest, ")"));
    }
    if (stop_at_ >= 0 && iteration >= stop_at_) {
      *ended = absl::StrCat("the job stopped before iteration ", iteration, ": ", job_message_);
      return std::shared_ptr<const Computed>();
    }
    if (auto f = compute_failed_.find(iteration); f != compute_failed_.end()) {
      absl::Status s = f->second;
      compute_failed_.erase(f);  // the next caller has it computed again
      changed_.SignalAll();
      return s;
    }
    if (iteration > wanted_) {
      wanted_ = iteration;
      changed_.SignalAll();  // the assignment thread
    }
    if (state_ == control::v1::JOB_STATE_PAUSED || state_ == control::v1::JOB_STATE_RECOVERING) {
      if (absl::Now() >= deadline) {
        if (state_ == control::v1::JOB_STATE_PAUSED) {
          return absl::UnavailableError("the job is paused; retry");
        }
        // The lost process is being replaced (or every process restarted
        // from the newest complete checkpoint); until then nothing new is
        // handed out.
        return absl::UnavailableError(
            absl::StrCat("the job is recovering (", job_message_, "); retry"));
      }
      ++paused_requests_;  // held by the pause while it waits here
      changed_.WaitWithDeadline(&mu_, deadline);
      --paused_requests_;
      continue;
    }
    if (!preprocess_) {
      return absl::FailedPreconditionError("no preprocess service (--preprocess) to read batches");
    }
    if (ahead_.count(iteration) > 0 && handing_out_ < 0) {
      if (absl::Status s = HandOutLocked(iteration); !s.ok()) return s;
      continue;
    }
    if (absl::Now() >= compute_deadline) {
      // Never past the caller's deadline: the batch (or a long solve ahead
      // of it) costs time, not the job.
      return absl::UnavailableError(
          absl::StrCat("iteration ", iteration, ": its assignment is not computed yet (",
                       computing_ == iteration && waiting_for_batch_
                           ? "loom-preprocess has not prepared its batch yet"
                       : computing_ >= 0 ? absl::StrCat("computing iteration ", computing_)
                                         : std::string("the assignment thread is behind"),
                       "); retry"));
    }
    changed_.WaitWithDeadline(&mu_, compute_deadline);
  }
}

absl::StatusOr<std::shared_ptr<const SchedulerServiceImpl::Computed>>
SchedulerServiceImpl::ValidationAssignment(int64_t index, int64_t generation, absl::Time deadline,
                                           scheduler::v1::Regroup* regroup) {
  const int batches = ValidationBatches(options_.job);
  if (batches == 0) {
    return absl::FailedPreconditionError("validation: the job has no data.validation");
  }
  if (index < 0 || index >= batches) {
    return absl::InvalidArgumentError(
        absl::StrCat("iteration: validation batch ", index, " is outside 0 to ", batches - 1));
  }
  if (!preprocess_) {
    return absl::FailedPreconditionError("no preprocess service (--preprocess) to read batches");
  }
  {
    absl::MutexLock lock(&mu_);
    for (;;) {
      if (generation < generation_) {
        *regroup = RegroupLocked();
        return std::shared_ptr<const Computed>();
      }
      if (absl::Status s = CheckGenerationLocked(generation); !s.ok()) return s;
      if (auto it = validation_assignments_.find(index); it != validation_assignments_.end()) {
        return it->second;
      }
      if (validation_computing_.count(index) == 0) break;  // this caller computes it
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(
            absl::StrCat("validation batch ", index, ": being assigned; retry"));
      }
      changed_.WaitWithDeadline(&mu_, deadline);
    }
    validation_computing_.insert(index);
  }
  absl::Cleanup done = [&] {
    absl::MutexLock lock(&mu_);
    validation_computing_.erase(index);
    changed_.SignalAll();
  };
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ctx.set_wait_for_ready(true);
  data::v1::GetBatchRequest request;
  request.set_iteration(index);
  request.set_validation(true);
  data::v1::GetBatchResponse batch;
  if (grpc::Status got = preprocess_->GetBatch(&ctx, request, &batch); !got.ok()) {
    if (got.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::UnavailableError(absl::StrCat(
          "validation batch ", index, ": loom-preprocess has not prepared it yet; retry"));
    }
    return FromGrpcStatus(got, "preprocess GetBatch (validation)");
  }
  auto computed = std::make_shared<Computed>();
  std::vector<std::string> keys;
  std::vector<sched::SampleLoad> loads;
  scheduler::v1::Plan plan;
  LoadsOf(batch, computed.get(), &keys, &loads, &plan);
  absl::StatusOr<scheduler::v1::Assignment> a =
      sched::AssignForPlan(plan, keys, loads, options_.algorithm, options_.ilp_seconds, nullptr);
  if (!a.ok()) return a.status();
  a->set_iteration(index);
  computed->assignment = *std::move(a);
  absl::MutexLock lock(&mu_);
  validation_assignments_[index] = computed;
  return std::shared_ptr<const Computed>(computed);
}

grpc::Status SchedulerServiceImpl::GetAssignment(grpc::ServerContext* context,
                                                 const scheduler::v1::GetAssignmentRequest* request,
                                                 scheduler::v1::GetAssignmentResponse* response) {
  if (absl::Status s = Configured(); !s.ok()) return ToGrpcStatus(s);
  const absl::Time start = absl::Now();
  auto answered = absl::MakeCleanup(
      [&] { get_assignment_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start)); });
  // A paused job holds the call until a second before the caller's deadline
  // (at most pause_hold); the caller retries the UNAVAILABLE that follows.
  // An iteration not computed yet likewise, at most kComputeHold.
  const absl::Time answer_by = absl::FromChrono(context->deadline()) - absl::Seconds(1);
  const absl::Time deadline = std::min(answer_by, absl::Now() + options_.pause_hold);
  const absl::Time compute_deadline = std::min(answer_by, absl::Now() + kComputeHold);
  std::string ended;
  scheduler::v1::Regroup regroup;
  absl::StatusOr<std::shared_ptr<const Computed>> c =
      request->validation() ? ValidationAssignment(request->iteration(), request->generation(),
                                                   compute_deadline, &regroup)
                            : AssignmentFor(request->iteration(), request->generation(), deadline,
                                            compute_deadline, &ended, &regroup);
  if (!c.ok()) return ToGrpcStatus(c.status());
  if (*c == nullptr) {
    if (ended.empty()) {
      *response->mutable_regroup() = regroup;
    } else {
      response->set_job_ended(ended);
    }
    return grpc::Status::OK;
  }
  *response->mutable_assignment() = (*c)->assignment;
  return grpc::Status::OK;
}

}  // namespace loom
