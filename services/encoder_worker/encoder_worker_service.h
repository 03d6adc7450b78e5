// loom-encoder-worker's gRPC service (worker::v1::EncoderWorkerService).
#ifndef LOOM_SERVICES_ENCODER_WORKER_ENCODER_WORKER_SERVICE_H_
#define LOOM_SERVICES_ENCODER_WORKER_ENCODER_WORKER_SERVICE_H_

#include "loom/worker/v1/worker.grpc.pb.h"
#include "services/common/chassis.h"

namespace loom {

// Thread-safe: gRPC calls its methods from many threads at once.
class EncoderWorkerServiceImpl final : public worker::v1::EncoderWorkerService::Service {
 public:
  // `chassis` is not owned and must outlive this service.
  explicit EncoderWorkerServiceImpl(const Chassis* chassis) : chassis_(chassis) {}

  grpc::Status GetInfo(grpc::ServerContext* context, const worker::v1::GetInfoRequest* request,
                       worker::v1::GetInfoResponse* response) override;

 private:
  const Chassis* chassis_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_ENCODER_WORKER_ENCODER_WORKER_SERVICE_H_
