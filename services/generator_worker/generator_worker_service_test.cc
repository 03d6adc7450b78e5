#include "services/generator_worker/generator_worker_service.h"

#include "gtest/gtest.h"
#include "services/common/chassis_testing.h"

namespace loom {
namespace {

TEST(GeneratorWorkerServiceImplTest, GetInfoReportsRoleAndBoundPorts) {
  Chassis chassis(testing::LocalOptions("loom-generator-worker", common::v1::ROLE_GENERATOR_WORKER,
                                        /*rank=*/1));
  GeneratorWorkerServiceImpl service(&chassis);
  chassis.AddService(&service, worker::v1::GeneratorWorkerService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());

  auto stub = worker::v1::GeneratorWorkerService::NewStub(testing::ChannelTo(chassis));
  auto ctx = testing::ContextWithDeadline();
  worker::v1::GetInfoResponse response;
  grpc::Status s = stub->GetInfo(ctx.get(), worker::v1::GetInfoRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.info().service_name(), "loom-generator-worker");
  EXPECT_EQ(response.info().role(), common::v1::ROLE_GENERATOR_WORKER);
  EXPECT_EQ(response.info().rank(), 1);
  EXPECT_EQ(response.info().grpc_port(), chassis.grpc_port());
  EXPECT_EQ(response.info().metrics_port(), chassis.metrics_port());
}

}  // namespace
}  // namespace loom
