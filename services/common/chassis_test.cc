#include "services/common/chassis.h"

#include <string>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "loom/data/v1/data.grpc.pb.h"
#include "services/common/chassis_testing.h"
#include "services/common/health_client.h"
#include "services/common/http_get.h"

namespace loom {
namespace {

using grpc::health::v1::HealthCheckResponse;
using testing::ContextWithDeadline;
using testing::LocalOptions;

// A generated service with no methods implemented (each answers
// UNIMPLEMENTED): enough to be registered, health-checked and reflected.
class EmptyService : public data::v1::PreprocessService::Service {};
constexpr char kServiceName[] = "loom.data.v1.PreprocessService";

std::string Target(const Chassis& c) { return absl::StrCat("127.0.0.1:", c.grpc_port()); }

TEST(ChassisTest, ServesHealthOverallAndPerServiceOnFreePorts) {
  Chassis chassis(LocalOptions("loom-test", common::v1::ROLE_SCHEDULER));
  EmptyService service;
  chassis.AddService(&service, kServiceName);
  ASSERT_TRUE(chassis.Start().ok());
  EXPECT_GT(chassis.grpc_port(), 0);
  EXPECT_GT(chassis.metrics_port(), 0);
  EXPECT_NE(chassis.grpc_port(), chassis.metrics_port());

  for (std::string name : {"", kServiceName}) {
    absl::StatusOr<ServingStatus> st = CheckHealth(Target(chassis), name, absl::Seconds(5));
    ASSERT_TRUE(st.ok()) << st.status();
    EXPECT_EQ(*st, HealthCheckResponse::SERVING) << "service '" << name << "'";
  }
  absl::StatusOr<ServingStatus> unknown =
      CheckHealth(Target(chassis), "loom.nope.v1.Nope", absl::Seconds(5));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);

  // A process that cannot do its work says so (a worker's stalled training),
  // and takes it back.
  for (bool serving : {false, true}) {
    chassis.SetServing(serving);
    for (std::string name : {"", kServiceName}) {
      absl::StatusOr<ServingStatus> st = CheckHealth(Target(chassis), name, absl::Seconds(5));
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(*st, serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING)
          << "service '" << name << "'";
    }
  }
}

TEST(ChassisTest, ServesBuildInfoOnMetrics) {
  Chassis chassis(LocalOptions("loom-test", common::v1::ROLE_LLM_WORKER, /*rank=*/3));
  ASSERT_TRUE(chassis.Start().ok());
  absl::StatusOr<HttpResponse> r =
      HttpGet("127.0.0.1", chassis.metrics_port(), "/metrics", absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status_code, 200);
  EXPECT_NE(r->body.find("# TYPE loom_build_info gauge"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("role=\"llm_worker\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("rank=\"3\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("loom_process_start_time_seconds"), std::string::npos);
}

TEST(ChassisTest, ServesReflection) {
  Chassis chassis(LocalOptions("loom-test", common::v1::ROLE_SCHEDULER));
  EmptyService service;
  chassis.AddService(&service, kServiceName);
  ASSERT_TRUE(chassis.Start().ok());

  // ServerReflectionRequest{list_services: ""}, encoded by hand (field 7,
  // length-delimited, empty) so the test needs no reflection client.
  grpc::GenericStub stub(testing::ChannelTo(chassis));
  grpc::CompletionQueue cq;
  auto ctx = ContextWithDeadline();
  auto call = stub.PrepareCall(
      ctx.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto step = [&](intptr_t want) {
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_EQ(reinterpret_cast<intptr_t>(tag), want);
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step(1);
  ASSERT_TRUE(ok);
  const char request[] = {0x3a, 0x00};
  grpc::Slice slice(request, sizeof(request));
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  step(2);
  ASSERT_TRUE(ok);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  step(3);
  ASSERT_TRUE(ok) << "no reflection response";
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string reply;
  for (const grpc::Slice& s : slices)
    reply.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(reply.find(kServiceName), std::string::npos);
  EXPECT_NE(reply.find("grpc.reflection.v1alpha.ServerReflection"), std::string::npos) << reply;
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST(ChassisTest, ShutdownTurnsWatchersNotServingThenStops) {
  Chassis chassis(LocalOptions("loom-test", common::v1::ROLE_PREPROCESS));
  EmptyService service;
  chassis.AddService(&service, kServiceName);
  ASSERT_TRUE(chassis.Start().ok());

  auto stub = grpc::health::v1::Health::NewStub(testing::ChannelTo(chassis));
  auto ctx = ContextWithDeadline(10);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(kServiceName);
  auto reader = stub->Watch(ctx.get(), req);
  HealthCheckResponse resp;
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.status(), HealthCheckResponse::SERVING);

  const int port = chassis.grpc_port();
  std::thread stopper([&] { chassis.Shutdown(); });
  bool saw_not_serving = false;
  while (reader->Read(&resp)) {
    if (resp.status() == HealthCheckResponse::NOT_SERVING) saw_not_serving = true;
  }
  stopper.join();
  EXPECT_TRUE(saw_not_serving);
  chassis.Shutdown();  // idempotent

  absl::StatusOr<ServingStatus> after =
      CheckHealth(absl::StrCat("127.0.0.1:", port), "", absl::Milliseconds(500));
  EXPECT_FALSE(after.ok());
}

TEST(ChassisTest, StartFailsClearlyWhenThePortIsTaken) {
  Chassis first(LocalOptions("loom-a", common::v1::ROLE_SCHEDULER));
  ASSERT_TRUE(first.Start().ok());

  ChassisOptions o = LocalOptions("loom-b", common::v1::ROLE_SCHEDULER);
  o.metrics_port = first.metrics_port();
  Chassis second(o);
  absl::Status s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(absl::StrCat(first.metrics_port())), absl::string_view::npos) << s;

  o = LocalOptions("loom-c", common::v1::ROLE_SCHEDULER);
  o.grpc_port = first.grpc_port();
  Chassis third(o);
  s = third.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST(ChassisTest, RejectsOutOfRangePortsNamingTheFlag) {
  ChassisOptions o = LocalOptions("loom-test", common::v1::ROLE_SCHEDULER);
  o.grpc_port = 70000;
  Chassis chassis(o);
  absl::Status s = chassis.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--grpc_port"), absl::string_view::npos) << s;
}

TEST(ChassisTest, FillsServiceInfoWithBoundPorts) {
  Chassis chassis(LocalOptions("loom-encoder-worker", common::v1::ROLE_ENCODER_WORKER, 1));
  ASSERT_TRUE(chassis.Start().ok());
  common::v1::ServiceInfo info;
  chassis.FillServiceInfo(&info);
  EXPECT_EQ(info.service_name(), "loom-encoder-worker");
  EXPECT_EQ(info.role(), common::v1::ROLE_ENCODER_WORKER);
  EXPECT_EQ(info.rank(), 1);
  EXPECT_EQ(info.grpc_port(), chassis.grpc_port());
  EXPECT_EQ(info.metrics_port(), chassis.metrics_port());
  EXPECT_GT(info.pid(), 0);
  EXPECT_GT(info.start_time().seconds(), 0);
}

}  // namespace
}  // namespace loom
