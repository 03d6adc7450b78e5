#include "runtime/base/open_files.h"

#include <sys/resource.h>

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(OpenFilesTest, RaisesTheSoftLimitToTheHardLimit) {
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  if (saved.rlim_max < 64) GTEST_SKIP() << "hard limit " << saved.rlim_max;
  rlimit low = saved;
  low.rlim_cur = 32;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const long got = RaiseOpenFileLimit();
  rlimit now;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(now.rlim_cur, saved.rlim_max);
  EXPECT_EQ(got, static_cast<long>(saved.rlim_max));
  EXPECT_EQ(RaiseOpenFileLimit(), got);  // already raised: unchanged
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace loom
