// A worker's calls to loom-scheduler, each with a deadline, and the
// scheduler's key-value store as the rendezvous for the workers'
// collectives.
#ifndef LOOM_SERVICES_WORKER_SCHEDULER_CLIENT_H_
#define LOOM_SERVICES_WORKER_SCHEDULER_CLIENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/data_key.h"
#include "services/common/incarnation.h"

namespace loom {

// How long one GetPlan or GetKey call asks loom-scheduler to hold it while
// the plan is incomplete or the key not set (a long poll): a cancel is seen
// within it.
inline constexpr absl::Duration kLongPoll = absl::Seconds(1);

class SchedulerClient {
 public:
  // While `*cancel` (optional) is true, the waiting calls (Register,
  // WaitForAllWorkers, the store's Get) return CANCELLED.
  SchedulerClient(const std::string& target, absl::Duration deadline = absl::Seconds(60),
                  const std::atomic<bool>* cancel = nullptr);
  // Over `channel` (e.g. ServiceChannel(target, /*own_connection=*/true)).
  SchedulerClient(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline,
                  const std::atomic<bool>* cancel);

  // Retries while the scheduler is not up yet (UNAVAILABLE), until `wait`.
  absl::StatusOr<scheduler::v1::RegisterWorkerResponse> Register(const scheduler::v1::Worker& w,
                                                                 absl::Duration wait);
  // Asks GetPlan (held by the scheduler up to kLongPoll each time) until
  // every worker of the plan has registered, or `wait`.
  absl::StatusOr<scheduler::v1::GetPlanResponse> WaitForAllWorkers(absl::Duration wait);
  // The workers asked for (GetWorkers, 4096 a call), in that order.
  absl::StatusOr<std::vector<scheduler::v1::Worker>> GetWorkers(
      const std::vector<scheduler::v1::WorkerRef>& refs);
  // The assignment, job_ended, or regroup when this client's generation is
  // over (GetAssignmentResponse). Waits on while the job is paused or
  // recovering. `validation`: of validation batch `iteration`.
  absl::StatusOr<scheduler::v1::GetAssignmentResponse> GetAssignment(int64_t iteration,
                                                                     bool validation = false);
  // The job's current generation and where it starts. A long poll when
  // `wait` > 0: the scheduler holds the call while its generation is
  // `known_generation`, up to `wait` (at most 5 s), and answers as soon as
  // the generation changes.
  absl::StatusOr<scheduler::v1::Regroup> GetGeneration(int64_t known_generation = -1,
                                                       absl::Duration wait = absl::ZeroDuration());
  absl::Status ReportTimings(scheduler::v1::ReportTimingsRequest request);
  // Reports are retried within the client's deadline while the scheduler is
  // unreachable (UNAVAILABLE, DEADLINE_EXCEEDED): a try that failed in
  // transit may have landed, so after one, ALREADY_EXISTS is its success
  // (both reports are idempotent on the scheduler: a step or a checkpoint
  // part counts once). One lost answer no longer ends the rank.
  absl::Status ReportStep(const scheduler::v1::StepReport& step);
  absl::Status ReportCheckpoint(common::v1::Role role, int rank, int64_t step);
  // This worker is done with the ended job and exits (--exit_on_job_end).
  absl::Status ReportDone(common::v1::Role role, int rank);
  absl::StatusOr<scheduler::v1::GetProgressResponse> GetProgress(int64_t after_iteration);

  scheduler::v1::SchedulerService::Stub* stub() { return stub_.get(); }
  absl::Duration deadline() const { return deadline_; }
  // The generation the calls speak for (GetAssignment, ReportStep,
  // ReportCheckpoint) and its data-plane key (the tags of the tensors
  // workers send each other: data_key.h): RegisterWorkerResponse's, then
  // each Regroup's. INVALID_ARGUMENT, and nothing changes, for a key that is
  // not DataKey::kBytes long.
  absl::Status SetGeneration(int64_t g, absl::string_view data_key);
  int64_t generation() const { return generation_.load(); }
  struct Generation {
    int64_t generation;
    DataKey key;
  };
  Generation generation_and_key() const;
  // CANCELLED once cancelled; OK otherwise.
  absl::Status Cancelled() const;
  // What Register binds the rank to and every report carries
  // (services/common/incarnation.h): the process's own, unless a process
  // standing for many ranks (scale_bench, tests) sets one per rank before
  // Register.
  void set_incarnation(std::string incarnation) { incarnation_ = std::move(incarnation); }
  const std::string& incarnation() const { return incarnation_; }

 private:
  // Runs `call` (one try, on a fresh context) as ReportStep describes.
  absl::Status Report(const char* what,
                      const std::function<grpc::Status(grpc::ClientContext*)>& call);

  std::unique_ptr<scheduler::v1::SchedulerService::Stub> stub_;
  absl::Duration deadline_;
  const std::atomic<bool>* cancel_;
  std::string incarnation_ = ProcessIncarnation();
  std::atomic<int64_t> generation_{0};
  mutable absl::Mutex key_mu_;
  DataKey key_ ABSL_GUARDED_BY(key_mu_);  // generation_'s (set together under key_mu_)
};

// The UCX addresses of the workers one sends to, learnt from loom-scheduler
// as they are needed (GetWorkers) and kept for the generation: at thousands
// of ranks no worker is sent every other's address. Thread-safe (the
// prefetch of the next iteration resolves while this one sends).
class PeerAddresses {
 public:
  explicit PeerAddresses(SchedulerClient* client) : client_(client) {}
  // Asks for those of `peers` not known yet (none: no call).
  absl::Status Resolve(const std::vector<scheduler::v1::WorkerRef>& peers);
  // A resolved peer's address; FAILED_PRECONDITION naming it otherwise.
  absl::StatusOr<std::string> Get(common::v1::Role role, int rank) const;
  void Clear();

 private:
  SchedulerClient* client_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::pair<int, int>, std::string> known_ ABSL_GUARDED_BY(mu_);
};

// KeyValueStore over the scheduler's SetKey/GetKey/DeleteKeys (Get asks again
// after NOT_FOUND, each call held by the scheduler up to kLongPoll).
class SchedulerStore final : public KeyValueStore {
 public:
  explicit SchedulerStore(SchedulerClient* client) : client_(client) {}
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Delete(const std::vector<std::string>& keys) override;
  // GetKeys, 4096 reads a call, each call held up to kLongPoll.
  absl::StatusOr<std::vector<Value>> GetMany(const std::vector<Read>& reads,
                                             absl::Duration timeout) override;

 private:
  SchedulerClient* client_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_WORKER_SCHEDULER_CLIENT_H_
