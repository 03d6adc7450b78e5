// The scheduler's part of a coordinated checkpoint: every worker reports its
// part of step N; after the last report the scheduler's checkpoint thread
// completes the step (what each module's parts hold into its manifest,
// preprocess cursor, cost model, the productive time before it, then the
// rename into place: runtime/checkpoint/steps.h). And
// the assignments recorded since the newest complete step, which a restart
// from it replays.
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/model/config.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/grpc_status.h"
#include "services/scheduler/job_state.h"
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
  const int parts = sched::PlanWorkerRanks(options_.plan);
  bool first = false, last = true;
  // Taken with the last part, before a loss declared meanwhile rolls the
  // clock back: every iteration before the step is reported by then (LLM
  // rank 0 reports its step before its part).
  double productive_before = 0;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckGenerationLocked(request->generation()); !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (absl::Status s =
            CheckHolderLocked(request->role(), request->rank(), request->incarnation());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
    if (!IsCheckpointStep(step)) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("step: ", step, " is not a checkpoint step of this job (checkpoint.every = ",
                       options_.job.checkpoint().every(), ", none requested there)")));
    }
    if (step <= last_checkpoint_ || completing_.count(step) > 0) {
      return ToGrpcStatus(absl::AlreadyExistsError(
          absl::StrCat("step: checkpoint ", step, " is already ",
                       step <= last_checkpoint_ ? "complete" : "reported by every worker")));
    }
    auto& reported = checkpoint_parts_[step];
    first = checkpoint_started_.try_emplace(step, absl::Now()).second;
    reported.insert({request->role(), request->rank()});
    if (static_cast<int>(reported.size()) < parts) {
      last = false;
    } else {
      checkpoint_parts_.erase(step);
      productive_before = clock_.ProductiveBefore(step);
    }
  }
  if (!first && !last) return grpc::Status::OK;
  // The cursor (kept when the step was marked: HandOutLocked; else read at
  // the first part) and the completion (at the last) are the scheduler's own
  // thread's work, done in order: no worker's call waits on loom-preprocess
  // or the disk.
  absl::MutexLock lock(&mu_);
  checkpoint_work_.push_back({step, request->generation(), productive_before, last});
  if (last) completing_.insert(step);
  if (!checkpointer_.joinable()) checkpointer_ = std::thread([this] { CheckpointThread(); });
  changed_.SignalAll();
  response->set_complete(last);
  return grpc::Status::OK;
}

void SchedulerServiceImpl::CheckpointThread() {
  for (;;) {
    CheckpointWork work;
    {
      absl::MutexLock lock(&mu_);
      while (!closing_ && checkpoint_work_.empty()) changed_.Wait(&mu_);
      if (closing_) return;
      work = checkpoint_work_.front();
      checkpoint_work_.pop_front();
    }
    if (!work.complete) {
      {
        absl::MutexLock lock(&mu_);
        if (checkpoint_cursors_.count(work.step) > 0) continue;  // kept at the mark
      }
      // Kept for the completion; a failure here is retried then.
      absl::StatusOr<std::string> cursor = ReadCursor(work.step);
      absl::MutexLock lock(&mu_);
      if (cursor.ok() && checkpoint_started_.count(work.step) > 0) {
        checkpoint_cursors_[work.step] = *std::move(cursor);
      }
      continue;
    }
    absl::Status s = CompleteCheckpoint(work.step, work.generation, work.productive_before);
    if (s.ok()) checkpoints_->Increment();
    absl::MutexLock lock(&mu_);
    completing_.erase(work.step);
    if (!s.ok()) {
      // A recovery began meanwhile: it abandoned this checkpoint, not the job.
      if (generation_ == work.generation && !IsFinalJobState(state_)) {
        LOOM_LOG(ERROR).With("step", work.step) << "checkpoint failed: " << s.message();
        job_message_ = absl::StrCat("checkpoint ", work.step, " failed: ", s.message());
        stop_at_ = newest_ + 1;
        SetStateLocked(control::v1::JOB_STATE_FAILED);
      }
      changed_.SignalAll();
      continue;
    }
    if (auto t = checkpoint_started_.find(work.step); t != checkpoint_started_.end()) {
      checkpoint_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - t->second));
      checkpoint_started_.erase(t);
    }
    checkpoint_steps_.erase(work.step);
    AddEventLocked(control::v1::JobEvent::KIND_CHECKPOINT, nullptr, work.step);
    MaybeSucceedLocked();
    changed_.SignalAll();
  }
}

