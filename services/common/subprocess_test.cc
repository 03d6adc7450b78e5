#include "services/common/subprocess.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>

#include "gtest/gtest.h"
#include "runtime/base/test_paths.h"

namespace loom {
namespace {

TEST(SubprocessTest, CapturesOutputAndExitStatus) {
  auto child = Subprocess::Start({"/bin/sh", "-c", "echo hello; echo oops >&2; exit 3"},
                                 testing::TempPath("a.log"));
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> st = (*child)->Wait(absl::Seconds(10));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(DescribeWaitStatus(*st), "exit 3");
  std::string log = (*child)->ReadLog();
  EXPECT_NE(log.find("hello"), std::string::npos);
  EXPECT_NE(log.find("oops"), std::string::npos);
}

TEST(SubprocessTest, WaitTimesOutThenSignalStopsTheChild) {
  auto child = Subprocess::Start({"/bin/sleep", "30"}, testing::TempPath("b.log"));
  ASSERT_TRUE(child.ok());
  EXPECT_EQ((*child)->Wait(absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  (*child)->Signal(SIGTERM);
  absl::StatusOr<int> st = (*child)->Wait(absl::Seconds(10));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFSIGNALED(*st));
  EXPECT_EQ(WTERMSIG(*st), SIGTERM);
}

TEST(SubprocessTest, StartFailsForAMissingBinary) {
  auto child = Subprocess::Start({"/nonexistent/loom-x"}, testing::TempPath("c.log"));
  EXPECT_FALSE(child.ok());
  EXPECT_NE(child.status().message().find("/nonexistent/loom-x"), absl::string_view::npos);
}

TEST(ServingPortsTest, FindsTheServingRecord) {
  std::string log =
      "{\"msg\":\"starting\"}\n"
      "{\"ts\":\"x\",\"msg\":\"serving\",\"src\":\"c.cc:1\",\"grpc_port\":4001,"
      "\"metrics_port\":4002}\n";
  absl::StatusOr<ServingPorts> p = FindServingPorts(log);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->grpc_port, 4001);
  EXPECT_EQ(p->metrics_port, 4002);
  EXPECT_EQ(FindServingPorts("{\"msg\":\"starting\"}\n").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ServingPortsTest, ReportsAChildThatExitsBeforeServing) {
  auto child = Subprocess::Start({"/bin/sh", "-c", "echo cannot bind >&2; exit 1"},
                                 testing::TempPath("d.log"));
  ASSERT_TRUE(child.ok());
  absl::StatusOr<ServingPorts> p = WaitForServing(**child, absl::Seconds(10));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("cannot bind"), absl::string_view::npos) << p.status();
  EXPECT_NE(p.status().message().find("exit 1"), absl::string_view::npos) << p.status();
}

}  // namespace
}  // namespace loom
