#include "services/common/rate_limiter.h"

#include "gtest/gtest.h"

namespace loom {
namespace {

TEST(RateLimiterTest, UnlimitedUntilReset) {
  RateLimiter r;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(r.TryAcquire());
}

TEST(RateLimiterTest, ABurstThenTheRate) {
  RateLimiter r;
  r.Reset(/*burst=*/5, /*per_second=*/10);
  const absl::Time t = absl::Now();
  int taken = 0;
  for (int i = 0; i < 20; ++i) taken += r.TryAcquire(t);
  EXPECT_EQ(taken, 5);
  // 0.25 s later: 2.5 tokens refilled, two calls pass.
  taken = 0;
  for (int i = 0; i < 20; ++i) taken += r.TryAcquire(t + absl::Milliseconds(250));
  EXPECT_EQ(taken, 2);
  // Never more than the burst, however long the pause.
  taken = 0;
  for (int i = 0; i < 20; ++i) taken += r.TryAcquire(t + absl::Hours(1));
  EXPECT_EQ(taken, 5);
}

TEST(RateLimiterTest, AClockGoingBackGrantsNothingExtra) {
  RateLimiter r;
  r.Reset(1, 1);
  const absl::Time t = absl::Now() + absl::Seconds(10);
  EXPECT_TRUE(r.TryAcquire(t));
  EXPECT_FALSE(r.TryAcquire(t - absl::Seconds(5)));
  EXPECT_FALSE(r.TryAcquire(t));
}

}  // namespace
}  // namespace loom
