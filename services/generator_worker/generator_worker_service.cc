#include "services/generator_worker/generator_worker_service.h"

namespace loom {

grpc::Status GeneratorWorkerServiceImpl::GetInfo(grpc::ServerContext*,
                                                 const worker::v1::GetInfoRequest*,
                                                 worker::v1::GetInfoResponse* response) {
  chassis_->FillServiceInfo(response->mutable_info());
  return grpc::Status::OK;
}

}  // namespace loom
