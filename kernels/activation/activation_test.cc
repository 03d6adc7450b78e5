#include "kernels/activation/activation.h"

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

TEST(GeluTest, MatchesKnownValues) {
  const float x[] = {-3.0f, -1.0f, 0.0f, 1.0f, 3.0f};
  float y[5];
  gelu_forward(y, x, 5);
  // tanh-approximate GELU at these points (as torch.nn.functional.gelu(approximate="tanh")).
  const float want[] = {-0.0036373f, -0.1588080f, 0.0f, 0.8411920f, 2.9963627f};
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(y[i], want[i], loom::testing::ClosedFormF32(want[i])) << x[i];
}

TEST(GeluTest, BackwardMatchesFiniteDifferences) {
  const int n = 200;
  auto x = RandomVector(n, 1, 4.0f), g = RandomVector(n, 2);
  std::vector<float> y(n);
  auto loss = [&] {
    gelu_forward(y.data(), x.data(), n);
    return WeightedSum(y, g);
  };
  std::vector<float> dx(n, 0.0f);
  gelu_backward(dx.data(), x.data(), g.data(), n);
  EXPECT_TRUE(CheckGradient(loss, x.data(), dx.data(), n, /*max_checks=*/n));
}

// torch.nn.functional.gelu(x) (erf) and CLIP's QuickGELU x * sigmoid(1.702 x).
TEST(ActivationTest, ExactAndQuickGeluMatchKnownValues) {
  const float x[] = {-3.0f, -1.0f, 0.0f, 1.0f, 3.0f};
  float y[5];
  activation_forward(Activation::kGeluErf, y, x, 5);
  const float erf_want[] = {-0.0040497f, -0.1586553f, 0.0f, 0.8413447f, 2.9959502f};
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(y[i], erf_want[i], loom::testing::ClosedFormF32(erf_want[i])) << x[i];
  activation_forward(Activation::kQuickGelu, y, x, 5);
  for (int i = 0; i < 5; ++i) {
    const double want = x[i] / (1.0 + std::exp(-1.702 * x[i]));
    EXPECT_NEAR(y[i], want, loom::testing::ClosedFormF32(want)) << x[i];
  }
  activation_forward(Activation::kGeluTanh, y, x, 5);
  EXPECT_NEAR(y[1], -0.1588080f, 1e-6f);  // the tanh approximation, as gelu_forward
}

class ActivationGradientTest : public ::testing::TestWithParam<Activation> {};

TEST_P(ActivationGradientTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int n = 200;
  auto x = RandomVector(n, 7, 4.0f), g = RandomVector(n, 8);
  std::vector<float> y(n);
  auto loss = [&] {
    activation_forward(GetParam(), y.data(), x.data(), n);
    return WeightedSum(y, g);
  };
  std::vector<float> dx(n, 0.0f);
  activation_backward(GetParam(), dx.data(), x.data(), g.data(), n);
  EXPECT_TRUE(CheckGradient(loss, x.data(), dx.data(), n, /*max_checks=*/n));
  std::vector<float> twice = dx;
  activation_backward(GetParam(), twice.data(), x.data(), g.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(twice[i], 2 * dx[i]);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ActivationGradientTest,
                         ::testing::Values(Activation::kGeluTanh, Activation::kGeluErf,
                                           Activation::kQuickGelu));

TEST(SwiGluTest, IsSiluOfGateTimesUp) {
  const float gate[] = {-2.0f, 0.0f, 1.5f}, up[] = {3.0f, 5.0f, -2.0f};
  float y[3];
  swiglu_forward(y, gate, up, 3);
  for (int i = 0; i < 3; ++i) {
    const double want = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    EXPECT_NEAR(y[i], want, loom::testing::ClosedFormF32(want));
  }
}

TEST(SwiGluTest, BackwardMatchesFiniteDifferences) {
  const int n = 150;
  auto gate = RandomVector(n, 3, 4.0f), up = RandomVector(n, 4, 2.0f), g = RandomVector(n, 5);
  std::vector<float> y(n);
  auto loss = [&] {
    swiglu_forward(y.data(), gate.data(), up.data(), n);
    return WeightedSum(y, g);
  };
  std::vector<float> dgate(n, 0.0f), dup(n, 0.0f);
  swiglu_backward(dgate.data(), dup.data(), gate.data(), up.data(), g.data(), n);
  EXPECT_TRUE(CheckGradient(loss, gate.data(), dgate.data(), n, /*max_checks=*/n));
  EXPECT_TRUE(CheckGradient(loss, up.data(), dup.data(), n, /*max_checks=*/n));
}

}  // namespace
}  // namespace loom::kernels
