#include "services/preprocess/preprocess_service.h"

#include "gtest/gtest.h"
#include "services/common/chassis_testing.h"

namespace loom {
namespace {

TEST(PreprocessServiceImplTest, GetInfoReportsRoleAndBoundPorts) {
  Chassis chassis(
      testing::LocalOptions("loom-preprocess", common::v1::ROLE_PREPROCESS, /*rank=*/0));
  PreprocessServiceImpl service(&chassis);
  chassis.AddService(&service, data::v1::PreprocessService::service_full_name());
  ASSERT_TRUE(chassis.Start().ok());

  auto stub = data::v1::PreprocessService::NewStub(testing::ChannelTo(chassis));
  auto ctx = testing::ContextWithDeadline();
  data::v1::GetInfoResponse response;
  grpc::Status s = stub->GetInfo(ctx.get(), data::v1::GetInfoRequest(), &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.info().service_name(), "loom-preprocess");
  EXPECT_EQ(response.info().role(), common::v1::ROLE_PREPROCESS);
  EXPECT_EQ(response.info().rank(), 0);
  EXPECT_EQ(response.info().grpc_port(), chassis.grpc_port());
  EXPECT_EQ(response.info().metrics_port(), chassis.metrics_port());
}

}  // namespace
}  // namespace loom
