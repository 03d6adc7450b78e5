// Watches a training thread for a hang in its own work: a process whose
// training is stuck may still answer its health checks, so a lease alone
// never finds it (issue 17, "Detection").
//
// The thread marks when it waits (for a peer's tensors, a collective, the
// scheduler, data) and when it works, in a named phase ("step" between
// waits, "checkpoint" while writing its part). Each stretch of work is
// timed; one that runs past max(floor, factor x the longest finished
// stretch of its phase) is a stall. Waiting is never a stall: a survivor
// waiting on a lost peer is that peer's victim, and the generation watcher
// ends its wait; a single wait is bounded by WaitLimit(), from the longest
// iteration. Thread-safe: the training thread marks, a watcher asks.
#ifndef LOOM_SERVICES_WORKER_STALL_WATCH_H_
#define LOOM_SERVICES_WORKER_STALL_WATCH_H_

#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom {

class StallWatch {
 public:
  // `margin` is added to a wait's limit (a worker's: the lease, so that a
  // stuck peer's own watch and the scheduler's lease find it first).
  StallWatch(absl::Duration floor, double factor, absl::Duration margin = absl::ZeroDuration())
      : floor_(floor), factor_(factor), margin_(margin) {}

  // From `now` on, the thread works in `phase` (a string literal).
  void Work(const char* phase, absl::Time now = absl::Now()) {
    absl::MutexLock lock(&mu_);
    EndLocked(now);
    phase_ = phase;
    since_ = now;
  }
  // From `now` on, the thread waits (or does not train): not watched.
  void Wait(absl::Time now = absl::Now()) {
    absl::MutexLock lock(&mu_);
    EndLocked(now);
    phase_ = nullptr;
  }

  // Waits for its lifetime, then works again in the phase it interrupted.
  class Waiting {
   public:
    explicit Waiting(StallWatch* w) : w_(w) {
      if (w_ == nullptr) return;
      absl::MutexLock lock(&w_->mu_);
      resume_ = w_->phase_;
      w_->EndLocked(absl::Now());
      w_->phase_ = nullptr;
    }
    ~Waiting() {
      if (w_ != nullptr && resume_ != nullptr) w_->Work(resume_);
    }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    StallWatch* w_;
    const char* resume_ = nullptr;
  };

  // An iteration took `d`, waits included.
  void IterationDone(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    longest_iteration_ = std::max(longest_iteration_, d);
  }
  // How long one wait for a peer (a transfer, a collective) may take:
  // max(floor, factor x the longest iteration so far) + margin. A peer that
  // is slower than that is stuck in its own work (its watch says so first)
  // or lost (the lease); past it, the waiting rank gives up on the iteration.
  absl::Duration WaitLimit() const {
    absl::MutexLock lock(&mu_);
    return std::max(floor_, longest_iteration_ * factor_) + margin_;
  }

  // What is stuck at `now` ("" if nothing).
  std::string Stalled(absl::Time now = absl::Now()) const {
    absl::MutexLock lock(&mu_);
    if (phase_ == nullptr) return "";
    const auto it = longest_.find(phase_);
    const absl::Duration longest = it == longest_.end() ? absl::ZeroDuration() : it->second;
    const absl::Duration limit = std::max(floor_, longest * factor_);
    if (now - since_ <= limit) return "";
    return absl::StrFormat(
        "training thread stuck in its own work (%s) for %.1fs, past its limit %.1fs "
        "(max(recovery.stall_floor_seconds %.1f, stall_factor %g x its longest %s %.2fs))",
        phase_, absl::ToDoubleSeconds(now - since_), absl::ToDoubleSeconds(limit),
        absl::ToDoubleSeconds(floor_), factor_, phase_, absl::ToDoubleSeconds(longest));
  }

 private:
  void EndLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (phase_ == nullptr) return;
    absl::Duration& longest = longest_[phase_];
    longest = std::max(longest, now - since_);
  }

  const absl::Duration floor_;
  const double factor_;
  const absl::Duration margin_;
  mutable absl::Mutex mu_;
  const char* phase_ ABSL_GUARDED_BY(mu_) = nullptr;  // null: waiting
  absl::Time since_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Duration> longest_ ABSL_GUARDED_BY(mu_);
  absl::Duration longest_iteration_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_SERVICES_WORKER_STALL_WATCH_H_
