// SchedulerServiceImpl's failure detection: the leases every worker and
// loom-preprocess hold with the scheduler, the RECOVERING state a lost
// process puts the job in, and the recovery's metrics.
//
// The scheduler asks each process's grpc.health.v1 (the check Kubernetes'
// probes use) rather than waiting for heartbeats: it knows every endpoint
// from the registrations, a stopped or hung process answers nothing, and no
// worker needs a thread of its own for it.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "runtime/base/log.h"
#include "services/common/health_client.h"
#include "services/scheduler/job_state.h"
#include "services/scheduler/scheduler_service.h"

namespace loom {

namespace {

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

void SchedulerServiceImpl::DeclareLostLocked(common::v1::Role role, int rank,
                                             const std::string& endpoint, const std::string& cause,
                                             absl::Time last_seen) {
  if (state_ != control::v1::JOB_STATE_RUNNING && state_ != control::v1::JOB_STATE_PAUSED) return;
  recovery_.Clear();
  recovery_.set_role(role);
  recovery_.set_rank(rank);
  recovery_.set_endpoint(endpoint);
  recovery_.set_cause(cause);
  recovery_.set_phase(JobPhase(JobLocked()));
  recovery_.set_last_seen_seconds(UnixSeconds(last_seen));
  recovery_.set_declared_seconds(UnixSeconds(absl::Now()));
  job_message_ = DescribeLoss(recovery_);
  LOOM_LOG(ERROR).With("role", RoleLabel(role)).With("rank", rank).With("endpoint", endpoint)
      << "process lost: " << cause;
  lost_->Increment();
  SetStateLocked(control::v1::JOB_STATE_RECOVERING);
}

void SchedulerServiceImpl::ObserveRecovery(const char* part, absl::Time begin, absl::Time end) {
  const double seconds = std::max(0.0, absl::ToDoubleSeconds(end - begin));
  recovery_seconds_.at(part)->Observe(seconds);
  LOOM_LOG(INFO).With("part", part).With("seconds", seconds) << "recovery";
}

void SchedulerServiceImpl::WatchLeases() {
  const absl::Duration lease = absl::Seconds(options_.job.recovery().lease_seconds());
  // Several probes a lease, each given a part of it, so that one slow
  // answer does not cost a lease.
  const absl::Duration every = std::min(lease / 4, absl::Seconds(1));
  const absl::Duration probe_deadline = std::min(lease / 3, absl::Seconds(2));
  struct Holder {
    common::v1::Role role;
    int rank;
    std::string endpoint;
  };
  std::map<std::pair<int, int>, absl::Time> last_ok;
  for (;;) {
    std::vector<Holder> holders;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + every;
      while (!closing_ && absl::Now() < until) changed_.WaitWithDeadline(&mu_, until);
      if (closing_) return;
      if (state_ != control::v1::JOB_STATE_RUNNING && state_ != control::v1::JOB_STATE_PAUSED) {
        last_ok.clear();  // a lease starts when the job runs
        continue;
      }
      for (const auto& [key, w] : workers_) {
        if (!w.endpoint().empty()) holders.push_back({w.role(), w.rank(), w.endpoint()});
      }
      if (!options_.preprocess.empty()) {
        holders.push_back({common::v1::ROLE_PREPROCESS, 0, options_.preprocess});
      }
    }
    for (const Holder& h : holders) {
      const std::pair<int, int> key(h.role, h.rank);
      const absl::Time asked = absl::Now();
      auto [seen, fresh] = last_ok.try_emplace(key, asked);
      absl::StatusOr<ServingStatus> health = CheckHealth(h.endpoint, "", probe_deadline);
      if (health.ok() && *health == grpc::health::v1::HealthCheckResponse::SERVING) {
        seen->second = absl::Now();
        continue;
      }
      if (fresh || absl::Now() - seen->second < lease) continue;
      const std::string answer =
          health.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*health)
                      : std::string(health.status().message());
      absl::MutexLock lock(&mu_);
      DeclareLostLocked(
          h.role, h.rank, h.endpoint,
          absl::StrFormat("no SERVING health answer for %.1fs (lease %s); last answer: %s",
                          absl::ToDoubleSeconds(absl::Now() - seen->second),
                          absl::FormatDuration(lease), answer),
          seen->second);
      break;
    }
  }
}

}  // namespace loom
