// loom-scheduler's gRPC service (scheduler::v1::SchedulerService).
#ifndef LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
#define LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_

#include "loom/scheduler/v1/scheduler.grpc.pb.h"
#include "services/common/chassis.h"

namespace loom {

// Thread-safe: gRPC calls its methods from many threads at once.
class SchedulerServiceImpl final : public scheduler::v1::SchedulerService::Service {
 public:
  // `chassis` is not owned and must outlive this service.
  explicit SchedulerServiceImpl(const Chassis* chassis) : chassis_(chassis) {}

  grpc::Status GetInfo(grpc::ServerContext* context, const scheduler::v1::GetInfoRequest* request,
                       scheduler::v1::GetInfoResponse* response) override;

 private:
  const Chassis* chassis_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_SCHEDULER_SCHEDULER_SERVICE_H_
