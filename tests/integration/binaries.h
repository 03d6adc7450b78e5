// The four Loom service binaries, as integration tests find and query them.
#ifndef LOOM_TESTS_INTEGRATION_BINARIES_H_
#define LOOM_TESTS_INTEGRATION_BINARIES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/common/v1/common.pb.h"
#include "runtime/base/test_paths.h"
#include "services/common/catalog.h"

namespace loom {

// A gtest parameter name for the binary: "loom-llm-worker" -> "LlmWorker".
std::string TestName(const ServiceBinary& b);

// The binary's path in the test's runfiles.
std::string BinaryPath(const ServiceBinary& b);

using testing::TempPath;  // runtime/base/test_paths.h

// Calls the binary's own GetInfo RPC at `target`, with a deadline.
absl::StatusOr<common::v1::ServiceInfo> GetInfo(const ServiceBinary& b, const std::string& target);

}  // namespace loom

#endif  // LOOM_TESTS_INTEGRATION_BINARIES_H_
