// loom-llm-worker's gRPC service (worker::v1::LlmWorkerService).
#ifndef LOOM_SERVICES_LLM_WORKER_LLM_WORKER_SERVICE_H_
#define LOOM_SERVICES_LLM_WORKER_LLM_WORKER_SERVICE_H_

#include "loom/worker/v1/worker.grpc.pb.h"
#include "services/common/chassis.h"

namespace loom {

// Thread-safe: gRPC calls its methods from many threads at once.
class LlmWorkerServiceImpl final : public worker::v1::LlmWorkerService::Service {
 public:
  // `chassis` is not owned and must outlive this service.
  explicit LlmWorkerServiceImpl(const Chassis* chassis) : chassis_(chassis) {}

  grpc::Status GetInfo(grpc::ServerContext* context, const worker::v1::GetInfoRequest* request,
                       worker::v1::GetInfoResponse* response) override;

 private:
  const Chassis* chassis_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_LLM_WORKER_LLM_WORKER_SERVICE_H_
