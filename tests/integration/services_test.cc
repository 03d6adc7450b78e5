// Starts each Loom service binary as a real process and checks the chassis
// contract from outside: the logged ports, grpc.health.v1 SERVING overall and
// per service, GetInfo over gRPC, /metrics that `promtool check metrics`
// accepts, and a clean exit 0 within a deadline after SIGTERM.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

// A free port p with p + 1 free too (bound and released: a race with other
// processes is possible but unlikely in a test's sandbox).
int FreePortPair() {
  static int attempt = 0;
  for (int tries = 0; tries < 200; ++tries) {
    const int p = 20000 + static_cast<int>((getpid() * 7919 + ++attempt * 104729) % 40000);
    bool free = true;
    for (int port : {p, p + 1}) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      free = free && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(fd);
    }
    if (free) return p;
  }
  return 0;
}

// One pod per node: --local_ranks=2 runs ranks 2·rank and 2·rank + 1 as two
// processes on consecutive ports; SIGTERM stops both (exit 0); a rank that
// dies stops the other and the pod's process fails.
TEST(LocalRanksTest, OneProcessPerRankOnConsecutivePorts) {
  const ServiceBinary* b = nullptr;
  for (const ServiceBinary& s : ServiceCatalog()) {
    if (s.role == common::v1::ROLE_LLM_WORKER) b = &s;
  }
  ASSERT_NE(b, nullptr);
  for (bool kill_one : {false, true}) {
    const int grpc = FreePortPair(), metrics = FreePortPair();
    ASSERT_TRUE(grpc != 0 && metrics != 0 && grpc != metrics && grpc + 1 != metrics &&
                metrics + 1 != grpc);
    std::vector<std::string> argv = {BinaryPath(*b),
                                     "--host=127.0.0.1",
                                     absl::StrCat("--grpc_port=", grpc),
                                     absl::StrCat("--metrics_port=", metrics),
                                     "--shutdown_deadline=2s",
                                     "--rank=1",
                                     "--local_ranks=2"};
    for (const std::string& flag : SecurityFlags(b->role)) argv.push_back(flag);
    auto pod = Subprocess::Start(argv, TempPath(absl::StrCat("local_ranks", kill_one, ".log")));
    ASSERT_TRUE(pod.ok()) << pod.status();
    std::vector<int> pids;
    for (int i = 0; i < 2; ++i) {
      const std::string target = absl::StrCat("127.0.0.1:", grpc + i);
      ASSERT_TRUE(WaitUntilServing(target, "", absl::Seconds(30)).ok()) << (*pod)->ReadLog();
      absl::StatusOr<common::v1::ServiceInfo> info = GetInfo(*b, target);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->rank(), 2 + i);
      EXPECT_EQ(info->metrics_port(), metrics + i);
      EXPECT_NE(info->pid(), (*pod)->pid());
      pids.push_back(info->pid());
    }
    if (kill_one) {
      kill(pids[1], SIGKILL);
      absl::StatusOr<int> st = (*pod)->Wait(absl::Seconds(20));
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(DescribeWaitStatus(*st), "exit 1") << (*pod)->ReadLog();
    } else {
      (*pod)->Signal(SIGTERM);
      absl::StatusOr<int> st = (*pod)->Wait(absl::Seconds(20));
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ(DescribeWaitStatus(*st), "exit 0") << (*pod)->ReadLog();
    }
    EXPECT_NE(kill(pids[0], 0), 0) << "local rank 0 outlived its pod's process";
  }
}

}  // namespace
}  // namespace loom
