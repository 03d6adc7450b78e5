// A training worker's part in a recovery in place (training_worker.h): it
// watches the job's generation, waits for the scheduler to declare one after
// a failed iteration, and regroups under it (scheduler_leases.cc is the
// scheduler's side).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/base/log.h"
#include "services/worker/training_worker_impl.h"

namespace loom {

absl::Status TrainingWorker::Impl::Regroup(const scheduler::v1::Regroup& g) {
  // Nothing of the old generation is kept: its models (which hold the TP
  // group), its groups (closing their sockets ends any peer still waiting
  // in a collective with this one), its weights (the checkpoint's come back).
  DropModels();
  tp_comm.reset();
  dp_comm.reset();
  pp_comm.reset();
  bridge_comm.reset();
  spans.Clear();
  // Registered again: a scheduler that took the job back after its own loss
  // knows no worker yet (to the one that declared the loss, it is a retry).
  absl::StatusOr<scheduler::v1::RegisterWorkerResponse> reg =
      scheduler->Register(Me(), options.startup_timeout);
  if (!reg.ok()) return reg.status();
  start_iteration = g.start_iteration();
  checkpoint_step_dir = g.checkpoint_step_dir();
  if (absl::Status s = scheduler->SetGeneration(g.generation(), g.data_key()); !s.ok()) return s;
  {
    absl::MutexLock lock(&generation_mu);
    generation = g.generation();
    // Under the lock: the watcher cancels only for a newer one.
    ucx->ClearCancel();
    if (!stop.load()) collectives.Clear();
  }
  return Join();
}

void TrainingWorker::Impl::WatchGeneration() {
  // A long poll: the scheduler answers as soon as the generation rises (a
  // survivor waiting on the lost peer stops waiting then), else after
  // kLongPoll, so that the stall check below runs about once a second (its
  // floor is minutes) and a stop is seen within one hold.
  int64_t seen = -1;  // the scheduler's generation as last answered
  while (watching.load() && !stop.load()) {
    // A hang in the thread's own work: NOT_SERVING, so that the scheduler
    // declares this process lost after a lease (and loom up or Kubernetes
    // replaces it); SERVING again should the work end before that.
    const std::string stuck = stall->Stalled();
    if (!stuck.empty() != stalled) {
      stalled = !stuck.empty();
      if (stalled) {
        LOOM_LOG(ERROR).With("stall", stuck) << "answering NOT_SERVING";
      } else {
        LOOM_LOG(WARNING) << "the stalled work ended: SERVING again";
      }
      chassis->SetServing(!stalled);
    }
    if (seen < 0) {
      absl::MutexLock lock(&generation_mu);
      seen = generation;
    }
    absl::StatusOr<scheduler::v1::Regroup> g = scheduler->GetGeneration(seen, kLongPoll);
    if (!g.ok()) {  // the scheduler unreachable: ask again shortly
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    seen = g->generation();
    absl::MutexLock lock(&generation_mu);
    if (g->generation() > generation) {
      // A peer was lost: whatever this worker waits for may never come.
      // (Each answer while this worker is behind cancels again: a regroup
      // into a generation already over is cut short within one hold.)
      ucx->Cancel();
      collectives.Cancel();
    }
  }
}

absl::StatusOr<scheduler::v1::Regroup> TrainingWorker::Impl::AwaitRegroup() {
  // The scheduler declares a loss within a lease (at once for a process
  // that exited); a failure with no recovery behind it is this worker's own.
  const double lease = job.recovery().lease_seconds();
  if (lease <= 0) return absl::UnavailableError("no recovery in place (recovery.lease_seconds 0)");
  const absl::Time until = absl::Now() + absl::Seconds(lease) + absl::Seconds(5);
  for (;;) {
    // Held by the scheduler until the generation rises (or kLongPoll).
    const absl::Duration hold =
        std::max(absl::ZeroDuration(), std::min(kLongPoll, until - absl::Now()));
    const absl::Time asked = absl::Now();
    absl::StatusOr<scheduler::v1::Regroup> g =
        scheduler->GetGeneration(scheduler->generation(), hold);
    if (g.ok() && g->generation() > scheduler->generation()) return *g;
    if (stop.load() || absl::Now() >= until) {
      return absl::DeadlineExceededError("the scheduler declared no recovery");
    }
    // Not held (an error, an older scheduler, the end near): not too often.
    if (absl::Now() - asked < absl::Milliseconds(100)) absl::SleepFor(absl::Milliseconds(100));
  }
}

}  // namespace loom
