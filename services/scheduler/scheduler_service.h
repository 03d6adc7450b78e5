// loom-scheduler's gRPC service (scheduler::v1::SchedulerService): the job's
// fixed plan, the workers' rendezvous, each iteration's assignment (computed
// from the preprocess service's batch metadata with the cost model), and the
// timing reports that refit the cost model.
#ifndef LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "loom/job/v1/job.pb.h"
#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "services/common/chassis.h"
#include "services/scheduler/cost_model.h"

namespace prometheus {
class Counter;
class Gauge;
}  // namespace prometheus

namespace loom {

struct SchedulerServiceOptions {
  scheduler::v1::Plan plan;  // fixed for the job; costs from the plan's coefficients
  std::string algorithm = "loom";
  std::string preprocess;        // host:port of loom-preprocess; empty: no assignments
  int retained_iterations = 16;  // assignments kept for fetches and timing reports
  double ilp_seconds = 10;
  // The job workers train (defaults applied). Its checkpoint.dir holds the
  // coordinated checkpoints; train.steps ends the job (0: no end).
  job::v1::JobConfig job;
  // Resume: continue after the checkpoint of step `start_iteration` (the
  // iteration after it is numbered start_iteration); 0 starts fresh.
  int64_t start_iteration = 0;
};

// Thread-safe: gRPC calls its methods from many threads at once.
class SchedulerServiceImpl final : public scheduler::v1::SchedulerService::Service {
 public:
  // `chassis` is not owned and must outlive this service. Without a plan
  // (the GetInfo-only form) the other RPCs answer FAILED_PRECONDITION.
  explicit SchedulerServiceImpl(const Chassis* chassis) : chassis_(chassis) {}

  // INVALID_ARGUMENT: an unknown algorithm, a plan without degrees.
  static absl::StatusOr<std::unique_ptr<SchedulerServiceImpl>> Create(
      Chassis* chassis, const SchedulerServiceOptions& options);

  grpc::Status GetInfo(grpc::ServerContext* context, const scheduler::v1::GetInfoRequest* request,
                       scheduler::v1::GetInfoResponse* response) override;
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const scheduler::v1::RegisterWorkerRequest* request,
                              scheduler::v1::RegisterWorkerResponse* response) override;
  grpc::Status GetPlan(grpc::ServerContext* context, const scheduler::v1::GetPlanRequest* request,
                       scheduler::v1::GetPlanResponse* response) override;
  grpc::Status GetAssignment(grpc::ServerContext* context,
                             const scheduler::v1::GetAssignmentRequest* request,
                             scheduler::v1::GetAssignmentResponse* response) override;
  grpc::Status ReportTimings(grpc::ServerContext* context,
                             const scheduler::v1::ReportTimingsRequest* request,
                             scheduler::v1::ReportTimingsResponse* response) override;
  grpc::Status ReportStep(grpc::ServerContext* context,
                          const scheduler::v1::ReportStepRequest* request,
                          scheduler::v1::ReportStepResponse* response) override;
  grpc::Status GetProgress(grpc::ServerContext* context,
                           const scheduler::v1::GetProgressRequest* request,
                           scheduler::v1::GetProgressResponse* response) override;
  grpc::Status ReportCheckpoint(grpc::ServerContext* context,
                                const scheduler::v1::ReportCheckpointRequest* request,
                                scheduler::v1::ReportCheckpointResponse* response) override;
  grpc::Status SetKey(grpc::ServerContext* context, const scheduler::v1::SetKeyRequest* request,
                      scheduler::v1::SetKeyResponse* response) override;
  grpc::Status GetKey(grpc::ServerContext* context, const scheduler::v1::GetKeyRequest* request,
                      scheduler::v1::GetKeyResponse* response) override;

 private:
  struct Computed {
    scheduler::v1::Assignment assignment;
    std::vector<sched::SampleShape> shapes;  // by batch index
  };

  absl::StatusOr<std::shared_ptr<const Computed>> AssignmentFor(int64_t iteration);
  absl::Status Configured() const;
  absl::Status ValidateWorkerId(common::v1::Role role, int rank) const;
  // Writes the cursor and the scheduler's state into the step's folder, then
  // COMPLETE. Called once every worker reported its part.
  absl::Status CompleteCheckpoint(int64_t step);

  const Chassis* chassis_;
  SchedulerServiceOptions options_;
  bool configured_ = false;
  std::unique_ptr<data::v1::PreprocessService::Stub> preprocess_;
  prometheus::Counter* assignments_ = nullptr;
  prometheus::Counter* reports_ = nullptr;
  prometheus::Gauge* registered_ = nullptr;
  prometheus::Gauge* llm_imbalance_ = nullptr;
  prometheus::Gauge* encoder_imbalance_ = nullptr;

  absl::Mutex compute_mu_;  // one assignment computed at a time
  mutable absl::Mutex mu_;
  std::map<std::pair<int, int>, scheduler::v1::Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::shared_ptr<const Computed>> assignments_by_iteration_ ABSL_GUARDED_BY(mu_);
  int64_t newest_ ABSL_GUARDED_BY(mu_) = -1;
  std::unique_ptr<sched::CostModel> costs_ ABSL_GUARDED_BY(mu_);
  std::deque<scheduler::v1::StepReport> steps_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, std::set<std::pair<int, int>>> checkpoint_parts_ ABSL_GUARDED_BY(mu_);
  int64_t last_checkpoint_ ABSL_GUARDED_BY(mu_) = -1;
  std::map<std::string, std::string> keys_ ABSL_GUARDED_BY(mu_);
  size_t key_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  prometheus::Counter* checkpoints_ = nullptr;
  prometheus::Gauge* checkpoint_seconds_ = nullptr;
};

// Checkpoint files the scheduler writes into DIR/step-N/ besides the
// workers' module files: the preprocess cursor before batch N and the cost
// model's coefficients.
inline constexpr char kCursorFile[] = "data_cursor.binpb";
inline constexpr char kSchedulerStateFile[] = "scheduler_costs.binpb";

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
