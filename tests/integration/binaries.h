// The four Loom service binaries, as integration tests find and query them.
#ifndef LOOM_TESTS_INTEGRATION_BINARIES_H_
#define LOOM_TESTS_INTEGRATION_BINARIES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/common/v1/common.pb.h"

namespace loom {

struct ServiceBinary {
  std::string name;          // "loom-scheduler"
  std::string package;       // Bazel package holding it: "services/scheduler"
  std::string grpc_service;  // full proto service name
  common::v1::Role role;
  bool worker;               // takes --rank
  std::string test_name;     // gtest parameter name
};

std::vector<ServiceBinary> AllServiceBinaries();

// The binary's path in the test's runfiles.
std::string BinaryPath(const ServiceBinary& b);

// A path in the test's private temporary folder.
std::string TempPath(const std::string& name);

// Calls the binary's own GetInfo RPC at `target`, with a deadline.
absl::StatusOr<common::v1::ServiceInfo> GetInfo(const ServiceBinary& b,
                                                const std::string& target);

}  // namespace loom

#endif  // LOOM_TESTS_INTEGRATION_BINARIES_H_
