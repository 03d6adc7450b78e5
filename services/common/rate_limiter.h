// A token bucket: up to `burst` calls at once, `per_second` on average.
// loom-scheduler bounds registrations and rendezvous key writes with it, so
// that a client gone wrong (or a holder of the job's certificate gone bad)
// cannot flood the scheduler's locks; the limits are sized by the plan so
// that a whole job starting at once stays well inside them.
//
// Thread-safe.
#ifndef LOOM_SERVICES_COMMON_RATE_LIMITER_H_
#define LOOM_SERVICES_COMMON_RATE_LIMITER_H_

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace loom {

class RateLimiter {
 public:
  // Unlimited until Reset().
  RateLimiter() = default;

  // A full bucket of `burst` tokens refilled at `per_second`.
  void Reset(double burst, double per_second) {
    absl::MutexLock lock(&mu_);
    burst_ = burst;
    per_second_ = per_second;
    tokens_ = burst;
    last_ = absl::Now();
  }

  // Takes one token if there is one (as of `now`).
  bool TryAcquire(absl::Time now = absl::Now()) {
    absl::MutexLock lock(&mu_);
    if (burst_ <= 0) return true;
    const absl::Duration elapsed = std::max(absl::ZeroDuration(), now - last_);
    tokens_ = std::min(burst_, tokens_ + per_second_ * absl::ToDoubleSeconds(elapsed));
    last_ = std::max(last_, now);
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

  double burst() const {
    absl::MutexLock lock(&mu_);
    return burst_;
  }
  double per_second() const {
    absl::MutexLock lock(&mu_);
    return per_second_;
  }

 private:
  mutable absl::Mutex mu_;
  double burst_ ABSL_GUARDED_BY(mu_) = 0;  // 0: unlimited
  double per_second_ ABSL_GUARDED_BY(mu_) = 0;
  double tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace loom

#endif  // LOOM_SERVICES_COMMON_RATE_LIMITER_H_
