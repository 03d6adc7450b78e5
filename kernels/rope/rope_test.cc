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

std::vector<float> InvFreq(int HD, float theta = kRopeTheta) {
  std::vector<float> f(HD / 2);
  rope_inv_freq(f.data(), HD, theta);
  return f;
}

TEST(RopeTest, PositionZeroIsIdentityAndVIsUntouched) {
  const int NH = 4, NKV = 2, HD = 4, W = (NH + 2 * NKV) * HD;
  auto qkv = RandomVector(W, 1);
  auto before = qkv;
  const auto f = InvFreq(HD);
  const int32_t pos[] = {0};
  rope_forward(qkv.data(), pos, f.data(), 1, NH, NKV, HD);
  for (int i = 0; i < W; ++i) EXPECT_FLOAT_EQ(qkv[i], before[i]);
  const int32_t pos5[] = {5};
  rope_forward(qkv.data(), pos5, f.data(), 1, NH, NKV, HD);
  for (int i = 0; i < (NH + NKV) * HD; ++i) EXPECT_NE(qkv[i], before[i]) << i;
  for (int i = (NH + NKV) * HD; i < W; ++i) EXPECT_EQ(qkv[i], before[i]) << i;
}

TEST(RopeTest, RotatesHalvesAsHuggingFace) {
  // One head of 4: pairs (0, 2) and (1, 3); at position p pair i turns by
  // p * theta^(-2i/4), so pair 0 by p radians and pair 1 by p / 100.
  const int HD = 4;
  const auto f = InvFreq(HD);
  ASSERT_FLOAT_EQ(f[0], 1.0f);
  ASSERT_FLOAT_EQ(f[1], 0.01f);
  std::vector<float> qkv = {1, 2, 3, 4, /*k*/ 1, 0, 0, 0, /*v*/ 9, 9, 9, 9};
  const int32_t pos[] = {3};
  rope_forward(qkv.data(), pos, f.data(), 1, 1, 1, HD);
  const double a = 3.0, b = 0.03;
  EXPECT_NEAR(qkv[0], 1 * std::cos(a) - 3 * std::sin(a), 1e-6);
  EXPECT_NEAR(qkv[2], 3 * std::cos(a) + 1 * std::sin(a), 1e-6);
  EXPECT_NEAR(qkv[1], 2 * std::cos(b) - 4 * std::sin(b), 1e-6);
  EXPECT_NEAR(qkv[3], 4 * std::cos(b) + 2 * std::sin(b), 1e-6);
  EXPECT_NEAR(qkv[4], std::cos(a), 1e-6);
  EXPECT_NEAR(qkv[6], std::sin(a), 1e-6);
}

TEST(RopeTest, ScoresDependOnlyOnRelativePosition) {
  // q at position a, k at position b: q·k is the same for (a, b) and (a+7, b+7).
  const int NH = 2, NKV = 1, HD = 8, W = (NH + 2 * NKV) * HD;
  auto base = RandomVector(2 * W, 2);
  const auto f = InvFreq(HD);
  auto score = [&](int a, int b) {
    auto x = base;
    const int32_t pos[] = {a, b};
    rope_forward(x.data(), pos, f.data(), 2, NH, NKV, HD);
    double dot = 0;  // q head 1 of row 0, the k head of row 1
    for (int d = 0; d < HD; ++d) dot += x[HD + d] * x[W + NH * HD + d];
    return dot;
  };
  const loom::testing::Tolerance t = loom::testing::kRotationInvarianceF32;
  EXPECT_NEAR(score(3, 1), score(10, 8), t.atol + t.rtol * std::abs(score(3, 1))) << t.reason;
  EXPECT_NEAR(score(0, 4), score(7, 11), t.atol + t.rtol * std::abs(score(0, 4))) << t.reason;
}

TEST(RopeTest, BackwardMatchesFiniteDifferences) {
  const int T = 5, NH = 4, NKV = 2, HD = 6, W = (NH + 2 * NKV) * HD;
  auto x = RandomVector(T * W, 3), g = RandomVector(T * W, 4);
  const int32_t pos[] = {0, 1, 2, 0, 1};  // two packed sequences
  const auto f = InvFreq(HD, 500.0f);
  std::vector<float> y;
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), pos, f.data(), T, NH, NKV, HD);
    return WeightedSum(y, g);
  };
  std::vector<float> dx = g;  // d(sum y*g)/dy = g, rotated back
  rope_backward(dx.data(), pos, f.data(), T, NH, NKV, HD);
  EXPECT_TRUE(CheckGradient(loss, x.data(), dx.data(), x.size(), /*max_checks=*/x.size()));
}

}  // namespace
}  // namespace loom::kernels
