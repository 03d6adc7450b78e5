// Starts each Loom service binary as a real process and checks the chassis
// contract from outside: the logged ports, grpc.health.v1 SERVING overall and
// per service, GetInfo over gRPC, /metrics that `promtool check metrics`
// accepts, and a clean exit 0 within a deadline after SIGTERM.
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/common/health_client.h"
#include "services/common/http_get.h"
#include "services/common/subprocess.h"
#include "tests/integration/binaries.h"

namespace loom {
namespace {

class ServiceProcessTest : public ::testing::TestWithParam<ServiceBinary> {};

TEST_P(ServiceProcessTest, ServesHealthMetricsAndStopsCleanlyOnSigterm) {
  const ServiceBinary& b = GetParam();
  std::vector<std::string> argv = {BinaryPath(b), "--host=127.0.0.1", "--grpc_port=0",
                                   "--metrics_port=0", "--shutdown_deadline=2s"};
  for (const std::string& flag : SecurityFlags(b.role)) argv.push_back(flag);
  if (b.worker) argv.push_back("--rank=1");
  auto child = Subprocess::Start(argv, TempPath(b.name + ".log"));
  ASSERT_TRUE(child.ok()) << child.status();

  absl::StatusOr<ServingPorts> ports = WaitForServing(**child, absl::Seconds(30));
  ASSERT_TRUE(ports.ok()) << ports.status();
  const std::string target = absl::StrCat("127.0.0.1:", ports->grpc_port);

  // Health, overall and for the service itself.
  for (const std::string& service : {std::string(), b.grpc_service}) {
    absl::Status s = WaitUntilServing(target, service, absl::Seconds(10));
    EXPECT_TRUE(s.ok()) << s;
  }

  // GetInfo names the binary, its role and rank, and the bound ports.
  absl::StatusOr<common::v1::ServiceInfo> info = GetInfo(b, target);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->service_name(), b.name);
  EXPECT_EQ(info->role(), b.role);
  EXPECT_EQ(info->rank(), b.worker ? 1 : 0);
  EXPECT_EQ(info->grpc_port(), ports->grpc_port);
  EXPECT_EQ(info->metrics_port(), ports->metrics_port);
  EXPECT_EQ(info->pid(), (*child)->pid());

  // /metrics passes promtool's checks.
  absl::StatusOr<HttpResponse> metrics =
      HttpGet("127.0.0.1", ports->metrics_port, "/metrics", absl::Seconds(10));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->status_code, 200);
  EXPECT_NE(metrics->body.find("loom_build_info{"), std::string::npos) << metrics->body;
  const std::string metrics_file = TempPath(b.name + ".metrics");
  std::ofstream(metrics_file) << metrics->body;
  auto promtool =
      Subprocess::Start({"/bin/sh", "-c", absl::StrCat("promtool check metrics < ", metrics_file)},
                        TempPath(b.name + ".promtool.log"));
  ASSERT_TRUE(promtool.ok()) << promtool.status();
  absl::StatusOr<int> prc = (*promtool)->Wait(absl::Seconds(30));
  ASSERT_TRUE(prc.ok()) << prc.status();
  EXPECT_EQ(DescribeWaitStatus(*prc), "exit 0") << "promtool check metrics:\n"
                                                << (*promtool)->ReadLog() << "\nmetrics:\n"
                                                << metrics->body;

  // SIGTERM: NOT_SERVING, then a clean exit 0 within the deadline (2 s drain
  // plus up to 2 s for the metrics listener, plus slack for a loaded machine).
  (*child)->Signal(SIGTERM);
  absl::StatusOr<int> st = (*child)->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.ok()) << st.status() << "\n" << (*child)->ReadLog();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << (*child)->ReadLog();
  const std::string log = (*child)->ReadLog();
  EXPECT_NE(log.find("\"msg\":\"NOT_SERVING; shutting down\""), std::string::npos) << log;
  EXPECT_NE(log.find("\"msg\":\"stopped\""), std::string::npos) << log;
}

TEST_P(ServiceProcessTest, RejectsABadFlagNamingIt) {
  const ServiceBinary& b = GetParam();
  auto child =
      Subprocess::Start({BinaryPath(b), "--grpc_port=notaport"}, TempPath(b.name + ".badflag.log"));
  ASSERT_TRUE(child.ok());
  absl::StatusOr<int> st = (*child)->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_NE(DescribeWaitStatus(*st), "exit 0");
  EXPECT_NE((*child)->ReadLog().find("grpc_port"), std::string::npos) << (*child)->ReadLog();
}

TEST_P(ServiceProcessTest, ExitsWithAnErrorWhenItsPortIsTaken) {
  const ServiceBinary& b = GetParam();
  std::vector<std::string> argv = {BinaryPath(b), "--host=127.0.0.1"};
  for (const std::string& flag : SecurityFlags(b.role)) argv.push_back(flag);
  auto first = Subprocess::Start(argv, TempPath(b.name + ".first.log"));
  ASSERT_TRUE(first.ok());
  absl::StatusOr<ServingPorts> ports = WaitForServing(**first, absl::Seconds(30));
  ASSERT_TRUE(ports.ok()) << ports.status();

  argv.push_back(absl::StrCat("--grpc_port=", ports->grpc_port));
  auto second = Subprocess::Start(argv, TempPath(b.name + ".second.log"));
  ASSERT_TRUE(second.ok());
  absl::StatusOr<int> st = (*second)->Wait(absl::Seconds(15));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 1");
  EXPECT_NE((*second)->ReadLog().find("cannot start"), std::string::npos) << (*second)->ReadLog();
  (*first)->Signal(SIGTERM);
  EXPECT_TRUE((*first)->Wait(absl::Seconds(15)).ok());
}

INSTANTIATE_TEST_SUITE_P(AllServices, ServiceProcessTest, ::testing::ValuesIn(ServiceCatalog()),
                         [](const auto& info) { return TestName(info.param); });

}  // namespace
}  // namespace loom
