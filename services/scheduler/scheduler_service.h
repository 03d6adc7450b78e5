// loom-scheduler's gRPC service (scheduler::v1::SchedulerService): the job's
// fixed plan, the workers' rendezvous, each iteration's assignment (computed
// from the preprocess service's batch metadata with the cost model), and the
// timing reports that refit the cost model.
#ifndef LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "loom/data/v1/data.grpc.pb.h"
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

 private:
  struct Computed {
    scheduler::v1::Assignment assignment;
    std::vector<sched::SampleShape> shapes;  // by batch index
  };

  absl::StatusOr<std::shared_ptr<const Computed>> AssignmentFor(int64_t iteration);
  absl::Status Configured() const;

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
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
