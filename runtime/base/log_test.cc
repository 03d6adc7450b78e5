#include "runtime/base/log.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace loom::log {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetSinkForTesting([this](std::string_view line) { lines_.emplace_back(line); });
    SetServiceName("loom-test");
    SetMinLevel(Level::kInfo);
  }
  void TearDown() override { SetSinkForTesting(nullptr); }
  std::vector<std::string> lines_;
};

TEST_F(LogTest, WritesOneJsonObjectPerRecordWithTypedFields) {
  LOOM_LOG(INFO).With("grpc_port", 40123).With("ok", true).With("name", "a\"b") << "serving " << 2;
  ASSERT_EQ(lines_.size(), 1u);
  const std::string& l = lines_[0];
  EXPECT_EQ(l.front(), '{');
  EXPECT_EQ(l.substr(l.size() - 2), "}\n");
  EXPECT_NE(l.find("\"level\":\"INFO\""), std::string::npos) << l;
  EXPECT_NE(l.find("\"service\":\"loom-test\""), std::string::npos) << l;
  EXPECT_NE(l.find("\"msg\":\"serving 2\""), std::string::npos) << l;
  EXPECT_NE(l.find("\"grpc_port\":40123"), std::string::npos) << l;
  EXPECT_NE(l.find("\"ok\":true"), std::string::npos) << l;
  EXPECT_NE(l.find("\"name\":\"a\\\"b\""), std::string::npos) << l;
  EXPECT_NE(l.find("\"src\":\"log_test.cc:"), std::string::npos) << l;
}

TEST_F(LogTest, DropsRecordsBelowTheMinimumLevel) {
  SetMinLevel(Level::kWarning);
  LOOM_LOG(INFO) << "hidden";
  LOOM_LOG(WARNING) << "shown";
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("shown"), std::string::npos);
}

TEST_F(LogTest, EscapesControlCharactersAndNonFiniteNumbers) {
  LOOM_LOG(ERROR).With("x", 0.0 / 0.0) << "line1\nline2\x01";
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("line1\\nline2\\u0001"), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[0].find("\"x\":\"nan\""), std::string::npos) << lines_[0];
  EXPECT_EQ(lines_[0].find('\n'), lines_[0].size() - 1);
}

TEST(LogLevelTest, ParsesNamesInAnyCase) {
  Level l;
  ASSERT_TRUE(ParseLevel("Warning", &l));
  EXPECT_EQ(l, Level::kWarning);
  EXPECT_FALSE(ParseLevel("loud", &l));
}

TEST(LogDeathTest, CheckFailureAbortsWithTheCondition) {
  EXPECT_DEATH({ LOOM_CHECK(1 + 1 == 3) << "math"; }, "check failed: 1 \\+ 1 == 3");
}

}  // namespace
}  // namespace loom::log
