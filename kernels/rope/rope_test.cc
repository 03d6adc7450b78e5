#include "kernels/rope/rope.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gradcheck.h"
#include "kernels/testing/tolerances.h"

namespace loom::kernels {
namespace {

using loom::testing::CheckGradient;
using loom::testing::RandomVector;
using loom::testing::WeightedSum;

TEST(RopeTest, PositionZeroIsIdentityAndVIsUntouched) {
  const int NH = 2, HD = 4, C = 8;
  auto qkv = RandomVector(3 * C, 1);
  auto before = qkv;
  const int32_t pos[] = {0};
  rope_forward(qkv.data(), pos, 1, NH, HD, kRopeTheta);
  for (int i = 0; i < 3 * C; ++i) EXPECT_FLOAT_EQ(qkv[i], before[i]);
  const int32_t pos5[] = {5};
  rope_forward(qkv.data(), pos5, 1, NH, HD, kRopeTheta);
  for (int i = 2 * C; i < 3 * C; ++i) EXPECT_EQ(qkv[i], before[i]);
}

TEST(RopeTest, ScoresDependOnlyOnRelativePosition) {
  // q at position a, k at position b: q·k is the same for (a, b) and (a+7, b+7).
  const int NH = 1, HD = 8, C = 8;
  auto base = RandomVector(2 * 3 * C, 2);
  auto score = [&](int a, int b) {
    auto x = base;
    const int32_t pos[] = {a, b};
    rope_forward(x.data(), pos, 2, NH, HD, kRopeTheta);
    double dot = 0;
    for (int d = 0; d < HD; ++d) dot += x[d] * x[3 * C + C + d];  // q of row 0, k of row 1
    return dot;
  };
  const loom::testing::Tolerance t = loom::testing::kRotationInvarianceF32;
  EXPECT_NEAR(score(3, 1), score(10, 8), t.atol + t.rtol * std::abs(score(3, 1))) << t.reason;
  EXPECT_NEAR(score(0, 4), score(7, 11), t.atol + t.rtol * std::abs(score(0, 4))) << t.reason;
}

TEST(RopeTest, BackwardMatchesFiniteDifferences) {
  const int T = 5, NH = 2, HD = 6, C = 12;
  auto x = RandomVector(T * 3 * C, 3), g = RandomVector(T * 3 * C, 4);
  const int32_t pos[] = {0, 1, 2, 0, 1};  // two packed sequences
  std::vector<float> y;
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), pos, T, NH, HD, kRopeTheta);
    return WeightedSum(y, g);
  };
  std::vector<float> dx = g;  // d(sum y*g)/dy = g, rotated back
  rope_backward(dx.data(), pos, T, NH, HD, kRopeTheta);
  EXPECT_TRUE(CheckGradient(loss, x.data(), dx.data(), x.size(), /*max_checks=*/x.size()));
}

}  // namespace
}  // namespace loom::kernels
