// loom-preprocess's gRPC service (data::v1::PreprocessService).
#ifndef LOOM_SERVICES_PREPROCESS_PREPROCESS_SERVICE_H_
#define LOOM_SERVICES_PREPROCESS_PREPROCESS_SERVICE_H_

#include "loom/data/v1/data.grpc.pb.h"
#include "services/common/chassis.h"

namespace loom {

// Thread-safe: gRPC calls its methods from many threads at once.
class PreprocessServiceImpl final : public data::v1::PreprocessService::Service {
 public:
  // `chassis` is not owned and must outlive this service.
  explicit PreprocessServiceImpl(const Chassis* chassis) : chassis_(chassis) {}

  grpc::Status GetInfo(grpc::ServerContext* context, const data::v1::GetInfoRequest* request,
                       data::v1::GetInfoResponse* response) override;

 private:
  const Chassis* chassis_;
};

}  // namespace loom

#endif  // LOOM_SERVICES_PREPROCESS_PREPROCESS_SERVICE_H_
