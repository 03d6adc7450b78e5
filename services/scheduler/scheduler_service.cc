#include "services/scheduler/scheduler_service.h"

namespace loom {

grpc::Status SchedulerServiceImpl::GetInfo(grpc::ServerContext*,
                                           const scheduler::v1::GetInfoRequest*,
                                           scheduler::v1::GetInfoResponse* response) {
  chassis_->FillServiceInfo(response->mutable_info());
  return grpc::Status::OK;
}

}  // namespace loom
