// Test helpers for code that runs on the chassis.
#ifndef LOOM_SERVICES_COMMON_CHASSIS_TESTING_H_
#define LOOM_SERVICES_COMMON_CHASSIS_TESTING_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/common/chassis.h"

namespace loom::testing {

// Options for a hermetic in-process chassis: loopback, free ports.
inline ChassisOptions LocalOptions(std::string name, common::v1::Role role, int rank = 0) {
  ChassisOptions o;
  o.service_name = std::move(name);
  o.role = role;
  o.rank = rank;
  o.host = "127.0.0.1";
  o.shutdown_deadline = absl::Seconds(1);
  return o;
}

// A channel to the chassis's gRPC port (the chassis must have started).
inline std::shared_ptr<grpc::Channel> ChannelTo(const Chassis& chassis) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", chassis.grpc_port()),
                             grpc::InsecureChannelCredentials());
}

// A client context with a deadline: every call in Loom's tests sets one.
inline std::unique_ptr<grpc::ClientContext> ContextWithDeadline(int seconds = 5) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return ctx;
}

}  // namespace loom::testing

#endif  // LOOM_SERVICES_COMMON_CHASSIS_TESTING_H_