void SchedulerServiceImpl::ContinueClockLocked() {
  const control::v1::TrainingTime& kept = options_.spec.training_time();
  if (kept.started_seconds() <= 0) return;  // a new job: the clock starts when it runs
  control::v1::TrainingTime at;
  if (start_iteration_ > 0) {
    const std::string path = absl::StrCat(
        StepDir(options_.job.checkpoint().dir(), start_iteration_), "/", kTrainingTimeFile);
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok() || !at.ParseFromString(*bytes)) {
      LOOM_LOG(WARNING).With("file", path)
          << "no productive time recorded before this checkpoint: counting from 0";
      at.Clear();
    }
  }
  clock_.Continue(kept, start_iteration_, at.productive_seconds());
  LOOM_LOG(INFO)
          .With("started_seconds", kept.started_seconds())
          .With("stopped_seconds", kept.stopped_seconds())
          .With("step", start_iteration_)
          .With("productive_seconds", at.productive_seconds())
      << "training clock continued";
}

absl::StatusOr<std::string> SchedulerServiceImpl::ReadCursor(int64_t step) {
  if (!preprocess_) {
    return absl::FailedPreconditionError("no preprocess service to read the data cursor from");
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(true);  // loom-preprocess may be restarting at its address
  data::v1::GetCursorRequest request;
  request.set_iteration(step);  // the cursor before batch `step`: where a resume starts
  data::v1::GetCursorResponse cursor;
  if (grpc::Status s = preprocess_->GetCursor(&ctx, request, &cursor); !s.ok()) {
    return FromGrpcStatus(s, "preprocess GetCursor");
  }
  return cursor.cursor().SerializeAsString();
}

absl::Status SchedulerServiceImpl::CompleteCheckpoint(int64_t step, int64_t generation,
                                                      double productive_before) {
  // Every worker wrote its part into the partial folder; the scheduler adds
  // its own and renames the folder into place (runtime/checkpoint/steps.h).
  const std::string dir = PartialStepDir(options_.job.checkpoint().dir(), step);
  std::string cursor;
  bool read_before = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = checkpoint_cursors_.find(step); it != checkpoint_cursors_.end()) {
      cursor = std::move(it->second);
      read_before = true;
      checkpoint_cursors_.erase(it);
    }
  }
  // loom-preprocess may be busy or stopped for a while: asked again until
  // it answers, or a recovery (it was lost) abandons this checkpoint.
  while (!read_before) {
    absl::StatusOr<std::string> read = ReadCursor(step);
    if (read.ok()) {
      cursor = *std::move(read);
      break;
    }
    const absl::StatusCode code = read.status().code();
    absl::MutexLock lock(&mu_);
    if ((code != absl::StatusCode::kDeadlineExceeded && code != absl::StatusCode::kUnavailable) ||
        generation_ != generation || closing_ || IsFinalJobState(state_)) {
      return read.status();
    }
  }
  // Each module's manifest, written by a worker that knew its parts' names
  // only, gets what each part holds (runtime/checkpoint/checkpoint.h): every
  // header read here once, one file at a time, so a load opens only the
  // parts that hold its rank's slices.
  absl::Status s;
  for (const char* module : kCheckpointSets) {
    std::error_code ec;
    if (!s.ok() || !std::filesystem::exists(ModuleManifestPath(dir, module), ec)) continue;
    s = DescribeModuleParts(dir, module);
  }
  if (s.ok()) s = WriteFileAtomically(absl::StrCat(dir, "/", kDataCursorFile), cursor);
  std::string costs;
  control::v1::TrainingTime before;  // what a restart from this step continues with
  before.set_productive_seconds(productive_before);
  {
    absl::MutexLock lock(&mu_);
    costs = costs_->coefficients().SerializeAsString();
  }
  if (s.ok()) s = WriteFileAtomically(absl::StrCat(dir, "/", kSchedulerStateFile), costs);
  if (s.ok()) {
    s = WriteFileAtomically(absl::StrCat(dir, "/", kTrainingTimeFile), before.SerializeAsString());
  }
  // Every part is durable: the step becomes visible, complete - unless a
  // recovery began since its last part. That rolled the job back before
  // this step, and the new generation writes it again: a step completed
  // from the old one's iterations would be trained twice over, and the
  // time of either attempt would be the one kept.
  //
  // The commit's fsyncs and renames run outside the main lock (slow shared
  // storage never holds up an RPC), under step_io_mu_, so the next
  // generation cannot start this step's partial folder meanwhile. A recovery
  // declared during the commit is seen after it: the step on disk is then a
  // complete, correct state of the same training (every part was written
  // after the same iterations), but the job continues from the step the
  // recovery chose, and the new generation writes this one again.
  if (s.ok()) {
    absl::MutexLock io(&step_io_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (generation_ != generation) {
        return absl::AbortedError(absl::StrCat("checkpoint ", step, " of generation ", generation,
                                               " abandoned: the job recovered in place (now ",
                                               generation_, ")"));
      }
    }
    s = CommitCheckpointStep(options_.job.checkpoint().dir(), step, options_.run);
  }
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    if (generation_ != generation) {
      return absl::AbortedError(absl::StrCat("checkpoint ", step, " of generation ", generation,
                                             " written, but the job recovered in place meanwhile "
                                             "(now ",
                                             generation_, "); it continues from an earlier step"));
    }
    last_checkpoint_ = std::max(last_checkpoint_, step);
    clock_.CheckpointComplete(step);
    KeepJobLocked();
  }
  if (s.ok()) PruneRecordedAssignments(step);
  if (s.ok()) {
    LOOM_LOG(INFO).With("step", step).With("productive_seconds", productive_before)
        << "checkpoint complete";
  }
  return s;
}

