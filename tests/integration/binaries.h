// The four Loom service binaries, as integration tests find and query them.
#ifndef LOOM_TESTS_INTEGRATION_BINARIES_H_
#define LOOM_TESTS_INTEGRATION_BINARIES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loom/common/v1/common.pb.h"
#include "runtime/base/test_paths.h"
#include "services/common/catalog.h"
#include "services/common/security.h"

namespace loom {

// A gtest parameter name for the binary: "loom-llm-worker" -> "LlmWorker".
std::string TestName(const ServiceBinary& b);

// The binary's path in the test's runfiles.
std::string BinaryPath(const ServiceBinary& b);

using testing::TempPath;  // runtime/base/test_paths.h

// The test's job certificates (MakeJobCertificates, once, in
// TempPath("tls")); the admin's is this process's client security: the
// secure path every test takes.
const std::string& JobCertificates();

// The certificate of `identity` (kWorkerIdentity, ...) of JobCertificates().
TransportSecurity Identity(const std::string& identity);

// The flags that start the service of `role` with its identity's
// certificate (and the scheduler with the control tokens).
std::vector<std::string> SecurityFlags(common::v1::Role role);

// Calls the binary's own GetInfo RPC at `target`, with a deadline, with
// `security` (default: the process's client security).
absl::StatusOr<common::v1::ServiceInfo> GetInfo(const ServiceBinary& b, const std::string& target);
absl::StatusOr<common::v1::ServiceInfo> GetInfo(const ServiceBinary& b, const std::string& target,
                                                const TransportSecurity& security);

}  // namespace loom

#endif  // LOOM_TESTS_INTEGRATION_BINARIES_H_
