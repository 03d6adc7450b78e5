// SchedulerServiceImpl's failure detection: the leases every worker and
// loom-preprocess hold with the scheduler, the RECOVERING state a lost
// process puts the job in, and the recovery's metrics.
//
// The scheduler asks each process's grpc.health.v1 (the check Kubernetes'
// probes use) rather than waiting for heartbeats: it knows every endpoint
// from the registrations, a stopped or hung process answers nothing, and no
// worker needs a thread of its own for it. A refused connection is final at
// once (the process is gone; its port is closed); a silence counts only
// after a whole lease. A round asks every holder at once (at most
// kMaxProbesInFlight probes in flight, each with its own deadline) over a
// channel kept per endpoint, so that at thousands of ranks a round stays
// well inside a lease and costs no TLS handshake per probe.
//
// A lost worker starts a recovery in place: the job's generation rises,
// its rank is free for a replacement, and the job rolls back to the newest
// complete checkpoint (weights, cost model, data cursor, the recorded
// assignments after it) while every other process stays up and regroups.
// A lost loom-preprocess has no such path: its supervisor restarts the job.
#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "runtime/base/file.h"
#include "runtime/base/log.h"
#include "runtime/checkpoint/steps.h"
#include "runtime/scheduling/schedule.h"
#include "services/common/grpc_status.h"
#include "services/common/health_prober.h"
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
  ObserveRecovery("detection", last_seen, absl::Now());
  if (const int cap = options_.job.recovery().max_restarts(); cap > 0 && RestartsLocked() >= cap) {
    absl::StrAppend(&job_message_, "; no restart left (recovery.max_restarts ", cap, ")");
    stop_at_ = std::max(newest_ + 1, start_iteration_);
    SetStateLocked(control::v1::JOB_STATE_FAILED);
    return;
  }
  BeginRegroupLocked(role, rank);
  SetStateLocked(control::v1::JOB_STATE_RECOVERING);
}

void SchedulerServiceImpl::MaybeEndRegroupLocked() {
  if (state_ != control::v1::JOB_STATE_RECOVERING || !regrouping_ || awaiting_preprocess_ ||
      static_cast<int>(workers_.size()) != sched::PlanWorkerRanks(options_.plan)) {
    return;
  }
  running_since_ = absl::Now();
  ObserveRecovery("regroup", absl::UnixEpoch() + absl::Seconds(recovery_.declared_seconds()),
                  running_since_);
  job_message_.clear();  // the loss stays in Job.recovery
  regrouping_ = false;
  SetStateLocked(control::v1::JOB_STATE_RUNNING);
}

void SchedulerServiceImpl::BeginRegroupLocked(common::v1::Role role, int rank) {
  ++generation_;
  data_key_ = DataKey::Random().bytes();  // a worker cut off from here cannot reach the next
  regrouping_ = true;
  if (role == common::v1::ROLE_PREPROCESS) {
    // Restarted at its address from the checkpoint's cursor: back once it
    // answers SERVING again (the lease thread looks).
    awaiting_preprocess_ = true;
  } else {
    ReleaseRankLocked(role, rank);
  }
  // From the newest complete checkpoint, or from the start of this run.
  const int64_t from = std::max(last_checkpoint_, options_.start_iteration);
  start_iteration_ = from;
  PublishRegroupLocked();  // the GetGeneration calls held answer now
  assignments_by_iteration_.clear();
  newest_ = -1;
  ahead_.clear();  // computed from the old generation's data order
  compute_failed_.clear();
  wanted_ = -1;
  if (batch_call_ != nullptr) batch_call_->TryCancel();
  while (!steps_.empty() && steps_.back().iteration() >= from) {
    tokens_seen_ -= steps_.back().tokens();  // trained again, counted again
    steps_.pop_back();
  }
  last_step_at_ = absl::InfinitePast();  // the recovery's pause is no pace
  step_interval_ = 0;
  clock_.RollBack();
  // Checkpoints placed after it are abandoned (their partial folders are
  // emptied when the steps are marked again).
  checkpoint_steps_.clear();
  checkpoint_parts_.clear();
  checkpoint_started_.clear();
  checkpoint_cursors_.clear();
  marking_step_ = 0;
  checkpoint_requested_ = false;
  {
    absl::MutexLock keys(&keys_mu_);
    keys_.clear();  // the old generation's rendezvous; the new one uses its own prefix
    key_bytes_ = 0;
  }
  absl::StatusOr<scheduler::v1::CostCoefficients> costs =
      StartingCosts(options_.plan, options_.job.checkpoint().dir(), from);
  if (costs.ok()) {
    costs_ = std::make_unique<sched::CostModel>(*costs);
  } else {
    LOOM_LOG(WARNING).With("error", std::string(costs.status().message()))
        << "recovery keeps the current cost model";
  }
  rewind_to_ = from;
  reload_pending_ = true;
  KeepJobLocked();
  recovery_.set_restart_seconds(recovery_.declared_seconds());
  restarts_->Increment();
  LOOM_LOG(INFO)
          .With("generation", generation_)
          .With("start_iteration", from)
          .With("productive_seconds", clock_.Read(absl::Now()).productive_seconds())
      << "recovering in place: waiting for " << RoleLabel(role) << " rank " << rank
      << " to come back";
}

