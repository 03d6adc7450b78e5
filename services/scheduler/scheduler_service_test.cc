#include "services/scheduler/scheduler_service.h"

#include "gtest/gtest.h"
#include "services/common/chassis_testing.h"

namespace loom {
namespace {

TEST(SchedulerServiceImplTest, GetInfoReportsRoleAndBoundPorts) {
  Chassis chassis(testing::LocalOptions("loom-scheduler", common::v1::ROLE_SCHEDULER, /*rank=*/0));
  SchedulerServiceImpl service(&chassis);
  chassis.AddService(&service, scheduler::v1::SchedulerService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());

  auto stub = scheduler::v1::SchedulerService::NewStub(testing::ChannelTo(chassis));
  auto ctx = testing::ContextWithDeadline();
  scheduler::v1::GetInfoResponse response;
  grpc::Status s = stub->GetInfo(ctx.get(), scheduler::v1::GetInfoRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.info().service_name(), "loom-scheduler");
  EXPECT_EQ(response.info().role(), common::v1::ROLE_SCHEDULER);
  EXPECT_EQ(response.info().rank(), 0);
  EXPECT_EQ(response.info().grpc_port(), chassis.grpc_port());
  EXPECT_EQ(response.info().metrics_port(), chassis.metrics_port());
}

}  // namespace
}  // namespace loom
