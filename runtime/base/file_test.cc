#include "runtime/base/file.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

std::string Read(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFile(path);
  return s.ok() ? *s : "<" + std::string(s.status().message()) + ">";
}

// Every incarnation of a process keeps its log: the newest earlier one as
// .prev, then .prev.1, .prev.2, ...; past `keep` the oldest goes.
TEST(KeepEarlierLogsTest, EveryEarlierLogSurvivesUpToKeep) {
  const std::string log = std::string(std::getenv("TEST_TMPDIR")) + "/worker.log";
  KeepEarlierLogs(log, 3);  // nothing there yet: nothing to do
  EXPECT_FALSE(ReadFile(log + ".prev").ok());
  for (int run = 1; run <= 5; ++run) {
    KeepEarlierLogs(log, 3);
    ASSERT_TRUE(WriteFileAtomically(log, absl::StrCat("run ", run)).ok());
  }
  EXPECT_EQ(Read(log), "run 5");
  EXPECT_EQ(Read(log + ".prev"), "run 4");
  EXPECT_EQ(Read(log + ".prev.1"), "run 3");
  EXPECT_EQ(Read(log + ".prev.2"), "run 2");
  EXPECT_EQ(Read(log + ".prev.3"), "run 1");
  EXPECT_FALSE(ReadFile(log + ".prev.4").ok()) << "kept more than 3 older than .prev";
}

}  // namespace
}  // namespace loom
