#include "services/preprocess/preprocess_service.h"

namespace loom {

grpc::Status PreprocessServiceImpl::GetInfo(grpc::ServerContext*, const data::v1::GetInfoRequest*,
                                            data::v1::GetInfoResponse* response) {
  chassis_->FillServiceInfo(response->mutable_info());
  return grpc::Status::OK;
}

}  // namespace loom