absl::Status SchedulerServiceImpl::RewindPreprocess() {
  int64_t to = -1;
  {
    absl::MutexLock lock(&mu_);
    to = rewind_to_;
  }
  if (to < 0) return absl::OkStatus();
  data::v1::RewindRequest request;
  request.set_start_iteration(to);
  if (to > 0) {  // else from the start of the data
    const std::string path =
        absl::StrCat(StepDir(options_.job.checkpoint().dir(), to), "/", kDataCursorFile);
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok() || !request.mutable_cursor()->ParseFromString(*bytes)) {
      return absl::DataLossError(absl::StrCat("recovery: cannot read the data cursor ", path));
    }
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(true);  // loom-preprocess may be restarting at its address
  data::v1::RewindResponse response;
  if (grpc::Status s = preprocess_->Rewind(&ctx, request, &response); !s.ok()) {
    return FromGrpcStatus(s, "preprocess Rewind");
  }
  absl::MutexLock lock(&mu_);
  if (rewind_to_ == to) rewind_to_ = -1;
  return absl::OkStatus();
}

void SchedulerServiceImpl::ObserveRecovery(const char* part, absl::Time begin, absl::Time end) {
  const double seconds = std::max(0.0, absl::ToDoubleSeconds(end - begin));
  recovery_seconds_.at(part)->Observe(seconds);
  LOOM_LOG(INFO).With("part", part).With("seconds", seconds) << "recovery";
}

