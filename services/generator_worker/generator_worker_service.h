// loom-generator-worker's gRPC service (worker::v1::GeneratorWorkerService).
#ifndef LOOM_SERVICES_GENERATOR_WORKER_GENERATOR_WORKER_SERVICE_H_
#define LOOM_SERVICES_GENERATOR_WORKER_GENERATOR_WORKER_SERVICE_H_

#include "loom/worker/v1/worker.grpc.pb.h"
#include "services/common/chassis.h"

namespace loom {

// Thread-safe: gRPC calls its methods from many threads at once.
class GeneratorWorkerServiceImpl final : public worker::v1::GeneratorWorkerService::Service {
 public:
  // `chassis` is not owned and must outlive this service.
  explicit GeneratorWorkerServiceImpl(const Chassis* chassis) : chassis_(chassis) {}

  grpc::Status GetInfo(grpc::ServerContext* context, const worker::v1::GetInfoRequest* request,
                       worker::v1::GetInfoResponse* response) override;

 private:
  const Chassis* chassis_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_GENERATOR_WORKER_GENERATOR_WORKER_SERVICE_H_
