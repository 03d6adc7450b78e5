#include "kernels/norm/norm.h"

#include <algorithm>
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

TEST(LayerNormTest, NormalisesEachRowToZeroMeanUnitVariance) {
  const int N = 3, C = 64;
  auto x = RandomVector(N * C, 1, 3.0f);
  std::vector<float> w(C, 1.0f), b(C, 0.0f), y(N * C), mean(N), rstd(N);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                    kLayerNormEps);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += y[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (y[n * C + c] - m) * (y[n * C + c] - m);
    const loom::testing::Tolerance t = loom::testing::kNormStatisticsF32;
    EXPECT_NEAR(m, 0.0, t.atol) << t.reason;
    EXPECT_NEAR(v / C, 1.0, t.atol + t.rtol) << t.reason;
  }
}

TEST(LayerNormTest, BackwardMatchesFiniteDifferences) {
  const int N = 4, C = 24;
  auto x = RandomVector(N * C, 2), w = RandomVector(C, 3), b = RandomVector(C, 4);
  auto g = RandomVector(N * C, 5);
  std::vector<float> y(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                      kLayerNormEps);
    return WeightedSum(y, g);
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  EXPECT_TRUE(CheckGradient(loss, x.data(), dx.data(), dx.size()));
  EXPECT_TRUE(CheckGradient(loss, w.data(), dw.data(), dw.size()));
  EXPECT_TRUE(CheckGradient(loss, b.data(), db.data(), db.size()));
}

TEST(RmsNormTest, ScalesEachRowToUnitRms) {
  const int N = 2, C = 32;
  auto x = RandomVector(N * C, 6, 5.0f);
  std::vector<float> w(C, 1.0f), y(N * C), rrms(N);
  rmsnorm_forward(y.data(), rrms.data(), x.data(), w.data(), N, C, kRmsNormEps);
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += y[n * C + c] * y[n * C + c];
    const loom::testing::Tolerance t = loom::testing::kNormStatisticsF32;
    EXPECT_NEAR(std::sqrt(ss / C), 1.0, t.atol + t.rtol) << t.reason;
  }
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 5, C = 16;
  auto x = RandomVector(N * C, 7), w = RandomVector(C, 8), g = RandomVector(N * C, 9);
  std::vector<float> y(N * C), rrms(N);
  auto loss = [&] {
    rmsnorm_forward(y.data(), rrms.data(), x.data(), w.data(), N, C, kRmsNormEps);
    return WeightedSum(y, g);
  };
  loss();
  std::vector<float> dx(N * C, 0.0f), dw(C, 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rrms.data(), N, C);
  EXPECT_TRUE(CheckGradient(loss, x.data(), dx.data(), dx.size()));
  EXPECT_TRUE(CheckGradient(loss, w.data(), dw.data(), dw.size()));
  // A second backward adds the same gradient again.
  std::vector<float> dx2 = dx;
  rmsnorm_backward(dx2.data(), dw.data(), g.data(), x.data(), w.data(), rrms.data(), N, C);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_FLOAT_EQ(dx2[i], 2 * dx[i]);
}

// A frozen norm: no weight (and bias) gradient, the input gradient unchanged.
TEST(NormTest, NullWeightGradientsGiveTheSameInputGradient) {
  const int N = 3, C = 8;
  auto x = RandomVector(N * C, 10), w = RandomVector(C, 11), b = RandomVector(C, 12);
  auto g = RandomVector(N * C, 13);
  std::vector<float> y(N * C), mean(N), rstd(N), dw(C, 0.0f), db(C, 0.0f);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                    kLayerNormEps);
  std::vector<float> dx_a(N * C, 0.0f), dx_b(N * C, 0.0f);
  layernorm_backward(dx_a.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  layernorm_backward(dx_b.data(), nullptr, nullptr, g.data(), x.data(), w.data(), mean.data(),
                     rstd.data(), N, C);
  EXPECT_EQ(dx_a, dx_b);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, kRmsNormEps);
  std::fill(dx_a.begin(), dx_a.end(), 0.0f);
  std::fill(dx_b.begin(), dx_b.end(), 0.0f);
  rmsnorm_backward(dx_a.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  rmsnorm_backward(dx_b.data(), nullptr, g.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_EQ(dx_a, dx_b);
}

}  // namespace
}  // namespace loom::kernels