void SchedulerServiceImpl::WatchLeases() {
  const absl::Duration lease = absl::Seconds(options_.job.recovery().lease_seconds());
  // Several rounds a lease, each probe given a part of it, so that one slow
  // answer does not cost a lease.
  const absl::Duration every = std::min(lease / 4, absl::Seconds(1));
  const absl::Duration probe_deadline = std::min(lease / 3, absl::Seconds(2));
  HealthProber prober(kMaxProbesInFlight);
  struct Holder {
    common::v1::Role role;
    int rank;
    std::string endpoint;
  };
  // A holder's lease, from its first probe: its last SERVING answer, and
  // since when it is silent (the sending of the first probe it failed after
  // that answer; InfiniteFuture while it answers). Counting the silence from
  // a failed probe, not from the last answer, keeps a round that ran long
  // (thousands of holders, a busy machine) from costing a healthy holder
  // its lease on one slow answer.
  struct Lease {
    std::string endpoint;
    absl::Time last_ok;
    absl::Time silent_since = absl::InfiniteFuture();
  };
  std::map<std::pair<int, int>, Lease> leases;
  for (;;) {
    std::vector<Holder> holders;
    bool check_preprocess = false;  // a lost loom-preprocess being restarted: is it back?
    {
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + every;
      while (!closing_ && absl::Now() < until) changed_.WaitWithDeadline(&mu_, until);
      if (closing_) return;
      effective_->Set(clock_.Read(absl::Now()).effective_ratio());
      if (state_ != control::v1::JOB_STATE_RUNNING && state_ != control::v1::JOB_STATE_PAUSED) {
        leases.clear();  // a lease starts when the job runs
        if (state_ != control::v1::JOB_STATE_RECOVERING || !awaiting_preprocess_) continue;
        check_preprocess = true;
      }
      for (const auto& [key, w] : workers_) {
        if (!w.endpoint().empty()) holders.push_back({w.role(), w.rank(), w.endpoint()});
      }
      if (!options_.preprocess.empty()) {
        holders.push_back({common::v1::ROLE_PREPROCESS, 0, options_.preprocess});
      }
    }
    if (check_preprocess) {
      const HealthProber::Answer a = prober.ProbeAll({options_.preprocess}, probe_deadline)[0];
      absl::MutexLock lock(&mu_);
      if (a.status.ok() && *a.status == grpc::health::v1::HealthCheckResponse::SERVING &&
          state_ == control::v1::JOB_STATE_RECOVERING) {
        awaiting_preprocess_ = false;
        MaybeEndRegroupLocked();
      }
      continue;
    }
    std::vector<std::string> endpoints;
    endpoints.reserve(holders.size());
    for (const Holder& h : holders) endpoints.push_back(h.endpoint);
    prober.Keep(endpoints);  // the channels of holders gone or moved are closed
    const absl::Time round_start = absl::Now();
    const std::vector<HealthProber::Answer> answers = prober.ProbeAll(endpoints, probe_deadline);
    lease_round_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - round_start));
    std::map<std::pair<int, int>, Lease> kept;  // the holders of this round only
    for (size_t i = 0; i < holders.size(); ++i) {
      const Holder& h = holders[i];
      const HealthProber::Answer& a = answers[i];
      const std::pair<int, int> key(h.role, h.rank);
      Lease l;
      if (auto it = leases.find(key); it != leases.end() && it->second.endpoint == h.endpoint) {
        l = it->second;
      } else {  // a new holder: its lease starts with its first probe
        l.endpoint = h.endpoint;
        l.last_ok = a.sent;
      }
      Lease& held = kept[key] = l;
      if (a.status.ok() && *a.status == grpc::health::v1::HealthCheckResponse::SERVING) {
        held.last_ok = a.answered;
        held.silent_since = absl::InfiniteFuture();
      } else if (held.silent_since == absl::InfiniteFuture()) {
        held.silent_since = a.sent;
      }
    }
    leases = std::move(kept);
    for (size_t i = 0; i < holders.size(); ++i) {
      const Holder& h = holders[i];
      const HealthProber::Answer& a = answers[i];
      const Lease& l = leases[{h.role, h.rank}];
      if (l.silent_since == absl::InfiniteFuture()) continue;
      // A closed port: the process is gone (a new one would be a new
      // registration); anything else may pass, so it gets the whole lease.
      const bool refused =
          !a.status.ok() && absl::StrContains(a.status.status().message(), "Connection refused");
      if (!refused && a.answered - l.silent_since < lease) continue;
      const std::string answer =
          a.status.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*a.status)
                        : std::string(a.status.status().message());
      absl::MutexLock lock(&mu_);
      if (h.role != common::v1::ROLE_PREPROCESS) {
        auto w = workers_.find({h.role, h.rank});
        if (w == workers_.end() || w->second.endpoint() != h.endpoint) continue;  // re-registered
      }
      DeclareLostLocked(
          h.role, h.rank, h.endpoint,
          refused
              ? absl::StrCat("its port refuses connections (", answer, ")")
              : absl::StrFormat("no SERVING health answer for %.1fs (lease %s); last answer: %s",
                                absl::ToDoubleSeconds(absl::Now() - l.last_ok),
                                absl::FormatDuration(lease), answer),
          l.last_ok);
      break;
    }
  }
}

scheduler::v1::Regroup SchedulerServiceImpl::RegroupLocked() const {
  scheduler::v1::Regroup g;
  g.set_generation(generation_);
  g.set_data_key(data_key_);
  g.set_start_iteration(start_iteration_);
  if (start_iteration_ > 0) {
    g.set_checkpoint_step_dir(StepDir(options_.job.checkpoint().dir(), start_iteration_));
  }
  return g;
}

absl::Status SchedulerServiceImpl::CheckGenerationLocked(int64_t generation) const {
  if (generation == generation_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      generation < generation_
          ? absl::StrCat("generation ", generation, " is over: the job recovered in place (now ",
                         generation_, ", from iteration ", start_iteration_, ")")
          : absl::StrCat("generation ", generation, " does not exist yet (now ", generation_, ")"));
}

}  // namespace loom