namespace {

std::string RecordsDir(const std::string& checkpoint_dir, const std::string& run) {
  return absl::StrCat(checkpoint_dir, "/assignments/", run);
}

}  // namespace

absl::StatusOr<scheduler::v1::Assignment> SchedulerServiceImpl::RecordedAssignment(
    int64_t iteration, const std::vector<std::string>& keys) const {
  const std::string path = absl::StrCat(
      RecordsDir(options_.job.checkpoint().dir(), options_.run.id), "/", iteration, ".binpb");
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return absl::NotFoundError(path);
  scheduler::v1::Assignment a;
  // It must be this iteration's, for this plan's ranks and microbatches, and
  // hold exactly this batch's samples where it says (a resume may change
  // the degrees: then the iteration is assigned again).
  bool fits = a.ParseFromString(*bytes) && a.iteration() == iteration &&
              a.bins_size() == options_.plan.llm().dp() * options_.plan.microbatches();
  std::vector<int> seen(keys.size(), 0);
  for (const scheduler::v1::Bin& b : a.bins()) {
    fits = fits && b.llm_rank() >= 0 && b.llm_rank() < options_.plan.llm().dp() &&
           b.encoder_rank() >= 0 && b.encoder_rank() < options_.plan.encoder().dp() &&
           (!options_.plan.has_generator() ||
            (b.generator_rank() >= 0 && b.generator_rank() < options_.plan.generator().dp())) &&
           b.samples_size() == b.indices_size();
    for (int k = 0; fits && k < b.indices_size(); ++k) {
      const int i = b.indices(k);
      fits = i >= 0 && i < static_cast<int>(keys.size()) && keys[i] == b.samples(k) && !seen[i]++;
    }
  }
  for (int n : seen) fits = fits && n == 1;
  if (!fits) {
    LOOM_LOG(WARNING).With("path", path)
        << "a recorded assignment that does not fit this plan and batch; assigning again";
    return absl::NotFoundError(path);
  }
  a.set_checkpoint(false);  // the mark is placed again as the job asks now
  LOOM_LOG(INFO).With("iteration", iteration) << "replaying the recorded assignment";
  return a;
}

absl::Status SchedulerServiceImpl::RecordAssignment(const scheduler::v1::Assignment& a) const {
  const std::string dir = RecordsDir(options_.job.checkpoint().dir(), options_.run.id);
  absl::Status s = MakeDirectories(dir);
  if (s.ok()) {
    s = WriteFileAtomically(absl::StrCat(dir, "/", a.iteration(), ".binpb"), a.SerializeAsString());
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot record the assignment of iteration ",
                                               a.iteration(), ": ", s.message()));
  }
  return absl::OkStatus();
}

void SchedulerServiceImpl::PruneRecordedAssignments(int64_t step) const {
  const std::string root = options_.job.checkpoint().dir() + "/assignments";
  std::error_code ec;
  for (const auto& run : std::filesystem::directory_iterator(root, ec)) {
    if (run.path().filename() != options_.run.id) {
      std::filesystem::remove_all(run.path(), ec);
      continue;
    }
    for (const auto& f : std::filesystem::directory_iterator(run.path(), ec)) {
      int64_t iteration = 0;
      if (absl::SimpleAtoi(f.path().stem().string(), &iteration) && iteration < step) {
        std::filesystem::remove(f.path(), ec);
      }
    }
  }
}

}  // namespace loom
